//! The fault runner at CI size: `sluice dev` as a child process, crashed and restarted on its
//! data directory (once onto a catalog whose policy is stricter), against the runner's
//! ground-truth upstream with every fault kind on (slow lookup keys included), with agents
//! calling through `sluice mcp --transport http` and re-driving their conversations, and an
//! operator purging finished runs mid-run — and every guarantee checked against the
//! upstream's own record (see `sluice_tests::chaos`).
//!
//! The `sluice` binary is this build's (`target/<profile>/sluice`); `scripts/test.sh` builds
//! it with `cargo build --workspace --bins` before the tests. The full run is a command:
//! `cargo run --release -p sluice-tests --bin sluice-chaos -- --effects 10000 --crashes 50`.

use std::time::Duration;

use sluice_tests::chaos::invariants::NO_UNEXPECTED_EXIT;
use sluice_tests::chaos::report::Report;
use sluice_tests::chaos::upstream::DispatchFault;
use sluice_tests::chaos::{self, Options};

/// The seeds CI replays. A new failure on one of them is replayed with
/// `sluice-chaos --seed <seed> --effects 2000 --crashes 20 --rate 50`.
const SEEDS: [u64; 2] = [0x5eed_0001, 0x5eed_0002];

fn ci_options(seed: u64, effects: usize, crashes: usize) -> Options {
    let mut options = Options::new(seed);
    options.workload.effects = effects;
    options.crashes = crashes;
    // A debug build on two shared cores: a pace it keeps up with.
    options.rate = 50.0;
    options.agents = 24;
    options.settle_timeout = Duration::from_secs(180);
    options
}

/// What every run must have exercised, whatever it found.
fn assert_exercised(report: &Report, effects: usize, crashes: usize) {
    let f = &report.figures;
    let seed = report.seed;
    assert!(
        f.accepted >= effects * 9 / 10,
        "seed {seed}: only {} of {effects} effects accepted\n{}",
        f.accepted,
        report.render()
    );
    assert!(
        f.injected_crashes >= crashes,
        "seed {seed}: {} crashes, wanted {crashes}\n{}",
        f.injected_crashes,
        report.render()
    );
    for fault in DispatchFault::ALL
        .into_iter()
        .filter(|f| *f != DispatchFault::None)
    {
        assert!(
            f.faults.get(fault.as_str()).copied().unwrap_or(0) > 0,
            "seed {seed}: fault {fault} never happened\n{}",
            report.render()
        );
    }
    for kind in [
        "inconclusive_check",
        "lagging_lookup (commits)",
        "key_ignoring (sms commits)",
        "slow_lookup (checks)",
    ] {
        assert!(
            f.faults.get(kind).copied().unwrap_or(0) > 0,
            "seed {seed}: no {kind}\n{}",
            report.render()
        );
    }
    for check in &report.checks {
        assert!(
            check.checked > 0 || check.invariant == NO_UNEXPECTED_EXIT,
            "seed {seed}: {} checked nothing\n{}",
            check.invariant,
            report.render()
        );
    }
    assert!(
        f.tightened.is_some(),
        "seed {seed}: no restart tightened the policy\n{}",
        report.render()
    );
    for (figures, what) in [
        (&f.mcp, "timed out, cancelled, sent again"),
        (&f.mcp, "re-driven in a new session"),
        (&f.purges, "purges"),
        (&f.purges, "runs purged"),
        (&f.flow, "breaker opened"),
        (&f.flow, "breaker closed"),
        (&f.flow, "calls held (breaker)"),
        (&f.flow, "calls held (rate)"),
    ] {
        assert!(
            figures.get(what).copied().unwrap_or(0) > 0,
            "seed {seed}: no {what}\n{}",
            report.render()
        );
    }
    assert!(
        f.settled,
        "seed {seed}: the pipeline did not settle\n{}",
        report.render()
    );
}

/// ≥ 2,000 effects and ≥ 20 crashes per seed, every fault kind, every guarantee. Both seeds
/// run before anything is asserted, so one failure shows what the other seed found too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ci_sized_chaos_run_keeps_every_guarantee() {
    let mut reports = Vec::new();
    for seed in SEEDS {
        let started = std::time::Instant::now();
        let report = chaos::run(ci_options(seed, 2_000, 20))
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: the run could not be carried out: {e}"));
        println!(
            "{}\nseed {seed}: {:.1} s",
            report.render(),
            started.elapsed().as_secs_f64()
        );
        reports.push(report);
    }
    for report in &reports {
        assert_exercised(report, 2_000, 20);
    }
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| r.failed())
        .map(|r| format!("seed {}: {} violation(s)", r.seed, r.violations()))
        .collect();
    assert!(
        failed.is_empty(),
        "guarantees broke (reports above): {failed:?}"
    );
}
