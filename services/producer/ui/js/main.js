// The console's entry: sign-in with a bearer token (kept in sessionStorage), the hash router
// (#/overview, #/flow, #/runs, #/run/<id>, #/queues, #/scheduled, #/audit[/<id>], #/budgets) and the navigation.

import { api, paths, token, setToken, clearToken, ApiError } from './api.js';
import { h, replace, session, errorState } from './dom.js';
import * as runs from './views/runs.js';
import * as run from './views/run.js';
import * as queues from './views/queues.js';
import * as scheduled from './views/scheduled.js';
import * as audit from './views/audit.js';
import * as overview from './views/overview.js';
import * as flow from './views/flow.js';
import * as budgets from './views/budgets.js';

const VIEWS = { runs, run, queues, scheduled, audit, overview, flow, budgets };
const view = document.getElementById('view');
let cleanup = null;

/** `#/run/r-1?x=y` → { name: 'run', arg: 'r-1', params: {x: 'y'} }. */
function route() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, q = ''] = hash.split('?');
  const [name, ...rest] = path.split('/');
  return {
    name: VIEWS[name] ? name : 'runs',
    arg: rest.length ? decodeURIComponent(rest.join('/')) : '',
    params: Object.fromEntries(new URLSearchParams(q)),
  };
}

async function show() {
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  if (!token()) {
    signInForm();
    return;
  }
  const r = route();
  for (const a of document.querySelectorAll('#nav a')) {
    const current = a.dataset.view === r.name || (r.name === 'run' && a.dataset.view === 'runs');
    if (current) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  replace(view, h('p', { class: 'muted' }, 'Loading…'));
  try {
    cleanup = (await VIEWS[r.name].render(view, r.arg, r.params)) || null;
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) {
      signOut('Your token was not accepted any more; sign in again.');
      return;
    }
    replace(view, errorState(e, show));
  }
}

function signInForm(message) {
  document.getElementById('nav').hidden = true;
  document.getElementById('who').hidden = true;
  replace(view);
  const section = document.getElementById('sign-in');
  section.hidden = false;
  const error = document.getElementById('sign-in-error');
  error.hidden = !message;
  error.textContent = message || '';
  document.getElementById('token').focus();
}

async function signIn(value) {
  setToken(value);
  try {
    const me = await api(paths.whoami());
    session.name = me.name;
    session.role = me.role;
  } catch (e) {
    clearToken();
    signInForm(e.status === 401
      ? 'That token is not recognised. Check it and try again (tokens are case-sensitive).'
      : e.message);
    return false;
  }
  document.getElementById('sign-in').hidden = true;
  document.getElementById('token').value = '';
  document.getElementById('nav').hidden = false;
  // The overview counts every run: an operator's or an admin's, not an agent's.
  document.querySelector('#nav [data-view=overview]').hidden = session.role === 'agent';
  // Budgets' counters name runs and tenants: an operator's or an admin's too.
  document.querySelector('#nav [data-view=budgets]').hidden = session.role === 'agent';
  document.querySelector('#nav [data-view=flow]').hidden = session.role === 'agent';
  const who = document.getElementById('who');
  who.hidden = false;
  replace(document.getElementById('who-name'), `Signed in as ${session.name} `,
    h('span', { class: 'role', 'data-role': session.role }, session.role));
  return true;
}

function signOut(message) {
  clearToken();
  session.name = null;
  session.role = null;
  if (cleanup) {
    cleanup();
    cleanup = null;
  }
  signInForm(message);
}

document.getElementById('sign-in-form').addEventListener('submit', async (e) => {
  e.preventDefault();
  const value = document.getElementById('token').value.trim();
  if (value && await signIn(value)) show();
});
document.getElementById('sign-out').addEventListener('click', () => signOut());
window.addEventListener('hashchange', async () => {
  if (!session.role) return;
  await show();
  // Keyboard and screen-reader users land on the new view, not on the link they followed.
  const heading = view.querySelector('h1');
  if (heading && !view.contains(document.activeElement)) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
});

(async () => {
  const saved = token();
  if (saved && await signIn(saved)) show();
  else if (!saved) signInForm();
})();
