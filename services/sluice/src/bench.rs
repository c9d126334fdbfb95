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

use indicatif::ProgressBar;
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sluice_bus::{BusError, Subscription, Topic};
use sluice_core::catalog::CatalogError;
use sluice_ledger::sqlite::Durability;
use sluice_runtime::assemble::example_catalog_at;
use sluice_runtime::config::{BusKind, LedgerKind, Role, TelemetryConfig, TokenConfig};
use sluice_runtime::messages::{event_type, header};
use sluice_runtime::{Config, Shutdown};
use sluice_upstream::{Faults, Upstream};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::demo::{DataDir, DataDirError, Progress, http_client, local_config};
use crate::dev::StartError;

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
/// The consumer group the bench reads lifecycle events as.
const EVENTS_GROUP: &str = "sluice-bench";
/// A pass gives up when no effect settled for this long.
const STALL: Duration = Duration::from_secs(30);
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
    /// Client tasks submitting at once.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
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
}

impl BenchArgs {
    /// The defaults of the flags, for tests and embedding.
    pub fn defaults() -> Self {
        Self {
            effects: 20_000,
            tool: BenchTool::Email,
            config: None,
            batch: 500,
            concurrency: 32,
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
        if self.concurrency == 0 {
            return invalid("--concurrency", "must be at least 1");
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
}

fn stall_note(stalled: bool) -> String {
    if stalled {
        format!("; then nothing settled for {} s", STALL.as_secs())
    } else {
        String::new()
    }
}

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
        if !self.round_trips_per_effect.is_empty() {
            let kinds: Vec<String> = self
                .round_trips_per_effect
                .iter()
                .map(|(kind, n)| format!("{n:.2} {kind}"))
                .collect();
            let lwt: Vec<String> = self
                .lwt_per_effect_by_op
                .iter()
                .filter(|(_, n)| **n > 0.0)
                .map(|(op, n)| format!("{op} {n:.2}"))
                .collect();
            line.push_str(&format!(
                "\n  ledger round trips per effect: {} (LWT by operation: {})",
                kinds.join(", "),
                lwt.join(", ")
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

/// Runs `sluice bench` as the flags say and prints the results.
pub async fn run(args: BenchArgs, shutdown: Shutdown) -> Result<(), BenchError> {
    sluice_runtime::telemetry::init(&TelemetryConfig {
        log_level: args.log_level.clone(),
        ..TelemetryConfig::default()
    });
    args.validate()?;
    let data_dir = DataDir::prepare(args.data_dir.as_deref(), "sluice-bench-")?;
    let progress = Progress::new(!args.json);
    let json = args.json;
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
        concurrency: args.concurrency,
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
            } else if let Err(e) = sluice_runtime::assemble::delete_topics(&config).await {
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
                if let Err(e) = sluice_runtime::assemble::drop_keyspace(&config).await {
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

/// How a pass submits its effects.
#[derive(Debug, Clone)]
enum Submission {
    Single,
    Batch,
    /// Open loop: batches sent on a fixed schedule at `rate` effects per second.
    Paced {
        rate: f64,
        of: String,
    },
}

impl Submission {
    fn name(&self) -> String {
        match self {
            Self::Single => "single".into(),
            Self::Batch => "batch".into(),
            Self::Paced { of, .. } => format!("{of}, paced"),
        }
    }

    fn slug(&self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Batch => "batch",
            Self::Paced { .. } => "paced",
        }
    }
}

/// The effects of one pass and where each one's events are expected.
#[derive(Debug)]
struct Workload {
    /// Each effect's request body, encoded before the pass starts: the client shares the
    /// pipeline's 2 cores, so it spends as little of them as it can.
    bodies: Vec<Box<RawValue>>,
    /// `<run_id>/<command_key>` (the events' `ce_subject`) to the effect's index.
    index: HashMap<String, usize>,
}

impl Workload {
    fn new(slug: &str, tool: BenchTool, effects: usize, per_run: usize) -> Self {
        let name = tool.name();
        let nonce = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let mut bodies = Vec::with_capacity(effects);
        let mut index = HashMap::with_capacity(effects);
        for i in 0..effects {
            let run_id = format!("bench-{nonce}-{slug}-{}", i / per_run);
            let decision = i % per_run;
            index.insert(format!("{run_id}/d-{decision}/{name}/0"), i);
            let body = json!({
                "run_id": run_id,
                "decision": decision,
                "tool": name,
                "call_idx": 0,
                "args": tool.args(i),
            });
            bodies.push(serde_json::value::to_raw_value(&body).expect("a JSON value encodes"));
        }
        Self { bodies, index }
    }

    /// The body of `POST /v1/effects/batch` for the effects in `range`, joined from their
    /// encoded bodies.
    fn batch_body(&self, range: std::ops::Range<usize>) -> String {
        let effects = &self.bodies[range];
        let len = effects.iter().map(|b| b.get().len() + 1).sum::<usize>();
        let mut body = String::with_capacity(len + 16);
        body.push_str("{\"effects\":[");
        for (i, effect) in effects.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(effect.get());
        }
        body.push_str("]}");
        body
    }
}

/// What the client reads of a batch answer: each effect's status, and its error when it has
/// one. The (minimal) commands in the answer are skipped, not built.
#[derive(Debug, serde::Deserialize)]
struct BatchStatuses {
    results: Vec<EffectStatus>,
}

#[derive(Debug, serde::Deserialize)]
struct EffectStatus {
    status: u16,
    #[serde(default)]
    error: Option<Box<RawValue>>,
}

/// When each effect was sent and confirmed, in nanoseconds since `origin` plus one (0: not
/// yet), written by the submitting tasks and the events reader.
#[derive(Debug)]
struct Tracker {
    origin: Instant,
    sent: Vec<AtomicU64>,
    confirmed: Vec<AtomicU64>,
    confirmed_count: AtomicUsize,
    /// Effects that settled otherwise (FAILED, STUCK, BLOCKED, CANCELLED).
    failed: AtomicUsize,
    refused: AtomicUsize,
    first_refusal: std::sync::Mutex<Option<String>>,
    settled: Notify,
}

impl Tracker {
    fn new(effects: usize) -> Self {
        Self {
            origin: Instant::now(),
            sent: (0..effects).map(|_| AtomicU64::new(0)).collect(),
            confirmed: (0..effects).map(|_| AtomicU64::new(0)).collect(),
            confirmed_count: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            first_refusal: std::sync::Mutex::new(None),
            settled: Notify::new(),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX - 1)
            + 1
    }

    fn mark_sent(&self, effect: usize, at: Instant) {
        self.sent[effect].store(self.stamp(at), Ordering::Relaxed);
    }

    fn refuse(&self, count: usize, why: String) {
        self.refused.fetch_add(count, Ordering::Relaxed);
        if let Ok(mut first) = self.first_refusal.lock() {
            first.get_or_insert(why);
        }
    }

    fn settled(&self) -> usize {
        self.confirmed_count.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }
}

/// Starts a pipeline on a fresh ledger, measures one pass and stops the pipeline.
/// The pass's result line is printed as it ends unless `args.json`.
async fn run_pass(
    args: &BenchArgs,
    submission: Submission,
    upstream: &Upstream,
    data_dir: &Path,
    scratch: &Scratch,
    shutdown: &Shutdown,
    progress: &Progress,
) -> Result<PassResult, BenchError> {
    let pass = submission.name();
    let mut config = args.config(&data_dir.join(submission.slug()))?;
    // Topics of its own per pass on a shared broker: the events group reads only this pass.
    config.bus.topic_prefix = format!(
        "{}bench-{}-{}.",
        config.bus.topic_prefix,
        &uuid::Uuid::new_v4().simple().to_string()[..8],
        submission.slug()
    );
    scratch.adopt(&mut config);
    // The client submits as an agent, with a bearer token, as agents do in production: the
    // producer then checks that each effect goes into a run of the agent's own.
    let token = uuid::Uuid::new_v4().simple().to_string();
    config.auth.tokens.push(TokenConfig {
        name: BENCH_AGENT.into(),
        role: Role::Agent,
        token: Some(token.clone()),
        token_sha256: None,
    });
    let catalog = example_catalog_at(&upstream.base_url())?;
    let pipeline = crate::dev::start(&config, catalog, shutdown.child_token()).await?;
    let measured = async {
        // Subscribed before the first submission, so no event is missed: a new group reads
        // the topic from its oldest message.
        let events = pipeline
            .ctx
            .bus
            .subscribe(Topic::Events, EVENTS_GROUP, "bench")
            .await?;
        let workload = Arc::new(Workload::new(
            submission.slug(),
            args.tool,
            args.effects,
            args.effects_per_run,
        ));
        let tracker = Arc::new(Tracker::new(args.effects));
        let bar = progress.bar(args.effects as u64, submission.slug());
        let reader = tokio::spawn(read_events(
            events,
            Arc::clone(&workload),
            Arc::clone(&tracker),
            bar.clone(),
        ));
        let client = http_client(Some(&token));
        let url = pipeline.url();
        let cpu_before = process_cpu();
        let submitted = submit(&client, &url, &submission, args, &pass, &workload, &tracker).await;
        let submit_secs = tracker.origin.elapsed().as_secs_f64();
        let stalled = submitted.is_ok() && !wait_settled(&tracker, args.effects).await;
        let cpu = process_cpu()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        reader.abort();
        bar.finish_and_clear();
        submitted?;
        let refused = tracker.refused.load(Ordering::Relaxed);
        if refused > 0 {
            return Err(BenchError::Refused {
                pass: pass.clone(),
                refused,
                effects: args.effects,
                first: tracker
                    .first_refusal
                    .lock()
                    .ok()
                    .and_then(|first| first.clone())
                    .unwrap_or_default(),
            });
        }
        let confirmed = tracker.confirmed_count.load(Ordering::Relaxed);
        if confirmed < args.effects {
            return Err(BenchError::Incomplete {
                pass: pass.clone(),
                confirmed,
                failed: tracker.failed.load(Ordering::Relaxed),
                effects: args.effects,
                stalled,
            });
        }
        let mut result = summarize(&pass, &submission, &tracker, submit_secs, cpu);
        count_round_trips(&mut result, pipeline.ctx.ledger.round_trips());
        Ok(result)
    };
    let result = measured.await;
    let stopped = pipeline.stop().await;
    scratch.tidy_topics().await;
    let result = result?;
    stopped.map_err(|error| BenchError::Stopped { pass, error })?;
    if !args.json {
        println!("{}", result.line());
    }
    Ok(result)
}

/// Reads lifecycle events and stamps the effects they confirm.
async fn read_events(
    mut events: Subscription,
    workload: Arc<Workload>,
    tracker: Arc<Tracker>,
    bar: ProgressBar,
) {
    let confirmed = event_type(sluice_core::command::CommandStatus::Confirmed);
    while let Some(delivery) = events.next().await {
        let at = Instant::now();
        let headers = &delivery.message.headers;
        if let (Some(subject), Some(kind)) =
            (header(headers, "ce_subject"), header(headers, "ce_type"))
        {
            if let Some(&effect) = workload.index.get(subject) {
                if kind == confirmed {
                    // The first CONFIRMED counts; a repeated event (at-least-once) does not.
                    if tracker.confirmed[effect]
                        .compare_exchange(
                            0,
                            tracker.stamp(at),
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        tracker.confirmed_count.fetch_add(1, Ordering::Relaxed);
                        bar.inc(1);
                        tracker.settled.notify_one();
                    }
                } else {
                    tracker.failed.fetch_add(1, Ordering::Relaxed);
                    tracker.settled.notify_one();
                }
            }
        }
        // Acknowledged so the partition hands out its next event; a refusal only means the
        // partition moved, which cannot happen to the group's only member.
        let _ = delivery.ack().await;
    }
}

/// Waits until every effect settled (true), or nothing settled for [`STALL`] (false).
async fn wait_settled(tracker: &Tracker, effects: usize) -> bool {
    let mut last = tracker.settled();
    let mut quiet_since = Instant::now();
    while tracker.settled() < effects {
        let _ = tokio::time::timeout(Duration::from_millis(200), tracker.settled.notified()).await;
        let now = tracker.settled();
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= STALL {
            return false;
        }
    }
    true
}

/// Sends the workload as `submission` says; returns when every submission was answered.
async fn submit(
    client: &reqwest::Client,
    url: &str,
    submission: &Submission,
    args: &BenchArgs,
    pass: &str,
    workload: &Arc<Workload>,
    tracker: &Arc<Tracker>,
) -> Result<(), BenchError> {
    let effects = workload.bodies.len();
    let mut tasks: JoinSet<Result<(), BenchError>> = JoinSet::new();
    match submission {
        Submission::Single => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..args.concurrency.min(effects) {
                let (client, url, pass) = (client.clone(), url.to_owned(), pass.to_owned());
                let (workload, tracker, next) =
                    (Arc::clone(workload), Arc::clone(tracker), Arc::clone(&next));
                tasks.spawn(async move {
                    loop {
                        let effect = next.fetch_add(1, Ordering::Relaxed);
                        if effect >= workload.bodies.len() {
                            return Ok(());
                        }
                        tracker.mark_sent(effect, Instant::now());
                        post_one(&client, &url, &pass, &workload.bodies[effect], &tracker).await?;
                    }
                });
            }
        }
        Submission::Batch => {
            let batches: Arc<Vec<std::ops::Range<usize>>> = Arc::new(
                (0..effects)
                    .step_by(args.batch)
                    .map(|start| start..(start + args.batch).min(effects))
                    .collect(),
            );
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..args.concurrency.min(batches.len()) {
                let (client, url, pass) = (client.clone(), url.to_owned(), pass.to_owned());
                let (workload, tracker, next, batches) = (
                    Arc::clone(workload),
                    Arc::clone(tracker),
                    Arc::clone(&next),
                    Arc::clone(&batches),
                );
                tasks.spawn(async move {
                    loop {
                        let Some(range) = batches.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return Ok(());
                        };
                        let now = Instant::now();
                        for effect in range.clone() {
                            tracker.mark_sent(effect, now);
                        }
                        post_batch(&client, &url, &pass, &workload, range.clone(), &tracker)
                            .await?;
                    }
                });
            }
        }
        Submission::Paced { rate, .. } => {
            // A batch per tick; at low rates one effect every 1/rate seconds.
            let rate = rate.max(1.0);
            let tick = PACE_TICK.max(Duration::from_secs_f64(1.0 / rate));
            let per_tick = rate * tick.as_secs_f64();
            let start = tokio::time::Instant::now();
            let (mut sent, mut owed, mut ticks) = (0_usize, 0.0_f64, 0_u32);
            while sent < effects {
                let due = start + tick * ticks;
                tokio::time::sleep_until(due).await;
                ticks += 1;
                owed += per_tick;
                let count = (owed.floor() as usize).min(effects - sent);
                if count == 0 {
                    continue;
                }
                owed -= count as f64;
                let range = sent..sent + count;
                sent += count;
                // Stamped with when it was due, not when the task got to send it.
                let due = due.into_std();
                for effect in range.clone() {
                    tracker.mark_sent(effect, due);
                }
                let (client, url, pass) = (client.clone(), url.to_owned(), pass.to_owned());
                let (workload, tracker) = (Arc::clone(workload), Arc::clone(tracker));
                tasks.spawn(async move {
                    post_batch(&client, &url, &pass, &workload, range, &tracker).await
                });
                while let Some(done) = tasks.try_join_next() {
                    flatten(done)?;
                }
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        flatten(done)?;
    }
    Ok(())
}

fn flatten(done: Result<Result<(), BenchError>, tokio::task::JoinError>) -> Result<(), BenchError> {
    match done {
        Ok(result) => result,
        // A submitting task panicked: that is a bug in the bench, not a measurement.
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

async fn post_one(
    client: &reqwest::Client,
    url: &str,
    pass: &str,
    body: &RawValue,
    tracker: &Tracker,
) -> Result<(), BenchError> {
    let response = client
        .post(format!("{url}/v1/effects"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(PREFER, RETURN_MINIMAL)
        .body(body.get().to_owned())
        .send()
        .await
        .map_err(|source| BenchError::Http {
            pass: pass.to_owned(),
            what: "POST /v1/effects",
            source,
        })?;
    let status = response.status();
    if status != StatusCode::CREATED {
        let text = response.text().await.unwrap_or_default();
        tracker.refuse(1, format!("{status} {text}"));
    }
    Ok(())
}

async fn post_batch(
    client: &reqwest::Client,
    url: &str,
    pass: &str,
    workload: &Workload,
    range: std::ops::Range<usize>,
    tracker: &Tracker,
) -> Result<(), BenchError> {
    let count = range.len();
    let body = workload.batch_body(range);
    let http = |source| BenchError::Http {
        pass: pass.to_owned(),
        what: "POST /v1/effects/batch",
        source,
    };
    let response = client
        .post(format!("{url}/v1/effects/batch"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(PREFER, RETURN_MINIMAL)
        .body(body)
        .send()
        .await
        .map_err(http)?;
    let status = response.status();
    if status != StatusCode::OK {
        let text = response.text().await.unwrap_or_default();
        tracker.refuse(count, format!("{status} {text}"));
        return Ok(());
    }
    let answer: BatchStatuses = response.json().await.map_err(http)?;
    let results = answer.results;
    for result in &results {
        if result.status != 201 {
            let error = result.error.as_ref().map_or("no error given", |e| e.get());
            tracker.refuse(1, format!("{} {error}", result.status));
        }
    }
    if results.len() != count {
        tracker.refuse(
            count.saturating_sub(results.len()),
            format!("{} results for {count} effects", results.len()),
        );
    }
    Ok(())
}

/// The CPU time this process has used so far, all threads, user and system, to the kernel's
/// 10 ms tick.
///
/// Read from `/proc/self/stat` rather than the process CPU clock: the vDSO lookup behind that
/// clock crashes under valgrind, and `scripts/bench-instructions.sh` runs the bench there.
fn process_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_of_stat(&stat)
}

/// `utime + stime` of a `/proc/<pid>/stat` line. The fields after the command name (which may
/// hold spaces and parentheses, hence the last `)`) start at the state, field 3; utime and
/// stime are fields 14 and 15, in USER_HZ ticks (100 per second on Linux, whatever the kernel's
/// own tick).
fn cpu_of_stat(stat: &str) -> Option<Duration> {
    const TICKS_PER_SECOND: u64 = 100;
    let (_, fields) = stat.rsplit_once(')')?;
    let mut fields = fields.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis(
        (user + system) * 1_000 / TICKS_PER_SECOND,
    ))
}

/// Throughput and latency percentiles of a finished pass.
fn summarize(
    pass: &str,
    submission: &Submission,
    tracker: &Tracker,
    submit_secs: f64,
    cpu: Option<Duration>,
) -> PassResult {
    let mut latencies: Vec<u64> = Vec::with_capacity(tracker.sent.len());
    let (mut first_sent, mut last_confirmed) = (u64::MAX, 0);
    for (sent, confirmed) in tracker.sent.iter().zip(&tracker.confirmed) {
        let (sent, confirmed) = (
            sent.load(Ordering::Relaxed),
            confirmed.load(Ordering::Relaxed),
        );
        if sent == 0 || confirmed == 0 {
            continue;
        }
        first_sent = first_sent.min(sent);
        last_confirmed = last_confirmed.max(confirmed);
        latencies.push(confirmed.saturating_sub(sent));
    }
    latencies.sort_unstable();
    let secs = last_confirmed.saturating_sub(first_sent) as f64 / 1e9;
    let ms = |nanos: u64| nanos as f64 / 1e6;
    PassResult {
        pass: pass.to_owned(),
        effects: latencies.len(),
        offered_per_sec: match submission {
            Submission::Paced { rate, .. } => Some(*rate),
            Submission::Single | Submission::Batch => None,
        },
        submit_secs,
        secs,
        confirmed_per_sec: if secs > 0.0 {
            latencies.len() as f64 / secs
        } else {
            0.0
        },
        p50_ms: ms(percentile(&latencies, 0.50)),
        p99_ms: ms(percentile(&latencies, 0.99)),
        max_ms: ms(latencies.last().copied().unwrap_or(0)),
        cpu_us_per_effect: cpu
            .filter(|_| !latencies.is_empty())
            .map(|cpu| cpu.as_secs_f64() * 1e6 / latencies.len() as f64),
        round_trips_per_effect: BTreeMap::new(),
        lwt_per_effect_by_op: BTreeMap::new(),
        plain_per_effect_by_op: BTreeMap::new(),
    }
}

/// Divides the pass's ledger round trips (a fresh ledger handle per pass) by its effects.
fn count_round_trips(result: &mut PassResult, trips: Vec<sluice_ledger::RoundTrips>) {
    let effects = result.effects.max(1) as f64;
    for trip in trips {
        *result.round_trips_per_effect.entry(trip.kind).or_default() += trip.count as f64 / effects;
        let by_op = match trip.kind {
            "lwt" => &mut result.lwt_per_effect_by_op,
            "plain" => &mut result.plain_per_effect_by_op,
            _ => continue,
        };
        *by_op.entry(trip.op).or_default() += trip.count as f64 / effects;
    }
}

/// The nearest-rank percentile of sorted `values` (0 when empty).
fn percentile(sorted: &[u64], quantile: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (quantile * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The name of the agent token the bench submits with.
const BENCH_AGENT: &str = "bench-agent";
/// The client reads only each effect's status, so it asks for answers without the commands,
/// as a client submitting at volume would (RFC 7240; see the producer's `wants_minimal`).
const PREFER: &str = "prefer";
const RETURN_MINIMAL: &str = "return=minimal";

fn print_settings(settings: &Settings) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_from_the_stat_line() {
        // A command name with spaces and a parenthesis, as `/proc` may show it.
        let stat = "4242 (sluice (x) y) R 1 4242 4242 0 -1 4194304 900 0 0 0 \
                    1234 56 0 0 20 0 3 0 100 0 0";
        assert_eq!(cpu_of_stat(stat), Some(Duration::from_millis(12_900)));
        assert_eq!(cpu_of_stat("4242 (short) R 1"), None);
        // Spinning shows up as CPU time within a few ticks, however busy the machine.
        let spent = process_cpu().expect("this process's stat");
        let started = std::time::Instant::now();
        let mut spins = 0_u64;
        loop {
            spins = std::hint::black_box(spins + 1);
            let now = process_cpu().expect("this process's stat");
            if now >= spent + Duration::from_millis(20) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "10 s of spinning and the CPU time stayed at {now:?} from {spent:?}"
            );
        }
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.50), 50);
        assert_eq!(percentile(&values, 0.99), 99);
        assert_eq!(percentile(&values, 1.0), 100);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn workload_subjects_match_the_command_keys() {
        let workload = Workload::new("single", BenchTool::Email, 10, 4);
        assert_eq!(workload.bodies.len(), 10);
        assert_eq!(workload.index.len(), 10);
        let body: Value = serde_json::from_str(workload.bodies[5].get()).expect("JSON");
        let subject = format!(
            "{}/d-{}/email/send/0",
            body["run_id"].as_str().expect("run id"),
            body["decision"]
        );
        assert_eq!(workload.index.get(&subject), Some(&5));
        let batch: Value = serde_json::from_str(&workload.batch_body(4..7)).expect("JSON");
        let effects = batch["effects"].as_array().expect("an array");
        assert_eq!(effects.len(), 3);
        assert_eq!(effects[1], body);
    }

    #[test]
    fn a_batch_answer_is_read_for_its_statuses() {
        let answer = r#"{"results":[{"status":201,"command":{"run_id":"r","args":{"a":[1,2]}}},
            {"status":422,"error":{"code":"invalid_arguments","message":"no"}}]}"#;
        let read: BatchStatuses = serde_json::from_str(answer).expect("parses");
        let statuses: Vec<u16> = read.results.iter().map(|r| r.status).collect();
        assert_eq!(statuses, vec![201, 422]);
        assert!(read.results[0].error.is_none());
        assert_eq!(
            read.results[1].error.as_ref().map(|e| e.get()),
            Some(r#"{"code":"invalid_arguments","message":"no"}"#)
        );
    }

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
