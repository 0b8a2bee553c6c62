// Media jobs: the list (status filter, cursor pages) and a job's page with its status, its
// artifacts (images previewed from the artifact content route), and cancel.

import { Pager, get, post, seg } from '../lib/api.js';
import { action, badge, details, errorBox, h, replace, table, toast } from '../lib/dom.js';
import { when } from '../lib/time.js';
import { paged } from './paged.js';

const STATUSES = ['queued', 'running', 'succeeded', 'failed', 'cancelled'];
const ACTIVE = ['queued', 'running'];
/** Types the API serves inline (raster images): the only ones previewed. */
const PREVIEWED = ['image/png', 'image/jpeg', 'image/gif', 'image/webp', 'image/avif'];
/** An active job is re-read this often until it ends. */
const POLL_MS = 1500;

export async function render(root, params, ctx) {
  if (params.media_job_id) return job(root, params.media_job_id, ctx);
  return jobs(root, ctx);
}

async function jobs(root, ctx) {
  const status = ctx.query.get('status') || '';
  const pager = new Pager('/v1/media-jobs', { status }, 20);
  const list = h('section', { 'aria-labelledby': 'media-heading' });
  const filter = h('select', { id: 'media-status', name: 'status' },
    h('option', { value: '' }, 'any status'),
    STATUSES.map((s) => h('option', { value: s, selected: s === status }, s)));
  filter.addEventListener('change', () => ctx.navigate(filter.value ? `#/media?status=${filter.value}` : '#/media'));
  replace(root, h('h1', { id: 'media-heading' }, 'Media jobs'),
    h('div', { class: 'toolbar' }, h('label', { for: 'media-status' }, 'Status'), filter), list);
  await paged(list, pager, (page) => table('Media jobs', ['Job', 'Operation', 'Prompt', 'Status', 'Artifacts', 'Created'],
    page.data.map((j) => [
      h('a', { href: `#/media/${seg(j.id)}` }, j.id), j.operation, j.prompt, badge(j.status),
      String(j.artifact_ids.length), when(j.created_at),
    ]), status ? `No media job is ${status}.` : 'No media jobs yet (POST /v1/media-jobs).'), ctx.signal);
}

/** An artifact's row: its name linked to its bytes, and a preview when it is an image. */
function artifactRow(base, artifact) {
  const url = `${base}/artifacts/${seg(artifact.id)}/content`;
  const image = PREVIEWED.includes(artifact.content_type) && artifact.status === 'complete';
  return [
    h('a', { href: url }, artifact.name),
    artifact.content_type,
    `${artifact.size_bytes} bytes`,
    badge(artifact.status),
    image ? h('img', { class: 'preview', src: url, alt: `preview of ${artifact.name}`, loading: 'lazy' }) : '',
  ];
}

async function job(root, id, ctx) {
  const base = `/v1/media-jobs/${seg(id)}`;
  const head = h('div');
  const artifacts = h('section', { 'aria-labelledby': 'artifacts-heading' });
  replace(root, h('p', {}, h('a', { href: '#/media' }, '\u2190 Media jobs')), head,
    h('h2', { id: 'artifacts-heading' }, 'Artifacts'), artifacts);
  const draw = async () => {
    const current = (await get(base)).data;
    const list = (await get(`${base}/artifacts?limit=200`)).data;
    if (ctx.signal.aborted) return current;
    replace(head,
      h('h1', {}, `Media job ${current.id}`),
      details([
        ['Status', badge(current.status)], ['Operation', current.operation], ['Prompt', current.prompt],
        ['Provider', current.provider_id], ['Attempt', String(current.attempt)],
        ['Error', current.last_error ? `${current.last_error_code || ''} ${current.last_error}` : null],
        ['Created', when(current.created_at)], ['Started', when(current.started_at)],
        ['Finished', when(current.finished_at)],
      ]),
      h('div', { class: 'actions' }, action('Cancel', async () => {
        await post(`${base}/cancel`);
        toast(`Cancelled ${current.id}.`);
        await draw();
      }, { class: 'danger', disabled: !ACTIVE.includes(current.status) })));
    replace(artifacts, table('Artifacts', ['Name', 'Type', 'Size', 'Status', 'Preview'],
      list.map((a) => artifactRow(base, a)), 'No artifacts yet.'));
    return current;
  };
  const poll = async () => {
    try {
      const current = await draw();
      if (ACTIVE.includes(current.status) && !ctx.signal.aborted) setTimeout(poll, POLL_MS);
    } catch (error) {
      if (!ctx.signal.aborted) replace(head, errorBox(error));
    }
  };
  await poll();
}
