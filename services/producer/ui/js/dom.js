// Small helpers every view shares: building elements (text only, never HTML strings, so no
// value from the API is ever parsed as markup), statuses with icon and text, local timestamps
// with UTC on hover, copy buttons, and empty and error states that say what to do.

/** `h('a', {href: '#'}, 'text', child)`: an element; strings become text nodes. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces the children of `el`. */
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** Statuses: an icon and a tone, so none is told apart by colour alone. */
const STATUS = {
  SCHEDULED: ['◷', 's-info'],
  PENDING: ['…', 's-info'],
  BLOCKED: ['‖', 's-wait'],
  APPROVED: ['✓', 's-info'],
  LEASED: ['▶', 's-info'],
  CONFIRMED: ['✔', 's-ok'],
  FAILED: ['✖', 's-bad'],
  UNKNOWN: ['?', 's-warn'],
  STUCK: ['⚠', 's-bad'],
  CANCELLED: ['⊘', 's-muted'],
  COMPENSATING: ['↺', 's-warn'],
  COMPENSATED: ['↩', 's-ok'],
  COMPENSATION_FAILED: ['‼', 's-bad'],
  NO_COMPENSATION: ['⚑', 's-warn'],
};
export const STATUSES = Object.keys(STATUS);

export function status(name) {
  const [icon, tone] = STATUS[name] || ['•', 's-muted'];
  return h('span', { class: `status ${tone}`, 'data-status': name },
    h('span', { class: 'icon', 'aria-hidden': 'true' }, icon), name || 'none');
}

/**
 * A timestamp in the viewer's zone on one line ("27 Nov 14:03:09"; the year only when it is
 * not this year's), with the UTC value in its title.
 */
export function time(iso) {
  if (!iso) return h('span', { class: 'muted' }, '—');
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return h('span', {}, iso);
  const date = at.toLocaleDateString(undefined, {
    day: 'numeric', month: 'short',
    year: at.getFullYear() === new Date().getFullYear() ? undefined : 'numeric',
  });
  const clock = at.toLocaleTimeString(undefined, {
    hour: '2-digit', minute: '2-digit', second: '2-digit', hourCycle: 'h23',
  });
  return h('time', { datetime: at.toISOString(), title: `${at.toISOString()} (UTC)` }, `${date} ${clock}`);
}

/** How long ago `iso` was, in words. */
export function ago(iso) {
  const ms = Date.now() - new Date(iso).getTime();
  if (!Number.isFinite(ms)) return '';
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

/** A button copying `text` to the clipboard. */
export function copy(text, what = 'id') {
  const button = h('button', {
    type: 'button', class: 'copy', title: `Copy ${what}`, 'aria-label': `Copy ${what} ${text}`,
  }, 'copy');
  button.addEventListener('click', async (e) => {
    e.preventDefault();
    e.stopPropagation();
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // Without clipboard access (plain HTTP off loopback): select a copy for Ctrl+C.
      const area = h('textarea', { class: 'visually-hidden' }, text);
      document.body.append(area);
      area.select();
      document.execCommand('copy');
      area.remove();
    }
    announce(`Copied ${what}`);
    button.textContent = 'copied';
    setTimeout(() => { button.textContent = 'copy'; }, 1200);
  });
  return button;
}

/** An id in monospace with its copy button. */
export function id(text, what = 'id', href) {
  const label = href ? h('a', { href, class: 'mono' }, text) : h('span', { class: 'mono' }, text);
  return h('span', { class: 'ident' }, label, copy(text, what));
}

/** JSON shown as text. */
export function json(value) {
  return h('pre', {}, value === undefined ? '—' : JSON.stringify(value, null, 2));
}

/** An empty state: what is not there and what to do. */
export function empty(title, hint) {
  return h('div', { class: 'empty card' }, h('strong', {}, title), hint ? h('span', {}, hint) : null);
}

/** What an error means for the person looking at it, and what to do next. */
export function errorState(err, retry) {
  const what = {
    0: 'The server did not answer.',
    401: 'Your token was not accepted.',
    403: 'Your token may not see or do this.',
    404: 'Not found.',
    503: 'The ledger or bus did not answer.',
  }[err.status] || 'The request failed.';
  const todo = {
    0: 'Check that Sluice is running (sluice dev, or the producer) and retry.',
    401: 'Sign out and sign in again with a valid token.',
    403: 'Use an operator token to read across runs, or an admin token to act.',
    404: 'Check the run id or command key; purged runs keep only their audit checkpoint.',
    503: 'Sluice is up but its storage is not: retry in a moment, and check the service logs.',
  }[err.status] || 'Retry; if it persists, check the service logs.';
  return h('div', { class: 'banner bad', role: 'alert' },
    h('strong', {}, what), ' ', err.message || '', h('br'), todo, ' ',
    retry ? h('button', { type: 'button', onclick: retry }, 'Retry') : null);
}

/** Says `message` to screen readers. */
export function announce(message) {
  const region = document.getElementById('announce');
  if (region) region.textContent = message;
}

/** The signed-in principal, set by main.js. */
export const session = { name: null, role: null };

export function isAdmin() {
  return session.role === 'admin';
}

/** Why an action button is disabled for a non-admin. */
export const NEEDS_ADMIN = 'Acting needs an admin token; your token may only read.';

/** A badge telling whether the live stream is connected. */
export function liveBadge() {
  const badge = h('span', { class: 'live off', role: 'status', 'aria-live': 'polite' }, '○ not live');
  badge.set = (state) => {
    const on = state === 'live';
    badge.className = `live ${on ? 'on' : 'off'}`;
    badge.textContent = on ? '● live' : state === 'reconnecting' ? '◌ reconnecting' : '○ not live';
    badge.dataset.state = state;
  };
  return badge;
}

/**
 * Re-renders `root` with `render()` keeping the keyboard focus on the same control (found by
 * its data-key and data-action, or its id), so live updates do not throw a person out.
 */
export function keepingFocus(root, render) {
  const active = document.activeElement;
  let selector = null;
  if (active && root.contains(active)) {
    const holder = active.closest('[data-key]');
    if (active.id) selector = `#${CSS.escape(active.id)}`;
    else if (holder && active.dataset.action) selector = `[data-key="${CSS.escape(holder.dataset.key)}"] [data-action="${CSS.escape(active.dataset.action)}"]`;
    else if (holder && active.tagName === 'SUMMARY') selector = `[data-key="${CSS.escape(holder.dataset.key)}"] > summary`;
  }
  render();
  if (selector) {
    const again = root.querySelector(selector);
    if (again) again.focus({ preventScroll: true });
  }
}

/**
 * `fn` run at most once per `ms` however often the returned function is called (a busy
 * system's events must not keep postponing a view's re-read for ever), and once more after
 * the last call.
 */
export function throttled(fn, ms) {
  let timer = null;
  let again = false;
  return () => {
    if (timer) {
      again = true;
      return;
    }
    timer = setTimeout(async function tick() {
      again = false;
      try {
        await fn();
      } finally {
        timer = again ? setTimeout(tick, ms) : null;
      }
    }, ms);
  };
}
