// The runs view: counts by status, filters by status, tool and time, search by run id or
// command key, and every run in the window with its effects' statuses. An agent sees its own
// runs only, made from the effects it submitted (it may not list run summaries).

import { api, paths } from '../api.js';
import { h, replace, status, time, id, empty, errorState, session, STATUSES, liveBadge, throttled } from '../dom.js';
import { watch } from '../live.js';

const WINDOWS = [['1h', 3600e3], ['24h', 86400e3], ['7d', 7 * 86400e3], ['30d', 30 * 86400e3], ['all', 0]];
const LIMIT = 1000;

/** Run summaries made from effects (what an agent may read), newest first. */
function runsOf(effects) {
  const runs = new Map();
  for (const e of effects) {
    const r = runs.get(e.run_id) || { run_id: e.run_id, created_at: e.created_at, updated_at: e.updated_at, open_commands: 0 };
    if (e.created_at < r.created_at) r.created_at = e.created_at;
    if (e.updated_at > r.updated_at) r.updated_at = e.updated_at;
    if (!TERMINAL.has(e.status)) r.open_commands += 1;
    // An agent reads no run summaries: a run whose effects a rollback touched was rolled back.
    if (ROLLED_BACK.has(e.status) || e.rollback_pending !== undefined) r.rolled_back_at = r.rolled_back_at || e.updated_at;
    runs.set(e.run_id, r);
  }
  return [...runs.values()].sort((a, b) => b.created_at.localeCompare(a.created_at));
}

const ROLLED_BACK = new Set(['COMPENSATING', 'COMPENSATED', 'COMPENSATION_FAILED', 'NO_COMPENSATION']);
const TERMINAL = new Set(['CONFIRMED', 'FAILED', 'CANCELLED', 'COMPENSATED', 'COMPENSATION_FAILED', 'NO_COMPENSATION']);

export async function render(root, _arg, params) {
  const agent = session.role === 'agent';
  const win = WINDOWS.find(([k]) => k === params.since) ? params.since : "24h";
  const filters = { status: params.status || '', tool: params.tool || '', since: win, q: params.q || '' };
  const setParams = (changes) => {
    const next = { ...filters, ...changes };
    const q = new URLSearchParams(Object.entries(next).filter(([, v]) => v)).toString();
    location.hash = `#/runs${q ? `?${q}` : ''}`;
  };

  const live = liveBadge();
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading runs…'));
  const toolList = h('datalist', { id: 'tools' });
  const form = h('form', {
    class: 'row card', role: 'search', 'aria-label': 'Filter runs',
    onsubmit: (e) => {
      e.preventDefault();
      const data = Object.fromEntries(new FormData(e.target).entries());
      setParams({ status: data.status, tool: data.tool.trim(), since: data.since, q: data.q.trim() });
    },
  },
  h('div', {}, h('label', { for: 'f-q' }, 'Search run id or command key'),
    h('input', { id: 'f-q', name: 'q', type: 'search', value: filters.q, spellcheck: 'false', placeholder: 'r-abc or d-3/payments/wire/0' })),
  h('div', {}, h('label', { for: 'f-status' }, 'Status'),
    h('select', { id: 'f-status', name: 'status' }, h('option', { value: '' }, 'any'),
      STATUSES.map((s) => h('option', { value: s, selected: s === filters.status }, s)))),
  h('div', {}, h('label', { for: 'f-tool' }, 'Tool'),
    h('input', { id: 'f-tool', name: 'tool', type: 'text', list: 'tools', value: filters.tool, placeholder: 'payments/wire' })),
  h('div', {}, h('label', { for: 'f-since' }, 'Created within'),
    h('select', { id: 'f-since', name: 'since' }, WINDOWS.map(([k]) => h('option', { value: k, selected: k === win }, k === 'all' ? 'any time' : `last ${k}`)))),
  h('button', { type: 'submit', class: 'primary' }, 'Apply'),
  h('button', { type: 'button', onclick: () => { location.hash = '#/runs'; } }, 'Clear'),
  toolList);

  replace(root, h('div', { class: 'spread' }, h('h1', {}, agent ? 'Your runs' : 'Runs'), live),
    agent ? h('p', { class: 'muted' }, `Signed in as agent ${session.name}: an agent token reads only the runs its agent submitted.`) : null,
    form, body);

  async function load() {
    const span = WINDOWS.find(([k]) => k === win)[1];
    const since = span ? new Date(Date.now() - span).toISOString() : undefined;
    let runs;
    let effects;
    try {
      [runs, effects] = await Promise.all([
        // An agent may not list run summaries: its runs are made from its own effects below.
        agent ? null : api(paths.runs({ since, limit: LIMIT })),
        api(paths.effects({ since, limit: LIMIT, tool: filters.tool })),
      ]);
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    draw(runs ? runs.runs : runsOf(effects.effects), effects.effects);
  }

  function draw(runs, effects) {
    const byRun = new Map();
    const totals = {};
    const tools = new Set();
    for (const e of effects) {
      tools.add(e.tool);
      totals[e.status] = (totals[e.status] || 0) + 1;
      if (!byRun.has(e.run_id)) byRun.set(e.run_id, []);
      byRun.get(e.run_id).push(e);
    }
    replace(toolList, [...tools].sort().map((t) => h('option', { value: t })));
    const q = filters.q.toLowerCase();
    const shown = runs.filter((r) => {
      const mine = byRun.get(r.run_id) || [];
      if (filters.status && !mine.some((e) => e.status === filters.status)) return false;
      if (filters.tool && !mine.length) return false;
      if (q && !r.run_id.toLowerCase().includes(q) && !mine.some((e) => e.command_key.toLowerCase().includes(q) || e.idempotency_key.toLowerCase().includes(q))) return false;
      return true;
    });
    const chips = h('div', { class: 'chips', role: 'group', 'aria-label': 'Effects by status; choose one to filter' },
      STATUSES.filter((s) => totals[s]).map((s) => h('button', {
        type: 'button', class: 'chip', 'aria-pressed': String(filters.status === s), 'data-count-status': s,
        onclick: () => setParams({ status: filters.status === s ? '' : s }),
      }, status(s), ` ${totals[s]}`)));
    const notes = [];
    if (effects.length >= LIMIT) notes.push(h('p', { class: 'muted' }, `Counting the newest ${LIMIT} effects only: narrow the time window or filter by tool for exact counts.`));
    let table;
    if (!runs.length) {
      table = empty('No runs in this window.', 'Widen "Created within", or submit an effect (POST /v1/effects) and it shows here.');
    } else if (!shown.length) {
      table = empty('No run matches these filters.', 'Clear the search or the status and tool filters.');
    } else {
      table = h('table', { 'aria-label': 'Runs' },
        h('thead', {}, h('tr', {}, ['Run', 'Agent', 'Created', 'Updated', 'Effects', 'Open', 'Statuses', 'Tools'].map((c) => h('th', { scope: 'col' }, c)))),
        h('tbody', {}, shown.map((r) => {
          const mine = byRun.get(r.run_id) || [];
          const counts = {};
          for (const e of mine) counts[e.status] = (counts[e.status] || 0) + 1;
          return h('tr', { 'data-run': r.run_id, 'data-rolled-back': r.rolled_back_at ? 'true' : null },
            h('td', {}, id(r.run_id, 'run id', `#/run/${encodeURIComponent(r.run_id)}`),
              r.rolled_back_at ? h('div', {}, h('span', {
                class: 'status s-warn rolled-back', 'data-status': 'ROLLED_BACK',
                title: `Rolled back: the run takes no new effects (${new Date(r.rolled_back_at).toISOString()} UTC)`,
              }, h('span', { class: 'icon', 'aria-hidden': 'true' }, '↩'), 'rolled back')) : null),
            h('td', {}, [...new Set(mine.map((e) => e.submitted_by || '—'))].join(', ')),
            h('td', {}, time(r.created_at)), h('td', {}, time(r.updated_at)),
            h('td', {}, String(mine.length)), h('td', {}, String(r.open_commands)),
            h('td', {}, h('div', { class: 'chips' }, Object.entries(counts).map(([s, n]) => h('span', {}, status(s), ` ${n}`)))),
            h('td', {}, [...new Set(mine.map((e) => e.tool))].join(', ')));
        })));
    }
    const direct = q && !runs.some((r) => r.run_id.toLowerCase() === q)
      ? h('p', {}, 'Not in this window? ', h('a', { href: `#/run/${encodeURIComponent(filters.q)}` }, `Open run ${filters.q} directly`), '.')
      : null;
    replace(body, chips, notes, direct, table);
  }

  await load();
  const reload = throttled(load, 1000);
  return watch('', () => {
    reload();
  }, (state) => live.set(state));
}
