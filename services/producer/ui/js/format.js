// Values shown the way people read them: amounts of money from the catalog's declarations
// (`[tool.money.<field>]`: 125000 with EUR and 2 minor units is "EUR 1,250.00") and arguments
// as a list of fields with their amounts formatted, the raw JSON one click away.

import { api, paths } from './api.js';
import { h, json } from './dom.js';

/** Each tool's money fields, once read: tool name → { field: { currency, minor_units } }. */
const moneyByTool = new Map();
let loading = null;

/** Reads the catalog's money declarations once per page (any token may read the tools). */
export function loadMoney() {
  if (!loading) {
    loading = api(paths.tools())
      .then((answer) => {
        for (const tool of answer.tools) moneyByTool.set(tool.name, tool.money || {});
      })
      .catch(() => {
        // Without the catalog amounts show as stored; try again on the next view.
        loading = null;
      });
  }
  return loading || Promise.resolve();
}

/** `amount` minor units in `money`'s currency, e.g. "EUR 1,250.00"; null when not a whole number. */
export function formatMoney(amount, money) {
  if (typeof amount !== 'number' || !Number.isSafeInteger(amount)) return null;
  const units = money.minor_units;
  const digits = String(Math.abs(amount)).padStart(units + 1, '0');
  const whole = digits.slice(0, digits.length - units).replace(/\B(?=(\d{3})+(?!\d))/g, ',');
  const fraction = units ? `.${digits.slice(digits.length - units)}` : '';
  return `${money.currency} ${amount < 0 ? '-' : ''}${whole}${fraction}`;
}

function moneyFields(tool) {
  return moneyByTool.get(tool) || {};
}

function shown(value) {
  return typeof value === 'string' ? value : JSON.stringify(value);
}

/** `field: value` pairs of a command's arguments, amounts formatted. */
function pairs(tool, args) {
  const money = moneyFields(tool);
  return Object.entries(args).map(([field, value]) => {
    const amount = money[field] ? formatMoney(value, money[field]) : null;
    return { field, value, amount, money: money[field] };
  });
}

/** A command's arguments in one line, amounts formatted (for tables). */
export function argsSummary(tool, args) {
  if (!args || typeof args !== 'object' || Array.isArray(args)) return shown(args);
  const text = pairs(tool, args).map((p) => `${p.field}: ${p.amount || shown(p.value)}`).join(', ');
  return text.length > 110 ? `${text.slice(0, 108)}…` : text;
}

/** A command's arguments as a list, amounts formatted, the JSON as stored below. */
export function argsView(tool, args) {
  if (!args || typeof args !== 'object' || Array.isArray(args)) return json(args);
  return h('div', { class: 'args' },
    h('dl', { class: 'grid' }, pairs(tool, args).map((p) => [
      h('dt', {}, p.field),
      h('dd', p.amount ? { 'data-money': p.field, title: `${p.value} in minor units (${p.money.minor_units} decimals)` } : {},
        p.amount ? h('strong', {}, p.amount) : h('span', { class: 'mono' }, shown(p.value))),
    ])),
    h('details', {}, h('summary', {}, 'JSON as stored'), json(args)));
}
