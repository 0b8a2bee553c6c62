// The queue: depth and oldest age per kind, active leases, live workers, and a throughput
// chart of the last minutes (inline SVG drawn with DOM calls), refreshed every few seconds.

import { get, seg } from '../lib/api.js';
import { errorBox, h, replace, table } from '../lib/dom.js';
import { when } from '../lib/time.js';

const REFRESH_MS = 3000;
const MINUTES = 15;
const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 720;
const HEIGHT = 180;
const AXIS = 28;

/** An SVG element with attributes; children appended. */
function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  node.append(...children);
  return node;
}

/** Milliseconds as "4.2 s", "3 min", "2 h". */
export function duration(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 3_600_000) return `${Math.round(ms / 60_000)} min`;
  return `${(ms / 3_600_000).toFixed(1)} h`;
}

/** Every kind's buckets added up, bucket by bucket. */
function totals(throughput) {
  const sums = [];
  for (const kind of throughput.kinds) {
    kind.buckets.forEach((bucket, i) => {
      sums[i] ??= { start: bucket.start, completed: 0, failed: 0 };
      sums[i].completed += bucket.completed;
      sums[i].failed += bucket.failed;
    });
  }
  return sums;
}

/** Stacked bars per bucket: completed below, failed on top; each bar says its figures on
 *  hover (`<title>`), and the figure carries a text summary for screen readers. */
export function chart(throughput) {
  const sums = totals(throughput);
  const highest = Math.max(1, ...sums.map((b) => b.completed + b.failed));
  const slots = Math.max(1, sums.length);
  const step = (WIDTH - AXIS) / slots;
  const plot = HEIGHT - 20;
  const scale = (n) => (n / highest) * plot;
  const completed = svg('g', { class: 'status-completed', fill: 'currentColor' });
  const failed = svg('g', { class: 'status-failed', fill: 'currentColor' });
  sums.forEach((bucket, i) => {
    const x = AXIS + i * step + 1;
    const w = Math.max(1, step - 2);
    const label = `${new Date(bucket.start).toLocaleTimeString()}: ${bucket.completed} completed, ${bucket.failed} failed`;
    if (bucket.completed > 0) {
      const height = scale(bucket.completed);
      completed.append(svg('rect', { class: 'bar', x, y: plot - height, width: w, height }, svg('title', {}, label)));
    }
    if (bucket.failed > 0) {
      const height = scale(bucket.failed);
      const y = plot - scale(bucket.completed) - height;
      failed.append(svg('rect', { class: 'bar failed', x, y, width: w, height }, svg('title', {}, label)));
    }
  });
  const axis = svg('g', { fill: 'currentColor', 'font-size': 11 },
    svg('line', { x1: AXIS, y1: plot + 0.5, x2: WIDTH, y2: plot + 0.5, stroke: 'currentColor' }),
    svg('text', { x: 0, y: 10 }, String(highest)),
    svg('text', { x: 0, y: plot }, '0'),
    svg('text', { x: AXIS, y: HEIGHT - 4 }, `${throughput.minutes} min ago`),
    svg('text', { x: WIDTH, y: HEIGHT - 4, 'text-anchor': 'end' }, 'now'));
  const done = sums.reduce((n, b) => n + b.completed, 0);
  const lost = sums.reduce((n, b) => n + b.failed, 0);
  const summary = `${done} jobs completed and ${lost} attempts failed in the last ${throughput.minutes} minutes, in ${throughput.bucket_seconds}-second buckets`;
  return h('figure', { class: 'chart' },
    svg('svg', { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: '100%', role: 'img', 'aria-label': summary, class: 'throughput' },
      axis, completed, failed),
    h('figcaption', {}, summary, ' (', h('span', { class: 'status-completed' }, '\u25A0 completed'), ', ',
      h('span', { class: 'status-failed' }, '\u25A0 failed'), ').'));
}

function kindsTable(stats, throughput) {
  const done = new Map(throughput.kinds.map((k) => [k.kind, k]));
  const names = [...new Set([...stats.queue.map((k) => k.kind), ...done.keys()])].sort();
  const byKind = new Map(stats.queue.map((k) => [k.kind, k]));
  return table('Queue per kind', ['Kind', 'Depth', 'Ready', 'Leased', 'Oldest ready', `Completed (${MINUTES} min)`, `Failed (${MINUTES} min)`],
    names.map((name) => {
      const queue = byKind.get(name) || {};
      const recent = done.get(name) || {};
      return [h('span', { class: 'kind' }, name), queue.depth ?? 0, queue.ready ?? 0, queue.leased ?? 0,
        duration(queue.oldest_age_ms), recent.completed ?? 0, recent.failed ?? 0];
    }), 'The queue is empty and nothing ran lately.');
}

function leasesTable(leases) {
  return table('Active leases', ['Job', 'Kind', 'Of', 'Worker', 'Claimed', 'Expires', 'Heartbeats'],
    leases.data.map((lease) => [String(lease.job_id), lease.kind, lease.ref_id, lease.owner,
      when(lease.claimed_at), when(lease.expires_at), String(lease.heartbeats)]),
    'No job holds a lease.');
}

function workersTable(workers) {
  return table('Live workers', ['Worker', 'Host', 'PID', 'Kinds', 'Concurrency', 'Leases held', 'Last heartbeat'],
    workers.list.map((w) => [w.id, w.hostname ?? '—', w.pid === null ? '—' : String(w.pid), w.kinds.join(', '), String(w.concurrency),
      String(w.active_leases), duration(w.last_seen_ms_ago) + ' ago']),
    'No worker is live: start one with `keel worker` (or `keel serve`).');
}

export async function render(root, _params, ctx) {
  const body = h('div', { 'aria-live': 'off' });
  const stamp = h('p', { class: 'live', 'data-state': 'live' }, 'Loading…');
  replace(root, h('h1', {}, 'Queue'), stamp, body);
  const refresh = async () => {
    try {
      const [stats, leases, throughput] = await Promise.all([
        get('/v1/system/stats'),
        get('/v1/runtime/leases?status=active&limit=50'),
        get(`/v1/system/throughput?minutes=${seg(String(MINUTES))}`),
      ]);
      if (ctx.signal.aborted) return;
      const s = stats.data;
      replace(body,
        h('h2', {}, 'Throughput'), chart(throughput.data),
        h('h2', {}, 'Per kind'), kindsTable(s, throughput.data),
        h('h2', {}, `Active leases (${s.active_leases})`), leasesTable(leases),
        h('h2', {}, `Live workers (${s.workers.live})`), workersTable(s.workers));
      replace(stamp, `Refreshed ${new Date().toLocaleTimeString()}, every ${REFRESH_MS / 1000} s.`);
      stamp.dataset.state = 'live';
    } catch (error) {
      if (ctx.signal.aborted) return;
      stamp.dataset.state = 'error';
      replace(stamp, errorBox(error));
    }
  };
  await refresh();
  const timer = setInterval(refresh, REFRESH_MS);
  ctx.signal.addEventListener('abort', () => clearInterval(timer));
}
