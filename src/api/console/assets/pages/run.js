// A run: its status and steps as they change, its event stream live over SSE, its stdout
// and stderr as they grow, its artifacts (images previewed), its file changes (revert an
// applied one, apply or discard a proposed one once the run ended), its lineage, and the
// buttons its status allows.

import { ApiError, get, post, seg, withQuery } from '../lib/api.js';
import { action, badge, changed, details, enable, h, idView, replace, table, toast } from '../lib/dom.js';
import { diffView } from '../lib/diff.js';
import { markdown } from '../lib/markdown.js';
import { follow } from '../lib/sse.js';
import { applyFrame } from '../lib/transcript.js';
import { when } from '../lib/time.js';
import { summaryText } from './approvals.js';
import { lineage } from './task.js';

const ACTIVE = ['awaiting_approval', 'queued', 'running'];
const TERMINAL_EVENTS = ['run.finished', 'run.failed', 'run.cancelled'];
const EVENT_TYPES = [
  'run.created', 'run.queued', 'run.started', ...TERMINAL_EVENTS, 'step.started', 'step.finished',
  'step.failed', 'artifact.created', 'gap.run_disconnected', 'run.resumed_from_event',
  'approval.requested', 'approval.resolved', 'model.call.completed', 'tool.file.reverted',
  'tool.file.applied', 'tool.file.discarded', 'policy.tool_blocked', 'task.updated', 'client.event',
  'model.delta', 'transcript', 'error',
];
/** Types the API serves inline (raster images): the only ones previewed. */
const PREVIEWED = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/avif'];
/** While a run is active its output grows without events: it is re-read this often. */
const OUTPUT_POLL_MS = 1000;
/** The run's facts, steps and artifacts are read again at most this often while events
 *  come; its conversation follows the stream's transcript frames without any read. */
const REFRESH_MS = 1000;

export async function render(root, { task_id: taskId, run_id: runId }, ctx) {
  const base = `/v1/tasks/${seg(taskId)}/runs/${seg(runId)}`;
  const [task, run] = await Promise.all([
    get(`/v1/tasks/${seg(taskId)}`).then((r) => r.data),
    get(base).then((r) => r.data),
  ]);
  if (ctx.signal.aborted) return;

  const view = {
    status: h('span', { id: 'run-status' }),
    live: h('span', { class: 'live', 'aria-live': 'polite' }, 'connecting'),
    actions: h('div', { class: 'actions' }),
    facts: h('div'),
    approvals: h('div'),
    stdout: h('pre', { class: 'output', id: 'stdout', tabindex: 0, 'aria-label': 'stdout' }),
    stderr: h('pre', { class: 'output', id: 'stderr', tabindex: 0, 'aria-label': 'stderr' }),
    model: h('pre', { class: 'output', hidden: true, 'aria-label': 'model text' }),
    conversation: h('div', { id: 'conversation' }, h('p', { class: 'who' }, 'Reading the conversation\u2026')),
    context: h('div'),
    steps: h('div'),
    artifacts: h('div'),
    patches: h('div'),
    events: h('ol', { class: 'events', id: 'events', 'aria-label': 'Events' }),
  };
  const agent = task.execution_kind === 'agent_loop';
  replace(root,
    h('p', {}, h('a', { href: `#/tasks/${seg(taskId)}` }, `\u2190 Task: ${task.title}`), ' ', idView(taskId)),
    h('h1', {}, `Run ${run.number} of ${task.title}`),
    h('div', { class: 'toolbar' }, view.status, view.live),
    view.actions,
    view.facts,
    view.approvals,
    // An agent's run reads as its conversation; it writes no stdout or stderr of its own.
    agent
      ? h('section', { 'aria-labelledby': 'conversation-heading' },
        h('h2', { id: 'conversation-heading' }, 'Conversation'), view.context, view.conversation)
      : h('div', { class: 'grid2' },
        h('section', {}, h('h2', {}, 'stdout'), view.stdout),
        h('section', {}, h('h2', {}, 'stderr'), view.stderr)),
    view.model,
    h('section', {}, h('h2', {}, 'Steps'), view.steps),
    h('section', {}, h('h2', {}, 'Artifacts'), view.artifacts),
    h('section', { 'aria-labelledby': 'patches-heading' }, h('h2', { id: 'patches-heading' }, 'File changes'), view.patches),
    h('section', {}, h('h2', {}, 'Events'), view.events));

  const state = { run, outputs: {}, descendants: await descendantsOf(taskId, runId), transcript: null, shown: new Map() };
  state.buttons = actions(view, state, task, base, ctx);
  if (agent) view.context.append(contextView(base));
  const refresh = refresher(async () => {
    state.run = (await get(base)).data;
    const [steps, artifacts] = await Promise.all([
      get(withQuery(`${base}/steps`, { limit: 200 })).then((r) => r.data),
      get(withQuery(`${base}/artifacts`, { limit: 200 })).then((r) => r.data),
    ]);
    if (ctx.signal.aborted) return;
    showRun(view, state, task);
    showSteps(view, steps);
    showArtifacts(view, artifacts, base);
    if (artifacts.some((a) => a.kind === 'patch')) {
      const patches = (await get(withQuery(`${base}/patches`, { limit: 200 }))).data;
      if (ctx.signal.aborted) return;
      showPatches(view, state, patches, base, refresh);
    }
    if (!agent) await showOutput(view, state, artifacts, base);
    if (state.run.status === 'awaiting_approval') await showApprovals(view, taskId, runId);
    else if (changed(view.approvals, '')) replace(view.approvals);
  });

  const conversationCtx = { base, refresh: () => refresh() };
  await refresh();
  // An agent's run has no output to poll: its events say when to read again.
  const poll = setInterval(() => !agent && ACTIVE.includes(state.run.status) && refresh(), OUTPUT_POLL_MS);
  const soon = throttled(() => refresh(), REFRESH_MS);
  ctx.signal.addEventListener('abort', () => { clearInterval(poll); soon.cancel(); });

  const projection = agent ? { projection: 'transcript' } : {};
  follow({
    url: withQuery(`${base}/stream`, projection),
    urlAfter: (sequence) => withQuery(`${base}/stream`, { ...projection, after_sequence: sequence }),
    types: EVENT_TYPES,
    signal: ctx.signal,
    // An agent run's last transcript frames come after the run's terminal event, in the
    // same burst: its stream is done once both have come.
    isLast: (type) => {
      if (TERMINAL_EVENTS.includes(type)) state.ended = true;
      return state.ended && (!agent || turnEnded(state.transcript));
    },
    onState: (live) => {
      view.live.dataset.state = live;
      view.live.textContent = { live: 'live', reconnecting: 'reconnecting\u2026', ended: 'stream ended' }[live];
      if (live === 'ended') refresh();
    },
    onEvent: (type, data) => {
      if (type === 'model.delta') {
        view.model.hidden = false;
        view.model.append(document.createTextNode(data.text || ''));
        return;
      }
      if (type === 'transcript') {
        // A call's words are in its block now: the live text of the next starts afresh.
        if (data.type === 'block_started' && data.block.kind === 'coordinator_text') replace(view.model);
        state.transcript = applyFrame(state.transcript, data);
        showConversation(view, state, task, conversationCtx);
        return;
      }
      if (type === 'error') {
        view.events.append(h('li', { class: 'error' }, data.message || 'the stream was interrupted'));
        return;
      }
      view.events.append(eventItem(data));
      view.events.scrollTop = view.events.scrollHeight;
      soon();
    },
  });
}

/** Whether the transcript's turn has ended (with its run). */
function turnEnded(transcript) {
  return Boolean(transcript) && transcript.turns.every((turn) => ['succeeded', 'failed', 'cancelled'].includes(turn.status));
}

/** `work` at most once per `ms`: a call during the wait is folded into the next run. */
function throttled(work, ms) {
  let timer = null;
  let last = 0;
  const call = () => {
    if (timer) return;
    const wait = Math.max(0, last + ms - Date.now());
    timer = setTimeout(() => {
      timer = null;
      last = Date.now();
      work();
    }, wait);
  };
  call.cancel = () => clearTimeout(timer);
  return call;
}

/** Runs `work` now, or once more after the current pass when asked during one. */
function refresher(work) {
  let running = null;
  let again = false;
  const run = async () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      do {
        again = false;
        try {
          await work();
        } catch (error) {
          if (!(error instanceof ApiError)) throw error;
          toast(error.message);
        }
      } while (again);
    })();
    try {
      await running;
    } finally {
      running = null;
    }
  };
  return run;
}

/** The runs of the task that were retried or resumed from this one. */
async function descendantsOf(taskId, runId) {
  const page = await get(withQuery(`/v1/tasks/${seg(taskId)}/runs`, { limit: 200 }));
  return page.data.filter((r) => r.retried_from_run_id === runId || r.resumed_from_run_id === runId);
}

/** The buttons, made once; each refresh only says which the status allows. */
function actions(view, state, task, base, ctx) {
  const carryOn = (verb) => async () => {
    const next = (await post(`${base}/${verb}`, { reason: `${verb} from the console` })).data;
    toast(`Run ${next.number} created (${verb}).`);
    ctx.navigate(`#/runs/${seg(task.id)}/${seg(next.id)}`);
  };
  const buttons = {
    cancel: action('Cancel', async () => {
      await post(`${base}/cancel`);
      toast(`Cancelling run ${state.run.number}.`);
    }, { class: 'danger' }),
    retry: action('Retry', carryOn('retry'), { class: 'secondary' }),
    resume: action('Resume', carryOn('resume'), { class: 'secondary' }),
  };
  replace(view.actions, buttons.cancel, buttons.retry, buttons.resume);
  return buttons;
}

function showRun(view, state, task) {
  const { run } = state;
  const active = ACTIVE.includes(run.status);
  enable(state.buttons.cancel, active);
  enable(state.buttons.retry, !active);
  enable(state.buttons.resume, !active);
  if (changed(view.status, run.status)) replace(view.status, badge(run.status));
  if (!changed(view.facts, JSON.stringify([run, state.descendants.map((d) => d.id)]))) return;
  const error = run.last_error;
  replace(view.facts, details([
    ['Run id', idView(run.id)],
    ['Origin', lineage(run)],
    ['Carried on by', state.descendants.length
      ? state.descendants.map((d, i) => [i ? ', ' : '',
        h('a', { href: `#/runs/${seg(task.id)}/${seg(d.id)}` }, `run ${d.number}`),
        ` (${d.retried_from_run_id ? 'retry' : d.lineage_kind || 'resume'})`])
      : null],
    ['Requested by', run.requested_by],
    ['Attempt', run.attempt],
    ['Worker', run.worker_id ? idView(run.worker_id) : null],
    ['Exit code', run.exit_code],
    ['Ended as', run.terminal_code],
    ['Last error', error ? (error.message || JSON.stringify(error)) : null],
    ['Model', run.model ? `${run.provider || ''} ${run.model} (${run.model_call_count} calls)` : null],
    ['Created', when(run.created_at)],
    ['Started', when(run.started_at)],
    ['Finished', when(run.finished_at)],
  ]));
}

async function showApprovals(view, taskId, runId) {
  const page = await get(withQuery(`/v1/tasks/${seg(taskId)}/approvals`, { status: 'pending' }));
  const mine = page.data.filter((a) => a.run_id === runId);
  if (!changed(view.approvals, mine.map((a) => a.id).join(','))) return;
  replace(view.approvals, mine.length === 0 ? null : h('div', { class: 'panel' },
    h('h2', {}, 'Waiting for approval'),
    mine.map((a) => [h('p', {}, a.kind), h('pre', { class: 'summary' }, summaryText(a))]),
    h('p', {}, h('a', { href: '#/approvals' }, 'Decide in the approvals inbox'))));
}

// A step's name, with what it was about: the tool a tool call called (an MCP server's
// tools are mcp__<server>__<tool>), and the server an mcp_server step started with the
// number of tools it offered.
function stepLabel(step) {
  const input = step.input || {};
  if (step.name === 'tool_call' && input.name) return `tool_call: ${input.name}`;
  if (step.name === 'mcp_server' && input.server) {
    const tools = step.output && step.output.tools;
    return Array.isArray(tools)
      ? `mcp_server: ${input.server} (${tools.length} tools)`
      : `mcp_server: ${input.server}`;
  }
  return step.name;
}

/** Seconds, one decimal, from milliseconds; empty when unknown. */
function seconds(ms) {
  return ms === null || ms === undefined ? '' : `${(Math.max(ms, 0) / 1000).toFixed(1)} s`;
}

/** A model call's figures: tokens in and out, cost (unknown when the model has no price),
 *  time. */
function callFacts(call) {
  const cost = call.cost_micros_usd === null || call.cost_micros_usd === undefined
    ? 'cost unknown' : `$${(call.cost_micros_usd / 1e6).toFixed(4)}`;
  return `call ${call.index} \u00b7 ${call.prompt_tokens ?? '?'} in, ${call.completion_tokens ?? '?'} out`
    + ` \u00b7 ${cost} \u00b7 ${seconds(call.latency_ms)}`;
}

/** One block of the transcript as the page shows it. */
function blockView(block, task, ctx) {
  switch (block.kind) {
    case 'user_message':
      return h('div', { class: 'turn user' }, h('p', { class: 'who' }, 'prompt'),
        h('div', { class: 'text md' }, markdown(block.text)));
    case 'raw_detail_ref':
      return h('p', { class: 'turn lineage' }, block.raw_detail_ref && block.raw_detail_ref.type === 'run'
        ? h('a', { href: `#/runs/${seg(task.id)}/${seg(block.raw_detail_ref.id)}` }, block.text) : block.text);
    case 'coordinator_text':
      return h('div', { class: 'turn assistant' },
        h('p', { class: 'who' }, 'assistant ', h('span', { class: 'facts' }, callFacts(block.model_call || {}))),
        block.text ? h('div', { class: 'text md' }, markdown(block.text)) : null);
    case 'operation_cell': {
      const tool = block.tool || {};
      const failed = tool.is_error || block.status === 'failed';
      return h('details', { class: `turn tool${failed ? ' failed' : ''}` },
        h('summary', {}, `${block.text || tool.name} `, badge(failed ? 'failed' : block.status),
          ` ${seconds(tool.latency_ms)}`),
        h('p', { class: 'who' }, 'arguments'), h('pre', { class: 'output' }, tool.arguments || ''),
        tool.result === null || tool.result === undefined ? null
          : [h('p', { class: 'who' }, 'result'), h('pre', { class: 'output' }, tool.result)],
        tool.abridged ? h('p', { class: 'who' }, 'Cut to 2,000 characters: the step has it whole.') : null);
    }
    case 'approval':
      return approvalView(block.approval || {}, task, ctx);
    case 'file_change': {
      const change = block.file_change || {};
      const path = change.path || '(the patch\'s files)';
      return patchDiff(ctx.base, change.patch_id, h('span', {}, 'file ', h('code', {}, path), ' ', badge(change.status)),
        { class: 'turn file', label: `the change to ${path}` });
    }
    default:
      return null;
  }
}

/** An approval the run waited on: what it covers, and while pending its decisions. */
function approvalView(approval, task, ctx) {
  const resolve = (decision) => action(decision === 'approve' ? 'Approve' : 'Reject', async () => {
    await post(`/v1/tasks/${seg(task.id)}/approvals/${seg(approval.approval_id)}/resolve`, { decision });
    toast(`Approval ${approval.approval_id}: ${decision}d.`);
    await ctx.refresh();
  }, { class: decision === 'approve' ? null : 'danger' });
  return h('div', { class: 'turn approval' },
    h('p', { class: 'who' }, 'approval ', badge(approval.status),
      approval.resolved_by ? ` by ${approval.resolved_by}` : ''),
    h('pre', { class: 'summary' }, (approval.action_summary || []).join('\n')),
    approval.status === 'pending' ? h('div', { class: 'actions' }, resolve('approve'), resolve('reject')) : null);
}

/**
 * The agent's run as its transcript (GET …/transcript): the prompt, each model call's text
 * (Markdown, rendered as elements, never as markup) with its tokens, cost and time, each
 * tool call (collapsed) with its arguments and result, approvals with their decisions, and
 * the file changes. Rebuilt only when a block changed.
 */
function showConversation(view, state, task, ctx) {
  const blocks = state.transcript.turns.flatMap((turn) => turn.blocks);
  const nodes = blocks.map((block) => {
    const key = JSON.stringify(block);
    const shown = state.shown.get(block.id);
    if (shown && shown.key === key) return shown.node;
    const node = blockView(block, task, ctx);
    state.shown.set(block.id, { key, node });
    return node;
  });
  // Only blocks that changed were made again; the rest keep their nodes (an open tool call
  // stays open), moved only if a block came before them.
  nodes.forEach((node, index) => {
    if (view.conversation.children[index] !== node) view.conversation.insertBefore(node, view.conversation.children[index] || null);
  });
  while (view.conversation.children.length > nodes.length) view.conversation.lastElementChild.remove();
}

/**
 * A patch as a diff, read when first opened (GET …/patches/ID): the file before and after,
 * the lines removed and added with a little around them.
 */
function patchDiff(base, patchId, summary, { class: className, label }) {
  return readWhenOpened(summary, className, async () => {
    const patch = (await get(`${base}/patches/${seg(patchId)}`)).data;
    return diffView(patch.before, patch.after, `diff of ${label}`);
  });
}

/** The prompt layers the run started from (GET …/context), read when first opened. */
function contextView(base) {
  const from = { stored: 'as the run kept them', task: 'from its task', not_started: 'from its task (not started yet)' };
  return readWhenOpened('Context: the system prompt layers', 'turn context', async () => {
    const context = (await get(`${base}/context`)).data;
    return [h('p', { class: 'who' }, `Layers ${from[context.source] || context.source}, in the order the model read them.`),
      context.layers.length === 0 ? h('p', { class: 'who' }, 'No system prompt.') : null,
      context.layers.map((layer) => [h('p', { class: 'who' }, `${layer.origin} layer`),
        h('pre', { class: 'output' }, layer.content)])];
  });
}

/** A collapsed section whose content `read` makes when it is first opened (again after a
 *  failed read, whose error it shows). */
function readWhenOpened(summary, className, read) {
  const body = h('div', {}, h('p', { class: 'who' }, 'Loading\u2026'));
  const node = h('details', { class: className }, h('summary', {}, summary), body);
  let done = false;
  node.addEventListener('toggle', async () => {
    if (!node.open || done) return;
    done = true;
    try {
      replace(body, await read());
    } catch (error) {
      done = false;
      replace(body, h('p', { class: 'error' }, error.message));
    }
  });
  return node;
}

function showSteps(view, steps) {
  if (!changed(view.steps, JSON.stringify(steps))) return;
  replace(view.steps, table('Steps', ['#', 'Step', 'Status', 'Started', 'Finished', 'Error'],
    steps.map((step) => [step.index, stepLabel(step), badge(step.status), when(step.started_at),
      when(step.finished_at), step.error ? String(step.error.message || step.error) : '']),
    'No steps yet.'));
}

function contentUrl(base, artifact) {
  return `${base}/artifacts/${seg(artifact.id)}/content`;
}

function showArtifacts(view, artifacts, base) {
  if (!changed(view.artifacts, JSON.stringify(artifacts))) return;
  replace(view.artifacts, table('Artifacts', ['Name', 'Type', 'Size', 'Status', 'Content'],
    artifacts.map((a) => [a.name, a.content_type, `${a.size_bytes} B${a.truncated ? ' (truncated)' : ''}`,
      badge(a.status),
      [h('a', { href: contentUrl(base, a), target: '_blank', rel: 'noopener' }, 'open'),
        PREVIEWED.includes(String(a.content_type).split(';')[0].trim().toLowerCase())
          ? h('img', { class: 'preview', src: contentUrl(base, a), alt: `preview of ${a.name}`, loading: 'lazy' })
          : null]]),
    'No artifacts yet.'));
}

/** What an operator may do with a patch in its status, once the run has ended. */
const PATCH_ACTIONS = {
  applied: [['Revert', 'revert']],
  proposed: [['Apply', 'apply'], ['Discard', 'discard']],
};

function showPatches(view, state, patches, base, refresh) {
  const ended = !ACTIVE.includes(state.run.status);
  if (!changed(view.patches, JSON.stringify([ended, patches]))) return;
  const bytes = (n) => (n === null || n === undefined ? 'none' : `${n} B`);
  replace(view.patches, table('File changes', ['Path', 'Status', 'Before', 'After', ''],
    patches.map((p) => [patchDiff(base, p.id, h('code', {}, p.path), { class: 'patch', label: p.path }),
      badge(p.status), bytes(p.before_bytes), bytes(p.after_bytes),
      (PATCH_ACTIONS[p.status] || []).map(([label, verb]) => action(label, async () => {
        await post(`${base}/patches/${seg(p.id)}/${verb}`);
        toast(`${p.path}: ${verb === 'apply' ? 'applied' : `${verb}ed`}`);
        await refresh();
      }, { class: verb === 'apply' ? null : 'secondary', disabled: !ended,
        'aria-label': `${label} ${p.path}` }))]),
    'No file changes.'));
}

/**
 * stdout and stderr as they grow: only the bytes after those already shown are fetched
 * (the content's `offset`), and a decoder per stream keeps a character split across two
 * reads whole.
 */
async function showOutput(view, state, artifacts, base) {
  for (const kind of ['stdout', 'stderr']) {
    const artifact = artifacts.find((a) => a.kind === kind || a.name === kind);
    const target = view[kind];
    if (!artifact) {
      if (!target.textContent) target.textContent = '(nothing yet)';
      continue;
    }
    const shown = state.outputs[kind] ||= { bytes: 0, text: '', decoder: new TextDecoder() };
    if (shown.read && shown.bytes >= artifact.size_bytes) continue;
    const url = `${contentUrl(base, artifact)}?offset=${shown.bytes}`;
    const response = await fetch(url, { credentials: 'same-origin' });
    if (!response.ok) continue;
    const bytes = new Uint8Array(await response.arrayBuffer());
    shown.read = true;
    shown.bytes += bytes.length;
    shown.text += shown.decoder.decode(bytes, { stream: true });
    target.textContent = shown.text || '(empty)';
    target.scrollTop = target.scrollHeight;
  }
}

function eventItem(event) {
  const facts = [];
  const data = event.data || {};
  for (const key of ['name', 'step', 'exit_code', 'kind', 'reason', 'error', 'status']) {
    if (data[key] !== undefined && data[key] !== null && typeof data[key] !== 'object') facts.push(`${key} ${data[key]}`);
  }
  return h('li', { 'data-type': event.type }, h('strong', {}, `#${event.sequence} ${event.type}`), ' ',
    facts.length ? `(${facts.join(', ')}) ` : '', when(event.occurred_at));
}
