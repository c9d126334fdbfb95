//! `sluice demo`: the whole pipeline against a misbehaving world, checked end to end.
//!
//! One process starts the demo upstream (a bank, mail, ticket and search service that injects
//! faults) and the four services on a fresh embedded ledger, then plays agents: it submits runs
//! of wires, emails, tickets and searches through the real HTTP API, long-polls each command
//! until it settles, rolls every K-th run back, and shows the idempotency contract (the same
//! key and arguments answer the stored command; other arguments answer 409).
//!
//! It ends with a table of what happened and checks the guarantees Sluice makes
//! (docs/guarantees.md):
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
use futures::future::LocalBoxFuture;
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

mod report;
mod world;

pub use report::*;
use world::*;

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
pub fn run(args: DemoArgs, shutdown: Shutdown) -> LocalBoxFuture<'static, Result<(), DemoError>> {
    Box::pin(run_body(args, shutdown))
}

async fn run_body(args: DemoArgs, shutdown: Shutdown) -> Result<(), DemoError> {
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
