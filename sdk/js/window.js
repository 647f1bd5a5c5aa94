// Event-time windows on keyed state and timers: tumbling, hopping and
// session windows per user key, each with a user aggregate, emitted once
// when the partition's watermark passes their end (and, optionally, early
// on every batch that changes them). A record whose windows have all closed
// is a dead letter of kind `late`, never dropped, or, with `retainMs`,
// updates a window that closed less than that ago (handed out again as
// 'update').
//
// It keeps windows in state exactly as the Rust SDK's
// `sluice_plugin::window` and the Python SDK's `sluice_plugin.window` do
// (docs/event-time.md), so a windowed transform gives the same rows, state
// and digest in any of them:
//
// - tumbling and hopping: the timer (`key`, end - 1) closes window [start,
//   end) of `key` and keeps its aggregate as its value, after a tag byte 1.
//   A timer with an empty value holds no window (a retention's) or one
//   opened before timer values, under `sluice/w/` + end (8 bytes,
//   big-endian, sign bit flipped) + `key`: read from there, moved into the
//   timer on its next change;
// - sessions: every open session of `key` under `sluice/s/` + `key`, per
//   session its start and end (8 bytes each, big-endian) and its
//   aggregate's length (4 bytes, big-endian) and bytes, in start order; a
//   timer (`key`, end - 1) per session closes it;
// - with a retention R: a closed window's aggregate under `sluice/r/` + end
//   + `key`, a closed session under `sluice/t/` + `key` (the layout of open
//   ones); a timer (`key`, end - 1 + R) forgets it (set without a value,
//   unless that timer exists already: it may hold a window).
//
//   import { Event, Rejected, Tumbling, Windowed, SUM } from './window.js';
//   const windowed = new Windowed(new Tumbling(60000n), SUM);
//   // take: once per record; null or a Rejected: in no window
//   const take = (r) => { const p = r.json(); return new Event(p.user, BigInt(p.ts), BigInt(p.cents)); };
//   windowed.run(batch, out, take, (out, w) => out.row(t, [utf8(w.key), w.startMs, w.acc]));
//
// What it costs a record: a host call for its event time; the host's
// watermark only when one of its windows may have closed (`Watermark`); a
// tumbling or hopping window is read from its timer and written back once a
// batch (`Held`), whatever the number of its records.
//
// Times are ms since the Unix epoch as BigInt. It must not read the host's
// clock or keep anything between batches outside state.

import { State, Time, dueTimers } from './sluice.js';

const encoder = new TextEncoder();
const WINDOW_PREFIX = encoder.encode('sluice/w/');
const SESSION_PREFIX = encoder.encode('sluice/s/');
const RETAINED_PREFIX = encoder.encode('sluice/r/');
const RETAINED_SESSION_PREFIX = encoder.encode('sluice/t/');

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
 * `decode` returns null for bytes that are not one, and must give back what
 * `encode` was given: a batch keeps each window's value in memory and state
 * keeps its bytes between batches, so a value that does not survive the
 * round trip would depend on where batches end. */
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
 * batch changed it, still open), 'final' (handed out once) or 'update' (late
 * records changed it after it closed, with `retainMs`). */
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
const retainedKey = (endMs, key) => concat(RETAINED_PREFIX, ordered(endMs), key);
/** The tag before a window's aggregate in its closing timer's value. */
const WINDOW_TAG = 1;

/** The aggregate of `key`'s window ending at `end` kept by its closing
 * timer's `value` or, for a window opened before timer values, under its
 * old key (removed when `take`, as its timer is about to hold it). */
function windowIn(state, value, key, end, take) {
  if (value.length > 0 && value[0] === WINDOW_TAG) return value.slice(1);
  const at = windowKey(end, key);
  const data = state.get(at);
  if (data !== null && take) state.delete(at);
  return data;
}

/** The aggregate of `key`'s open window ending at `end`: null if no timer
 * closes one there. */
function openWindow(state, time, key, end, take) {
  const value = time.timerValue(key, end - 1n);
  return value === null ? null : windowIn(state, value, key, end, take);
}

/** Sets a timer without a value (a retention's), unless the timer exists:
 * it may hold a window, and fires at the same time anyway. */
function setBareTimer(time, key, atMs) {
  if (time.timerValue(key, atMs) === null) time.setTimer(key, atMs);
}

/** The sessions under `at` (an open or a retained sessions key):
 * [start, end, aggregate bytes] each. */
function readSessions(state, at) {
  const data = state.get(at) || new Uint8Array();
  const view = new DataView(data.buffer, data.byteOffset, data.length);
  const sessions = [];
  for (let at = 0; at + 20 <= data.length; ) {
    const length = view.getUint32(at + 16);
    sessions.push([view.getBigInt64(at), view.getBigInt64(at + 8), data.subarray(at + 20, at + 20 + length)]);
    at += 20 + length;
  }
  return sessions;
}

function writeSessions(state, at, sessions) {
  if (sessions.length === 0) {
    state.delete(at);
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
  state.set(at, concat(...parts));
}

const byStart = (a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0);

const bytesOf = (key) => (typeof key === 'string' ? encoder.encode(key) : new Uint8Array(key));
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

const UNKNOWN = Symbol('unknown');

/** A partition's watermark just before a record, asked of the host only when
 * a window's fate depends on it. Its ceiling is the higher of the watermark
 * the host told for one of the partition's records in the batch and the
 * event times of its records since: the watermark (highest event time minus
 * a lateness never negative, never falling) is at most that, so a window
 * whose last millisecond is past it is open for sure. */
class Watermark {
  constructor(time, atMost) {
    this.time = time;
    this.atMost = atMost;
    this.told = UNKNOWN;
  }

  get() {
    if (this.told === UNKNOWN) this.told = this.time.watermark();
    return this.told;
  }

  /** Whether the watermark has reached `atMs` (a window's last
   * millisecond): the window has closed. */
  reached(atMs) {
    const ceiling = this.atMost;
    if (ceiling !== UNKNOWN && (ceiling === null || atMs > ceiling)) return false;
    const watermark = this.get();
    return watermark !== null && atMs <= watermark;
  }

  /** The ceiling for the partition's next record, after this one at
   * `timeMs`. */
  ceilingAfter(timeMs) {
    const known = this.told === UNKNOWN ? this.atMost : this.told;
    if (known === UNKNOWN) return UNKNOWN;
    return known === null || timeMs > known ? timeMs : known;
  }
}

/** The open tumbling and hopping windows a batch adds records to, held
 * (their aggregates as values) until the batch's end: each is read from its
 * closing timer once and written back to it once, in the order first read,
 * however many of the batch's records it takes. The host keeps a timer's
 * last value, so what the batch commits is the same. Written back before
 * the batch asks for its due timers; a window a late record closes is let
 * go (`take`). */
class Held {
  constructor() {
    // topic, partition, key, end -> [index of a record of its partition,
    // key, end, aggregate]
    this.windows = new Map();
  }

  static at(record, key, end) {
    return `${record.topic}\0${record.partition}\0${hex(key)}\0${end}`;
  }

  get(record, key, end, read) {
    const at = Held.at(record, key, end);
    let held = this.windows.get(at);
    if (held === undefined) {
      held = [record.index, key, end, read()];
      this.windows.set(at, held);
    }
    return held;
  }

  take(record, key, end) {
    const at = Held.at(record, key, end);
    const held = this.windows.get(at);
    this.windows.delete(at);
    return held;
  }

  writeBack(encode) {
    for (const [index, key, end, acc] of this.windows.values()) {
      new Time(index).setTimerValue(key, end - 1n, concat(Uint8Array.of(WINDOW_TAG), encode(acc)));
    }
    this.windows = new Map();
  }
}

/** Windows of one kind with one aggregate. With `retainMs`, a closed window
 * takes late records that long more (event time): a record behind the
 * watermark whose window ended less than `retainMs` before it updates the
 * window, handed out again as 'update' once per batch, instead of becoming a
 * `late` dead letter; a closed session only if the record's time is within
 * its records (first to last), so its bounds never move. */
export class Windowed {
  constructor(windows, aggregate, early = false, retainMs = 0n) {
    this.windows = windows;
    this.aggregate = aggregate;
    this.early = early;
    this.retainMs = BigInt(retainMs) > 0n ? BigInt(retainMs) : 0n;
  }

  /** Runs a batch: `take(record)` says once per record what it brings (an
   * `Event`), or that it is in no window (null, or a `Rejected`: either way
   * it does not move the watermark, so a malformed record's Kafka timestamp
   * cannot close windows). Each event goes into its windows, or updates
   * retained ones, or becomes a `late` dead letter; then every window the
   * watermark passed is handed to `emit(out, windowValue)` once, as final,
   * every retained window late records changed as 'update' (and, with
   * `early`, every open window the batch changed as early). */
  run(batch, out, take, emit) {
    // held: open windows changed; early: those too, listed; closed: final
    // values of windows a late record reached before their timer; updated:
    // closed windows changed.
    const pending = { held: new Held(), early: this.early ? [] : null, closed: [], updated: [] };
    const ceilings = new Map();
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
      const partition = `${record.topic}\0${record.partition}`;
      const ceiling = ceilings.has(partition) ? ceilings.get(partition) : UNKNOWN;
      const watermark = new Watermark(time, ceiling);
      const added =
        this.windows instanceof Session
          ? this.addToSession(record, key, at, taken.input, watermark.get(), pending)
          : this.addToWindows(record, key, at, taken.input, watermark, pending);
      if (!added) {
        const shown = watermark.get() === null ? 'None' : `Some(${watermark.get()})`;
        time.late(`event time ${at} is behind the watermark ${shown}: its window has closed`);
      }
      ceilings.set(partition, watermark.ceilingAfter(at));
    }
    pending.held.writeBack((acc) => this.aggregate.encode(acc));
    const fired = dueTimers();
    for (const [index, key, start, end, data] of pending.closed) {
      this.handOut(batch, out, emit, index, key, start, end, data, 'final');
    }
    // Before the timers: one may forget a window this batch updated.
    this.emitChanged(batch, pending.updated, 'update', out, emit);
    for (const timer of fired) this.close(batch, timer, out, emit);
    if (pending.early !== null) this.emitChanged(batch, pending.early, 'early', out, emit);
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

  /** Whether a window ending at `end`, closed by `watermark`, still takes
   * late records. */
  retained(end, watermark) {
    return this.retainMs > 0n && watermark !== null && end - 1n + this.retainMs > watermark;
  }

  decode(data) {
    const acc = data === null ? null : this.aggregate.decode(data);
    return acc === null ? this.aggregate.init() : acc;
  }

  addToWindows(record, key, time, input, watermark, pending) {
    const state = record.state();
    const agg = this.aggregate;
    let added = false;
    for (const [start, end] of this.windowsOf(time)) {
      if (watermark.reached(end - 1n)) {
        if (this.updateClosedWindow(record, key, start, end, input, watermark.get(), pending)) added = true;
        continue;
      }
      const held = pending.held.get(record, key, end, () =>
        this.decode(openWindow(state, record.time(), key, end, true)),
      );
      held[3] = agg.add(held[3], input);
      if (pending.early !== null) pending.early.push([record.index, record.topic, record.partition, key, end]);
      added = true;
    }
    return added;
  }

  /** Adds a late record to the closed window [start, end) if it is retained
   * (closing it first if its timer has not yet). */
  updateClosedWindow(record, key, start, end, input, watermark, pending) {
    if (!this.retained(end, watermark)) return false;
    const state = record.state();
    const at = retainedKey(end, key);
    let data = state.get(at);
    if (data === null) {
      const time = record.time();
      const held = pending.held.take(record, key, end);
      data = held !== undefined ? this.aggregate.encode(held[3]) : openWindow(state, time, key, end, true);
      if (data !== null) {
        // Its timer stays, without the window: it may also forget a
        // retained one.
        time.setTimer(key, end - 1n);
        pending.closed.push([record.index, key, start, end, data]);
      }
      setBareTimer(time, key, end - 1n + this.retainMs);
    }
    state.set(at, this.aggregate.encode(this.aggregate.add(this.decode(data), input)));
    pending.updated.push([record.index, record.topic, record.partition, key, end]);
    return true;
  }

  addToSession(record, key, time, input, watermark, pending) {
    const state = record.state();
    const agg = this.aggregate;
    const gap = this.windows.gapMs;
    let [start, end] = [time, time + gap];
    const sessions = readSessions(state, concat(SESSION_PREFIX, key));
    const meets = [];
    const apart = [];
    for (const s of sessions) {
      // A session the watermark has passed is closed, though its timer
      // fires only at the batch's end: nothing joins it.
      const open = watermark === null || s[1] - 1n > watermark;
      (open && s[0] < time + gap && time < s[1] ? meets : apart).push(s);
    }
    for (const s of meets) {
      if (s[0] < start) start = s[0];
      if (s[1] > end) end = s[1];
    }
    if (watermark !== null && end - 1n <= watermark) {
      return this.updateClosedSession(record, key, time, input, watermark, sessions, pending);
    }
    let acc = agg.add(agg.init(), input);
    for (const s of meets) {
      // With a retention, the timer may also forget a closed session.
      if (s[1] !== end && this.retainMs === 0n) record.time().deleteTimer(key, s[1] - 1n);
      const other = agg.decode(s[2]);
      if (other !== null) acc = agg.merge(acc, other);
    }
    record.time().setTimer(key, end - 1n);
    const kept = [...apart, [start, end, agg.encode(acc)]];
    kept.sort(byStart);
    writeSessions(state, concat(SESSION_PREFIX, key), kept);
    if (pending.early !== null) pending.early.push([record.index, record.topic, record.partition, key, end]);
    return true;
  }

  /** Adds a late record to the retained closed session of its key whose
   * records' span holds its time (closing it first if its timer has not yet:
   * `sessions` are the key's open ones). */
  updateClosedSession(record, key, time, input, watermark, sessions, pending) {
    const gap = this.windows.gapMs;
    const holds = (s) => this.retained(s[1], watermark) && s[0] <= time && time <= s[1] - gap;
    const state = record.state();
    const retainedAt = concat(RETAINED_SESSION_PREFIX, key);
    const retained = readSessions(state, retainedAt);
    let at = retained.findIndex(holds);
    if (at < 0) {
      const found = sessions.findIndex((s) => s[1] - 1n <= watermark && holds(s));
      if (found < 0) return false;
      const [session] = sessions.splice(found, 1);
      writeSessions(state, concat(SESSION_PREFIX, key), sessions);
      pending.closed.push([record.index, key, session[0], session[1], session[2]]);
      record.time().setTimer(key, session[1] - 1n + this.retainMs);
      retained.push(session);
      retained.sort(byStart);
      at = retained.findIndex(holds);
    }
    const session = retained[at];
    session[2] = this.aggregate.encode(this.aggregate.add(this.decode(session[2]), input));
    writeSessions(state, retainedAt, retained);
    pending.updated.push([record.index, record.topic, record.partition, key, session[1]]);
    return true;
  }

  /** Hands out the window `timer` closes, as final, keeping it if there is a
   * retention; forgets the retained window it ends. */
  close(batch, timer, out, emit) {
    const state = timer.state();
    const end = timer.atMs + 1n;
    if (this.retainMs > 0n) this.find(state, timer.key, end - this.retainMs, true, true);
    const session = this.windows instanceof Session;
    let closed;
    if (session) {
      closed = this.find(state, timer.key, end, false, true);
    } else {
      const data = windowIn(state, timer.value, timer.key, end, true);
      closed = data === null ? null : [end - this.windows.sizeMs, data];
    }
    if (closed === null) return;
    const [start, data] = closed;
    if (this.retainMs > 0n) {
      this.keepClosed(state, timer.key, start, end, data);
      const at = timer.atMs + this.retainMs;
      if (session) timer.time().setTimer(timer.key, at);
      else setBareTimer(timer.time(), timer.key, at);
    }
    this.handOut(batch, out, emit, timer.index, timer.key, start, end, data, 'final');
  }

  /** The window of `key` ending at `end`, open or `retained`: [start,
   * bytes], removed from state when `take`; null if there is none. */
  find(state, key, end, retained, take) {
    if (this.windows instanceof Session) {
      const at = concat(retained ? RETAINED_SESSION_PREFIX : SESSION_PREFIX, key);
      const sessions = readSessions(state, at);
      const found = sessions.findIndex((s) => s[1] === end);
      if (found < 0) return null;
      const [[start, , data]] = sessions.splice(found, 1);
      if (take) writeSessions(state, at, sessions);
      return [start, data];
    }
    let data;
    if (retained) {
      const at = retainedKey(end, key);
      data = state.get(at);
      if (data !== null && take) state.delete(at);
    } else {
      data = openWindow(state, new Time(state.index), key, end, take);
    }
    if (data === null) return null;
    return [end - this.windows.sizeMs, data];
  }

  /** Keeps a closed window for late records. */
  keepClosed(state, key, start, end, data) {
    if (this.windows instanceof Session) {
      const at = concat(RETAINED_SESSION_PREFIX, key);
      const retained = readSessions(state, at);
      retained.push([start, end, data]);
      retained.sort(byStart);
      writeSessions(state, at, retained);
    } else {
      state.set(retainedKey(end, key), data);
    }
  }

  handOut(batch, out, emit, index, key, start, end, data, why) {
    const acc = this.aggregate.decode(data);
    if (acc === null) return;
    const [topic, partition] = batch.partitionOf(index) || ['', 0];
    emit(out, new WindowValue(topic, partition, key, start, end, acc, why, new State(index)));
  }

  /** Hands out, as `why`, each window the batch changed (early: still open;
   * update: still retained), once, in the order first changed. */
  emitChanged(batch, touched, why, out, emit) {
    const seen = new Set();
    for (const [index, topic, partition, key, end] of touched) {
      const id = `${topic}\u0000${partition}\u0000${hex(key)}\u0000${end}`;
      if (seen.has(id)) continue;
      seen.add(id);
      const found = this.find(new State(index), key, end, why === 'update', false);
      if (found === null) continue;
      const [start, data] = found;
      this.handOut(batch, out, emit, index, key, start, end, data, why);
    }
  }
}
