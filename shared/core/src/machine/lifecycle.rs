//! The command's scheduling, leases and claims: `Due`, `Lease`, `ExtendLease`, `Release`,
//! `Block` and `Deny` (policy at dispatch), `LeaseExpired` (quiet while the lease holds), and
//! the quiet `Claim` and `Republish`.

use super::*;

/// `Event::Due`.
pub(super) fn due(a: &Apply<'_>) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
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
    }
}

/// `Event::Lease`.
pub(super) fn lease(a: &Apply<'_>, owner: &std::sync::Arc<str>) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Pending | S::Approved => {
            if state.attempts >= rules.max_attempts {
                return Err(Refusal::AttemptsExhausted {
                    max_attempts: rules.max_attempts,
                });
            }
            if let Some(until) = state.rate_limited_until
                && rate_limit_holds(state, rules, now)
            {
                // The upstream asked to be called again only then.
                return Err(Refusal::NotYetDue { due_at: until });
            }
            next.rate_limited_until = None;
            next.flow_slot = None;
            let expires_at = now.plus_millis(rules.lease_ttl_ms);
            next.status = S::Leased;
            next.lease = Lease {
                epoch: state.lease.epoch.next(),
                owner: Some(owner.clone()),
                expires_at: Some(expires_at),
            };
            next.attempts = state.attempts + 1;
            next.due_at = Some(lease_due(state, now, expires_at));
            let reason = format!(
                "leased by {owner}, attempt {} of {}",
                next.attempts, rules.max_attempts
            );
            Ok(step(next, vec![Action::CallUpstream], reason, Value::Null))
        }
        S::Leased if lease::reservation_lease_lapsing(state, rules, now) => {
            lease::take_over_reservation_lease(next, state, rules, owner, now)
                .map(|(next, reason)| step(next, vec![Action::CallUpstream], reason, Value::Null))
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
    }
}

/// `Event::ExtendLease`: quiet, fenced by the epoch; never shortens the lease.
pub(super) fn extend_lease(
    a: &Apply<'_>,
    epoch: &LeaseEpoch,
    to: Timestamp,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let state = a.state;
    let from = a.state.status;
    let mut next = a.next();
    match from {
        S::Leased => {
            check_epoch(state, *epoch)?;
            if let Some(expires_at) = state.lease.expires_at.filter(|at| *at >= to) {
                return Err(Refusal::LeaseNotExtended { expires_at });
            }
            next.lease.expires_at = Some(to);
            next.due_at = Some(to);
            Ok(a.quiet_step(next, vec![], format!("lease extended to {to}")))
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
        | S::NoCompensation => Err(a.refuse()),
    }
}

/// `Event::Claim`: quiet. Taken only for the work the command waits for now
/// ([`awaited`]): a look when it is due (another look's claim holds it until then), a
/// compensation job when no other job holds it (`claimed_until`). Bumps the epoch, so a stale
/// holder's write loses its compare-and-set and a stale claim's result is refused.
pub(super) fn claim(a: &Apply<'_>, job: ClaimJob, hold_ms: i64) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply { state, now, .. } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let until = now.plus_millis(hold_ms.max(0));
    let take = |mut next: CommandState| {
        next.lease.epoch = state.lease.epoch.next();
        next.due_at = Some(until);
        if job != ClaimJob::Look {
            next.claimed_until = Some(until);
        }
        a.quiet_step(next, vec![], format!("claimed for {job:?} until {until}"))
    };
    let takes = match (job, from) {
        (ClaimJob::Look, S::Unknown | S::Confirmed | S::Failed | S::Cancelled | S::Compensated) => {
            true
        }
        (ClaimJob::Compensate, S::Compensating) | (ClaimJob::UndoDuplicates, S::Confirmed) => true,
        (
            ClaimJob::Look,
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Stuck
            | S::Compensating
            | S::CompensationFailed
            | S::NoCompensation,
        )
        | (
            ClaimJob::Compensate,
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
            | S::NoCompensation,
        )
        | (
            ClaimJob::UndoDuplicates,
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
            | S::NoCompensation,
        ) => false,
    };
    if !takes {
        return Err(a.refuse());
    }
    // Of the statuses that may wait for the job, only one that waits for it now.
    if awaited(state) != Some(job.action()) {
        return Err(Refusal::NotAwaited);
    }
    match job {
        ClaimJob::Look => {
            if let Some(due_at) = state.due_at.filter(|at| *at > now) {
                return Err(Refusal::NotYetDue { due_at });
            }
        }
        ClaimJob::Compensate | ClaimJob::UndoDuplicates => {
            if let Some(until) = state.claimed_until.filter(|until| *until > now) {
                return Err(Refusal::JobClaimed { until });
            }
            if let Some(info) = next.compensation.as_mut()
                && job == ClaimJob::Compensate
            {
                // The job's calls start now: the compensation's result is timed from here.
                info.started_at = now;
            }
        }
    }
    Ok(take(next))
}

/// `Event::Republish`: quiet. A command the sweep found due while it waits for work of the
/// pipeline gets that work's request again (the step's one action) and is left alone for the
/// grace (a PENDING or APPROVED one at least `pending_stale_ms`, the wait it is given before it
/// counts as stale). The epoch stays: whoever holds the work may still write its result.
pub(super) fn republish(a: &Apply<'_>, grace_ms: i64) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let delay = match from {
        S::Pending | S::Approved => rules.pending_stale_ms.max(grace_ms),
        S::Unknown | S::Confirmed | S::Failed | S::Cancelled | S::Compensating | S::Compensated => {
            grace_ms
        }
        S::Scheduled
        | S::Blocked
        | S::Leased
        | S::Stuck
        | S::CompensationFailed
        | S::NoCompensation => return Err(a.refuse()),
    };
    let Some(action) = awaited(state) else {
        return Err(Refusal::NotAwaited);
    };
    if let Some(due_at) = state.due_at.filter(|at| *at > now) {
        return Err(Refusal::NotYetDue { due_at });
    }
    let until = now.plus_millis(delay.max(0));
    next.due_at = Some(until);
    Ok(a.quiet_step(
        next,
        vec![action],
        format!("republished; due again at {until}"),
    ))
}

/// `Event::Release`.
pub(super) fn release(a: &Apply<'_>, epoch: &LeaseEpoch, reason: &str) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
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
    }
}

/// `Event::Hold`.
pub(super) fn hold(
    a: &Apply<'_>,
    epoch: Option<&LeaseEpoch>,
    until: Timestamp,
    cause: crate::flow::HoldCause,
    reason: &str,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply { state, now, .. } = *a;
    let mut next = a.next();
    let from = state.status;
    match (from, epoch) {
        // A look kept back: only its due time moves; no check is spent.
        (S::Unknown, None) if awaits_look(state) => {
            let until = until.max(now);
            next.due_at = Some(until);
            return Ok(a.step(
                next,
                Vec::new(),
                format!("look held until {until} without spending a check: {reason}"),
                Value::Null,
            ));
        }
        (S::Pending | S::Approved, None) => {}
        // A reservation's lease, not yet called under: given back, its attempt not counted.
        (S::Leased, Some(epoch))
            if state.lease.owner.as_deref() == Some(lease::RESERVATION_OWNER)
                && state.rollback_pending.is_none() =>
        {
            check_holder(state, *epoch)?;
            next.lease = released(&state.lease);
            next.attempts = state.attempts.saturating_sub(1);
            next.status = S::Pending;
        }
        _ => return Err(a.refuse()),
    }
    let until = until.max(now);
    next.due_at = Some(until);
    next.rate_limited_until = Some(until);
    // A slot of the upstream's rate was booked for it: it goes then without booking another.
    next.flow_slot = (cause == crate::flow::HoldCause::Rate).then_some(until);
    Ok(a.step(
        next,
        Vec::new(),
        format!("held until {until} without spending an attempt: {reason}"),
        Value::Null,
    ))
}

/// `Event::Block` (and `Event::Deny`).
pub(super) fn block_or_deny(
    a: &Apply<'_>,
    reason: &str,
    epoch: &Option<LeaseEpoch>,
) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state,
        rules,
        now,
        event,
        ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
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

/// When a command a dispatcher just leased (until `expires_at`) is next due: the due time it
/// had, if that is still to come and earlier than the lease's end, else the lease's end.
///
/// Kept, the due time does not move, so a ledger that indexes due times (CQL's due index, a
/// partition of its own that the lease's compare-and-set cannot write) files no entry for the
/// lease and deletes none: two round trips fewer per NON_IDEMPOTENT effect. The cost falls on
/// calls still running at that time: the sweep then finds the command due under a live lease
/// and moves it to the lease's end (a quiet `LeaseExpired`), so a dispatcher that died is
/// still taken over when its lease ends, not earlier.
fn lease_due(state: &CommandState, now: Timestamp, expires_at: Timestamp) -> Timestamp {
    state
        .due_at
        .filter(|at| *at > now && *at < expires_at)
        .unwrap_or(expires_at)
}

/// `Event::LeaseExpired`: the sweep found a LEASED command due. Its lease ended: the call's
/// outcome is unknown. Not yet, and the command was due before the lease's end (a lease keeps
/// an earlier due time, [`lease_due`]): a quiet move of its due time to the lease's end.
pub(super) fn lease_expired(a: &Apply<'_>) -> Result<Step, Refusal> {
    use CommandStatus as S;
    let Apply {
        state, rules, now, ..
    } = *a;
    let from = a.state.status;
    let mut next = a.next();
    let step = |next, actions, reason, evidence| a.step(next, actions, reason, evidence);
    let refuse = || a.refuse();
    match from {
        S::Leased => {
            if let Some(expires_at) = state.lease.expires_at.filter(|at| *at > now) {
                // Due already (so before the lease's end): only the due time moves.
                if state.due_at.is_some_and(|at| at <= now) {
                    next.due_at = Some(expires_at);
                    return Ok(a.quiet_step(
                        next,
                        vec![],
                        format!("the lease holds until {expires_at}: due then"),
                    ));
                }
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
    }
}
