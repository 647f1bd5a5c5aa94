// The conformance transform in JavaScript (docs/languages.md states it; every
// language's copy must give byte-identical output on the same input).
import { exportTransform } from './sluice.js';

function asciiWords(text) {
  return text.split(/[^A-Za-z0-9]+/).filter((w) => w.length > 0).map((w) => w.toLowerCase());
}

class Conformance {
  process(batch, out) {
    const events = out.target('events', {
      offset: 'int64', user: 'text', score: 'float64', scaled: 'float64',
      key: 'bytes', words: 'int64', vip: 'bool',
    });
    const words = out.target('words', { offset: 'int64', word: 'text' });
    const now = batch.context.batchTimeMs;
    for (const r of batch) {
      let obj = null;
      try {
        obj = r.json();
      } catch (e) {
        obj = null;
      }
      if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) {
        out.reject(r, 'not a JSON object');
        continue;
      }
      if (obj.keep === false) continue;
      const score = typeof obj.score === 'number' ? obj.score : null;
      const split = typeof obj.text === 'string' ? asciiWords(obj.text) : [];
      out.row(events, {
        offset: r.offset,
        user: typeof obj.user === 'string' ? obj.user : null,
        score,
        scaled: score === null ? null : score * 0.1,
        key: r.key,
        words: split.length,
        vip: obj.vip === true,
      });
      for (const w of split) out.row(words, [r.offset, w]);
      if (typeof obj.user !== 'string') continue;
      const state = r.state();
      const n = (state.getInt(`n:${obj.user}`) ?? 0n) + 1n;
      const last = state.getText(`last:${obj.user}`);
      if (obj.forget === true) state.delete(`n:${obj.user}`);
      else state.setInt(`n:${obj.user}`, n);
      const expires = obj.expire === true ? now : now + 60000n;
      state.setExpiring(`last:${obj.user}`, new TextEncoder().encode(typeof obj.text === 'string' ? obj.text : ''), expires);
      // Declared where its first row is made: mid-batch, after rows of the
      // other targets (later calls find it by name).
      const seen = out.target('seen', { offset: 'int64', user: 'text', n: 'int64', last: 'text' });
      out.row(seen, [r.offset, obj.user, n, last]);
    }
  }
}

export const { init, process } = exportTransform(Conformance);
