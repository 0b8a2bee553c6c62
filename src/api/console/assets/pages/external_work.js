// External work: each source with its item and action counts by state, its actions (poll
// now, reconcile, background polling on or off), and its items page by page.

import { Pager, get, post, seg } from '../lib/api.js';
import { action, badge, h, replace, table, toast } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

/** `{queued: 2, total: 3}` as "queued 2 · total 3". */
function counts(map) {
  const entries = Object.entries(map || {});
  return entries.length ? entries.map(([state, n]) => `${state} ${n}`).join(' \u00B7 ') : '—';
}

function itemsSection(source, slot, signal) {
  const pager = new Pager(`/v1/external-work/sources/${seg(source.id)}/items`, {}, 20);
  const list = h('div');
  replace(slot, h('h2', {}, `Items of ${source.id}`), list);
  return paged(list, pager, (page) => table('Items', ['Item', 'Identifier', 'Tracker state', 'State', 'Run', 'Error'],
    page.data.map((item) => [
      item.id, item.identifier, item.tracker_state, badge(item.state),
      item.run_id && item.task_id ? h('a', { href: `#/runs/${seg(item.task_id)}/${seg(item.run_id)}` }, item.run_id) : '\u2014',
      item.last_error ? `${item.last_error_code || ''} ${item.last_error}` : '',
    ]), 'No items yet: poll the source.'), signal);
}

export async function render(root, _params, ctx) {
  const list = h('section', { 'aria-labelledby': 'external-heading' });
  const items = h('section', { 'aria-live': 'polite' });
  replace(root, h('h1', { id: 'external-heading' }, 'External work'), list, items);
  const pager = new Pager('/v1/external-work/sources', {}, 20);
  const draw = async (page) => table('Sources',
    ['Source', 'Tracker', 'Items by state', 'Actions by state', 'Background', 'Last error', ''],
    await Promise.all(page.data.map((source) => sourceRow(source, items, ctx, reload))),
    'No external work source (POST /v1/external-work/sources).');
  const reload = () => paged(list, pager, draw, ctx.signal);
  await reload();
}

/** A source's row: its counts from its status route, and its actions. */
async function sourceRow(source, items, ctx, reload) {
  const base = `/v1/external-work/sources/${seg(source.id)}`;
  const status = (await get(`${base}/status`)).data;
  const run = (label, path, body) => action(label, async () => {
    await post(`${base}/${path}`, body);
    toast(`${label}: done for ${source.id}.`);
    await reload();
  }, { class: 'secondary' });
  return [
    source.id, `${source.tracker_kind} ${source.target}`,
    counts(status.records), counts(status.actions),
    [badge(status.background.status), ' ', when(status.background.last_poll_at)],
    source.last_error_code ? `${source.last_error_code} ${source.last_error || ''}` : '',
    h('div', { class: 'actions' },
      h('button', { type: 'button', class: 'secondary', onclick: () => itemsSection(source, items, ctx.signal) }, 'Items'),
      run('Poll now', 'poll', {}),
      run('Reconcile', 'reconcile'),
      run(status.background.running ? 'Stop background' : 'Start background', 'background',
        { enabled: !status.background.running })),
  ];
}
