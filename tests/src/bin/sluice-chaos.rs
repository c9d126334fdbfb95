//! `sluice-chaos`: the seeded fault runner (see `sluice_tests::chaos`). Prints its seed first,
//! then the invariants table and the figures; exits 1 when a guarantee broke, 2 when the run
//! itself could not be carried out.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sluice_tests::chaos::{self, Options, crashes::CrashMode};

/// Crash a `sluice dev` pipeline while agents drive it against a misbehaving upstream, then
/// check the guarantees against the upstream's own record.
#[derive(Debug, Parser)]
#[command(name = "sluice-chaos")]
struct Args {
    /// The seed; random (and printed) when not given. The same seed plans the same workload
    /// and draws the same fault for each request.
    #[arg(long)]
    seed: Option<u64>,
    /// Effects to submit.
    #[arg(long, default_value_t = 10_000)]
    effects: usize,
    /// Crashes to inject during the workload.
    #[arg(long, default_value_t = 50)]
    crashes: usize,
    /// Effects submitted per second.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Runs in flight at once.
    #[arg(long, default_value_t = 48)]
    agents: usize,
    /// Multiply every fault rate by this (1: the standard rates, about 27% of calls ambiguous).
    #[arg(long, default_value_t = 1.0)]
    fault_scale: f64,
    /// Crash at failpoints instead of with SIGKILL; needs a `sluice` built with
    /// `--features failpoints` (see --build).
    #[arg(long)]
    failpoints: bool,
    /// The failpoint names to draw from (comma-separated, or @file with one per line); default:
    /// those the failpoint build declares.
    #[arg(long)]
    failpoint_names: Option<String>,
    /// In failpoint mode, offset each service's clock by up to this many ms either way.
    #[arg(long, default_value_t = 0)]
    clock_skew_ms: u64,
    /// The `sluice` binary to run (default: beside this executable).
    #[arg(long)]
    sluice_bin: Option<PathBuf>,
    /// Build `sluice` first (release; with the failpoints feature under --failpoints) into
    /// `<this executable's target dir>/chaos`.
    #[arg(long)]
    build: bool,
    /// Leave the late-commit and verification horizons (`late_commit_ms`, `verify_after_ms`,
    /// `max_clock_skew_ms`) out of the catalog: the tools' defaults then apply, which do not
    /// match this upstream's late commits and lagging lookups.
    #[arg(long)]
    no_horizons: bool,
    /// Do not restart halfway through the crashes with a stricter catalog (by default one
    /// restart brings a catalog in which tickets, email and SMS need approval and wires need it
    /// above a lower amount, under a new policy version).
    #[arg(long)]
    no_tighten: bool,
    /// Leave out the upstream's phases (a third of the way through the workload 30 % of
    /// dispatches answered 429 `Retry-After: 1`; two thirds of the way the bank down, every
    /// dispatch and lookup 503).
    #[arg(long)]
    no_phases: bool,
    /// How long each phase lasts, in seconds.
    #[arg(long, default_value_t = 8)]
    phase_secs: u64,
    /// MCP stories per effect: agents calling through `sluice mcp --transport http` and
    /// re-driving their conversations in new sessions (0: none).
    #[arg(long, default_value_t = 0.01)]
    mcp_stories_per_effect: f64,
    /// Do not purge finished runs mid-run (by default an operator purges every few seconds,
    /// with a cutoff as recent as the agents allow, through the workload and the settling).
    #[arg(long)]
    no_purges: bool,
    /// Seconds between two purges.
    #[arg(long, default_value_t = 5)]
    purge_every_secs: u64,
    /// Seconds the pipeline may take to settle after the workload.
    #[arg(long, default_value_t = 240)]
    settle_timeout_secs: u64,
    /// Keep the run's directory (ledger, catalog, process logs).
    #[arg(long)]
    keep: bool,
    /// Violations told with their whole story (audit path, upstream history), per invariant.
    #[arg(long, default_value_t = sluice_tests::chaos::report::STORIES_PER_INVARIANT)]
    stories: usize,
    /// The pipeline's log level.
    #[arg(long, default_value = "warn")]
    log_level: String,
}

fn failpoint_names(given: Option<&str>) -> anyhow::Result<Vec<String>> {
    let names = match given {
        None => chaos::crashes::known_failpoints(),
        Some(file) if file.starts_with('@') => std::fs::read_to_string(&file[1..])?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_owned)
            .collect(),
        Some(list) => list
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    };
    anyhow::ensure!(
        !names.is_empty(),
        "--failpoints needs failpoint names: pass --failpoint-names until the failpoint build's list is on main"
    );
    Ok(names)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(chaos::random_seed);
    println!("sluice-chaos: seed {seed} (replay with --seed {seed})");
    let stories = args.stories;
    match run(args, seed).await {
        Ok(report) => {
            println!("{}", report.render_with(stories));
            if report.failed() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("sluice-chaos (seed {seed}): the run could not be carried out: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args, seed: u64) -> anyhow::Result<chaos::report::Report> {
    let mut options = Options::new(seed);
    options.workload.effects = args.effects;
    options.crashes = args.crashes;
    options.rate = args.rate;
    options.agents = args.agents;
    options.rates = options.rates.scaled(args.fault_scale);
    options.horizons.declare = !args.no_horizons;
    // Each service is offset by up to the skew either way: two of them differ by twice that.
    options.horizons.max_clock_skew_ms = args.clock_skew_ms.saturating_mul(2);
    options.settle_timeout = Duration::from_secs(args.settle_timeout_secs);
    options.tighten_policy = !args.no_tighten;
    options.mcp_stories_per_effect = args.mcp_stories_per_effect.max(0.0);
    options.retention = (!args.no_purges).then(|| chaos::purge::Retention {
        every: Duration::from_secs(args.purge_every_secs.max(1)),
        ..chaos::purge::Retention::default()
    });
    options.phases = (!args.no_phases).then(|| Duration::from_secs(args.phase_secs.max(1)));
    options.keep = args.keep;
    options.log_level = args.log_level;
    if args.failpoints {
        options.crash_mode = CrashMode::Failpoints {
            points: failpoint_names(args.failpoint_names.as_deref())?,
            clock_skew_ms: args.clock_skew_ms,
        };
    }
    options.sluice_bin = args.sluice_bin;
    if args.build {
        let exe = std::env::current_exe()?;
        let target = exe
            .parent()
            .and_then(|release| release.parent())
            .ok_or_else(|| {
                anyhow::anyhow!("cannot find the target directory of {}", exe.display())
            })?
            .join("chaos");
        options.sluice_bin = Some(chaos::crashes::build_sluice(&target, args.failpoints)?);
    }
    Ok(chaos::run(options).await?)
}
