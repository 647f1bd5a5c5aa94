// The windowed conformance transform in JavaScript: the same as the Rust
// test plugin `tests/plugins/windows` (per record key, the sum and count of
// the records' `amount` in windows of event time, one `windows` row per
// window), so they must give the same rows, state and digest on the same
// input (tests/tests/languages.rs).
//
// Records: a key, and a JSON value `{"amount": N}` (optionally the event
// time under `time_field`; else the Kafka timestamp). Anything else is
// rejected. JSON.parse reads `5.0` as 5, which Rust and Python reject as
// not an integer: the sample has no such value.
// Params: `windows` ("tumbling" with `size_ms`, "hopping" with `size_ms` and
// `hop_ms`, "session" with `gap_ms`), `early`, `retain_ms`, `time_field`.
import { exportTransform } from './sluice.js';
import { Event, Hopping, Rejected, Session, Tumbling, Windowed } from './window.js';

const int64 = (v) => (Number.isSafeInteger(v) ? BigInt(v) : null);

/** [total, records], 16 bytes: two big-endian int64. */
const SumCount = {
  init: () => [0n, 0n],
  add: (acc, amount) => [acc[0] + amount, acc[1] + 1n],
  merge: (acc, other) => [acc[0] + other[0], acc[1] + other[1]],
  encode: (acc) => {
    const bytes = new Uint8Array(16);
    const view = new DataView(bytes.buffer);
    view.setBigInt64(0, acc[0]);
    view.setBigInt64(8, acc[1]);
    return bytes;
  },
  decode: (data) => {
    if (data.length < 16) return null;
    const view = new DataView(data.buffer, data.byteOffset, 16);
    return [view.getBigInt64(0), view.getBigInt64(8)];
  },
};

const text = new TextDecoder('utf-8', { ignoreBOM: true });

class WindowSums {
  constructor(params) {
    const ms = (name) => {
      const value = int64(params[name]);
      if (value === null || value <= 0n) throw new Error(`windows params: \`${name}\` must be a positive integer`);
      return value;
    };
    let windows;
    if (params.windows === 'tumbling') windows = new Tumbling(ms('size_ms'));
    else if (params.windows === 'hopping') windows = new Hopping(ms('size_ms'), ms('hop_ms'));
    else if (params.windows === 'session') windows = new Session(ms('gap_ms'));
    else throw new Error('windows params: `windows` is tumbling, hopping or session');
    const retainMs = int64(params.retain_ms) ?? 0n;
    this.windowed = new Windowed(windows, SumCount, params.early === true, retainMs);
    this.timeField = typeof params.time_field === 'string' ? params.time_field : null;
  }

  take(r) {
    let obj = null;
    try {
      obj = r.json();
    } catch (e) {
      obj = null;
    }
    const isObject = obj !== null && typeof obj === 'object' && !Array.isArray(obj);
    const amount = isObject ? int64(obj.amount) : null;
    if (amount === null) return new Rejected('the value is not JSON with an integer `amount`');
    const timeMs = this.timeField === null ? null : int64(obj[this.timeField]);
    return new Event(r.key || new Uint8Array(), timeMs, amount);
  }

  process(batch, out) {
    const t = out.target('windows', {
      partition: 'int64', key: 'text', start_ms: 'int64', end_ms: 'int64',
      total: 'int64', records: 'int64', emit: 'text',
    });
    const emit = (out, w) =>
      out.row(t, [w.partition, text.decode(w.key), w.startMs, w.endMs, w.acc[0], w.acc[1], w.emit]);
    this.windowed.run(batch, out, (r) => this.take(r), emit);
  }
}

export const { init, process } = exportTransform(WindowSums);
