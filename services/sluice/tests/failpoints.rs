//! The failpoints in the real `sluice` binary, as a fault runner drives them: `sluice dev`
//! armed with `FAILPOINTS` dies by SIGABRT at the named site of a real submission, and after a
//! restart on the same data directory the command it had reserved is there, and the agent's
//! retry gets it back (200) instead of a second one. `SLUICE_FAULT_CLOCK_SKEW_MS` moves the
//! producer's clock, and `FAILPOINTS` or a clock skew naming nothing real stops it at start.
//! Built with the `failpoints` feature only.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_core::time::Clock as _;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const SIGABRT: i32 = 6;

/// A `sluice dev` child: its URL and admin token, and its stderr read to the end by a thread
/// (the log must be drained or the child blocks on a full pipe).
struct Dev {
    child: Child,
    url: String,
    token: String,
    stderr: Option<JoinHandle<String>>,
}

impl Dev {
    /// Starts `sluice dev` on `data` with the fault variables `env`.
    fn start(data: &Path, env: &[(&str, &str)]) -> Self {
        let mut command = dev_command(data);
        command.envs(env.iter().copied());
        let mut child = command.spawn().expect("sluice dev starts");
        let stderr = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut log = String::new();
            let _ = BufReader::new(stderr).read_to_string(&mut log);
            log
        });
        let stdout = child.stdout.take().expect("piped");
        let line = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("SLUICE_TOKEN="))
            .expect("sluice dev prints its URL and token");
        let word = |prefix: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(prefix))
                .expect("the URL and the token")
                .to_owned()
        };
        Self {
            url: word("SLUICE_URL="),
            token: word("SLUICE_TOKEN="),
            child,
            stderr: Some(stderr),
        }
    }

    /// Waits for the child to end on its own, at most `within`; its status and log.
    fn wait_for_exit(mut self, within: Duration) -> (ExitStatus, String) {
        let deadline = Instant::now() + within;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                break status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("sluice dev still running after {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let log = self.log();
        (status, log)
    }

    fn log(&mut self) -> String {
        self.stderr
            .take()
            .map(|reader| reader.join().expect("the log reader"))
            .unwrap_or_default()
    }

    fn stop(mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log()
    }
}

fn dev_command(data: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("dev")
        .env("SLUICE_PRODUCER__LISTEN", "127.0.0.1:0")
        .env("SLUICE_LEDGER__DATA_DIR", data)
        .env_remove("SLUICE_TOKEN")
        .env_remove("FAILPOINTS")
        .env_remove("SLUICE_FAULT_CLOCK_SKEW_MS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A wire (NON_IDEMPOTENT) of the example catalog; its upstream is not running, which does
/// not matter here: the crash comes before any call.
fn wire() -> Value {
    json!({
        "run_id": "r-failpoint", "decision": 1, "tool": "payments/wire", "call_idx": 0,
        "args": {"account": "acc-1", "amount_minor": 1200, "beneficiary": "b-1", "date": "2026-11-22"}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_reservation_keeps_the_command_and_the_retry_gets_it_back() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let http = reqwest::Client::new();

    let armed = tokio::task::spawn_blocking({
        let data = data.path().to_owned();
        move || Dev::start(&data, &[("FAILPOINTS", "ledger.reserve.post=return")])
    })
    .await
    .expect("started");
    let answer = http
        .post(format!("{}/v1/effects", armed.url))
        .bearer_auth(&armed.token)
        .json(&wire())
        .send()
        .await;
    assert!(
        answer.is_err(),
        "the process died before it could answer: {answer:?}"
    );
    let (status, log) =
        tokio::task::spawn_blocking(move || armed.wait_for_exit(Duration::from_secs(20)))
            .await
            .expect("waited");
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "killed by SIGABRT, not {status:?}; log:\n{log}"
    );
    assert!(
        log.contains("sluice failpoint ledger.reserve.post: crash (abort)"),
        "the crash names its site:\n{log}"
    );
    assert!(
        log.contains("failpoints armed [ledger.reserve.post=return]"),
        "the start says what is armed:\n{log}"
    );

    // Restarted on the same directory, unarmed: the reservation had committed.
    let dev = tokio::task::spawn_blocking({
        let data = data.path().to_owned();
        move || Dev::start(&data, &[])
    })
    .await
    .expect("restarted");
    let stored = http
        .get(format!(
            "{}/v1/runs/r-failpoint/effects/d-1%2Fpayments%2Fwire%2F0",
            dev.url
        ))
        .bearer_auth(&dev.token)
        .send()
        .await
        .expect("the restarted pipeline answers");
    assert_eq!(
        stored.status(),
        200,
        "the reserved command survived the crash"
    );
    let stored: Value = stored.json().await.expect("a command");
    assert_eq!(stored["idempotency_key"], "r-failpoint/d-1/payments/wire/0");

    let retry = http
        .post(format!("{}/v1/effects", dev.url))
        .bearer_auth(&dev.token)
        .json(&wire())
        .send()
        .await
        .expect("the retry is answered");
    assert_eq!(
        retry.status(),
        200,
        "the agent's retry replays, not a second command"
    );
    let retried: Value = retry.json().await.expect("a command");
    assert_eq!(retried["idempotency_key"], stored["idempotency_key"]);
    assert_eq!(retried["created_at"], stored["created_at"]);
    let log = tokio::task::spawn_blocking(move || dev.stop())
        .await
        .expect("stopped");
    assert!(!log.contains("failpoints armed"), "{log}");
}

/// A handler that panics (`consumer.handle.pre=1*panic`: the first delivery's handler, here
/// the dispatcher's for the one wire submitted) has its delivery retried: the retry gets into
/// the dispatcher's handler, where `dispatcher.lease.pre=return` ends the process — before any
/// call, so no upstream is needed. The log names the panic, the message and its command. Before
/// the fix the panic was dropped with the delivery unacknowledged, the partition waited for a
/// rebalance, and the process never reached the dispatcher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_panic_is_logged_and_its_delivery_retried() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let http = reqwest::Client::new();
    let armed = tokio::task::spawn_blocking({
        let data = data.path().to_owned();
        move || {
            Dev::start(
                &data,
                &[(
                    "FAILPOINTS",
                    "consumer.handle.pre=1*panic;dispatcher.lease.pre=return",
                )],
            )
        }
    })
    .await
    .expect("started");
    let mut wire = wire();
    wire["run_id"] = json!("r-panic");
    let answer = http
        .post(format!("{}/v1/effects", armed.url))
        .bearer_auth(&armed.token)
        .json(&wire)
        .send()
        .await
        .expect("the submission is answered");
    assert_eq!(answer.status(), 201);
    let (status, log) =
        tokio::task::spawn_blocking(move || armed.wait_for_exit(Duration::from_secs(20)))
            .await
            .expect("waited");
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "the retried delivery reached the dispatcher, not {status:?}; log:\n{log}"
    );
    assert!(
        log.contains("sluice failpoint dispatcher.lease.pre: crash (abort)"),
        "{log}"
    );
    let panicked = log
        .lines()
        .find(|line| line.contains("handler panicked"))
        .unwrap_or_else(|| panic!("the panic is logged:\n{log}"));
    for part in [
        "r-panic",
        "d-1/payments/wire/0",
        "failpoint consumer.handle.pre panic",
        "retrying",
    ] {
        assert!(panicked.contains(part), "{part} in {panicked}");
    }
}

#[test]
fn a_failpoint_or_clock_skew_naming_nothing_real_stops_the_start() {
    let data = tempfile::tempdir().expect("a temporary directory");
    for (var, value, named) in [
        (
            "FAILPOINTS",
            "ledger.reserve.pre=sleep(10);ledger.finalise.post=return",
            "ledger.finalise.post",
        ),
        ("FAILPOINTS", "ledger.reserve.pre=explode", "explode"),
        (
            "SLUICE_FAULT_CLOCK_SKEW_MS",
            "dispatcher=50,sweeper=5",
            "sweeper",
        ),
    ] {
        let output = dev_command(data.path())
            .env(var, value)
            .stdin(Stdio::null())
            .output()
            .expect("sluice dev runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{var}={value}: {stderr}");
        assert!(
            stderr.contains(named),
            "{var}={value}: the error names {named}: {stderr}"
        );
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("SLUICE_TOKEN="),
            "nothing started"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_moves_the_producers_clock() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let http = reqwest::Client::new();
    // The producer an hour ahead: the commands it records are stamped an hour ahead.
    let hour: i64 = 3_600_000;
    let dev = tokio::task::spawn_blocking({
        let data = data.path().to_owned();
        move || {
            Dev::start(
                &data,
                &[(
                    "SLUICE_FAULT_CLOCK_SKEW_MS",
                    "producer=3600000,dispatcher=-250",
                )],
            )
        }
    })
    .await
    .expect("started");
    let before = sluice_core::time::SystemClock.now();
    let answer = http
        .post(format!("{}/v1/effects", dev.url))
        .bearer_auth(&dev.token)
        .json(&wire())
        .send()
        .await
        .expect("answered");
    assert_eq!(answer.status(), 201);
    let command: Value = answer.json().await.expect("a command");
    let after = sluice_core::time::SystemClock.now();
    let created = command["created_at"]
        .as_str()
        .and_then(|at| sluice_core::time::Timestamp::parse_rfc3339(at).ok())
        .expect("a creation time");
    assert!(
        created >= before.plus_millis(hour) && created <= after.plus_millis(hour),
        "created at {created}, an hour after {before}..{after}"
    );
    let log = tokio::task::spawn_blocking(move || dev.stop())
        .await
        .expect("stopped");
    assert!(
        log.contains("clock skew [producer=3600000,dispatcher=-250]"),
        "the start says what is skewed:\n{log}"
    );
}
