// Spend budgets: each budget's declaration (tools, scope, window, limits, what happens past a
// limit) and its counters in the current window — per scope value and currency, the amount
// held (reserved at admission, kept once committed, given back when a command ends without
// committing), the limit, what remains and how many commands hold on it. From GET /v1/budgets
// (operators and admins); re-read every 5 seconds. Amounts are in the currency's minor units,
// as the tools declare them.

import { api } from '../api.js';
import { h, replace, time, empty, errorState } from '../dom.js';

const REFRESH_MS = 5000;

const amount = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en'));

function limits(budget) {
  return Object.entries(budget.limits).map(([currency, limit]) => `${amount(limit)} ${currency}`).join(', ');
}

function counters(budget) {
  if (!budget.counters.length) {
    return h('p', { class: 'muted', 'data-empty': '1' }, 'Nothing held in this window.');
  }
  return h('table', { 'aria-label': `Counters of ${budget.name}` },
    h('thead', {}, h('tr', {}, [budget.scope.charAt(0).toUpperCase() + budget.scope.slice(1), 'Currency', 'Held', 'Limit', 'Remaining', 'Commands holding']
      .map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, budget.counters.map((c) => h('tr', {
      'data-scope-value': c.scope_value, 'data-currency': c.currency, 'data-held': String(c.used),
    },
    h('th', { scope: 'row' }, c.scope_value),
    h('td', {}, c.currency),
    h('td', { class: 'mono' }, amount(c.used)),
    h('td', { class: 'mono' }, amount(c.limit)),
    h('td', { class: 'mono' }, amount(c.remaining)),
    h('td', {}, String(c.holds))))));
}

function card(budget) {
  return h('section', { class: 'card', 'data-budget': budget.name, 'aria-labelledby': `budget-${budget.name}` },
    h('h2', { id: `budget-${budget.name}` }, budget.name),
    h('dl', { class: 'grid' },
      h('dt', {}, 'Tools'), h('dd', {}, budget.tools.join(', ')),
      h('dt', {}, 'Scope'), h('dd', {}, `per ${budget.scope}`),
      h('dt', {}, 'Window'), h('dd', {}, budget.window, ' — from ', time(budget.window_start),
        budget.window_end ? h('span', {}, ' to ', time(budget.window_end)) : ''),
      h('dt', {}, 'Limits'), h('dd', {}, limits(budget), h('span', { class: 'muted' }, ' (minor units)')),
      h('dt', {}, 'Past a limit'), h('dd', {}, budget.on_exceed === 'deny' ? 'denied' : 'sent for approval')),
    counters(budget));
}

export async function render(root) {
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  replace(root, h('h1', {}, 'Budgets'),
    h('p', { class: 'muted' }, 'An amount is held in the ledger when a command is admitted, atomically on every producer: racing agents cannot pass a limit together.'),
    body);
  async function load() {
    let answer;
    try {
      answer = await api('/v1/budgets');
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    if (!answer.budgets.length) {
      replace(body, empty('No budgets.', 'The catalog declares no [budgets.<name>].'));
      return;
    }
    replace(body, ...answer.budgets.map(card));
  }
  await load();
  const timer = setInterval(load, REFRESH_MS);
  return () => clearInterval(timer);
}
