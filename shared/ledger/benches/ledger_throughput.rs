//! Ledger throughput with group commit: each effect is the ledger work of one dispatch —
//! reserve, acquire the lease, finalize — with the audit record each of them appends.
//!
//! `cargo bench -p sluice-ledger --bench ledger_throughput -- [effects] [concurrency] [full|normal]`
//!
//! Prints effects/s, ledger operations/s and the per-effect latency percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_ledger::Ledger;
use sluice_ledger::contract::dispatch_effect;
use sluice_ledger::sqlite::{Durability, SqliteConfig, SqliteLedger};

/// The allocator the Sluice binaries use: the writer thread frees what request tasks
/// allocated, which glibc's per-thread arenas handle poorly.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let effects: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(60_000);
    let concurrency: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1_024);
    let durability = match args.get(2).map(String::as_str) {
        Some("normal") => Durability::Normal,
        _ => Durability::Full,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(effects, concurrency, durability));
}

async fn run(effects: usize, concurrency: usize, durability: Durability) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = SqliteConfig {
        durability,
        ..SqliteConfig::in_dir(dir.path())
    };
    let ledger: Arc<dyn Ledger> = Arc::new(SqliteLedger::open(config).expect("open"));
    let per_task = effects.div_ceil(concurrency);
    let started = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let ledger = Arc::clone(&ledger);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let begun = Instant::now();
                    dispatch_effect(&*ledger, "payments/wire", task, i, 10).await;
                    latencies.push(begun.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut latencies: Vec<Duration> = Vec::with_capacity(effects);
    for task in tasks {
        latencies.extend(task.await.expect("task"));
    }
    let elapsed = started.elapsed();
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let done = latencies.len() as f64;
    println!(
        "ledger_throughput: {} effects ({} concurrent, durability {:?}) in {:.2} s: {:.0} effects/s, {:.0} ledger ops/s (3 writes + 3 audit records per effect); per-effect latency p50 {:.1} ms, p99 {:.1} ms",
        latencies.len(),
        concurrency,
        durability,
        elapsed.as_secs_f64(),
        done / elapsed.as_secs_f64(),
        done * 3.0 / elapsed.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
}
