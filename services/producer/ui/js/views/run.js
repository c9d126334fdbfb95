// One run: its effects in journal order, each with its arguments, result, external reference
// and a timeline from the run's audit chain (every transition, actor, reason, evidence); the
// admin's actions on each; the rollback and its live progress. Lifecycle events re-read it.

import { api, paths } from '../api.js';
import {
  h, replace, status, time, id, json, empty, errorState, isAdmin, NEEDS_ADMIN, liveBadge, announce,
  keepingFocus,
  throttled,
} from '../dom.js';
import * as actions from '../actions.js';
import { argsView, loadMoney } from '../format.js';
import { watch } from '../live.js';

/** Statuses a person should look at first. */
const ATTENTION = new Set(['BLOCKED', 'STUCK', 'UNKNOWN', 'COMPENSATION_FAILED', 'NO_COMPENSATION', 'FAILED']);

/** The actions that apply to a command as it is. */
function applicable(c) {
  const list = [];
  if (c.status === 'BLOCKED') {
    list.push(['Approve', actions.approve, 'primary'], ['Reject', actions.reject, 'danger'],
      ['Link', actions.approvalLink, '']);
  }
  if (['SCHEDULED', 'BLOCKED', 'APPROVED'].includes(c.status) || (c.status === 'PENDING' && !c.outcome_unknown)) {
    list.push(['Cancel', actions.cancel, 'danger']);
  }
  if (c.status === 'STUCK') list.push(['Resolve', actions.resolve, 'primary']);
  if (c.status === 'STUCK' || c.status === 'FAILED') list.push(['Replay', actions.replay, '']);
  return list;
}

export function actionButtons(c, reload) {
  return applicable(c).map(([label, action, kind]) => h('button', {
    type: 'button', class: kind, 'data-action': label.toLowerCase(),
    disabled: !isAdmin(), title: isAdmin() ? `${label} ${c.command_key}` : NEEDS_ADMIN,
    onclick: () => action(c, reload),
  }, label));
}

function fact(label, value) {
  if (value === undefined || value === null || value === '' || value === false) return null;
  return [h('dt', {}, label), h('dd', {}, value === true ? 'yes' : value)];
}

export function timeline(entries) {
  if (!entries.length) return h('p', { class: 'muted' }, 'No audit records for this effect (purged runs keep a checkpoint only).');
  return h('ol', { class: 'timeline', 'aria-label': 'Audit timeline' }, entries.map((e) => h('li', { 'data-seq': e.seq },
    time(e.at), ' ', e.from ? status(e.from) : h('span', { class: 'muted' }, '(new)'), ' → ', e.to ? status(e.to) : '—',
    ' by ', h('strong', {}, e.actor), e.reason ? [': ', e.reason] : null,
    h('span', { class: 'muted mono' }, ` #${e.seq}`),
    e.evidence !== null && e.evidence !== undefined ? h('details', {}, h('summary', {}, 'Evidence'), json(e.evidence)) : null)));
}

function effectCard(c, entries, open, reload) {
  const details = h('details', {
    class: `card effect${ATTENTION.has(c.status) || c.escalated ? ' attention' : ''}`,
    'data-key': c.command_key, 'data-status': c.status, open: open.has(c.command_key),
  },
  h('summary', {}, status(c.status), h('span', { class: 'mono' }, c.command_key), h('span', { class: 'muted' }, c.tool),
    c.escalated ? h('span', { class: 'status s-bad' }, '⚑ escalated') : null,
    c.external_ref ? h('span', { class: 'muted' }, `ref ${c.external_ref}`) : null,
    h('span', { class: 'muted' }, 'updated ', time(c.updated_at))),
  h('div', { class: 'buttons' }, actionButtons(c, reload)),
  h('dl', { class: 'grid' },
    fact('Command key', id(c.command_key, 'command key')),
    fact('Idempotency key', id(c.idempotency_key, 'idempotency key')),
    fact('External reference', c.external_ref ? id(c.external_ref, 'external reference') : null),
    fact('Semantics', c.semantics),
    fact('Business key', c.business_key),
    fact('Submitted by', c.submitted_by),
    fact('Tenant', c.tenant),
    fact('Created', time(c.created_at)),
    fact('Not before', c.not_before ? time(c.not_before) : null),
    fact('Due', c.due_at ? time(c.due_at) : null),
    fact('Attempts', `${c.attempts} of ${c.max_attempts}${c.checks ? `, ${c.checks} status checks` : ''}${c.replays ? `, ${c.replays} replays` : ''}`),
    fact('Lease', c.lease && c.lease.owner ? `epoch ${c.lease.epoch}, ${c.lease.owner}` : null),
    fact('May land until', c.lands_by ? time(c.lands_by) : null),
    fact('Last error', c.last_error),
    fact('Outcome unknown', c.outcome_unknown),
    fact('Last look pending', c.verify_pending),
    fact('Marked by a rollback', c.rollback_pending !== undefined ? `epoch ${c.rollback_pending}` : null),
    fact('Approval', c.approval ? [`${c.approval.approver}: “${c.approval.reason}” at `, time(c.approval.at)] : null),
    fact('Edited', c.revisions && c.revisions.length ? h('ol', { 'data-revisions': String(c.revisions.length) }, c.revisions.map((r) => h('li', {},
      `${r.by}: “${r.reason}” at `, time(r.at), ' — ',
      r.changes.map((x) => (x.secret ? `${x.pointer} (secret)` : `${x.pointer} ${JSON.stringify(x.old)} → ${JSON.stringify(x.new)}`)).join(', ')))) : null),
    fact('Compensation', c.compensation ? [`${c.compensation.attempts} attempts`, c.compensation.reference ? `, ref ${c.compensation.reference}` : '', c.compensation.detail ? `, ${c.compensation.detail}` : ''] : null),
    fact('Owed duplicates', c.owed_duplicates && c.owed_duplicates.length ? c.owed_duplicates.join(', ') : null)),
  h('div', { class: 'cols' },
    h('div', {}, h('h3', {}, c.revisions && c.revisions.length ? 'Arguments (as edited)' : 'Arguments'),
      argsView(c.tool, c.revisions && c.revisions.length ? c.revisions[c.revisions.length - 1].args : c.args)),
    h('div', {}, h('h3', {}, 'Result'), c.result === undefined ? h('p', { class: 'muted' }, 'No result yet.') : json(c.result))),
  h('h3', {}, 'Timeline'), timeline(entries));
  details.addEventListener('toggle', () => {
    if (details.open) open.add(c.command_key);
    else open.delete(c.command_key);
  });
  return details;
}

function progressPanel(progress) {
  const list = progress.commands;
  if (!list.length) return null;
  const settled = list.filter((c) => c.status !== 'COMPENSATING').length;
  return h('section', { class: 'card', 'aria-labelledby': 'rb-title', 'data-rollback-done': String(progress.done) },
    h('h2', { id: 'rb-title' }, progress.done ? '↩ Rollback done' : '↺ Rollback in progress'),
    h('div', { class: 'row' }, h('progress', { max: list.length, value: settled, 'aria-label': 'Compensations settled' }),
      h('span', {}, `${settled} of ${list.length} settled`)),
    h('ol', {}, list.map((c) => h('li', { 'data-key': c.command_key }, status(c.status), ' ', h('span', { class: 'mono' }, c.command_key), ` ${c.tool}`,
      c.escalated ? ' — escalated: a person must look' : ''))));
}

/** The run's own audit records (a rollback, with who asked and why). */
function runRecords(entries) {
  if (!entries.length) return null;
  const rolledBack = entries.some((e) => e.reason.startsWith('run rollback:'));
  return h('section', { class: `banner ${rolledBack ? 'info' : ''}`, 'aria-label': 'Run records' },
    rolledBack ? h('strong', {}, '↩ This run was rolled back: it takes no new effects. ') : null,
    h('ul', {}, entries.map((e) => h('li', { 'data-seq': e.seq }, time(e.at), ' ', h('strong', {}, e.actor), `: ${e.reason}`,
      h('span', { class: 'muted mono' }, ` #${e.seq}`)))));
}

export async function render(root, runId) {
  if (!runId) {
    location.hash = '#/runs';
    return null;
  }
  const open = new Set();
  const live = liveBadge();
  const rollbackButton = h('button', {
    type: 'button', class: 'danger', id: 'rollback', disabled: !isAdmin(),
    title: isAdmin() ? 'Compensate this run\'s effects, last first' : NEEDS_ADMIN,
    onclick: () => actions.rollback(runId, load),
  }, 'Roll back run');
  const body = h('div', {}, h('p', { class: 'muted' }, 'Loading…'));
  replace(root,
    h('div', { class: 'spread' },
      h('h1', {}, 'Run ', id(runId, 'run id')),
      h('div', { class: 'row' }, live,
        h('a', { class: 'button', href: `#/audit/${encodeURIComponent(runId)}` }, 'Verify audit chain'),
        rollbackButton)),
    isAdmin() ? null : h('p', { class: 'muted', id: 'read-only' }, `Read only: ${NEEDS_ADMIN}`),
    body);

  const seen = new Map();
  async function load() {
    let effects;
    let trail;
    let progress;
    try {
      [effects, , trail, progress] = await Promise.all([
        api(paths.run(runId)),
        loadMoney(),
        api(paths.audit(runId)).catch((e) => (e.status === 404 ? { entries: [], checkpoint: null } : Promise.reject(e))),
        api(paths.rollback(runId)).catch((e) => (e.status === 404 ? null : Promise.reject(e))),
      ]);
    } catch (e) {
      replace(body, errorState(e, load));
      return;
    }
    const list = effects.effects;
    if (!list.length) {
      replace(body, empty(`Run ${runId} has no effects.`, 'Check the id (they are case-sensitive). A purged run keeps only its audit checkpoint: open it under Audit.'));
      return;
    }
    // Open what needs a person when it is first seen in that state; leave the rest as chosen.
    for (const c of list) {
      if (ATTENTION.has(c.status) && seen.get(c.command_key) !== c.status) open.add(c.command_key);
      seen.set(c.command_key, c.status);
    }
    const counts = {};
    for (const c of list) counts[c.status] = (counts[c.status] || 0) + 1;
    keepingFocus(body, () => replace(body,
      h('div', { class: 'chips', 'aria-label': 'Effects by status' }, Object.entries(counts).map(([s, n]) => h('span', { class: 'chip' }, status(s), ` ${n}`))),
      runRecords(trail.entries.filter((e) => e.command_key === null)),
      progress ? progressPanel(progress.progress) : null,
      h('h2', {}, `Effects in journal order (${list.length})`),
      list.map((c) => effectCard(c, trail.entries.filter((e) => e.command_key === c.command_key), open, load))));
  }

  await load();
  const reload = throttled(load, 250);
  return watch(runId, (command) => {
    if (command) announce(`${command.command_key} is now ${command.status}`);
    reload();
  }, (state) => live.set(state));
}
