//! Decisions about leases and rollbacks made outside a transition: what a dispatcher does with
//! a command it is handed ([`plan_dispatch`]), whether a lease may still be used for a call,
//! what a run's rollback does to each of its commands, which compensation may run next, and
//! which commands are leased by their own reservation.

use super::*;

/// Whether the holder of a command's lease may call the upstream now: the lease is held and
/// more than the whole call's time (timeout plus skew bound) of it remains, so the outcome is
/// written before anyone may take the lease for expired. Checked right before the call, after
/// the lease write and its retries.
pub fn lease_usable(state: &CommandState, rules: &Rules, now: Timestamp) -> bool {
    state.status == CommandStatus::Leased
        && state
            .lease
            .expires_at
            .is_some_and(|expires_at| expires_at.millis_since(now) > rules.call_margin_ms())
}

/// What a run's rollback does to one of its commands as it is now (decided afresh on every
/// read, so a command that moved while the rollback ran is still taken): cancel what has not
/// started, undo what committed, mark what is in flight; `None` for what needs nothing (a
/// read, a command already settled without a commit, or already undone or marked).
pub fn rollback_event(
    state: &CommandState,
    semantics: EffectSemantics,
    operator: &Operator,
) -> Option<Event> {
    use CommandStatus as S;
    let operator = operator.clone();
    let undoable = semantics != EffectSemantics::ObserveOnly;
    match state.status {
        S::Pending | S::Approved if state.outcome_unknown => (undoable
            && state.rollback_pending.is_none())
        .then_some(Event::MarkRollback { operator }),
        S::Scheduled | S::Pending | S::Blocked | S::Approved => Some(Event::Cancel { operator }),
        S::Leased | S::Unknown | S::Stuck => (undoable && state.rollback_pending.is_none())
            .then_some(Event::MarkRollback { operator }),
        S::Confirmed => undoable.then_some(Event::Rollback { operator }),
        S::Failed | S::Cancelled => (undoable && state.rollback_pending.is_none())
            .then_some(Event::MarkRollback { operator }),
        S::Compensating | S::Compensated | S::CompensationFailed | S::NoCompensation => None,
    }
}

/// [`rollback_event`] for a rollback asked again of a run an earlier rollback closed: what the
/// first left undone (a crash cut it short) is still taken — a cancel, an undo, the mark of a
/// command in flight or FAILED (a FAILED one could otherwise be replayed into the closed run) —
/// but a CANCELLED command is not marked. The first rollback cancels without marking, and a
/// CANCELLED command never committed and is never replayed, so its mark would be a record
/// written for nothing, on every repeat.
pub fn repeated_rollback_event(
    state: &CommandState,
    semantics: EffectSemantics,
    operator: &Operator,
) -> Option<Event> {
    match state.status {
        CommandStatus::Cancelled => None,
        _ => rollback_event(state, semantics, operator),
    }
}

/// Of a run's commands in journal order, the one whose compensation may run now: the last one
/// still to be undone. Compensation is last-in-first-out: nothing earlier in the journal is
/// undone while a later command is COMPENSATING or still in flight under a rollback (its
/// outcome decides whether it is undone first). `None`: nothing can be compensated now.
pub fn next_to_compensate<T>(run: &[T], state_of: impl Fn(&T) -> &CommandState) -> Option<usize> {
    for (index, item) in run.iter().enumerate().rev() {
        let state = state_of(item);
        if state.status == CommandStatus::Compensating {
            return Some(index);
        }
        // Still moving under the rollback: its outcome decides whether it is undone first. A
        // STUCK one waits for a person, perhaps for days, and does not hold the others up; if
        // it is resolved CONFIRMED it is undone then, out of order, and the audit says so.
        if state.rollback_pending.is_some() && !state.status.is_settled() {
            return None;
        }
    }
    None
}

/// The lease owner of a command that was leased by its own reservation
/// ([`lease_at_reservation`]): whichever dispatcher receives its dispatch request calls under it.
pub const RESERVATION_OWNER: &str = "reservation";

/// The state a reservation stores for a command whose tool may be called again with the same
/// idempotency key (IDEMPOTENT, OBSERVE_ONLY): leased already, so dispatching it costs no lease
/// write of its own — two ledger writes per effect (reserve, outcome) instead of three.
///
/// The lease's compare-and-set is what keeps a NON_IDEMPOTENT effect to one caller. For these
/// tools a second caller is harmless by their contract (it carries the same key), and the
/// outcome's write is still fenced by the epoch, so exactly one outcome is stored. What the
/// early lease keeps is the rest of the lease's meaning: from its reservation on, the command
/// reads LEASED — handed to the dispatchers, possibly in flight — so a cancel or a rollback
/// never takes it for not started, and a lost dispatch request ends in the lease-expiry sweep,
/// which reconciles it like any other lease that lapsed.
///
/// `None` (the command is stored as it is) unless the command is PENDING, its tool is of that
/// kind and `policy` allows it outright: a command that needs approval is blocked by the
/// dispatcher as before, and a SCHEDULED one is leased when it falls due.
pub fn lease_at_reservation(
    state: &CommandState,
    rules: &Rules,
    policy: &PolicyDecision,
    now: Timestamp,
) -> Option<CommandState> {
    let repeatable = match rules.semantics {
        EffectSemantics::Idempotent | EffectSemantics::ObserveOnly => true,
        EffectSemantics::NonIdempotent => false,
    };
    let allowed = match policy {
        PolicyDecision::Allow => true,
        PolicyDecision::RequireApproval { .. } | PolicyDecision::Deny { .. } => false,
    };
    if !repeatable || !allowed || state.status != CommandStatus::Pending {
        return None;
    }
    let lease = Event::Lease {
        owner: std::sync::Arc::from(RESERVATION_OWNER),
    };
    let mut next = apply(state, rules, &lease, now).ok()?.state;
    // A dispatcher takes the lease up within `pending_stale_ms` (the wait a PENDING command is
    // given before the sweep republishes it) and calls for at most the call's timeout, so the
    // lease lapses no later than that: a dispatch request lost with an embedded bus's process
    // is then reconciled as soon as a stale PENDING one would be republished, not a whole
    // `lease_ttl_ms` later.
    let expires_at = now.plus_millis(
        rules
            .pending_stale_ms
            .saturating_add(rules.dispatch_timeout_ms)
            .saturating_add(rules.write_slack_ms)
            .min(rules.lease_ttl_ms),
    );
    next.lease.expires_at = Some(expires_at);
    next.due_at = Some(expires_at);
    Some(next)
}

/// Whether a command's reservation lease can no longer be called under (less than the whole
/// call's time left, or lapsed) while the command waits for it: its dispatch request waited
/// on the bus longer than the lease was sized for. Only for a tool whose attempts may repeat
/// with the same key, and not once a rollback marked the command.
pub fn reservation_lease_lapsing(state: &CommandState, rules: &Rules, now: Timestamp) -> bool {
    state.status == CommandStatus::Leased
        && state.lease.owner.as_deref() == Some(RESERVATION_OWNER)
        && rules.semantics != EffectSemantics::NonIdempotent
        && state.rollback_pending.is_none()
        && !lease_usable(state, rules, now)
}

/// A dispatcher takes a lapsing reservation lease over ([`reservation_lease_lapsing`]) with a
/// lease of its own, instead of leaving it to the sweep (lease expiry, UNKNOWN, a status check,
/// a same-key retry and a lease: four more writes, on a ledger that is already behind). Safe
/// for these tools alone: whoever called under the reservation's lease (only while the whole
/// call fitted in it) sent the same idempotency key, and the new epoch fences that caller's
/// outcome. Its attempt's outcome is unknown as after any same-key retry: it may land until
/// the horizon after the old lease's end, a rollback marks rather than cancels, and a tool that
/// asks for a look after every commit gets one.
pub(super) fn take_over_reservation_lease(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    owner: &std::sync::Arc<str>,
    now: Timestamp,
) -> Result<(CommandState, String), Refusal> {
    if state.attempts >= rules.max_attempts {
        return Err(Refusal::AttemptsExhausted {
            max_attempts: rules.max_attempts,
        });
    }
    let ended_by = state.lease.expires_at.map_or(now, |at| at.max(now));
    let lands_by = ended_by.plus_millis(rules.late_commit_ms.saturating_add(rules.clock_skew_ms));
    let expires_at = now.plus_millis(rules.lease_ttl_ms);
    next.lease = Lease {
        epoch: state.lease.epoch.next(),
        owner: Some(owner.clone()),
        expires_at: Some(expires_at),
    };
    next.attempts = state.attempts + 1;
    next.ambiguous_before = true;
    next.outcome_unknown = true;
    next.lands_by = Some(state.lands_by.map_or(lands_by, |at| at.max(lands_by)));
    next.due_at = Some(expires_at);
    let reason = format!(
        "the reservation's lease ran short before a dispatcher could call under it: taken over \
         by {owner} with the same key, attempt {} of {}",
        next.attempts, rules.max_attempts
    );
    Ok((next, reason))
}

/// Whether a dispatcher may call under a lease its command got at reservation: the lease is
/// still the reservation's, and it has more than the call's timeout left, so the outcome is
/// written before the sweep may take the lease for expired. A lease with less left is left to
/// that sweep, which reconciles it and retries under a lease of its own.
pub fn reservation_lease_usable(state: &CommandState, rules: &Rules, now: Timestamp) -> bool {
    state.lease.owner.as_deref() == Some(RESERVATION_OWNER) && lease_usable(state, rules, now)
}

/// A CONFIRMED command of a rolled-back run: COMPENSATING, or NO_COMPENSATION escalated when the
/// tool cannot undo it. Owed duplicate clean-ups travel with the compensation. A last look
/// still owed is kept for after it: a second commit it would have found (behind one 2xx, or an
/// earlier attempt landing late) must not outlive the undo.
pub(super) fn rollback_confirmed(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    operator: &Operator,
    now: Timestamp,
) -> Result<Step, Refusal> {
    if rules.semantics == EffectSemantics::ObserveOnly {
        return Err(Refusal::NotCompensable);
    }
    next.verify_pending = state.verify_pending
        || (rules.semantics == EffectSemantics::NonIdempotent
            && state.ambiguous_before
            && rules.has_status_check);
    let step = |next, actions, reason| Step {
        from: CommandStatus::Confirmed,
        state: next,
        actions,
        reason,
        evidence: Value::Null,
        quiet: false,
    };
    if rules.has_compensate {
        next.status = CommandStatus::Compensating;
        next.compensation = Some(Box::new(CompensationInfo::started(now)));
        next.due_at = Some(now.plus_millis(rules.compensation_timeout_ms));
        Ok(step(
            next,
            vec![Action::Compensate],
            operator.reason.clone(),
        ))
    } else {
        next.status = CommandStatus::NoCompensation;
        next.escalated = true;
        next.verify_pending = false;
        next.due_at = None;
        Ok(step(
            next,
            vec![
                Action::Escalate {
                    reason: "rolled back but the tool declares no compensate".into(),
                },
                Action::Publish {
                    status: CommandStatus::NoCompensation,
                },
            ],
            format!("{} (no compensate declared)", operator.reason),
        ))
    }
}

/// What a dispatcher does with a command it was asked to dispatch, decided from the command as
/// read, the tool's rules and today's policy for its stored arguments (evaluated once per read
/// by the caller): the one place that decides whether to call, lease, take over, block, deny
/// or leave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DispatchPlan {
    /// Call now, under the lease the command already holds (its reservation's, with the whole
    /// call's time left): no lease write.
    Call,
    /// Write this event first (a lease, a take-over of a lapsing reservation lease, a block or
    /// a denial); call only if it leaves the command leased to this dispatcher.
    Apply(Event),
    /// Nothing to do: not waiting for a dispatcher, or a reservation lease that is neither
    /// usable nor lapsing (left to its holder or the sweep).
    Nothing,
}

/// Decides what to do with `command` (see [`DispatchPlan`]). `policy`: `None` when its tool is
/// no longer in the catalog. `held`: flow control keeps the call back now (`crate::flow`);
/// an allowed command is then put back until its time instead of leased.
pub fn plan_dispatch(
    command: &crate::command::Command,
    rules: &Rules,
    policy: Option<&PolicyDecision>,
    held: Option<&crate::flow::Held>,
    owner: &std::sync::Arc<str>,
    now: Timestamp,
) -> DispatchPlan {
    let state = &command.state;
    // Held back by an upstream that asked to be called again later: the sweep republishes
    // the request when the wait is over.
    if !command.awaits_dispatch() || rate_limit_holds(state, rules, now) {
        return DispatchPlan::Nothing;
    }
    // Waiting for dispatch and LEASED: the reservation's lease, whose epoch a block or denial
    // must present.
    let reserved = state.status == CommandStatus::Leased;
    let epoch = reserved.then_some(state.lease.epoch);
    let Some(policy) = policy else {
        return DispatchPlan::Apply(Event::Deny {
            reason: format!("tool {} is no longer in the catalog", command.tool),
            epoch,
        });
    };
    match (policy, held) {
        // A reservation lease that is lapsing is left to lapse: the sweep reconciles it, as a
        // lease that was called under may have sent.
        (PolicyDecision::Allow, Some(held))
            if !reserved || reservation_lease_usable(state, rules, now) =>
        {
            // A rate's slots are spaced already; any other hold's end is spread per command.
            let jitter = match held.cause {
                crate::flow::HoldCause::Rate => 0,
                _ => crate::flow::jitter_ms(
                    command.command_key.as_str(),
                    held.until.millis_since(now),
                ),
            };
            DispatchPlan::Apply(Event::Hold {
                epoch,
                until: held.until.plus_millis(jitter),
                cause: held.cause,
                reason: held.reason.clone(),
            })
        }
        (PolicyDecision::Allow, Some(_)) => DispatchPlan::Nothing,
        _ => plan_allowed(command, rules, policy, owner, epoch, now),
    }
}

fn plan_allowed(
    command: &crate::command::Command,
    rules: &Rules,
    policy: &PolicyDecision,
    owner: &std::sync::Arc<str>,
    epoch: Option<LeaseEpoch>,
    now: Timestamp,
) -> DispatchPlan {
    let state = &command.state;
    let reserved = epoch.is_some();
    match policy {
        PolicyDecision::Allow if reserved && reservation_lease_usable(state, rules, now) => {
            DispatchPlan::Call
        }
        // Its request waited on the bus past the lease's time: taken over with the same key
        // (one write) rather than left to lapse into the sweep's several.
        PolicyDecision::Allow if reserved => {
            if reservation_lease_lapsing(state, rules, now) {
                DispatchPlan::Apply(Event::Lease {
                    owner: owner.clone(),
                })
            } else {
                DispatchPlan::Nothing
            }
        }
        PolicyDecision::Allow => DispatchPlan::Apply(Event::Lease {
            owner: owner.clone(),
        }),
        PolicyDecision::RequireApproval { reason } => DispatchPlan::Apply(Event::Block {
            reason: reason.clone(),
            epoch,
        }),
        PolicyDecision::Deny { reason } => DispatchPlan::Apply(Event::Deny {
            reason: reason.clone(),
            epoch,
        }),
    }
}
