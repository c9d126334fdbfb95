// The queues a person works through (an agent: its own runs'): BLOCKED effects waiting for approval, STUCK effects and
// effects UNKNOWN for longer than a chosen time, each with the evidence from its audit chain
// and the actions that settle it. Lifecycle events re-read the queues.

import { allEffects, api, paths } from '../api.js';
import {
  h, replace, status, time, ago, id, empty, errorState, liveBadge, session, keepingFocus,
  throttled,
} from '../dom.js';
import { actionButtons, timeline } from './run.js';
import { argsSummary, loadMoney } from '../format.js';
import { watch } from '../live.js';

/** Runs whose audit chains are read for evidence, at most. */
const MAX_TRAILS = 25;
const UNKNOWN_AGES = [['1', 'for over 1 minute'], ['5', 'for over 5 minutes'], ['15', 'for over 15 minutes'], ['60', 'for over an hour'], ['0', 'any time']];

function table(label, effects, trails, reload) {
  return h('table', { 'aria-label': label },
    h('thead', {}, h('tr', {}, ['Status', 'Run', 'Command', 'Since', 'Evidence', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, effects.map((c) => {
      const entries = (trails.get(c.run_id) || []).filter((e) => e.command_key === c.command_key);
      const last = entries[entries.length - 1];
      return h('tr', { 'data-key': c.command_key, 'data-run': c.run_id },
        h('td', {}, status(c.status)),
        h('td', {}, id(c.run_id, 'run id', `#/run/${encodeURIComponent(c.run_id)}`)),
        h('td', {}, id(c.command_key, 'command key'), h('div', { class: 'muted' }, c.tool), h('div', { class: 'muted' }, argsSummary(c.tool, c.args))),
        h('td', {}, time(c.updated_at), h('div', { class: 'muted' }, ago(c.updated_at))),
        h('td', {},
          last ? h('div', {}, h('strong', {}, last.actor), `: ${last.reason || ''}`) : null,
          c.last_error ? h('div', { class: 'error' }, c.last_error) : null,
          h('div', { class: 'muted' }, `${c.attempts}/${c.max_attempts} attempts${c.checks ? `, ${c.checks} checks` : ''}`),
          c.lands_by ? h('div', { class: 'muted' }, 'may land until ', time(c.lands_by)) : null,
          entries.length ? h('details', {}, h('summary', {}, `Timeline (${entries.length})`), timeline(entries)) : null),
        h('td', {}, h('div', { class: 'buttons' }, actionButtons(c, reload))));
    })));
}

export async function render(root, _arg, params) {
  const age = UNKNOWN_AGES.some(([k]) => k === params.unknown) ? params.unknown : '5';
  const live = liveBadge();
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading queues…'));
  const select = h('select', { id: 'unknown-age', onchange: (e) => { location.hash = `#/queues?unknown=${e.target.value}`; } },
    UNKNOWN_AGES.map(([k, label]) => h('option', { value: k, selected: k === age }, label)));
  replace(root, h('div', { class: 'spread' }, h('h1', {}, 'Queues'), live),
    session.role === 'agent' ? h('p', { class: 'muted' }, 'Your own runs\' effects only: an agent token sees no other agent\'s work.') : null,
    body);

  async function load() {
    let blocked;
    let stuck;
    let unknown;
    try {
      [blocked, stuck, unknown] = await Promise.all(['BLOCKED', 'STUCK', 'UNKNOWN']
        .map((s) => allEffects({ status: s, limit: 1000 })));
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    const cutoff = Date.now() - Number(age) * 60e3;
    unknown = unknown.filter((c) => new Date(c.updated_at).getTime() <= cutoff);
    const trails = new Map();
    const runs = [...new Set([...stuck, ...unknown, ...blocked].map((c) => c.run_id))].slice(0, MAX_TRAILS);
    await Promise.all([loadMoney(), ...runs.map((r) => api(paths.audit(r)).then((t) => trails.set(r, t.entries)).catch(() => null))]);
    keepingFocus(body, () => replace(body,
      h('section', { 'aria-labelledby': 'q-blocked' },
        h('h2', { id: 'q-blocked' }, `‖ Waiting for approval (${blocked.length})`),
        blocked.length ? table('Blocked effects', blocked, trails, load)
          : empty('Nothing waits for approval.', 'Effects above a tool\'s approval threshold appear here; approve or reject them with a reason.')),
      h('section', { 'aria-labelledby': 'q-stuck' },
        h('h2', { id: 'q-stuck' }, `⚠ Stuck (${stuck.length})`),
        h('p', { class: 'muted' }, 'Sluice could not learn these effects\' outcomes from evidence. Check the upstream, then resolve with what it says, or replay when it did not commit.'),
        stuck.length ? table('Stuck effects', stuck, trails, load)
          : empty('No stuck effects.', 'Effects whose outcome cannot be learned from evidence appear here.')),
      h('section', { 'aria-labelledby': 'q-unknown' },
        h('div', { class: 'row' }, h('h2', { id: 'q-unknown' }, `? Unknown (${unknown.length})`),
          h('div', {}, h('label', { for: 'unknown-age' }, 'Unknown'), select)),
        h('p', { class: 'muted' }, 'The reconciler is looking these up; one unknown for long usually means the upstream\'s status check is failing.'),
        unknown.length ? table('Unknown effects', unknown, trails, load)
          : empty('No effect has been unknown that long.', 'Choose a shorter time to see effects being reconciled now.'))));
  }

  await load();
  const reload = throttled(load, 1000);
  return watch('', () => {
    reload();
  }, (state) => live.set(state));
}
