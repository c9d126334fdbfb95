// The overview: how the pipeline has been doing over the last hour, from the server's own
// counters (GET /v1/overview, sampled once a minute; the last point is the minute under way):
// effects settled per minute by outcome, and the UNKNOWN, STUCK and BLOCKED counts. Plain SVG
// drawn from the DOM (no inline script or style, no chart library), each chart with its figures
// in a table beside it. Read again every 15 seconds.

import { api, paths } from '../api.js';
import { h, replace, status, time, empty, errorState } from '../dom.js';

const SVG = 'http://www.w3.org/2000/svg';
const SLOTS = 61; // an hour of minutes and the one under way
const W = 640;
const H = 180;
const PAD = { left: 40, right: 8, top: 10, bottom: 24 };
const OUTCOMES = ['CONFIRMED', 'FAILED', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED', 'NO_COMPENSATION'];
const HELD = [['unknown', 'UNKNOWN'], ['stuck', 'STUCK'], ['blocked', 'BLOCKED']];
const REFRESH_MS = 15_000;

/** An SVG element; attributes only (the policy allows no inline style). */
function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  for (const child of children.flat()) if (child) el.append(child);
  return el;
}

function hhmm(iso) {
  return new Date(iso).toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' });
}

/** The frame of a chart: its y scale to `max`, grid lines, and time labels under its slots. */
function frame(minutes, max, label) {
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const slot = plotW / SLOTS;
  const first = SLOTS - minutes.length;
  const x = (i) => PAD.left + (first + i) * slot;
  const y = (v) => PAD.top + plotH - (max ? (v / max) * plotH : 0);
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': label });
  for (const v of [0, max / 2, max]) {
    svg.append(s('line', { x1: PAD.left, x2: W - PAD.right, y1: y(v), y2: y(v), class: 'grid-line' }),
      s('text', { x: PAD.left - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, String(Math.round(v * 10) / 10)));
  }
  minutes.forEach((m, i) => {
    if (i === minutes.length - 1 || (minutes.length - 1 - i) % 10 === 0) {
      svg.append(s('text', { x: x(i) + slot / 2, y: H - 6, 'text-anchor': 'middle', class: 'axis' }, m.partial ? 'now' : hhmm(m.to)));
    }
  });
  return { svg, x, y, slot };
}

function settledChart(minutes) {
  const totals = minutes.map((m) => OUTCOMES.reduce((n, o) => n + (m.settled[o] || 0), 0));
  const max = Math.max(4, ...totals);
  const { svg, x, y, slot } = frame(minutes, max,
    `Effects settled per minute by outcome over the last ${minutes.length} minute(s): ${totals.reduce((a, b) => a + b, 0)} in all`);
  minutes.forEach((m, i) => {
    let base = 0;
    for (const outcome of OUTCOMES) {
      const n = m.settled[outcome] || 0;
      if (!n) continue;
      svg.append(s('rect', {
        x: x(i) + 1, width: Math.max(slot - 2, 1), y: y(base + n), height: y(base) - y(base + n),
        class: `bar o-${outcome}`, 'data-outcome': outcome, 'data-count': n,
      }, s('title', {}, `${m.partial ? 'this minute' : hhmm(m.to)}: ${n} ${outcome}`)));
      base += n;
    }
  });
  return svg;
}

function heldChart(minutes) {
  const max = Math.max(4, ...minutes.flatMap((m) => HELD.map(([k]) => m[k])));
  const { svg, x, y, slot } = frame(minutes, max, 'UNKNOWN, STUCK and BLOCKED effects held, minute by minute');
  for (const [key, name] of HELD) {
    const points = minutes.map((m, i) => `${x(i) + slot / 2},${y(m[key])}`).join(' ');
    svg.append(s('polyline', { points, class: `line h-${key}`, 'data-series': name }));
    minutes.forEach((m, i) => svg.append(s('circle', { cx: x(i) + slot / 2, cy: y(m[key]), r: 2.5, class: `dot h-${key}` },
      s('title', {}, `${m.partial ? 'now' : hhmm(m.to)}: ${m[key]} ${name}`))));
  }
  return svg;
}

function legend(items) {
  return h('ul', { class: 'legend' }, items.map(([cls, name, text]) => h('li', {},
    h('span', { class: `swatch ${cls}`, 'aria-hidden': 'true' }), status(name), text ? ` ${text}` : '')));
}

function figures(caption, minutes, columns) {
  return h('details', { class: 'figures' }, h('summary', {}, `${caption}: the figures`),
    h('table', { 'aria-label': caption },
      h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Minute ending'), columns.map(([name]) => h('th', { scope: 'col' }, name)))),
      h('tbody', {}, minutes.map((m) => h('tr', { 'data-partial': String(m.partial) },
        h('td', {}, m.partial ? 'now (under way)' : time(m.to)), columns.map(([, get]) => h('td', {}, String(get(m)))))))));
}

export async function render(root) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  replace(root, h('h1', {}, 'Overview'),
    h('p', { class: 'muted' }, 'The last hour, from this server\'s own counters, sampled once a minute; the last point is the minute under way. It starts empty when the server starts.'),
    body);

  async function load() {
    let o;
    try {
      o = await api(paths.overview());
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    const now = o.minutes[o.minutes.length - 1];
    const sums = Object.fromEntries(OUTCOMES.map((out) => [out, o.minutes.reduce((n, m) => n + (m.settled[out] || 0), 0)]));
    const seen = OUTCOMES.filter((out) => sums[out]);
    replace(body,
      h('section', { class: 'tiles', 'aria-label': 'Held now' }, HELD.map(([key, name]) => h('a', {
        class: `tile card${now[key] ? ' attention' : ''}`, href: '#/queues', 'data-held': name,
      }, status(name), h('strong', { class: 'figure' }, String(now[key])), h('span', { class: 'muted' }, 'now')))),
      o.gauges ? null : h('p', { class: 'banner info' }, 'This server does not keep the state gauges (metrics.command_gauges is off here): its UNKNOWN, STUCK and BLOCKED counts stay at zero; read them where the gauges are kept.'),
      h('section', { class: 'card', 'aria-labelledby': 'ov-settled' },
        h('h2', { id: 'ov-settled' }, 'Effects settled per minute, by outcome'),
        seen.length ? legend(seen.map((out) => [`o-${out}`, out, `${sums[out]} in the hour`]))
          : empty('Nothing settled in this window.', 'Effects that reach a final status (CONFIRMED, FAILED, …) are counted here.'),
        settledChart(o.minutes),
        figures('Effects settled per minute', o.minutes, OUTCOMES.map((out) => [out, (m) => m.settled[out] || 0]))),
      h('section', { class: 'card', 'aria-labelledby': 'ov-held' },
        h('h2', { id: 'ov-held' }, 'UNKNOWN, STUCK and BLOCKED over the hour'),
        legend(HELD.map(([key, name]) => [`h-${key}`, name, `${now[key]} now`])),
        heldChart(o.minutes),
        figures('Effects held', o.minutes, HELD.map(([key, name]) => [name, (m) => m[key]]))),
      h('p', { class: 'muted' }, 'As of ', time(o.at), `; ${o.minutes.length - 1} whole minute(s) sampled.`));
  }

  await load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}
