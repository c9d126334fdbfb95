// The admin's actions, each in a dialog that asks for a reason (and evidence where the API
// needs it), calls the API route that `sluice` on the command line also calls, and shows the
// audited result: the transition and the audit record it wrote.

import { api, paths } from './api.js';
import { h, replace, status, json, time, announce, session, id } from './dom.js';
import { argsView } from './format.js';

/** Evidence as typed: a JSON object when it parses as one, else the text. */
function evidence(text) {
  const t = (text || '').trim();
  if (!t) return undefined;
  if (t.startsWith('{')) {
    try {
      return JSON.parse(t);
    } catch {
      return t;
    }
  }
  return t;
}

function field(f) {
  const idFor = `f-${f.name}`;
  let input;
  if (f.kind === 'select') {
    input = h('select', { id: idFor, name: f.name }, f.options.map((o) => h('option', { value: o }, o)));
  } else if (f.kind === 'text') {
    input = h('input', { id: idFor, name: f.name, type: 'text', autocomplete: 'off', spellcheck: 'false' });
  } else {
    input = h('textarea', { id: idFor, name: f.name, required: f.required });
  }
  return h('div', { class: 'field' },
    h('label', { for: idFor }, f.label, f.required ? ' (required)' : ''), input,
    f.hint ? h('div', { class: 'muted' }, f.hint) : null);
}

/**
 * Opens the action dialog. `spec`: { title, intro, fields, buttons: [{ label, kind, run(values,
 * ui) }] }. A button's `run` returns nodes to show as the result, or throws an ApiError.
 */
export function openAction(spec) {
  const dialog = document.getElementById('action');
  const form = document.getElementById('action-form');
  const body = document.getElementById('action-body');
  const result = document.getElementById('action-result');
  const buttons = document.getElementById('action-buttons');
  replace(document.getElementById('action-title'), spec.title);
  replace(body, spec.intro ? h('p', {}, spec.intro) : null, spec.details || null, spec.fields.map(field));
  replace(result);
  let done = false;
  const close = h('button', { type: 'button', class: 'quiet', onclick: () => dialog.close() }, 'Close');
  const ui = {
    result,
    lock(label, locked) {
      for (const b of buttons.querySelectorAll('button')) if (b.textContent === label) b.dataset.locked = locked ? '1' : '0';
    },
  };
  const actionButtons = spec.buttons.map((b) => {
    const button = h('button', { type: 'button', class: b.kind || 'primary', disabled: b.locked }, b.label);
    button.addEventListener('click', async () => {
      const values = Object.fromEntries(new FormData(form).entries());
      if (spec.fields.some((f) => f.required && !(values[f.name] || '').trim())) {
        replace(result, h('p', { class: 'error', role: 'alert' },
          `Fill in ${spec.fields.filter((f) => f.required).map((f) => f.label.toLowerCase()).join(' and ')}: every action is recorded with its reason.`));
        return;
      }
      for (const other of buttons.querySelectorAll('button')) other.disabled = true;
      replace(result, h('p', { class: 'muted' }, 'Working…'));
      try {
        const shown = await b.run(values, ui);
        replace(result, shown);
        if (b.final !== false) {
          done = true;
          for (const input of body.querySelectorAll('input, textarea, select')) input.disabled = true;
        }
        announce(`${spec.title}: done`);
      } catch (e) {
        replace(result, h('div', { class: 'banner bad', role: 'alert' },
          h('strong', {}, `Refused (${e.status || 'no answer'} ${e.code || ''}). `), e.message,
          e.details && e.details.problems ? json(e.details.problems) : null));
      }
      for (const other of buttons.querySelectorAll('button')) {
        other.disabled = done ? other !== close : other.dataset.locked === '1';
      }
      close.disabled = false;
      if (done) close.focus();
    });
    if (b.locked) button.dataset.locked = '1';
    return button;
  });
  replace(buttons, actionButtons, close);
  form.onsubmit = (e) => e.preventDefault();
  dialog.onclose = () => { if (done && spec.onDone) spec.onDone(); };
  dialog.showModal();
  const first = body.querySelector('textarea, input, select');
  if (first) first.focus();
}

/** The audit record an action just wrote (the newest for `key`), shown with the transition. */
async function audited(run, key, answer) {
  let record = null;
  try {
    const trail = await api(paths.audit(run));
    // The record of this very transition (the pipeline may have moved the command on since).
    record = trail.entries.filter((e) => e.command_key === key && e.from === answer.from
      && e.to === answer.to && e.actor === session.name).pop() || null;
  } catch {
    record = null;
  }
  return h('div', { class: 'banner ok', 'data-result': 'applied' },
    h('strong', {}, `${answer.action}: `), status(answer.from), ' → ', status(answer.to),
    record ? h('div', {},
      `Audit record #${record.seq} by ${record.actor} at `, time(record.at), `: “${record.reason}”`,
      h('div', { class: 'mono muted' }, `hash ${record.hash.slice(0, 16)}…`)) : null);
}

function simple(action, title, intro) {
  return (command, onDone, details) => openAction({
    title: `${title} ${command.command_key}`,
    intro,
    details,
    fields: [{ name: 'reason', label: 'Reason', required: true, hint: 'Recorded in the audit chain with your token\'s name.' }],
    buttons: [{
      label: title,
      kind: action === 'approve' ? 'primary' : 'danger',
      run: async (v) => audited(command.run_id, command.command_key,
        await api(paths.action(command.run_id, command.command_key, action), { method: 'POST', body: { reason: v.reason } })),
    }],
    onDone,
  });
}

/** The arguments the command is dispatched with: its last revision's, else as submitted. */
function currentArgs(command) {
  const revisions = command.revisions || [];
  return revisions.length ? revisions[revisions.length - 1].args : command.args;
}

/**
 * The approve dialog: a reason, and the arguments as JSON — left as they are, the command is
 * approved as it is; changed, it is approved edited to them (a revision of the same command,
 * checked by the server against the schema, policy and budgets).
 */
function approveAction(command, onDone, details) {
  const shown = JSON.stringify(currentArgs(command), null, 2);
  openAction({
    title: `Approve ${command.command_key}`,
    intro: 'The command is dispatched under the current policy version. Edit its arguments below to correct them as you approve: the edit is recorded as a revision of the same command, under the same key.',
    details,
    fields: [
      { name: 'reason', label: 'Reason', required: true, hint: 'Recorded in the audit chain with your token\'s name.' },
      { name: 'args', label: 'Arguments (JSON)', required: false, hint: 'Left as they are: approved as submitted. Changed: approved with your edit, whole.' },
    ],
    buttons: [{
      label: 'Approve',
      kind: 'primary',
      run: async (v) => {
        const body = { reason: v.reason };
        if ((v.args || '').trim() !== shown.trim()) {
          try {
            body.args = JSON.parse(v.args);
          } catch (e) {
            throw Object.assign(new Error(`the arguments are not JSON: ${e.message}`), { code: 'invalid_json' });
          }
        }
        return audited(command.run_id, command.command_key,
          await api(paths.action(command.run_id, command.command_key, 'approve'), { method: 'POST', body }));
      },
    }],
    onDone,
  });
  const args = document.getElementById('f-args');
  if (args) {
    args.value = shown;
    args.dataset.edit = 'args';
    args.rows = Math.min(16, shown.split('\n').length + 1);
  }
}

/**
 * Approve, showing what is approved: the run, the tool, the arguments (amounts formatted) and
 * why policy holds it, from the BLOCKED record of its audit chain.
 */
export function approve(command, onDone) {
  const why = h('dd', { 'data-policy-reason': 'loading' }, h('span', { class: 'muted' }, 'Reading the audit chain…'));
  approveAction(command, onDone, h('dl', { class: 'grid approve-facts', 'aria-label': 'What you approve' },
    h('dt', {}, 'Run'), h('dd', { 'data-fact': 'run' }, id(command.run_id, 'run id')),
    h('dt', {}, 'Tool'), h('dd', { 'data-fact': 'tool' }, h('span', { class: 'mono' }, command.tool), ` (${command.semantics})`),
    h('dt', {}, 'Submitted by'), h('dd', {}, command.submitted_by || '—', ' at ', time(command.created_at)),
    h('dt', {}, 'Why it waits'), why,
    h('dt', {}, 'Arguments'), h('dd', { 'data-fact': 'args' }, argsView(command.tool, currentArgs(command)))));
  api(paths.audit(command.run_id)).then((trail) => {
    const blocked = trail.entries.filter((e) => e.command_key === command.command_key && e.to === 'BLOCKED').pop();
    why.dataset.policyReason = blocked ? 'found' : 'none';
    replace(why, blocked ? h('strong', {}, blocked.reason) : h('span', { class: 'muted' }, 'No BLOCKED record in the audit chain.'),
      ` (policy version ${command.policy_version})`);
  }).catch((e) => {
    why.dataset.policyReason = 'error';
    replace(why, h('span', { class: 'error' }, `The audit chain could not be read: ${e.message}`));
  });
}
export const reject = simple('reject', 'Reject', 'The command is cancelled and never dispatched.');
export const cancel = simple('cancel', 'Cancel',
  'Only a command that has not started (SCHEDULED, PENDING, BLOCKED, APPROVED) can be cancelled.');

export function resolve(command, onDone) {
  openAction({
    title: `Resolve ${command.command_key}`,
    intro: 'Settle this STUCK command by hand, from what the upstream says happened.',
    fields: [
      { name: 'outcome', label: 'Outcome', kind: 'select', options: ['CONFIRMED', 'FAILED'] },
      { name: 'evidence', label: 'Evidence', required: true, hint: 'The upstream reference or record (text, or a JSON object).' },
      { name: 'external_ref', label: 'External reference', kind: 'text', hint: 'CONFIRMED only; the evidence text is taken when empty.' },
      { name: 'reason', label: 'Reason', required: true },
    ],
    buttons: [{
      label: 'Resolve',
      run: async (v) => {
        const body = { outcome: v.outcome, evidence: evidence(v.evidence), reason: v.reason };
        if (v.outcome === 'CONFIRMED' && v.external_ref.trim()) body.external_ref = v.external_ref.trim();
        return audited(command.run_id, command.command_key,
          await api(paths.action(command.run_id, command.command_key, 'resolve'), { method: 'POST', body }));
      },
    }],
    onDone,
  });
}

function report(r) {
  return h('div', { class: `banner ${r.allowed ? 'ok' : 'bad'} report`, 'data-result': 'dry-run' },
    h('strong', {}, r.allowed ? '✔ A replay is allowed. ' : '✖ A replay would be refused. '),
    'Dry run: nothing was called or changed.',
    h('dl', { class: 'grid' },
      h('dt', {}, 'From'), h('dd', {}, status(r.from), r.to ? [' → ', status(r.to)] : null),
      h('dt', {}, 'Arguments'), h('dd', {}, r.arguments.valid ? 'valid under the current schema' : json(r.arguments.violations)),
      h('dt', {}, 'Policy'), h('dd', {}, r.policy ? `${r.policy.decision}${r.policy.reason ? `: ${r.policy.reason}` : ''}` : '—', ` (version ${r.policy_version})`),
      h('dt', {}, 'Replays'), h('dd', {}, `command ${r.replays.command}/${r.replays.command_limit}, run ${r.replays.run}/${r.replays.run_limit}`),
      r.problems.length ? [h('dt', {}, 'Problems'), h('dd', {}, h('ul', {}, r.problems.map((p) => h('li', {}, `${p.code}: ${p.message}`))))] : null,
      h('dt', {}, 'Next'), h('dd', {}, r.next)));
}

export function replay(command, onDone) {
  const needsEvidence = command.status === 'STUCK' && command.semantics === 'NON_IDEMPOTENT';
  openAction({
    title: `Replay ${command.command_key}`,
    intro: 'Run the dry run first: it reports what a replay would do and calls nothing.',
    fields: [
      { name: 'reason', label: 'Reason', required: true },
      { name: 'evidence', label: 'Evidence', required: false,
        hint: needsEvidence ? 'Needed: evidence that the earlier attempt did not commit.' : 'Optional.' },
    ],
    buttons: [
      {
        label: 'Dry run', kind: 'quiet', final: false,
        run: async (v, ui) => {
          const body = { reason: v.reason, dry_run: true };
          if (evidence(v.evidence) !== undefined) body.evidence = evidence(v.evidence);
          let r;
          try {
            r = await api(paths.action(command.run_id, command.command_key, 'replay'), { method: 'POST', body });
          } catch (e) {
            if (e.details && e.details.dry_run !== undefined) r = e.details;
            else throw e;
          }
          // The replay itself is offered only once a dry run said it is allowed.
          ui.lock('Replay', !r.allowed);
          return report(r);
        },
      },
      {
        label: 'Replay', locked: true,
        run: async (v) => {
          const body = { reason: v.reason };
          if (evidence(v.evidence) !== undefined) body.evidence = evidence(v.evidence);
          return audited(command.run_id, command.command_key,
            await api(paths.action(command.run_id, command.command_key, 'replay'), { method: 'POST', body }));
        },
      },
    ],
    onDone,
  });
}

export function rollback(run, onDone) {
  openAction({
    title: `Roll back run ${run}`,
    intro: 'Every confirmed effect is compensated, last first; effects in flight are undone once their outcome is known; the run takes no new effects.',
    fields: [{ name: 'reason', label: 'Reason', required: true }],
    buttons: [{
      label: 'Roll back',
      kind: 'danger',
      run: async (v) => {
        const a = await api(paths.rollback(run), { method: 'POST', body: { reason: v.reason } });
        const r = a.rollback;
        let record = null;
        try {
          record = (await api(paths.audit(run))).entries
            .filter((e) => e.command_key === null && e.actor === session.name).pop() || null;
        } catch {
          record = null;
        }
        return h('div', { class: 'banner ok', 'data-result': 'rollback' },
          h('strong', {}, 'Rollback begun. '),
          `${r.compensating} compensating, ${r.cancelled} cancelled, ${r.no_compensation} with no compensation, ${r.in_flight.length} in flight (${r.marked} marked). `,
          record ? h('div', {}, `Audit record #${record.seq} by ${record.actor} at `, time(record.at), `: “${record.reason}”`) : null,
          'Close this to watch it progress live.');
      },
    }],
    onDone,
  });
}

const LINK_LIVES = { '1 hour': 3600, '24 hours': 86400, '7 days': 604800 };

/**
 * An approval link for a BLOCKED command: a signed, single-use URL a person opens without a
 * token to approve or reject it (POST …:approval-link). The URL is shown once, to copy.
 */
export function approvalLink(command, onDone) {
  openAction({
    title: `Approval link for ${command.command_key}`,
    intro: 'Anyone holding the link can approve or reject this command once, without signing in, until it expires. Send it only to its approver. It stops working if the arguments or the policy change.',
    fields: [
      { name: 'for', label: 'For', kind: 'text', hint: 'Who the link is for (recorded in the audit chain).' },
      { name: 'life', label: 'Expires in', kind: 'select', options: Object.keys(LINK_LIVES) },
    ],
    buttons: [{
      label: 'Create link',
      run: async (v) => {
        const body = { expires_in_s: LINK_LIVES[v.life] || 86400 };
        if ((v.for || '').trim()) body.for = v.for.trim();
        const answer = await api(`${paths.action(command.run_id, command.command_key, 'approval-link')}`, { method: 'POST', body });
        return h('div', { class: 'banner ok', 'data-result': 'link' },
          h('label', { for: 'link-url' }, `Link ${answer.link_id}, expires `, time(answer.expires_at)),
          h('input', { id: 'link-url', type: 'text', readonly: true, value: answer.url, class: 'mono' }));
      },
    }],
    onDone,
  });
}
