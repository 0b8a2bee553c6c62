// The console's shell: signs the browser in, shows who it is, and routes `#/…` to pages.
// Each page is a module `pages/<module>.js` exporting `render(root, params, ctx)`.

import { get, post, del, request, setCsrf } from './lib/api.js';
import { h, replace, errorBox, toast } from './lib/dom.js';

/** Every page: its module, its route (`:name` takes one path segment), and its label in
 *  the navigation (none: reached by links only). One line per page. */
export const PAGES = [
  { module: 'tasks', route: '/tasks', nav: 'Tasks' },
  { module: 'task', route: '/tasks/:task_id' },
  { module: 'runs', route: '/runs', nav: 'Runs' },
  { module: 'run', route: '/runs/:task_id/:run_id' },
  { module: 'approvals', route: '/approvals', nav: 'Approvals' },
  { module: 'policy', route: '/policy', nav: 'Policy' },
  { module: 'schedules', route: '/schedules', nav: 'Schedules' },
  { module: 'media', route: '/media', nav: 'Media' },
  { module: 'media', route: '/media/:media_job_id' },
  { module: 'providers', route: '/providers', nav: 'Providers' },
  { module: 'queue', route: '/queue', nav: 'Queue' },
  { module: 'external_work', route: '/external-work', nav: 'External work' },
  { module: 'usage', route: '/usage', nav: 'Usage' },
];

const DEFAULT_ROUTE = '#/tasks';
/** A sign-in link (`keel console`): `/console#sign-in=<code>`, the code good once. */
const SIGN_IN_LINK = /^#sign-in=([0-9a-f]+)$/;

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');
let session = null;
let leaving = null;

/** The page and its parameters for a hash: `#/tasks/abc?status=running`. */
export function match(hash) {
  const [path, search = ''] = hash.replace(/^#/, '').split('?');
  const parts = path.split('/').filter(Boolean);
  for (const page of PAGES) {
    const pattern = page.route.split('/').filter(Boolean);
    if (pattern.length !== parts.length) continue;
    const params = {};
    const fits = pattern.every((piece, i) => {
      if (piece.startsWith(':')) {
        params[piece.slice(1)] = decodeURIComponent(parts[i]);
        return true;
      }
      return piece === parts[i];
    });
    if (fits) return { page, params, query: new URLSearchParams(search) };
  }
  return null;
}

function renderNav(current) {
  replace(nav, h('ul', {}, PAGES.filter((p) => p.nav).map((page) => h('li', {},
    h('a', { href: `#${page.route}`, 'aria-current': page === current ? 'page' : null }, page.nav)))));
}

async function route() {
  leaving?.abort();
  leaving = new AbortController();
  const found = match(location.hash || DEFAULT_ROUTE);
  if (!found) {
    location.replace(DEFAULT_ROUTE);
    return;
  }
  renderNav(found.page);
  const root = h('div', { class: 'page', 'data-page': found.page.module });
  replace(main, root);
  // Keyboard and screen reader users land on the new page, not on what was removed.
  main.focus({ preventScroll: true });
  const ctx = {
    signal: leaving.signal,
    query: found.query,
    session,
    navigate: (hash) => { location.hash = hash; },
  };
  try {
    const module = await import(`./pages/${found.page.module}.js`);
    if (ctx.signal.aborted) return;
    await module.render(root, found.params, ctx);
  } catch (error) {
    if (!ctx.signal.aborted) replace(root, errorBox(error));
  }
}

function signInForm(failure) {
  const input = h('input', { id: 'token', name: 'token', type: 'password', autocomplete: 'current-password', required: true });
  const form = h('form', { class: 'sign-in', method: 'post', action: '/console/session' },
    h('h1', {}, 'Sign in'),
    h('p', {}, 'This runtime is protected by its runtime token. Run `keel console` on its host for a sign-in link, or enter the token (KEEL_RUNTIME_TOKEN, or the runtime-token file in its data directory) once; the browser keeps a session cookie.'),
    h('label', { for: 'token' }, 'Runtime token'),
    input,
    failure ? errorBox(failure) : null,
    h('button', { type: 'submit' }, 'Sign in'));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    try {
      const answer = await post('/console/session', { token: input.value });
      start(answer.data);
    } catch (error) {
      signInForm(error);
    }
  });
  replace(nav);
  replace(who);
  replace(main, form);
  input.focus();
}

async function showWho() {
  try {
    const me = (await get('/v1/whoami')).data;
    const host = me.runtime_host || {};
    const signOut = session.sign_in === 'token'
      ? h('button', { type: 'button', class: 'link', onclick: signOutNow }, 'Sign out')
      : null;
    replace(who, h('span', { title: `workspace ${me.workspace} on ${host.label} (${host.runtime_mode} mode)` },
      `${me.actor_id} · ${host.label}`), ' ', signOut);
  } catch (error) {
    replace(who, errorBox(error));
  }
}

async function signOutNow() {
  try {
    await del('/console/session');
  } finally {
    load();
  }
}

function start(current) {
  session = current;
  setCsrf(session.csrf_token);
  if (!session.signed_in) {
    if (session.sign_in === 'token') {
      signInForm();
    } else {
      replace(main, h('p', { class: 'error', role: 'alert' },
        'Your proxy did not identify you to this runtime: sign in through it and reload.'));
    }
    return;
  }
  showWho();
  route();
}

/** Trades a sign-in link's code for a session; the form, with why, if it is refused. */
async function signInWithLink(code) {
  // Off the address bar and the history before it is used: the code is spent either way.
  history.replaceState(null, '', location.pathname);
  try {
    start((await post('/console/session', { code })).data);
  } catch (error) {
    // A used link opened again by a browser that is signed in already: nothing is lost.
    const current = (await get('/console/session').catch(() => null))?.data;
    if (current?.signed_in) start(current); else signInForm(error);
  }
}

async function load() {
  const link = location.hash.match(SIGN_IN_LINK);
  if (link) {
    signInWithLink(link[1]);
    return;
  }
  try {
    start((await request('GET', '/console/session')).data);
  } catch (error) {
    replace(main, errorBox(error));
  }
}

window.addEventListener('hashchange', () => session?.signed_in && route());
window.addEventListener('keel:unauthorized', () => {
  if (session?.signed_in) {
    toast('The session ended: sign in again.');
    load();
  }
});
load();
