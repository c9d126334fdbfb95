//! Tests of asynchronous tools (`[tool.async]`, `DispatchOutcome::Accepted`): an accepted call
//! waits in UNKNOWN until its deadline; its callback (an `Event::Evidence`) settles it, once;
//! at the deadline it is looked up or escalated, as the tool declares.

use serde_json::json;

use super::*;
use crate::command::{CommandState, CommandStatus as S, EffectSemantics as E};
use crate::evidence::EvidenceOutcome;

const T0: i64 = 1_000_000;
const DEADLINE: i64 = 600_000;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

fn go(state: &CommandState, rules: &Rules, event: Event, now: Timestamp) -> Step {
    apply(state, rules, &event, now).unwrap_or_else(|refusal| panic!("{event:?}: {refusal}"))
}

/// A payout tool: NON_IDEMPOTENT, answers 202, a status check, looked up at the deadline.
fn payout_rules() -> Rules {
    Rules {
        has_status_check: true,
        async_deadline_ms: Some(DEADLINE),
        ..Rules::defaults(E::NonIdempotent)
    }
}

/// The same, but a person decides at the deadline (`then = "escalate"`).
fn escalating_rules() -> Rules {
    Rules {
        async_escalate: true,
        ..payout_rules()
    }
}

fn accepted() -> DispatchOutcome {
    DispatchOutcome::Accepted {
        reason: "HTTP 202".into(),
        external_ref: None,
    }
}

/// The state after a dispatch at `at(0)` answered `outcome` at `at(100)`.
fn answered(rules: &Rules, outcome: DispatchOutcome) -> Step {
    let pending = CommandState::reserved(at(0), None, 10_000);
    let leased = go(
        &pending,
        rules,
        Event::Lease {
            owner: "d-1".into(),
        },
        at(0),
    )
    .state;
    go(
        &leased,
        rules,
        Event::Dispatched {
            epoch: leased.lease.epoch,
            outcome,
            sent_at: at(0),
        },
        at(100),
    )
}

fn callback(outcome: EvidenceOutcome) -> Event {
    Event::Evidence {
        source: "callback:payouts/send".into(),
        event_id: "cb-1".into(),
        outcome,
        external_ref: Some("po_1".into()),
        evidence: json!({"status": "whatever the upstream said"}),
    }
}

#[test]
fn an_accepted_dispatch_waits_in_unknown_until_the_deadline() {
    let step = answered(&payout_rules(), accepted());
    let state = &step.state;
    assert_eq!(state.status, S::Unknown);
    assert_eq!(
        state.due_at,
        Some(at(100 + DEADLINE)),
        "not looked up before"
    );
    assert_eq!(state.awaiting_callback, Some(at(100 + DEADLINE)));
    assert!(
        step.actions.is_empty(),
        "no look is asked for now: {:?}",
        step.actions
    );
    assert!(
        step.reason.starts_with("accepted (HTTP 202)"),
        "{}",
        step.reason
    );
    // Before the deadline, the sweep's look is not due.
    assert!(state.due_at.is_some_and(|due| due > at(DEADLINE)));
}

#[test]
fn an_accepted_answer_keeps_the_upstreams_reference_of_the_job() {
    let rules = payout_rules();
    let step = answered(
        &rules,
        DispatchOutcome::Accepted {
            reason: "HTTP 202".into(),
            external_ref: Some("job_7".into()),
        },
    );
    assert_eq!(step.state.status, S::Unknown);
    assert_eq!(
        step.state.external_ref.as_deref(),
        Some("job_7"),
        "the job's id is kept for its webhook to name"
    );
    assert!(step.state.awaiting_callback.is_some());
    // Its webhook, naming the job, confirms it with the same reference.
    let confirmed = go(
        &step.state,
        &rules,
        Event::Evidence {
            source: "psp".into(),
            event_id: "evt_1".into(),
            outcome: EvidenceOutcome::Present,
            external_ref: Some("job_7".into()),
            evidence: json!({"type": "job.succeeded"}),
        },
        at(5_000),
    );
    assert_eq!(confirmed.state.status, S::Confirmed);
    assert_eq!(confirmed.state.external_ref.as_deref(), Some("job_7"));
    // Without a reference in the answer, none is made up.
    assert_eq!(answered(&rules, accepted()).state.external_ref, None);
}

#[test]
fn an_accepted_outcome_stored_before_it_named_a_reference_still_reads() {
    let older = json!({"outcome": "accepted", "reason": "HTTP 202"});
    let read: DispatchOutcome = serde_json::from_value(older).expect("decodes");
    assert_eq!(read, accepted());
    // And one without a reference is written as before.
    assert_eq!(
        serde_json::to_value(accepted()).expect("encodes"),
        json!({"outcome": "accepted", "reason": "HTTP 202"})
    );
}

#[test]
fn a_tool_without_async_reads_an_accepted_answer_as_ambiguous() {
    let rules = Rules {
        has_status_check: true,
        ..Rules::defaults(E::NonIdempotent)
    };
    let step = answered(&rules, accepted());
    assert_eq!(step.state.status, S::Unknown);
    assert_eq!(step.state.awaiting_callback, None);
    assert_eq!(
        step.actions,
        vec![Action::Reconcile],
        "looked up as any ambiguity"
    );
}

#[test]
fn a_callback_saying_present_confirms_and_ends_the_wait() {
    let rules = payout_rules();
    let waiting = answered(&rules, accepted()).state;
    let step = go(
        &waiting,
        &rules,
        callback(EvidenceOutcome::Present),
        at(5_000),
    );
    assert_eq!(step.state.status, S::Confirmed, "{}", step.reason);
    assert_eq!(step.state.external_ref.as_deref(), Some("po_1"));
    assert_eq!(step.state.awaiting_callback, None);
    assert!(
        step.reason
            .starts_with("evidence callback:payouts/send/cb-1 (present)"),
        "{}",
        step.reason
    );
}

#[test]
fn a_callback_saying_failed_fails_at_once() {
    let rules = payout_rules();
    let waiting = answered(&rules, accepted()).state;
    let step = go(
        &waiting,
        &rules,
        callback(EvidenceOutcome::Failed),
        at(5_000),
    );
    assert_eq!(step.state.status, S::Failed, "{}", step.reason);
    assert_eq!(step.state.awaiting_callback, None);
    assert!(
        step.reason.contains("the accepted job failed"),
        "{}",
        step.reason
    );
    assert_eq!(
        step.evidence,
        json!({"status": "whatever the upstream said"})
    );
}

#[test]
fn an_absence_before_the_deadline_proves_nothing() {
    // The job may still be running: a NON_IDEMPOTENT effect is not sent again on it, and the
    // command is looked at again at the deadline, as a status check's absence would be.
    let rules = payout_rules();
    let waiting = answered(&rules, accepted()).state;
    let step = go(
        &waiting,
        &rules,
        callback(EvidenceOutcome::Absent),
        at(5_000),
    );
    assert_eq!(step.state.status, S::Unknown, "{}", step.reason);
    assert_eq!(step.state.due_at, Some(at(100 + DEADLINE)));
    assert!(step.reason.contains("may still land"), "{}", step.reason);
}

#[test]
fn a_settled_command_takes_a_second_event_only_as_its_last_look() {
    let rules = payout_rules();
    let waiting = answered(&rules, accepted()).state;
    let confirmed = go(
        &waiting,
        &rules,
        callback(EvidenceOutcome::Present),
        at(5_000),
    )
    .state;
    // A NON_IDEMPOTENT effect settled through UNKNOWN owes one last look; a second
    // `present` (the upstream's webhook after its callback) is taken as that look, and then
    // nothing more is. (The same token used twice never gets here: the evidence store
    // answers it as a replay.)
    assert!(confirmed.verify_pending);
    let looked = go(
        &confirmed,
        &rules,
        callback(EvidenceOutcome::Present),
        at(6_000),
    )
    .state;
    assert_eq!(looked.status, S::Confirmed);
    assert!(!looked.verify_pending);
    let again = apply(
        &looked,
        &rules,
        &callback(EvidenceOutcome::Present),
        at(7_000),
    );
    assert!(
        again.is_err(),
        "a settled command takes no third event: {again:?}"
    );
    let failed = go(
        &waiting,
        &rules,
        callback(EvidenceOutcome::Failed),
        at(5_000),
    )
    .state;
    assert!(
        apply(
            &failed,
            &rules,
            &callback(EvidenceOutcome::Present),
            at(6_000)
        )
        .is_err()
    );
}

#[test]
fn at_the_deadline_a_look_tool_is_looked_up() {
    let rules = payout_rules();
    let waiting = answered(&rules, accepted()).state;
    assert_eq!(
        look_for(&waiting, &rules, true, at(100 + DEADLINE)),
        Look::StatusCheck
    );
    // The look's answer decides as any look's: present confirms.
    let step = go(
        &waiting,
        &rules,
        Event::Observed {
            observation: crate::command::Observation::Present,
            external_ref: Some("po_1".into()),
            evidence: json!({"http_status": 200}),
            extra_refs: vec![],
            retry_after_ms: None,
            record: None,
        },
        at(100 + DEADLINE),
    );
    assert_eq!(step.state.status, S::Confirmed, "{}", step.reason);
    assert_eq!(step.state.awaiting_callback, None);
}

#[test]
fn at_the_deadline_an_escalating_tool_goes_to_a_person() {
    let rules = escalating_rules();
    let waiting = answered(&rules, accepted()).state;
    let Look::GiveUp(reason) = look_for(&waiting, &rules, true, at(100 + DEADLINE)) else {
        panic!("an escalating tool is not looked up at the deadline");
    };
    assert!(reason.contains("by the deadline"), "{reason}");
    let step = go(
        &waiting,
        &rules,
        Event::GiveUp { reason },
        at(100 + DEADLINE),
    );
    assert_eq!(step.state.status, S::Stuck);
    assert!(step.state.escalated);
    assert_eq!(step.state.awaiting_callback, None);
}

#[test]
fn a_callback_after_the_deadline_still_settles_a_command_still_unknown() {
    // The look at the deadline found nothing yet (absent, waiting out the settle interval):
    // the callback that then comes answers.
    let rules = payout_rules();
    let waiting = answered(&rules, accepted()).state;
    let looked = go(
        &waiting,
        &rules,
        Event::Observed {
            observation: crate::command::Observation::Absent,
            external_ref: None,
            evidence: json!({"http_status": 404}),
            extra_refs: vec![],
            retry_after_ms: None,
            record: None,
        },
        at(100 + DEADLINE),
    )
    .state;
    assert_eq!(looked.status, S::Unknown);
    let step = go(
        &looked,
        &rules,
        callback(EvidenceOutcome::Present),
        at(101 + DEADLINE),
    );
    assert_eq!(step.state.status, S::Confirmed, "{}", step.reason);
}
