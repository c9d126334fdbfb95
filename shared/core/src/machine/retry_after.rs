//! Tests of answers that ask for a later call (`Retry-After`, issue 30): waited out without
//! spending attempts or checks, up to the tool's ceiling; a NON_IDEMPOTENT command looked up
//! before it is sent again unless its tool declares such answers commit nothing.

use serde_json::json;

use super::*;
use crate::command::{CommandState, CommandStatus as S, EffectSemantics as E, Observation as O};

const T0: i64 = 1_000_000;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

fn rules(semantics: E) -> Rules {
    Rules {
        has_status_check: semantics == E::NonIdempotent,
        has_compensate: semantics == E::NonIdempotent,
        max_attempts: 3,
        max_rate_limited_ms: 10_000,
        ..Rules::defaults(semantics)
    }
}

fn apply_ok(state: &CommandState, rules: &Rules, event: Event, now: Timestamp) -> Step {
    apply(state, rules, &event, now).unwrap_or_else(|refusal| panic!("{event:?}: {refusal}"))
}

fn leased(state: &CommandState, rules: &Rules, now: Timestamp) -> CommandState {
    apply_ok(state, rules, Event::Lease { owner: "d".into() }, now).state
}

fn answered(state: &CommandState, rules: &Rules, outcome: DispatchOutcome, now: Timestamp) -> Step {
    let event = Event::Dispatched {
        epoch: state.lease.epoch,
        outcome,
        sent_at: now,
    };
    apply_ok(state, rules, event, now)
}

fn too_many(retry_after_ms: i64) -> DispatchOutcome {
    DispatchOutcome::RateLimited {
        reason: "HTTP 429".into(),
        retry_after_ms,
        refusal: false,
    }
}

fn committed() -> DispatchOutcome {
    DispatchOutcome::Committed {
        external_ref: Some("w-1".into()),
        result: None,
    }
}

fn pending() -> CommandState {
    CommandState::reserved(at(0), None, 10_000)
}

#[test]
fn an_idempotent_429_waits_its_retry_after_without_spending_the_attempt() {
    let rules = rules(E::Idempotent);
    let first = leased(&pending(), &rules, at(0));
    assert_eq!(first.attempts, 1);
    let step = answered(&first, &rules, too_many(1_000), at(50));
    let state = &step.state;
    assert_eq!(state.status, S::Pending);
    assert_eq!(state.attempts, 0, "the attempt is given back");
    assert_eq!(state.due_at, Some(at(1_050)));
    assert_eq!(state.rate_limited_until, Some(at(1_050)));
    assert_eq!(state.rate_limited_ms, 1_000);
    assert!(
        state.outcome_unknown,
        "resent with the same key, its outcome still open"
    );
    assert!(
        step.actions.is_empty(),
        "the sweep sends it when the wait is over"
    );
    assert!(
        step.reason.contains("without spending the attempt"),
        "{}",
        step.reason
    );

    // No dispatcher leases it before the upstream's time, whoever asks.
    let early = apply(state, &rules, &Event::Lease { owner: "d".into() }, at(500));
    assert_eq!(early, Err(Refusal::NotYetDue { due_at: at(1_050) }));
    let command_held = rate_limit_holds(state, &rules, at(500));
    assert!(command_held);
    assert!(!rate_limit_holds(state, &rules, at(1_050)));
    let again = leased(state, &rules, at(1_050));
    assert_eq!((again.attempts, again.rate_limited_until), (1, None));
    let done = answered(&again, &rules, committed(), at(1_100));
    assert_eq!(done.state.status, S::Confirmed);
    assert_eq!(done.state.attempts, 1);
}

/// The user's report: three attempts, a bank answering 429 Retry-After: 1 again and again.
/// Ten of them in a row spend no attempt; the eleventh call commits.
#[test]
fn a_run_of_429s_spends_no_attempt_budget() {
    let rules = rules(E::Idempotent);
    let mut state = pending();
    let mut clock = at(0);
    for _ in 0..8 {
        state = leased(&state, &rules, clock);
        state = answered(&state, &rules, too_many(1_000), clock).state;
        assert_eq!(state.status, S::Pending);
        clock = state.due_at.expect("due when the wait is over");
    }
    assert_eq!(state.attempts, 0);
    assert_eq!(state.rate_limited_ms, 8_000);
    state = leased(&state, &rules, clock);
    let done = answered(&state, &rules, committed(), clock);
    assert_eq!(done.state.status, S::Confirmed);
}

#[test]
fn past_the_ceiling_a_429_counts_as_it_did_before() {
    let rules = rules(E::Idempotent);
    let mut state = pending();
    state.rate_limited_ms = 9_500;
    let first = leased(&state, &rules, at(0));
    // Huge: capped at what is left of the ceiling.
    let step = answered(&first, &rules, too_many(3_600_000), at(0));
    assert_eq!(step.state.status, S::Pending);
    assert_eq!(step.state.due_at, Some(at(500)));
    assert_eq!(step.state.rate_limited_ms, 10_000);
    // The ceiling is spent: ambiguous, as today, and the attempt counts.
    let second = leased(&step.state, &rules, at(500));
    let step = answered(&second, &rules, too_many(1_000), at(500));
    assert_eq!(step.state.status, S::Unknown);
    assert_eq!(step.state.attempts, 1);
    assert_eq!(step.actions, vec![Action::Reconcile]);
    assert_eq!(step.state.rate_limited_ms, 10_000);
}

#[test]
fn retry_after_values_are_clamped() {
    let rules = rules(E::Idempotent);
    let state = pending();
    // Zero: at least the first backoff, so a `Retry-After: 0` cannot loop without end.
    assert_eq!(
        rate_limited_wait_ms(&state, &rules, 0),
        Some(rules.backoff_base_ms)
    );
    // Negative (the connector never reports one): no header, as today.
    assert_eq!(rate_limited_wait_ms(&state, &rules, -1), None);
    let first = leased(&state, &rules, at(0));
    let step = answered(&first, &rules, too_many(-5_000), at(0));
    assert_eq!(step.state.status, S::Unknown);
    // Huge: the ceiling.
    assert_eq!(rate_limited_wait_ms(&state, &rules, i64::MAX), Some(10_000));
    // A ceiling of 0 turns the waiting off.
    let off = Rules {
        max_rate_limited_ms: 0,
        ..rules
    };
    assert_eq!(rate_limited_wait_ms(&state, &off, 1_000), None);
}

#[test]
fn a_non_idempotent_429_is_looked_up_after_the_wait_before_any_resend() {
    let rules = rules(E::NonIdempotent);
    let first = leased(&pending(), &rules, at(0));
    let step = answered(&first, &rules, too_many(2_000), at(100));
    let state = step.state.clone();
    assert_eq!(state.status, S::Unknown);
    assert_eq!(state.attempts, 0, "the attempt is given back");
    assert_eq!(
        state.due_at,
        Some(at(2_100)),
        "looked up once the wait is over"
    );
    assert!(
        state.lands_by.is_some(),
        "an absence counts only after the horizon"
    );
    assert!(
        step.actions.is_empty(),
        "no look before the upstream's time"
    );
    // The look is not taken before it is due.
    let claim = Event::Claim {
        job: ClaimJob::Look,
        hold_ms: 5_000,
    };
    assert!(matches!(
        apply(&state, &rules, &claim, at(1_000)),
        Err(Refusal::NotYetDue { .. })
    ));
    // Never resent blindly.
    assert_eq!(
        apply(&state, &rules, &Event::RetrySameKey, at(2_100)),
        Err(Refusal::BlindRetry)
    );
}

#[test]
fn a_tool_that_declares_rate_limited_answers_commit_nothing_is_resent_without_a_look() {
    let rules = Rules {
        rate_limited_commits_nothing: true,
        ..rules(E::NonIdempotent)
    };
    let first = leased(&pending(), &rules, at(0));
    let step = answered(&first, &rules, too_many(1_000), at(0));
    assert_eq!(step.state.status, S::Pending);
    assert_eq!(step.state.attempts, 0);
    assert!(
        !step.state.outcome_unknown,
        "nothing committed: not in flight"
    );
    assert!(!step.state.ambiguous_before);
    assert_eq!(step.state.lands_by, None);
    assert!(step.reason.contains("commits nothing"), "{}", step.reason);
}

#[test]
fn a_403_with_retry_after_waits_and_past_the_ceiling_is_refused_as_before() {
    let rules = Rules {
        rate_limited_commits_nothing: true,
        ..rules(E::Idempotent)
    };
    let secondary = |ms| DispatchOutcome::RateLimited {
        reason: "HTTP 403: secondary rate limit".into(),
        retry_after_ms: ms,
        refusal: true,
    };
    let first = leased(&pending(), &rules, at(0));
    let step = answered(&first, &rules, secondary(60_000), at(0));
    assert_eq!(step.state.status, S::Pending);
    assert_eq!(step.state.due_at, Some(at(10_000)), "capped at the ceiling");
    let second = leased(&step.state, &rules, at(10_000));
    let step = answered(&second, &rules, secondary(60_000), at(10_000));
    assert_eq!(step.state.status, S::Failed);
    assert_eq!(step.state.attempts, 1);
}

#[test]
fn a_rolled_back_run_settles_a_429_as_before() {
    let rules = rules(E::Idempotent);
    let first = leased(&pending(), &rules, at(0));
    let marked = apply_ok(
        &first,
        &rules,
        Event::MarkRollback {
            operator: Operator {
                actor: "alice".into(),
                reason: "abort".into(),
            },
        },
        at(0),
    )
    .state;
    let step = apply_ok(
        &marked,
        &rules,
        Event::Dispatched {
            epoch: first.lease.epoch,
            outcome: too_many(1_000),
            sent_at: at(0),
        },
        at(0),
    );
    assert_eq!(
        step.state.status,
        S::Unknown,
        "looked up, then cancelled or undone"
    );
    assert_eq!(step.state.rate_limited_ms, 0);
}

fn look_answered(state: &CommandState, rules: &Rules, retry_after_ms: Option<i64>) -> Step {
    let event = Event::Observed {
        observation: O::Inconclusive,
        external_ref: None,
        evidence: json!({"http_status": 429}),
        extra_refs: vec![],
        retry_after_ms,
        record: None,
    };
    apply_ok(state, rules, event, state.due_at.expect("due"))
}

#[test]
fn a_status_check_answered_429_waits_and_is_not_counted_as_inconclusive() {
    let rules = Rules {
        max_checks: 2,
        ..rules(E::NonIdempotent)
    };
    let first = leased(&pending(), &rules, at(0));
    let ambiguous = DispatchOutcome::Ambiguous {
        reason: "timeout".into(),
    };
    let mut state = answered(&first, &rules, ambiguous, at(0)).state;
    assert_eq!(state.status, S::Unknown);
    // Five rate-limited looks: more than max_checks, none counted, each waiting its delay.
    for n in 1..=5 {
        let due = state.due_at.expect("due");
        let step = look_answered(&state, &rules, Some(1_500));
        assert_eq!(step.state.status, S::Unknown);
        assert_eq!(step.state.checks, 0, "look {n} was not counted");
        assert_eq!(step.state.due_at, Some(due.plus_millis(1_500)));
        assert_eq!(step.evidence, json!({"http_status": 429}));
        state = step.state;
    }
    assert_eq!(state.rate_limited_ms, 7_500);
    // The ceiling holds over looks too: 2,500 ms more, then they count as today.
    let step = look_answered(&state, &rules, Some(5_000));
    assert_eq!(step.state.rate_limited_ms, 10_000);
    assert_eq!(step.state.checks, 0);
    let step = look_answered(&step.state, &rules, Some(1_000));
    assert_eq!(
        step.state.checks, 1,
        "past the ceiling: an inconclusive look"
    );
    let step = look_answered(&step.state, &rules, Some(1_000));
    assert_eq!(step.state.status, S::Stuck, "max_checks inconclusive looks");
}

#[test]
fn a_last_look_answered_429_waits_too() {
    let rules = rules(E::NonIdempotent);
    let mut state = pending();
    state.status = S::Confirmed;
    state.verify_pending = true;
    state.due_at = Some(at(0));
    let step = look_answered(&state, &rules, Some(2_000));
    assert_eq!(step.state.status, S::Confirmed);
    assert!(step.state.verify_pending);
    assert_eq!(step.state.due_at, Some(at(2_000)));
    assert_eq!(step.state.checks, 0);
    // A present answer carrying a Retry-After is still a present answer.
    let present = Event::Observed {
        observation: O::Present,
        external_ref: Some("w-1".into()),
        evidence: json!({}),
        extra_refs: vec![],
        retry_after_ms: Some(1_000),
        record: None,
    };
    let mut unknown = pending();
    unknown.status = S::Unknown;
    let step = apply_ok(&unknown, &rules, present, at(0));
    assert_eq!(step.state.status, S::Confirmed);
}
