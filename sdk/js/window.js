// Event-time windows on keyed state and timers: tumbling, hopping and
// session windows per user key, each with a user aggregate, emitted once
// when the partition's watermark passes their end (and, optionally, early
// on every batch that changes them). A record whose windows have all closed
// is a dead letter of kind `late`, never dropped.
//
// It keeps windows in state exactly as the Rust SDK's
// `sluice_plugin::window` and the Python SDK's `sluice_plugin.window` do
// (docs/event-time.md), so a windowed transform gives the same rows, state
// and digest in any of them:
//
// - tumbling and hopping: the aggregate of window [start, end) of `key`
//   under `sluice/w/` + end (8 bytes, big-endian, sign bit flipped) + `key`;
//   a timer (`key`, end - 1) closes it;
// - sessions: every open session of `key` under `sluice/s/` + `key`, per
//   session its start and end (8 bytes each, big-endian) and its
//   aggregate's length (4 bytes, big-endian) and bytes, in start order; a
//   timer (`key`, end - 1) per session closes it.
//
//   import { Event, Rejected, Tumbling, Windowed, SUM } from './window.js';
//   const windowed = new Windowed(new Tumbling(60000n), SUM);
//   // take: once per record; null or a Rejected: in no window
//   const take = (r) => { const p = r.json(); return new Event(p.user, BigInt(p.ts), BigInt(p.cents)); };
//   windowed.run(batch, out, take, (out, w) => out.row(t, [utf8(w.key), w.startMs, w.acc]));
//
// Times are ms since the Unix epoch as BigInt. It must not read the host's
// clock or keep anything between batches outside state.

import { State, dueTimers } from './sluice.js';

const encoder = new TextEncoder();
const WINDOW_PREFIX = encoder.encode('sluice/w/');
const SESSION_PREFIX = encoder.encode('sluice/s/');

/** Back-to-back windows of `sizeMs`, aligned to the Unix epoch. */
export class Tumbling {
  constructor(sizeMs) {
    this.sizeMs = BigInt(sizeMs);
    this.hopMs = this.sizeMs;
  }
}

/** Windows of `sizeMs` starting every `hopMs`, aligned to the epoch. */
export class Hopping {
  constructor(sizeMs, hopMs) {
    this.sizeMs = BigInt(sizeMs);
    this.hopMs = BigInt(hopMs);
  }
}

/** Records of a key less than `gapMs` apart, together: a session ends
 * `gapMs` after its last record. */
export class Session {
  constructor(gapMs) {
    this.gapMs = BigInt(gapMs);
  }
}

/** The sum of the inputs (BigInt), an int64 kept as 8 bytes big-endian
 * (Rust's `i64` accumulator). An aggregate is any object with these five
 * methods; values are immutable: `add` and `merge` return the new one,
 * `decode` returns null for bytes that are not one. */
export const SUM = {
  init: () => 0n,
  add: (acc, input) => BigInt.asIntN(64, acc + BigInt(input)),
  merge: (acc, other) => BigInt.asIntN(64, acc + other),
  encode: (acc) => {
    const bytes = new Uint8Array(8);
    new DataView(bytes.buffer).setBigInt64(0, acc);
    return bytes;
  },
  decode: (data) => (data.length === 8 ? new DataView(data.buffer, data.byteOffset, 8).getBigInt64(0) : null),
};

/** A record goes into the windows of `key` (Uint8Array or string) at
 * `timeMs` (null: its Kafka timestamp), bringing `input` to their
 * aggregates. */
export class Event {
  constructor(key, timeMs, input) {
    this.key = key;
    this.timeMs = timeMs;
    this.input = input;
  }
}

/** A record in no window: a `rejected` dead letter with `reason`. */
export class Rejected {
  constructor(reason) {
    this.reason = reason;
  }
}

/** A window's value, handed to the emit function; `emit` is 'early' (the
 * batch changed it, still open) or 'final' (handed out once). */
export class WindowValue {
  constructor(topic, partition, key, startMs, endMs, acc, emit, state) {
    Object.assign(this, { topic, partition, key, startMs, endMs, acc, emit, state });
  }
}

function concat(...parts) {
  const bytes = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  return bytes;
}

/** `at` as 8 bytes that sort as the numbers do. */
function ordered(at) {
  const bytes = new Uint8Array(8);
  new DataView(bytes.buffer).setBigUint64(0, BigInt.asUintN(64, at) ^ (1n << 63n));
  return bytes;
}

const windowKey = (endMs, key) => concat(WINDOW_PREFIX, ordered(endMs), key);

/** The open sessions of `key`: [start, end, aggregate bytes] each. */
function readSessions(state, key) {
  const data = state.get(concat(SESSION_PREFIX, key)) || new Uint8Array();
  const view = new DataView(data.buffer, data.byteOffset, data.length);
  const sessions = [];
  for (let at = 0; at + 20 <= data.length; ) {
    const length = view.getUint32(at + 16);
    sessions.push([view.getBigInt64(at), view.getBigInt64(at + 8), data.subarray(at + 20, at + 20 + length)]);
    at += 20 + length;
  }
  return sessions;
}

function writeSessions(state, key, sessions) {
  if (sessions.length === 0) {
    state.delete(concat(SESSION_PREFIX, key));
    return;
  }
  const parts = [];
  for (const [start, end, acc] of sessions) {
    const head = new Uint8Array(20);
    const view = new DataView(head.buffer);
    view.setBigInt64(0, start);
    view.setBigInt64(8, end);
    view.setUint32(16, acc.length);
    parts.push(head, acc);
  }
  state.set(concat(SESSION_PREFIX, key), concat(...parts));
}

const bytesOf = (key) => (typeof key === 'string' ? encoder.encode(key) : new Uint8Array(key));
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

/** Windows of one kind with one aggregate. */
export class Windowed {
  constructor(windows, aggregate, early = false) {
    this.windows = windows;
    this.aggregate = aggregate;
    this.early = early;
  }

  /** Runs a batch: `take(record)` says once per record what it brings (an
   * `Event`), or that it is in no window (null, or a `Rejected`: either way
   * it does not move the watermark, so a malformed record's Kafka timestamp
   * cannot close windows). Each event goes into its windows, or becomes a
   * `late` dead letter; then every window the watermark passed is handed to
   * `emit(out, windowValue)` once, as final (and, with `early`, every other
   * window the batch changed as early). */
  run(batch, out, take, emit) {
    const touched = this.early ? [] : null;
    for (const record of batch) {
      const taken = take(record);
      const time = record.time();
      if (!(taken instanceof Event)) {
        time.clearEventTime();
        if (taken instanceof Rejected) out.reject(record, taken.reason);
        continue;
      }
      const key = bytesOf(taken.key);
      let at = record.timestamp;
      if (taken.timeMs !== null && taken.timeMs !== undefined) {
        at = BigInt(taken.timeMs);
        time.setEventTime(at);
      }
      const watermark = time.watermark();
      const added =
        this.windows instanceof Session
          ? this.addToSession(record, key, at, taken.input, watermark, touched)
          : this.addToWindows(record, key, at, taken.input, watermark, touched);
      if (!added) {
        const shown = watermark === null ? 'None' : `Some(${watermark})`;
        time.late(`event time ${at} is behind the watermark ${shown}: its window has closed`);
      }
    }
    for (const timer of dueTimers()) this.close(batch, timer, out, emit);
    if (touched !== null) this.emitEarly(batch, touched, out, emit);
  }

  /** [start, end) of every window `time` falls in, oldest first. */
  windowsOf(time) {
    const { sizeMs, hopMs } = this.windows;
    const windows = [];
    for (let start = time - (((time % hopMs) + hopMs) % hopMs); start > time - sizeMs; start -= hopMs) {
      windows.push([start, start + sizeMs]);
    }
    return windows.reverse();
  }

  addToWindows(record, key, time, input, watermark, touched) {
    const state = record.state();
    const agg = this.aggregate;
    let added = false;
    for (const [, end] of this.windowsOf(time)) {
      if (watermark !== null && end - 1n <= watermark) continue;
      const at = windowKey(end, key);
      const stored = state.get(at);
      let acc = null;
      if (stored === null) {
        record.time().setTimer(key, end - 1n);
      } else {
        acc = agg.decode(stored);
      }
      if (acc === null) acc = agg.init();
      state.set(at, agg.encode(agg.add(acc, input)));
      if (touched !== null) touched.push([record.index, record.topic, record.partition, key, end]);
      added = true;
    }
    return added;
  }

  addToSession(record, key, time, input, watermark, touched) {
    const state = record.state();
    const agg = this.aggregate;
    const gap = this.windows.gapMs;
    let [start, end] = [time, time + gap];
    const meets = [];
    const apart = [];
    for (const s of readSessions(state, key)) {
      // A session the watermark has passed is closed, though its timer
      // fires only at the batch's end: nothing joins it.
      const open = watermark === null || s[1] - 1n > watermark;
      (open && s[0] < time + gap && time < s[1] ? meets : apart).push(s);
    }
    for (const s of meets) {
      if (s[0] < start) start = s[0];
      if (s[1] > end) end = s[1];
    }
    if (watermark !== null && end - 1n <= watermark) return false;
    let acc = agg.add(agg.init(), input);
    for (const s of meets) {
      if (s[1] !== end) record.time().deleteTimer(key, s[1] - 1n);
      const other = agg.decode(s[2]);
      if (other !== null) acc = agg.merge(acc, other);
    }
    record.time().setTimer(key, end - 1n);
    const sessions = [...apart, [start, end, agg.encode(acc)]];
    sessions.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    writeSessions(state, key, sessions);
    if (touched !== null) touched.push([record.index, record.topic, record.partition, key, end]);
    return true;
  }

  close(batch, timer, out, emit) {
    const state = timer.state();
    const end = timer.atMs + 1n;
    let start, data;
    if (this.windows instanceof Session) {
      const sessions = readSessions(state, timer.key);
      const found = sessions.findIndex((s) => s[1] === end);
      if (found < 0) return;
      [[start, , data]] = sessions.splice(found, 1);
      writeSessions(state, timer.key, sessions);
    } else {
      const at = windowKey(end, timer.key);
      data = state.get(at);
      if (data === null) return;
      state.delete(at);
      start = end - this.windows.sizeMs;
    }
    const acc = this.aggregate.decode(data);
    if (acc === null) return;
    const [topic, partition] = batch.partitionOf(timer.index) || ['', 0];
    emit(out, new WindowValue(topic, partition, timer.key, start, end, acc, 'final', state));
  }

  emitEarly(batch, touched, out, emit) {
    const seen = new Set();
    for (const [index, topic, partition, key, end] of touched) {
      const id = `${topic}\u0000${partition}\u0000${hex(key)}\u0000${end}`;
      if (seen.has(id)) continue;
      seen.add(id);
      const state = new State(index);
      let start, data;
      if (this.windows instanceof Session) {
        const found = readSessions(state, key).find((s) => s[1] === end);
        if (!found) continue;
        [start, , data] = found;
      } else {
        data = state.get(windowKey(end, key));
        if (data === null) continue;
        start = end - this.windows.sizeMs;
      }
      const acc = this.aggregate.decode(data);
      if (acc === null) continue;
      emit(out, new WindowValue(topic, partition, key, start, end, acc, 'early', state));
    }
  }
}
