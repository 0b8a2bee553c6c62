// Every paginated list shares this: a list route shown page by page in a slot, with
// Previous / page n / Next under it.

import { errorBox, h, replace } from '../lib/dom.js';

/** Loads `pager`'s first page into `slot` as `await draw(page)` (nodes), with the buttons
 *  under it; each button loads its page the same way. Errors are shown in the slot.
 *  Resolves once the first page is shown. */
export function paged(slot, pager, draw, signal) {
  const show = async (load) => {
    try {
      const page = await load();
      const content = await draw(page);
      if (signal.aborted) return;
      replace(slot, content,
        h('div', { class: 'pager' },
          h('button', { type: 'button', disabled: !pager.hasPrevious(), onclick: () => show(() => pager.previous()) }, 'Previous'),
          h('span', {}, `page ${pager.number()}`),
          h('button', { type: 'button', disabled: !pager.hasNext(), onclick: () => show(() => pager.next()) }, 'Next')));
    } catch (error) {
      if (!signal.aborted) replace(slot, errorBox(error));
    }
  };
  return show(() => pager.load());
}
