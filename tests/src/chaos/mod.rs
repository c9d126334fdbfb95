//! The seeded fault runner: agent runs through the real HTTP API of a `sluice dev` process
//! that is crashed and restarted, against an upstream that misbehaves on purpose and keeps its
//! own record; then the guarantees, checked against that record.
//!
//! One [`run`] of a seed:
//!
//! 1. starts the ground-truth upstream ([`upstream`]), writes a catalog with one tool per shape
//!    ([`catalog`]) and a configuration into a fresh directory, and starts `sluice dev` on it
//!    as a child process ([`crashes`]);
//! 2. submits the seed's planned runs at a steady pace ([`workload`], [`driver`]) while an
//!    operator approves, rejects, cancels, rolls back, replays and resolves ([`operator`]) and
//!    the process is crashed and restarted on the same data directory — once with a catalog
//!    whose policy is stricter ([`catalog::Policy`]) — and agents of their own make their calls
//!    through `sluice mcp --transport http`, then re-drive them in a new session ([`mcp`]),
//!    while retention purges the runs nobody works on any more ([`purge`]);
//! 3. stops the faults, restarts the process without failpoints, and waits until every command
//!    is terminal or STUCK and stays so past the verification horizon;
//! 4. checks the invariants ([`invariants`]) and reports ([`report`]).
//!
//! Faults and the workload are drawn from the seed ([`dice`]), so a failing seed replays.

pub mod api;
pub mod catalog;
pub mod crashes;
pub mod dice;
pub mod driver;
pub mod invariants;
pub mod mcp;
pub mod operator;
pub mod phases;
pub mod purge;
pub mod report;
pub mod upstream;
pub mod workload;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use sluice_core::command::{Command, CommandStatus};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::catalog::{Horizons, Policy, Timing, Tokens};
use self::crashes::{CrashMode, Supervisor};
use self::report::{Figures, Report};
use self::upstream::{ChaosUpstream, FaultRates, FaultTimes};
use self::workload::WorkloadOptions;

/// Why a run could not be carried out (as opposed to a guarantee it found broken).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Setup(String),
    #[error("{what} got no usable answer within {secs} s (last: {last})")]
    Unanswered {
        what: String,
        secs: u64,
        last: String,
    },
    #[error("{what}: HTTP {status}: {body}")]
    Unexpected {
        what: String,
        status: u16,
        body: String,
    },
    #[error("sluice did not start: {0}")]
    NotReady(String),
}

/// Everything one run is made of.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub workload: WorkloadOptions,
    /// Crashes to inject during the workload.
    pub crashes: usize,
    /// Effects submitted per second; the workload lasts `effects / rate`.
    pub rate: f64,
    /// Runs in flight at once.
    pub agents: usize,
    pub rates: FaultRates,
    pub times: FaultTimes,
    pub timing: Timing,
    pub horizons: Horizons,
    pub crash_mode: CrashMode,
    /// The `sluice` binary; default: beside this executable.
    pub sluice_bin: Option<PathBuf>,
    /// How long the pipeline may take to settle after the workload.
    pub settle_timeout: Duration,
    /// Keep the run's directory (ledger, catalog, logs) instead of removing it.
    pub keep: bool,
    pub log_level: String,
    /// Print progress lines on stderr.
    pub progress: bool,
    /// Restart once, halfway through the crashes, with a catalog whose policy is stricter.
    pub tighten_policy: bool,
    /// MCP stories per planned effect (each a conversation of 2–5 calls, told twice).
    pub mcp_stories_per_effect: f64,
    /// Purge finished runs every so often through the workload and the settling (`None`: no
    /// retention).
    pub retention: Option<purge::Retention>,
    /// How long each of the upstream's phases lasts (`None`: none): a third of the way through
    /// the workload 30 % of dispatches are answered 429 `Retry-After: 1`, two thirds of the way
    /// the bank's endpoints answer every dispatch and lookup 503 (issue 30: flow control).
    pub phases: Option<Duration>,
}

impl Options {
    /// The defaults for `seed`: 10,000 effects, 50 crashes, the standard faults.
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            workload: WorkloadOptions::default(),
            crashes: 50,
            rate: 100.0,
            agents: 48,
            rates: FaultRates::standard(),
            times: FaultTimes {
                hold_past_timeout_ms: 250,
                late_commit_ms: (100, 700),
                lag_ms: (700, 1_500),
            },
            timing: Timing::default(),
            horizons: Horizons::default(),
            crash_mode: CrashMode::Kill,
            sluice_bin: None,
            settle_timeout: Duration::from_secs(240),
            keep: false,
            log_level: "warn".into(),
            progress: true,
            tighten_policy: true,
            mcp_stories_per_effect: 0.01,
            retention: Some(purge::Retention::default()),
            phases: Some(Duration::from_secs(8)),
        }
    }

    /// How long after the last change the run counts as settled: past every late commit, every
    /// lagging lookup and a verification look after it.
    fn quiet(&self) -> Duration {
        Duration::from_millis(
            self.times.late_commit_ms.1
                + self.times.lag_ms.1
                + self.timing.settle_ms
                + self.timing.bank_timeout_ms
                + 2_000,
        )
    }
}

/// What Sluice ended with, read through its API for every run.
#[derive(Debug, Default)]
pub struct Ended {
    /// The final state of every command, by (run, command key).
    pub commands: HashMap<(String, String), Command>,
    /// Each run's command keys in journal order.
    pub journals: HashMap<String, Vec<String>>,
    pub audits: HashMap<String, Vec<sluice_core::audit::AuditEntry>>,
    /// The API's verdict per run (`GET …/audit/verify`).
    pub verdicts: HashMap<String, serde_json::Value>,
}

/// Reads [`Ended`] for `run_ids`, eight runs at a time: the oracle's view of the ledger.
pub async fn read_ended(api: &api::Api, run_ids: &[String]) -> Result<Ended, ChaosError> {
    let collected: Vec<(String, Vec<Command>, Vec<_>, serde_json::Value)> =
        futures::stream::iter(run_ids.iter().cloned())
            .map(|run| {
                let api = api.clone();
                async move {
                    let commands = api.run_commands(&run).await?;
                    let audit = api.audit(&run).await?;
                    let verdict = api.verify(&run).await?;
                    Ok::<_, ChaosError>((run, commands, audit, verdict))
                }
            })
            .buffer_unordered(8)
            .try_collect()
            .await?;
    let mut ended = Ended::default();
    for (run, listed, audit, verdict) in collected {
        ended.journals.insert(
            run.clone(),
            listed.iter().map(|c| c.command_key.to_string()).collect(),
        );
        for command in listed {
            ended
                .commands
                .insert((run.clone(), command.command_key.to_string()), command);
        }
        ended.audits.insert(run.clone(), audit);
        ended.verdicts.insert(run, verdict);
    }
    Ok(ended)
}

/// A seed from the operating system, for a run that was given none. `SLUICE_CHAOS_SEED`, when set to a number, replays that seed instead (the cluster test draws
/// its seed here, and has no flag of its own).
pub fn random_seed() -> u64 {
    if let Some(seed) = std::env::var("SLUICE_CHAOS_SEED")
        .ok()
        .and_then(|text| text.trim().parse().ok())
    {
        return seed;
    }
    let uuid = uuid::Uuid::new_v4();
    let (high, _) = uuid.as_u64_pair();
    high
}

macro_rules! progress {
    ($options:expr, $($arg:tt)*) => {
        if $options.progress {
            eprintln!("[chaos seed {}] {}", $options.seed, format!($($arg)*));
        }
    };
}

/// Runs one seed end to end and reports what it found.
pub async fn run(options: Options) -> Result<Report, ChaosError> {
    let started = Instant::now();
    let started_ms = upstream::record::now_ms();
    let bin = crashes::locate_sluice(options.sluice_bin.as_deref())?;
    let dir = tempfile::Builder::new()
        .prefix("sluice-chaos-")
        .tempdir()
        .map_err(|source| ChaosError::Io {
            what: "create the run's directory".into(),
            source,
        })?;
    let upstream = Arc::new(
        ChaosUpstream::start(
            catalog::endpoints(&options.timing),
            options.rates.clone(),
            options.times.clone(),
            options.seed,
        )
        .await
        .map_err(|source| ChaosError::Io {
            what: "start the upstream".into(),
            source,
        })?,
    );
    let catalog_text = catalog::catalog_toml(
        &upstream.base_url(),
        &options.timing,
        &options.times,
        &options.horizons,
    );
    catalog::validate(&catalog_text).map_err(ChaosError::Setup)?;
    let catalog_path = dir.path().join("catalog.toml");
    write(&catalog_path, &catalog_text)?;
    let listen = free_port()?;
    let tokens = Tokens::generate();
    let config_path = dir.path().join("sluice.toml");
    write(
        &config_path,
        &catalog::config_toml(
            dir.path(),
            &catalog_path,
            listen,
            &tokens,
            &options.timing,
            &options.log_level,
        ),
    )?;
    let api = api::Api::new(&format!("http://{listen}"), &tokens.agent, &tokens.admin)?;
    progress!(
        options,
        "sluice {} on {listen}, files in {}",
        bin.display(),
        dir.path().display()
    );

    let mut supervisor = Supervisor::new(
        &bin,
        &config_path,
        dir.path(),
        api.clone(),
        options.crash_mode.clone(),
        options.seed,
    );
    if options.tighten_policy && options.crashes > 0 {
        let tightened = catalog::catalog_toml_under(
            &upstream.base_url(),
            &options.timing,
            &options.times,
            &options.horizons,
            Policy::Tightened,
        );
        catalog::validate(&tightened).map_err(ChaosError::Setup)?;
        supervisor.tighten_at(options.crashes.div_ceil(2), &catalog_path, tightened);
    }
    supervisor.start(true).await?;

    // Crashes, the operator and the agents run side by side.
    let plan = workload::plan(options.seed, &options.workload);
    let planned: usize = plan.iter().map(|r| r.effects.len()).sum();
    let workload_time = Duration::from_secs_f64(planned as f64 / options.rate.max(0.001));
    // The runs the agents still use, which retention leaves alone.
    let activity = purge::Activity::default();
    // The MCP agents, through a `sluice mcp` of their own that outlives every crash.
    let stories = mcp::plan(
        options.seed,
        (planned as f64 * options.mcp_stories_per_effect).round() as usize,
        &options.rates,
    );
    let mut mcp_server = None;
    let telling = if stories.is_empty() {
        None
    } else {
        let server = mcp::McpServer::start(&bin, api.base(), dir.path()).await?;
        let client = mcp::McpClient::new(&server.url, &tokens.agent)?;
        mcp_server = Some(server);
        let spacing = workload_time.div_f64(stories.len() as f64 + 1.0);
        Some(tokio::spawn(mcp::tell(
            client,
            stories,
            spacing,
            activity.clone(),
        )))
    };
    let mean = workload_time.div_f64(options.crashes.max(1) as f64);
    let reached = CancellationToken::new();
    let stop_crashing = CancellationToken::new();
    let crashing = {
        let (reached, stop) = (reached.clone(), stop_crashing.clone());
        let crashes = options.crashes;
        tokio::spawn(async move {
            let outcome = supervisor.crash_loop(crashes, mean, reached, stop).await;
            (supervisor, outcome)
        })
    };
    let settling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_operating = CancellationToken::new();
    let operating = tokio::spawn(operator::operate_beside_purges(
        api.clone(),
        Arc::clone(&upstream),
        options.seed,
        Duration::from_secs(45),
        Duration::from_secs(1),
        Arc::clone(&settling),
        stop_operating.clone(),
        options.retention.is_some(),
    ));
    let stop_purging = CancellationToken::new();
    let purging = options.retention.clone().map(|mut retention| {
        // No write after a cutoff may carry an earlier time: twice the skew apart at most.
        let skew = match &options.crash_mode {
            CrashMode::Failpoints { clock_skew_ms, .. } => *clock_skew_ms,
            CrashMode::Kill => 0,
        };
        retention.age = retention.age.max(Duration::from_millis(2 * skew + 500));
        tokio::spawn(purge::purge_loop(
            api.clone(),
            activity.clone(),
            retention,
            started_ms,
            stop_purging.clone(),
        ))
    });
    progress!(
        options,
        "workload: {planned} effects in {} runs over ~{:.0} s, {} crashes",
        plan.len(),
        workload_time.as_secs_f64(),
        options.crashes
    );
    let phasing = options.phases.map(|length| {
        tokio::spawn(phases::play(
            Arc::clone(&upstream),
            workload_time,
            length,
            options.progress,
        ))
    });
    let runs = plan.len();
    let driven = driver::drive_noting(
        api.clone(),
        plan,
        options.rate,
        options.agents,
        activity.clone(),
    )
    .await;
    // The crashes may lag behind the workload (restarts take time; a failpoint is reached
    // when it is reached): keep the faults on until they are all in, within twice their
    // schedule.
    tokio::select! {
        () = reached.cancelled() => {}
        () = tokio::time::sleep(workload_time.max(mean * 2 * u32::try_from(options.crashes).unwrap_or(u32::MAX))) => {}
    }
    stop_crashing.cancel();
    let (mut supervisor, crashed) = crashing
        .await
        .map_err(|e| ChaosError::Setup(format!("the crash loop failed: {e}")))?;
    let mut driven = driven?;
    crashed?;
    let told = match telling {
        Some(telling) => telling
            .await
            .map_err(|e| ChaosError::Setup(format!("the MCP agents failed: {e}")))?,
        None => mcp::Told::default(),
    };
    driven.accepted.extend(mcp::McpCall::accepted(&told.calls));
    if let Some(server) = mcp_server.as_mut() {
        if !server.alive() {
            driven.unexpected.push(format!(
                "sluice mcp exited during the run (see {})",
                server.log.display()
            ));
        }
        driven.unexpected.extend(server.lends_a_token.clone());
    }
    let workload_done = started.elapsed();
    progress!(
        options,
        "workload done after {:.1} s: {} accepted, {} crashes; settling",
        workload_done.as_secs_f64(),
        driven.accepted.len(),
        supervisor.crashes.len()
    );

    // Settle: no more faults, a process without failpoints, and time.
    if let Some(phasing) = phasing {
        phasing.abort();
        let _ = phasing.await;
    }
    upstream.calm();
    settling.store(true, std::sync::atomic::Ordering::SeqCst);
    supervisor.restart_clean().await?;
    let run_ids: Vec<String> = driven
        .accepted
        .iter()
        .map(|a| a.run_id.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let settle_started = Instant::now();
    let settled = settle(&api, &upstream, &run_ids, &options).await?;
    let settle_time = settle_started.elapsed();
    stop_operating.cancel();
    let operated = operating
        .await
        .map_err(|e| ChaosError::Setup(format!("the operator failed: {e}")))??;
    stop_purging.cancel();
    let purges = match purging {
        Some(purging) => Some(
            purging
                .await
                .map_err(|e| ChaosError::Setup(format!("the purges failed: {e}")))?,
        ),
        None => None,
    };
    progress!(
        options,
        "settled={settled} after {:.1} s; checking",
        settle_time.as_secs_f64()
    );

    // Collect what Sluice ended with, and what the upstream saw: a purged run as read just
    // before the purge that took it.
    let purged: HashMap<&str, &purge::Purged> = purges
        .iter()
        .flat_map(|p| &p.purged)
        .map(|p| (p.run_id.as_str(), p))
        .collect();
    let kept: Vec<String> = run_ids
        .iter()
        .filter(|run| !purged.contains_key(run.as_str()))
        .cloned()
        .collect();
    let Ended {
        mut commands,
        mut journals,
        mut audits,
        mut verdicts,
    } = read_ended(&api, &kept).await?;
    let flow = phases::figures(&api, &audits).await?;
    for (run, gone) in &purged {
        let Some(snapshot) = &gone.snapshot else {
            continue;
        };
        journals.insert(
            (*run).to_owned(),
            snapshot
                .commands
                .iter()
                .map(|c| c.command_key.to_string())
                .collect(),
        );
        for command in &snapshot.commands {
            commands.insert(
                ((*run).to_owned(), command.command_key.to_string()),
                command.clone(),
            );
        }
        audits.insert((*run).to_owned(), snapshot.audit.clone());
        verdicts.insert((*run).to_owned(), snapshot.verdict.clone());
    }
    let record = upstream.record();
    let clock_skew_ms = match &options.crash_mode {
        CrashMode::Failpoints { clock_skew_ms, .. } => *clock_skew_ms,
        CrashMode::Kill => 0,
    };
    let evidence = invariants::Evidence {
        seed: options.seed,
        accepted: &driven.accepted,
        commands: &commands,
        journals: &journals,
        audits: &audits,
        verdicts: &verdicts,
        record: &record,
        rollbacks: &driven.rollbacks,
        crashes: &supervisor.crashes,
        timing: &options.timing,
        late_commit_horizon_ms: options.times.late_commit_horizon_ms(),
        clock_skew_ms,
    };
    let scenario = invariants::Scenario {
        tightened: supervisor.tightened,
        mcp: (told.stories > 0).then_some(told.calls.as_slice()),
        purged: purges.as_ref().map(|p| p.purged.as_slice()),
    };
    let checks = invariants::check_with(&evidence, &scenario);

    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    let accepted_keys: HashSet<(&str, &str)> = driven
        .accepted
        .iter()
        .map(|a| (a.run_id.as_str(), a.command_key.as_str()))
        .collect();
    let mut escalated = 0;
    for ((run, key), command) in &commands {
        if accepted_keys.contains(&(run.as_str(), key.as_str())) {
            *statuses.entry(command.status().to_string()).or_default() += 1;
            escalated += u64::from(command.state.escalated);
        }
    }
    let dispatch_faults = record.dispatch_faults();
    let mut faults: BTreeMap<String, u64> = dispatch_faults
        .iter()
        .filter(|(kind, _)| **kind != upstream::DispatchFault::None)
        .map(|(kind, n)| (kind.to_string(), *n))
        .collect();
    faults.insert(
        "inconclusive_check".into(),
        record.counters.inconclusive_checks,
    );
    faults.insert("slow_lookup (checks)".into(), record.counters.slow_lookups);
    faults.insert(
        "lagging_lookup (commits)".into(),
        record.counters.lagged_commits,
    );
    faults.insert(
        "key_ignoring (sms commits)".into(),
        record
            .commits
            .iter()
            .filter(|c| c.endpoint == "sms")
            .count() as u64,
    );
    for reversal in &record.reversals {
        if reversal.fault != upstream::ReverseFault::None {
            *faults
                .entry(reversal.fault.as_str().to_owned())
                .or_default() += 1;
        }
    }
    let mut operator_actions = operated.actions.clone();
    for (outcome, n) in &driven.cancels {
        operator_actions.insert(format!("cancel {outcome}"), *n);
    }
    operator_actions.insert("rollback requests".into(), driven.rollbacks.len() as u64);
    let mut unexpected = driven.unexpected.clone();
    unexpected.extend(operated.unexpected.iter().cloned());
    unexpected.extend(told.unexpected.iter().cloned());
    if let Some(purges) = &purges {
        unexpected.extend(purges.unexpected.iter().cloned());
    }
    let mcp = mcp_figures(&told);
    let tightened = supervisor.tightened.map(|t| {
        format!(
            "{} from generation {} (after crash {}), {:.1} s into the run",
            Policy::Tightened.version(),
            t.generation,
            options.crashes.div_ceil(2),
            (t.at_ms - started_ms) as f64 / 1_000.0
        )
    });
    let figures = Figures {
        effects_planned: planned,
        runs,
        accepted: driven.accepted.len(),
        resubmitted: driven.resubmitted,
        refused_rolled_back: driven.refused_rolled_back,
        backed_off: driven.backed_off,
        batches: driven.batches,
        dispatch_calls: record.dispatches.len() as u64,
        ambiguous_calls: record
            .dispatches
            .iter()
            .filter(|d| d.fault.ambiguous() || d.in_progress)
            .count() as u64,
        faults,
        status_checks: record.counters.status_checks,
        lagged_misses: record.counters.lagged_misses,
        reversals: record.reversals.len() as u64,
        crashes: supervisor.by_cause(),
        injected_crashes: supervisor.crashes.iter().filter(|c| c.injected()).count(),
        clean_restarts: supervisor.restarts,
        statuses,
        escalated,
        operator: operator_actions,
        unexpected,
        mcp,
        tightened,
        purges: purges.as_ref().map(purge_figures).unwrap_or_default(),
        flow,
        workload: workload_done,
        settle: settle_time,
        total: started.elapsed(),
        settled,
    };
    supervisor.shutdown();
    drop(supervisor);
    drop(mcp_server);
    if let Ok(upstream) = Arc::try_unwrap(upstream) {
        upstream.stop().await;
    }
    let kept = options.keep.then(|| dir.keep().display().to_string());
    Ok(Report {
        seed: options.seed,
        checks,
        figures,
        kept,
    })
}

/// What retention did.
fn purge_figures(purges: &purge::Purges) -> BTreeMap<String, u64> {
    let mut figures = BTreeMap::from([
        ("purges".into(), purges.rounds),
        ("runs purged".into(), purges.purged.len() as u64),
        (
            "runs kept, owing work (over all purges)".into(),
            purges.kept_runs,
        ),
        ("purges whose answer was lost".into(), purges.unanswered),
    ]);
    for (owed, n) in &purges.kept {
        figures.insert(format!("kept owing {owed}"), *n);
    }
    figures
}

/// What the MCP agents did, by kind.
fn mcp_figures(told: &mcp::Told) -> BTreeMap<String, u64> {
    let calls = &told.calls;
    let count = |f: &dyn Fn(&mcp::McpCall) -> bool| calls.iter().filter(|c| f(c)).count() as u64;
    BTreeMap::from([
        ("stories".into(), told.stories as u64),
        ("sessions".into(), told.sessions),
        ("calls".into(), calls.len() as u64),
        (
            "timed out, cancelled, sent again".into(),
            count(&|c| c.timed_out),
        ),
        (
            "sent again after no answer".into(),
            calls.iter().map(|c| u64::from(c.unanswered)).sum(),
        ),
        (
            "re-driven in a new session".into(),
            count(&|c| c.redrive.is_some()),
        ),
    ])
}

fn write(path: &std::path::Path, text: &str) -> Result<(), ChaosError> {
    std::fs::write(path, text).map_err(|source| ChaosError::Io {
        what: format!("write {}", path.display()),
        source,
    })
}

/// A loopback address with a free port, kept by the restarts of the pipeline.
fn free_port() -> Result<std::net::SocketAddr, ChaosError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|source| ChaosError::Io {
            what: "find a free port".into(),
            source,
        })
}

/// Whether nothing more will happen to the command by itself. A CONFIRMED command with a due
/// time still has a look coming (a verification, a duplicate's clean-up).
pub fn at_rest(command: &Command) -> bool {
    (command.status().is_terminal() || command.status() == CommandStatus::Stuck)
        && !command.state.verify_pending
        && command.state.owed_duplicates.is_empty()
        && !(command.status() == CommandStatus::Confirmed && command.state.due_at.is_some())
}

/// Waits until every command of `runs` is at rest and nothing changes for the quiet period,
/// and the upstream has no work still running; `false` if the deadline came first.
pub async fn settle(
    api: &api::Api,
    upstream: &ChaosUpstream,
    runs: &[String],
    options: &Options,
) -> Result<bool, ChaosError> {
    let deadline = Instant::now() + options.settle_timeout;
    let mut quiet_since: Option<(Instant, u64)> = None;
    let mut last_report = Instant::now();
    loop {
        let listed: Vec<Vec<Command>> = futures::stream::iter(runs.iter().cloned())
            .map(|run| {
                let api = api.clone();
                async move { api.run_commands(&run).await }
            })
            .buffer_unordered(8)
            .try_collect()
            .await?;
        let mut moving = 0;
        let mut fingerprint = std::collections::hash_map::DefaultHasher::new();
        let mut all: Vec<&Command> = listed.iter().flatten().collect();
        all.sort_by(|a, b| {
            (a.run_id.as_str(), a.command_key.to_string())
                .cmp(&(b.run_id.as_str(), b.command_key.to_string()))
        });
        for command in all {
            if !at_rest(command) {
                moving += 1;
            }
            command.command_key.to_string().hash(&mut fingerprint);
            command.state.updated_at.as_millis().hash(&mut fingerprint);
        }
        let fingerprint = fingerprint.finish();
        let running = upstream.running();
        if moving == 0 && running == 0 {
            match quiet_since {
                Some((since, print)) if print == fingerprint => {
                    if since.elapsed() >= options.quiet() {
                        return Ok(true);
                    }
                }
                _ => quiet_since = Some((Instant::now(), fingerprint)),
            }
        } else {
            quiet_since = None;
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            progress!(
                options,
                "settling: {moving} command(s) still moving, {running} upstream request(s) running"
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
