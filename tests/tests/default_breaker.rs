//! Resilient by default (issue 39): the catalog as most users write it — no `[upstream]`, no
//! breaker — against a bank down for 20 seconds (every call answered 503, nothing committed),
//! with the pipeline killed mid-flight and another started on the same ledger. Before, with no
//! breaker, every wire looked up in the outage was found absent, sent again into it and spent
//! its attempts: 81 of 120 wires ended FAILED. Now the bank's host has a breaker by default:
//! it opens after five failing answers, the wires wait without spending attempts, probes test
//! the bank and the breaker closes once one is answered. No wire ends FAILED, each is booked
//! once, and the calls made into the outage are counted (the bank's own count of its 503s).
//!
//! Measured here (2026-12-06): with the default breaker 120/120 CONFIRMED and 8 calls into the
//! outage; with `breaker = false` (`without_a_breaker_the_same_outage_fails_wires`, ignored)
//! 119 of 120 FAILED and 356 calls into it.
//!
//! `cargo test -p sluice-tests --test default_breaker -- --nocapture` prints the figures.

use std::time::{Duration, Instant};

use sluice_core::command::{Command, CommandStatus};
use sluice_core::flow::Breaker;
use sluice_core::ids::RunId;
use sluice_ledger::{AuditStore, FlowStore};
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

const RUNS: usize = 30;
const PER_RUN: usize = 4;
const OUTAGE: Duration = Duration::from_secs(20);

fn bank_down() -> Faults {
    Faults::none().with_rates(Family::Bank, FaultRates::only(FaultKind::Error5xx, 1.0))
}

fn account(run: usize, n: usize) -> String {
    format!("acc-default-{run}-{n}")
}

/// What the outage left: every wire as settled, the bank's count of its 503s when the bank came
/// back, and a line of figures.
struct Outage {
    settled: Vec<Command>,
    refused_in_outage: u64,
    stats: sluice_upstream::Stats,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_with_no_breaker_declared_fails_no_wire() {
    let Outage {
        settled,
        refused_in_outage,
        stats,
    } = outage(true).await;
    let describe = |c: &Command| {
        format!(
            "{} {}: {} attempts {} ({:?})",
            c.run_id, c.command_key, c.state.status, c.state.attempts, c.state.last_error
        )
    };
    let failed = settled
        .iter()
        .filter(|c| c.status() == CommandStatus::Failed)
        .count();
    assert_eq!(failed, 0, "wires FAILED by a 20 s outage");
    for command in &settled {
        assert_eq!(
            command.status(),
            CommandStatus::Confirmed,
            "{}",
            describe(command)
        );
    }
    for run in 0..RUNS {
        for n in 0..PER_RUN {
            let key = wire_business_key(&account(run, n), 5_000);
            assert_eq!(stats.standing_wires(&key), 1, "{key}: {stats:?}");
        }
    }
    assert_no_double_commit(&stats);
    // The breaker held the wires: with none, each of the 120 was sent into the outage at least
    // once (and most three times; `without_a_breaker_the_same_outage_fails_wires`).
    assert!(
        refused_in_outage < u64::try_from(settled.len()).expect("small"),
        "{refused_in_outage} calls were sent into the outage"
    );
}

/// The same outage with the breaker turned off (`breaker = false`), as every catalog was
/// before: the figure the default is measured against. Not a check of Sluice (an upstream
/// failing past a tool's attempts is meant to fail it): `-- --ignored --nocapture` prints it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement of the behaviour without a breaker, not a check"]
async fn without_a_breaker_the_same_outage_fails_wires() {
    let Outage { settled, stats, .. } = outage(false).await;
    let failed = settled
        .iter()
        .filter(|c| c.status() == CommandStatus::Failed)
        .count();
    assert!(failed > 0, "no wire failed without a breaker");
    assert_no_double_commit(&stats);
}

/// Runs the outage; `default_breakers`: the catalog as written (a breaker per host by
/// default), else with `breaker = false` on every tool.
async fn outage(default_breakers: bool) -> Outage {
    init_tracing();
    let upstream = start_upstream(bank_down()).await;
    // The wire with short calls and horizons, as in the report; no upstream, no breaker.
    let mut edit = short_wire(CatalogEdit::example(&upstream.base_url()));
    if default_breakers {
        edit = edit.default_breakers();
        assert!(
            !edit.text().contains("[upstream") && !edit.text().contains("breaker"),
            "the catalog declares no upstream and no breaker:\n{}",
            edit.text()
        );
    }
    let catalog = edit.build();
    let wire = catalog
        .resolve("payments/wire")
        .expect("the example's wire");
    let host = wire.upstream().to_owned();
    if default_breakers {
        assert_eq!(
            host,
            upstream.base_url().trim_start_matches("http://"),
            "the wire joins its host's upstream"
        );
    }
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());

    // Pipeline A takes the wires into the outage, and is killed mid-flight.
    let started = Instant::now();
    let a = Detached::start(&config, catalog.clone()).await;
    let agent_a = Agent::new(&a.url);
    let mut wires = Vec::new();
    for run in 0..RUNS {
        let run_id = format!("r-default-{run}");
        let batch = (0..PER_RUN)
            .map(|n| {
                wires.push((run_id.clone(), format!("d-1/payments/wire/{n}")));
                let call = u32::try_from(n).expect("small");
                effect(
                    &run_id,
                    1,
                    "payments/wire",
                    call,
                    wire_args(&account(run, n), 5_000),
                )
            })
            .collect();
        agent_a.batch_created(batch).await;
    }
    let ledger = open_ledger(data.path());
    // Killed once the bank has refused calls: with the breaker, once it opened.
    let opened = if default_breakers {
        let control = eventually("the bank host's default breaker open", DEADLINE, || async {
            let controls = ledger.flow_controls().await.expect("read");
            controls.into_iter().find(|c| {
                c.name == host
                    && matches!(c.breaker, Breaker::Open { .. } | Breaker::HalfOpen { .. })
            })
        })
        .await;
        control.breaker.name()
    } else {
        eventually("the bank refusing calls", DEADLINE, || async {
            (upstream.stats().faults.error_5xx >= 5).then_some(())
        })
        .await;
        "none"
    };
    let opened_at = started.elapsed();
    let refused_when_opened = upstream.stats().faults.error_5xx;
    a.crash();
    let killed_at = started.elapsed();

    // Pipeline B on the same ledger, a fresh bus; the bank stays down until 20 s.
    let b = start_pipeline(&config, catalog).await;
    let agent_b = Agent::new(&b.url());
    tokio::time::sleep(OUTAGE.saturating_sub(started.elapsed())).await;
    let refused_in_outage = upstream.stats().faults.error_5xx;
    upstream
        .set_faults(Faults::none())
        .expect("the bank comes back");

    let mut settled: Vec<Command> = Vec::new();
    for (run, key) in &wires {
        settled.push(agent_b.wait_settled_within(run, key, RECOVERY).await);
    }
    let settled_after = started.elapsed();
    let stats = upstream.stats();
    let failed = settled
        .iter()
        .filter(|c| c.status() == CommandStatus::Failed)
        .count();
    let attempts: u32 = settled.iter().map(|c| c.state.attempts).sum();
    let most = settled.iter().map(|c| c.state.attempts).max().unwrap_or(0);

    // The default breaker's changes are in the ledger's own chain, named by the host.
    let system = RunId::parse(sluice_ledger::SYSTEM_RUN).expect("valid");
    let trail = ledger.audit_read(&system).await.expect("chain");
    let reasons: Vec<&str> = trail
        .entries
        .iter()
        .map(|e| e.record.reason.as_str())
        .collect();
    if default_breakers {
        for change in ["circuit breaker opened", "circuit breaker closed"] {
            let wanted = format!("{host}: {change}");
            assert!(
                reasons.iter().any(|r| r.contains(&wanted)),
                "{wanted}: {reasons:?}"
            );
        }
    }
    let confirmed = settled
        .iter()
        .filter(|c| c.status() == CommandStatus::Confirmed)
        .count();
    println!(
        "default_breaker ({}): {} wires, no [upstream] declared, through a {} s outage with a kill at {:.1} s — \
         breaker {:?} at {:.1} s after {} refusals; {} calls into the whole outage; \
         CONFIRMED {}/{}, FAILED {}; wires booked {}; attempts {} (at most {} per wire); all settled in {:.1} s",
        if default_breakers {
            "the default breaker"
        } else {
            "breaker = false"
        },
        wires.len(),
        OUTAGE.as_secs(),
        killed_at.as_secs_f64(),
        opened,
        opened_at.as_secs_f64(),
        refused_when_opened,
        refused_in_outage,
        confirmed,
        wires.len(),
        failed,
        stats.wires,
        attempts,
        most,
        settled_after.as_secs_f64(),
    );
    drop(ledger);
    b.stop().await.expect("every service stops cleanly");
    upstream.shutdown().await;
    Outage {
        settled,
        refused_in_outage,
        stats,
    }
}
