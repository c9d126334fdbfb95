//! Undoing what committed: a commit that must not stand goes to COMPENSATING (or to a person
//! when the tool cannot undo it), extra commits a `duplicate` observation named are owed their
//! clean-up with a due time the sweep honours, and a compensation's outcome settles the command
//! — with the last look still owed after it, so a second commit cannot outlive the undo.

use serde_json::Value;

use super::settle::last_landing;
use super::{Action, CompensationOutcome, Rules, Step};
use crate::command::{CommandState, CommandStatus, CompensationInfo, EffectSemantics};
use crate::time::Timestamp;

/// A commit that must not stand (the run was rolled back, or the command was decided FAILED
/// or CANCELLED before it showed): COMPENSATING, with `extra_refs` owed too, or
/// NO_COMPENSATION escalated when the tool cannot undo it.
pub(super) fn undo_commit(
    mut next: CommandState,
    from: CommandStatus,
    rules: &Rules,
    extra_refs: &[String],
    reason: String,
    now: Timestamp,
) -> Step {
    next.rollback_pending = None;
    next.verify_pending = false;
    next.outcome_unknown = false;
    let lands_by = next.lands_by.take();
    if rules.has_compensate && rules.semantics != EffectSemantics::ObserveOnly {
        // The undo is looked at once more after an ambiguous attempt, or when the tool asks
        // for a look after every commit: the commit undone may not be the only one (an
        // upstream that ignores the key, an attempt landing late, two commits behind one 2xx).
        next.verify_pending =
            (next.ambiguous_before || rules.verify_after_commit) && rules.has_status_check;
        // Kept for the look after the undo: it waits for an earlier attempt landing late.
        next.lands_by = lands_by.filter(|_| next.verify_pending);
        next.status = CommandStatus::Compensating;
        next.owed_duplicates = extra_refs.to_vec();
        next.compensation = Some(Box::new(CompensationInfo::started(now)));
        next.due_at = Some(now.plus_millis(rules.compensation_timeout_ms));
        Step {
            from,
            state: next,
            actions: vec![Action::Compensate],
            reason,
            evidence: Value::Null,
            quiet: false,
        }
    } else {
        next.status = CommandStatus::NoCompensation;
        next.escalated = true;
        next.due_at = None;
        let why = format!("{reason}; the tool declares no compensate");
        Step {
            from,
            state: next,
            actions: vec![
                Action::Escalate {
                    reason: why.clone(),
                },
                Action::Publish {
                    status: CommandStatus::NoCompensation,
                },
            ],
            reason: why,
            evidence: Value::Null,
            quiet: false,
        }
    }
}

/// Records the extra commits a `duplicate` observation named as owed clean-up (durable, with a
/// due time the sweep honours), or escalates when nobody can undo them.
pub(super) fn owe_duplicates(
    mut step: Step,
    rules: &Rules,
    extra_refs: &[String],
    now: Timestamp,
) -> Step {
    let undoable = rules.has_compensate && rules.semantics != EffectSemantics::ObserveOnly;
    if undoable && !extra_refs.is_empty() {
        // Soon: the compensator claims the command (moving this) before it calls; if the
        // request is lost, the sweep takes the clean-up up from here. One already owed is not
        // put off.
        let soon = now.plus_millis(rules.compensation_timeout_ms.min(5_000));
        step.state.due_at = Some(match step.state.due_at {
            Some(owed) if !step.state.owed_duplicates.is_empty() => owed.min(soon),
            _ => soon,
        });
        step.state.owed_duplicates = extra_refs.to_vec();
        step.actions.insert(0, Action::CompensateDuplicate);
    } else {
        step.state.escalated = true;
        let reason = if undoable {
            "duplicate commit reported without naming the extra commit"
        } else {
            "duplicate commit and no compensate declared"
        };
        step.actions.insert(
            0,
            Action::Escalate {
                reason: reason.into(),
            },
        );
    }
    step
}

pub(super) fn compensated(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    outcome: &CompensationOutcome,
    now: Timestamp,
    from: CommandStatus,
) -> Step {
    let mut info = state.compensation.clone().unwrap_or_else(|| {
        Box::new(CompensationInfo {
            started_at: now,
            ended_at: None,
            reference: None,
            detail: None,
            attempts: 0,
        })
    });
    let evidence = serde_json::to_value(outcome).unwrap_or(Value::Null);
    // Asked to call again later: waited out, the attempt not spent, within the ceiling the
    // dispatch's waits share (`rate_limit`); past it the answer counts as any other retry.
    if let CompensationOutcome::Retry {
        reason,
        retry_after_ms: Some(asked),
    } = outcome
        && let Some(wait) = super::rate_limit::rate_limited_wait_ms(state, rules, *asked)
    {
        info.detail = Some(reason.clone());
        next.rate_limited_ms = state.rate_limited_ms.max(0).saturating_add(wait);
        next.due_at = Some(now.plus_millis(wait));
        next.compensation = Some(info);
        return Step {
            from,
            state: next,
            actions: vec![],
            reason: format!(
                "compensation asked to call again later ({reason}); waits {wait} ms without spending an attempt"
            ),
            evidence,
            quiet: false,
        };
    }
    info.attempts += 1;
    let (status, actions, reason) = match outcome {
        CompensationOutcome::Done { reference } => {
            info.ended_at = Some(now);
            info.reference = reference.clone();
            (
                CommandStatus::Compensated,
                vec![Action::Publish {
                    status: CommandStatus::Compensated,
                }],
                "compensated".to_owned(),
            )
        }
        CompensationOutcome::Impossible { reason } => {
            info.ended_at = Some(now);
            info.detail = Some(reason.clone());
            next.escalated = true;
            (
                CommandStatus::CompensationFailed,
                vec![
                    Action::Escalate {
                        reason: format!("compensation refused: {reason}"),
                    },
                    Action::Publish {
                        status: CommandStatus::CompensationFailed,
                    },
                ],
                format!("compensation refused: {reason}"),
            )
        }
        CompensationOutcome::Retry { reason, .. } if info.attempts >= rules.max_attempts => {
            info.ended_at = Some(now);
            info.detail = Some(reason.clone());
            next.escalated = true;
            let why = format!("compensation failed {} times: {reason}", rules.max_attempts);
            (
                CommandStatus::CompensationFailed,
                vec![
                    Action::Escalate {
                        reason: why.clone(),
                    },
                    Action::Publish {
                        status: CommandStatus::CompensationFailed,
                    },
                ],
                why,
            )
        }
        CompensationOutcome::Retry { reason, .. } => {
            info.detail = Some(reason.clone());
            next.due_at = Some(now.plus_millis(rules.backoff_ms(info.attempts - 1)));
            next.compensation = Some(info);
            return Step {
                from,
                state: next,
                actions: vec![],
                reason: format!("compensation will be retried: {reason}"),
                evidence,
                quiet: false,
            };
        }
    };
    next.status = status;
    next.due_at = None;
    let lands_by = next.lands_by.take();
    if status == CommandStatus::Compensated && state.verify_pending {
        // The last look the command still owed: a second commit must not outlive the undo.
        next.checks = 0;
        next.due_at = Some(last_landing(lands_by, now).plus_millis(rules.verify_after_ms));
    } else {
        next.verify_pending = false;
    }
    next.compensation = Some(info);
    next.owed_duplicates.clear();
    Step {
        from,
        state: next,
        actions,
        reason,
        evidence,
        quiet: false,
    }
}
