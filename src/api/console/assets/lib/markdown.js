// The Markdown a model writes, as elements: paragraphs, headings, lists, fenced code,
// block quotes, and inline code, bold, emphasis and links. Built with `h` alone: text
// only ever becomes text nodes, and a link only an http(s) one, so a model's words cannot
// inject markup or script. Anything else stays as the text it was.

import { h } from './dom.js';

/** `text` as block elements. */
export function markdown(text) {
  const blocks = [];
  const lines = String(text || '').replace(/\r\n?/g, '\n').split('\n');
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+-]*)\s*$/);
    if (fence) {
      const code = [];
      for (i += 1; i < lines.length && !lines[i].trim().startsWith(fence[1]); i += 1) code.push(lines[i]);
      i += 1;
      blocks.push(h('pre', { class: 'code' }, h('code', fence[2] ? { 'data-lang': fence[2] } : {}, code.join('\n'))));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      // Headings inside a page's section: h3 at most, so they never outrank the page's.
      blocks.push(h(`h${Math.min(heading[1].length + 2, 6)}`, { class: 'md-heading' }, inline(heading[2])));
      i += 1;
      continue;
    }
    const list = listOf(line);
    if (list) {
      const items = [];
      while (i < lines.length && listOf(lines[i]) && listOf(lines[i]).ordered === list.ordered) {
        items.push(h('li', {}, inline(listOf(lines[i]).text)));
        i += 1;
      }
      blocks.push(h(list.ordered ? 'ol' : 'ul', {}, items));
      continue;
    }
    if (line.startsWith('>')) {
      const quoted = [];
      for (; i < lines.length && lines[i].startsWith('>'); i += 1) quoted.push(lines[i].replace(/^>\s?/, ''));
      blocks.push(h('blockquote', {}, markdown(quoted.join('\n'))));
      continue;
    }
    if (line.trim() === '') {
      i += 1;
      continue;
    }
    const paragraph = [];
    for (; i < lines.length && lines[i].trim() !== '' && !startsBlock(lines[i]); i += 1) paragraph.push(lines[i]);
    blocks.push(h('p', {}, inline(paragraph.join('\n'))));
  }
  return blocks;
}

function listOf(line) {
  const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
  if (bullet) return { ordered: false, text: bullet[1] };
  const numbered = line.match(/^\s*\d{1,9}[.)]\s+(.*)$/);
  return numbered ? { ordered: true, text: numbered[1] } : null;
}

function startsBlock(line) {
  return /^\s*(```|~~~)/.test(line) || /^#{1,6}\s/.test(line) || listOf(line) !== null || line.startsWith('>');
}

/** The spans of one block: `code`, **bold**, *emphasis* or _emphasis_, [links](https://…). */
const INLINE = /(`+)([\s\S]+?)\1|\*\*([\s\S]+?)\*\*|\*([^*\s][^*]*?)\*|\b_([^_\s][^_]*?)_\b|\[([^\]]+)\]\(([^)\s]+)\)/g;

export function inline(text) {
  const out = [];
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) out.push(text.slice(last, match.index));
    const [whole, , code, bold, em1, em2, label, url] = match;
    if (code !== undefined) out.push(h('code', {}, code));
    else if (bold !== undefined) out.push(h('strong', {}, inline(bold)));
    else if (em1 !== undefined || em2 !== undefined) out.push(h('em', {}, inline(em1 ?? em2)));
    else if (/^https?:\/\//i.test(url)) out.push(h('a', { href: url, rel: 'noopener noreferrer', target: '_blank' }, label));
    else out.push(whole);
    last = match.index + whole.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}
