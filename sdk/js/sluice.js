// The JavaScript SDK for sluice transforms.
//
// Owns the guest side of the `sluice:plugin` world for JavaScript: it hides
// the columnar batch layout behind an iterator of records and the columnar
// output layout behind a row builder. A transform is a class:
//
//   import { exportTransform } from './sluice.js';
//   class Upper {
//     constructor(params) {}
//     process(batch, out) {
//       const t = out.target('upper', { value: 'text' });
//       for (const r of batch) out.row(t, { value: r.text().toUpperCase() });
//     }
//   }
//   export const { init, process } = exportTransform(Upper);
//
// Built with `sluice build` (componentize-js). It must not reach outside the
// world: the host gives the module a fixed clock (Date.now() is the batch
// time), seeded Math.random(), no files and no network.

import { write } from 'sluice:plugin/log@0.1.3';
import * as stateImport from 'sluice:plugin/state@0.1.3';
import * as timeImport from 'sluice:plugin/time@0.1.3';

const KINDS = ['int64', 'float64', 'text', 'bytes', 'bool'];
// ignoreBOM keeps a leading BOM, as the other SDKs' text does.
const utf8 = new TextDecoder('utf-8', { ignoreBOM: true });
// ignoreBOM keeps a BOM in the text, so JSON.parse refuses it as every language does.
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
const encoder = new TextEncoder();

/** Fails the whole batch (not a trap); `retryable` when a rerun may pass. */
export class BatchError extends Error {
  constructor(message, retryable = false) {
    super(message);
    this.retryable = retryable;
  }
}

/** Deterministic logging, buffered by the host per batch. */
export const log = {
  debug: (m) => write('debug', String(m)),
  info: (m) => write('info', String(m)),
  warn: (m) => write('warn', String(m)),
  error: (m) => write('error', String(m)),
};

/** One input record; `key` and `value` are Uint8Array or null. */
export class Record {
  constructor(index, topic, partition, offset, timestamp, key, value, headers) {
    this.index = index;
    this.topic = topic;
    this.partition = partition;
    this.offset = offset; // BigInt
    this.timestamp = timestamp; // BigInt
    this.key = key;
    this.value = value;
    this.headers = headers; // [name, Uint8Array | null][]
  }
  /** The value as UTF-8 text ('' when null; bad bytes replaced). */
  text() {
    return this.value === null ? '' : utf8.decode(this.value);
  }
  /** The value parsed as JSON from strict UTF-8 (throws when it is not,
   * when arrays and objects nest deeper than MAX_JSON_DEPTH, and at a lone
   * surrogate escape). */
  json() {
    if (this.value === null) throw new Error('value is null');
    const text = strictUtf8.decode(this.value);
    checkJson(text);
    return JSON.parse(text);
  }
  /** The keyed state of the partition this record came from. */
  state() {
    return new State(this.index);
  }
  /** Event time of the partition this record came from. */
  time() {
    return new Time(this.index);
  }
}

/** Event time of one input partition, as a record (or a fired timer) names
 * it. A partition's watermark is the highest event time of its records so
 * far minus `event_time.allowed_lateness_ms`, kept in its state by the
 * host; a timer comes due once the watermark reaches its time, in the batch
 * that moved it there (`dueTimers`). Times are ms since the Unix epoch,
 * BigInt (a Number is taken too). */
export class Time {
  constructor(index) {
    this.index = index;
  }
  /** The partition's watermark just before this record (BigInt): as the
   * batch started, moved by the partition's records before it; null
   * before its first record. */
  watermark() {
    const watermark = timeImport.watermark(this.index);
    return watermark === undefined ? null : watermark;
  }
  /** Sets this record's event time (default: its Kafka timestamp). Call it
   * (or `clearEventTime`) in record order, before `watermark` of later
   * records and before `dueTimers`. */
  setEventTime(timeMs) {
    timeImport.setRecordTime(this.index, BigInt(timeMs));
  }
  /** Leaves this record out of the watermark: it has no event time (a
   * record no window takes: no key, not parseable). */
  clearEventTime() {
    timeImport.setRecordTime(this.index, undefined);
  }
  /** Sets the timer (`key`, `atMs`) on the partition (`key` at most 245
   * bytes); setting it again is one timer (and empties its value). */
  setTimer(key, atMs) {
    timeImport.setTimer(this.index, stateKey(key), BigInt(atMs));
  }
  /** Sets the timer (`key`, `atMs`) keeping `value` (a Uint8Array) with
   * it, bounded like a state value, handed back in `FiredTimer.value`:
   * state that lives as long as the timer, one stored entry where a state
   * key and a timer would take two. Setting it again replaces the value. */
  setTimerValue(key, atMs, value) {
    timeImport.setTimerValue(this.index, stateKey(key), BigInt(atMs), value);
  }
  /** The value kept with the timer (`key`, `atMs`): null if there is no
   * such timer (never set, deleted, fired), empty if it was set by
   * `setTimer`. */
  timerValue(key, atMs) {
    const value = timeImport.timerValue(this.index, stateKey(key), BigInt(atMs));
    return value === undefined ? null : value;
  }
  /** Removes the timer (`key`, `atMs`) of the partition. */
  deleteTimer(key, atMs) {
    timeImport.deleteTimer(this.index, stateKey(key), BigInt(atMs));
  }
  /** Makes the record a dead letter of kind `late` with `reason`. */
  late(reason) {
    timeImport.late(this.index, String(reason));
  }
}

/** A timer that came due: `index` names its partition, `key` is a
 * Uint8Array, `atMs` a BigInt, `value` what `setTimerValue` kept with it
 * (a Uint8Array, empty for `setTimer`). */
export class FiredTimer {
  constructor(index, key, atMs, value = new Uint8Array(0)) {
    this.index = index;
    this.key = key;
    this.atMs = atMs;
    this.value = value;
  }
  /** The keyed state of the timer's partition. */
  state() {
    return new State(this.index);
  }
  /** Event time of the timer's partition. */
  time() {
    return new Time(this.index);
  }
}

/** Moves each partition's watermark past the batch's records and returns
 * the timers that came due by it, oldest first, each once (they are removed
 * as they are returned). What the module writes and emits for them commits
 * with this batch. */
export function dueTimers() {
  return timeImport.dueTimersWithValues().map((t) => new FiredTimer(t.index, t.key, t.atMs, t.value));
}

/** How many arrays and objects Record.json() lets nest. Every SDK's JSON
 * helper refuses what Rust's serde_json refuses beyond RFC 8259
 * (docs/languages.md): a deeper value (it would exhaust the module's stack)
 * and a \\u escape of half a surrogate pair (it has no UTF-8 encoding). */
export const MAX_JSON_DEPTH = 127;

/** More than `limit` of `c` in `text`. */
function moreThan(text, c, limit) {
  for (let at = text.indexOf(c), n = 0; at >= 0; at = text.indexOf(c, at + 1)) {
    if (++n > limit) return true;
  }
  return false;
}

function checkJson(text) {
  // The exact scan runs only when a cheap count says it may find something.
  const deep = moreThan(text, '[', MAX_JSON_DEPTH / 2) || moreThan(text, '{', MAX_JSON_DEPTH / 2);
  if (!deep && !text.includes('\\u')) return;
  let depth = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString && c === '\\') {
      i += text[i + 1] === 'u' ? surrogates(text, i) - 1 : 1;
    } else if (inString) {
      inString = c !== '"';
    } else if (c === '"') {
      inString = true;
    } else if (c === '[' || c === '{') {
      if (++depth > MAX_JSON_DEPTH) throw new Error(`JSON nested deeper than ${MAX_JSON_DEPTH} levels`);
    } else if (c === ']' || c === '}') {
      depth--;
    }
  }
}

/** The code unit of the 4 hex digits at `at`, or -1. */
function hex4(text, at) {
  const digits = text.slice(at, at + 4);
  return /^[0-9a-fA-F]{4}$/.test(digits) ? parseInt(digits, 16) : -1;
}

/** Checks the \\u escape at `i`; returns its length (a pair: both). */
function surrogates(text, i) {
  const unit = hex4(text, i + 2);
  const lone = () => new Error(`lone surrogate escape \\u${unit.toString(16).padStart(4, '0')} in JSON`);
  if (unit >= 0xdc00 && unit <= 0xdfff) throw lone();
  if (unit >= 0xd800 && unit <= 0xdbff) {
    const low = text.slice(i + 6, i + 8) === '\\u' ? hex4(text, i + 8) : -1;
    if (low < 0xdc00 || low > 0xdfff) throw lone();
    return 12;
  }
  return 6;
}

const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;
const INTEGER = /^-?[0-9]+$/;
const stateKey = (key) => (typeof key === 'string' ? encoder.encode(key) : new Uint8Array(key));

/** Keyed state of one input partition, as a record sees it: the state as
 * the batch started plus the batch's own earlier writes. The host commits
 * what the batch writes with its rows and offsets, exactly once, and
 * replays it in `sluice verify`. Keys (Uint8Array, or a string as UTF-8)
 * are at most 255 bytes; values at most `limits.max_state_value_kib`.
 *
 * The typed helpers store integers as their decimal text and strings as
 * UTF-8: the same bytes in every SDK. */
export class State {
  constructor(index) {
    this.index = index;
  }
  /** The value under `key` (Uint8Array), or null if absent or expired. */
  get(key) {
    const value = stateImport.get(this.index, stateKey(key));
    return value === undefined ? null : value;
  }
  /** Stores `value` (Uint8Array) under `key`. */
  set(key, value) {
    stateImport.set(this.index, stateKey(key), new Uint8Array(value), undefined);
  }
  /** Stores `value` under `key` until `expiresAtMs` (ms since the epoch,
   * Number or BigInt): batches whose batch time is at or past it read it as
   * absent. Expiry follows batch time (`batch.context.batchTimeMs`) or a
   * time the module computes, never the host's clock. */
  setExpiring(key, value, expiresAtMs) {
    stateImport.set(this.index, stateKey(key), new Uint8Array(value), BigInt(expiresAtMs));
  }
  /** Removes `key`. */
  delete(key) {
    stateImport['delete'](this.index, stateKey(key));
  }
  /** The integer under `key` as a BigInt (decimal text: an optional `-`
   * then digits, in the int64 range); null if absent or anything else. */
  getInt(key) {
    const value = this.getText(key);
    if (value === null || !INTEGER.test(value)) return null;
    const n = BigInt(value);
    return n < I64_MIN || n > I64_MAX ? null : n;
  }
  /** Stores an int64 (BigInt, or a safe-integer Number) as decimal text. */
  setInt(key, value) {
    if (typeof value === 'number' && !Number.isSafeInteger(value)) throw new RangeError(`${value} is not an integer`);
    const n = BigInt(value);
    if (n < I64_MIN || n > I64_MAX) throw new RangeError(`${n} is not an int64`);
    this.set(key, encoder.encode(n.toString()));
  }
  /** The text under `key`; null if absent or not UTF-8. */
  getText(key) {
    const value = this.get(key);
    if (value === null) return null;
    try {
      return strictUtf8.decode(value);
    } catch (e) {
      return null;
    }
  }
  /** Stores `value` (a string) under `key` as UTF-8. */
  setText(key, value) {
    this.set(key, encoder.encode(value));
  }
}

function take(data, length, at) {
  if (length < 0) return [null, at];
  return [data.subarray(at, at + length), at + length];
}

/** A batch of records, iterated in order. */
export class Batch {
  constructor(ctx, raw) {
    this.context = ctx; // { pipeline, batchId, batchTimeMs (BigInt), seed (BigInt) }
    this.raw = raw;
  }
  get length() {
    return this.raw.offsets.length;
  }
  /** `[topic, partition]` of record `index` (or a timer's index), or null. */
  partitionOf(index) {
    for (const s of this.raw.slices) {
      if (s.first <= index && index < s.first + s.count) return [s.topic, s.partition];
    }
    return null;
  }
  *[Symbol.iterator]() {
    const raw = this.raw;
    let keyAt = 0, valueAt = 0, nameAt = 0, headerValueAt = 0, headerAt = 0;
    for (const s of raw.slices) {
      for (let i = s.first; i < s.first + s.count; i++) {
        let key, value;
        [key, keyAt] = take(raw.keys, raw.keyLengths[i], keyAt);
        [value, valueAt] = take(raw.values, raw.valueLengths[i], valueAt);
        const headers = [];
        for (let h = headerAt; h < headerAt + raw.headerCounts[i]; h++) {
          const n = raw.headerNameLengths[h];
          const name = utf8.decode(raw.headerNames.subarray(nameAt, nameAt + n));
          nameAt += n;
          let hv;
          [hv, headerValueAt] = take(raw.headerValues, raw.headerValueLengths[h], headerValueAt);
          headers.push([name, hv]);
        }
        headerAt += raw.headerCounts[i];
        yield new Record(i, s.topic, s.partition, raw.offsets[i], raw.timestamps[i], key, value, headers);
      }
    }
  }
}

/** The rows of a batch, by target, and its rejected records. */
export class Output {
  constructor() {
    this.targets = [];
    this.byName = new Map();
    this.rejections = [];
  }
  /** Declares target `name` with `{column: kind}` (kinds: int64, float64,
   * text, bytes, bool), in order; returns its handle. */
  target(name, columns) {
    if (this.byName.has(name)) return this.byName.get(name);
    const names = Object.keys(columns);
    for (const c of names) {
      if (!KINDS.includes(columns[c])) throw new Error(`column ${c}: kind ${columns[c]} is not one of ${KINDS}`);
    }
    this.targets.push({ name, names, known: new Set(names), kinds: names.map((c) => columns[c]), values: names.map(() => []), rows: 0 });
    this.byName.set(name, this.targets.length - 1);
    return this.targets.length - 1;
  }
  /** Adds a row: an object by column name, or an array in declared order;
   * null or undefined is null. */
  row(target, values) {
    // Plain loops, no closures or intermediate arrays: in an interpreter
    // (SpiderMonkey compiled to Wasm runs without a JIT) each one costs.
    const t = this.targets[target];
    const columns = t.values;
    const width = columns.length;
    if (Array.isArray(values)) {
      if (values.length !== width) throw new Error(`target ${t.name} takes ${width} values, got ${values.length}`);
      for (let i = 0; i < width; i++) columns[i].push(values[i]);
    } else {
      const names = Object.keys(values);
      for (let i = 0; i < names.length; i++) {
        if (!t.known.has(names[i])) throw new Error(`target ${t.name} has no column ${names[i]}`);
      }
      const declared = t.names;
      for (let i = 0; i < width; i++) columns[i].push(values[declared[i]]);
    }
    t.rows += 1;
  }
  /** Makes `record` a dead letter with `reason`. */
  reject(record, reason) {
    this.rejections.push({ index: record.index, reason: String(reason) });
  }
  toWit() {
    return {
      targets: this.targets.map((t) => ({
        target: t.name,
        rows: t.rows,
        columns: t.names.map((n, i) => column(n, t.kinds[i], t.values[i])),
      })),
      rejections: this.rejections,
    };
  }
}

const isNull = (v) => v === null || v === undefined;

function column(name, kind, values) {
  const n = values.length;
  let nulls = new Uint8Array(n);
  let anyNull = false;
  for (let i = 0; i < n; i++) {
    if (isNull(values[i])) {
      nulls[i] = 1;
      anyNull = true;
    }
  }
  if (!anyNull) nulls = new Uint8Array();
  let data;
  if (kind === 'int64') {
    const val = new BigInt64Array(n);
    for (let i = 0; i < n; i++) if (!nulls[i]) val[i] = BigInt(values[i]);
    data = { tag: 'int64', val };
  } else if (kind === 'float64') {
    const val = new Float64Array(n);
    for (let i = 0; i < n; i++) if (!nulls[i]) val[i] = Number(values[i]);
    data = { tag: 'float64', val };
  } else if (kind === 'bool') {
    const val = new Uint8Array(n);
    for (let i = 0; i < n; i++) if (values[i]) val[i] = 1;
    data = { tag: 'boolean', val };
  } else {
    const parts = new Array(n);
    const lengths = new Uint32Array(n);
    let total = 0;
    for (let i = 0; i < n; i++) {
      const v = values[i];
      const p = isNull(v) ? EMPTY : typeof v === 'string' ? encoder.encode(v) : new Uint8Array(v);
      parts[i] = p;
      lengths[i] = p.length;
      total += p.length;
    }
    const bytes = new Uint8Array(total);
    let at = 0;
    for (let i = 0; i < n; i++) {
      bytes.set(parts[i], at);
      at += parts[i].length;
    }
    data = { tag: kind === 'text' ? 'text' : 'bytes', val: { lengths, data: bytes } };
  }
  return { name, nulls, data };
}
const EMPTY = new Uint8Array();

/** The `init` and `process` exports around a transform class, whose
 * constructor takes the params (parsed JSON) and whose `process(batch, out)`
 * fills `out`. */
export function exportTransform(TransformClass) {
  let instance = null;
  return {
    init(params) {
      try {
        instance = new TransformClass(params ? JSON.parse(params) : {});
      } catch (e) {
        throw `${e && e.name ? e.name + ': ' : ''}${e && e.message !== undefined ? e.message : e}`;
      }
    },
    process(ctx, raw) {
      const out = new Output();
      try {
        instance.process(new Batch(ctx, raw), out);
      } catch (e) {
        if (e instanceof BatchError) throw { message: e.message, retryable: e.retryable };
        // Anything else is a bug or a poison record: it must trap (the host
        // retries, then isolates the record), not become a declared error.
        // Say what it was, then throw what the bindings cannot lower.
        write('error', `uncaught ${e && e.stack ? `${e}\n${e.stack}` : String(e)}`);
        throw 0n;
      }
      return out.toWit();
    },
  };
}
