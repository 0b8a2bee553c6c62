// Providers: each preset with the readiness of its secrets (configured or not, and why),
// never a value: the API returns none, and this page shows references and statuses only.

import { Pager, get, post, seg, withQuery } from '../lib/api.js';
import { action, badge, errorBox, h, replace, table } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

/** A secret status as a badge and its reason. */
function readiness(status) {
  if (!status) return h('span', { class: 'hint' }, 'no key needed');
  return h('span', { class: 'secret-status' },
    badge(status.configured ? 'ready' : 'missing'),
    status.configured ? '' : ` ${status.error_code || ''} ${status.message || ''}`);
}

/** The statuses of a preset's secret header references, one request each. */
async function headerStatuses(provider) {
  const refs = Object.entries(provider.secret_header_refs || {});
  return Promise.all(refs.map(async ([name, ref]) => {
    try {
      const status = (await get(withQuery('/v1/secrets/status', { ref, purpose: 'custom_header' }))).data;
      return h('div', {}, `${name} (${ref}): `, readiness(status));
    } catch (error) {
      return h('div', {}, `${name} (${ref}): `, errorBox(error));
    }
  }));
}

/** The result of a static check (`POST /v1/providers/{id}/check`) beside its button. */
function checkButton(provider) {
  const result = h('span', { class: 'check-result', 'aria-live': 'polite' });
  const button = action('Check', async () => {
    const check = (await post(`/v1/providers/${seg(provider.id)}/check`)).data;
    replace(result, badge(check.ok ? 'ready' : 'failed'), ` ${check.code}: ${check.message}`);
  }, { class: 'secondary' });
  return [button, result];
}

function lastCheck(provider) {
  const check = provider.last_check;
  if (!check) return 'never';
  return [badge(check.ok ? 'ready' : 'failed'), ' ', String(check.code ?? ''), ' ', when(check.checked_at)];
}

export async function render(root, _params, ctx) {
  const list = h('section', { 'aria-labelledby': 'providers-heading' });
  replace(root, h('h1', { id: 'providers-heading' }, 'Providers'),
    h('p', { class: 'hint' }, 'Readiness of each preset\u2019s secrets, checked in the runtime; secret values are never shown.'),
    list);
  await paged(list, new Pager('/v1/providers', {}, 20), async (page) => table('Providers',
    ['Preset', 'Kind', 'API and model', 'Enabled', 'Secrets', 'Last check', ''],
    await Promise.all(page.data.map(async (p) => [
      h('span', { class: 'provider-name' }, p.display_name), p.kind, `${p.api} \u00B7 ${p.model}`,
      p.enabled ? 'yes' : 'no',
      h('div', {}, p.api_key_ref ? `${p.api_key_ref}: ` : '', readiness(p.api_key_status), await headerStatuses(p)),
      lastCheck(p),
      checkButton(p),
    ])), 'No provider preset yet (POST /v1/providers).'), ctx.signal);
}
