// Approval policy: the caller's workspace's, as an operator changes it (each gate's
// decision, per MCP server, and where file writers may write), and every change from the
// audit trail. Members see the API's refusal: the policy is an operator's.

import { Pager, get, request, seg } from '../lib/api.js';
import { action, details, errorBox, h, replace, table, toast } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

const GATES = ['shell_exec', 'git_exec', 'file_write', 'network_egress', 'read_file', 'all_tools'];

/** What each gate covers (docs/configuration.md, `KEEL_APPROVAL_POLICIES`). */
const COVERS = {
  shell_exec: 'Shell runs, agent runs that start stdio MCP servers, and the agent\u2019s shell_exec and http_request tools.',
  git_exec: 'Git runs, and the agent\u2019s git_status and git_diff tools.',
  file_write: 'File runs, and the agent\u2019s file_write, file_edit and apply_patch tools.',
  network_egress: 'Anything that can reach out from a task with network: shell commands, stdio MCP servers, hooks, a repository\u2019s clone and push, git commands that reach a remote, and the agent\u2019s http_request.',
  read_file: 'The agent\u2019s read_file, list_dir, grep and glob tools.',
  all_tools: 'Every one of the above, and every agent tool call.',
};
const DECISIONS = ['allow', 'ask', 'deny'];

/** `name=decision` lines as an object; throws on a line that is not one. */
function servers(text) {
  const parsed = {};
  for (const line of text.split('\n').map((l) => l.trim()).filter(Boolean)) {
    const [name, decision] = line.split('=').map((part) => part.trim());
    if (!name || !DECISIONS.includes(decision)) {
      throw new Error(`"${line}": write one server per line as name=allow, name=ask or name=deny`);
    }
    parsed[name] = decision;
  }
  return parsed;
}

function form(policy, save, reset) {
  const selects = Object.fromEntries(GATES.map((gate) => [gate,
    h('select', { id: `gate-${gate}`, name: gate, 'aria-describedby': `gate-${gate}-covers` },
      DECISIONS.map((d) => h('option', { value: d, selected: policy.gates[gate] === d }, d)))]));
  const mcp = h('textarea', { id: 'policy-mcp', rows: 3 },
    Object.entries(policy.mcp_servers).map(([name, d]) => `${name}=${d}`).join('\n'));
  const paths = h('textarea', { id: 'policy-paths', rows: 3 }, (policy.allowed_write_paths || []).join('\n'));
  const body = () => {
    const lines = paths.value.split('\n').map((l) => l.trim()).filter(Boolean);
    return {
      gates: Object.fromEntries(GATES.map((gate) => [gate, selects[gate].value])),
      mcp_servers: servers(mcp.value),
      allowed_write_paths: lines.length ? lines : null,
    };
  };
  return h('form', { class: 'policy', onsubmit: (event) => event.preventDefault() },
    GATES.map((gate) => h('div', { class: 'field' }, h('label', { for: `gate-${gate}` }, gate), selects[gate],
      h('p', { class: 'hint', id: `gate-${gate}-covers` }, COVERS[gate]))),
    h('label', { for: 'policy-mcp' }, 'MCP servers (name=decision, one per line)'), mcp,
    h('label', { for: 'policy-paths' }, 'Write paths (one per line; none: anywhere in the workspace)'), paths,
    h('div', { class: 'actions' },
      action('Save policy', () => save(body())),
      action('Use the process setting', reset, { class: 'secondary' })));
}

export async function render(root, _params, ctx) {
  const me = (await get('/v1/whoami')).data;
  const path = `/v1/workspaces/${seg(me.workspace)}/approval-policy`;
  const current = h('section', { 'aria-labelledby': 'policy-heading' });
  const history = h('section', { 'aria-labelledby': 'policy-history-heading' });
  replace(root, h('h1', { id: 'policy-heading' }, `Approval policy of ${me.workspace}`), current,
    h('h2', { id: 'policy-history-heading' }, 'Changes'), history);

  const showHistory = () => paged(history,
    new Pager('/v1/state-transitions', { entity_type: 'approval_policy', entity_id: me.workspace, order: 'desc' }, 20),
    (page) => table('Changes', ['When', 'By', 'From', 'To'],
      page.data.map((t) => [when(t.occurred_at), t.actor, h('code', {}, t.from_status || ''), h('code', {}, t.to_status)]),
      'Never changed: the process setting applies.'), ctx.signal);
  const show = (policy) => {
    replace(current,
      details([
        ['In force', policy.source === 'workspace' ? 'this workspace\'s own' : 'the process setting (KEEL_APPROVAL_POLICIES)'],
        ['Updated', policy.updated_at ? `${new Date(policy.updated_at).toLocaleString()} by ${policy.updated_by}` : ''],
      ]),
      form(policy, async (body) => {
        show((await request('PUT', path, body)).data);
        toast('Saved: it applies to the next run and tool call.');
        await showHistory();
      }, async () => {
        show((await request('DELETE', path)).data);
        toast('The process setting applies again.');
        await showHistory();
      }));
  };
  try {
    show((await get(path)).data);
  } catch (error) {
    replace(current, errorBox(error));
    return;
  }
  await showHistory();
}
