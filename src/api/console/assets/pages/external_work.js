// External work: each source with its item and action counts by state, its actions (poll
// now, reconcile, background polling on or off), and its items page by page (a pull
// request's CI triaged from there); then the tracker actions by status, each approved one
// executed or cancelled from here; then the CI triage records, each fix run started here.

import { Pager, get, post, seg } from '../lib/api.js';
import { action, badge, h, idView, replace, table, toast } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { isOperator } from './approvals.js';
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
  // A pull request's CI is triaged by a worker: the button queues the scan.
  const triage = (item) => item.kind !== 'github_pull_request' ? '' : action('Triage CI', async () => {
    const scan = (await post(`/v1/external-work/items/${seg(item.id)}/ci-triage`, {})).data;
    toast(`CI triage of ${item.identifier} queued (${scan.id}).`);
  }, { class: 'secondary' });
  return paged(list, pager, (page) => table('Items', ['Item', 'Identifier', 'Tracker state', 'State', 'Run', 'Error', ''],
    page.data.map((item) => [
      idView(item.id), item.identifier, item.tracker_state, badge(item.state),
      item.run_id && item.task_id ? idView(item.run_id, `#/runs/${seg(item.task_id)}/${seg(item.run_id)}`) : '\u2014',
      item.last_error ? `${item.last_error_code || ''} ${item.last_error}` : '',
      triage(item),
    ]), 'No items yet: poll the source.'), signal);
}

/** CI triage records, newest scans' findings included: a record with a fix task and no run
 *  yet gets Start fix run (one run per record, however often pressed). */
function triageSection(slot, signal) {
  const list = h('div');
  replace(slot, h('h2', { id: 'triage-heading' }, 'CI triage'), list);
  const pager = new Pager('/v1/external-work/ci-triage', {}, 20);
  const start = (record) => action('Start fix run', async () => {
    const fix = (await post(`/v1/external-work/ci-triage/${seg(record.id)}/run`)).data;
    toast(`Fix run ${fix.run.id} started.`);
    await triageSection(slot, signal);
  });
  const run = (r) => r.run_id && r.task_id
    ? idView(r.run_id, `#/runs/${seg(r.task_id)}/${seg(r.run_id)}`)
    : (r.task_id && r.status !== 'stale' ? start(r) : '\u2014');
  return paged(list, pager, (page) => table('CI triage',
    ['Check', 'Status', 'Fix run', 'Pull request', 'Head', 'Reason'],
    page.data.map((r) => [
      r.check_name || '(stale head)', badge(r.status), run(r),
      `${r.repository}#${r.subject_number}`, r.head_sha.slice(0, 12), r.reason || '',
    ]), 'No triage record yet: triage a pull request item\'s CI.'), signal);
}

export async function render(root, _params, ctx) {
  const list = h('section', { 'aria-labelledby': 'external-heading' });
  const items = h('section', { 'aria-live': 'polite' });
  const actions = h('section', { 'aria-labelledby': 'actions-heading' });
  const triage = h('section', { 'aria-labelledby': 'triage-heading' });
  replace(root, h('h1', { id: 'external-heading' }, 'External work'), list, items, actions, triage);
  const pager = new Pager('/v1/external-work/sources', {}, 20);
  const draw = async (page) => table('Sources',
    ['Source', 'Tracker', 'Items by state', 'Actions by state', 'Background', 'Last error', ''],
    await Promise.all(page.data.map((source) => sourceRow(source, items, ctx, reload))),
    'No external work source (POST /v1/external-work/sources).');
  const reload = () => paged(list, pager, draw, ctx.signal);
  await reload();
  const me = (await get('/v1/whoami')).data;
  await actionsSection(actions, me, ctx.signal);
  await triageSection(triage, ctx.signal);
}

/** The statuses the actions list is filtered by: approved (waiting for its execute) first. */
const ACTION_STATUSES = ['approved', 'pending_approval', 'sending', 'sent', 'stale_target',
  'failed', 'rejected', 'cancelled'];

/** Tracker actions in one status, each approved one with Execute, each pending or approved
 *  one with Cancel (its pending approval is rejected with the cancel); `me` is whoami's. */
function actionsSection(slot, me, signal, status = 'approved') {
  const select = h('select', { id: 'action-status', onchange: () => actionsSection(slot, me, signal, select.value) },
    ACTION_STATUSES.map((s) => h('option', { value: s, selected: s === status }, s)));
  const list = h('div');
  replace(slot, h('h2', { id: 'actions-heading' }, 'Tracker actions'),
    h('p', { class: 'hint' }, 'An approved action is sent only when executed here (or by ',
      h('code', {}, 'keel external-work actions execute'), ').'),
    h('label', { for: 'action-status' }, 'Status '), select, list);
  const pager = new Pager('/v1/external-work/actions', { status }, 20);
  const reload = () => actionsSection(slot, me, signal, status);
  const step = (label, path, done, attrs) => action(label, async () => {
    await post(path, attrs.body);
    toast(done);
    await reload();
  }, { class: attrs.class });
  const buttons = (a) => {
    const base = `/v1/external-work/actions/${seg(a.id)}`;
    // Offered only to whom the API allows: operators execute; they and the proposer cancel.
    const operator = isOperator(me);
    const executable = operator && a.status === 'approved' && !a.execute_requested_at;
    const cancellable = (operator || a.proposed_by === me.actor_id)
      && (a.status === 'pending_approval' || a.status === 'approved');
    return h('div', { class: 'actions' },
      executable ? step('Execute', `${base}/execute`, `Executing ${a.id}.`, {}) : null,
      cancellable ? step('Cancel', `${base}/cancel`, `Cancelled ${a.id}.`,
        { class: 'danger', body: { reason: 'cancelled from the console' } }) : null);
  };
  return paged(list, pager, (page) => table('Tracker actions',
    // The buttons before the long ids: reachable without scrolling sideways.
    ['Action', 'Kind', 'Status', '', 'Proposed', 'Item', 'Last error'],
    page.data.map((a) => [
      a.id, a.kind,
      [badge(a.status), a.execute_requested_at && a.status === 'approved' ? ' queued' : ''],
      buttons(a),
      when(a.created_at),
      a.item_id,
      a.last_error ? `${a.last_error_code || ''} ${a.last_error}` : '',
    ]), `No ${status} action.`), signal);
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
