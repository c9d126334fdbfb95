//! The pipeline as a child process that the runner crashes and restarts on the same data
//! directory.
//!
//! `sluice dev --config <run dir>/sluice.toml` is started, waited for (`/readyz`), and crashed
//! in one of two ways, both like `kill -9` (no shutdown hook runs, leases stay held, the
//! embedded bus's queue is lost; only the SQLite ledger survives):
//!
//! * [`CrashMode::Kill`] — the runner sends SIGKILL at seeded random times.
//! * [`CrashMode::Failpoints`] — each start picks a failpoint and a probability and passes them
//!   as `FAILPOINTS` (`<service>.<step>.<pre|post>=<p>%return`, the `fail` crate's syntax) to a
//!   `sluice` built with `--features failpoints`, whose `return` action aborts the process at
//!   that site; a second point gets a `sleep`; and on half the starts a handler panics now and
//!   then (`consumer.handle.pre` or `.post` `=<p>%panic`): the consume loop catches it and
//!   retries the delivery, and one that keeps panicking is dead-lettered and left to the
//!   sweeps. With a clock-skew bound, each start also gives every service a clock offset
//!   (`SLUICE_FAULT_CLOCK_SKEW_MS`). A process that outlives its window without reaching its
//!   failpoint is killed with SIGKILL instead.
//!
//! Whatever way the process ended, it is started again at once on the same directory, and the
//! crash is counted by its cause. At one restart mid-run the catalog file may be replaced
//! first ([`Supervisor::tighten_at`]): the process comes back under a stricter policy, as a
//! rolling deploy of a new catalog would bring it, while commands admitted under the old one
//! are still in flight.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ChaosError;
use super::api::Api;

/// How the pipeline is crashed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CrashMode {
    /// SIGKILL from the runner.
    Kill,
    /// An abort at a failpoint, drawn from `points`, with each service's clock offset by up to
    /// `clock_skew_ms` either way (0: none).
    Failpoints {
        points: Vec<String>,
        clock_skew_ms: u64,
    },
}

/// Where a handler is made to panic (the `panic` action; the consume loop catches it).
const PANIC_POINTS: [&str; 2] = ["consumer.handle.pre", "consumer.handle.post"];

/// The failpoints of a failpoint-enabled `sluice`: `sluice_faults::POINTS`, the one list the
/// sites are checked against (`--failpoint-names` narrows it).
pub fn known_failpoints() -> Vec<String> {
    sluice_faults::POINTS
        .iter()
        .map(|point| (*point).to_owned())
        .collect()
}

/// One crash.
#[derive(Debug, Clone)]
pub struct Crash {
    pub generation: u32,
    /// `sigkill`, `failpoint <name>`, `sigkill (failpoint <name> not reached)`, or
    /// `unexpected exit: <status>` for an end the runner did not cause.
    pub cause: String,
    pub uptime: Duration,
}

impl Crash {
    /// Whether the runner (or a failpoint it set) caused it.
    pub fn injected(&self) -> bool {
        !self.cause.starts_with("unexpected")
    }
}

/// The child process and its crash history.
#[derive(Debug)]
pub struct Supervisor {
    bin: PathBuf,
    config: PathBuf,
    logs: PathBuf,
    api: Api,
    mode: CrashMode,
    rng: StdRng,
    child: Option<Child>,
    started: Instant,
    generation: u32,
    /// The failpoint armed in the current process, if any.
    armed: Option<String>,
    pub crashes: Vec<Crash>,
    /// Processes stopped by the runner outside the crash schedule (the final clean restart).
    pub restarts: u32,
    /// A catalog to restart with once this many crashes were injected.
    swap: Option<CatalogSwap>,
    /// When the swapped catalog took over, once it did.
    pub tightened: Option<Tightened>,
}

/// A catalog the process is restarted with after the `after_crash`-th injected crash.
#[derive(Debug, Clone)]
struct CatalogSwap {
    after_crash: usize,
    path: PathBuf,
    text: String,
}

/// The restart that brought a stricter catalog in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tightened {
    /// When the catalog file was replaced (ms since the epoch, the record's time base): every
    /// process from then on loads it.
    pub at_ms: i64,
    /// The first generation started on it.
    pub generation: u32,
}

impl Supervisor {
    pub fn new(
        bin: &Path,
        config: &Path,
        logs: &Path,
        api: Api,
        mode: CrashMode,
        seed: u64,
    ) -> Self {
        Self {
            bin: bin.to_owned(),
            config: config.to_owned(),
            logs: logs.to_owned(),
            api,
            mode,
            rng: StdRng::seed_from_u64(seed ^ 0x0c4a_54e5),
            child: None,
            started: Instant::now(),
            generation: 0,
            armed: None,
            crashes: Vec::new(),
            restarts: 0,
            swap: None,
            tightened: None,
        }
    }

    /// Replaces the catalog file at `path` with `text` before the restart that follows the
    /// `after_crash`-th injected crash (while no process runs, as a deploy replaces a node).
    pub fn tighten_at(&mut self, after_crash: usize, path: &Path, text: String) {
        self.swap = Some(CatalogSwap {
            after_crash: after_crash.max(1),
            path: path.to_owned(),
            text,
        });
    }

    /// Writes the swapped catalog if its crash has come.
    fn swap_catalog(&mut self) -> Result<(), ChaosError> {
        let injected = self.crashes.iter().filter(|c| c.injected()).count();
        let Some(swap) = self.swap.take_if(|swap| injected >= swap.after_crash) else {
            return Ok(());
        };
        std::fs::write(&swap.path, &swap.text).map_err(|source| ChaosError::Io {
            what: format!("write the tightened catalog {}", swap.path.display()),
            source,
        })?;
        self.tightened = Some(Tightened {
            at_ms: super::upstream::record::now_ms(),
            generation: self.generation + 1,
        });
        Ok(())
    }

    /// The log file of generation `n`.
    pub fn log_of(&self, n: u32) -> PathBuf {
        self.logs.join(format!("sluice-{n}.log"))
    }

    /// Starts a process and waits until it is ready. `faulty` arms failpoints (in failpoint
    /// mode). A process that dies while starting (a failpoint on the start-up path) counts as
    /// a crash and is started again.
    pub async fn start(&mut self, faulty: bool) -> Result<(), ChaosError> {
        for _ in 0..50 {
            self.spawn(faulty)?;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(status) = self.exited() {
                    self.record_exit(status);
                    break;
                }
                if self.api.ready().await {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    let log =
                        std::fs::read_to_string(self.log_of(self.generation)).unwrap_or_default();
                    self.kill();
                    return Err(ChaosError::NotReady(format!(
                        "generation {} did not answer /readyz within 60 s; its log:\n{}",
                        self.generation,
                        tail(&log, 40)
                    )));
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        }
        Err(ChaosError::NotReady(
            "50 starts in a row died before answering /readyz".into(),
        ))
    }

    fn spawn(&mut self, faulty: bool) -> Result<(), ChaosError> {
        self.generation += 1;
        let log_path = self.log_of(self.generation);
        let log = std::fs::File::create(&log_path).map_err(|source| ChaosError::Io {
            what: format!("create {}", log_path.display()),
            source,
        })?;
        let err = log.try_clone().map_err(|source| ChaosError::Io {
            what: "a second handle on the log".into(),
            source,
        })?;
        let mut command = Command::new(&self.bin);
        command
            .arg("dev")
            .arg("--config")
            .arg(&self.config)
            .env_remove("SLUICE_CONFIG")
            .env_remove("FAILPOINTS")
            .env_remove("SLUICE_FAULT_CLOCK_SKEW_MS")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        self.armed = None;
        if faulty
            && let CrashMode::Failpoints {
                points,
                clock_skew_ms,
            } = self.mode.clone()
        {
            let (spec, armed) = self.draw_failpoints(&points);
            command.env("FAILPOINTS", &spec);
            self.armed = armed;
            if clock_skew_ms > 0 {
                let skew = ["producer", "dispatcher", "reconciler", "compensator"]
                    .map(|service| {
                        let bound = i64::try_from(clock_skew_ms).unwrap_or(i64::MAX);
                        format!("{service}={}", self.rng.random_range(-bound..=bound))
                    })
                    .join(",");
                command.env("SLUICE_FAULT_CLOCK_SKEW_MS", skew);
            }
        }
        let child = command.spawn().map_err(|source| ChaosError::Io {
            what: format!("start {} dev", self.bin.display()),
            source,
        })?;
        self.child = Some(child);
        self.started = Instant::now();
        Ok(())
    }

    /// `FAILPOINTS` for one start: one point that aborts with some probability per pass, one
    /// that delays, and on half the starts a handler that panics now and then.
    fn draw_failpoints(&mut self, points: &[String]) -> (String, Option<String>) {
        if points.is_empty() {
            return (String::new(), None);
        }
        let abort = points[self.rng.random_range(0..points.len())].clone();
        let percent = [2, 5, 10, 25, 50][self.rng.random_range(0..5usize)];
        let mut spec = format!("{abort}={percent}%return");
        let delay = &points[self.rng.random_range(0..points.len())];
        if *delay != abort {
            let ms = self.rng.random_range(20..300u32);
            spec.push_str(&format!(";{delay}=20%sleep({ms})"));
        }
        // A panic before the handler's work or after it (its writes done), caught by the
        // consume loop and retried; at these rates a message is rarely dead-lettered for
        // panicking three times in a row, which leaves its command to the sweeps.
        let panics = PANIC_POINTS[self.rng.random_range(0..PANIC_POINTS.len())];
        if self.rng.random_bool(0.5)
            && points.iter().any(|p| p == panics)
            && panics != abort
            && panics != delay.as_str()
        {
            let percent = [1, 2, 5, 10][self.rng.random_range(0..4usize)];
            spec.push_str(&format!(";{panics}={percent}%panic"));
        }
        (spec, Some(abort))
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn record_exit(&mut self, status: ExitStatus) {
        self.child = None;
        let cause = match (&self.armed, status.signal()) {
            // The fail crate's `return` aborts (SIGABRT) at the armed site.
            (Some(point), Some(6)) => format!("failpoint {point}"),
            _ => format!("unexpected exit: {status}"),
        };
        self.crashes.push(Crash {
            generation: self.generation,
            cause,
            uptime: self.started.elapsed(),
        });
    }

    /// SIGKILL, and wait for the process to be gone.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Crashes the process `crashes` times, about `mean` apart, restarting it each time, then
    /// keeps it running (restarting it if it dies on its own) until `stop`.
    pub async fn crash_loop(
        &mut self,
        crashes: usize,
        mean: Duration,
        reached: CancellationToken,
        stop: CancellationToken,
    ) -> Result<(), ChaosError> {
        let injected = |s: &Self| s.crashes.iter().filter(|c| c.injected()).count();
        while !stop.is_cancelled() {
            let crashing = injected(self) < crashes;
            if !crashing {
                reached.cancel();
            }
            let window = match (&self.mode, crashing) {
                (_, false) => Duration::from_secs(3600),
                (CrashMode::Kill, true) => mean.mul_f64(self.rng.random_range(0.3..1.7)),
                // A failpoint usually ends the process first; this is the fallback.
                (CrashMode::Failpoints { .. }, true) => mean.mul_f64(2.0),
            };
            let until = Instant::now() + window;
            let mut exited = None;
            while Instant::now() < until && !stop.is_cancelled() {
                if let Some(status) = self.exited() {
                    exited = Some(status);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if stop.is_cancelled() && exited.is_none() {
                break;
            }
            match exited {
                Some(status) => self.record_exit(status),
                None => {
                    let cause = match &self.armed {
                        Some(point) => format!("sigkill (failpoint {point} not reached)"),
                        None => "sigkill".to_owned(),
                    };
                    self.kill();
                    self.crashes.push(Crash {
                        generation: self.generation,
                        cause,
                        uptime: self.started.elapsed(),
                    });
                }
            }
            self.swap_catalog()?;
            self.start(injected(self) < crashes).await?;
        }
        Ok(())
    }

    /// Replaces the process with one that has no failpoints and no clock skew (killing the
    /// current one, which is not counted as a crash).
    pub async fn restart_clean(&mut self) -> Result<(), ChaosError> {
        if let Some(status) = self.exited() {
            self.record_exit(status);
        }
        if self.child.is_some() {
            self.restarts += 1;
        }
        self.kill();
        self.start(false).await
    }

    /// Whether the process is running.
    pub fn alive(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    /// Crashes by cause.
    pub fn by_cause(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for crash in &self.crashes {
            *counts.entry(crash.cause.clone()).or_default() += 1;
        }
        counts
    }

    /// Stops the process for good.
    pub fn shutdown(&mut self) {
        self.kill();
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The `sluice` binary to run: `explicit` if given, else the one beside this executable
/// (`target/<profile>/sluice`, also from a test binary in `target/<profile>/deps/`).
pub fn locate_sluice(explicit: Option<&Path>) -> Result<PathBuf, ChaosError> {
    if let Some(path) = explicit {
        return if path.exists() {
            Ok(path.to_owned())
        } else {
            Err(ChaosError::Setup(format!(
                "--sluice-bin {} does not exist",
                path.display()
            )))
        };
    }
    let exe = std::env::current_exe().map_err(|source| ChaosError::Io {
        what: "find this executable".into(),
        source,
    })?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        if let Some(d) = dir {
            let candidate = d.join("sluice");
            if candidate.exists() {
                return Ok(candidate);
            }
            dir = d.parent();
        }
    }
    Err(ChaosError::Setup(format!(
        "no `sluice` binary beside {}: build it first (`cargo build --release -p sluice`, or \
         with `--features failpoints` for the failpoint mode) or pass --sluice-bin",
        exe.display()
    )))
}

/// Builds `sluice` (release, with the failpoints feature when asked) into `target_dir` and
/// returns the binary's path.
pub fn build_sluice(target_dir: &Path, failpoints: bool) -> Result<PathBuf, ChaosError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command
        .args([
            "build",
            "--release",
            "-p",
            "sluice",
            "--bin",
            "sluice",
            "--target-dir",
        ])
        .arg(target_dir);
    if failpoints {
        command.args(["--features", "failpoints"]);
    }
    let status = command.status().map_err(|source| ChaosError::Io {
        what: "run cargo build".into(),
        source,
    })?;
    if !status.success() {
        return Err(ChaosError::Setup(format!(
            "cargo build of sluice failed: {status}"
        )));
    }
    Ok(target_dir.join("release").join("sluice"))
}
