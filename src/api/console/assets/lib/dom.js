// Builds elements. Data only ever becomes text (textContent, text nodes, attribute values):
// nothing here parses HTML, so a task's command or an approval's summary cannot inject markup.

/** `h('a', {href: '#/tasks', class: 'x', onclick: fn}, 'text', child, [more])` */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2), value);
    } else if (key === 'class') {
      node.className = value;
    } else if (key === 'for') {
      node.htmlFor = value;
    } else if (value === true) {
      node.setAttribute(key, '');
    } else {
      node.setAttribute(key, String(value));
    }
  }
  append(node, children);
  return node;
}

/** Appends children: nodes as they are, strings and numbers as text, arrays flattened. */
export function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Empties `node` and fills it with `children`. */
export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** A status as a badge the stylesheet colours by its value. */
export function badge(status) {
  return h('span', { class: `badge status-${String(status).replace(/[^a-z_]/g, '')}` }, status);
}

/** A `<dl>` of [term, value] pairs, leaving out empty values. */
export function details(pairs) {
  const list = h('dl', { class: 'details' });
  for (const [term, value] of pairs) {
    if (value === null || value === undefined || value === '') continue;
    append(list, [h('dt', {}, term), h('dd', {}, value)]);
  }
  return list;
}

/** A table with a caption, headings and rows of cells, in a box that scrolls sideways on
 *  a narrow screen instead of the page. */
export function table(caption, headings, rows, empty = 'Nothing here yet.') {
  if (rows.length === 0) return h('p', { class: 'empty' }, empty);
  return h('div', { class: 'table-wrap' },
    h('table', {},
      h('caption', { class: 'visually-hidden' }, caption),
      h('thead', {}, h('tr', {}, headings.map((text) => h('th', { scope: 'col' }, text)))),
      h('tbody', {}, rows.map((cells) => h('tr', {}, cells.map((cell) => h('td', {}, cell)))))));
}

/** Keel's ids (`run_` and 32 hex digits) as their kind and last 8 digits. */
export function shortened(id) {
  const parts = String(id).match(/^([a-z]+_)[0-9a-f]{24,}$/);
  return parts ? `${parts[1]}\u2026${String(id).slice(-8)}` : String(id);
}

/**
 * A long id shortened (a link when `href` is given), the whole id its title and its
 * accessible name, with a button that copies it whole.
 */
export function idView(id, href = null) {
  const shown = h(href ? 'a' : 'code', { class: 'id', href, title: id, 'aria-label': id }, shortened(id));
  const copy = h('button', { type: 'button', class: 'copy', title: 'Copy the id', 'aria-label': `Copy ${id}` }, 'copy');
  copy.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(id);
      toast(`Copied ${id}.`);
    } catch {
      toast(`Copy it by hand: ${id}`);
    }
  });
  return h('span', { class: 'id-copy' }, shown, copy);
}

/** A message in the page's live region. */
export function toast(message) {
  const region = document.getElementById('toast');
  replace(region, message);
  region.classList.add('shown');
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => region.classList.remove('shown'), 5000);
}

/** An error as the API reported it: its message and the request id to look it up by. */
export function errorBox(error) {
  return h('p', { class: 'error', role: 'alert' }, error.message,
    error.requestId ? h('span', { class: 'request-id' }, ` (request ${error.requestId})`) : null);
}

/** Runs an action from a button: disabled while it runs, its error shown beside it.
 *  `attrs.disabled` (and later `enable`) say whether it may be used at all. */
export function action(label, run, attrs = {}) {
  const { disabled = false, ...rest } = attrs;
  const button = h('button', { type: 'button', ...rest }, label);
  enable(button, !disabled);
  button.addEventListener('click', async () => {
    button.parentElement?.querySelector(':scope > .error')?.remove();
    button.disabled = true;
    try {
      await run();
    } catch (error) {
      button.after(errorBox(error));
    } finally {
      button.disabled = button.dataset.off === '1';
    }
  });
  return button;
}

/** Whether an action's button may be used. */
export function enable(button, on) {
  button.dataset.off = on ? '' : '1';
  button.disabled = !on;
}

/** Whether `key` differs from what `node` shows now (and records it): a view rebuilt only
 *  on change keeps the keyboard focus and text selection of people reading it. */
export function changed(node, key) {
  if (node.dataset.key === key) return false;
  node.dataset.key = key;
  return true;
}
