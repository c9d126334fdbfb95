//! The failpoints as a fault run meets them, in a child process: `return` aborts the process
//! with SIGABRT exactly at the named site (not before, not after), `sleep` delays there, and
//! `FAILPOINTS` naming no site stops `setup` with the name.
//!
//! The child is this test binary run again with `SLUICE_FAULTS_CHILD` set: the `child` test
//! then plays the scenario that variable names, through real `point!` sites, and prints a line
//! as it passes each one. Built with the `failpoints` feature only (`required-features`); the
//! workspace's `cargo test` turns it on through the tests crate.

use std::os::unix::process::ExitStatusExt as _;
use std::process::{Command, Output};
use std::time::Instant;

const CHILD: &str = "SLUICE_FAULTS_CHILD";
const SIGABRT: i32 = 6;

/// Runs the `child` test of this binary with `scenario` and `failpoints` (unset when `None`).
fn run_child(scenario: &str, failpoints: Option<&str>) -> Output {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut command = Command::new(exe);
    command
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env_remove(sluice_faults::CLOCK_SKEW_VAR);
    match failpoints {
        Some(failpoints) => command.env(sluice_faults::FAILPOINTS_VAR, failpoints),
        None => command.env_remove(sluice_faults::FAILPOINTS_VAR),
    };
    command.output().expect("the child runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Prints and flushes at once: what the parent reads must be out before a crash.
fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("stdout flushed");
}

/// A synchronous function with a value to return, passing two sites.
fn reserve_like() -> Result<u64, String> {
    say("reached ledger.reserve.pre");
    sluice_faults::point!("ledger.reserve.pre");
    say("passed ledger.reserve.pre");
    sluice_faults::point!("ledger.reserve.post");
    say("passed ledger.reserve.post");
    Ok(7)
}

/// An async function returning something else entirely, passing two sites.
async fn call_like() -> Option<String> {
    say("reached connector.dispatch.pre");
    sluice_faults::point!("connector.dispatch.pre");
    say("passed connector.dispatch.pre");
    tokio::task::yield_now().await;
    sluice_faults::point!("connector.dispatch.post");
    say("passed connector.dispatch.post");
    Some("answer".into())
}

/// The child's side: does nothing unless started by one of the tests below.
#[test]
fn child() {
    let Ok(scenario) = std::env::var(CHILD) else {
        return;
    };
    let armed = match sluice_faults::setup() {
        Ok(armed) => armed,
        Err(e) => {
            say(&format!("setup refused: {e}"));
            return;
        }
    };
    say(&format!("armed {} point(s)", armed.points.len()));
    match scenario.as_str() {
        "sync" => {
            let value = reserve_like().expect("the function's own value");
            say(&format!("returned {value}"));
        }
        "async" => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            let answer = runtime.block_on(async { tokio::spawn(call_like()).await });
            say(&format!("returned {:?}", answer.expect("the task ran")));
        }
        "twice" => {
            for _ in 0..2 {
                let value = reserve_like().expect("the function's own value");
                say(&format!("returned {value}"));
            }
        }
        "timed" => {
            let started = Instant::now();
            sluice_faults::point!("bus.publish.pre");
            say(&format!("elapsed_ms {}", started.elapsed().as_millis()));
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn assert_aborted_at(output: &Output, passed: &[&str], site: &str) {
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(
        output.status.signal(),
        Some(SIGABRT),
        "killed by SIGABRT, not {:?}; stdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(stdout.contains("armed 1 point(s)"), "{stdout}");
    for before in passed {
        assert!(
            stdout.contains(&format!("passed {before}\n")),
            "{before} was passed first:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains(&format!("passed {site}")),
        "nothing runs after {site}:\n{stdout}"
    );
    assert!(!stdout.contains("returned"), "{stdout}");
    assert!(
        stderr.contains(&format!("sluice failpoint {site}: crash (abort)")),
        "the crash names its site:\n{stderr}"
    );
}

#[test]
fn return_aborts_a_sync_function_at_the_named_site() {
    let output = run_child("sync", Some("ledger.reserve.post=return"));
    assert_aborted_at(&output, &["ledger.reserve.pre"], "ledger.reserve.post");

    let output = run_child("sync", Some("ledger.reserve.pre=return"));
    assert_aborted_at(&output, &[], "ledger.reserve.pre");
}

#[test]
fn return_aborts_an_async_task_and_its_whole_process() {
    let output = run_child("async", Some("connector.dispatch.post=return"));
    assert_aborted_at(
        &output,
        &["connector.dispatch.pre"],
        "connector.dispatch.post",
    );
}

#[test]
fn unarmed_and_unrelated_sites_change_nothing() {
    for failpoints in [None, Some("bus.ack.post=return")] {
        let output = run_child("sync", failpoints);
        let stdout = text(&output.stdout);
        assert!(output.status.success(), "{failpoints:?}: {stdout}");
        assert!(stdout.contains("passed ledger.reserve.post"), "{stdout}");
        assert!(stdout.contains("returned 7"), "{stdout}");
    }
    let output = run_child("async", None);
    assert!(output.status.success());
    assert!(
        text(&output.stdout).contains("returned Some(\"answer\")"),
        "{}",
        text(&output.stdout)
    );
}

fn elapsed_ms(output: &Output) -> u128 {
    let stdout = text(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        text(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| line.strip_prefix("elapsed_ms "))
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed time in:\n{stdout}"))
}

#[test]
fn sleep_and_delay_hold_the_site_for_their_time() {
    let unarmed = elapsed_ms(&run_child("timed", None));
    assert!(unarmed < 300, "an unarmed site takes no time: {unarmed} ms");
    let slept = elapsed_ms(&run_child("timed", Some("bus.publish.pre=sleep(400)")));
    assert!(slept >= 400, "sleep(400) held the site {slept} ms");
    let busy = elapsed_ms(&run_child("timed", Some("bus.publish.pre=delay(300)")));
    assert!(busy >= 300, "delay(300) held the site {busy} ms");
}

#[test]
fn a_count_picks_which_pass_through_a_site_crashes() {
    // What a fault runner does to crash at the N-th pass: `off` N-1 times, then `return`.
    let output = run_child("twice", Some("ledger.reserve.pre=1*off->return"));
    let stdout = text(&output.stdout);
    assert_eq!(output.status.signal(), Some(SIGABRT), "{stdout}");
    assert_eq!(
        stdout.matches("returned 7").count(),
        1,
        "the first pass went through, the second crashed:\n{stdout}"
    );
    assert_eq!(stdout.matches("reached ledger.reserve.pre").count(), 2);
}

#[test]
fn setup_refuses_a_site_this_build_does_not_have() {
    let output = run_child(
        "sync",
        Some("ledger.reserve.pre=return;ledger.finalise.post=return"),
    );
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("setup refused") && stdout.contains("\"ledger.finalise.post\""),
        "{stdout}"
    );
    assert!(
        !stdout.contains("reached"),
        "nothing ran after the refusal: {stdout}"
    );

    let output = run_child("sync", Some("ledger.reserve.pre=explode"));
    let stdout = text(&output.stdout);
    assert!(
        stdout.contains("setup refused") && stdout.contains("explode"),
        "{stdout}"
    );
}
