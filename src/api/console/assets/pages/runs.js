// Runs across every task of the workspace, newest first (the API's `order=desc`), with
// a status filter: what is running, waiting or failed now, without opening each task.

import { Pager, seg } from '../lib/api.js';
import { badge, h, idView, replace, table } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

const STATUSES = ['awaiting_approval', 'queued', 'running', 'completed', 'failed', 'cancelled'];

export async function render(root, _params, ctx) {
  const status = ctx.query.get('status') || '';
  const list = h('section', { 'aria-labelledby': 'runs-heading' });
  const filter = h('select', { id: 'run-status-filter', name: 'status' },
    h('option', { value: '' }, 'any status'),
    STATUSES.map((s) => h('option', { value: s, selected: s === status }, s)));
  filter.addEventListener('change', () => ctx.navigate(filter.value ? `#/runs?status=${filter.value}` : '#/runs'));
  replace(root,
    h('h1', {}, 'Runs'),
    h('div', { class: 'toolbar' }, h('label', { for: 'run-status-filter' }, 'Status'), filter),
    list);
  await paged(list, new Pager('/v1/runs', { status, order: 'desc' }, 20), (page) => [
    h('h2', { id: 'runs-heading' }, status ? `Runs that are ${status}` : 'All runs'),
    table('Runs', ['Run', 'Task', 'Status', 'Requested by', 'Created', 'Finished', 'Error'],
      page.data.map((run) => [
        idView(run.id, `#/runs/${seg(run.task_id)}/${seg(run.id)}`),
        idView(run.task_id, `#/tasks/${seg(run.task_id)}`),
        badge(run.status),
        run.requested_by || '',
        when(run.created_at),
        when(run.finished_at),
        run.last_error || '',
      ]), status ? `No run is ${status}.` : 'No runs yet.'),
  ], ctx.signal);
}
