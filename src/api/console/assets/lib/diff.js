// A file change as a line diff: the lines removed and added, with a little of what stayed
// around each change. A longest-common-subsequence table over the lines that differ (the
// common head and tail are taken off first); past MAX_CELLS it says the files are too large
// to compare here rather than hold the page.

import { h } from './dom.js';

/** The most cells of the comparison table: about 2,000 changed lines on each side. */
const MAX_CELLS = 4_000_000;
/** Unchanged lines shown around each change. */
const CONTEXT = 3;

/**
 * The lines of `before` and `after` (null: the file did not exist), as `[op, line]` pairs:
 * `' '` kept, `'-'` removed, `'+'` added; null when the files are too large to compare.
 */
export function lineDiff(before, after) {
  const a = lines(before);
  const b = lines(after);
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head += 1;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head
    && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail += 1;
  const x = a.slice(head, a.length - tail);
  const y = b.slice(head, b.length - tail);
  if ((x.length + 1) * (y.length + 1) > MAX_CELLS) return null;
  // common[i][j]: the longest common subsequence of x[i..] and y[j..].
  const width = y.length + 1;
  const common = new Uint32Array((x.length + 1) * width);
  for (let i = x.length - 1; i >= 0; i -= 1) {
    for (let j = y.length - 1; j >= 0; j -= 1) {
      common[i * width + j] = x[i] === y[j]
        ? common[(i + 1) * width + j + 1] + 1
        : Math.max(common[(i + 1) * width + j], common[i * width + j + 1]);
    }
  }
  const ops = a.slice(0, head).map((line) => [' ', line]);
  let i = 0;
  let j = 0;
  while (i < x.length || j < y.length) {
    if (i < x.length && j < y.length && x[i] === y[j]) {
      ops.push([' ', x[i]]);
      i += 1;
      j += 1;
    } else if (j < y.length && (i === x.length || common[i * width + j + 1] >= common[(i + 1) * width + j])) {
      ops.push(['+', y[j]]);
      j += 1;
    } else {
      ops.push(['-', x[i]]);
      i += 1;
    }
  }
  return ops.concat(a.slice(a.length - tail).map((line) => [' ', line]));
}

function lines(text) {
  if (text === null || text === undefined || text === '') return [];
  const all = String(text).split('\n');
  // A final newline ends the last line; it does not start another.
  if (all[all.length - 1] === '') all.pop();
  return all;
}

/** The diff as a `pre`, unchanged runs longer than the context folded into a marker line. */
export function diffView(before, after, label) {
  const ops = lineDiff(before, after);
  if (ops === null) return h('p', { class: 'who' }, 'Too large to compare here: read the patch through the API.');
  const near = ops.map(() => false);
  ops.forEach(([op], index) => {
    if (op === ' ') return;
    for (let k = Math.max(0, index - CONTEXT); k <= Math.min(ops.length - 1, index + CONTEXT); k += 1) near[k] = true;
  });
  const rows = [];
  let folded = 0;
  const fold = () => {
    if (folded) rows.push(h('span', { class: 'diff-fold' }, `\u22ef ${folded} unchanged line${folded === 1 ? '' : 's'}\n`));
    folded = 0;
  };
  ops.forEach(([op, line], index) => {
    if (!near[index]) {
      folded += 1;
      return;
    }
    fold();
    const kind = { '+': 'diff-add', '-': 'diff-del', ' ': 'diff-same' }[op];
    rows.push(h('span', { class: kind }, `${op} ${line}\n`));
  });
  fold();
  if (!ops.some(([op]) => op !== ' ')) rows.push(h('span', { class: 'diff-fold' }, 'No change.\n'));
  return h('pre', { class: 'output diff', tabindex: 0, 'aria-label': label }, rows);
}
