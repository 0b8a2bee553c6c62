// A task: what it does, its runs (paginated), and a start button.

import { Pager, get, seg } from '../lib/api.js';
import { action, badge, details, h, idView, replace, table } from '../lib/dom.js';
import { paged } from './paged.js';
import { when } from '../lib/time.js';
import { startTask, summary } from './tasks.js';

const ACTIVE = ['awaiting_approval', 'queued', 'running'];

/** How a run came to be, as a short phrase with a link to its source. */
export function lineage(run) {
  const source = run.retried_from_run_id || run.resumed_from_run_id;
  if (!source) return run.schedule_id ? 'scheduled' : 'started';
  const how = run.retried_from_run_id ? 'retry of' : `${run.lineage_kind || 'resume'} of`;
  return [`${how} `, idView(source, `#/runs/${seg(run.task_id)}/${seg(source)}`)];
}

export async function render(root, { task_id: taskId }, ctx) {
  const task = (await get(`/v1/tasks/${seg(taskId)}`)).data;
  if (ctx.signal.aborted) return;
  const runs = h('section', { 'aria-labelledby': 'runs-heading' });
  const pager = new Pager(`/v1/tasks/${seg(taskId)}/runs`, {}, 20);

  const draw = (page) => {
    const rows = page.data.map((run) => [
      h('a', { href: `#/runs/${seg(taskId)}/${seg(run.id)}` }, `run ${run.number}`),
      badge(run.status),
      lineage(run),
      run.exit_code ?? '',
      when(run.created_at),
      when(run.finished_at),
    ]);
    return [
      h('h2', { id: 'runs-heading' }, 'Runs'),
      table('Runs of this task', ['Run', 'Status', 'Origin', 'Exit code', 'Created', 'Finished'], rows,
        'No runs yet: start the task.'),
    ];
  };

  replace(root,
    h('p', {}, h('a', { href: '#/tasks' }, '\u2190 Tasks')),
    h('h1', {}, task.title),
    details([
      ['Task id', task.id],
      ['Status', badge(task.status)],
      ['Kind', task.execution_kind],
      ['What it does', h('code', { class: 'command' }, summary(task))],
      ['Description', task.execution_kind === 'agent_loop' ? null : task.prompt],
      ['Workspace', task.workspace_mode],
      ['Working directory', task.working_directory],
      ['Timeout', task.timeout_ms ? `${task.timeout_ms / 1000} s` : null],
      ['Priority', task.priority],
      ['Runs', task.run_count],
      ['Created', when(task.created_at)],
      ['Updated', when(task.updated_at)],
    ]),
    h('div', { class: 'actions' },
      action('Start', () => startTask(task, ctx), { disabled: ACTIVE.includes(task.status) })),
    runs);
  await paged(runs, pager, draw, ctx.signal);
}
