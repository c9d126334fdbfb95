//! The outcomes the state machine settles a command into: what a dispatch, a status check, a
//! verification or a compensation decides, and the shared shapes of the terminal steps.
//!
//! **Late commits.** An upstream keeps working after the client gave up, and its lookups can
//! lag its writes. So an `absent` observation proves nothing until the last attempt can no
//! longer land (`lands_by`: the call's timeout, plus the tool's `late_commit_ms`, plus the
//! clock-skew bound); and a NON_IDEMPOTENT command that went through UNKNOWN or was
//! redispatched is looked up once more `verify_after_ms` after it settled. A commit found then
//! that should not be there (a duplicate, or a commit of a command FAILED or CANCELLED on
//! `absent` evidence) is compensated, or escalated to a person when the tool cannot
//! compensate: never left standing silently.
//!
//! **Rollback in flight.** A command the run's rollback found in flight carries
//! `rollback_pending`: a commit it turns out to have made is undone (COMPENSATING, or
//! NO_COMPENSATION escalated), and nothing is dispatched for it afresh.

use serde_json::Value;

use super::undo::{owe_duplicates, undo_commit};
use super::{Action, DispatchOutcome, OnAbsent, Refusal, Rules, Step};
use crate::command::{CommandState, CommandStatus, EffectSemantics};
use crate::command::{Lease, Observation};
use crate::ids::LeaseEpoch;
use crate::time::Timestamp;

pub(super) fn check_epoch(state: &CommandState, presented: LeaseEpoch) -> Result<(), Refusal> {
    if presented == state.lease.epoch {
        Ok(())
    } else {
        Err(Refusal::StaleEpoch {
            current: state.lease.epoch,
            presented,
        })
    }
}

/// The lease holder's fence: the current epoch, or the one a run rollback found the command
/// leased under — but only while that lease is still the command's: the mark moved the epoch
/// on by one without taking the lease from its holder, so the holder's epoch is accepted while
/// the lease is held and no lease or claim has moved the epoch further. Once it expired or
/// another took the lease, the holder is as stale as any other.
pub(super) fn check_holder(state: &CommandState, presented: LeaseEpoch) -> Result<(), Refusal> {
    let marked_holder = state.rollback_pending == Some(presented)
        && state.lease.epoch == presented.next()
        && state.lease.owner.is_some();
    if marked_holder {
        return Ok(());
    }
    check_epoch(state, presented)
}

/// The lease after release: no holder, and the epoch kept so older holders stay fenced out.
pub(super) fn released(lease: &Lease) -> Lease {
    Lease {
        epoch: lease.epoch,
        owner: None,
        expires_at: None,
    }
}

/// UNKNOWN after an attempt whose call ended by `ended_by`: looked at now, and its `absent`
/// trusted only once the attempt can no longer land.
pub(super) fn enter_unknown(
    next: &mut CommandState,
    rules: &Rules,
    ended_by: Timestamp,
    now: Timestamp,
) {
    next.status = CommandStatus::Unknown;
    next.ambiguous_before = true;
    next.checks = 0;
    next.first_absent_at = None;
    next.lands_by =
        Some(ended_by.plus_millis(rules.late_commit_ms.saturating_add(rules.clock_skew_ms)));
    next.due_at = Some(now);
}

pub(super) fn is_empty_evidence(evidence: &Value) -> bool {
    match evidence {
        Value::Null => true,
        Value::String(text) => text.trim().is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

pub(super) fn stuck(mut next: CommandState, from: CommandStatus, reason: String) -> Step {
    next.status = CommandStatus::Stuck;
    next.escalated = true;
    next.due_at = None;
    next.lands_by = None;
    Step {
        from,
        state: next,
        actions: vec![
            Action::Escalate {
                reason: reason.clone(),
            },
            Action::Publish {
                status: CommandStatus::Stuck,
            },
        ],
        reason,
        evidence: Value::Null,
        quiet: false,
    }
}

pub(super) fn cancelled(
    next: CommandState,
    from: CommandStatus,
    rules: &Rules,
    operator: &super::Operator,
    now: Timestamp,
) -> Step {
    cancelled_unsent(next, from, rules, operator.reason.clone(), now)
}

/// CANCELLED: nothing of it was sent, or what was sent is believed not to have committed. A
/// command that once went through UNKNOWN owes a last look all the same: the absence it was
/// decided on may have come from a lookup that lagged.
pub(super) fn cancelled_unsent(
    mut next: CommandState,
    from: CommandStatus,
    rules: &Rules,
    reason: String,
    now: Timestamp,
) -> Step {
    next.status = CommandStatus::Cancelled;
    next.due_at = None;
    let lands_by = next.lands_by.take();
    let ambiguous = next.ambiguous_before;
    let mut step = Step {
        from,
        state: next,
        actions: vec![Action::Publish {
            status: CommandStatus::Cancelled,
        }],
        reason,
        evidence: Value::Null,
        quiet: false,
    };
    if ambiguous && rules.semantics != EffectSemantics::ObserveOnly {
        owe_verification(&mut step, rules, now, lands_by);
    }
    step
}

pub(super) fn failed(mut next: CommandState, from: CommandStatus, reason: String) -> Step {
    next.status = CommandStatus::Failed;
    next.due_at = None;
    next.lands_by = None;
    next.last_error = Some(reason.clone());
    Step {
        from,
        state: next,
        actions: vec![Action::Publish {
            status: CommandStatus::Failed,
        }],
        reason,
        evidence: Value::Null,
        quiet: false,
    }
}

fn confirmed(
    mut next: CommandState,
    from: CommandStatus,
    external_ref: Option<String>,
    reason: String,
    evidence: Value,
) -> Step {
    next.status = CommandStatus::Confirmed;
    next.due_at = None;
    // `lands_by` is kept: a look owed now or after an undo waits for it.
    next.outcome_unknown = false;
    if external_ref.is_some() {
        next.external_ref = external_ref;
    }
    Step {
        from,
        state: next,
        actions: vec![Action::Publish {
            status: CommandStatus::Confirmed,
        }],
        reason,
        evidence,
        quiet: false,
    }
}

/// The latest time anything of the command may still land: now, or the landing horizon of an
/// earlier attempt whose outcome is still open (a same-key retry sent before it).
pub(super) fn last_landing(lands_by: Option<Timestamp>, now: Timestamp) -> Timestamp {
    lands_by.map_or(now, |at| at.max(now))
}

/// Owes the command a last look, where the tool can look: `verify_after_ms` after the latest
/// time anything of it may land (`lands_by`, else now).
fn owe_verification(step: &mut Step, rules: &Rules, now: Timestamp, lands_by: Option<Timestamp>) {
    if rules.has_status_check {
        step.state.verify_pending = true;
        step.state.checks = 0;
        step.state.due_at = Some(last_landing(lands_by, now).plus_millis(rules.verify_after_ms));
    }
}

/// A NON_IDEMPOTENT command that once went through UNKNOWN (a replay included) and now ends
/// FAILED without a commit of this attempt: an earlier attempt may still show up, so it owes a
/// last look.
fn owe_last_look_after_ambiguity(
    step: &mut Step,
    state: &CommandState,
    rules: &Rules,
    now: Timestamp,
) {
    if rules.semantics == EffectSemantics::NonIdempotent && state.ambiguous_before {
        owe_verification(step, rules, now, state.lands_by);
    }
}

/// A commit is known: CONFIRMED, or undone when the run was rolled back meanwhile.
#[allow(clippy::too_many_arguments)]
fn committed(
    next: CommandState,
    state: &CommandState,
    rules: &Rules,
    external_ref: Option<String>,
    extra_refs: &[String],
    reason: String,
    evidence: Value,
    now: Timestamp,
) -> Step {
    if state.rollback_pending.is_some() {
        let mut next = next;
        if external_ref.is_some() {
            next.external_ref = external_ref;
        }
        let mut step = undo_commit(
            next,
            state.status,
            rules,
            extra_refs,
            format!("{reason}; the run was rolled back meanwhile: undo it"),
            now,
        );
        step.evidence = evidence;
        return step;
    }
    let step = confirmed(next, state.status, external_ref, reason, evidence);
    if extra_refs.is_empty() {
        step
    } else {
        owe_duplicates(step, rules, extra_refs, now)
    }
}

/// The commits other than the command's own among what a status check reported (`primary`
/// first, then `extra_refs`). The command's own commit is its recorded `external_ref`, else the
/// status check's primary reference. `Err`: the check does not show the recorded commit.
pub(super) fn others_than_own(
    state: &CommandState,
    primary: &Option<String>,
    extra_refs: &[String],
) -> Result<(Option<String>, Vec<String>), String> {
    let seen: Vec<&String> = primary.iter().chain(extra_refs).collect();
    let own = match &state.external_ref {
        Some(own) => {
            if !seen.is_empty() && !seen.contains(&own) {
                return Err(format!(
                    "the status check shows commits {seen:?} but not the recorded {own}"
                ));
            }
            own.clone()
        }
        None => match primary {
            Some(primary) => primary.clone(),
            None => return Ok((None, extra_refs.to_vec())),
        },
    };
    let mut others = Vec::new();
    for reference in seen {
        if *reference != own && !others.contains(reference) {
            others.push(reference.clone());
        }
    }
    Ok((Some(own), others))
}

/// `sent_at` is when the holder sent the attempt, by its clock.
pub(super) fn dispatched(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    outcome: &DispatchOutcome,
    sent_at: Timestamp,
    now: Timestamp,
    from: CommandStatus,
) -> Step {
    // The key went out with any attempt that was sent, whatever came back.
    if !matches!(outcome, DispatchOutcome::NotSent { .. }) && next.key_sent_at.is_none() {
        next.key_sent_at = Some(sent_at);
    }
    match outcome {
        DispatchOutcome::Committed {
            external_ref,
            result,
        } => {
            next.result = result.clone();
            next.last_error = None;
            let mut step = committed(
                next,
                state,
                rules,
                external_ref.clone(),
                &[],
                "upstream committed".into(),
                Value::Null,
                now,
            );
            // A NON_IDEMPOTENT command redispatched (or replayed) after an ambiguous attempt
            // may have that attempt land late, or have been redispatched on a lookup that
            // lagged; the tool may also ask for every commit to be looked up once more.
            let redispatched =
                rules.semantics == EffectSemantics::NonIdempotent && state.ambiguous_before;
            if step.state.status == CommandStatus::Confirmed
                && (redispatched || rules.verify_after_commit)
            {
                owe_verification(&mut step, rules, now, state.lands_by);
            }
            step
        }
        DispatchOutcome::Refused { reason } if state.outcome_unknown => {
            // The earlier attempt's outcome is still unknown; a refusal of this one says
            // nothing about it.
            stuck(
                next,
                from,
                format!("refused ({reason}) after an earlier attempt with an unknown outcome"),
            )
        }
        DispatchOutcome::Refused { reason } => {
            // The mark stays: the run was rolled back, so the command is never replayed.
            let mut step = failed(next, from, format!("refused: {reason}"));
            owe_last_look_after_ambiguity(&mut step, state, rules, now);
            if rules.verify_after_refusal {
                // The tool says its upstream can refuse after booking: the refusal is looked
                // up once more, and a commit found then is undone or escalated, like one that
                // lands after a FAILED decided on absence.
                let ended_by = sent_at.plus_millis(rules.dispatch_timeout_ms).min(now);
                let lands_by =
                    ended_by.plus_millis(rules.late_commit_ms.saturating_add(rules.clock_skew_ms));
                owe_verification(&mut step, rules, now, Some(lands_by));
            }
            step
        }
        DispatchOutcome::Ambiguous { reason } => {
            // An early answer (a gateway's 503, a reset) may come from something that handed
            // the work on, so the attempt counts as running until its timeout, and may land
            // until the horizon after that. The holder sent only with the whole call left in
            // its lease, so the lease's expiry bounds it whatever the holder's clock said.
            let ended_by = super::rate_limit::attempt_end(state, rules, sent_at, now);
            enter_unknown(&mut next, rules, ended_by, now);
            next.last_error = Some(reason.clone());
            Step {
                from,
                state: next,
                actions: vec![Action::Reconcile],
                reason: format!("outcome ambiguous: {reason}"),
                evidence: Value::Null,
                quiet: false,
            }
        }
        DispatchOutcome::Accepted {
            reason,
            external_ref,
        } => match rules.async_deadline_ms {
            Some(deadline_ms) => super::accepted::accepted(
                next,
                rules,
                reason,
                external_ref.clone(),
                deadline_ms,
                now,
                from,
            ),
            // A tool that declares no `[tool.async]` cannot wait for a callback: the answer
            // proves nothing either way.
            None => dispatched(
                next,
                state,
                rules,
                &DispatchOutcome::Ambiguous {
                    reason: reason.clone(),
                },
                sent_at,
                now,
                from,
            ),
        },
        DispatchOutcome::RateLimited {
            reason,
            retry_after_ms,
            ..
        } => match super::rate_limit::dispatch_later(
            &next,
            state,
            rules,
            *retry_after_ms,
            reason,
            sent_at,
            now,
        ) {
            Some(step) => step,
            // Not waited on (the ceiling is spent): it counts as it would without the header.
            None => dispatched(
                next,
                state,
                rules,
                &outcome.without_retry_after(),
                sent_at,
                now,
                from,
            ),
        },
        DispatchOutcome::NotSent { reason }
            if state.rollback_pending.is_some() && !state.outcome_unknown =>
        {
            // The mark stays: the run was rolled back, so the command is never replayed.
            cancelled_unsent(
                next,
                from,
                rules,
                format!("run rolled back; the call was not sent: {reason}"),
                now,
            )
        }
        DispatchOutcome::NotSent { reason }
            if state.outcome_unknown
                && state.attempts < rules.max_attempts
                && rules.key_forgotten_by(
                    &next,
                    now.plus_millis(rules.backoff_ms(state.attempts.saturating_sub(1))),
                ) =>
        {
            // The retry would resend a key its upstream may have forgotten, after an attempt
            // that may have committed: look first, or hand it to a person.
            let why = rules.key_forgotten_reason(&next);
            if rules.has_status_check {
                enter_unknown(&mut next, rules, now, now);
                next.last_error = Some(reason.clone());
                Step {
                    from,
                    state: next,
                    actions: vec![Action::Reconcile],
                    reason: format!("not sent ({reason}); {why}"),
                    evidence: Value::Null,
                    quiet: false,
                }
            } else {
                stuck(next, from, format!("not sent ({reason}); {why}"))
            }
        }
        DispatchOutcome::NotSent { reason } => {
            if state.attempts < rules.max_attempts {
                next.status = CommandStatus::Pending;
                next.last_error = Some(reason.clone());
                // The stale-PENDING sweep republishes it after the backoff, so an upstream
                // that refuses connections is not hammered in a loop.
                let delay = rules.backoff_ms(state.attempts.saturating_sub(1));
                next.due_at = Some(now.plus_millis(delay));
                Step {
                    from,
                    state: next,
                    actions: vec![],
                    reason: format!("not sent, will retry: {reason}"),
                    evidence: Value::Null,
                    quiet: false,
                }
            } else if state.outcome_unknown {
                stuck(
                    next,
                    from,
                    format!(
                        "not sent after {} attempts, and an earlier attempt's outcome is unknown: {reason}",
                        rules.max_attempts
                    ),
                )
            } else {
                let mut step = failed(
                    next,
                    from,
                    format!("not sent after {} attempts: {reason}", rules.max_attempts),
                );
                owe_last_look_after_ambiguity(&mut step, state, rules, now);
                step
            }
        }
    }
}

/// What an `absent` observation of an UNKNOWN command decides: a redispatch, a final FAILED
/// or CANCELLED (then owing a last look), or another look later.
fn absent(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    evidence: &Value,
    now: Timestamp,
) -> Step {
    let from = state.status;
    let later = |mut next: CommandState, due: Timestamp, reason: String| {
        next.due_at = Some(due);
        Step {
            from,
            state: next,
            actions: vec![],
            reason,
            evidence: evidence.clone(),
            quiet: false,
        }
    };
    let non_idempotent = rules.semantics == EffectSemantics::NonIdempotent;
    // Absence counts only once the last attempt can no longer land — for any decision that
    // is final or sends a NON_IDEMPOTENT effect again. (A same-key retry of an IDEMPOTENT
    // tool is safe at any time.)
    let final_or_risky =
        non_idempotent || state.rollback_pending.is_some() || state.attempts >= rules.max_attempts;
    if final_or_risky && let Some(lands_by) = state.lands_by.filter(|at| *at > now) {
        next.first_absent_at = None;
        return later(
            next,
            lands_by,
            format!(
                "status check: absent, but the last attempt may still land until {lands_by}; look again then"
            ),
        );
    }
    // A NON_IDEMPOTENT absence must hold over the settle interval (lookups lag writes).
    let settled = match state.first_absent_at {
        Some(first) => now.millis_since(first) >= rules.settle_ms,
        None => false,
    };
    let decide_now = !non_idempotent || settled || rules.on_absent == OnAbsent::Fail;
    if !decide_now {
        let first = state.first_absent_at.unwrap_or(now);
        next.first_absent_at = Some(first);
        return later(
            next,
            first.plus_millis(rules.settle_ms),
            "status check: absent; look again after the settle interval".into(),
        );
    }
    let looked = match state.first_absent_at {
        Some(first) => format!(
            "status check: absent, confirmed {} ms after the first look",
            now.millis_since(first)
        ),
        None => "status check: absent".to_owned(),
    };
    next.first_absent_at = None;
    let mut step = if state.rollback_pending.is_some() {
        // The mark stays: the run was rolled back, so the command is never replayed.
        cancelled_unsent(
            next,
            from,
            rules,
            format!("{looked}; the run was rolled back"),
            now,
        )
    } else if non_idempotent && rules.on_absent == OnAbsent::Fail {
        failed(
            next,
            from,
            format!("{looked}; the tool asks a person to decide (on_absent = fail)"),
        )
    } else if state.attempts < rules.max_attempts {
        // A same-key retry is safe at any time, but an absence seen before the last attempt
        // can land proves nothing: that attempt's outcome stays unknown (a cancel is refused,
        // a rollback waits for it) until an answer or a believed absence settles it.
        let may_land = state.lands_by.filter(|at| *at > now);
        next.status = CommandStatus::Pending;
        next.lands_by = may_land;
        next.outcome_unknown = may_land.is_some();
        next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
        return Step {
            from,
            state: next,
            actions: vec![Action::Dispatch],
            reason: format!("{looked}; redispatch"),
            evidence: evidence.clone(),
            quiet: false,
        };
    } else {
        failed(
            next,
            from,
            format!("{looked}; all {} attempts used", rules.max_attempts),
        )
    };
    step.evidence = evidence.clone();
    if rules.semantics != EffectSemantics::ObserveOnly {
        // Decided for good on absence: a commit that shows up later (a lookup that lagged)
        // is not left standing, whatever the tool's semantics.
        owe_verification(&mut step, rules, now, state.lands_by);
    }
    step
}

#[allow(clippy::too_many_arguments)]
pub(super) fn observed(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    observation: Observation,
    external_ref: &Option<String>,
    evidence: &Value,
    extra_refs: &[String],
    now: Timestamp,
) -> Step {
    let from = state.status;
    next.checks = state.checks + 1;
    let non_idempotent = rules.semantics == EffectSemantics::NonIdempotent;
    match observation {
        Observation::Present | Observation::Duplicate => {
            let (own, others) = match others_than_own(state, external_ref, extra_refs) {
                Ok(split) => split,
                Err(why) => {
                    let mut step = stuck(next, from, why);
                    step.evidence = evidence.clone();
                    return step;
                }
            };
            let reason = match observation {
                Observation::Duplicate => "status check: duplicate commit",
                _ => "status check: present",
            };
            if observation == Observation::Duplicate && others.is_empty() {
                // A duplicate without naming the extra commit: nobody can undo it blindly.
                let step = committed(
                    next,
                    state,
                    rules,
                    own,
                    &[],
                    reason.into(),
                    evidence.clone(),
                    now,
                );
                return owe_duplicates(step, rules, &[], now);
            }
            let mut step = committed(
                next,
                state,
                rules,
                own,
                &others,
                reason.into(),
                evidence.clone(),
                now,
            );
            if (non_idempotent || rules.verify_after_commit)
                && step.state.status == CommandStatus::Confirmed
                && !step.state.escalated
            {
                // Went through UNKNOWN: an attempt may still show up late. With extra commits
                // owed, the look is owed too but falls due after their clean-up
                // (`DuplicateSettled`), so the clean-up's due time stays.
                if step.state.owed_duplicates.is_empty() {
                    owe_verification(&mut step, rules, now, state.lands_by);
                } else if rules.has_status_check {
                    step.state.verify_pending = true;
                    step.state.checks = 0;
                }
            }
            step
        }
        Observation::Absent => absent(next, state, rules, evidence, now),
        Observation::Inconclusive => {
            if next.checks >= rules.max_checks {
                let mut step = stuck(
                    next,
                    from,
                    format!(
                        "status check inconclusive {} times; a person must decide",
                        rules.max_checks
                    ),
                );
                step.evidence = evidence.clone();
                step
            } else {
                next.due_at = Some(now.plus_millis(rules.backoff_ms(state.checks)));
                Step {
                    from,
                    state: next,
                    actions: vec![],
                    reason: "status check inconclusive; look again later".into(),
                    evidence: evidence.clone(),
                    quiet: false,
                }
            }
        }
    }
}
