//! The `sluice` console as people use it: the real binary against a real pipeline (SQLite ledger
//! in a temporary directory, the demo upstream), checking its tables, its `--json` and that
//! each exit code means what the console promises. And `sluice dev`: it prints an admin token
//! that works, and never writes it to its log.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_runtime::config::{Role, TokenConfig};

const BIN: &str = env!("CARGO_BIN_EXE_sluice");
const ADMIN: &str = "console-admin-token-0123456789";
const OPERATOR: &str = "console-operator-token-0123456789";
const AGENT: &str = "console-agent-token-0123456789";

/// Runs the console; returns (exit code, stdout, stderr).
async fn console(url: &str, token: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("SLUICE_URL", url)
        .env_remove("SLUICE_TOKEN");
    if let Some(token) = token {
        command.env("SLUICE_TOKEN", token);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the console runs")
        .expect("the binary starts");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn submit(url: &str, token: &str, body: Value) -> Value {
    let answer = reqwest::Client::new()
        .post(format!("{url}/v1/effects"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("the producer answers");
    assert!(answer.status().is_success(), "{}", answer.status());
    answer.json().await.expect("a command")
}

async fn wait_status(url: &str, run: &str, key: &str, status: &str) {
    wait_status_within(url, run, key, status, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_speaks_the_api_with_tables_json_and_meaningful_exit_codes() {
    let upstream = sluice_upstream::Upstream::start(
        "127.0.0.1:0".parse().expect("an address"),
        sluice_upstream::Faults::none(),
        7,
    )
    .await
    .expect("the upstream starts");
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = sluice_runtime::Config::default();
    config.ledger.data_dir = data.path().to_owned();
    config.producer.listen = "127.0.0.1:0".parse().expect("an address");
    config.reconciler.sweep_interval_ms = 100;
    for (name, role, token) in [
        ("admin-1", Role::Admin, ADMIN),
        ("operator-1", Role::Operator, OPERATOR),
        ("agent-1", Role::Agent, AGENT),
    ] {
        config.auth.tokens.push(TokenConfig {
            name: name.into(),
            role,
            token: Some(token.into()),
            token_sha256: None,
            tenants: Vec::new(),
        });
    }
    config.validate().expect("valid");
    let catalog = sluice_assemble::example_catalog_at(&upstream.base_url()).expect("catalog");
    let pipeline = sluice_embedded::dev::start(&config, catalog, sluice_runtime::Shutdown::new())
        .await
        .expect("the pipeline starts");
    let url = pipeline.url();
    let run = "r-console";

    let (code, out, _) = console(&url, Some(ADMIN), &["whoami"]).await;
    assert_eq!((code, out.trim()), (0, "admin-1 (admin)"));
    let (code, _, err) = console(&url, None, &["runs"]).await;
    assert_eq!(code, 5, "no token: {err}");
    assert!(err.contains("401"), "{err}");

    submit(
        &url,
        AGENT,
        json!({"run_id": run, "decision": 1, "tool": "email/send", "call_idx": 0,
        "args": {"to": "ops@example.com", "subject": "hi", "body": "b"}}),
    )
    .await;
    submit(&url, AGENT, json!({"run_id": run, "decision": 2, "tool": "payments/wire", "call_idx": 0,
        "args": {"account": "acc-c", "amount_minor": 2_000_000, "beneficiary": "b", "date": "2026-11-22"}})).await;
    wait_status(&url, run, "d-1/email/send/0", "CONFIRMED").await;
    wait_status(&url, run, "d-2/payments/wire/0", "BLOCKED").await;

    let (code, out, _) = console(&url, Some(OPERATOR), &["effects", run]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("d-1/email/send/0") && out.contains("CONFIRMED") && out.contains("BLOCKED"),
        "{out}"
    );
    assert!(out.contains("2 effect(s)"), "{out}");
    let (code, out, _) = console(
        &url,
        Some(OPERATOR),
        &["--json", "effects", "--status", "BLOCKED"],
    )
    .await;
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(listed["effects"].as_array().map(Vec::len), Some(1), "{out}");
    let (code, out, _) = console(&url, Some(OPERATOR), &["runs", "--since", "1h"]).await;
    assert_eq!(code, 0);
    assert!(out.contains(run), "{out}");

    let (code, _, err) = console(&url, Some(OPERATOR), &["show", run, "d-9/email/send/0"]).await;
    assert_eq!(code, 3, "not found: {err}");
    let (code, _, err) = console(
        &url,
        Some(OPERATOR),
        &["approve", run, "d-2/payments/wire/0", "--reason", "ok"],
    )
    .await;
    assert_eq!(code, 5, "an operator may not approve: {err}");
    let (code, _, err) = console(
        &url,
        Some(ADMIN),
        &["cancel", run, "d-1/email/send/0", "--reason", "x"],
    )
    .await;
    assert_eq!(code, 4, "a CONFIRMED command is not cancelled: {err}");
    assert!(err.contains("CONFIRMED"), "{err}");
    let (code, out, _) = console(
        &url,
        Some(ADMIN),
        &[
            "replay",
            run,
            "d-1/email/send/0",
            "--reason",
            "x",
            "--dry-run",
        ],
    )
    .await;
    let _ = out;
    assert_eq!(code, 4, "a dry run that would be refused exits 4");
    let (code, _, err) = console(&url, Some(OPERATOR), &["effects", "--status", "DONE"]).await;
    assert_eq!(code, 2, "invalid input: {err}");
    let (code, _, _) = console(&url, Some(ADMIN), &["approve", run, "d-2/payments/wire/0"]).await;
    assert_eq!(code, 2, "a missing --reason is a usage error");

    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &[
            "approve",
            run,
            "d-2/payments/wire/0",
            "--reason",
            "finance said yes",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("BLOCKED -> APPROVED"), "{out}");
    wait_status(&url, run, "d-2/payments/wire/0", "CONFIRMED").await;

    let (code, out, _) = console(&url, Some(OPERATOR), &["audit", "show", run]).await;
    assert_eq!(code, 0);
    assert!(
        out.contains("finance said yes") && out.contains("admin-1"),
        "{out}"
    );
    let (code, out, _) = console(&url, Some(OPERATOR), &["audit", "verify", run]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("verifies"), "{out}");

    // Tampering with the file is caught, and the exit code says so.
    let db = rusqlite::Connection::open(data.path().join("ledger.db")).expect("the ledger opens");
    db.busy_timeout(Duration::from_secs(5))
        .expect("busy timeout");
    let changed = db
        .execute(
            "UPDATE audit SET record = replace(record, 'finance said yes', 'finance said no') \
             WHERE run_seq = (SELECT run_seq FROM runs WHERE run_id = ?1) \
             AND record LIKE '%finance said yes%'",
            [run],
        )
        .expect("update");
    assert_eq!(changed, 1);
    let (code, _, err) = console(&url, Some(OPERATOR), &["audit", "verify", run]).await;
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("BROKEN at seq"), "{err}");

    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &["purge", "--older-than", "30d", "--reason", "retention"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("purged 0 run(s)"), "{out}");
    let (code, _, _) = console("http://127.0.0.1:1", Some(ADMIN), &["runs"]).await;
    assert_eq!(code, 1, "an unreachable server");

    pipeline.stop().await.expect("stops");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_dev_prints_an_admin_token_that_works_and_never_logs_it() {
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut child = Command::new(BIN)
        .arg("dev")
        .env("SLUICE_PRODUCER__LISTEN", "127.0.0.1:0")
        .env("SLUICE_LEDGER__DATA_DIR", data.path())
        .env_remove("SLUICE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sluice dev starts");
    let stdout = child.stdout.take().expect("piped");
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|line| line.contains("SLUICE_TOKEN="))
    })
    .await
    .expect("read")
    .expect("sluice dev prints the token");
    let url = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("SLUICE_URL="))
        .expect("the URL")
        .to_owned();
    let token = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("SLUICE_TOKEN="))
        .expect("the token")
        .to_owned();
    assert!(token.len() >= 32, "{token}");
    let (code, out, err) = console(&url, Some(&token), &["whoami"]).await;
    assert_eq!((code, out.trim()), (0, "dev-admin (admin)"), "{err}");
    let (code, _, _) = console(&url, Some("sluice-guess-0000000000000000"), &["whoami"]).await;
    assert_eq!(code, 5);

    child.kill().expect("stop the child we started");
    let mut log = String::new();
    child
        .stderr
        .take()
        .expect("piped")
        .read_to_string(&mut log)
        .expect("the log");
    let _ = child.wait();
    assert!(
        log.contains("sluice dev is running"),
        "the log was captured: {log}"
    );
    assert!(
        !log.contains(&token),
        "the token leaked into the log: {log}"
    );
}

/// A pipeline on a fresh SQLite ledger with the demo upstream, and the console's three tokens.
struct Pipeline {
    url: String,
    data: tempfile::TempDir,
    pipeline: sluice_embedded::dev::Pipeline,
    upstream: sluice_upstream::Upstream,
}

impl Pipeline {
    async fn start() -> Self {
        Self::start_with_catalog("").await
    }

    /// With `extra` TOML (such as `[budgets.<name>]`) after the example catalog.
    async fn start_with_catalog(extra: &str) -> Self {
        let upstream = sluice_upstream::Upstream::start(
            "127.0.0.1:0".parse().expect("an address"),
            sluice_upstream::Faults::none(),
            7,
        )
        .await
        .expect("the upstream starts");
        let data = tempfile::tempdir().expect("a temporary directory");
        let mut config = sluice_runtime::Config::default();
        config.ledger.data_dir = data.path().to_owned();
        config.producer.listen = "127.0.0.1:0".parse().expect("an address");
        config.reconciler.sweep_interval_ms = 100;
        for (name, role, token) in [
            ("admin-1", Role::Admin, ADMIN),
            ("operator-1", Role::Operator, OPERATOR),
            ("agent-1", Role::Agent, AGENT),
        ] {
            config.auth.tokens.push(TokenConfig {
                name: name.into(),
                role,
                token: Some(token.into()),
                token_sha256: None,
                tenants: Vec::new(),
            });
        }
        config.validate().expect("valid");
        let text = sluice_assemble::EXAMPLE_CATALOG.replace(
            sluice_assemble::EXAMPLE_UPSTREAM,
            upstream.base_url().trim_end_matches('/'),
        );
        let catalog = sluice_core::catalog::Catalog::from_toml_str(
            &format!("{text}\n{extra}"),
            "deploy/catalog.toml (with the test's additions)",
        )
        .expect("catalog");
        let pipeline =
            sluice_embedded::dev::start(&config, catalog, sluice_runtime::Shutdown::new())
                .await
                .expect("the pipeline starts");
        Self {
            url: pipeline.url(),
            data,
            pipeline,
            upstream,
        }
    }

    async fn stop(self) {
        self.pipeline.stop().await.expect("stops");
        self.upstream.shutdown().await;
        drop(self.data);
    }
}

async fn email(url: &str, run: &str, decision: u32) {
    submit(
        url,
        AGENT,
        json!({"run_id": run, "decision": decision, "tool": "email/send", "call_idx": 0,
        "args": {"to": "ops@example.com", "subject": "hi", "body": "b"}}),
    )
    .await;
    wait_status(url, run, &format!("d-{decision}/email/send/0"), "CONFIRMED").await;
}

/// How many records a run's audit chain holds.
async fn audit_records(url: &str, run: &str) -> usize {
    let (code, out, err) = console(url, Some(OPERATOR), &["--json", "audit", "show", run]).await;
    assert_eq!(code, 0, "{err}");
    let trail: Value = serde_json::from_str(&out).expect("--json prints JSON");
    trail["entries"].as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_run_is_not_found_rather_than_an_empty_table() {
    let p = Pipeline::start().await;
    let url = p.url.clone();
    email(&url, "r-known", 1).await;

    for args in [
        &["effects", "r-nope"][..],
        &["--json", "effects", "r-nope"],
        &["effects", "r-nope", "--status", "CONFIRMED"],
        &["scheduled", "r-nope"],
    ] {
        let (code, out, err) = console(&url, Some(OPERATOR), args).await;
        assert_eq!(code, 3, "{args:?} exits 3 (not found): {out}{err}");
        assert!(
            err.contains("r-nope") && err.contains("not found"),
            "{args:?}: {err}"
        );
        assert!(out.is_empty(), "no empty table: {out}");
    }
    // A run that exists with nothing matching is an empty answer, not a missing run.
    let (code, out, err) = console(
        &url,
        Some(OPERATOR),
        &["effects", "r-known", "--status", "FAILED"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0 effect(s)"), "{out}");
    let (code, out, err) = console(&url, Some(OPERATOR), &["scheduled", "r-known"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("0 effect(s)"), "{out}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_dry_run_lists_what_it_would_remove_and_a_purge_what_it_removed() {
    let p = Pipeline::start().await;
    let url = p.url.clone();
    email(&url, "r-old-1", 1).await;
    email(&url, "r-old-2", 1).await;
    let before = audit_records(&url, "r-old-1").await;
    tokio::time::sleep(Duration::from_millis(20)).await;

    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &[
            "purge",
            "--older-than",
            "0s",
            "--reason",
            "retention",
            "--dry-run",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("dry run"), "{out}");
    assert!(out.contains("would purge 2 run(s)"), "{out}");
    assert!(out.contains("r-old-1") && out.contains("r-old-2"), "{out}");
    // Nothing was removed, and nothing was written: not even the purge's own record.
    let (code, out, err) = console(&url, Some(OPERATOR), &["effects", "r-old-1"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 effect(s)"), "{out}");
    assert_eq!(audit_records(&url, "r-old-1").await, before);
    let (code, out, _) = console(
        &url,
        Some(OPERATOR),
        &["--json", "audit", "show", "sluice.system"],
    )
    .await;
    assert!(
        code == 3 || !out.contains("purge"),
        "a dry run records nothing: {out}"
    );

    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &["purge", "--older-than", "0s", "--reason", "retention"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("purged 2 run(s)"), "{out}");
    assert!(out.contains("r-old-1") && out.contains("r-old-2"), "{out}");

    // The purged run: its effects are gone (and the console says why), its checkpoint stays
    // and `audit verify` shows it without --json.
    let (code, _, err) = console(&url, Some(OPERATOR), &["effects", "r-old-1"]).await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("purged"), "{err}");
    let (code, out, err) = console(&url, Some(OPERATOR), &["audit", "verify", "r-old-1"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("verifies"), "{out}");
    assert!(
        out.contains("checkpoint") && out.contains(&format!("{before} record(s) purged")),
        "the kept checkpoint is shown: {out}"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_rollback_says_the_run_is_already_rolled_back_and_writes_nothing() {
    let p = Pipeline::start().await;
    let url = p.url.clone();
    let run = "r-twice";
    email(&url, run, 1).await;
    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &["rollback", run, "--reason", "customer cancelled"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("d-1/email/send/0"), "{out}");
    // Wait until the rollback has finished, so that the chain no longer moves on its own.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, out, _) = console(&url, Some(OPERATOR), &["--json", "rollback", run]).await;
        let progress: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        if progress["progress"]["done"] == json!(true) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rollback never finished: {out}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = audit_records(&url, run).await;

    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &["rollback", run, "--reason", "clicked twice"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("already rolled back"), "{out}");
    assert!(
        out.contains("customer cancelled"),
        "names the first rollback: {out}"
    );
    assert_eq!(
        audit_records(&url, run).await,
        before,
        "a second rollback writes no record"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_error_prints_its_causes_and_never_a_backtrace() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[producer]\nlisten = \"not an address\"\n").expect("write");
    let output = Command::new(BIN)
        .args(["dev", "--config"])
        .arg(&config)
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .env("SLUICE_LEDGER__DATA_DIR", dir.path())
        .output()
        .expect("the binary starts");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: invalid configuration"), "{err}");
    assert!(err.contains("listen"), "names what was wrong: {err}");
    assert!(
        !err.to_lowercase().contains("backtrace") && !err.contains("at ./"),
        "no backtrace: {err}"
    );
    assert!(err.lines().count() <= 3, "{err}");
}

/// An operator's pause through the CLI (issue 30): the paused tool's calls wait PENDING,
/// spending no attempt and reaching no upstream, while another tool's calls go; `flow list`
/// shows who paused it and why; a resume lets them go, each booked once. An operator cannot
/// pause (an admin's action), an unknown name is not found, and pausing twice writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tool_waits_without_spending_attempts_until_it_is_resumed() {
    let p = Pipeline::start().await;
    let url = p.url.clone();
    let run = "r-paused";

    let (code, _, err) = console(
        &url,
        Some(OPERATOR),
        &["flow", "pause", "payments/wire", "--reason", "x"],
    )
    .await;
    assert_eq!(code, 5, "an operator may not pause: {err}");
    let (code, _, err) = console(
        &url,
        Some(ADMIN),
        &["flow", "pause", "bank/nope", "--reason", "x"],
    )
    .await;
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("bank/nope"), "{err}");
    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &[
            "flow",
            "pause",
            "payments/wire",
            "--reason",
            "the bank's maintenance window",
        ],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("payments/wire: paused (paused by admin-1"),
        "{out}"
    );
    let (code, out, _) = console(
        &url,
        Some(ADMIN),
        &["flow", "pause", "payments/wire", "--reason", "again"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("already_paused") && out.contains("maintenance window"),
        "{out}"
    );
    let (code, out, err) = console(&url, Some(OPERATOR), &["flow", "list"]).await;
    assert_eq!(code, 0, "{err}");
    let row = out
        .lines()
        .find(|l| l.contains("payments/wire"))
        .unwrap_or_default();
    assert!(
        row.contains("admin-1: the bank's maintenance window"),
        "{out}"
    );

    // Within a second every dispatcher holds the wires; the email goes.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    for n in 0..3 {
        submit(&url, AGENT, json!({"run_id": run, "decision": 1, "tool": "payments/wire", "call_idx": n,
            "args": {"account": format!("acc-p{n}"), "amount_minor": 2_000, "beneficiary": "b", "date": "2026-11-27"}})).await;
    }
    email(&url, run, 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in 0..3 {
        let (code, out, _) = console(
            &url,
            Some(OPERATOR),
            &["--json", "show", run, &format!("d-1/payments/wire/{n}")],
        )
        .await;
        assert_eq!(code, 0);
        let wire: Value = serde_json::from_str(&out).expect("json");
        assert_eq!(wire["status"], json!("PENDING"), "{wire}");
        assert_eq!(wire["attempts"], json!(0), "{wire}");
        assert!(
            !wire["due_at"].is_null(),
            "held until a time the sweep brings it back: {wire}"
        );
    }
    assert_eq!(
        p.upstream.stats().wires,
        0,
        "nothing reached the bank while paused"
    );

    let (code, out, err) = console(
        &url,
        Some(ADMIN),
        &["flow", "resume", "payments/wire", "--reason", "window over"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("payments/wire: resumed"), "{out}");
    for n in 0..3 {
        wait_status_within(
            &url,
            run,
            &format!("d-1/payments/wire/{n}"),
            "CONFIRMED",
            Duration::from_secs(30),
        )
        .await;
    }
    assert_eq!(p.upstream.stats().wires, 3, "each wire booked once");
    let (_, out, _) = console(
        &url,
        Some(ADMIN),
        &["flow", "resume", "payments/wire", "--reason", "again"],
    )
    .await;
    assert!(out.contains("not_paused"), "{out}");
    let (code, out, _) = console(
        &url,
        Some(OPERATOR),
        &["--json", "audit", "show", "sluice.system"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(
        out.contains("payments/wire paused") && out.contains("payments/wire resumed"),
        "{out}"
    );
    p.stop().await;
}

/// `sluice budgets`: each budget's counters as a table (an operator's), its JSON with
/// `--json`, another window with `--at`, and an agent refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_shows_what_each_counter_holds() {
    let p = Pipeline::start_with_catalog(
        "[budgets.daily_wires]\ntools = [\"payments/wire\"]\nscope = \"tenant\"\n\
         window = \"day\"\nlimits = { EUR = 3000000 }\non_exceed = \"deny\"\n",
    )
    .await;
    let url = p.url.clone();
    let (code, out, err) = console(&url, Some(OPERATOR), &["budgets"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("budget daily_wires: per tenant, day window"),
        "{out}"
    );
    assert!(out.contains("nothing held in this window"), "{out}");
    submit(
        &url,
        AGENT,
        json!({"run_id": "r-budget-cli", "decision": 1, "tool": "payments/wire", "call_idx": 0,
               "args": {"account": "acc-1", "amount_minor": 125000, "beneficiary": "b-1",
                        "date": "2026-11-22"}}),
    )
    .await;
    let (code, out, err) = console(&url, Some(OPERATOR), &["budgets"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let row = out
        .lines()
        .find(|line| line.contains("agent-1"))
        .unwrap_or_else(|| panic!("a row for the agent's tenant: {out}"));
    for cell in ["EUR", "125000", "3000000", "2875000"] {
        assert!(row.contains(cell), "{cell} in {row}");
    }
    let (code, out, _) = console(&url, Some(OPERATOR), &["budgets", "--json"]).await;
    assert_eq!(code, 0);
    let body: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(body["budgets"][0]["counters"][0]["used"], json!(125000));
    let (code, out, _) = console(
        &url,
        Some(OPERATOR),
        &["budgets", "--at", "2020-01-01T10:00:00+00:00"],
    )
    .await;
    assert_eq!(code, 0);
    assert!(out.contains("2020-01-01T00:00:00"), "{out}");
    assert!(out.contains("nothing held in this window"), "{out}");
    let (code, _, err) = console(&url, Some(AGENT), &["budgets"]).await;
    assert_ne!(code, 0, "an agent may not read budgets");
    assert!(err.contains("forbidden") || err.contains("role"), "{err}");
    p.stop().await;
}

async fn wait_status_within(url: &str, run: &str, key: &str, status: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (code, out, _) = console(url, Some(OPERATOR), &["--json", "show", run, key]).await;
        let body: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        if code == 0 && body["status"] == json!(status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{run}/{key} never became {status}: {out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
