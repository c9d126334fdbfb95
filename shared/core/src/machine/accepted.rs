//! `DispatchOutcome::Accepted`: an asynchronous tool (`[tool.async]`) answered "accepted, the
//! outcome comes later" (a 202). The command waits in UNKNOWN — no new status: to the agent,
//! the console and the events it is an effect whose outcome is not known yet — with
//! `awaiting_callback` and `due_at` at the tool's deadline, so the sweep does not look it up
//! before then. Its callback (`POST /v1/callbacks/{token}`) or its webhook settles it as
//! evidence does (`Event::Evidence`); at the deadline the reconciler asks the status check or,
//! where the tool declares `then = "escalate"`, a person (`machine::look_for`).
//!
//! The upstream took the work and promised the outcome by the deadline, so an absence before
//! the deadline proves nothing (`lands_by` is the deadline: the job may still be running, and
//! a NON_IDEMPOTENT effect is never sent again on it); an absence after it is read as any
//! look's. An upstream's own word that the accepted job *failed* ends it FAILED at once
//! (`evidence::on_evidence`).
//!
//! The answer's reference of the accepted work (the job id, read as a commit's is) is kept as
//! the command's `external_ref`, so a webhook that names the job by that id, and not by the
//! idempotency key, finds its command (`[tool.evidence] reference_pointer`). An answer without
//! one leaves a reference stored before as it was.

use super::*;

pub(super) fn accepted(
    mut next: CommandState,
    rules: &Rules,
    reason: &str,
    external_ref: Option<String>,
    deadline_ms: i64,
    now: Timestamp,
    from: CommandStatus,
) -> Step {
    settle::enter_unknown(&mut next, rules, now, now);
    if external_ref.is_some() {
        next.external_ref = external_ref;
    }
    let deadline = now.plus_millis(deadline_ms.max(0));
    next.lands_by = Some(deadline);
    next.due_at = Some(deadline);
    next.awaiting_callback = Some(deadline);
    next.last_error = None;
    Step {
        from,
        state: next,
        actions: vec![],
        reason: format!(
            "accepted ({reason}): the outcome comes by callback or webhook until {deadline}"
        ),
        evidence: Value::Null,
        quiet: false,
    }
}
