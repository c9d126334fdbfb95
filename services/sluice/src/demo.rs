//! `sluice demo`: the whole pipeline against a misbehaving world, checked end to end.
//!
//! One process starts the demo upstream (a bank, mail, ticket and search service that injects
//! faults) and the four services on a fresh embedded ledger, then plays agents: it submits runs
//! of wires, emails, tickets and searches through the real HTTP API, long-polls each command
//! until it settles, rolls every K-th run back, and shows the idempotency contract (the same
//! key and arguments answer the stored command; other arguments answer 409).
//!
//! It ends with a table of what happened and checks the guarantees Sluice makes (README.md):
//! no business key has two standing wires (a duplicate commit left uncompensated), nothing
//! accepted is lost (every submitted command is in the ledger and settled by the deadline),
//! and every run's audit chain verifies. A broken guarantee makes the command fail.
//!
//! To keep the demo short the example catalog's timeouts are cut (see [`DEMO_TOOL_TIMEOUT_MS`]);
//! the upstream holds a `commit_then_timeout` answer longer than that, so those calls really
//! time out on Sluice's side and have to be reconciled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use reqwest::StatusCode;
use serde::Serialize;
use serde_json::{Value, json};
use sluice_assemble::{EXAMPLE_CATALOG, EXAMPLE_UPSTREAM};
use sluice_core::audit;
use sluice_core::catalog::{Catalog, CatalogError};
use sluice_core::command::{Command, CommandStatus, EffectSemantics};
use sluice_core::ids::RunId;
use sluice_ledger::LedgerError;
use sluice_runtime::config::TelemetryConfig;
use sluice_runtime::{Config, Shutdown};
use sluice_upstream::{FaultCounts, FaultKind, FaultRates, Faults, Upstream};

use crate::dev::{Pipeline, StartError};

/// Every connector timeout of the demo catalog (the example catalog has 10 s for wires).
pub const DEMO_TOOL_TIMEOUT_MS: u64 = 1_500;
/// The demo catalog's `settle_ms` (the example catalog has 2 s).
pub const DEMO_SETTLE_MS: u64 = 500;
/// The demo catalog's `verify_after_ms`, the last look at a commit (the example has 30 s): past
/// the landing horizon (the tool timeout as `late_commit_ms`, plus the 500 ms skew bound) and
/// the settle interval.
pub const DEMO_VERIFY_AFTER_MS: u64 = 3_000;
/// How long the upstream holds a `commit_then_timeout` answer: longer than every tool timeout,
/// so the client gives up first and the outcome is ambiguous.
pub const DEMO_TIMEOUT_SLEEP_MS: u64 = 3_000;
const _: () = assert!(DEMO_TIMEOUT_SLEEP_MS > DEMO_TOOL_TIMEOUT_MS);
/// How often the demo's reconciler sweeps the due index.
pub const DEMO_SWEEP_INTERVAL_MS: u64 = 200;
/// Bus partitions of the demo pipeline: runs on different partitions dispatch concurrently.
pub const DEMO_PARTITIONS: u32 = 16;

/// Wires above this many minor units need a person's approval (deploy/catalog.toml).
const APPROVAL_THRESHOLD_MINOR: i64 = 1_000_000;
/// Submissions in flight at once.
const SUBMIT_CONCURRENCY: usize = 8;
/// Runs whose commands are awaited at once.
const SETTLE_CONCURRENCY: usize = 32;
/// Longest single long poll.
const MAX_LONG_POLL: Duration = Duration::from_secs(30);
/// How often a rolled-back run is re-read while its compensations finish.
const ROLLBACK_POLL: Duration = Duration::from_millis(200);
/// Effects re-submitted unchanged to show that a replay answers the stored command.
const REPLAYS: usize = 3;
/// Reason given for the demo's rollbacks.
const ROLLBACK_REASON: &str = "sluice demo: every K-th run is rolled back";

/// Flags of `sluice demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Agent runs to play.
    #[arg(long, default_value_t = 40)]
    pub runs: u32,
    /// Effects per run.
    #[arg(long, default_value_t = 6)]
    pub effects: u32,
    /// Roll back every K-th run once its effects settled (0: never).
    #[arg(long, default_value_t = 5)]
    pub rollback_every: u32,
    /// Rate of each fault kind per upstream call (and of inconclusive status checks); at most
    /// 0.2 with every kind, since the faults of one call exclude each other.
    #[arg(long, default_value_t = 0.05)]
    pub fault_rate: f64,
    /// Leave this fault kind out (repeatable): commit_then_timeout, drop_response, error_5xx,
    /// commit_then_5xx, commit_twice, status_inconclusive.
    #[arg(long = "skip-fault", value_name = "KIND", value_parser = parse_fault_kind)]
    pub skip_faults: Vec<FaultKind>,
    /// Seed of the effect mix and of the upstream's faults.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Where the ledger lives; default a fresh temporary directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the temporary data directory at the end.
    #[arg(long)]
    pub keep: bool,
    /// Print a machine-readable summary (JSON) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Give up waiting for commands to settle after this many seconds.
    #[arg(long, default_value_t = 120)]
    pub deadline_secs: u64,
    /// Log filter of the pipeline's own logs (stderr), e.g. `warn` or `sluice=debug`.
    #[arg(long, default_value = "error")]
    pub log_level: String,
}

impl DemoArgs {
    /// The defaults of the flags, for tests and embedding.
    pub fn defaults() -> Self {
        Self {
            runs: 40,
            effects: 6,
            rollback_every: 5,
            fault_rate: 0.05,
            skip_faults: Vec::new(),
            seed: 7,
            data_dir: None,
            keep: false,
            json: false,
            deadline_secs: 120,
            log_level: "error".into(),
        }
    }

    fn validate(&self) -> Result<(), DemoError> {
        let invalid = |flag: &'static str, why: String| Err(DemoError::InvalidFlag { flag, why });
        if self.runs == 0 {
            return invalid("--runs", "must be at least 1".into());
        }
        if self.effects == 0 {
            return invalid("--effects", "must be at least 1".into());
        }
        // Each fault kind left gets the rate, and the faults of one call exclude each other:
        // with all five kinds of a bank call, 0.2 is the most.
        if let Err(e) = demo_faults(self.fault_rate, &self.skip_faults).validate() {
            return invalid(
                "--fault-rate",
                format!(
                    "is {}, which gives each fault kind left: {e}",
                    self.fault_rate
                ),
            );
        }
        if self.deadline_secs == 0 {
            return invalid("--deadline-secs", "must be at least 1".into());
        }
        Ok(())
    }

    fn is_rolled_back(&self, run: usize) -> bool {
        self.rollback_every != 0 && (run + 1) % self.rollback_every as usize == 0
    }
}

/// Why the demo could not run, or what it found broken.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("flag {flag} {why}")]
    InvalidFlag { flag: &'static str, why: String },
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    #[error("cannot start the demo upstream")]
    Upstream(#[source] std::io::Error),
    #[error("the demo catalog does not load")]
    Catalog(#[from] CatalogError),
    #[error("cannot start the pipeline")]
    Start(#[from] StartError),
    #[error("{what} failed")]
    Http {
        what: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{what} answered {status}: {body}")]
    Unexpected {
        what: String,
        status: StatusCode,
        body: String,
    },
    #[error("reading the ledger failed")]
    Ledger(#[from] LedgerError),
    #[error("interrupted")]
    Interrupted,
    #[error(
        "{} invariant(s) broken; the first: {}",
        .0.len(),
        .0.first().map_or("", String::as_str)
    )]
    InvariantsBroken(Vec<String>),
}

/// Runs `sluice demo` as the flags say: prints the header, the progress and the summary, and
/// fails when an invariant broke.
pub async fn run(args: DemoArgs, shutdown: Shutdown) -> Result<(), DemoError> {
    sluice_runtime::telemetry::init(&TelemetryConfig {
        log_level: args.log_level.clone(),
        ..TelemetryConfig::default()
    });
    args.validate()?;
    let data_dir = DataDir::prepare(args.data_dir.as_deref(), "sluice-demo-")?;
    let progress = Progress::new(!args.json);
    let json = args.json;
    let outcome = execute(&args, data_dir.path(), &shutdown, &progress, |setup| {
        if !json {
            print_header(&args, setup, data_dir.is_temporary());
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
        print_report(&report);
        match kept {
            Ok(Some(path)) => println!("data kept in {}", path.display()),
            Ok(None) => {}
            Err(e) => eprintln!("could not remove the data directory: {e}"),
        }
    }
    if report.violations.is_empty() {
        Ok(())
    } else {
        Err(DemoError::InvariantsBroken(report.violations))
    }
}

/// Where and how the demo runs, known once the upstream and the pipeline are up.
#[derive(Debug, Clone, Serialize)]
pub struct Setup {
    pub upstream_url: String,
    pub producer_url: String,
    pub data_dir: PathBuf,
    pub tool_timeout_ms: u64,
    pub settle_ms: u64,
    pub timeout_sleep_ms: u64,
    pub sweep_interval_ms: u64,
    pub partitions: u32,
}

/// Everything the demo saw, and the invariants it found broken.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub setup: Setup,
    pub runs: u32,
    pub effects_per_run: u32,
    pub rollback_every: u32,
    pub fault_rate: f64,
    pub skipped_faults: Vec<FaultKind>,
    pub seed: u64,
    pub elapsed_secs: f64,
    /// Commands created (201).
    pub submitted: u64,
    /// Runs rolled back.
    pub rolled_back_runs: u64,
    pub statuses: StatusCounts,
    pub reconciled: Reconciled,
    pub upstream: UpstreamReport,
    pub idempotency: IdempotencyReport,
    pub audit: AuditReport,
    /// The invariants that broke; empty when all held.
    pub violations: Vec<String>,
}

impl DemoReport {
    /// True when every invariant held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Final statuses of the submitted commands.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatusCounts {
    pub confirmed: u64,
    pub failed: u64,
    pub blocked: u64,
    pub cancelled: u64,
    pub stuck: u64,
    pub compensated: u64,
    pub no_compensation: u64,
    pub compensation_failed: u64,
    /// Still moving at the end (PENDING, LEASED, UNKNOWN, COMPENSATING, …): lost by the
    /// deadline.
    pub unsettled: u64,
    /// Commands marked for a person (STUCK, NO_COMPENSATION, failed compensations, duplicates
    /// that could not be undone).
    pub escalated: u64,
}

/// Commands whose audit chain records a status check answer of each kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reconciled {
    pub present: u64,
    pub absent: u64,
    /// Found committed twice, after an ambiguous outcome or by a post-commit verification.
    pub duplicate: u64,
    pub inconclusive: u64,
    /// 2xx commits looked up again (`verify_after_commit`) and found exactly once.
    pub verified_once: u64,
}

/// What the upstream saw.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamReport {
    pub faults: FaultCounts,
    pub wires_committed: u64,
    pub wires_reversed: u64,
    /// Business keys under which the bank booked more than one wire.
    pub keys_committed_twice: u64,
    /// Of those, keys left with at most one standing wire (the extra commits were undone).
    pub keys_committed_twice_compensated: u64,
    /// Business keys with more than one standing wire at the end.
    pub double_commits: BTreeMap<String, u64>,
    pub status_checks: u64,
    pub emails: u64,
    pub email_replays: u64,
    pub tickets: u64,
    pub tickets_closed: u64,
    pub searches: u64,
}

/// The idempotency contract as the API answered it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdempotencyReport {
    /// Effects re-submitted with the same key and arguments.
    pub replays: u64,
    /// Of those, answered 200 with the stored command.
    pub replays_answered_stored: u64,
    /// A re-submission with the same key and other arguments answered 409.
    pub drift_refused: Option<bool>,
    /// A wire re-submitted under a new call index with the same business key answered 200
    /// with the existing command.
    pub business_key_answered_existing: Option<bool>,
}

/// The audit chains.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub runs: u64,
    pub verified: u64,
    pub records: u64,
}

/// A data directory that cannot be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot prepare the data directory {path}")]
pub struct DataDirError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// A temporary data directory, or one the user named (never removed).
#[derive(Debug)]
pub(crate) enum DataDir {
    Given(PathBuf),
    Temporary(tempfile::TempDir),
}

impl DataDir {
    pub(crate) fn prepare(given: Option<&Path>, prefix: &str) -> Result<Self, DataDirError> {
        match given {
            Some(path) => {
                std::fs::create_dir_all(path).map_err(|source| DataDirError {
                    path: path.to_owned(),
                    source,
                })?;
                Ok(Self::Given(path.to_owned()))
            }
            None => tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .map(Self::Temporary)
                .map_err(|source| DataDirError {
                    path: std::env::temp_dir(),
                    source,
                }),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        match self {
            Self::Given(path) => path,
            Self::Temporary(dir) => dir.path(),
        }
    }

    pub(crate) fn is_temporary(&self) -> bool {
        matches!(self, Self::Temporary(_))
    }

    /// Removes a temporary directory unless `keep`; returns the directory that remains.
    pub(crate) fn finish(self, keep: bool) -> std::io::Result<Option<PathBuf>> {
        match self {
            Self::Given(path) => Ok(Some(path)),
            Self::Temporary(dir) if keep => Ok(Some(dir.keep())),
            Self::Temporary(dir) => dir.close().map(|()| None),
        }
    }
}

/// Progress bars on stderr, drawn only on a terminal and when asked for.
#[derive(Debug, Clone)]
pub struct Progress {
    multi: MultiProgress,
}

impl Progress {
    /// Bars on stderr when `wanted` and stderr is a terminal, else hidden.
    pub fn new(wanted: bool) -> Self {
        let target = if wanted && std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Self {
            multi: MultiProgress::with_draw_target(target),
        }
    }

    /// Never drawn: for tests and embedding.
    pub fn hidden() -> Self {
        Self {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::hidden()),
        }
    }

    pub(crate) fn bar(&self, len: u64, label: &str) -> ProgressBar {
        let style = ProgressStyle::with_template(
            "{prefix:>12} [{bar:40}] {pos:>6}/{len:<6} {elapsed:>4} {msg}",
        )
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        let bar = self.multi.add(ProgressBar::new(len).with_style(style));
        bar.set_prefix(label.to_owned());
        bar
    }

    pub(crate) fn clear(&self) {
        let _ = self.multi.clear();
    }
}

/// The demo's fault preset: `Faults::demo()` with every rate at `rate` except the kinds in
/// `skip`, and a `commit_then_timeout` hold longer than the demo catalog's timeouts.
pub fn demo_faults(rate: f64, skip: &[FaultKind]) -> Faults {
    let mut faults = Faults::uniform(FaultRates::each(rate))
        .with_status_inconclusive(rate)
        .with_timeout_sleep(Duration::from_millis(DEMO_TIMEOUT_SLEEP_MS));
    for kind in skip {
        faults.set_everywhere(*kind, 0.0);
    }
    faults
}

/// Parses a fault kind by its snake_case name.
fn parse_fault_kind(raw: &str) -> Result<FaultKind, String> {
    FaultKind::ALL
        .into_iter()
        .find(|kind| kind.as_str() == raw)
        .ok_or_else(|| {
            let names: Vec<&str> = FaultKind::ALL.iter().map(|kind| kind.as_str()).collect();
            format!(
                "unknown fault kind {raw:?}; expected one of {}",
                names.join(", ")
            )
        })
}

/// The example catalog (deploy/catalog.toml) pointed at `base_url`, with every connector
/// timeout set to [`DEMO_TOOL_TIMEOUT_MS`] and `settle_ms` to [`DEMO_SETTLE_MS`].
///
/// Edited as a TOML document rather than as text, so that a reformatted catalog cannot make an
/// edit silently miss.
pub fn demo_catalog(base_url: &str) -> Result<Catalog, CatalogError> {
    const SOURCE: &str = "deploy/catalog.toml (built in, demo timeouts)";
    let text = EXAMPLE_CATALOG.replace(EXAMPLE_UPSTREAM, base_url.trim_end_matches('/'));
    let mut document: toml::Table =
        toml::from_str(&text).map_err(|source| CatalogError::Syntax {
            file: SOURCE.into(),
            source: Box::new(source),
        })?;
    let timeout = toml::Value::Integer(DEMO_TOOL_TIMEOUT_MS as i64);
    if let Some(tools) = document.get_mut("tool").and_then(toml::Value::as_array_mut) {
        for tool in tools.iter_mut().filter_map(toml::Value::as_table_mut) {
            let policy = tool
                .entry("policy")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let Some(policy) = policy.as_table_mut() {
                policy.insert("timeout_ms".into(), timeout.clone());
                policy.insert(
                    "verify_after_ms".into(),
                    toml::Value::Integer(DEMO_VERIFY_AFTER_MS as i64),
                );
                // The demo upstream commits before it stalls, never after the client hung up.
                policy.insert("late_commit_ms".into(), timeout.clone());
                policy.insert(
                    "settle_ms".into(),
                    toml::Value::Integer(DEMO_SETTLE_MS as i64),
                );
            }
            for section in ["dispatch", "status_check", "compensate"] {
                if let Some(endpoint) = tool.get_mut(section).and_then(toml::Value::as_table_mut) {
                    endpoint.insert("timeout_ms".into(), timeout.clone());
                }
            }
        }
    }
    let text = toml::to_string(&document).map_err(|e| CatalogError::Malformed {
        file: SOURCE.into(),
        detail: format!("cannot write the edited catalog back: {e}"),
    })?;
    Catalog::from_toml_str(&text, SOURCE)
}

/// A pipeline configuration for one process on loopback: the producer on a free port, the
/// ledger in `data_dir`.
pub(crate) fn local_config(data_dir: &Path) -> Config {
    let mut config = Config::default();
    config.producer.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    config.ledger.data_dir = data_dir.to_owned();
    // The demo's own agents on loopback; the bench adds a token of its own instead.
    config.producer.open = true;
    config
}

/// The demo's pipeline configuration.
pub fn demo_config(data_dir: &Path) -> Config {
    let mut config = local_config(data_dir);
    config.reconciler.sweep_interval_ms = DEMO_SWEEP_INTERVAL_MS;
    config.bus.partitions = DEMO_PARTITIONS;
    config
}

/// The HTTP client of the demo and the bench; `bearer` is sent as the bearer token of every
/// request.
pub(crate) fn http_client(bearer: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(token) = bearer
        && let Ok(mut value) = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
    {
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    reqwest::Client::builder()
        .timeout(MAX_LONG_POLL + Duration::from_secs(30))
        .default_headers(headers)
        .build()
        // Only TLS backend initialisation can fail here, and plain HTTP needs none of it.
        .expect("a plain HTTP client builds")
}

/// Starts the upstream and the pipeline, plays the demo, stops both, and reports. `announce`
/// is called once both are up.
pub async fn execute(
    args: &DemoArgs,
    data_dir: &Path,
    shutdown: &Shutdown,
    progress: &Progress,
    announce: impl FnOnce(&Setup),
) -> Result<DemoReport, DemoError> {
    args.validate()?;
    let upstream = Upstream::start(
        SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        demo_faults(args.fault_rate, &args.skip_faults),
        args.seed,
    )
    .await
    .map_err(DemoError::Upstream)?;
    let config = demo_config(data_dir);
    let pipeline = match demo_catalog(&upstream.base_url()) {
        Ok(catalog) => crate::dev::start(&config, catalog, shutdown.child_token()).await,
        Err(e) => {
            upstream.shutdown().await;
            return Err(e.into());
        }
    };
    let pipeline = match pipeline {
        Ok(pipeline) => pipeline,
        Err(e) => {
            upstream.shutdown().await;
            return Err(e.into());
        }
    };
    let setup = Setup {
        upstream_url: upstream.base_url(),
        producer_url: pipeline.url(),
        data_dir: data_dir.to_owned(),
        tool_timeout_ms: DEMO_TOOL_TIMEOUT_MS,
        settle_ms: DEMO_SETTLE_MS,
        timeout_sleep_ms: DEMO_TIMEOUT_SLEEP_MS,
        sweep_interval_ms: config.reconciler.sweep_interval_ms,
        partitions: config.bus.partitions,
    };
    announce(&setup);
    let played = tokio::select! {
        played = play(args, &setup, &pipeline, &upstream, progress) => played,
        () = shutdown.cancelled() => Err(DemoError::Interrupted),
    };
    // Stopped whatever happened: the services first (they call the upstream), then the world.
    let stopped = pipeline.stop().await;
    upstream.shutdown().await;
    let mut report = played?;
    if let Err(e) = stopped {
        report
            .violations
            .push(format!("the pipeline stopped with an error: {e}"));
    }
    Ok(report)
}

/// The kinds of effect the demo agents ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Wire,
    Email,
    Ticket,
    Search,
}

impl Kind {
    fn tool(self) -> &'static str {
        match self {
            Self::Wire => "payments/wire",
            Self::Email => "email/send",
            Self::Ticket => "tickets/create",
            Self::Search => "search/lookup",
        }
    }
}

/// One effect an agent will submit.
#[derive(Debug, Clone)]
struct Planned {
    run: usize,
    decision: u32,
    kind: Kind,
    args: Value,
}

impl Planned {
    fn request(&self, run_id: &str, call_idx: u32, args: &Value) -> Value {
        json!({
            "run_id": run_id,
            "decision": self.decision,
            "tool": self.kind.tool(),
            "call_idx": call_idx,
            "args": args,
        })
    }
}

/// The effects of every run, drawn from `seed`. Business keys are distinct: the amount is
/// unique per effect, and `nonce` keeps them apart from an earlier demo in the same ledger.
fn plan(args: &DemoArgs, nonce: &str) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut planned = Vec::new();
    for run in 0..args.runs as usize {
        for decision in 0..args.effects {
            let serial = planned.len() as i64;
            let draw: f64 = rng.random();
            let (kind, args) = if draw < 0.4 {
                // One wire in eight is above the approval threshold: it waits for a person.
                let large = rng.random_range(0..8) == 0;
                let base = if large {
                    APPROVAL_THRESHOLD_MINOR + 1
                } else {
                    1_000
                };
                (
                    Kind::Wire,
                    json!({
                        "account": format!("acc-{nonce}-{}", run % 10),
                        "amount_minor": base + serial * 137,
                        "beneficiary": format!("beneficiary-{}", rng.random_range(1..50)),
                        "date": "2026-11-22",
                        "reference": format!("invoice {run}-{decision}"),
                    }),
                )
            } else if draw < 0.65 {
                (
                    Kind::Email,
                    json!({
                        "to": format!("customer{}@example.com", rng.random_range(1..500)),
                        "subject": format!("Your order, run {run}"),
                        "body": format!("Step {decision} of run {run} is done."),
                    }),
                )
            } else if draw < 0.85 {
                let priority = ["low", "normal", "high"][rng.random_range(0..3)];
                (
                    Kind::Ticket,
                    json!({
                        "title": format!("Follow up on run {run}, step {decision}"),
                        "priority": priority,
                    }),
                )
            } else {
                (
                    Kind::Search,
                    json!({
                        "query": format!("refund policy {}", rng.random_range(1..20)),
                        "limit": 3,
                    }),
                )
            };
            planned.push(Planned {
                run,
                decision,
                kind,
                args,
            });
        }
    }
    planned
}

/// A command the API accepted.
#[derive(Debug, Clone)]
struct Accepted {
    run: usize,
    command_key: String,
}

/// A status code and a JSON body.
type Answer = (StatusCode, Value);

/// The producer's HTTP API, as an agent uses it.
#[derive(Debug, Clone)]
struct Api {
    client: reqwest::Client,
    base: String,
}

impl Api {
    async fn submit(&self, body: &Value) -> Result<Answer, DemoError> {
        let what = || format!("POST /v1/effects ({})", body["tool"]);
        let response = self
            .client
            .post(format!("{}/v1/effects", self.base))
            .json(body)
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: what(),
                source,
            })?;
        let status = response.status();
        let body = response.json().await.map_err(|source| DemoError::Http {
            what: what(),
            source,
        })?;
        Ok((status, body))
    }

    /// Long-polls a command for at most `wait`.
    async fn wait_for(
        &self,
        run_id: &str,
        command_key: &str,
        wait: Duration,
    ) -> Result<Command, DemoError> {
        let path = format!("/v1/runs/{run_id}/effects/{command_key}");
        let response = self
            .client
            .get(format!("{}{path}?wait={}ms", self.base, wait.as_millis()))
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: format!("GET {path}"),
                source,
            })?;
        expect_json(response, StatusCode::OK, &format!("GET {path}")).await
    }

    async fn list(&self, run_id: &str) -> Result<Vec<Command>, DemoError> {
        let path = format!("/v1/runs/{run_id}/effects");
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: format!("GET {path}"),
                source,
            })?;
        let mut body: Value = expect_json(response, StatusCode::OK, &format!("GET {path}")).await?;
        serde_json::from_value(body["effects"].take()).map_err(|e| DemoError::Unexpected {
            what: format!("GET {path}"),
            status: StatusCode::OK,
            body: format!("not a list of commands: {e}"),
        })
    }

    async fn rollback(&self, run_id: &str) -> Result<(), DemoError> {
        let path = format!("/v1/runs/{run_id}/rollback");
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&json!({ "reason": ROLLBACK_REASON, "actor": "sluice-demo" }))
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: format!("POST {path}"),
                source,
            })?;
        let _: Value = expect_json(response, StatusCode::ACCEPTED, &format!("POST {path}")).await?;
        Ok(())
    }
}

async fn expect_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    expected: StatusCode,
    what: &str,
) -> Result<T, DemoError> {
    let status = response.status();
    let text = response.text().await.map_err(|source| DemoError::Http {
        what: what.to_owned(),
        source,
    })?;
    if status != expected {
        return Err(DemoError::Unexpected {
            what: what.to_owned(),
            status,
            body: text,
        });
    }
    serde_json::from_str(&text).map_err(|e| DemoError::Unexpected {
        what: what.to_owned(),
        status,
        body: format!("unreadable answer ({e}): {text}"),
    })
}

/// Drives the agents against a running pipeline and builds the report.
async fn play(
    args: &DemoArgs,
    setup: &Setup,
    pipeline: &Pipeline,
    upstream: &Upstream,
    progress: &Progress,
) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.deadline_secs);
    let api = Api {
        client: http_client(None),
        base: setup.producer_url.clone(),
    };
    let nonce = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let run_ids: Vec<String> = (0..args.runs)
        .map(|run| format!("demo-{nonce}-r{run:03}"))
        .collect();
    let planned = plan(args, &nonce);
    let mut violations = Vec::new();

    let accepted = submit_all(&api, &planned, &run_ids, progress, &mut violations).await?;
    let idempotency = show_idempotency(&api, &planned, &run_ids, &mut violations).await?;
    let mut by_run: Vec<Vec<String>> = vec![Vec::new(); run_ids.len()];
    for command in &accepted {
        by_run[command.run].push(command.command_key.clone());
    }
    let rolled_back_runs = settle_all(
        &api,
        args,
        &run_ids,
        &by_run,
        deadline,
        progress,
        &mut violations,
    )
    .await?;
    let found = inspect_ledger(pipeline, &run_ids, &by_run, &mut violations).await?;
    let upstream_report = inspect_upstream(&api.client, upstream).await?;
    check_the_bank(upstream, &upstream_report, &found.wires, &mut violations);

    Ok(DemoReport {
        setup: setup.clone(),
        runs: args.runs,
        effects_per_run: args.effects,
        rollback_every: args.rollback_every,
        fault_rate: args.fault_rate,
        skipped_faults: args.skip_faults.clone(),
        seed: args.seed,
        elapsed_secs: started.elapsed().as_secs_f64(),
        submitted: accepted.len() as u64,
        rolled_back_runs,
        statuses: found.statuses,
        reconciled: found.reconciled,
        upstream: upstream_report,
        idempotency,
        audit: found.audit,
        violations,
    })
}

/// Submits every planned effect through the API; returns those accepted (201).
async fn submit_all(
    api: &Api,
    planned: &[Planned],
    run_ids: &[String],
    progress: &Progress,
    violations: &mut Vec<String>,
) -> Result<Vec<Accepted>, DemoError> {
    let bar = progress.bar(planned.len() as u64, "submitting");
    let answers: Vec<(usize, Result<Answer, DemoError>)> =
        futures::stream::iter(planned.iter().enumerate())
            .map(|(index, effect)| {
                let (api, bar) = (api.clone(), bar.clone());
                let body = effect.request(&run_ids[effect.run], 0, &effect.args);
                async move {
                    let answer = api.submit(&body).await;
                    bar.inc(1);
                    (index, answer)
                }
            })
            .buffer_unordered(SUBMIT_CONCURRENCY)
            .collect()
            .await;
    bar.finish();
    let mut accepted: Vec<Option<Accepted>> = vec![None; planned.len()];
    for (index, answer) in answers {
        let effect = &planned[index];
        let (status, body) = answer?;
        if status == StatusCode::CREATED {
            accepted[index] = Some(Accepted {
                run: effect.run,
                command_key: body["command_key"].as_str().unwrap_or_default().to_owned(),
            });
        } else {
            violations.push(format!(
                "{} {} of run {} was not accepted: {status} {body}",
                effect.kind.tool(),
                effect.decision,
                run_ids[effect.run]
            ));
        }
    }
    Ok(accepted.into_iter().flatten().collect())
}

/// Waits for every run to settle, rolling back every K-th one; returns how many were rolled
/// back.
async fn settle_all(
    api: &Api,
    args: &DemoArgs,
    run_ids: &[String],
    by_run: &[Vec<String>],
    deadline: tokio::time::Instant,
    progress: &Progress,
    violations: &mut Vec<String>,
) -> Result<u64, DemoError> {
    let commands = by_run.iter().map(Vec::len).sum::<usize>();
    let settling = progress.bar(commands as u64, "settling");
    let rollbacks = (0..run_ids.len())
        .filter(|run| args.is_rolled_back(*run))
        .count();
    let rolling = progress.bar(rollbacks as u64, "rolling back");
    let outcomes: Vec<Result<RunOutcome, DemoError>> =
        futures::stream::iter(by_run.iter().enumerate())
            .map(|(run, keys)| {
                let (api, settling, rolling) = (api.clone(), settling.clone(), rolling.clone());
                let run_id = run_ids[run].clone();
                let roll_back = args.is_rolled_back(run);
                async move {
                    let outcome =
                        settle_run(&api, &run_id, keys, roll_back, deadline, &settling).await?;
                    if roll_back {
                        rolling.inc(1);
                    }
                    Ok(outcome)
                }
            })
            .buffer_unordered(SETTLE_CONCURRENCY)
            .collect()
            .await;
    settling.finish();
    rolling.finish();
    let mut rolled_back = 0;
    for outcome in outcomes {
        let outcome = outcome?;
        if outcome.rolled_back {
            rolled_back += 1;
        }
        violations.extend(outcome.problems);
    }
    Ok(rolled_back)
}

/// What the ledger holds at the end.
#[derive(Debug, Default)]
struct LedgerFindings {
    statuses: StatusCounts,
    reconciled: Reconciled,
    audit: AuditReport,
    /// Per business key, the command that holds it.
    wires: HashMap<String, WireCommand>,
}

/// Reads every submitted command and every run's audit chain from the ledger (the source of
/// truth): final statuses, lost commands, status check evidence, chain verification.
async fn inspect_ledger(
    pipeline: &Pipeline,
    run_ids: &[String],
    by_run: &[Vec<String>],
    violations: &mut Vec<String>,
) -> Result<LedgerFindings, DemoError> {
    let ledger = &pipeline.ctx.ledger;
    let mut found = LedgerFindings::default();
    for (run, keys) in by_run.iter().enumerate() {
        let run_id = RunId::parse(&run_ids[run]).map_err(|e| DemoError::Unexpected {
            what: "a demo run id".into(),
            status: StatusCode::OK,
            body: e.to_string(),
        })?;
        let stored: HashMap<String, Command> = ledger
            .list_run(&run_id, None)
            .await?
            .into_iter()
            .map(|command| (command.command_key.to_string(), command))
            .collect();
        let trail = ledger.audit_read(&run_id).await?;
        found.audit.runs += 1;
        found.audit.records += trail.entries.len() as u64;
        match audit::verify(&run_id, trail.checkpoint.as_ref(), &trail.entries) {
            Ok(_) => found.audit.verified += 1,
            Err(broken) => violations.push(broken.to_string()),
        }
        // Each command counts once per kind of answer, however often it was checked.
        let mut observed: HashSet<(String, Evidence)> = HashSet::new();
        for entry in &trail.entries {
            if let (Some(kind), Some(key)) = (
                Evidence::of_reason(&entry.record.reason),
                &entry.record.command_key,
            ) {
                observed.insert((key.to_string(), kind));
            }
        }
        for (_, kind) in &observed {
            let counter = match kind {
                Evidence::Present => &mut found.reconciled.present,
                Evidence::Absent => &mut found.reconciled.absent,
                Evidence::Duplicate => &mut found.reconciled.duplicate,
                Evidence::Inconclusive => &mut found.reconciled.inconclusive,
                Evidence::VerifiedOnce => &mut found.reconciled.verified_once,
            };
            *counter += 1;
        }
        for key in keys {
            let Some(command) = stored.get(key) else {
                violations.push(format!("lost: {run_id}/{key} is not in the ledger"));
                continue;
            };
            count_status(&mut found.statuses, command);
            if !command.status().is_settled() {
                violations.push(format!(
                    "lost: {run_id}/{key} is still {} after the deadline",
                    command.status()
                ));
            } else if let Some(due) = command.state.due_at.filter(|_| !command.state.at_rest()) {
                violations.push(format!(
                    "unfinished: {run_id}/{key} is {} but still owed work (due {due}) after the deadline",
                    command.status()
                ));
            }
            if let Some(business_key) = &command.business_key {
                found.wires.insert(
                    business_key.as_str().to_owned(),
                    WireCommand {
                        subject: format!("{run_id}/{key}"),
                        status: command.status(),
                        attempts: command.state.attempts,
                        checked: observed.iter().any(|(observed, _)| observed == key),
                    },
                );
            }
        }
    }
    Ok(found)
}

/// The bank's books against the ledger: no business key with two standing wires, and nothing
/// standing for a wire the ledger says was compensated.
fn check_the_bank(
    upstream: &Upstream,
    report: &UpstreamReport,
    wires: &HashMap<String, WireCommand>,
    violations: &mut Vec<String>,
) {
    for (key, standing) in &report.double_commits {
        let holder = wires.get(key).map_or_else(
            || "no command of this demo holds the key".to_owned(),
            WireCommand::describe,
        );
        violations.push(format!(
            "double commit: business key {key} has {standing} standing wires ({holder})"
        ));
    }
    let stats = upstream.stats();
    for (key, wire) in wires {
        let standing = stats.standing_wires(key);
        if wire.status == CommandStatus::Compensated && standing != 0 {
            violations.push(format!(
                "a compensated wire still stands: business key {key} has {standing} standing wire(s) after the rollback ({})",
                wire.describe()
            ));
        }
    }
}

/// What a status check told the reconciler about a command, as its audit chain records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Evidence {
    Present,
    Absent,
    Duplicate,
    Inconclusive,
    /// A 2xx commit looked up again and found once.
    VerifiedOnce,
}

impl Evidence {
    /// The evidence an audit reason records: the reasons `machine::observed` and
    /// `machine::verified` write.
    fn of_reason(reason: &str) -> Option<Self> {
        if reason.starts_with("status check: present") {
            Some(Self::Present)
        } else if reason.starts_with("status check: absent") {
            Some(Self::Absent)
        } else if reason.starts_with("status check: duplicate")
            || reason.starts_with("verified: duplicate")
        {
            Some(Self::Duplicate)
        } else if reason.starts_with("status check inconclusive") {
            Some(Self::Inconclusive)
        } else if reason.starts_with("verified: the commit is there once") {
            Some(Self::VerifiedOnce)
        } else {
            None
        }
    }
}

fn count_status(counts: &mut StatusCounts, command: &Command) {
    let counter = match command.status() {
        CommandStatus::Confirmed => &mut counts.confirmed,
        CommandStatus::Failed => &mut counts.failed,
        CommandStatus::Blocked => &mut counts.blocked,
        CommandStatus::Cancelled => &mut counts.cancelled,
        CommandStatus::Stuck => &mut counts.stuck,
        CommandStatus::Compensated => &mut counts.compensated,
        CommandStatus::NoCompensation => &mut counts.no_compensation,
        CommandStatus::CompensationFailed => &mut counts.compensation_failed,
        CommandStatus::Scheduled
        | CommandStatus::Pending
        | CommandStatus::Approved
        | CommandStatus::Leased
        | CommandStatus::Unknown
        | CommandStatus::Compensating => &mut counts.unsettled,
    };
    *counter += 1;
    if command.state.escalated {
        counts.escalated += 1;
    }
}

/// The command behind a business key.
#[derive(Debug)]
struct WireCommand {
    subject: String,
    status: CommandStatus,
    attempts: u32,
    /// Its audit chain records a status check.
    checked: bool,
}

impl WireCommand {
    fn describe(&self) -> String {
        format!(
            "command {} is {} after {} attempt(s), {}",
            self.subject,
            self.status,
            self.attempts,
            if self.checked {
                "with a status check in its audit chain"
            } else {
                "never status-checked: the bank answered its dispatch 2xx"
            }
        )
    }
}

/// What happened to one run.
#[derive(Debug, Default)]
struct RunOutcome {
    rolled_back: bool,
    problems: Vec<String>,
}

/// Settled (terminal, STUCK or BLOCKED) and owed nothing more by the pipeline: no
/// verification or duplicate clean-up is still to come.
fn at_rest(command: &Command) -> bool {
    command.state.at_rest()
}

/// Waits until every command of the run is at rest (or the deadline passed); then, for a run
/// to roll back, asks for the rollback and waits until its confirmed effects were compensated.
async fn settle_run(
    api: &Api,
    run_id: &str,
    keys: &[String],
    roll_back: bool,
    deadline: tokio::time::Instant,
    bar: &ProgressBar,
) -> Result<RunOutcome, DemoError> {
    let mut outcome = RunOutcome::default();
    let waits = keys.iter().map(|key| async move {
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let command = api.wait_for(run_id, key, left.min(MAX_LONG_POLL)).await?;
            if at_rest(&command) {
                bar.inc(1);
                return Ok::<bool, DemoError>(true);
            }
            if left.is_zero() {
                return Ok(false);
            }
            if command.status().is_settled() {
                // Settled but still owed work: the long poll would answer at once.
                tokio::time::sleep(ROLLBACK_POLL.min(left)).await;
            }
        }
    });
    let settled = futures::future::try_join_all(waits).await?;
    if settled.iter().any(|settled| !settled) || !roll_back || keys.is_empty() {
        // An unsettled command is reported from the ledger afterwards.
        return Ok(outcome);
    }
    api.rollback(run_id).await?;
    outcome.rolled_back = true;
    loop {
        let open: Vec<String> = api
            .list(run_id)
            .await?
            .into_iter()
            .filter(|command| {
                let undone = command.semantics == EffectSemantics::ObserveOnly
                    || !matches!(
                        command.status(),
                        CommandStatus::Confirmed | CommandStatus::Compensating
                    );
                !(undone && at_rest(command))
            })
            .map(|command| format!("{}/{} ({})", run_id, command.command_key, command.status()))
            .collect();
        if open.is_empty() {
            return Ok(outcome);
        }
        if tokio::time::Instant::now() >= deadline {
            outcome.problems.push(format!(
                "rollback of {run_id} unfinished at the deadline: {}",
                open.join(", ")
            ));
            return Ok(outcome);
        }
        tokio::time::sleep(ROLLBACK_POLL).await;
    }
}

/// Re-submits a few effects unchanged (expect 200 and the stored command), one with other
/// arguments (expect 409), and one wire under a new call index with the same business key
/// (expect 200 and the existing command). A different answer is a broken contract.
async fn show_idempotency(
    api: &Api,
    planned: &[Planned],
    run_ids: &[String],
    violations: &mut Vec<String>,
) -> Result<IdempotencyReport, DemoError> {
    let mut report = IdempotencyReport::default();
    // One of each kind first, so the replays cover several tools.
    let mut picks: Vec<&Planned> = Vec::new();
    for kind in [Kind::Wire, Kind::Email, Kind::Ticket, Kind::Search] {
        if let Some(effect) = planned.iter().find(|effect| effect.kind == kind) {
            picks.push(effect);
        }
    }
    for effect in picks.into_iter().take(REPLAYS) {
        let run_id = &run_ids[effect.run];
        let (status, body) = api.submit(&effect.request(run_id, 0, &effect.args)).await?;
        report.replays += 1;
        let key = format!("d-{}/{}/0", effect.decision, effect.kind.tool());
        if status == StatusCode::OK && body["command_key"] == key.as_str() {
            report.replays_answered_stored += 1;
        } else {
            violations.push(format!(
                "idempotency: re-submitting {run_id}/{key} unchanged answered {status} {body}; expected 200 and the stored command"
            ));
        }
    }
    if let Some(effect) = planned.iter().find(|effect| effect.kind == Kind::Email) {
        let run_id = &run_ids[effect.run];
        let mut changed = effect.args.clone();
        changed["subject"] = json!("A different subject under the same key");
        let (status, body) = api.submit(&effect.request(run_id, 0, &changed)).await?;
        let refused = status == StatusCode::CONFLICT;
        report.drift_refused = Some(refused);
        if !refused {
            violations.push(format!(
                "idempotency: the same key with other arguments answered {status} {body}; expected 409"
            ));
        }
    }
    if let Some(effect) = planned.iter().find(|effect| effect.kind == Kind::Wire) {
        let run_id = &run_ids[effect.run];
        let (status, body) = api.submit(&effect.request(run_id, 1, &effect.args)).await?;
        let key = format!("d-{}/{}/0", effect.decision, effect.kind.tool());
        let existing = status == StatusCode::OK && body["command_key"] == key.as_str();
        report.business_key_answered_existing = Some(existing);
        if !existing {
            violations.push(format!(
                "idempotency: the same wire under a new call index answered {status} {body}; expected 200 and {run_id}/{key}"
            ));
        }
    }
    Ok(report)
}

/// Reads the upstream's counters, and every wire it booked to find the business keys that
/// were committed more than once.
async fn inspect_upstream(
    client: &reqwest::Client,
    upstream: &Upstream,
) -> Result<UpstreamReport, DemoError> {
    let stats = upstream.stats();
    let base = upstream.base_url();
    let wires: Vec<Result<Value, DemoError>> = futures::stream::iter(1..=stats.wires)
        .map(|n| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let what = format!("GET /bank/wires/w-{n}");
                let response = client
                    .get(format!("{base}/bank/wires/w-{n}"))
                    .send()
                    .await
                    .map_err(|source| DemoError::Http {
                        what: what.clone(),
                        source,
                    })?;
                expect_json(response, StatusCode::OK, &what).await
            }
        })
        .buffer_unordered(SUBMIT_CONCURRENCY)
        .collect()
        .await;
    let mut booked_by_key: HashMap<String, u64> = HashMap::new();
    for wire in wires {
        let wire = wire?;
        let key = wire["business_key"].as_str().unwrap_or_default().to_owned();
        *booked_by_key.entry(key).or_default() += 1;
    }
    let twice: Vec<&String> = booked_by_key
        .iter()
        .filter(|(_, booked)| **booked > 1)
        .map(|(key, _)| key)
        .collect();
    let compensated = twice
        .iter()
        .filter(|key| stats.standing_wires(key) <= 1)
        .count();
    Ok(UpstreamReport {
        faults: stats.faults,
        wires_committed: stats.wires,
        wires_reversed: stats.wires_reversed,
        keys_committed_twice: twice.len() as u64,
        keys_committed_twice_compensated: compensated as u64,
        double_commits: stats
            .double_commits()
            .into_iter()
            .map(|(key, standing)| (key.to_owned(), standing))
            .collect(),
        status_checks: stats.status_checks,
        emails: stats.emails,
        email_replays: stats.email_replays,
        tickets: stats.tickets,
        tickets_closed: stats.tickets_closed,
        searches: stats.searches,
    })
}

fn print_header(args: &DemoArgs, setup: &Setup, temporary: bool) {
    let percent = args.fault_rate * 100.0;
    let skipped = if args.skip_faults.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = args.skip_faults.iter().map(|kind| kind.as_str()).collect();
        format!(" except {}", names.join(", "))
    };
    println!(
        "sluice demo: {} runs x {} effects ({} in all), rollback every {} run(s), fault rate {}, seed {}",
        args.runs,
        args.effects,
        u64::from(args.runs) * u64::from(args.effects),
        args.rollback_every,
        args.fault_rate,
        args.seed
    );
    println!(
        "  upstream  {}  each fault kind at {percent}% per call (status checks inconclusive too){skipped}; \
         commit_then_timeout holds its answer {} ms",
        setup.upstream_url, setup.timeout_sleep_ms
    );
    println!(
        "  catalog   deploy/catalog.toml with every tool timeout cut to {} ms and settle_ms to {} ms, \
         so the demo stays short",
        setup.tool_timeout_ms, setup.settle_ms
    );
    println!(
        "  pipeline  {}  {} bus partitions, sweep every {} ms",
        setup.producer_url, setup.partitions, setup.sweep_interval_ms
    );
    println!(
        "  ledger    {}{}",
        setup.data_dir.display(),
        if temporary && !args.keep {
            " (removed at the end; --keep keeps it)"
        } else {
            ""
        }
    );
    println!();
}

fn print_report(report: &DemoReport) {
    let s = &report.statuses;
    let r = &report.reconciled;
    let u = &report.upstream;
    let f = &u.faults;
    let i = &report.idempotency;
    let yes_no = |answer: Option<bool>| match answer {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "not tried",
    };
    let rows: Vec<(String, String)> = vec![
        ("submitted".into(), report.submitted.to_string()),
        ("confirmed".into(), s.confirmed.to_string()),
        ("failed".into(), s.failed.to_string()),
        ("blocked (awaiting approval)".into(), s.blocked.to_string()),
        ("cancelled".into(), s.cancelled.to_string()),
        (
            "reconciled present / absent / duplicate".into(),
            format!("{} / {} / {}", r.present, r.absent, r.duplicate),
        ),
        (
            "  (status checks inconclusive)".into(),
            r.inconclusive.to_string(),
        ),
        (
            "2xx commits verified, found once".into(),
            r.verified_once.to_string(),
        ),
        (
            "runs rolled back".into(),
            report.rolled_back_runs.to_string(),
        ),
        ("compensated".into(), s.compensated.to_string()),
        ("no_compensation".into(), s.no_compensation.to_string()),
        (
            "compensation_failed".into(),
            s.compensation_failed.to_string(),
        ),
        ("stuck".into(), s.stuck.to_string()),
        ("escalated".into(), s.escalated.to_string()),
        ("unsettled at the deadline".into(), s.unsettled.to_string()),
        (
            "upstream faults injected".into(),
            format!(
                "{} (commit_then_timeout {}, drop_response {}, error_5xx {}, commit_then_5xx {}, commit_twice {}, status_inconclusive {})",
                f.total(),
                f.commit_then_timeout,
                f.drop_response,
                f.error_5xx,
                f.commit_then_5xx,
                f.commit_twice,
                f.status_inconclusive
            ),
        ),
        (
            "wires booked / reversed".into(),
            format!("{} / {}", u.wires_committed, u.wires_reversed),
        ),
        (
            "wires committed twice (one business key)".into(),
            format!(
                "{}, compensated {}, still standing twice {}",
                u.keys_committed_twice,
                u.keys_committed_twice_compensated,
                u.double_commits.len()
            ),
        ),
        (
            "emails sent (key replays) / tickets".into(),
            format!("{} ({}) / {}", u.emails, u.email_replays, u.tickets),
        ),
        (
            "replays with same key and args -> 200".into(),
            format!("{}/{}", i.replays_answered_stored, i.replays),
        ),
        (
            "same key, other args -> 409".into(),
            yes_no(i.drift_refused).into(),
        ),
        (
            "same business key, new call -> existing".into(),
            yes_no(i.business_key_answered_existing).into(),
        ),
        (
            "audit chains verified".into(),
            format!(
                "{}/{} ({} records)",
                report.audit.verified, report.audit.runs, report.audit.records
            ),
        ),
    ];
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in rows {
        println!("  {name:<width$}  {value}");
    }
    println!();
    if report.ok() {
        println!(
            "invariants hold: no double commit left standing, nothing lost, every audit chain verifies ({:.1} s)",
            report.elapsed_secs
        );
    } else {
        println!("INVARIANTS BROKEN ({:.1} s):", report.elapsed_secs);
        for violation in &report.violations {
            println!("  - {violation}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_catalog_has_short_timeouts_and_settle() {
        let catalog = demo_catalog("http://127.0.0.1:9").expect("the demo catalog loads");
        for tool in catalog.tools() {
            assert_eq!(tool.dispatch().endpoint.timeout_ms, DEMO_TOOL_TIMEOUT_MS);
            if let Some(check) = tool.status_check() {
                assert_eq!(check.timeout_ms, DEMO_TOOL_TIMEOUT_MS);
            }
            assert!(
                tool.dispatch()
                    .endpoint
                    .url
                    .to_string()
                    .starts_with("http://127.0.0.1:9/")
            );
        }
        let wire = catalog.resolve("payments/wire").expect("wire");
        assert_eq!(wire.rules().settle_ms, DEMO_SETTLE_MS as i64);
    }

    #[test]
    fn demo_faults_scale_and_validate() {
        let faults = demo_faults(0.05, &[]);
        assert_eq!(faults, {
            let mut expected = Faults::demo();
            expected.timeout_sleep_ms = DEMO_TIMEOUT_SLEEP_MS;
            expected
        });
        assert!(demo_faults(0.2, &[]).validate().is_ok());
        let without = demo_faults(
            0.1,
            &[FaultKind::CommitTwice, FaultKind::StatusInconclusive],
        );
        assert_eq!(without.bank.commit_twice, 0.0);
        assert_eq!(without.status_inconclusive, 0.0);
        assert_eq!(without.bank.drop_response, 0.1);
        assert_eq!(parse_fault_kind("commit_twice"), Ok(FaultKind::CommitTwice));
        assert!(parse_fault_kind("twice").is_err());
    }

    #[test]
    fn the_plan_is_seeded_and_business_keys_are_distinct() {
        let args = DemoArgs::defaults();
        let first = plan(&args, "n");
        let again = plan(&args, "n");
        assert_eq!(first.len(), 240);
        assert!(
            first
                .iter()
                .zip(&again)
                .all(|(a, b)| a.kind == b.kind && a.args == b.args)
        );
        let wires: Vec<&Planned> = first.iter().filter(|e| e.kind == Kind::Wire).collect();
        let keys: HashSet<String> = wires
            .iter()
            .map(|w| format!("{}:{}", w.args["account"], w.args["amount_minor"]))
            .collect();
        assert_eq!(keys.len(), wires.len());
        assert!(
            wires
                .iter()
                .any(|w| w.args["amount_minor"].as_i64() > Some(APPROVAL_THRESHOLD_MINOR)),
            "some wires need approval"
        );
        for kind in [Kind::Email, Kind::Ticket, Kind::Search] {
            assert!(first.iter().any(|e| e.kind == kind), "{kind:?} planned");
        }
    }

    #[test]
    fn observation_reasons_are_classified() {
        let cases = [
            ("status check: present", Some(Evidence::Present)),
            (
                "status check: absent; look again after the settle interval",
                Some(Evidence::Absent),
            ),
            ("status check: duplicate commit", Some(Evidence::Duplicate)),
            ("verified: duplicate commit", Some(Evidence::Duplicate)),
            (
                "status check inconclusive; look again later",
                Some(Evidence::Inconclusive),
            ),
            (
                "verified: the commit is there once",
                Some(Evidence::VerifiedOnce),
            ),
            ("reserved", None),
        ];
        for (reason, evidence) in cases {
            assert_eq!(Evidence::of_reason(reason), evidence, "{reason}");
        }
    }

    #[test]
    fn fault_rates_above_the_limit_are_refused() {
        let args = DemoArgs {
            fault_rate: 0.3,
            ..DemoArgs::defaults()
        };
        let err = args.validate().expect_err("refused");
        assert!(err.to_string().contains("--fault-rate"), "{err}");
        let alone = DemoArgs {
            fault_rate: 0.9,
            skip_faults: FaultKind::ALL
                .into_iter()
                .filter(|kind| *kind != FaultKind::CommitTwice)
                .collect(),
            ..DemoArgs::defaults()
        };
        alone
            .validate()
            .expect("one fault kind alone may have a high rate");
        let negative = DemoArgs {
            fault_rate: -0.1,
            ..DemoArgs::defaults()
        };
        assert!(negative.validate().is_err());
    }
}
