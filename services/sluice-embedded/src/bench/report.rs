//! What a bench reports: the settings it ran with, each pass's result and their printing.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::{BENCH_AGENT, DurabilityArg, PREFER, RETURN_MINIMAL};

/// The settings a bench ran with.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub effects: usize,
    pub effects_per_run: usize,
    pub tool: &'static str,
    /// `sqlite` or `cql`.
    pub ledger: String,
    /// `embedded` or `kafka`.
    pub bus: String,
    pub batch: usize,
    pub concurrency: usize,
    pub partitions: u32,
    /// `bus.admission` (the embedded bus's dispatch backlog; 0: no bound).
    pub admission: u32,
    pub dispatcher_concurrency: usize,
    pub durability: DurabilityArg,
    pub sweep_interval_ms: u64,
    pub data_dir: PathBuf,
    /// On a CQL ledger, the keyspace of this run's own that every pass writes to.
    pub keyspace: Option<String>,
}

/// The result of one pass.
#[derive(Debug, Clone, Serialize)]
pub struct PassResult {
    /// `single`, `batch`, or `<mode> paced`.
    pub pass: String,
    pub effects: usize,
    /// Effects per second offered by a paced pass.
    pub offered_per_sec: Option<f64>,
    /// From the first submission to the last answer.
    pub submit_secs: f64,
    /// From the first submission to the last CONFIRMED.
    pub secs: f64,
    pub confirmed_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// CPU time this process spent per confirmed effect, in microseconds, from the first
    /// submission until every effect settled: the pipeline, and on the embedded default also
    /// the demo upstream and the client, which run in the same process. Not the engines' CPU.
    pub cpu_us_per_effect: Option<f64>,
    /// Ledger round trips per confirmed effect, by kind (`lwt`, `serial`, `plain`), and the
    /// lightweight transactions per effect by operation; empty for the embedded ledger.
    pub round_trips_per_effect: BTreeMap<&'static str, f64>,
    pub lwt_per_effect_by_op: BTreeMap<&'static str, f64>,
    pub plain_per_effect_by_op: BTreeMap<&'static str, f64>,
    /// Bus messages per confirmed effect by topic: (published, fetched by the process's
    /// consumer groups and the bench's reader of `events`).
    pub bus_per_effect: BTreeMap<&'static str, (f64, f64)>,
    /// Submissions answered 503 (the pipeline's admission: behind) and sent again after the
    /// answer's `Retry-After`.
    pub deferred_503: usize,
}

impl PassResult {
    /// The one-line summary, e.g. `bench batch: 20000 effects in 3.2 s: …`.
    pub fn line(&self) -> String {
        let offered = self
            .offered_per_sec
            .map(|rate| format!(" ({rate:.0} effects/s offered)"))
            .unwrap_or_default();
        let mut line = format!(
            "bench {}{offered}: {} effects in {:.1} s: {:.0} effects/s confirmed; latency p50 {:.1} ms p99 {:.1} ms (max {:.1} ms; all submitted in {:.1} s)",
            self.pass,
            self.effects,
            self.secs,
            self.confirmed_per_sec,
            self.p50_ms,
            self.p99_ms,
            self.max_ms,
            self.submit_secs
        );
        if let Some(cpu) = self.cpu_us_per_effect {
            line.push_str(&format!("; {cpu:.0} µs of this process's CPU per effect"));
        }
        if self.deferred_503 > 0 {
            line.push_str(&format!(
                "; {} submissions answered 503 and sent again after Retry-After",
                self.deferred_503
            ));
        }
        if !self.round_trips_per_effect.is_empty() {
            let kinds: Vec<String> = self
                .round_trips_per_effect
                .iter()
                .map(|(kind, n)| format!("{n:.2} {kind}"))
                .collect();
            let by_op = |counts: &BTreeMap<&'static str, f64>| -> String {
                counts
                    .iter()
                    .filter(|(_, n)| **n > 0.0)
                    .map(|(op, n)| format!("{op} {n:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            line.push_str(&format!(
                "\n  ledger round trips per effect: {} (LWT by operation: {}; plain by operation: {})",
                kinds.join(", "),
                by_op(&self.lwt_per_effect_by_op),
                by_op(&self.plain_per_effect_by_op)
            ));
        }
        if !self.bus_per_effect.is_empty() {
            let topics: Vec<String> = self
                .bus_per_effect
                .iter()
                .map(|(topic, (published, fetched))| {
                    format!("{topic} {published:.2} published, {fetched:.2} fetched")
                })
                .collect();
            let (published, fetched) = self
                .bus_per_effect
                .values()
                .fold((0.0, 0.0), |(p, f), (published, fetched)| {
                    (p + published, f + fetched)
                });
            line.push_str(&format!(
                "\n  bus messages per effect: {published:.2} published, {fetched:.2} fetched ({})",
                topics.join("; ")
            ));
        }
        line
    }
}

/// Everything a bench measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub settings: Settings,
    pub results: Vec<PassResult>,
    /// What the run left on the engines: kept on purpose (`--keep`), or not removable (with
    /// the reason). Empty on the embedded default.
    pub left_behind: Vec<String>,
}

pub(super) fn print_settings(settings: &Settings) {
    println!(
        "sluice bench: {} {} effects per pass, {} per run; client: {} tasks as agent {BENCH_AGENT}, batches of {}, {PREFER}: {RETURN_MINIMAL}",
        settings.effects,
        settings.tool,
        settings.effects_per_run,
        settings.concurrency,
        settings.batch
    );
    let ledger = match &settings.keyspace {
        Some(keyspace) => format!(
            "fresh runs per pass in the CQL keyspace {keyspace}, the bench's own (dropped at the \
             end unless --keep)"
        ),
        None => format!(
            "a fresh ledger per pass under {}",
            settings.data_dir.display()
        ),
    };
    let admission = if settings.bus == "embedded" {
        format!(", bus.admission = {}", settings.admission)
    } else {
        String::new()
    };
    println!(
        "  pipeline: ledger {}, bus {}, bus.partitions = {}{admission}, \
         dispatcher.concurrency = {}, ledger.durability = {}, reconciler.sweep_interval_ms = {}; \
         {ledger}",
        settings.ledger,
        settings.bus,
        settings.partitions,
        settings.dispatcher_concurrency,
        settings.durability.as_str(),
        settings.sweep_interval_ms,
    );
    if settings.bus == "kafka" {
        println!("  bus: Kafka topics of each pass's own (deleted after the pass unless --keep)");
    }
    println!(
        "  upstream: the demo upstream on loopback, no faults; latency = CONFIRMED event read \
         in-process - submission sent"
    );
}
