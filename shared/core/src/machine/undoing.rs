//! Rollbacks and compensations: `MarkRollback`, `Rollback`, `Compensated`, `DuplicateSettled`.

use super::*;

/// `Event::MarkRollback`.
pub(super) fn mark_rollback(a: &Apply<'_>, operator: &Operator) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply { state, rules, .. } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
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
    // PENDING copy would otherwise overwrite the mark); the
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

/// `Event::Rollback`.
pub(super) fn rollback(a: &Apply<'_>, operator: &Operator) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let next = a.next();
    let refuse = || a.refuse();
    match from {
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
    }
}

/// `Event::Compensated`.
pub(super) fn on_compensated(
    a: &Apply<'_>,
    epoch: &LeaseEpoch,
    outcome: &CompensationOutcome,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let refuse = || a.refuse();
    match from {
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
    }
}

/// `Event::DuplicateSettled`.
pub(super) fn duplicate_settled(
    a: &Apply<'_>,
    epoch: &LeaseEpoch,
    outcome: &CompensationOutcome,
    undone: &[String],
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
        S::Confirmed if !state.owed_duplicates.is_empty() => {
            check_epoch(state, *epoch)?;
            next.claimed_until = None;
            // A transient failure with attempts left: kept in the ledger, not retried in
            // memory — the attempt counted, the extra commits undone struck off, and a due
            // time after the backoff, at which the sweep sends the clean-up again. A crash
            // loses neither the count nor the wait.
            if let CompensationOutcome::Retry { reason, .. } = outcome
                && state.duplicate_attempts.saturating_add(1) < rules.max_attempts
            {
                next.owed_duplicates.retain(|extra| !undone.contains(extra));
                next.duplicate_attempts = state.duplicate_attempts + 1;
                let at = now.plus_millis(rules.backoff_ms(state.duplicate_attempts));
                next.due_at = Some(at);
                return Ok(step(
                    next,
                    vec![],
                    format!(
                        "extra commit clean-up failed (attempt {} of {}): {reason}; tried again at {at}",
                        state.duplicate_attempts + 1,
                        rules.max_attempts
                    ),
                    serde_json::to_value(outcome).unwrap_or(Value::Null),
                ));
            }
            next.duplicate_attempts = 0;
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
                | CompensationOutcome::Retry { reason, .. } => {
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
    }
}
