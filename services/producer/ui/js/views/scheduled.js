// Scheduled effects: what will run later, earliest first, across runs or in one
// run (`#/scheduled?run=…`); an agent sees its own runs' only. The admin may cancel them.

import { allEffects, api } from '../api.js';
import { h, replace, time, id, empty, errorState, liveBadge, session, throttled } from '../dom.js';
import { actionButtons } from './run.js';
import { watch } from '../live.js';

export async function render(root, _arg, params) {
  const run = params.run || '';
  const agent = session.role === 'agent';
  const live = liveBadge();
  const input = h('input', { id: 'sched-run', type: 'text', value: run, spellcheck: 'false', placeholder: agent ? 'all your runs' : 'all runs' });
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  replace(root,
    h('div', { class: 'spread' }, h('h1', {}, 'Scheduled effects'), live),
    h('form', {
      class: 'row card', role: 'search',
      onsubmit: (e) => {
        e.preventDefault();
        const v = input.value.trim();
        location.hash = v ? `#/scheduled?run=${encodeURIComponent(v)}` : '#/scheduled';
      },
    }, h('div', {}, h('label', { for: 'sched-run' }, 'Run id'), input), h('button', { type: 'submit' }, 'Show')),
    body);

  async function load() {
    let effects;
    try {
      effects = run ? (await api(`/v1/runs/${encodeURIComponent(run)}/scheduled`)).effects
        : await allEffects({ status: 'SCHEDULED', limit: 1000 });
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    effects.sort((a, b) => String(a.due_at || a.not_before).localeCompare(String(b.due_at || b.not_before)));
    if (!effects.length) {
      replace(body, empty('Nothing is scheduled.', 'Effects submitted with delay_ms or a future not_before wait here until they are due.'));
      return;
    }
    replace(body, h('table', { 'aria-label': 'Scheduled effects' },
      h('thead', {}, h('tr', {}, ['Due', 'Run', 'Command', 'Tool', 'Arguments', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, effects.map((c) => h('tr', { 'data-key': c.command_key, 'data-run': c.run_id },
        h('td', {}, time(c.not_before || c.due_at)),
        h('td', {}, id(c.run_id, 'run id', `#/run/${encodeURIComponent(c.run_id)}`)),
        h('td', {}, id(c.command_key, 'command key')),
        h('td', {}, c.tool),
        h('td', { class: 'mono' }, JSON.stringify(c.args)),
        h('td', {}, h('div', { class: 'buttons' }, actionButtons(c, load))))))));
  }

  await load();
  const reload = throttled(load, 1000);
  return watch(run, () => {
    reload();
  }, (state) => live.set(state));
}
