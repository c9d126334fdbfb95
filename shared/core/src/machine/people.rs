//! What an operator decides: `Approve`, `Reject`, `ApprovalExpired` (a person who never came),
//! `Cancel`, `Resolve`, `Replay`.

use super::*;
use crate::command::Rejection;
use crate::revision::Revision;

/// `Event::Approve`.
pub(super) fn approve(
    a: &Apply<'_>,
    operator: &Operator,
    policy_version: &str,
    revision: Option<&Revision>,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply { rules, now, .. } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Blocked => {
            next.status = S::Approved;
            next.approval = Some(Box::new(Approval {
                approver: operator.actor.clone(),
                reason: operator.reason.clone(),
                at: now,
                policy_version: policy_version.to_owned(),
            }));
            next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
            let Some(revision) = revision else {
                return Ok(step(
                    next,
                    vec![Action::Dispatch],
                    operator.reason.clone(),
                    Value::Null,
                ));
            };
            // An edit made against the revision the approver saw: one made meanwhile wins, and
            // this one is refused rather than silently stacked on it.
            let current = u32::try_from(a.state.revisions.len()).unwrap_or(u32::MAX);
            if revision.number != current.saturating_add(1) {
                return Err(Refusal::StaleRevision {
                    current,
                    given: revision.number,
                });
            }
            next.revisions.push(revision.clone());
            let reason = format!(
                "approved with edited arguments (revision {}: {}): {}",
                revision.number,
                revision.pointers(),
                operator.reason
            );
            Ok(step(
                next,
                vec![Action::Dispatch],
                reason,
                revision.summary(),
            ))
        }
        S::Scheduled
        | S::Pending
        | S::Approved
        | S::Leased
        | S::Confirmed
        | S::Failed
        | S::Unknown
        | S::Stuck
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(refuse()),
    }
}

/// How the audit chain opens a rejection's reason.
const REJECTED: &str = "rejected: ";

/// `Event::Reject`.
pub(super) fn reject(a: &Apply<'_>, operator: &Operator) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply { rules, now, .. } = *a;
    let from = a.state.status;
    let next = a.next();
    let refuse = || a.refuse();
    match from {
        S::Blocked => {
            // The reason as the person wrote it; an event from a build before rejections were
            // kept carries it already prefixed for the audit chain.
            let written = operator
                .reason
                .strip_prefix(REJECTED)
                .unwrap_or(&operator.reason);
            let mut next = next;
            next.rejection = Some(Box::new(Rejection {
                by: operator.actor.clone(),
                reason: written.to_owned(),
                at: now,
            }));
            let with_reason = super::Operator {
                actor: operator.actor.clone(),
                reason: format!("{REJECTED}{written}"),
            };
            Ok(cancelled(next, from, rules, &with_reason, now))
        }
        S::Scheduled
        | S::Pending
        | S::Approved
        | S::Leased
        | S::Confirmed
        | S::Failed
        | S::Unknown
        | S::Stuck
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(refuse()),
    }
}

/// `Event::ApprovalExpired`.
pub(super) fn approval_expired(a: &Apply<'_>) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Blocked => {
            if let Some(due_at) = state.due_at.filter(|at| *at > now) {
                return Err(Refusal::NotYetDue { due_at });
            }
            next.status = S::Cancelled;
            next.due_at = None;
            next.escalated = true;
            let reason = format!(
                "no approval within {} ms; cancelled",
                rules.approval_timeout_ms
            );
            Ok(step(
                next,
                vec![
                    Action::Escalate {
                        reason: reason.clone(),
                    },
                    Action::Publish {
                        status: S::Cancelled,
                    },
                ],
                reason,
                Value::Null,
            ))
        }
        S::Scheduled
        | S::Pending
        | S::Approved
        | S::Leased
        | S::Confirmed
        | S::Failed
        | S::Unknown
        | S::Stuck
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(refuse()),
    }
}

/// `Event::Cancel`.
pub(super) fn cancel(a: &Apply<'_>, operator: &Operator) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let next = a.next();
    let refuse = || a.refuse();
    match from {
        S::Pending | S::Approved if state.outcome_unknown => Err(Refusal::OutcomeUnknown),
        S::Scheduled | S::Pending | S::Blocked | S::Approved => {
            Ok(cancelled(next, from, rules, operator, now))
        }
        S::Leased
        | S::Confirmed
        | S::Failed
        | S::Unknown
        | S::Stuck
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(refuse()),
    }
}

/// `Event::Resolve`.
pub(super) fn resolve(
    a: &Apply<'_>,
    operator: &Operator,
    resolution: &Resolution,
    evidence: &Value,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Stuck => {
            if is_empty_evidence(evidence) {
                return Err(Refusal::EvidenceRequired);
            }
            let status = match resolution {
                Resolution::Confirmed { external_ref } => {
                    if external_ref.trim().is_empty() {
                        return Err(Refusal::EvidenceRequired);
                    }
                    next.external_ref = Some(external_ref.clone());
                    S::Confirmed
                }
                Resolution::Failed => S::Failed,
            };
            next.escalated = false;
            next.due_at = None;
            next.outcome_unknown = false;
            if status == S::Confirmed && state.rollback_pending.is_some() {
                let mut step = undo_commit(
                    next,
                    from,
                    rules,
                    &[],
                    format!("{} (run rolled back: undone)", operator.reason),
                    now,
                );
                step.evidence = evidence.clone();
                return Ok(step);
            }
            next.status = status;
            // The mark stays: the run was rolled back, so the command is never replayed.
            Ok(step(
                next,
                vec![Action::Publish { status }],
                operator.reason.clone(),
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
        | S::Unknown
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(refuse()),
    }
}

/// `Event::Replay`.
pub(super) fn replay(
    a: &Apply<'_>,
    operator: &Operator,
    evidence: &Option<Value>,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Stuck | S::Failed => {
            if state.rollback_pending.is_some() {
                return Err(Refusal::RunRolledBack);
            }
            if state.replays >= rules.max_replays {
                return Err(Refusal::ReplayLimit {
                    replays: state.replays,
                    max_replays: rules.max_replays,
                });
            }
            let outcome_unknown = crate::replay::outcome_unknown(from);
            let evidence = evidence.clone().unwrap_or(Value::Null);
            // Without evidence, a command whose outcome is unknown is not sent again where a
            // resend could commit twice: a NON_IDEMPOTENT one, or an IDEMPOTENT one whose
            // upstream has forgotten its key by now.
            if outcome_unknown
                && (rules.semantics == EffectSemantics::NonIdempotent
                    || rules.key_forgotten_by(state, now))
                && is_empty_evidence(&evidence)
            {
                return Err(Refusal::ReplayNeedsEvidence);
            }
            next.status = S::Pending;
            next.attempts = 0;
            next.checks = 0;
            next.rate_limited_ms = 0;
            next.rate_limited_until = None;
            next.flow_slot = None;
            next.replays = state.replays + 1;
            next.first_absent_at = None;
            next.lands_by = None;
            next.outcome_unknown = false;
            // A last look still owed is not lost: `ambiguous_before` stays, so the replay's
            // commit is looked up once more and a late earlier commit found then.
            next.verify_pending = false;
            next.escalated = false;
            next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
            Ok(step(
                next,
                vec![Action::Dispatch],
                operator.reason.clone(),
                evidence,
            ))
        }
        S::Scheduled
        | S::Pending
        | S::Blocked
        | S::Approved
        | S::Leased
        | S::Confirmed
        | S::Unknown
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => Err(refuse()),
    }
}
