//! `Event::Evidence`: a signed event from an upstream (`crate::evidence`) says what became of
//! the effect. It is read as a status check's answer would be — `present` as present,
//! `absent` and `failed` as absent (neither committed) — so the same rules decide: an absence
//! proves nothing before the last attempt can no longer land, a NON_IDEMPOTENT absence is
//! looked at again after the settle interval, a commit of a rolled-back run is undone.
//!
//! Besides UNKNOWN (and a last look owed), a CONFIRMED command that an event says did *not*
//! commit is escalated to a person, kept CONFIRMED (the agent was told so; a person decides),
//! whether or not a last look is owed (a lookup may lag; an upstream's own event that the
//! effect failed does not);
//! every other status refuses, and the service keeps the event with the command unapplied.

use super::*;
use crate::evidence::EvidenceOutcome;

/// `Event::Evidence`.
pub(super) fn on_evidence(
    a: &Apply<'_>,
    source: &str,
    event_id: &str,
    outcome: EvidenceOutcome,
    external_ref: &Option<String>,
    evidence: &Value,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let said = format!("evidence {source}/{event_id} ({})", outcome.as_str());
    let observation = match outcome {
        EvidenceOutcome::Present => Observation::Present,
        EvidenceOutcome::Absent | EvidenceOutcome::Failed => Observation::Absent,
    };
    let state = a.state;
    let as_a_look = |a: &Apply<'_>| -> Result<Step, Refusal> {
        let mut step = outcomes::on_observed(a, &observation, external_ref, evidence, &[], None)?;
        step.reason = match step.reason.strip_prefix("status check") {
            Some(rest) => format!("{said}{rest}"),
            None => format!("{said}: {}", step.reason),
        };
        Ok(step)
    };
    match state.status {
        // The upstream's own word that the job it accepted failed: nothing committed, and no
        // call is left to land (the accepted call ended with its answer).
        S::Unknown
            if state.awaiting_callback.is_some()
                && outcome == EvidenceOutcome::Failed
                && state.rollback_pending.is_none() =>
        {
            let mut step = settle::failed(
                a.next(),
                S::Unknown,
                format!("{said}: the accepted job failed"),
            );
            step.evidence = evidence.clone();
            Ok(step)
        }
        S::Unknown => as_a_look(a),
        // A CONFIRMED command's last look takes a `present` as its answer; an event that says
        // the commit is not there is no lagging lookup to look past: a person decides.
        S::Confirmed if state.verify_pending && observation == Observation::Present => as_a_look(a),
        S::Failed | S::Cancelled | S::Compensated if state.verify_pending => as_a_look(a),
        S::Confirmed if observation == Observation::Absent && !state.escalated => {
            let mut next = a.next();
            next.escalated = true;
            let reason = format!(
                "{said} says the effect did not commit, but the command is CONFIRMED: a person must decide"
            );
            Ok(a.step(
                next,
                vec![Action::Escalate {
                    reason: reason.clone(),
                }],
                reason,
                evidence.clone(),
            ))
        }
        S::Scheduled
        | S::Pending
        | S::Blocked
        | S::Approved
        | S::Leased
        | S::Confirmed
        | S::Failed
        | S::Stuck
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(a.refuse()),
    }
}
