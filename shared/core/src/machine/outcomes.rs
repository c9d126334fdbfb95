//! What the upstream did or what a look found: `Dispatched`, `Observed`, `RetrySameKey`,
//! `GiveUp`.

use super::*;

/// `Event::Dispatched`.
pub(super) fn on_dispatched(
    a: &Apply<'_>,
    epoch: &LeaseEpoch,
    outcome: &DispatchOutcome,
    sent_at: &Timestamp,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let refuse = || a.refuse();
    match from {
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
    }
}

/// `Event::Observed`.
pub(super) fn on_observed(
    a: &Apply<'_>,
    observation: &Observation,
    external_ref: &Option<String>,
    evidence: &Value,
    extra_refs: &[String],
    record: Option<&Value>,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let refuse = || a.refuse();
    match from {
        S::Unknown => {
            // The dispatch's answer was lost (or never read): what the lookup found for the
            // command's own commit is its result, as the answer would have been.
            let found = matches!(observation, Observation::Present | Observation::Duplicate);
            if found && next.result.is_none() {
                next.result = record.cloned().map(std::sync::Arc::new);
            }
            Ok(observed(
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
    }
}

/// `Event::RetrySameKey`.
pub(super) fn retry_same_key(a: &Apply<'_>) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Unknown => match rules.semantics {
            EffectSemantics::NonIdempotent => Err(Refusal::BlindRetry),
            EffectSemantics::Idempotent
                if rules
                    .key_forgotten_by(state, now.plus_millis(rules.backoff_ms(state.attempts))) =>
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
    }
}

/// `Event::GiveUp`.
pub(super) fn give_up(a: &Apply<'_>, reason: &str) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply { state, .. } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Unknown => Ok(stuck(next, from, reason.to_owned())),
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
    }
}
