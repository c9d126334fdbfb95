//! Answers that ask for a later call: a 429 or 503 with `Retry-After`, or a 403 with it
//! (GitHub's secondary rate limit). The upstream did not decide; it told the caller when to
//! come back. Such an answer is waited out instead of spent: the command is due again after
//! the delay, the attempt (or the look) is not counted, and what was waited is recorded in
//! `CommandState::rate_limited_ms`, so the tool's `max_rate_limited_ms` bounds the waiting of
//! a whole cycle, across attempts and looks. Past that ceiling such answers count as they
//! would without the header (`DispatchOutcome::without_retry_after`).
//!
//! Whether the answer proves that nothing committed is the tool's to declare
//! (`rate_limited_commits_nothing`): by default a NON_IDEMPOTENT command is looked up before
//! it is sent again (UNKNOWN, its look due after the delay), while an IDEMPOTENT or
//! OBSERVE_ONLY one is sent again with the same key after the delay, its outcome still open
//! (`outcome_unknown`). Why the default differs: docs/decisions.md, "Retry-After".

use super::*;
use crate::command::Observation;

/// How long to wait on an answer that asked for `retry_after_ms`, given what the command has
/// waited already in this cycle: at least the tool's first backoff (a `Retry-After: 0` would
/// otherwise loop without end), at most what is left of the ceiling. `None`: not waited on
/// (the ceiling is spent or 0, or the delay is negative), so the answer counts as today.
pub fn rate_limited_wait_ms(
    state: &CommandState,
    rules: &Rules,
    retry_after_ms: i64,
) -> Option<i64> {
    let left = rules
        .max_rate_limited_ms
        .saturating_sub(state.rate_limited_ms.max(0));
    if left <= 0 || retry_after_ms < 0 {
        return None;
    }
    Some(retry_after_ms.max(rules.backoff_base_ms.max(1)).min(left))
}

/// Whether a PENDING (or APPROVED) command is still held back by an answer that asked for a
/// later call: no dispatcher leases it before then, whoever asks. The clock-skew bound is
/// granted, so a dispatcher whose clock lags the sweep's does not leave it for another round.
pub fn rate_limit_holds(state: &CommandState, rules: &Rules, now: Timestamp) -> bool {
    state
        .rate_limited_until
        .is_some_and(|until| until > now.plus_millis(rules.clock_skew_ms))
}

/// When an attempt sent at `sent_at` can no longer be running: its timeout after the send,
/// bounded by the lease it was sent under, and never before now.
pub(super) fn attempt_end(
    state: &CommandState,
    rules: &Rules,
    sent_at: Timestamp,
    now: Timestamp,
) -> Timestamp {
    let timeout_at = sent_at.plus_millis(rules.dispatch_timeout_ms);
    state
        .lease
        .expires_at
        .map_or(timeout_at, |expiry| timeout_at.min(expiry))
        .max(now)
}

/// A dispatch answered "later" (`DispatchOutcome::RateLimited`), from LEASED: the step that
/// waits it out, or `None` when it is not waited on and counts as today. `next` is the state
/// after the answer (lease given back, key recorded as sent).
#[allow(clippy::too_many_arguments)]
pub(super) fn dispatch_later(
    next: &CommandState,
    state: &CommandState,
    rules: &Rules,
    retry_after_ms: i64,
    reason: &str,
    sent_at: Timestamp,
    now: Timestamp,
) -> Option<Step> {
    // A run rolled back meanwhile is settled as today: looked up, then cancelled or undone.
    if state.rollback_pending.is_some() {
        return None;
    }
    let wait = rate_limited_wait_ms(state, rules, retry_after_ms)?;
    let due = now.plus_millis(wait);
    let mut next = next.clone();
    let commits_nothing = rules.rate_limited_commits_nothing;
    let resend = commits_nothing || rules.semantics != EffectSemantics::NonIdempotent;
    // A resend after an attempt that may have committed must not reach an upstream that has
    // forgotten the key: then it is looked up first, as today.
    let open = !commits_nothing || state.outcome_unknown;
    if resend && open && rules.key_forgotten_by(&next, due) {
        return None;
    }
    next.attempts = state.attempts.saturating_sub(1);
    next.rate_limited_ms = state.rate_limited_ms.max(0).saturating_add(wait);
    next.last_error = Some(reason.to_owned());
    let waited = format!(
        "asked to call again later ({reason}); waits {wait} ms without spending the attempt ({} of {} ms waited this cycle)",
        next.rate_limited_ms, rules.max_rate_limited_ms
    );
    let ended_by = attempt_end(state, rules, sent_at, now);
    if !resend {
        // NON_IDEMPOTENT, and the tool does not say such an answer proves nothing committed:
        // looked up before it is sent again, the look due once the wait is over.
        settle::enter_unknown(&mut next, rules, ended_by, now);
        next.due_at = Some(due);
        return Some(step_of(
            state.status,
            next,
            format!("{waited}; looked up then, before any resend"),
        ));
    }
    next.status = CommandStatus::Pending;
    next.due_at = Some(due);
    next.rate_limited_until = Some(due);
    if !commits_nothing {
        // Sent again with the same key; until an answer settles it, this attempt's outcome is
        // as open as an ambiguous one's.
        next.outcome_unknown = true;
        next.ambiguous_before = true;
        let horizon =
            ended_by.plus_millis(rules.late_commit_ms.saturating_add(rules.clock_skew_ms));
        next.lands_by = Some(
            state
                .lands_by
                .map_or(horizon, |earlier| earlier.max(horizon)),
        );
    }
    let then = if commits_nothing {
        "sent again then (the tool declares such an answer commits nothing)"
    } else {
        "sent again then with the same idempotency key"
    };
    Some(step_of(state.status, next, format!("{waited}; {then}")))
}

/// A look answered "later" (`Event::Observed` with `retry_after_ms`, an `inconclusive`
/// answer): the next look waits for it and this one is not counted. `None` when the event is
/// not such a look of a command that awaits one, or the ceiling is spent: decided as today.
pub(super) fn look_later(
    a: &Apply<'_>,
    observation: Observation,
    retry_after_ms: Option<i64>,
    evidence: &Value,
) -> Option<Step> {
    let Apply {
        state, rules, now, ..
    } = *a;
    let retry_after_ms = retry_after_ms?;
    if observation != Observation::Inconclusive || !awaits_look(state) {
        return None;
    }
    let wait = rate_limited_wait_ms(state, rules, retry_after_ms)?;
    let mut next = a.next();
    next.rate_limited_ms = state.rate_limited_ms.max(0).saturating_add(wait);
    next.due_at = Some(now.plus_millis(wait));
    let mut step = step_of(
        state.status,
        next,
        format!(
            "status check asked to be asked again later; looks again in {wait} ms, the look not counted ({} of {} ms waited this cycle)",
            state.rate_limited_ms.max(0).saturating_add(wait),
            rules.max_rate_limited_ms
        ),
    );
    step.evidence = evidence.clone();
    Some(step)
}

fn step_of(from: CommandStatus, next: CommandState, reason: String) -> Step {
    Step {
        from,
        state: next,
        actions: vec![],
        reason,
        evidence: Value::Null,
        quiet: false,
    }
}
