// Audit: verify a run's hash chain (sha256(prev || canonical_json(record))) on the server and
// show the verdict, naming the first broken link, next to the chain's records.

import { api, paths } from '../api.js';
import { h, replace, status, time, id, json, empty, errorState, session } from '../dom.js';

export async function render(root, runId) {
  const input = h('input', { id: 'audit-run', type: 'text', value: runId || '', required: true, spellcheck: 'false', placeholder: 'r-abc, or sluice.system' });
  const body = h('div', {});
  replace(root, h('h1', {}, 'Audit chain'),
    h('form', {
      class: 'row card', role: 'search',
      onsubmit: (e) => {
        e.preventDefault();
        const v = input.value.trim();
        if (v) location.hash = `#/audit/${encodeURIComponent(v)}`;
      },
    }, h('div', {}, h('label', { for: 'audit-run' }, 'Run id'), input), h('button', { type: 'submit', class: 'primary' }, 'Verify')),
    body);
  if (!runId) {
    replace(body, empty('Choose a run to verify.', session.role === 'agent'
      ? 'Enter one of your run ids.'
      : 'Enter a run id, or sluice.system for the ledger\'s own chain (purges).'));
    return null;
  }
  let verdict;
  let trail;
  try {
    [verdict, trail] = await Promise.all([api(paths.verify(runId)), api(paths.audit(runId))]);
  } catch (e) {
    replace(body, errorState(e));
    return null;
  }
  const broken = verdict.valid ? null : verdict.broken;
  const banner = verdict.valid
    ? h('div', { class: 'banner ok', role: 'status', 'data-verdict': 'valid' },
      h('strong', {}, '✔ The chain verifies. '), `${verdict.records} records; head #${verdict.head.next_seq} `,
      h('span', { class: 'mono' }, verdict.head.hash), verdict.head.hash ? ' ' : '', verdict.checkpoint ? ' (continues from a purge checkpoint)' : '')
    : h('div', { class: 'banner bad', role: 'alert', 'data-verdict': 'broken' },
      h('strong', {}, `✖ The chain is broken at record #${broken.seq} (${broken.kind.replace(/_/g, ' ')}). `),
      verdict.message, h('dl', { class: 'grid' },
        h('dt', {}, 'Expected'), h('dd', { class: 'mono' }, broken.expected),
        h('dt', {}, 'Found'), h('dd', { class: 'mono' }, broken.found)),
      'Records from this one on cannot be trusted: compare them with a backup of the ledger, and report it.');
  const entries = trail.entries;
  replace(body, banner,
    h('p', {}, 'Run ', id(runId, 'run id', runId === 'sluice.system' ? undefined : `#/run/${encodeURIComponent(runId)}`)),
    trail.checkpoint ? h('p', { class: 'muted' }, `Checkpoint: ${trail.checkpoint.count} records purged at `, time(trail.checkpoint.purged_at)) : null,
    entries.length ? h('table', { 'aria-label': 'Audit records' },
      h('thead', {}, h('tr', {}, ['#', 'At', 'Command', 'Transition', 'Actor', 'Reason', 'Evidence', 'Hash'].map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, entries.map((e) => h('tr', { class: broken && broken.seq === e.seq ? 'broken' : '', 'data-seq': e.seq },
        h('td', {}, String(e.seq), broken && broken.seq === e.seq ? ' ✖ first broken' : ''),
        h('td', {}, time(e.at)),
        h('td', { class: 'mono key' }, e.command_key || '(run)'),
        h('td', {}, e.from ? status(e.from) : '—', ' → ', e.to ? status(e.to) : '—'),
        h('td', {}, e.actor),
        h('td', {}, e.reason),
        h('td', {}, e.evidence === null || e.evidence === undefined ? '' : h('details', {}, h('summary', {}, 'show'), json(e.evidence))),
        h('td', {}, h('span', { class: 'mono', title: e.hash }, `${e.hash.slice(0, 12)}…`)))))) : empty('No records.', 'A purged run keeps only its checkpoint.'));
  return null;
}
