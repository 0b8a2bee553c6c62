// Tasks: filter by status, page through, create a shell task, start one.

import { Pager, post, seg } from '../lib/api.js';
import { action, badge, errorBox, h, idView, replace, table, toast } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

const STATUSES = ['not_started', 'awaiting_approval', 'queued', 'running', 'completed', 'failed', 'cancelled'];
const ACTIVE = ['awaiting_approval', 'queued', 'running'];

/** What a task does, in one line. */
export function summary(task) {
  switch (task.execution_kind) {
    case 'shell': return task.shell_command;
    case 'git': return `git ${task.git_command}`;
    case 'file': return `${task.file_operation} ${task.file_path}`;
    default: return task.prompt || task.execution_kind;
  }
}

/** Starts the task's next run and opens its page. */
export async function startTask(task, ctx) {
  const run = (await post(`/v1/tasks/${seg(task.id)}/start`, { reason: 'started from the console' })).data;
  toast(`Run ${run.number} of ${task.id} is ${run.status}.`);
  ctx.navigate(`#/runs/${seg(task.id)}/${seg(run.id)}`);
}

export async function render(root, _params, ctx) {
  const status = ctx.query.get('status') || '';
  const pager = new Pager('/v1/tasks', { status }, 20);
  const list = h('section', { 'aria-labelledby': 'tasks-heading' });
  const filter = h('select', { id: 'status-filter', name: 'status' },
    h('option', { value: '' }, 'any status'),
    STATUSES.map((s) => h('option', { value: s, selected: s === status }, s)));
  filter.addEventListener('change', () => ctx.navigate(filter.value ? `#/tasks?status=${filter.value}` : '#/tasks'));

  const draw = (page) => {
    const rows = page.data.map((task) => [
      [h('a', { href: `#/tasks/${seg(task.id)}` }, task.title), h('br'), idView(task.id)],
      task.execution_kind,
      badge(task.status),
      task.latest_run_id
        ? h('a', { href: `#/runs/${seg(task.id)}/${seg(task.latest_run_id)}` }, `run ${task.run_count}`)
        : '—',
      when(task.updated_at),
      action('Start', () => startTask(task, ctx), { disabled: ACTIVE.includes(task.status) }),
    ]);
    return [
      h('h2', { id: 'tasks-heading' }, status ? `Tasks that are ${status}` : 'All tasks'),
      table('Tasks', ['Task', 'Kind', 'Status', 'Latest run', 'Updated', ''], rows,
        status ? `No task is ${status}.` : 'No tasks yet: create one above.'),
    ];
  };

  replace(root,
    h('h1', {}, 'Tasks'),
    createForm(ctx),
    h('div', { class: 'toolbar' }, h('label', { for: 'status-filter' }, 'Status'), filter),
    list);
  await paged(list, pager, draw, ctx.signal);
}

function createForm(ctx) {
  const command = h('textarea', { id: 'shell-command', name: 'shell_command', rows: 2, required: true, spellcheck: 'false' });
  const title = h('input', { id: 'task-title', name: 'title', type: 'text', maxlength: 200 });
  const prompt = h('input', { id: 'task-prompt', name: 'prompt', type: 'text' });
  const timeout = h('input', { id: 'task-timeout', name: 'timeout_s', type: 'number', min: 1, inputmode: 'numeric' });
  const startNow = h('input', { id: 'start-now', name: 'start', type: 'checkbox', checked: true });
  const problems = h('div');
  const form = h('form', { class: 'create', 'aria-labelledby': 'create-heading' },
    h('h2', { id: 'create-heading' }, 'New shell task'),
    h('p', { class: 'hint' }, 'Shell runs wait for an operator\u2019s approval when the runtime\u2019s approval policy gates them (the default).'),
    h('label', { for: 'shell-command' }, 'Shell command (sh -c)'), command,
    h('div', { class: 'fields' },
      h('div', { class: 'field grow' }, h('label', { for: 'task-title' }, 'Title (optional: the command\u2019s first line)'), title),
      h('div', { class: 'field grow' }, h('label', { for: 'task-prompt' }, 'Description (optional)'), prompt),
      h('div', { class: 'field' }, h('label', { for: 'task-timeout' }, 'Timeout in seconds (optional)'), timeout)),
    problems,
    h('div', { class: 'actions' },
      h('button', { type: 'submit' }, 'Create task'),
      h('div', { class: 'check' }, startNow, h('label', { for: 'start-now' }, 'Start it now'))));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    replace(problems);
    const draft = { execution_kind: 'shell', shell_command: command.value };
    if (title.value.trim()) draft.title = title.value;
    if (prompt.value.trim()) draft.prompt = prompt.value;
    if (timeout.value) draft.timeout_ms = Number(timeout.value) * 1000;
    try {
      const task = (await post('/v1/tasks', draft)).data;
      if (startNow.checked) {
        await startTask(task, ctx);
      } else {
        toast(`Created ${task.id}.`);
        ctx.navigate(`#/tasks/${seg(task.id)}`);
      }
    } catch (error) {
      replace(problems, errorBox(error));
    }
  });
  return form;
}
