//! The happy path end to end: an agent submits a wire, an email, a ticket and a search over
//! HTTP; the embedded pipeline dispatches each to the demo upstream with its keys and records
//! the upstream's answer; the run's audit chain verifies and tells the story.

use reqwest::StatusCode;
use sluice_core::command::{CommandStatus, EffectSemantics};
use sluice_tests::*;
use sluice_upstream::Faults;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_tools_confirm_with_the_upstream_reference_and_the_audit_chain_verifies() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-happy";
    let wire = h
        .agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-1", 125_000),
        ))
        .await;
    assert_eq!(wire.status(), CommandStatus::Pending);
    assert_eq!(wire.command_key.to_string(), "d-1/payments/wire/0");
    assert_eq!(
        wire.idempotency_key.to_string(),
        "r-happy/d-1/payments/wire/0"
    );
    assert_eq!(wire.semantics, EffectSemantics::NonIdempotent);
    assert_eq!(
        wire.business_key
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("acc-1:b-9:125000:2026-11-22")
    );
    h.agent
        .submit_created(&effect(run, 2, "email/send", 0, email_args("paid")))
        .await;
    h.agent
        .submit_created(&effect(run, 3, "tickets/create", 0, ticket_args("refund")))
        .await;
    h.agent
        .submit_created(&effect(
            run,
            4,
            "search/lookup",
            0,
            search_args("refund policy"),
        ))
        .await;

    let wire = h.agent.wait_settled(run, "d-1/payments/wire/0").await;
    let email = h.agent.wait_settled(run, "d-2/email/send/0").await;
    let ticket = h.agent.wait_settled(run, "d-3/tickets/create/0").await;
    let search = h.agent.wait_settled(run, "d-4/search/lookup/0").await;
    for command in [&wire, &email, &ticket, &search] {
        assert_eq!(
            command.status(),
            CommandStatus::Confirmed,
            "{}: {command:?}",
            command.command_key
        );
        assert_eq!(command.state.attempts, 1, "{}", command.command_key);
        assert!(!command.state.escalated);
    }
    // The references are the upstream's ids, read from the dispatch answers.
    assert_eq!(wire.state.external_ref.as_deref(), Some("w-1"));
    assert_eq!(email.state.external_ref.as_deref(), Some("m-1"));
    assert_eq!(ticket.state.external_ref.as_deref(), Some("t-1"));
    let hits = search
        .state
        .result
        .as_ref()
        .expect("the search result is stored")["results"]
        .as_array()
        .expect("the search answered hits")
        .len();
    assert_eq!(hits, 2, "the stored result is the upstream's answer");

    // The world changed exactly once per effect.
    let stats = h.upstream.stats();
    assert_eq!(stats.wires, 1, "the bank saw exactly one wire: {stats:?}");
    assert_eq!(stats.standing_wires("acc-1:b-9:125000:2026-11-22"), 1);
    assert_eq!((stats.emails, stats.tickets, stats.searches), (1, 1, 1));
    assert_eq!(stats.faults.total(), 0);

    // The bank saw the wire contract's headers: the idempotency key from the journal position and
    // the business key from the arguments.
    let booked: serde_json::Value =
        reqwest::get(format!("{}/bank/wires/w-1", h.upstream.base_url()))
            .await
            .expect("the bank answers")
            .json()
            .await
            .expect("a wire as JSON");
    assert_eq!(booked["idempotency_key"], "r-happy/d-1/payments/wire/0");
    assert_eq!(booked["run_id"], "r-happy");
    assert_eq!(booked["command_key"], "d-1/payments/wire/0");
    assert_eq!(booked["business_key"], "acc-1:b-9:125000:2026-11-22");

    // The chain verifies and records the wire's life: reserved, leased, confirmed.
    let trail = h.audit(run).await;
    assert_eq!(
        trail.path("d-1/payments/wire/0"),
        vec![
            (None, Some(CommandStatus::Pending)),
            (Some(CommandStatus::Pending), Some(CommandStatus::Leased)),
            (Some(CommandStatus::Leased), Some(CommandStatus::Confirmed)),
        ],
        "{:#?}",
        trail.describe("d-1/payments/wire/0")
    );
    let actors: Vec<&str> = trail
        .of("d-1/payments/wire/0")
        .iter()
        .map(|e| e.record.actor.as_str())
        .collect();
    assert_eq!(actors, ["producer", "dispatcher", "dispatcher"]);
    // The tools that may be called twice with one key were leased by their reservation: one
    // write fewer, and the chain says so.
    for key in [
        "d-2/email/send/0",
        "d-3/tickets/create/0",
        "d-4/search/lookup/0",
    ] {
        assert_eq!(
            trail.path(key),
            vec![
                (None, Some(CommandStatus::Leased)),
                (Some(CommandStatus::Leased), Some(CommandStatus::Confirmed)),
            ],
            "{:#?}",
            trail.describe(key)
        );
        assert_eq!(trail.of(key)[0].record.actor, "producer");
    }
    assert_eq!(
        trail.entries.len(),
        3 + 3 * 2,
        "three records for the wire, two for each of the others"
    );

    // A resubmission after the fact changes nothing: same command, 200, no second wire.
    let again = h
        .agent
        .submit(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-1", 125_000),
        ))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.command().status(), CommandStatus::Confirmed);
    assert_eq!(h.upstream.stats().wires, 1);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_effect_is_scheduled_and_dispatched_when_due_not_before() {
    const DELAY_MS: i64 = 400;
    let h = Harness::start(Faults::none(), |c| c).await;
    let (run, key) = ("r-later", "d-1/tickets/create/0");
    let mut submission = effect(run, 1, "tickets/create", 0, ticket_args("later"));
    submission["delay_ms"] = serde_json::json!(DELAY_MS);
    let scheduled = h.agent.submit_created(&submission).await;
    assert_eq!(scheduled.status(), CommandStatus::Scheduled);
    let not_before = scheduled
        .not_before
        .expect("a scheduled command has a time");
    assert_eq!(not_before.millis_since(scheduled.created_at), DELAY_MS);

    let ticket = h.agent.wait_settled(run, key).await;
    assert_eq!(ticket.status(), CommandStatus::Confirmed, "{ticket:?}");
    let trail = h.audit(run).await;
    assert_eq!(
        trail.path(key),
        vec![
            (None, Some(CommandStatus::Scheduled)),
            (Some(CommandStatus::Scheduled), Some(CommandStatus::Pending)),
            (Some(CommandStatus::Pending), Some(CommandStatus::Leased)),
            (Some(CommandStatus::Leased), Some(CommandStatus::Confirmed)),
        ],
        "{:#?}",
        trail.describe(key)
    );
    let leased = trail.find(key, CommandStatus::Pending, CommandStatus::Leased);
    assert!(
        leased.record.at >= not_before,
        "dispatched at {} before its time {not_before}",
        leased.record.at
    );
    assert_eq!(h.upstream.stats().tickets, 1);
    h.stop().await;
}
