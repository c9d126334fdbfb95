//! Restarts end to end (docs/architecture.md, "Delivery"): the ledger, not the bus, is the source
//! of truth. A pipeline killed with effects in flight is replaced by a new one on the same data
//! directory — a new embedded bus, so every message of the first is gone — and its sweeps must
//! bring every accepted command to an end without committing a NON_IDEMPOTENT effect twice. A
//! graceful stop must not lose a command it answered 201 for.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use reqwest::StatusCode;
use sluice_core::command::CommandStatus::{self, *};
use sluice_core::ids::ArgsHash;
use sluice_tests::*;
use sluice_upstream::{FaultKind, FaultRates, Faults};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_killed_mid_flight_is_recovered_by_the_next_without_a_double_commit() {
    const WIRES: usize = 20;
    const EMAILS: usize = 20;
    init_tracing();
    // The bank and the mail service commit, then hold the answer far past the timeout.
    let slow = Faults::uniform(FaultRates::only(FaultKind::CommitThenTimeout, 1.0))
        .with_timeout_sleep(std::time::Duration::from_secs(10));
    let upstream = start_upstream(slow).await;
    let catalog = CatalogEdit::example(&upstream.base_url())
        .dispatch("payments/wire", "timeout_ms", 2_000)
        .policy("payments/wire", "lease_ttl_ms", 2_500)
        .policy("payments/wire", "settle_ms", 300)
        .dispatch("email/send", "timeout_ms", 2_000)
        .policy("email/send", "lease_ttl_ms", 2_500)
        .build();
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = test_config(data.path());
    // Many partitions, so most runs are in flight at once rather than queued behind another.
    config.bus.partitions = 64;

    // Pipeline A: every effect in its own run; one batch.
    let a = Detached::start(&config, catalog.clone()).await;
    let agent_a = Agent::new(&a.url);
    let mut effects = Vec::new();
    let mut expected: Vec<(String, String)> = Vec::new();
    for i in 0..WIRES {
        let run = format!("r-crash-w{i}");
        effects.push(effect(
            &run,
            1,
            "payments/wire",
            0,
            wire_args(&format!("acc-crash-{i}"), 5_000),
        ));
        expected.push((run, "d-1/payments/wire/0".into()));
    }
    for i in 0..EMAILS {
        let run = format!("r-crash-m{i}");
        effects.push(effect(
            &run,
            1,
            "email/send",
            0,
            email_args(&format!("crash {i}")),
        ));
        expected.push((run, "d-1/email/send/0".into()));
    }
    agent_a.batch_created(effects).await;
    // Wait until half of them have reached the upstream (committed, answers held), then kill A.
    eventually("effects to be in flight", DEADLINE, || async {
        let stats = upstream.stats();
        (stats.wires + stats.emails >= 20).then_some(())
    })
    .await;
    a.crash();

    // What the crash left in the ledger, read directly.
    let ledger = open_ledger(data.path());
    let mut at_crash: BTreeMap<CommandStatus, usize> = BTreeMap::new();
    for (run, key) in &expected {
        let command = ledger_get(&ledger, run, key)
            .await
            .unwrap_or_else(|| panic!("{run}/{key} was answered 201, so it is in the ledger"));
        *at_crash.entry(command.status()).or_default() += 1;
    }
    assert!(
        at_crash.get(&Leased).copied().unwrap_or(0) >= 20,
        "the crash left effects in flight: {at_crash:?}"
    );
    drop(ledger);

    // Pipeline B on the same directory, with a fresh (empty) bus, and an upstream that behaves.
    upstream.set_faults(Faults::none()).expect("valid faults");
    let b_started_at = sluice_core::time::Clock::now(&sluice_core::time::SystemClock);
    let b = start_pipeline(&config, catalog).await;
    let agent_b = Agent::new(&b.url());
    let mut statuses: BTreeMap<CommandStatus, usize> = BTreeMap::new();
    for (run, key) in &expected {
        let command = agent_b.wait_settled_within(run, key, RECOVERY).await;
        assert_ne!(command.status(), Blocked, "{run}/{key}");
        *statuses.entry(command.status()).or_default() += 1;
    }
    assert_eq!(
        statuses.get(&Confirmed).copied(),
        Some(WIRES + EMAILS),
        "after the restart every command is confirmed (the crash left {at_crash:?}): {statuses:?}"
    );

    let stats = upstream.stats();
    assert_no_double_commit(&stats);
    assert_eq!(
        stats.wires, WIRES as u64,
        "no wire was sent twice: {stats:?}"
    );
    for i in 0..WIRES {
        assert_eq!(
            stats.standing_wires(&wire_business_key(&format!("acc-crash-{i}"), 5_000)),
            1
        );
    }
    assert_eq!(stats.emails, EMAILS as u64, "one email each: {stats:?}");

    // Every chain verifies; a wire that was in flight went through the lease-expiry path.
    let mut via_expiry = 0;
    for (run, key) in &expected {
        let trail = verified_audit(b.ctx.ledger.as_ref(), run).await;
        let path = trail.path(key);
        assert!(
            matches!(path.last(), Some((_, Some(Confirmed)))),
            "{run}/{key}: {:#?}",
            trail.describe(key)
        );
        if path.contains(&(Some(Leased), Some(Unknown))) {
            let expired = trail.find(key, Leased, Unknown);
            // The crash stops A's runtime in the background (`Detached::crash`): its HTTP
            // connections close first, and a dispatcher polled once more in between reads its
            // held call's failure as an ambiguous outcome and writes it (the ledger's writer is
            // a thread of its own) before B starts — a process dying just after that write,
            // reconciled from there the same way. Anything else moving a lease A held to
            // UNKNOWN is the sweep's expiry.
            let written_while_dying = expired.record.actor == "dispatcher"
                && expired.record.reason.starts_with("outcome ambiguous")
                && expired.record.at < b_started_at;
            assert!(
                expired.record.actor == "sweep" || written_while_dying,
                "{:#?}",
                trail.describe(key)
            );
            if key.contains("/payments/wire/") {
                // Resolved from evidence: present, or absent twice a settle interval apart (the
                // crash came between the lease and the request) and only then sent again.
                let from_evidence = trail.of(key).iter().any(|e| {
                    (e.record.to == Some(Confirmed) && e.record.reason == "status check: present")
                        || (e.record.from == Some(Unknown)
                            && e.record.to == Some(Pending)
                            && e.record.reason.contains("absent, confirmed"))
                });
                assert!(from_evidence, "{:#?}", trail.describe(key));
            }
            via_expiry += 1;
        }
    }
    assert!(
        via_expiry >= 20,
        "leases held at the crash expired and were reconciled ({via_expiry})"
    );
    b.stop().await.expect("pipeline B stops cleanly");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_keeps_every_command_it_accepted() {
    const SUBMITTERS: usize = 4;
    const BEFORE_STOP: usize = 40;
    init_tracing();
    let upstream = start_upstream(Faults::none()).await;
    let catalog = example_catalog(&upstream.base_url());
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());
    let a = start_pipeline(&config, catalog.clone()).await;
    let agent = Agent::new(&a.url());

    // Agents keep submitting while the pipeline stops; every 201 is remembered.
    let accepted_count = Arc::new(AtomicUsize::new(0));
    let stop_submitting = Arc::new(AtomicBool::new(false));
    let mut submitters = Vec::new();
    for s in 0..SUBMITTERS {
        let (agent, accepted_count, stop_submitting) = (
            agent.clone(),
            Arc::clone(&accepted_count),
            Arc::clone(&stop_submitting),
        );
        submitters.push(tokio::spawn(async move {
            let run = format!("r-grace-{s}");
            let mut accepted: Vec<(String, String, ArgsHash)> = Vec::new();
            for decision in 0..500u32 {
                if stop_submitting.load(Ordering::SeqCst) {
                    break;
                }
                let (tool, args) = match decision % 3 {
                    0 => (
                        "payments/wire",
                        wire_args(&format!("acc-grace-{s}-{decision}"), 4_200),
                    ),
                    1 => ("email/send", email_args(&format!("grace {decision}"))),
                    _ => ("tickets/create", ticket_args(&format!("grace {decision}"))),
                };
                let Ok(answer) = agent
                    .try_submit(&effect(&run, decision, tool, 0, args))
                    .await
                else {
                    break; // the producer stopped listening
                };
                match answer.status {
                    StatusCode::CREATED => {
                        let command = answer.command();
                        accepted.push((
                            run.clone(),
                            command.command_key.to_string(),
                            command.args_hash,
                        ));
                        accepted_count.fetch_add(1, Ordering::SeqCst);
                    }
                    // A request the stopping producer could no longer record is not accepted.
                    status => assert!(
                        status.is_server_error(),
                        "a fresh key answered {status}: {}",
                        answer.text
                    ),
                }
            }
            accepted
        }));
    }
    eventually("submissions to be accepted", DEADLINE, || async {
        (accepted_count.load(Ordering::SeqCst) >= BEFORE_STOP).then_some(())
    })
    .await;
    a.stop().await.expect("every service stops cleanly");
    stop_submitting.store(true, Ordering::SeqCst);
    let mut accepted = Vec::new();
    for submitter in submitters {
        accepted.extend(submitter.await.expect("a submitter finishes"));
    }
    assert!(accepted.len() >= BEFORE_STOP);

    // Reopened: every accepted command is there, with the arguments it was accepted with.
    let ledger = open_ledger(data.path());
    for (run, key, hash) in &accepted {
        let command = ledger_get(&ledger, run, key)
            .await
            .unwrap_or_else(|| panic!("{run}/{key} was answered 201 but is not in the ledger"));
        assert_eq!(&command.args_hash, hash, "{run}/{key}");
    }
    drop(ledger);

    // And a new pipeline brings each to its end: nothing accepted is lost.
    let b = start_pipeline(&config, catalog).await;
    let agent_b = Agent::new(&b.url());
    for (run, key, _) in &accepted {
        let command = agent_b.wait_settled_within(run, key, RECOVERY).await;
        assert_eq!(command.status(), Confirmed, "{run}/{key}: {command:?}");
    }
    let wires = accepted
        .iter()
        .filter(|(_, key, _)| key.contains("/payments/wire/"))
        .count();
    let stats = upstream.stats();
    assert_eq!(
        stats.wires, wires as u64,
        "each accepted wire sent once: {stats:?}"
    );
    assert_no_double_commit(&stats);
    b.stop().await.expect("pipeline B stops cleanly");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_left_by_a_crash_before_the_wire_reached_the_bank_is_redispatched_once() {
    init_tracing();
    // Before the crash the wire goes to an endpoint that swallows it: sent, never booked.
    let hole = BlackHole::start().await;
    let upstream = start_upstream(Faults::none()).await;
    let tune = |c: CatalogEdit| {
        c.dispatch("payments/wire", "timeout_ms", 800)
            .policy("payments/wire", "lease_ttl_ms", 1_000)
            .policy("payments/wire", "settle_ms", 300)
    };
    let swallowing = tune(CatalogEdit::example(&upstream.base_url()))
        .dispatch(
            "payments/wire",
            "url",
            format!("{}/bank/wires", hole.base_url()),
        )
        .build();
    let healthy = tune(CatalogEdit::example(&upstream.base_url())).build();
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());

    let a = Detached::start(&config, swallowing).await;
    let (run, key) = ("r-lost-lease", "d-1/payments/wire/0");
    Agent::new(&a.url)
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-lost", 5_000),
        ))
        .await;
    eventually("the wire to be in flight", DEADLINE, || async {
        (hole.accepted() >= 1).then_some(())
    })
    .await;
    a.crash();

    let b = start_pipeline(&config, healthy).await;
    let wire = Agent::new(&b.url()).wait_settled(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(
        wire.state.attempts, 2,
        "sent again once, after evidence it did not commit"
    );
    let stats = upstream.stats();
    assert_eq!(stats.wires, 1, "{stats:?}");
    assert_eq!(
        stats.standing_wires(&wire_business_key("acc-lost", 5_000)),
        1
    );

    let trail = verified_audit(b.ctx.ledger.as_ref(), run).await;
    // Looks before the lapsed attempt's landing horizon and the first look that counts are
    // all UNKNOWN -> UNKNOWN; how many there are depends on the sweep's timing.
    let mut path = trail.path(key);
    path.dedup();
    assert_eq!(
        path,
        vec![
            (None, Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Unknown)),
            (Some(Unknown), Some(Unknown)),
            (Some(Unknown), Some(Pending)),
            (Some(Pending), Some(Leased)),
            (Some(Leased), Some(Confirmed)),
        ],
        "lease expired, absent twice, redispatched: {:#?}",
        trail.describe(key)
    );
    let expired = trail.find(key, Leased, Unknown);
    assert_eq!(expired.record.actor, "sweep");
    assert_eq!(expired.record.reason, "lease expired without an outcome");
    b.stop().await.expect("pipeline B stops cleanly");
    upstream.shutdown().await;
}

/// Two processes on one ledger file: the dispatcher of one starts from the copy of a command it
/// reserved itself (no read), so it must still see that the other process cancelled it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_does_not_call_for_a_command_another_process_cancelled() {
    use sluice_assemble::assemble;
    use sluice_core::machine::{Event, Job, Operator};
    use sluice_runtime::{Actor, Ran, Sites};

    init_tracing();
    let upstream = start_upstream(Faults::none()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let config = test_config(dir.path());
    let this = assemble(&config, example_catalog(&upstream.base_url()))
        .await
        .expect("this process");
    let other = assemble(&config, example_catalog(&upstream.base_url()))
        .await
        .expect("the other process");
    let run = sluice_core::ids::RunId::parse("r-two-processes").expect("valid");
    let command = sluice_ledger::contract::command(
        &run,
        0,
        "email/send",
        0,
        serde_json::json!({"to": "a@example.com", "subject": "s", "body": "b"}),
    );
    let key = command.command_key.clone();
    let audit = command.reservation_audit("producer");
    this.ledger.reserve(command, audit).await.expect("reserve");
    assert!(this.ledger.cached(&run, &key).is_some());

    let cancel = Event::Cancel {
        operator: Operator {
            actor: "operator".into(),
            reason: "cancelled: not wanted".into(),
        },
    };
    let current = other.current(&run, &key).await.expect("read");
    let cancelled = other
        .run_job(
            Job::Operate,
            Actor::on_behalf_of("producer", "operator"),
            current,
            Sites::NONE,
            |_| Some(cancel.clone()),
        )
        .await
        .expect("cancel");
    assert!(matches!(cancelled, Ran::Applied(ref c, _) if c.status() == Cancelled));

    let after = sluice_dispatcher::dispatch(&this, "dispatcher-test", &run, &key)
        .await
        .expect("dispatch")
        .expect("the command exists");
    assert_eq!(after.status(), Cancelled);
    assert_eq!(upstream.stats().emails, 0, "the email must not be sent");
    assert!(this.ledger.cached(&run, &key).is_none());
    let trail = this.ledger.audit_read(&run).await.expect("audit");
    assert_eq!(
        trail.entries.len(),
        2,
        "reserved and cancelled, nothing else"
    );
}
