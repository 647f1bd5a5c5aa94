// A deliberately misbehaving JavaScript transform, for the host's tests:
// each record's value names what it tries, and the row it writes (target
// `probe`: offset, what, n, text) says what it got.
//
// - `clock`: n = Date.now() (must be the batch time)
// - `random`: text = Math.random() and crypto.getRandomValues, printed
// - `print`: console.log 20,000 lines
// - `spin`, `bomb`, `recurse`, `throw`: loops forever, allocates without
//   end, recurses without end, throws
// - anything else: echoed (n = its length)
import { exportTransform } from './sluice.js';

function recurse(n) {
  return recurse(n + 1) + 1;
}

class Hostile {
  process(batch, out) {
    const t = out.target('probe', { offset: 'int64', what: 'text', n: 'int64', text: 'text' });
    for (const r of batch) {
      const what = r.text();
      let n = 0;
      let text = '';
      if (what === 'clock') {
        n = Date.now();
      } else if (what === 'random') {
        const bytes = new Uint8Array(8);
        crypto.getRandomValues(bytes);
        text = `${Math.random()} ${Array.from(bytes).join(',')}`;
      } else if (what === 'print') {
        for (let i = 0; i < 20000; i++) console.log(`line ${i} of a flood`);
      } else if (what === 'spin') {
        for (;;) {}
      } else if (what === 'bomb') {
        const hoard = [];
        for (;;) hoard.push(new Uint8Array(1 << 20).fill(hoard.length & 255));
      } else if (what === 'recurse') {
        recurse(0);
      } else if (what === 'throw') {
        throw new Error('hostile plugin throws on purpose');
      } else {
        n = what.length;
      }
      out.row(t, [r.offset, what, n, text]);
    }
  }
}

export const { init, process } = exportTransform(Hostile);
