//! The command state machine (docs/architecture.md, "State machine"): one pure, total function.
//!
//! [`apply`] takes a command's state, the rules of its tool, an [`Event`] and the current time,
//! and returns either a [`Step`] (the next state, the [`Action`]s a service must carry out, and
//! what to write in the audit chain) or a typed [`Refusal`]. It does no IO: the services carry
//! out the actions and store the next state with a guarded ledger write, so a refusal here and
//! a failed compare-and-set in the ledger are the only two ways a transition does not happen.
//!
//! Every match is exhaustive over states and events, without wildcard arms, so adding a state
//! or an event fails to compile until each pair is decided.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::AuditDraft;
use crate::command::{Approval, CommandState, CommandStatus, CompensationInfo, EffectSemantics};
use crate::command::{Lease, Observation};
use crate::ids::{CommandKey, LeaseEpoch};
use crate::policy::PolicyDecision;
use crate::time::Timestamp;

mod event;
mod lease;
mod rules;

pub use event::*;
pub use lease::*;
pub use rules::*;

/// Computes the transition of `state` under `event` at `now`. Pure and total.
pub fn apply(
    state: &CommandState,
    rules: &Rules,
    event: &Event,
    now: Timestamp,
) -> Result<Step, Refusal> {
    use CommandStatus as S;

    if let Some(operator) = event.operator()
        && operator.reason.trim().is_empty()
    {
        return Err(Refusal::ReasonRequired);
    }
    let from = state.status;
    let refuse = || Refusal::NotAllowed {
        status: from,
        event: event.kind(),
    };
    let mut next = state.clone();
    next.updated_at = now;
    let step = |next: CommandState, actions: Vec<Action>, reason: String, evidence: Value| Step {
        from,
        state: next,
        actions,
        reason,
        evidence,
    };

    match event {
        Event::Due => match from {
            S::Scheduled => {
                if let Some(due_at) = state.due_at.filter(|at| *at > now) {
                    return Err(Refusal::NotYetDue { due_at });
                }
                next.status = S::Pending;
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    "due".into(),
                    Value::Null,
                ))
            }
            S::Pending
            | S::Blocked
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
        },

        Event::Lease { owner } => match from {
            S::Pending | S::Approved => {
                if state.attempts >= rules.max_attempts {
                    return Err(Refusal::AttemptsExhausted {
                        max_attempts: rules.max_attempts,
                    });
                }
                let expires_at = now.plus_millis(rules.lease_ttl_ms);
                next.status = S::Leased;
                next.lease = Lease {
                    epoch: state.lease.epoch.next(),
                    owner: Some(owner.clone()),
                    expires_at: Some(expires_at),
                };
                next.attempts = state.attempts + 1;
                next.due_at = Some(expires_at);
                let reason = format!(
                    "leased by {owner}, attempt {} of {}",
                    next.attempts, rules.max_attempts
                );
                Ok(step(next, vec![Action::CallUpstream], reason, Value::Null))
            }
            S::Leased if lease::reservation_lease_lapsing(state, rules, now) => {
                lease::take_over_reservation_lease(next, state, rules, owner, now).map(
                    |(next, reason)| step(next, vec![Action::CallUpstream], reason, Value::Null),
                )
            }
            S::Scheduled
            | S::Blocked
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
        },

        Event::ExtendLease { epoch } => match from {
            S::Leased => {
                check_epoch(state, *epoch)?;
                let expires_at = now.plus_millis(rules.lease_ttl_ms);
                next.lease.expires_at = Some(expires_at);
                next.due_at = Some(expires_at);
                Ok(step(next, vec![], "lease extended".into(), Value::Null))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Release { epoch, reason } => match from {
            S::Leased => {
                check_holder(state, *epoch)?;
                next.lease = released(&state.lease);
                // Nothing was sent under this lease: the attempt does not count.
                next.attempts = state.attempts.saturating_sub(1);
                if state.rollback_pending.is_some() && !state.outcome_unknown {
                    // The mark stays: the run was rolled back, so the command is never replayed.
                    return Ok(cancelled_unsent(
                        next,
                        from,
                        rules,
                        format!("run rolled back; the lease was given back unused ({reason})"),
                        now,
                    ));
                }
                next.status = S::Pending;
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    format!("lease given back before the call: {reason}"),
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Block { reason, epoch } | Event::Deny { reason, epoch } => {
            let deny = matches!(event, Event::Deny { .. });
            match from {
                S::Leased if state.lease.owner.as_deref() == Some(RESERVATION_OWNER) => {
                    // The reservation's lease is anyone's to call under: a dispatcher on the
                    // policy the command was admitted by may already have called. Neither
                    // BLOCKED nor FAILED could say that the effect did not happen, so the
                    // command is looked up first, as after any attempt whose outcome is
                    // unknown; the new epoch fences the other caller's write, and what the
                    // look finds is what is recorded (policy is asked again if it is absent).
                    check_epoch(state, epoch.unwrap_or(LeaseEpoch::ZERO))?;
                    let label = if deny { "denied" } else { "blocked" };
                    let ended_by = state.lease.expires_at.map_or(now, |at| at.max(now));
                    next.lease = Lease {
                        epoch: state.lease.epoch.next(),
                        owner: None,
                        expires_at: None,
                    };
                    enter_unknown(&mut next, rules, ended_by, now);
                    Ok(step(
                        next,
                        vec![Action::Reconcile],
                        format!(
                            "{label} by policy ({reason}), but leased at its reservation, under which a dispatcher on the earlier policy may have called: looked up before anything is decided"
                        ),
                        Value::Null,
                    ))
                }
                S::Pending | S::Approved | S::Leased => {
                    if from == S::Leased {
                        check_epoch(state, epoch.unwrap_or(LeaseEpoch::ZERO))?;
                        // Nothing was sent under this lease: the attempt does not count.
                        next.attempts = state.attempts.saturating_sub(1);
                        next.lease = released(&state.lease);
                    }
                    if state.outcome_unknown {
                        // Policy now refuses a same-key retry, but the earlier attempt may
                        // have committed: neither FAILED nor BLOCKED says what happened.
                        let label = if deny { "denied" } else { "blocked" };
                        return Ok(stuck(
                            next,
                            from,
                            format!(
                                "{label} by policy ({reason}) while an earlier attempt's outcome is unknown"
                            ),
                        ));
                    }
                    next.due_at = None;
                    let (status, label) = if deny {
                        next.last_error = Some(format!("denied by policy: {reason}"));
                        (S::Failed, "denied by policy")
                    } else {
                        // A gate waits for a person only so long (Tape's gates time out).
                        next.due_at = Some(now.plus_millis(rules.approval_timeout_ms));
                        (S::Blocked, "blocked by policy")
                    };
                    next.status = status;
                    Ok(step(
                        next,
                        vec![Action::Publish { status }],
                        format!("{label}: {reason}"),
                        Value::Null,
                    ))
                }
                S::Scheduled
                | S::Blocked
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

        Event::Dispatched {
            epoch,
            outcome,
            sent_at,
        } => match from {
            S::Leased => {
                check_holder(state, *epoch)?;
                next.lease = released(&state.lease);
                Ok(dispatched(next, state, rules, outcome, *sent_at, now, from))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::LeaseExpired => match from {
            S::Leased => {
                if let Some(expires_at) = state.lease.expires_at.filter(|at| *at > now) {
                    return Err(Refusal::LeaseStillValid { expires_at });
                }
                next.lease = released(&state.lease);
                // The holder checked that the whole call fit in the lease before it sent, so
                // the call ended by the expiry; it may still land until the horizon after it.
                let ended_by = state.lease.expires_at.map_or(now, |at| at.max(now));
                enter_unknown(&mut next, rules, ended_by, now);
                Ok(step(
                    next,
                    vec![Action::Reconcile],
                    "lease expired without an outcome".into(),
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Observed {
            observation,
            external_ref,
            evidence,
            extra_refs,
        } => match from {
            S::Unknown => Ok(observed(
                next,
                state,
                rules,
                *observation,
                external_ref,
                evidence,
                extra_refs,
                now,
            )),
            S::Confirmed | S::Failed | S::Cancelled | S::Compensated if state.verify_pending => {
                Ok(verified(
                    next,
                    state,
                    rules,
                    *observation,
                    external_ref,
                    evidence,
                    extra_refs,
                    now,
                ))
            }
            S::Confirmed | S::Failed | S::Cancelled | S::Compensated => Err(refuse()),
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Stuck
            | S::Compensating
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::RetrySameKey => match from {
            S::Unknown => match rules.semantics {
                EffectSemantics::NonIdempotent => Err(Refusal::BlindRetry),
                EffectSemantics::Idempotent
                    if rules.key_forgotten_by(
                        state,
                        now.plus_millis(rules.backoff_ms(state.attempts)),
                    ) =>
                {
                    Ok(stuck(next, from, rules.key_forgotten_reason(state)))
                }
                EffectSemantics::Idempotent | EffectSemantics::ObserveOnly => {
                    if state.attempts < rules.max_attempts {
                        next.status = S::Pending;
                        next.outcome_unknown = true;
                        next.due_at = Some(now.plus_millis(rules.backoff_ms(state.attempts)));
                        Ok(step(
                            next,
                            vec![],
                            "retry with the same idempotency key".into(),
                            Value::Null,
                        ))
                    } else if rules.semantics == EffectSemantics::ObserveOnly {
                        // A read that never answered changed nothing: it simply failed.
                        next.status = S::Failed;
                        next.due_at = None;
                        Ok(step(
                            next,
                            vec![Action::Publish { status: S::Failed }],
                            format!("no answer after {} attempts", rules.max_attempts),
                            Value::Null,
                        ))
                    } else {
                        Ok(stuck(
                            next,
                            from,
                            format!(
                                "outcome unknown after {} attempts with the same key",
                                rules.max_attempts
                            ),
                        ))
                    }
                }
            },
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
            | S::NoCompensation => Err(refuse()),
        },

        Event::GiveUp { reason } => match from {
            S::Unknown => Ok(stuck(next, from, reason.clone())),
            // A last look nobody can take any more (the tool lost its status check or left
            // the catalog): a person, not a loop.
            S::Confirmed | S::Failed | S::Cancelled | S::Compensated if state.verify_pending => {
                // An extra commit still owed its clean-up stays due: the escalation is for
                // the look alone.
                verify::end_look(&mut next);
                next.escalated = true;
                let why = format!("the last look cannot be taken: {reason}");
                Ok(step(
                    next,
                    vec![Action::Escalate {
                        reason: why.clone(),
                    }],
                    why,
                    Value::Null,
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
            | S::NoCompensation => Err(refuse()),
        },

        Event::Approve {
            operator,
            policy_version,
        } => match from {
            S::Blocked => {
                next.status = S::Approved;
                next.approval = Some(Box::new(Approval {
                    approver: operator.actor.clone(),
                    reason: operator.reason.clone(),
                    at: now,
                    policy_version: policy_version.clone(),
                }));
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    operator.reason.clone(),
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
        },

        Event::Reject { operator } => match from {
            S::Blocked => Ok(cancelled(next, from, rules, operator, now)),
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
        },

        Event::ApprovalExpired => match from {
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
        },

        Event::MarkRollback { operator } => {
            // FAILED and CANCELLED are marked too: nothing of them stands, but the mark keeps
            // a person from replaying them into a run that was rolled back.
            let in_flight = match from {
                S::Leased | S::Unknown | S::Stuck | S::Failed | S::Cancelled => true,
                S::Pending | S::Approved => state.outcome_unknown,
                S::Scheduled
                | S::Blocked
                | S::Confirmed
                | S::Compensating
                | S::Compensated
                | S::CompensationFailed
                | S::NoCompensation => false,
            };
            if !in_flight || state.rollback_pending.is_some() {
                return Err(refuse());
            }
            if rules.semantics == EffectSemantics::ObserveOnly {
                return Err(Refusal::NotCompensable);
            }
            next.rollback_pending = Some(state.lease.epoch);
            // A new epoch makes every write begun from a copy read before the mark lose its
            // compare-and-set and be decided again under it (a lease taken from a stale
            // PENDING copy would otherwise overwrite the mark: found by the fault runner); the
            // lease holder of the epoch the mark records may still write its outcome
            // (`check_holder`).
            next.lease.epoch = state.lease.epoch.next();
            Ok(step(
                next,
                vec![],
                format!(
                    "{} (in flight: undone once its outcome is known)",
                    operator.reason
                ),
                Value::Null,
            ))
        }

        Event::Cancel { operator } => match from {
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
        },

        Event::Rollback { operator } => match from {
            S::Confirmed => rollback_confirmed(next, state, rules, operator, now),
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Compensated { epoch, outcome } => match from {
            S::Compensating => {
                check_epoch(state, *epoch)?;
                next.claimed_until = None;
                Ok(compensated(next, state, rules, outcome, now, from))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::DuplicateSettled { epoch, outcome } => match from {
            S::Confirmed if !state.owed_duplicates.is_empty() => {
                check_epoch(state, *epoch)?;
                next.claimed_until = None;
                next.owed_duplicates.clear();
                // A verification still owed falls due after the clean-up.
                next.due_at = state.verify_pending.then(|| {
                    settle::last_landing(state.lands_by, now).plus_millis(rules.verify_after_ms)
                });
                let (actions, reason) = match outcome {
                    CompensationOutcome::Done { reference } => (
                        vec![],
                        format!(
                            "extra commit compensated{}",
                            reference
                                .as_deref()
                                .map(|r| format!(" ({r})"))
                                .unwrap_or_default()
                        ),
                    ),
                    CompensationOutcome::Impossible { reason }
                    | CompensationOutcome::Retry { reason } => {
                        next.escalated = true;
                        let why = format!("extra commit could not be compensated: {reason}");
                        (
                            vec![Action::Escalate {
                                reason: why.clone(),
                            }],
                            why,
                        )
                    }
                };
                Ok(step(
                    next,
                    actions,
                    reason,
                    serde_json::to_value(outcome).unwrap_or(Value::Null),
                ))
            }
            S::Confirmed => Err(refuse()),
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Resolve {
            operator,
            resolution,
            evidence,
        } => match from {
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
        },

        Event::Replay { operator, evidence } => match from {
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
                let outcome_unknown = from == S::Stuck;
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
        },
    }
}

mod settle;
mod undo;
mod verify;
use settle::{
    cancelled, cancelled_unsent, check_epoch, check_holder, dispatched, enter_unknown,
    is_empty_evidence, observed, released, stuck,
};
use undo::{compensated, undo_commit};
use verify::verified;

#[cfg(test)]
mod fault_paths;
#[cfg(test)]
mod key_window;
#[cfg(test)]
mod tests;
