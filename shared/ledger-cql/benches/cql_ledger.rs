//! What a CQL node can do for the ledger on this machine, in two numbers:
//!
//! 1. **The LWT ceiling**: `INSERT … IF NOT EXISTS` of distinct keys into a one-column table,
//!    from many concurrent tasks: the most lightweight transactions per second the node
//!    completes, with no ledger logic around them.
//! 2. **Ledger effects/s**: the ledger work of one dispatched effect as the pipeline does it —
//!    reserve, acquire the lease, finalize, each with its audit record; an IDEMPOTENT or
//!    OBSERVE_ONLY effect is leased by its reservation and skips the lease — through
//!    [`CqlLedger`], and the round trips per effect it cost, by kind, for each semantics.
//!
//! An effect that needs n LWTs can never exceed 1/n of the ceiling: the benchmark shows how
//! close the ledger comes, with the LWTs it measured.
//!
//! `cargo bench -p sluice-ledger-cql --bench cql_ledger -- [effects] [concurrency] [per_run]`
//! against `SLUICE_TEST_CQL_NODES` (default `127.0.0.1:19042`, what
//! `scripts/engines/start.sh cassandra` starts). The keyspace is created and dropped here.

use std::sync::Arc;
use std::time::Instant;

use sluice_ledger::contract::dispatch_effect;
use sluice_ledger_cql::{CqlConfig, CqlLedger, StatsSnapshot};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .filter_map(|a| a.parse().ok())
        .collect();
    let effects = args.first().copied().unwrap_or(3_000);
    let concurrency = args.get(1).copied().unwrap_or(256);
    let per_run = args.get(2).copied().unwrap_or(1).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(effects, concurrency, per_run));
}

async fn run(effects: usize, concurrency: usize, per_run: usize) {
    let nodes: Vec<String> = std::env::var("SLUICE_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:19042".into())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let keyspace = format!(
        "sluice_bench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    );
    let ledger = CqlLedger::connect(CqlConfig {
        nodes,
        keyspace: keyspace.clone(),
        ..CqlConfig::default()
    })
    .await
    .expect("a CQL node (start one with scripts/engines/start.sh cassandra)");
    let ledger = Arc::new(ledger);
    let session = ledger.session();

    // 1. The raw LWT ceiling.
    session
        .query_unpaged(
            format!("CREATE TABLE IF NOT EXISTS {keyspace}.lwt_probe (k text PRIMARY KEY, v int)"),
            (),
        )
        .await
        .expect("create the probe table");
    let insert = Arc::new(
        session
            .prepare(format!(
                "INSERT INTO {keyspace}.lwt_probe (k, v) VALUES (?, 1) IF NOT EXISTS"
            ))
            .await
            .expect("prepare"),
    );
    let lwts = effects * 3;
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let (ledger, insert) = (Arc::clone(&ledger), Arc::clone(&insert));
            tokio::spawn(async move {
                for i in (task..lwts).step_by(concurrency) {
                    ledger
                        .session()
                        .execute_unpaged(&insert, (format!("k-{i}"),))
                        .await
                        .expect("an LWT insert");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let ceiling = lwts as f64 / started.elapsed().as_secs_f64();
    println!(
        "cql_ledger: LWT ceiling: {lwts} INSERT IF NOT EXISTS ({concurrency} concurrent) at {ceiling:.0} LWT/s"
    );

    // 2. The ledger's work per effect, for each semantics.
    for (tool, semantics) in [
        ("email/send", "IDEMPOTENT"),
        ("payments/wire", "NON_IDEMPOTENT"),
        ("search/lookup", "OBSERVE_ONLY"),
    ] {
        let before = ledger.stats();
        let started = Instant::now();
        let tasks: Vec<_> = (0..concurrency)
            .map(|task| {
                let ledger = Arc::clone(&ledger);
                tokio::spawn(async move {
                    for i in (task..effects).step_by(concurrency) {
                        dispatch_effect(&*ledger, tool, task, i / concurrency, per_run).await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        let rate = effects as f64 / started.elapsed().as_secs_f64();
        let spent = ledger.stats().since(&before);
        let lwt_per_effect = spent.total_lwt() as f64 / effects.max(1) as f64;
        println!(
            "cql_ledger: {semantics} ({tool}), {per_run} effect(s) per run: {effects} effects at {rate:.0} effects/s ({:.0}% of the ceiling over {lwt_per_effect:.2} LWT each); per effect {}",
            100.0 * rate * lwt_per_effect / ceiling,
            per_effect(&spent, effects)
        );
    }
    let _ = ledger
        .session()
        .query_unpaged(format!("DROP KEYSPACE IF EXISTS {keyspace}"), ())
        .await;
}

fn per_effect(spent: &StatsSnapshot, effects: usize) -> String {
    let n = effects as f64;
    let by_op: Vec<String> = spent
        .ops
        .iter()
        .filter(|(_, c)| c.lwt > 0)
        .map(|(op, c)| format!("{op} {:.2}", c.lwt as f64 / n))
        .collect();
    let plain_by_op: Vec<String> = spent
        .ops
        .iter()
        .filter(|(_, c)| c.plain > 0)
        .map(|(op, c)| format!("{op} {:.2}", c.plain as f64 / n))
        .collect();
    let serial: u64 = spent.ops.values().map(|c| c.serial).sum();
    format!(
        "{:.2} LWT ({}), {:.2} plain ({}), {:.2} serial round trips",
        spent.total_lwt() as f64 / n,
        by_op.join(", "),
        spent.total_plain() as f64 / n,
        plain_by_op.join(", "),
        serial as f64 / n
    )
}
