//! `sluice demo` and `sluice bench` end to end, on small workloads: the real demo upstream and
//! the four services over HTTP on loopback, a real SQLite ledger in a temporary directory.

use sluice_embedded::bench::{self, BenchArgs, DurabilityArg, Mode};
use sluice_embedded::demo::{self, DemoArgs, Progress};
use sluice_runtime::Shutdown;
use sluice_upstream::FaultKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_small_run_holds_its_invariants() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let args = DemoArgs {
        runs: 4,
        effects: 4,
        rollback_every: 2,
        fault_rate: 0.1,
        seed: 11,
        deadline_secs: 40,
        ..DemoArgs::defaults()
    };
    let report = demo::execute(
        &args,
        dir.path(),
        &Shutdown::new(),
        &Progress::hidden(),
        |_| {},
    )
    .await
    .expect("the demo runs");

    assert!(report.ok(), "invariants broken: {:#?}", report.violations);
    assert_eq!(report.submitted, 16);
    let s = &report.statuses;
    let settled = s.confirmed
        + s.failed
        + s.blocked
        + s.cancelled
        + s.stuck
        + s.compensated
        + s.no_compensation
        + s.compensation_failed;
    assert_eq!(settled, 16, "every command settled: {s:?}");
    assert_eq!(s.unsettled, 0);
    assert!(
        report.upstream.faults.total() > 0,
        "the upstream injected faults: {:?}",
        report.upstream.faults
    );
    assert_eq!(report.rolled_back_runs, 2, "runs 2 and 4 rolled back");
    assert!(
        s.compensated + s.no_compensation + s.cancelled > 0,
        "a rollback left its mark: {s:?}"
    );
    assert!(report.upstream.double_commits.is_empty());
    assert_eq!(report.audit.runs, 4);
    assert_eq!(report.audit.verified, 4);
    let i = &report.idempotency;
    assert!(i.replays > 0);
    assert_eq!(i.replays_answered_stored, i.replays, "{i:?}");
    assert_eq!(i.drift_refused, Some(true), "{i:?}");
    assert_eq!(i.business_key_answered_existing, Some(true), "{i:?}");
}

/// `commit_twice` alone, at a high rate: the bank books a wire twice under one business key and
/// answers 201 with the first id, so nothing about the answer is ambiguous. The wire tool's
/// `verify_after_commit` looks the key up once more, finds the duplicate and reverses the
/// extra wire; without it the extra wire would stand and the demo would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_double_booking_answered_2xx_is_caught_and_undone() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let others: Vec<FaultKind> = FaultKind::ALL
        .into_iter()
        .filter(|kind| *kind != FaultKind::CommitTwice)
        .collect();
    let args = DemoArgs {
        runs: 6,
        effects: 4,
        rollback_every: 3,
        fault_rate: 0.5,
        skip_faults: others,
        deadline_secs: 40,
        ..DemoArgs::defaults()
    };
    let report = demo::execute(
        &args,
        dir.path(),
        &Shutdown::new(),
        &Progress::hidden(),
        |_| {},
    )
    .await
    .expect("the demo runs");
    assert!(report.ok(), "invariants broken: {:#?}", report.violations);
    let upstream = &report.upstream;
    assert!(upstream.faults.commit_twice > 0, "{upstream:?}");
    assert!(upstream.keys_committed_twice > 0, "{upstream:?}");
    assert_eq!(
        upstream.keys_committed_twice_compensated, upstream.keys_committed_twice,
        "every extra wire reversed: {upstream:?}"
    );
    assert!(
        report.reconciled.duplicate > 0,
        "found by a status check: {:?}",
        report.reconciled
    );
}

/// Runs the bench passes `args` ask for with their data under `dir`, quietly.
async fn bench_in(
    args: &BenchArgs,
    dir: &std::path::Path,
) -> Result<bench::BenchReport, bench::BenchError> {
    bench::execute(args, dir, &Shutdown::new(), &Progress::hidden(), |_| {}).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_small_run_confirms_every_effect_in_each_pass() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let args = BenchArgs {
        effects: 300,
        batch: 50,
        concurrency: vec![8],
        mode: Mode::Both,
        durability: Some(DurabilityArg::Normal),
        partitions: Some(16),
        dispatcher_concurrency: Some(32),
        json: true,
        ..BenchArgs::defaults()
    };
    let report = bench_in(&args, dir.path()).await.expect("the bench runs");

    let passes: Vec<&str> = report.results.iter().map(|r| r.pass.as_str()).collect();
    assert_eq!(
        passes,
        ["single", "batch", "batch at half rate, paced"],
        "{report:#?}"
    );
    for result in &report.results {
        assert_eq!(result.effects, 300, "{result:?}");
        assert!(result.confirmed_per_sec > 0.0, "{result:?}");
        assert!(
            0.0 < result.p50_ms && result.p50_ms <= result.p99_ms && result.p99_ms <= result.max_ms,
            "{result:?}"
        );
        assert!(result.line().starts_with(&format!("bench {}", result.pass)));
        // The process did work for every effect, and the line says how much.
        let cpu = result
            .cpu_us_per_effect
            .expect("the process CPU clock is read");
        assert!(cpu > 0.0, "{result:?}");
        let line = result.line();
        let summary = line.lines().next().unwrap_or_default();
        assert!(
            summary.ends_with(&format!("; {cpu:.0} µs of this process's CPU per effect")),
            "{line}"
        );
        // And the bus's work per effect: each effect's dispatch request at least.
        let requested = result.bus_per_effect.get("requested").copied();
        assert!(
            requested.is_some_and(|(published, fetched)| published >= 1.0 && fetched >= 1.0),
            "{line}"
        );
        assert!(line.contains("\n  bus messages per effect: "), "{line}");
    }
    let batch = &report.results[1];
    let paced = &report.results[2];
    let offered = paced.offered_per_sec.expect("the paced pass offers a rate");
    assert!(
        (offered - batch.confirmed_per_sec / 2.0).abs() < 1e-6,
        "half the batch throughput: {offered} vs {}",
        batch.confirmed_per_sec
    );
    assert_eq!(report.settings.partitions, 16);
    assert_eq!(report.settings.dispatcher_concurrency, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_paced_mode_offers_the_rate_it_is_given_and_nothing_else() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let args = BenchArgs {
        effects: 200,
        mode: Mode::Paced,
        rate: Some(400.0),
        durability: Some(DurabilityArg::Normal),
        partitions: Some(8),
        json: true,
        ..BenchArgs::defaults()
    };
    let report = bench_in(&args, dir.path()).await.expect("the bench runs");

    let passes: Vec<&str> = report.results.iter().map(|r| r.pass.as_str()).collect();
    assert_eq!(passes, ["batch at 400 effects/s, paced"], "{report:#?}");
    let paced = &report.results[0];
    assert_eq!(paced.offered_per_sec, Some(400.0), "{paced:?}");
    assert_eq!(paced.effects, 200, "{paced:?}");
    // 200 effects at 400/s take half a second to offer: it cannot finish sooner.
    assert!(paced.confirmed_per_sec <= 400.0 * 1.1, "{paced:?}");
}

#[tokio::test]
async fn bench_refuses_a_paced_mode_without_a_rate_and_a_rate_below_one() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (args, flag) in [
        (
            BenchArgs {
                mode: Mode::Paced,
                ..BenchArgs::defaults()
            },
            "--mode",
        ),
        (
            BenchArgs {
                rate: Some(0.5),
                ..BenchArgs::defaults()
            },
            "--rate",
        ),
        (
            BenchArgs {
                rate: Some(f64::NAN),
                ..BenchArgs::defaults()
            },
            "--rate",
        ),
    ] {
        let refused = bench_in(&args, dir.path())
            .await
            .expect_err("the flags are refused");
        assert!(
            refused.to_string().starts_with(&format!("flag {flag} ")),
            "{refused}"
        );
    }
}
