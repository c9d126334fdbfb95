// Flow control: every upstream and tool with its declared rate, cap and circuit breaker, the
// breaker's state and who paused what; an admin pauses or resumes one with a reason (the same
// API route `sluice flow pause|resume` calls). Re-read every 5 seconds: a breaker opens and
// closes by itself.

import { api } from '../api.js';
import { h, replace, time, empty, errorState, isAdmin, NEEDS_ADMIN } from '../dom.js';
import { openAction } from '../actions.js';

const REFRESH_MS = 5000;

function breakerCell(e) {
  const state = e.breaker_state || { state: 'closed' };
  if (!e.breaker && state.state === 'closed') return h('span', { class: 'muted' }, 'none');
  if (state.state === 'open') {
    return h('div', { 'data-breaker': 'open' }, h('strong', { class: 'error' }, 'open'),
      h('div', { class: 'muted' }, 'since ', time(state.since)),
      h('div', { class: 'muted' }, 'probe at ', time(state.probe_at)),
      state.reason ? h('div', { class: 'muted' }, state.reason) : null);
  }
  if (state.state === 'half_open') {
    return h('div', { 'data-breaker': 'half_open' }, h('strong', {}, 'half open'),
      h('div', { class: 'muted' }, `probe by ${state.probe_by} until `, time(state.until)));
  }
  return h('span', { 'data-breaker': 'closed' }, 'closed');
}

function flowAction(entry, pause, reload) {
  const verb = pause ? 'Pause' : 'Resume';
  return openAction({
    title: `${verb} ${entry.name}`,
    intro: pause
      ? 'Its calls and looks wait, spending no attempt, on every dispatcher within a second, until it is resumed. Compensations still go.'
      : 'Its waiting calls come back within 10 seconds, spread out, at its rate.',
    fields: [{ name: 'reason', label: 'Reason', required: true, hint: 'Recorded in the sluice.system audit chain with your token\'s name.' }],
    buttons: [{
      label: verb,
      kind: pause ? 'danger' : 'primary',
      run: async (v) => {
        const answer = await api(`/v1/flow/${encodeURIComponent(entry.name)}:${pause ? 'pause' : 'resume'}`,
          { method: 'POST', body: { reason: v.reason } });
        return h('div', { class: 'banner ok', 'data-result': answer.outcome },
          h('strong', {}, `${entry.name}: ${answer.outcome.replace('_', ' ')}`),
          answer.paused ? h('div', {}, `by ${answer.paused.actor} at `, time(answer.paused.at), `: “${answer.paused.reason}”`) : null);
      },
    }],
    onDone: reload,
  });
}

function table(entries, reload) {
  const admin = isAdmin();
  return h('table', { 'aria-label': 'Flow control' },
    h('thead', {}, h('tr', {}, ['Name', 'Kind', 'Rate', 'In flight', 'Breaker', 'Paused', 'Actions'].map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, entries.map((e) => {
      const paused = e.paused;
      const button = h('button', {
        type: 'button',
        class: paused ? 'primary' : 'danger',
        'data-action': paused ? 'resume' : 'pause',
        disabled: !admin,
        title: admin ? '' : NEEDS_ADMIN,
        onclick: () => flowAction(e, !paused, reload),
      }, paused ? 'Resume' : 'Pause');
      return h('tr', { 'data-name': e.name, 'data-paused': paused ? '1' : '0' },
        h('th', { scope: 'row' }, e.name),
        h('td', {}, e.kind === 'tool' && e.upstream !== e.name ? `tool of ${e.upstream}` : e.kind,
          e.kind === 'upstream' && e.tools.length ? h('div', { class: 'muted' }, e.tools.join(', ')) : null),
        h('td', {}, e.rate ? `${e.rate} (burst ${e.burst})` : h('span', { class: 'muted' }, 'no limit')),
        h('td', {}, e.max_in_flight ? String(e.max_in_flight) : h('span', { class: 'muted' }, 'no cap')),
        h('td', {}, breakerCell(e)),
        h('td', {}, paused ? h('div', {}, h('strong', {}, 'paused'), ` by ${paused.actor} at `, time(paused.at),
          h('div', { class: 'muted' }, paused.reason)) : h('span', { class: 'muted' }, 'no')),
        h('td', {}, button));
    })));
}

export async function render(root) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  replace(root, h('h1', {}, 'Flow control'),
    h('p', { class: 'muted' }, 'Each upstream\'s limits hold over every dispatcher together; a call that may not go now waits in the ledger without spending an attempt.'),
    body);
  async function load() {
    let answer;
    try {
      answer = await api('/v1/flow');
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    if (!answer.flow.length) {
      replace(body, empty('No tools.', 'The catalog declares no tool.'));
      return;
    }
    replace(body, table(answer.flow, load));
  }
  await load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}
