//! Flow control end to end (issue 30): a circuit breaker against a bank that goes down for 20
//! seconds and comes back. Before, every wire looked up during the outage was found absent,
//! sent again into it and spent its attempts: 63 of 120 wires ended FAILED. Now the bank's
//! breaker opens after three failing answers, the wires wait (no attempt spent) while probes
//! test the bank, and the breaker closes when a probe is answered: every wire is CONFIRMED,
//! booked once.
//!
//! `cargo test -p sluice-tests --test flow_control -- --nocapture` prints the figures.

use std::time::{Duration, Instant};

use sluice_core::command::{Command, CommandStatus};
use sluice_core::flow::Breaker;
use sluice_core::ids::RunId;
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

const RUNS: usize = 24;
const PER_RUN: usize = 5;
const OUTAGE: Duration = Duration::from_secs(20);

fn bank_down() -> Faults {
    Faults::none().with_rates(Family::Bank, FaultRates::only(FaultKind::Error5xx, 1.0))
}

/// The wire on a shared `bank` upstream with a breaker; short calls and horizons, so a wire
/// looked up after a 503 is sent again within seconds, as in the report.
fn bank_with_breaker(c: CatalogEdit) -> CatalogEdit {
    short_wire(c)
        .upstream(
            "bank",
            "[breaker]\nfailures = 3\nopen_ms = 2000\nmax_open_ms = 4000\nprobe_ms = 3000",
        )
        .tool_key("payments/wire", "upstream", "bank")
}

fn account(run: usize, n: usize) -> String {
    format!("acc-out-{run}-{n}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outage_opens_the_breaker_and_no_wire_fails_or_is_booked_twice() {
    let h = Harness::start(bank_down(), bank_with_breaker).await;
    let started = Instant::now();
    let mut wires = Vec::new();
    for run in 0..RUNS {
        let run_id = format!("r-outage-{run}");
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
        h.agent.batch_created(batch).await;
    }

    // The breaker opens within the outage, and is read back open from the ledger.
    let opened = eventually(
        "the bank's breaker open",
        Duration::from_secs(15),
        || async {
            let controls = h.ctx().ledger.flow_controls().await.expect("read");
            controls.into_iter().find(|c| {
                c.name == "bank"
                    && matches!(c.breaker, Breaker::Open { .. } | Breaker::HalfOpen { .. })
            })
        },
    )
    .await;
    let opened_at = started.elapsed();
    let during = h.upstream.stats().faults.error_5xx;
    tokio::time::sleep(OUTAGE.saturating_sub(started.elapsed())).await;
    let refused_in_outage = h.upstream.stats().faults.error_5xx;
    h.upstream
        .set_faults(Faults::none())
        .expect("the bank comes back");

    let mut settled: Vec<Command> = Vec::new();
    for (run, key) in &wires {
        settled.push(h.agent.wait_settled(run, key).await);
    }
    let settled_after = started.elapsed();
    let stats = h.upstream.stats();
    let describe = |c: &Command| {
        format!(
            "{} {}: {} attempts {} ({:?})",
            c.run_id, c.command_key, c.state.status, c.state.attempts, c.state.last_error
        )
    };
    for command in &settled {
        assert_eq!(
            command.status(),
            CommandStatus::Confirmed,
            "{}",
            describe(command)
        );
        assert!(!command.state.escalated, "{}", describe(command));
    }
    for run in 0..RUNS {
        for n in 0..PER_RUN {
            let key = wire_business_key(&account(run, n), 5_000);
            assert_eq!(stats.standing_wires(&key), 1, "{key}: {stats:?}");
        }
    }
    assert_no_double_commit(&stats);
    // While open, the wires waited instead of being sent into the outage: before, each of the
    // 120 was refused up to its three attempts (63 ended FAILED, ≥ 189 refusals).
    assert!(
        refused_in_outage < 60,
        "{refused_in_outage} calls were sent into the outage"
    );
    let attempts: u32 = settled.iter().map(|c| c.state.attempts).sum();
    let most = settled.iter().map(|c| c.state.attempts).max().unwrap_or(0);
    assert!(most < 3, "a wire spent {most} attempts");

    // It closed again once a probe was answered; each change is in the ledger's own chain.
    eventually(
        "the bank's breaker closed",
        Duration::from_secs(15),
        || async {
            let controls = h.ctx().ledger.flow_controls().await.expect("read");
            controls
                .into_iter()
                .find(|c| c.name == "bank" && c.breaker == Breaker::Closed)
        },
    )
    .await;
    let system = RunId::parse(sluice_ledger::SYSTEM_RUN).expect("valid");
    let trail = h.ctx().ledger.audit_read(&system).await.expect("chain");
    let reasons: Vec<&str> = trail
        .entries
        .iter()
        .map(|e| e.record.reason.as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("bank: circuit breaker opened")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("bank: circuit breaker closed")),
        "{reasons:?}"
    );
    let metrics = h
        .ctx()
        .metrics
        .flow
        .breaker_transitions
        .with_label_values(&["bank", "open"])
        .get();
    assert!(metrics >= 1);
    println!(
        "flow_control: {} wires through a {} s outage — breaker opened at {:.1} s ({:?}), {} refusals when it opened, \
         {} in the whole outage; CONFIRMED {}/{}, FAILED 0, STUCK 0; wires booked {}; attempts {} (at most {} per wire); \
         breaker opened {} times (the first, then each failed probe); all settled in {:.1} s",
        wires.len(),
        OUTAGE.as_secs(),
        opened_at.as_secs_f64(),
        opened.breaker.name(),
        during,
        refused_in_outage,
        settled.len(),
        wires.len(),
        stats.wires,
        attempts,
        most,
        metrics,
        settled_after.as_secs_f64(),
    );
    h.stop().await;
}
