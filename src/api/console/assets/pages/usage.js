// Usage: the model calls' totals of the workspace, and per provider preset, for a window.

import { get, withQuery } from '../lib/api.js';
import { errorBox, h, replace, table } from '../lib/dom.js';

const WINDOWS = [['', 'all time'], ['1', 'last 24 hours'], ['7', 'last 7 days'], ['30', 'last 30 days']];

/** Micro-dollars as "$0.0016". */
export function dollars(micros) {
  return `$${(micros / 1e6).toFixed(micros % 10_000 === 0 ? 2 : 6)}`;
}

function figures(row) {
  return [String(row.calls), String(row.prompt_tokens), String(row.completion_tokens),
    String(row.cached_tokens), dollars(row.cost_micros_usd), String(row.calls_without_price)];
}

const HEADINGS = ['Calls', 'Prompt tokens', 'Completion tokens', 'Cached tokens', 'Cost', 'Calls without a price'];

export async function render(root, _params, ctx) {
  const days = ctx.query.get('days') || '';
  const picker = h('select', { id: 'usage-window', name: 'days' },
    WINDOWS.map(([value, label]) => h('option', { value, selected: value === days }, label)));
  picker.addEventListener('change', () => ctx.navigate(picker.value ? `#/usage?days=${picker.value}` : '#/usage'));
  const body = h('section', { 'aria-labelledby': 'usage-heading' });
  replace(root, h('h1', { id: 'usage-heading' }, 'Usage'),
    h('div', { class: 'toolbar' }, h('label', { for: 'usage-window' }, 'Window'), picker), body);
  const since = days ? new Date(Date.now() - Number(days) * 86_400_000).toISOString() : null;
  try {
    const summary = (await get(withQuery('/v1/usage/summary', { scope: 'provider', since }))).data;
    if (ctx.signal.aborted) return;
    replace(body,
      h('h2', {}, 'Totals'),
      table('Usage totals', HEADINGS, [figures(summary.totals)]),
      h('h2', {}, 'Per provider preset'),
      table('Usage per provider', ['Provider', ...HEADINGS],
        summary.rows.map((row) => [row.key, ...figures(row)]), 'No model calls in this window.'),
      h('p', { class: 'hint' }, 'Costs come from the runtime\u2019s model prices (KEEL_MODEL_PRICES); calls without a price are counted but cost nothing here.'));
  } catch (error) {
    replace(body, errorBox(error));
  }
}
