//! `sluice bench --mode agents`: the agent's call, one synchronous submission per effect.
//!
//! C agents in a closed loop each submit an IDEMPOTENT `email/send` effect with `Prefer:
//! wait=30, return=minimal` and wait for its answer before sending the next: the call an agent
//! makes when it runs a tool through Sluice. Every concurrency of `--concurrency` (default
//! 1,16,64,256) is one row, measured on a fresh pipeline.
//!
//! Three processes, so that the figures are the pipeline's alone: `sluice dev` (the pipeline
//! under test, on a fresh data directory per row), the demo upstream (`sluice bench-upstream`,
//! started once), and this process, the load generator. A row's CPU per effect is the
//! pipeline process's user and system time over the measured effects (read from
//! `/proc/<pid>/stat`); its peak RSS is the pipeline's `VmHWM` at the end of the row.
//! Latency is measured by the agent, from sending the request to reading the settled answer.
//! The first effects of a row (a fiftieth, at least one per agent) warm the pipeline up and
//! are not measured.

use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::*;

/// One row of the agents bench.
#[derive(Debug, Clone, Serialize)]
pub struct AgentsRow {
    pub concurrency: usize,
    /// Effects measured (after the warm-up).
    pub effects: usize,
    pub effects_per_sec: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// CPU of the pipeline process per measured effect, in microseconds.
    pub cpu_us_per_effect: Option<f64>,
    /// The pipeline process's peak resident set, in MiB.
    pub peak_rss_mib: Option<f64>,
}

impl AgentsRow {
    pub fn line(&self) -> String {
        let cpu = self
            .cpu_us_per_effect
            .map_or_else(|| "?".into(), |cpu| format!("{cpu:.0}"));
        let rss = self
            .peak_rss_mib
            .map_or_else(|| "?".into(), |rss| format!("{rss:.0}"));
        format!(
            "bench agents C={}: {} effects, {:.0} effects/s; latency p50 {:.2} ms p99 {:.2} ms max {:.1} ms; {cpu} µs of the pipeline's CPU per effect; peak RSS {rss} MiB",
            self.concurrency,
            self.effects,
            self.effects_per_sec,
            self.p50_ms,
            self.p99_ms,
            self.max_ms
        )
    }
}

/// The agents' bearer token name.
const AGENT: &str = "bench-agent";
/// Effects of one agent per run: a run's effects are dispatched one after another.
const EFFECTS_PER_RUN: usize = 100;

/// Runs every row of `--concurrency`, printing each as it ends unless `args.json`.
pub(super) async fn run_agents(
    args: &BenchArgs,
    data_dir: &Path,
    shutdown: &Shutdown,
    progress: &Progress,
) -> Result<Vec<AgentsRow>, BenchError> {
    let exe = std::env::current_exe().map_err(|e| BenchError::Process(format!("{e}")))?;
    let (mut upstream, base_url) = start_upstream(&exe, data_dir).await?;
    let mut rows = Vec::new();
    let outcome = async {
        for &concurrency in &args.concurrency_list(Mode::Agents) {
            let row = run_row(args, &exe, &base_url, data_dir, concurrency, progress);
            let row = tokio::select! {
                row = row => row?,
                () = shutdown.cancelled() => return Err(BenchError::Interrupted),
            };
            if !args.json {
                println!("{}", row.line());
            }
            rows.push(row);
        }
        Ok(())
    }
    .await;
    let _ = upstream.kill().await;
    outcome.map(|()| rows)
}

/// Starts `sluice bench-upstream` on a free port; its base URL is the first line it prints.
async fn start_upstream(exe: &Path, data_dir: &Path) -> Result<(Child, String), BenchError> {
    let log = std::fs::File::create(data_dir.join("upstream.log"))
        .map_err(|e| BenchError::Process(format!("upstream log: {e}")))?;
    let mut child = Command::new(exe)
        .args(["bench-upstream", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::Process(format!("cannot start the upstream: {e}")))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Process("the upstream has no stdout".into()))?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .map_err(|_| BenchError::Process("the upstream did not start within 30 s".into()))?
        .map_err(|e| BenchError::Process(format!("reading the upstream: {e}")))?
        .ok_or_else(|| BenchError::Process("the upstream exited before listening".into()))?;
    let base_url = line
        .rsplit(' ')
        .next()
        .filter(|url| url.starts_with("http://"))
        .ok_or_else(|| BenchError::Process(format!("unexpected upstream line {line:?}")))?
        .to_owned();
    Ok((child, base_url))
}

/// A free loopback port (bound, then released for the pipeline to bind).
fn free_port() -> Result<u16, BenchError> {
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|e| BenchError::Process(format!("no free port: {e}")))
}

/// The pipeline's configuration for one row: the embedded default as `sluice dev` runs it,
/// fsync per commit group, one agent token.
fn pipeline_config(dir: &Path, port: u16, token: &str, args: &BenchArgs) -> String {
    let durability = args.durability.unwrap_or(DurabilityArg::Full).as_str();
    let mut text = format!(
        "[catalog]\npath = {catalog:?}\n\n[ledger]\ndata_dir = {ledger:?}\ndurability = \"{durability}\"\n\n\
         [producer]\nlisten = \"127.0.0.1:{port}\"\n\n[telemetry]\nlog_level = {level:?}\n\n\
         [[auth.tokens]]\nname = \"{AGENT}\"\nrole = \"agent\"\ntoken = \"{token}\"\n",
        catalog = dir.join("catalog.toml").display().to_string(),
        ledger = dir.join("ledger").display().to_string(),
        level = args.log_level,
    );
    if let Some(partitions) = args.partitions {
        text.push_str(&format!("\n[bus]\npartitions = {partitions}\n"));
    }
    if let Some(concurrency) = args.dispatcher_concurrency {
        text.push_str(&format!("\n[dispatcher]\nconcurrency = {concurrency}\n"));
    }
    text
}

/// The pipeline process of one row, killed when dropped.
struct PipelineProcess {
    child: Child,
    pid: u32,
    base: String,
}

impl PipelineProcess {
    async fn start(
        exe: &Path,
        dir: &Path,
        base_url: &str,
        args: &BenchArgs,
        token: &str,
    ) -> Result<Self, BenchError> {
        std::fs::create_dir_all(dir.join("ledger"))
            .map_err(|e| BenchError::Process(format!("{}: {e}", dir.display())))?;
        let catalog = sluice_assemble::EXAMPLE_CATALOG.replace(
            sluice_assemble::EXAMPLE_UPSTREAM,
            base_url.trim_end_matches('/'),
        );
        let port = free_port()?;
        let write = |name: &str, text: &str| {
            std::fs::write(dir.join(name), text)
                .map_err(|e| BenchError::Process(format!("{name}: {e}")))
        };
        write("catalog.toml", &catalog)?;
        write("sluice.toml", &pipeline_config(dir, port, token, args))?;
        let log = std::fs::File::create(dir.join("sluice.log"))
            .map_err(|e| BenchError::Process(format!("sluice.log: {e}")))?;
        // Under a profiler when asked: the wrapper runs `exe` in this same process id (valgrind
        // and perf exec it), so the CPU and RSS figures stay the pipeline's.
        let mut wrap = args
            .pipeline_wrap
            .as_deref()
            .unwrap_or_default()
            .split_whitespace();
        let mut command = match wrap.next() {
            Some(program) => {
                let mut command = Command::new(program);
                command.args(wrap).arg(exe);
                command
            }
            None => Command::new(exe),
        };
        let child = command
            .arg("dev")
            .arg("--config")
            .arg(dir.join("sluice.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| BenchError::Process(format!("cannot start sluice dev: {e}")))?;
        let pid = child
            .id()
            .ok_or_else(|| BenchError::Process("sluice dev exited at once".into()))?;
        let process = Self {
            child,
            pid,
            base: format!("http://127.0.0.1:{port}"),
        };
        process.ready().await?;
        Ok(process)
    }

    /// Waits for `/readyz`.
    async fn ready(&self) -> Result<(), BenchError> {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(response) = client.get(format!("{}/readyz", self.base)).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(BenchError::Process(format!(
            "sluice dev (pid {}) was not ready within 60 s; see its log",
            self.pid
        )))
    }

    fn cpu(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        cpu_of_stat(&stat)
    }

    /// `VmHWM`: the peak resident set so far, in MiB.
    fn peak_rss_mib(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        peak_rss_of_status(&status)
    }
}

/// `VmHWM` of a `/proc/<pid>/status` text, in MiB.
fn peak_rss_of_status(status: &str) -> Option<f64> {
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// What the agents of one row share: the next effect to send and the latencies measured.
struct Loop {
    next: AtomicUsize,
    total: usize,
    warmup: usize,
    latencies_ns: std::sync::Mutex<Vec<u64>>,
    /// When the first measured effect was sent, and when the last one was answered.
    measured_from: std::sync::Mutex<Option<Instant>>,
    measured_to: std::sync::Mutex<Option<Instant>>,
    cpu_at_start: std::sync::Mutex<Option<Duration>>,
}

/// One row: a fresh pipeline, `concurrency` agents, `args.effects` effects.
async fn run_row(
    args: &BenchArgs,
    exe: &Path,
    base_url: &str,
    data_dir: &Path,
    concurrency: usize,
    progress: &Progress,
) -> Result<AgentsRow, BenchError> {
    let dir = data_dir.join(format!("agents-c{concurrency}"));
    let token = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let pipeline = PipelineProcess::start(exe, &dir, base_url, args, &token).await?;
    let client = http_client(Some(&token));
    let total = args.effects.max(concurrency * 2);
    let shared = Arc::new(Loop {
        next: AtomicUsize::new(0),
        total,
        warmup: (total / 50).max(concurrency),
        latencies_ns: std::sync::Mutex::new(Vec::with_capacity(total)),
        measured_from: std::sync::Mutex::new(None),
        measured_to: std::sync::Mutex::new(None),
        cpu_at_start: std::sync::Mutex::new(None),
    });
    let bar = progress.bar(total as u64, &format!("agents C={concurrency}"));
    let mut agents = JoinSet::new();
    for agent in 0..concurrency {
        let (client, shared, base, bar) = (
            client.clone(),
            Arc::clone(&shared),
            pipeline.base.clone(),
            bar.clone(),
        );
        let pid = pipeline.pid;
        agents.spawn(async move {
            agent_loop(agent, concurrency, &client, &base, &shared, &bar, pid).await
        });
    }
    while let Some(done) = agents.join_next().await {
        flatten(done)?;
    }
    bar.finish_and_clear();
    let cpu_end = pipeline.cpu();
    let peak_rss_mib = pipeline.peak_rss_mib();
    let mut pipeline = pipeline;
    if args.pipeline_wrap.is_some() {
        // Stopped as a signal stops it, so that a profiler around it writes its output.
        let _ = Command::new("kill")
            .args(["-TERM", &pipeline.pid.to_string()])
            .status()
            .await;
        let _ = tokio::time::timeout(Duration::from_secs(300), pipeline.child.wait()).await;
    }
    let _ = pipeline.child.kill().await;

    let mut latencies = std::mem::take(&mut *lock(&shared.latencies_ns));
    latencies.sort_unstable();
    let from = *lock(&shared.measured_from);
    let to = *lock(&shared.measured_to);
    let secs = match (from, to) {
        (Some(from), Some(to)) => to.duration_since(from).as_secs_f64(),
        _ => 0.0,
    };
    let cpu_start = *lock(&shared.cpu_at_start);
    let measured = latencies.len();
    let ms = |nanos: u64| nanos as f64 / 1e6;
    Ok(AgentsRow {
        concurrency,
        effects: measured,
        effects_per_sec: if secs > 0.0 {
            measured as f64 / secs
        } else {
            0.0
        },
        p50_ms: ms(percentile(&latencies, 0.50)),
        p99_ms: ms(percentile(&latencies, 0.99)),
        max_ms: ms(latencies.last().copied().unwrap_or(0)),
        cpu_us_per_effect: match (cpu_start, cpu_end) {
            (Some(start), Some(end)) if measured > 0 => {
                Some(end.saturating_sub(start).as_secs_f64() * 1e6 / measured as f64)
            }
            _ => None,
        },
        peak_rss_mib,
    })
}

/// One agent: takes the next effect, submits it and waits for its settled answer, until the
/// row's effects are all sent.
async fn agent_loop(
    agent: usize,
    concurrency: usize,
    client: &reqwest::Client,
    base: &str,
    shared: &Loop,
    bar: &ProgressBar,
    pid: u32,
) -> Result<(), BenchError> {
    let url = format!("{base}/v1/effects");
    let mut sent_by_me = 0usize;
    loop {
        let index = shared.next.fetch_add(1, Ordering::Relaxed);
        if index >= shared.total {
            return Ok(());
        }
        if index == shared.warmup {
            // The first measured effect: the pipeline's CPU from here on is the row's.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            *lock(&shared.cpu_at_start) = stat.as_deref().and_then(cpu_of_stat);
            *lock(&shared.measured_from) = Some(Instant::now());
        }
        let run = format!(
            "agents-c{concurrency}-a{agent}-{}",
            sent_by_me / EFFECTS_PER_RUN
        );
        let decision = sent_by_me % EFFECTS_PER_RUN + 1;
        sent_by_me += 1;
        let body = json!({
            "run_id": run,
            "decision": decision,
            "tool": "email/send",
            "call_idx": 0,
            "args": {"to": "agent@example.com", "subject": format!("effect {index}"), "body": "hello"},
        });
        let started = Instant::now();
        let response = client
            .post(&url)
            .header(PREFER, "wait=30, return=minimal")
            .json(&body)
            .send()
            .await
            .map_err(|e| BenchError::Process(format!("submission {index}: {e}")))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| BenchError::Process(format!("submission {index}: {e}")))?;
        let elapsed = started.elapsed();
        if status != StatusCode::CREATED || !text.contains("\"CONFIRMED\"") {
            return Err(BenchError::Process(format!(
                "submission {index} was answered {status}, not 201 CONFIRMED: {}",
                text.chars().take(300).collect::<String>()
            )));
        }
        if index >= shared.warmup {
            lock(&shared.latencies_ns).push(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX));
            let mut to = lock(&shared.measured_to);
            let now = Instant::now();
            if to.is_none_or(|to| to < now) {
                *to = Some(now);
            }
        }
        bar.inc(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_resident_set_is_read_from_the_status_text() {
        let status =
            "Name:\tsluice\nVmPeak:\t 2000000 kB\nVmHWM:\t   65536 kB\nVmRSS:\t   60000 kB\n";
        assert_eq!(peak_rss_of_status(status), Some(64.0));
        assert_eq!(peak_rss_of_status("Name:\tsluice\n"), None);
    }

    #[test]
    fn the_pipeline_configuration_is_valid_toml_with_the_agent_token() {
        let dir = std::env::temp_dir().join(format!("sluice-agents-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let text = pipeline_config(&dir, 4321, "token-of-sixteen-chars", &BenchArgs::defaults());
        std::fs::write(dir.join("sluice.toml"), &text).expect("written");
        let config = Config::load(Some(&dir.join("sluice.toml")), Vec::new())
            .unwrap_or_else(|e| panic!("{e}: {text}"));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(config.producer.listen.port(), 4321);
        assert_eq!(config.auth.tokens.len(), 1);
        assert_eq!(config.auth.tokens[0].role, Role::Agent);
    }
}
