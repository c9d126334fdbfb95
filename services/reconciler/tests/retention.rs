//! Retention by schedule, against a real SQLite file and a real Cassandra node
//! (`SLUICE_TEST_CQL_NODES`, `scripts/engines/start.sh cassandra`; `SLUICE_SKIP_CQL=1` skips
//! the Cassandra half): a finished run older than the retention is purged by the reconciler's
//! schedule and leaves its audit checkpoint (its chain still verifies); a younger finished run
//! and an old unfinished one are kept; two reconcilers looking at once purge once (the lease),
//! and neither again until the interval is over; `retention_days = 0` keeps everything.
//!
//! The reconcilers read a clock of the test's (`ManualClock`), set so that the retention's
//! cutoff falls between the old runs and the young one: nothing waits for time to pass.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use sluice_bus::{Bus, EmbeddedBus, EmbeddedConfig};
use sluice_core::audit::verify;
use sluice_core::command::{Command, CommandStatus, EffectSemantics, Intent};
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::machine::{self, DispatchOutcome, Event, Rules};
use sluice_core::time::{Clock, ManualClock, SystemClock, Timestamp};
use sluice_ledger::contract::fresh_run;
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{Ledger, Reserved, SYSTEM_RUN, Transition};
use sluice_ledger_cql::{CqlConfig, CqlLedger, Replication};
use sluice_reconciler::retention::{Purged, purge_if_due};
use sluice_runtime::config::ReconcilerConfig;
use sluice_runtime::{Context, Metrics};

const KEEP_MS: u64 = 60_000;
const EVERY_MS: u64 = 10_000;

fn config() -> ReconcilerConfig {
    ReconcilerConfig {
        retention_ms: Some(KEEP_MS),
        purge_every_ms: EVERY_MS,
        purge_batch: 2,
        ..ReconcilerConfig::default()
    }
}

fn context(ledger: Arc<dyn Ledger>, clock: Arc<ManualClock>) -> Context {
    let bus: Arc<dyn Bus> =
        Arc::new(EmbeddedBus::new(EmbeddedConfig::default()).expect("embedded bus"));
    Context {
        ledger,
        bus,
        catalog: Arc::new(
            sluice_assemble::example_catalog_at("http://127.0.0.1:9").expect("catalog"),
        ),
        connector: Arc::new(sluice_connector::HttpConnector::new().expect("connector")),
        clock,
        metrics: Arc::new(Metrics::new()),
        flow: sluice_runtime::flow::Flow::new(),
        copies: None,
        local_events: Default::default(),
    }
}

fn rules() -> Rules {
    Rules {
        has_status_check: true,
        has_compensate: true,
        ..Rules::defaults(EffectSemantics::NonIdempotent)
    }
}

/// Reserves a wire of `run` at `at`; with `finish`, leases it and writes its commit too.
async fn wire(ledger: &dyn Ledger, run: &RunId, at: Timestamp, finish: bool) -> Command {
    let intent = Intent {
        run_id: run.clone(),
        command_key: CommandKey::new(1, ToolName::parse("payments/wire").expect("valid"), 0),
        semantics: EffectSemantics::NonIdempotent,
        args: json!({}),
        business_key: Some(BusinessKey::new(format!("bk-{run}"))),
        policy_version: "1".into(),
        max_attempts: 3,
        not_before: None,
    };
    let wanted = Command::from_intent(intent, at, 10_000);
    let audit = wanted.reservation_audit("test");
    let Reserved::Created(pending) = ledger.reserve(wanted, audit).await.expect("reserve") else {
        panic!("a new run");
    };
    if !finish {
        return pending;
    }
    let apply = |command: &Command, event: Event| {
        let step = machine::apply(&command.state, &rules(), &event, at).expect("applies");
        Transition::from_step(command, &step, "test")
    };
    let leased = ledger
        .acquire_lease(apply(
            &pending,
            Event::Lease {
                owner: "d-1".into(),
            },
        ))
        .await
        .expect("lease")
        .applied()
        .cloned()
        .expect("uncontended");
    let done = ledger
        .finalize(apply(
            &leased,
            Event::Dispatched {
                epoch: leased.epoch(),
                sent_at: at,
                outcome: DispatchOutcome::Committed {
                    external_ref: Some("w-1".into()),
                    result: None,
                },
            },
        ))
        .await
        .expect("finalize")
        .applied()
        .cloned()
        .expect("uncontended");
    assert_eq!(done.status(), CommandStatus::Confirmed);
    done
}

async fn kept(ledger: &dyn Ledger, run: &RunId) -> bool {
    !ledger.list_run(run, None).await.expect("list").is_empty()
}

async fn purged_on_schedule_once_and_never_with_retention_off(open: Arc<dyn Ledger>) {
    let ledger = &*open;
    let t0 = SystemClock.now();
    let (old_done, old_open) = (fresh_run("ret-old-done"), fresh_run("ret-old-open"));
    let old = wire(ledger, &old_done, t0, true).await;
    wire(ledger, &old_open, t0, false).await;
    let head = ledger
        .audit_read(&old_done)
        .await
        .expect("audit")
        .entries
        .last()
        .expect("records")
        .hash
        .clone();
    // The young run is created after the old ones, at the retention's cutoff: not older than it.
    let young = fresh_run("ret-young");
    let t1 = t0.plus_millis(5);
    wire(ledger, &young, t1, true).await;
    let clock = Arc::new(ManualClock::starting_at(
        t1.plus_millis(i64::try_from(KEEP_MS).expect("small")),
    ));

    // Retention off: nothing, ever, whatever the clock.
    let off = ReconcilerConfig {
        retention_days: 0,
        ..ReconcilerConfig::default()
    };
    let ctx = context(Arc::clone(&open), Arc::clone(&clock));
    assert_eq!(
        purge_if_due(&ctx, &off, "reconciler-a")
            .await
            .expect("look"),
        Purged::Off
    );
    assert!(
        kept(ledger, &old_done).await,
        "retention_days = 0 keeps everything"
    );

    // Two reconcilers look at once: one wins the lease and purges, the other does nothing.
    let (a, b) = (
        context(Arc::clone(&open), Arc::clone(&clock)),
        context(Arc::clone(&open), Arc::clone(&clock)),
    );
    let config = config();
    let (first, second) = tokio::join!(
        purge_if_due(&a, &config, "reconciler-a"),
        purge_if_due(&b, &config, "reconciler-b"),
    );
    let outcomes = [first.expect("a looks"), second.expect("b looks")];
    let done: Vec<&Purged> = outcomes
        .iter()
        .filter(|p| matches!(p, Purged::Done { .. }))
        .collect();
    assert_eq!(done.len(), 1, "one purge at a time: {outcomes:?}");
    assert!(
        outcomes.contains(&Purged::NotMine),
        "the other took no part: {outcomes:?}"
    );
    let Purged::Done { runs, .. } = done[0] else {
        unreachable!()
    };
    assert!(*runs >= 1, "{outcomes:?}");
    let purged = a.metrics.purge.runs.get() + b.metrics.purge.runs.get();
    assert_eq!(purged, *runs, "sluice_purged_runs_total counts them");

    // The old finished run is gone, its checkpoint kept and its chain verifying; the old
    // unfinished run and the young finished one stay.
    assert_eq!(
        ledger.get(&old_done, &old.command_key).await.expect("get"),
        None
    );
    let trail = ledger.audit_read(&old_done).await.expect("audit");
    let checkpoint = trail.checkpoint.clone().expect("a checkpoint is left");
    assert_eq!(
        (checkpoint.last_hash.as_str(), checkpoint.count),
        (head.as_str(), 3)
    );
    verify(&old_done, trail.checkpoint.as_ref(), &trail.entries).expect("verifies after purge");
    assert!(kept(ledger, &old_open).await, "an unfinished run is kept");
    assert!(
        kept(ledger, &young).await,
        "a run younger than the retention is kept"
    );
    let system = RunId::parse(SYSTEM_RUN).expect("valid");
    let log = ledger.audit_read(&system).await.expect("system chain");
    assert!(
        log.entries
            .iter()
            .any(|e| e.record.actor == sluice_reconciler::retention::ACTOR),
        "the scheduled purge is recorded in the system chain"
    );

    // Not again within the interval, by either; due again once the lease lapsed.
    clock.advance(Duration::from_millis(EVERY_MS - 1));
    for (ctx, me) in [(&a, "reconciler-a"), (&b, "reconciler-b")] {
        assert_eq!(
            purge_if_due(ctx, &config, me).await.expect("look"),
            Purged::NotMine
        );
    }
    clock.advance(Duration::from_millis(1));
    assert!(matches!(
        purge_if_due(&b, &config, "reconciler-b")
            .await
            .expect("look"),
        Purged::Done { .. }
    ));
    // By then the young run is older than the retention too, and goes; the open one stays.
    assert!(
        !kept(ledger, &young).await,
        "a finished run goes once past the retention"
    );
    assert!(kept(ledger, &old_open).await, "an unfinished run is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_purges_old_finished_runs_once_on_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("ledger");
    purged_on_schedule_once_and_never_with_retention_off(Arc::new(ledger)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_purges_old_finished_runs_once_on_cassandra() {
    if std::env::var("SLUICE_SKIP_CQL").is_ok_and(|v| v == "1") {
        eprintln!("SLUICE_SKIP_CQL=1: skipped");
        return;
    }
    let nodes: Vec<String> = std::env::var("SLUICE_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:19042".to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let secs = SystemClock.now().as_millis() / 1_000;
    let config = CqlConfig {
        nodes,
        keyspace: format!("sluice_t_{secs}_{}", &unique[..10]),
        replication: Replication::Simple {
            replication_factor: 1,
        },
        ..CqlConfig::default()
    };
    let ledger = CqlLedger::connect(config.clone())
        .await
        .expect("a Cassandra node (scripts/engines/start.sh cassandra)");
    let ledger = Arc::new(ledger);
    purged_on_schedule_once_and_never_with_retention_off(Arc::clone(&ledger) as Arc<dyn Ledger>)
        .await;
    let _ = sluice_ledger_cql::drop_keyspace(ledger.session(), &config.keyspace).await;
}

/// The SQLite file's size on disk (its write-ahead log apart: it is checkpointed back into the
/// file and reused, and its size says how busy the last seconds were, not how much is kept).
fn size_on_disk(dir: &std::path::Path) -> u64 {
    std::fs::metadata(dir.join(sluice_ledger::sqlite::LEDGER_FILE))
        .map(|meta| meta.len())
        .unwrap_or(0)
}

/// One long run on a clock the bench advances a day at a time: `RUNS_PER_DAY` finished runs
/// a day for `DAYS` days, the reconciler's schedule looked at once a day (retention on: the
/// default 30 days; off: 0), then one sweep pass timed and the ledger's size read. Returns
/// the (day, size in bytes, sweep ms, purge ms) of every tenth day and the runs purged.
async fn long_run(retention_days: u32) -> (Vec<(u32, u64, f64, f64)>, u64) {
    const DAYS: u32 = 120;
    const RUNS_PER_DAY: u32 = 500;
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger: Arc<dyn Ledger> = Arc::new(
        SqliteLedger::open(SqliteConfig {
            durability: sluice_ledger::sqlite::Durability::Normal,
            ..SqliteConfig::in_dir(dir.path())
        })
        .expect("ledger"),
    );
    let start = SystemClock.now();
    let clock = Arc::new(ManualClock::starting_at(start));
    let ctx = context(Arc::clone(&ledger), Arc::clone(&clock));
    let config = ReconcilerConfig {
        retention_days,
        ..ReconcilerConfig::default()
    };
    let mut figures = Vec::new();
    for day in 1..=DAYS {
        let day_start = clock.now();
        for batch in 0..RUNS_PER_DAY / 10 {
            let writes = (0..10).map(|n| {
                let run = fresh_run("bench");
                let at = day_start.plus_millis(i64::from(batch * 10 + n) * 60_000);
                let ledger = Arc::clone(&ledger);
                async move { wire(&*ledger, &run, at, true).await }
            });
            futures::future::join_all(writes).await;
        }
        clock.set(day_start.plus_millis(86_400_000));
        let purge_started = std::time::Instant::now();
        purge_if_due(&ctx, &config, "reconciler-bench")
            .await
            .expect("purge");
        let purge_ms = purge_started.elapsed().as_secs_f64() * 1_000.0;
        let sweep_started = std::time::Instant::now();
        sluice_reconciler::sweep_once(&ctx, &config)
            .await
            .expect("sweep");
        let sweep_ms = sweep_started.elapsed().as_secs_f64() * 1_000.0;
        if day % 10 == 0 {
            figures.push((day, size_on_disk(dir.path()), sweep_ms, purge_ms));
        }
    }
    (figures, ctx.metrics.purge.runs.get())
}

/// `cargo test -p sluice-reconciler --test retention -- --ignored --nocapture` prints the
/// figures quoted in docs/scaling.md, "Retention".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement (about a minute), not a check"]
async fn ledger_size_and_sweep_time_over_120_days_with_retention_on_and_off() {
    let (on, purged) = long_run(sluice_core::retention::DEFAULT_RETENTION_DAYS).await;
    let (off, none) = long_run(0).await;
    assert_eq!(none, 0, "retention off purges nothing");
    println!(
        "day | ledger.db on (MiB) | ledger.db off (MiB) | sweep on (ms) | sweep off (ms) | purge on (ms)"
    );
    for ((day, size_on, sweep_on, purge_on), (_, size_off, sweep_off, _)) in on.iter().zip(&off) {
        let mib = |bytes: &u64| *bytes as f64 / 1_048_576.0;
        println!(
            "{day} | {:.1} | {:.1} | {sweep_on:.1} | {sweep_off:.1} | {purge_on:.1}",
            mib(size_on),
            mib(size_off)
        );
    }
    println!("runs purged with retention on: {purged} of 60000");
}
