// {{name}}: a sluice transform in JavaScript.
//
// Each record's value is read as UTF-8 text (bad bytes replaced by U+FFFD);
// a record with no value is rejected (it becomes a dead letter); every other
// one gives a row of target `out` with its offset and its value, ASCII
// letters in upper case, after the `prefix` param. Every language's
// template does exactly this.
//
// Try it:   sluice build && sluice test dist/{{name}}.wasm --input sample.jsonl
import { exportTransform, log } from './sluice.js';

class Upper {
  constructor(params) {
    // The pipeline's `[module.params]`, parsed from JSON.
    this.prefix = params.prefix ?? '';
  }

  process(batch, out) {
    const t = out.target('out', { offset: 'int64', value: 'text' });
    for (const r of batch) {
      if (r.value === null) {
        out.reject(r, 'no value');
        continue;
      }
      out.row(t, { offset: r.offset, value: this.prefix + r.text().replace(/[a-z]+/g, (s) => s.toUpperCase()) });
    }
    log.info(`${batch.length} records`);
  }
}

export const { init, process } = exportTransform(Upper);
