// Schedules: every task's schedule with its next fire time in the schedule's own zone (and
// the browser's, UTC on hover), and a schedule's occurrences, page by page.

import { Pager, seg } from '../lib/api.js';
import { badge, h, idView, replace, table } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

/** `iso` as wall-clock time in the IANA zone `zone` ("2026-12-02 09:00 Europe/Paris"). */
export function inZone(iso, zone) {
  if (!iso) return '';
  try {
    const text = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short', timeZone: zone })
      .format(new Date(iso));
    return `${text} ${zone}`;
  } catch {
    return `${iso} (zone ${zone} unknown to this browser)`;
  }
}

/** What the schedule says, in one line. */
function rule(schedule) {
  return schedule.kind === 'cron' ? `cron ${schedule.cron_expression}` : `once at ${inZone(schedule.run_at, schedule.timezone)}`;
}

export async function render(root, _params, ctx) {
  const list = h('section', { 'aria-labelledby': 'schedules-heading' });
  const occurrences = h('section', { 'aria-live': 'polite' });
  replace(root, h('h1', { id: 'schedules-heading' }, 'Schedules'), list, occurrences);

  const openOccurrences = (schedule) => {
    const pager = new Pager(`/v1/tasks/${seg(schedule.task_id)}/schedule/occurrences`, {}, 20);
    const slot = h('div');
    replace(occurrences, h('h2', { id: 'occurrences-heading' }, `Occurrences of ${schedule.id}`), slot);
    paged(slot, pager, (page) => table('Occurrences',
      ['Scheduled for', 'In its zone', 'Status', 'Run', 'Error'],
      page.data.map((o) => [
        when(o.scheduled_for),
        inZone(o.scheduled_for, schedule.timezone),
        badge(o.status),
        o.run_id ? idView(o.run_id, `#/runs/${seg(o.task_id)}/${seg(o.run_id)}`) : '—',
        o.error || '',
      ]), 'It has not fired yet.'), ctx.signal);
  };

  await paged(list, new Pager('/v1/task-schedules', {}, 20), (page) => table('Schedules',
    ['Task', 'Rule', 'Zone', 'Enabled', 'Next fire (its zone)', 'Next fire (here)', ''],
    page.data.map((s) => [
      idView(s.task_id, `#/tasks/${seg(s.task_id)}`),
      h('code', {}, rule(s)),
      s.timezone,
      s.enabled ? 'yes' : 'no',
      h('span', { class: 'next-fire' }, s.next_run_at ? inZone(s.next_run_at, s.timezone) : 'none'),
      when(s.next_run_at),
      h('button', { type: 'button', class: 'secondary', onclick: () => openOccurrences(s) }, 'Occurrences'),
    ]), 'No task has a schedule (PUT /v1/tasks/{id}/schedule sets one).'), ctx.signal);
}
