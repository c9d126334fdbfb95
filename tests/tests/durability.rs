//! Work the pipeline owes after it answered, across a crash (docs/architecture.md, "Delivery": the
//! ledger, not the bus, is the source of truth; a lost message is harmless because the sweeps
//! republish what stalls; nothing accepted is lost).
//!
//! Two kinds of owed work live only as bus messages: the clean-up of an extra commit found by a
//! `duplicate` observation, and a run rollback answered 202. The embedded bus is in memory, so
//! a restart loses whatever it had not handled yet. Each test holds that work in flight against
//! an endpoint that hangs (a [`BlackHole`]), kills the pipeline, starts a new one on the same
//! ledger with the endpoint healthy, and expects the owed work to be done — or at least to be
//! visible to a person — within a bound.

use std::time::Duration;

use reqwest::StatusCode;
use sluice_core::command::CommandStatus::*;
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

/// How long the new pipeline gets to pick up the owed work: many sweep intervals.
const RECOVERY: Duration = Duration::from_secs(8);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_clean_up_cut_short_by_a_crash_is_resumed_or_escalated_after_restart() {
    init_tracing();
    let hole = BlackHole::start().await;
    let upstream = start_upstream(Faults::none()).await;
    // A compensation is held for twice its timeout before the sweep may redo it, so the
    // recovery below is bounded by the (short) compensate timeout.
    let short = |c: CatalogEdit| {
        c.dispatch("payments/wire", "timeout_ms", 400)
            .policy("payments/wire", "lease_ttl_ms", 2_000)
            .compensate("payments/wire", "timeout_ms", 1_000)
    };
    // Before the crash the bank's reversal endpoint hangs; after it, it works.
    let hanging = short(CatalogEdit::example(&upstream.base_url()))
        .compensate(
            "payments/wire",
            "url",
            format!("{}/bank/wires/{{external_ref}}/reverse", hole.base_url()),
        )
        .build();
    let healthy = short(CatalogEdit::example(&upstream.base_url())).build();
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());

    let (run, key) = ("r-dup-crash", "d-1/payments/wire/0");
    let business_key = wire_business_key("acc-dup-crash", 5_000);
    let preloaded = reqwest::Client::new()
        .post(format!("{}/bank/wires", upstream.base_url()))
        .header("X-Sluice-Business-Key", &business_key)
        .json(&wire_args("acc-dup-crash", 5_000))
        .send()
        .await
        .expect("the bank answers");
    assert_eq!(preloaded.status(), StatusCode::CREATED);
    upstream
        .set_faults(Faults::none().with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThen5xx, 1.0),
        ))
        .expect("valid faults");

    let a = Detached::start(&config, hanging).await;
    let agent_a = Agent::new(&a.url);
    agent_a
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-dup-crash", 5_000),
        ))
        .await;
    let confirmed = agent_a.wait_settled(run, key).await;
    assert_eq!(confirmed.status(), Confirmed, "{confirmed:?}");
    assert_eq!(upstream.stats().standing_wires(&business_key), 2);
    eventually(
        "the reversal of the extra wire to be in flight",
        DEADLINE,
        || async { (hole.accepted() >= 1).then_some(()) },
    )
    .await;
    a.crash();

    upstream.set_faults(Faults::none()).expect("valid faults");
    let b = start_pipeline(&config, healthy).await;
    let agent_b = Agent::new(&b.url());
    let handled = poll_for(RECOVERY, || async {
        let command = agent_b.get(run, key).await;
        (upstream.stats().standing_wires(&business_key) == 1 || command.state.escalated)
            .then_some(command)
    })
    .await;
    let command = agent_b.get(run, key).await;
    let trail = verified_audit(b.ctx.ledger.as_ref(), run).await;
    assert!(
        handled.is_some(),
        "BUG: the clean-up of a duplicate commit is not durable. The reconciler stored \
         UNKNOWN -> CONFIRMED (duplicate) with no due time and left the reversal of the extra \
         wire to a compensate-topic message only; the crash lost that message, and {RECOVERY:?} \
         after the restart the extra wire still stands ({} standing for {business_key}), the \
         command is {} with escalated = {}, and nothing in the ledger will bring it back. \
         Audit: {:#?}",
        upstream.stats().standing_wires(&business_key),
        command.status(),
        command.state.escalated,
        trail.describe(key)
    );
    b.stop().await.expect("pipeline B stops cleanly");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_answered_202_before_a_crash_is_carried_out_after_restart() {
    init_tracing();
    let hole = BlackHole::start().await;
    let upstream = start_upstream(Faults::none()).await;
    // Before the crash closing a ticket hangs (for 10 s, longer than the test needs).
    let hanging = CatalogEdit::example(&upstream.base_url())
        .compensate(
            "tickets/create",
            "url",
            format!("{}/tickets/{{external_ref}}/close", hole.base_url()),
        )
        .compensate("tickets/create", "timeout_ms", 10_000)
        .build();
    let healthy = example_catalog(&upstream.base_url());
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = test_config(data.path());
    // One partition: the second run's rollback queues behind the first run's hanging one.
    config.bus.partitions = 1;

    let a = Detached::start(&config, hanging).await;
    let agent_a = Agent::new(&a.url);
    let (run_x, ticket) = ("r-rb-crash-x", "d-1/tickets/create/0");
    let (run_y, wire) = ("r-rb-crash-y", "d-1/payments/wire/0");
    agent_a
        .submit_created(&effect(run_x, 1, "tickets/create", 0, ticket_args("x")))
        .await;
    agent_a
        .submit_created(&effect(
            run_y,
            1,
            "payments/wire",
            0,
            wire_args("acc-rb-crash", 777),
        ))
        .await;
    assert_eq!(
        agent_a.wait_settled(run_x, ticket).await.status(),
        Confirmed
    );
    assert_eq!(agent_a.wait_settled(run_y, wire).await.status(), Confirmed);

    let first = agent_a.rollback(run_x, "abort x").await;
    assert_eq!(first.status, StatusCode::ACCEPTED, "{}", first.text);
    eventually("run x's compensation to be in flight", DEADLINE, || async {
        (hole.accepted() >= 1).then_some(())
    })
    .await;
    let second = agent_a.rollback(run_y, "abort y").await;
    assert_eq!(second.status, StatusCode::ACCEPTED, "{}", second.text);
    a.crash();

    let b = start_pipeline(&config, healthy).await;
    let agent_b = Agent::new(&b.url());
    let compensated = poll_for(RECOVERY, || async {
        let command = agent_b.get(run_y, wire).await;
        (command.status() != Confirmed).then_some(command)
    })
    .await;
    let trail = verified_audit(b.ctx.ledger.as_ref(), run_y).await;
    let rollback_recorded = trail
        .entries
        .iter()
        .any(|e| e.record.reason.starts_with("run rollback"));
    assert!(
        compensated.is_some(),
        "BUG: a rollback answered 202 Accepted is not durable. The producer only publishes a \
         compensate-topic message (nothing is written to the ledger: rollback recorded in run \
         {run_y}'s audit chain = {rollback_recorded}); the crash lost the message, and \
         {RECOVERY:?} after the restart {run_y}/{wire} is still CONFIRMED, the wire still \
         stands ({} standing), and no sweep will ever roll it back. Audit: {:#?}",
        upstream
            .stats()
            .standing_wires(&wire_business_key("acc-rb-crash", 777)),
        trail.describe(wire)
    );
    b.stop().await.expect("pipeline B stops cleanly");
    upstream.shutdown().await;
}
