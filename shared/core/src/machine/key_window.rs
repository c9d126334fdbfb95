//! Tests of the provider's key window (`idempotency_key_ttl_ms`): an IDEMPOTENT effect is
//! retried with its key only while the upstream still remembers it; past the window, a
//! command whose earlier attempt may have committed is looked up first or goes to a person.

use serde_json::json;

use super::*;
use crate::command::{CommandState, CommandStatus as S, EffectSemantics as E};

const T0: i64 = 1_000_000;
const TTL: i64 = 60_000;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

fn go(state: &CommandState, rules: &Rules, event: Event, now: Timestamp) -> Step {
    apply(state, rules, &event, now).unwrap_or_else(|refusal| panic!("{event:?}: {refusal}"))
}

/// An SQS-like tool: IDEMPOTENT through its deduplication id, remembered for a minute, no
/// status check.
fn queue_rules() -> Rules {
    Rules {
        max_attempts: 5,
        idempotency_key_ttl_ms: Some(TTL),
        clock_skew_ms: 500,
        ..Rules::defaults(E::Idempotent)
    }
}

fn lease(state: &CommandState, rules: &Rules, now: Timestamp) -> CommandState {
    go(
        state,
        rules,
        Event::Lease {
            owner: "d-1".into(),
        },
        now,
    )
    .state
}

fn dispatched(state: &CommandState, outcome: DispatchOutcome, sent: Timestamp) -> Event {
    Event::Dispatched {
        epoch: state.lease.epoch,
        outcome,
        sent_at: sent,
    }
}

fn timeout() -> DispatchOutcome {
    DispatchOutcome::Ambiguous {
        reason: "timeout".into(),
    }
}

/// UNKNOWN after a first attempt sent at `at(0)` that timed out.
fn unknown(rules: &Rules) -> CommandState {
    let leased = lease(&CommandState::reserved(at(0), None, 10_000), rules, at(0));
    let unknown = go(
        &leased,
        rules,
        dispatched(&leased, timeout(), at(0)),
        at(1_000),
    )
    .state;
    assert_eq!(unknown.status, S::Unknown);
    assert_eq!(
        unknown.key_sent_at,
        Some(at(0)),
        "the key went out at the first attempt"
    );
    unknown
}

#[test]
fn within_the_window_the_key_is_resent() {
    let rules = queue_rules();
    let unknown = unknown(&rules);
    assert_eq!(
        look_for(&unknown, &rules, true, at(2_000)),
        Look::RetrySameKey
    );
    let retry = go(&unknown, &rules, Event::RetrySameKey, at(2_000));
    assert_eq!(retry.state.status, S::Pending);
}

#[test]
fn past_the_window_a_tool_without_a_lookup_goes_to_a_person() {
    let rules = queue_rules();
    let unknown = unknown(&rules);
    // The skew bound counts against the window: at TTL - skew it is already closed.
    let Look::GiveUp(reason) = look_for(&unknown, &rules, true, at(TTL - 500)) else {
        panic!("past the window the key is not resent blindly");
    };
    assert!(
        reason.contains("forgets idempotency keys after 60000 ms"),
        "{reason}"
    );
    let stuck = go(&unknown, &rules, Event::GiveUp { reason }, at(TTL));
    assert_eq!(stuck.state.status, S::Stuck);
    assert!(stuck.state.escalated);
    // The machine itself refuses a resend whose backoff would reach past the window.
    let late = go(&unknown, &rules, Event::RetrySameKey, at(TTL - 1_500));
    assert_eq!(late.state.status, S::Stuck, "{}", late.reason);
}

#[test]
fn past_the_window_a_tool_with_a_lookup_looks_before_it_resends() {
    let rules = Rules {
        has_status_check: true,
        ..queue_rules()
    };
    let unknown = unknown(&rules);
    assert_eq!(
        look_for(&unknown, &rules, true, at(TTL * 2)),
        Look::StatusCheck
    );
    // An attempt that was not sent, after one whose outcome is unknown, goes back to a look
    // rather than to PENDING.
    let retry = go(&unknown, &rules, Event::RetrySameKey, at(1_000)).state;
    assert!(retry.outcome_unknown);
    let leased = lease(&retry, &rules, at(TTL + 1_000));
    let not_sent = go(
        &leased,
        &rules,
        dispatched(
            &leased,
            DispatchOutcome::NotSent {
                reason: "connection refused".into(),
            },
            at(TTL + 1_000),
        ),
        at(TTL + 1_100),
    );
    assert_eq!(not_sent.state.status, S::Unknown, "{}", not_sent.reason);
    assert_eq!(not_sent.actions, vec![Action::Reconcile]);
}

#[test]
fn past_the_window_a_replay_of_an_unknown_outcome_needs_evidence() {
    let rules = queue_rules();
    let unknown = unknown(&rules);
    let stuck = go(
        &unknown,
        &rules,
        Event::GiveUp {
            reason: "no lookup".into(),
        },
        at(TTL + 1),
    )
    .state;
    let operator = Operator {
        actor: "alice".into(),
        reason: "send it again".into(),
    };
    assert_eq!(
        apply(
            &stuck,
            &rules,
            &Event::Replay {
                operator: operator.clone(),
                evidence: None,
            },
            at(TTL + 2),
        ),
        Err(Refusal::ReplayNeedsEvidence)
    );
    let replayed = go(
        &stuck,
        &rules,
        Event::Replay {
            operator,
            evidence: Some(json!({"checked": "the queue holds no such message"})),
        },
        at(TTL + 3),
    );
    assert_eq!(replayed.state.status, S::Pending);
}

#[test]
fn a_tool_without_a_window_and_an_unsent_key_are_never_held_back() {
    let forever = Rules {
        idempotency_key_ttl_ms: None,
        ..queue_rules()
    };
    let unknown = unknown(&forever);
    assert_eq!(
        look_for(&unknown, &forever, true, at(TTL * 100)),
        Look::RetrySameKey
    );
    // A command whose key never went out has nothing an upstream could remember.
    let rules = queue_rules();
    let fresh = CommandState::reserved(at(0), None, 10_000);
    assert!(!rules.key_forgotten_by(&fresh, at(TTL * 100)));
    let leased = lease(&fresh, &rules, at(0));
    let unsent = go(
        &leased,
        &rules,
        dispatched(
            &leased,
            DispatchOutcome::NotSent {
                reason: "refused".into(),
            },
            at(0),
        ),
        at(10),
    )
    .state;
    assert_eq!(unsent.key_sent_at, None);
    assert_eq!(unsent.status, S::Pending);
}
