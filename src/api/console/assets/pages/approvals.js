// The approvals inbox: pending approvals across tasks, what each would do, approve or
// reject with a note.

import { Pager, get, post, seg } from '../lib/api.js';
import { badge, errorBox, h, idView, replace, toast } from '../lib/dom.js';
import { when } from '../lib/time.js';

/** New approvals appear without a reload: the inbox is re-read this often. */
const REFRESH_MS = 3000;

export async function render(root, _params, ctx) {
  const me = (await get('/v1/whoami')).data;
  const pager = new Pager('/v1/approvals', { status: 'pending' }, 20);
  const list = h('div', { id: 'approval-list' });
  replace(root, h('h1', {}, 'Approvals'),
    h('p', { class: 'hint' }, 'Runs that an approval policy gates wait here until an operator decides.'),
    list);

  // A note being typed is not thrown away by a refresh: the list is rebuilt only when the
  // set of pending approvals changed.
  let shown = '';
  const show = async (load, force = false) => {
    let page;
    try {
      page = await load();
    } catch (error) {
      replace(list, errorBox(error));
      return;
    }
    if (ctx.signal.aborted) return;
    const key = page.data.map((a) => a.id).join(',') + pager.number();
    if (key === shown && !force) return;
    shown = key;
    replace(list,
      page.data.length === 0 ? h('p', { class: 'empty' }, 'No approvals are pending.') : null,
      page.data.map((approval) => card(approval, me, () => show(() => pager.load(), true))),
      h('div', { class: 'pager' },
        h('button', { type: 'button', disabled: !pager.hasPrevious(), onclick: () => show(() => pager.previous(), true) }, 'Previous'),
        h('span', {}, `page ${pager.number()}`),
        h('button', { type: 'button', disabled: !pager.hasNext(), onclick: () => show(() => pager.next(), true) }, 'Next')));
  };
  await show(() => pager.load());
  const timer = setInterval(() => show(() => pager.load()), REFRESH_MS);
  ctx.signal.addEventListener('abort', () => clearInterval(timer));
}

/** What the approval would let happen, one line each. */
export function summaryText(approval) {
  const lines = Array.isArray(approval.action_summary) ? approval.action_summary : [];
  return lines.length ? lines.join('\n') : '(no summary)';
}

/**
 * Whether the caller (`me`, from whoami) may decide `approval`, as the API decides it:
 * operators only (an org's, or the runtime operator), and not an approval of their own
 * request unless self-approval is allowed. The buttons are shown only then, so nobody is
 * offered a 403.
 */
export function mayDecide(me, approval) {
  if (!isOperator(me)) return false;
  return me.may_approve_own || approval.requested_by !== me.actor_id;
}

/** Whether whoami's role is one that decides approvals (and executes tracker actions). */
export function isOperator(me) {
  return Boolean(me) && (me.role === 'operator' || me.role === 'runtime_operator');
}

/** Why the caller cannot decide `approval` (see mayDecide). */
function undecidable(me) {
  return isOperator(me)
    ? 'You requested this; another operator decides it.'
    : 'Only an operator decides approvals.';
}

function card(approval, me, done) {
  const noteId = `note-${approval.id}`;
  const note = h('input', { id: noteId, class: 'note', type: 'text', name: 'note', maxlength: 2000 });
  const problems = h('div');
  const decide = (decision) => async () => {
    replace(problems);
    try {
      const body = { decision };
      if (note.value.trim()) body.note = note.value;
      await post(`/v1/tasks/${seg(approval.task_id)}/approvals/${seg(approval.id)}/resolve`, body);
      toast(`${decision === 'approve' ? 'Approved' : 'Rejected'} ${approval.id}.`);
      await done();
    } catch (error) {
      replace(problems, errorBox(error));
    }
  };
  return h('article', { class: 'panel approval', 'aria-label': `Approval ${approval.id}`, 'data-approval': approval.id },
    h('h2', {}, `${approval.kind} `, badge(approval.status)),
    h('p', {}, 'Task ', idView(approval.task_id, `#/tasks/${seg(approval.task_id)}`),
      approval.run_id
        ? [', ', h('a', { href: `#/runs/${seg(approval.task_id)}/${seg(approval.run_id)}` }, 'its run')]
        : null,
      ' \u00b7 asked ', when(approval.created_at),
      approval.expires_at ? [' \u00b7 expires ', when(approval.expires_at)] : null),
    approval.requested_by ? h('p', {}, 'Requested by ', approval.requested_by) : null,
    h('pre', { class: 'summary' }, summaryText(approval)),
    approval.action_summary_incomplete ? h('p', { class: 'hint' }, 'The summary was cut short.') : null,
    mayDecide(me, approval)
      ? [h('label', { for: noteId }, 'Note (optional)'), note,
        problems,
        h('div', { class: 'actions' },
          h('button', { type: 'button', onclick: decide('approve') }, 'Approve'),
          h('button', { type: 'button', class: 'danger', onclick: decide('reject') }, 'Reject'))]
      : h('p', { class: 'hint' }, undecidable(me)));
}
