//! `sluice bench`: effects per second from submission to CONFIRMED, and their latency.
//!
//! One process starts the demo upstream without faults and, for each pass, a fresh pipeline on
//! its own ledger (so one pass's rows do not slow the next). Clients submit IDEMPOTENT
//! `email/send` effects spread over many runs through the real HTTP API — one per request
//! (`POST /v1/effects`) or in batches (`POST /v1/effects/batch`) — and the bench watches the
//! pipeline's lifecycle events in-process, as a consumer group of its own on the events topic.
//! An effect's latency is the time its CONFIRMED event was read minus the time its submission
//! was sent; throughput is the effects of a pass over the time from the first submission to
//! the last CONFIRMED.
//!
//! The closed-loop passes (each client task waits for its answer before sending again) find
//! the pipeline's capacity; a last open-loop pass offers half the measured batch throughput at
//! a steady pace, where the latency is that of a pipeline that is not saturated. Its latency is
//! measured from when each submission was *due*, so a client that falls behind does not hide
//! the wait (no coordinated omission).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use indicatif::ProgressBar;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sluice_assemble::example_catalog_at;
use sluice_bus::{BusError, Subscription, Topic};
use sluice_core::catalog::CatalogError;
use sluice_ledger::sqlite::Durability;
use sluice_runtime::config::{BusKind, LedgerKind, Role, TelemetryConfig, TokenConfig};
use sluice_runtime::messages::{event_type, header};
use sluice_runtime::{Config, Shutdown};
use sluice_upstream::{Faults, Upstream};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::demo::{DataDir, DataDirError, Progress, http_client, local_config};
use crate::dev::StartError;

mod agents;
mod measure;
mod pass;
mod report;

pub use agents::AgentsRow;
use measure::*;
use pass::*;
use report::print_settings;
pub use report::{BenchReport, PassResult, Settings};

/// The tool the bench's effects call, one per semantics of the example catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BenchTool {
    /// `email/send`: IDEMPOTENT.
    Email,
    /// `tickets/create`: IDEMPOTENT, with a status check.
    Ticket,
    /// `payments/wire`: NON_IDEMPOTENT, with a business key (one more LWT: its claim).
    Wire,
    /// `search/lookup`: OBSERVE_ONLY.
    Search,
}

impl BenchTool {
    pub fn name(self) -> &'static str {
        match self {
            Self::Email => "email/send",
            Self::Ticket => "tickets/create",
            Self::Wire => "payments/wire",
            Self::Search => "search/lookup",
        }
    }

    /// Arguments of effect `i`, distinct per effect (a wire's business key is unique).
    fn args(self, i: usize) -> Value {
        match self {
            Self::Email => json!({
                "to": format!("user{i}@example.com"),
                "subject": format!("bench {i}"),
                "body": "a benchmark effect",
            }),
            Self::Ticket => json!({ "title": format!("bench {i}"), "body": "a benchmark effect" }),
            Self::Wire => json!({
                "account": format!("acc-bench-{i}"),
                "amount_minor": 100,
                "beneficiary": "b-bench",
                "date": "2026-11-23",
            }),
            Self::Search => json!({ "query": format!("bench {i}") }),
        }
    }
}
/// The consumer group the bench reads lifecycle events as, after the bus's group prefix.
const EVENTS_GROUP: &str = "bench";
/// A pass gives up when no effect settled for this long.
const STALL: Duration = Duration::from_secs(30);
/// Client tasks of a pass unless `--concurrency` says otherwise.
const DEFAULT_CLIENTS: usize = 32;
/// The rows of `--mode agents` unless `--concurrency` says otherwise.
const DEFAULT_AGENTS: [usize; 4] = [1, 16, 64, 256];

/// The paced pass sends a batch this often (or less often at low rates).
const PACE_TICK: Duration = Duration::from_millis(10);

/// Which submission paths to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// One effect per `POST /v1/effects`.
    Single,
    /// `--batch` effects per `POST /v1/effects/batch`.
    Batch,
    /// Both, single first.
    Both,
    /// No closed-loop pass: only the paced pass at `--rate`.
    Paced,
    /// Agents in a closed loop, each effect one synchronous submission (`Prefer: wait`), one
    /// row per `--concurrency` value (default 1,16,64,256); the pipeline (`sluice dev`) and the
    /// upstream run in processes of their own.
    Agents,
}

/// How hard the ledger syncs (`ledger.durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DurabilityArg {
    /// fsync every commit group.
    Full,
    /// fsync at checkpoints only.
    Normal,
}

impl DurabilityArg {
    /// The configuration value, as written in a config file.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Normal => "normal",
        }
    }
}

impl From<Durability> for DurabilityArg {
    fn from(value: Durability) -> Self {
        match value {
            Durability::Full => Self::Full,
            Durability::Normal => Self::Normal,
        }
    }
}

impl From<DurabilityArg> for Durability {
    fn from(value: DurabilityArg) -> Self {
        match value {
            DurabilityArg::Full => Durability::Full,
            DurabilityArg::Normal => Durability::Normal,
        }
    }
}

/// Flags of `sluice bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Effects per pass.
    #[arg(long, default_value_t = 20_000)]
    pub effects: usize,
    /// The tool the effects call (its semantics decide the ledger work per effect).
    #[arg(long, value_enum, default_value_t = BenchTool::Email)]
    pub tool: BenchTool,
    /// A configuration file whose ledger and bus the passes use (e.g. deploy/distributed.toml
    /// for Kafka and Cassandra); default the embedded ledger and bus. Each pass gets topics of
    /// its own; the flags below override the file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Effects per batch submission.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Client tasks submitting at once (default 32); for `--mode agents` a comma-separated list
    /// of agent counts, one row each (default 1,16,64,256).
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Which submission paths to measure.
    #[arg(long, value_enum, default_value_t = Mode::Both)]
    pub mode: Mode,
    /// Ledger durability (`ledger.durability`). Default: the configuration file's, or `full`.
    #[arg(long, value_enum)]
    pub durability: Option<DurabilityArg>,
    /// Bus partitions (`bus.partitions`): each hands out one message at a time. Default: the
    /// configuration file's, or the bus kind's (256 embedded, 64 on Kafka).
    #[arg(long)]
    pub partitions: Option<u32>,
    /// Dispatcher concurrency (`dispatcher.concurrency`). Default: the configuration file's,
    /// or the bus kind's (256 embedded, 64 on Kafka).
    #[arg(long)]
    pub dispatcher_concurrency: Option<usize>,
    /// Effects per run (a run's effects are dispatched one after another).
    #[arg(long, default_value_t = 4)]
    pub effects_per_run: usize,
    /// Skip the paced pass at half the measured throughput.
    #[arg(long)]
    pub no_paced: bool,
    /// Also run a paced pass offering this many effects per second (batches every 10 ms):
    /// whether the pipeline keeps up with a steady load, and at what latency.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Where the ledgers live; default a fresh temporary directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep what the passes made at the end: the temporary data directory and, on a cluster,
    /// each pass's Kafka topics and the run's CQL keyspace (both removed by default).
    #[arg(long)]
    pub keep: bool,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
    /// Log filter of the pipeline's own logs (stderr).
    #[arg(long, default_value = "error")]
    pub log_level: String,
    /// For `--mode agents`: a command the pipeline process runs under, split on whitespace
    /// (e.g. `valgrind --tool=callgrind`), to profile the pipeline alone. The wrapped process
    /// is stopped with SIGTERM at the end of its row, so the profiler writes its output.
    #[arg(long)]
    pub pipeline_wrap: Option<String>,
}

impl BenchArgs {
    /// The defaults of the flags, for tests and embedding.
    pub fn defaults() -> Self {
        Self {
            effects: 20_000,
            tool: BenchTool::Email,
            config: None,
            batch: 500,
            concurrency: Vec::new(),
            mode: Mode::Both,
            durability: None,
            partitions: None,
            dispatcher_concurrency: None,
            effects_per_run: 4,
            no_paced: false,
            rate: None,
            data_dir: None,
            keep: false,
            json: false,
            log_level: "error".into(),
            pipeline_wrap: None,
        }
    }

    fn validate(&self) -> Result<(), BenchError> {
        let invalid = |flag: &'static str, why: &str| {
            Err(BenchError::InvalidFlag {
                flag,
                why: why.to_owned(),
            })
        };
        if self.effects == 0 {
            return invalid("--effects", "must be at least 1");
        }
        if self.batch == 0 {
            return invalid("--batch", "must be at least 1");
        }
        if self.concurrency.contains(&0) {
            return invalid("--concurrency", "must be at least 1");
        }
        if self.mode != Mode::Agents && self.concurrency.len() > 1 {
            return invalid("--concurrency", "takes one value except with --mode agents");
        }
        if self.effects_per_run == 0 {
            return invalid("--effects-per-run", "must be at least 1");
        }
        if self.mode == Mode::Paced && self.rate.is_none() {
            return invalid("--mode", "paced needs --rate");
        }
        if self
            .rate
            .is_some_and(|rate| !(rate.is_finite() && rate >= 1.0))
        {
            return invalid(
                "--rate",
                "must be a number of effects per second, at least 1",
            );
        }
        Ok(())
    }

    /// Client tasks of a single, batch or paced pass.
    pub fn clients(&self) -> usize {
        self.concurrency.first().copied().unwrap_or(DEFAULT_CLIENTS)
    }

    /// The agent counts of `--mode agents`, one row each.
    pub fn concurrency_list(&self, mode: Mode) -> Vec<usize> {
        match (mode, self.concurrency.is_empty()) {
            (Mode::Agents, true) => DEFAULT_AGENTS.to_vec(),
            (_, true) => vec![DEFAULT_CLIENTS],
            (_, false) => self.concurrency.clone(),
        }
    }

    /// The pipeline configuration of one pass.
    pub fn config(&self, data_dir: &Path) -> Result<Config, BenchError> {
        let mut config = match &self.config {
            Some(path) => {
                let mut config = Config::load(Some(path), std::env::vars())?;
                config.ledger.data_dir = data_dir.to_owned();
                config.ledger.cql.migrate_on_start = true;
                config.producer.listen =
                    std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
                config.telemetry = local_config(data_dir).telemetry;
                config
            }
            None => {
                // The embedded default as `sluice dev` runs it, fsync per commit group.
                let mut config = local_config(data_dir);
                config.ledger.durability = Durability::Full;
                config
            }
        };
        // A flag given overrides the file; one not given leaves the file's setting.
        if let Some(partitions) = self.partitions {
            config.bus.partitions = partitions;
        }
        if let Some(concurrency) = self.dispatcher_concurrency {
            config.dispatcher.concurrency = concurrency;
        }
        if let Some(durability) = self.durability {
            config.ledger.durability = durability.into();
        }
        config.producer.max_batch = config.producer.max_batch.max(self.batch);
        config.producer.max_body_bytes = config.producer.max_body_bytes.max(self.batch * 1_024);
        config.validate()?;
        Ok(config)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("flag {flag} {why}")]
    InvalidFlag { flag: &'static str, why: String },
    #[error("invalid pipeline configuration")]
    Config(#[from] sluice_runtime::config::ConfigError),
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error("cannot start the demo upstream")]
    Upstream(#[source] std::io::Error),
    #[error("the example catalog does not load")]
    Catalog(#[from] CatalogError),
    #[error("cannot start the pipeline")]
    Start(#[from] StartError),
    #[error("cannot watch the lifecycle events")]
    Bus(#[from] BusError),
    #[error("bench {pass}: {what} failed")]
    Http {
        pass: String,
        what: &'static str,
        #[source]
        source: reqwest::Error,
    },
    #[error("bench {pass}: {refused} of {effects} submissions were refused, first: {first}")]
    Refused {
        pass: String,
        refused: usize,
        effects: usize,
        first: String,
    },
    #[error(
        "bench {pass}: only {confirmed} of {effects} effects were confirmed ({failed} ended otherwise){}",
        stall_note(*.stalled)
    )]
    Incomplete {
        pass: String,
        confirmed: usize,
        failed: usize,
        effects: usize,
        stalled: bool,
    },
    #[error("bench {pass}: the pipeline stopped with an error: {error}")]
    Stopped { pass: String, error: String },
    #[error("interrupted")]
    Interrupted,
    #[error("agents bench: {0}")]
    Process(String),
}

fn stall_note(stalled: bool) -> String {
    if stalled {
        format!("; then nothing settled for {} s", STALL.as_secs())
    } else {
        String::new()
    }
}

/// Runs `sluice bench` as the flags say and prints the results.
pub fn run(args: BenchArgs, shutdown: Shutdown) -> BoxFuture<'static, Result<(), BenchError>> {
    Box::pin(run_body(args, shutdown))
}

async fn run_body(args: BenchArgs, shutdown: Shutdown) -> Result<(), BenchError> {
    sluice_runtime::telemetry::init(&TelemetryConfig {
        log_level: args.log_level.clone(),
        ..TelemetryConfig::default()
    });
    args.validate()?;
    let data_dir = DataDir::prepare(args.data_dir.as_deref(), "sluice-bench-")?;
    let progress = Progress::new(!args.json);
    let json = args.json;
    if args.mode == Mode::Agents {
        if !json {
            println!(
                "sluice bench --mode agents: {} effects per row, IDEMPOTENT email/send, one `Prefer: wait=30` submission per effect; the pipeline (`sluice dev`, ledger.durability = {}) and the demo upstream in processes of their own",
                args.effects,
                args.durability.unwrap_or(DurabilityArg::Full).as_str()
            );
        }
        let rows = agents::run_agents(&args, data_dir.path(), &shutdown, &progress).await;
        progress.clear();
        let kept = data_dir.finish(args.keep);
        let rows = rows?;
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(&rows).unwrap_or_default()
            );
        } else if let Ok(Some(path)) = kept {
            println!("data kept in {}", path.display());
        }
        return Ok(());
    }
    let outcome = execute(&args, data_dir.path(), &shutdown, &progress, |settings| {
        if !json {
            print_settings(settings);
        }
    })
    .await;
    progress.clear();
    let kept = data_dir.finish(args.keep);
    let report = outcome?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        if let Ok(Some(path)) = kept {
            println!("data kept in {}", path.display());
        }
        for left in &report.left_behind {
            println!("{left}");
        }
    }
    Ok(())
}

/// Starts the upstream, runs the passes the flags ask for, each on a fresh pipeline under
/// `data_dir`, and stops everything. `announce` is called before the first pass, and each
/// result line is printed as its pass ends unless `args.json`.
pub async fn execute(
    args: &BenchArgs,
    data_dir: &Path,
    shutdown: &Shutdown,
    progress: &Progress,
    announce: impl FnOnce(&Settings),
) -> Result<BenchReport, BenchError> {
    args.validate()?;
    let probe = args.config(data_dir)?;
    let scratch = Scratch::new(&probe, args.keep);
    let settings = Settings {
        effects: args.effects,
        effects_per_run: args.effects_per_run,
        tool: args.tool.name(),
        ledger: format!("{:?}", probe.ledger.kind).to_ascii_lowercase(),
        bus: format!("{:?}", probe.bus.kind).to_ascii_lowercase(),
        batch: args.batch,
        concurrency: args.clients(),
        partitions: probe.bus.partitions,
        admission: probe.bus.admission,
        dispatcher_concurrency: probe.dispatcher.concurrency,
        durability: probe.ledger.durability.into(),
        sweep_interval_ms: probe.reconciler.sweep_interval_ms,
        data_dir: data_dir.to_owned(),
        keyspace: scratch.keyspace.clone(),
    };
    announce(&settings);
    let upstream = Upstream::start(
        std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0)),
        Faults::none(),
        0,
    )
    .await
    .map_err(BenchError::Upstream)?;
    let passes = async {
        let mut results: Vec<PassResult> = Vec::new();
        let measure = |submission| {
            run_pass(
                args, submission, &upstream, data_dir, &scratch, shutdown, progress,
            )
        };
        let mut planned = Vec::new();
        if matches!(args.mode, Mode::Single | Mode::Both) {
            planned.push(Submission::Single);
        }
        if matches!(args.mode, Mode::Batch | Mode::Both) {
            planned.push(Submission::Batch);
        }
        for submission in planned {
            results.push(measure(submission).await?);
        }
        if !args.no_paced
            && let Some(last) = results.last()
        {
            // Half of the last closed-loop pass: the batch one when it ran.
            let half = Submission::Paced {
                rate: last.confirmed_per_sec / 2.0,
                of: format!("{} at half rate", last.pass),
            };
            results.push(measure(half).await?);
        }
        if let Some(rate) = args.rate {
            let steady = Submission::Paced {
                rate,
                of: format!("batch at {rate:.0} effects/s"),
            };
            results.push(measure(steady).await?);
        }
        Ok::<_, BenchError>(results)
    };
    let results = tokio::select! {
        results = passes => results,
        () = shutdown.cancelled() => Err(BenchError::Interrupted),
    };
    upstream.shutdown().await;
    let left_behind = scratch.finish(&probe).await;
    Ok(BenchReport {
        settings,
        results: results?,
        left_behind,
    })
}

/// What a run makes on a cluster besides its measurements — each pass's Kafka topics and the
/// run's CQL keyspace — and removes as soon as they are done with, unless `--keep`. On the
/// embedded default there is nothing: the data directory is [`DataDir`]'s.
struct Scratch {
    keep: bool,
    /// On a CQL ledger, a keyspace of the run's own: the configured one may hold a real ledger,
    /// and the bench's runs have no business there.
    keyspace: Option<String>,
    /// The configurations of passes whose Kafka topics still exist.
    topics: std::sync::Mutex<Vec<Config>>,
    /// What was kept, or could not be removed.
    left: std::sync::Mutex<Vec<String>>,
}

impl Scratch {
    fn new(probe: &Config, keep: bool) -> Self {
        let keyspace = (probe.ledger.kind == LedgerKind::Cql).then(|| {
            let nonce = &uuid::Uuid::new_v4().simple().to_string()[..8];
            // Keyspace names are at most 48 characters.
            let room = 48 - "_bench_".len() - nonce.len();
            let base: String = probe.ledger.cql.keyspace.chars().take(room).collect();
            format!("{base}_bench_{nonce}")
        });
        Self {
            keep,
            keyspace,
            topics: std::sync::Mutex::default(),
            left: std::sync::Mutex::default(),
        }
    }

    /// Points a pass's configuration at the run's keyspace and notes the topics it will make.
    fn adopt(&self, config: &mut Config) {
        if let Some(keyspace) = &self.keyspace {
            config.ledger.cql.keyspace.clone_from(keyspace);
        }
        if config.bus.kind == BusKind::Kafka {
            lock(&self.topics).push(config.clone());
        }
    }

    fn note(&self, what: String) {
        lock(&self.left).push(what);
    }

    /// Deletes the topics of the passes noted so far.
    async fn tidy_topics(&self) {
        let passes = std::mem::take(&mut *lock(&self.topics));
        for config in passes {
            let prefix = &config.bus.topic_prefix;
            if self.keep {
                self.note(format!("kept: the Kafka topics {prefix}*"));
            } else if let Err(e) = sluice_assemble::delete_topics(&config).await {
                self.note(format!("not removed: the Kafka topics {prefix}* ({e})"));
            }
        }
    }

    /// Removes what is left at the end of the run; says what stays.
    async fn finish(self, probe: &Config) -> Vec<String> {
        self.tidy_topics().await;
        if let Some(keyspace) = &self.keyspace {
            if self.keep {
                self.note(format!("kept: the CQL keyspace {keyspace}"));
            } else {
                let mut config = probe.clone();
                config.ledger.cql.keyspace.clone_from(keyspace);
                if let Err(e) = sluice_assemble::drop_keyspace(&config).await {
                    self.note(format!("not removed: the CQL keyspace {keyspace} ({e})"));
                }
            }
        }
        self.left
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The name of the agent token the bench submits with.
const BENCH_AGENT: &str = "bench-agent";
/// The client reads only each effect's status, so it asks for answers without the commands,
/// as a client submitting at volume would (RFC 7240; see the producer's `wants_minimal`).
const PREFER: &str = "prefer";
const RETURN_MINIMAL: &str = "return=minimal";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_fits_the_batch_and_validates() {
        let args = BenchArgs {
            batch: 5_000,
            ..BenchArgs::defaults()
        };
        let config = args.config(Path::new("/tmp/x")).expect("valid");
        assert_eq!(config.producer.max_batch, 5_000);
        assert_eq!(
            config.bus.partitions,
            sluice_runtime::config::EMBEDDED_PARTITIONS
        );
        assert_eq!(
            config.dispatcher.concurrency,
            sluice_runtime::config::EMBEDDED_PARTITIONS as usize
        );
        assert_eq!(config.ledger.durability, Durability::Full);
        config.validate().expect("valid");
    }

    #[test]
    fn a_configuration_file_keeps_its_settings_unless_a_flag_says_otherwise() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("bench.toml");
        std::fs::write(
            &file,
            "[bus]\npartitions = 12\n[dispatcher]\nconcurrency = 48\n[ledger]\ndurability = \"normal\"\n",
        )
        .expect("write the configuration");
        let from_file = BenchArgs {
            config: Some(file.clone()),
            ..BenchArgs::defaults()
        };
        let config = from_file.config(dir.path()).expect("valid");
        assert_eq!(config.bus.partitions, 12);
        assert_eq!(config.dispatcher.concurrency, 48);
        assert_eq!(config.ledger.durability, Durability::Normal);

        let flagged = BenchArgs {
            config: Some(file),
            partitions: Some(16),
            dispatcher_concurrency: Some(8),
            durability: Some(DurabilityArg::Full),
            ..BenchArgs::defaults()
        };
        let config = flagged.config(dir.path()).expect("valid");
        assert_eq!(config.bus.partitions, 16);
        assert_eq!(config.dispatcher.concurrency, 8);
        assert_eq!(config.ledger.durability, Durability::Full);
    }
}
