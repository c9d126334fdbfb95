//! The examples (`examples/email`, `rest`, `aws`, `stripe`) end to end against the real API
//! emulators nobody here wrote — Mailpit, json-server, moto and localstripe — as
//! `scripts/emulators/start.sh` starts them (`scripts/test.sh` does, and exports their
//! addresses as `SLUICE_EMU_*_URL`). Each test loads the example's own `catalog.toml`, points it
//! at a fault-injecting proxy in front of the emulator ([`Proxy`]), shortens its horizons so the
//! test is quick, runs the pipeline in this process, and then:
//!
//! * loses a call before it arrives and the answer of a call that committed (503), and checks
//!   against the emulator's own state — never the ledger — that there is exactly one mail,
//!   record, message or charge, or that the command is visibly STUCK;
//! * rolls the run back and checks that exactly those were undone, and nothing else: a mail,
//!   record, object or charge Sluice never made, and another run's, is still there.
//!
//! A missing emulator address fails the test with how to start them;
//! `SLUICE_SKIP_EMULATORS=1` skips them instead (the dry run of the real-Stripe catalog needs
//! no emulator and always runs). The Stripe adapter runs under `SLUICE_EXAMPLES_PYTHON`, a
//! Python with Sluice's SDK and uvicorn (`scripts/test.sh` makes one).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use axum::http::Method;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_connector::preview;
use sluice_core::catalog::Catalog;
use sluice_core::command::CommandStatus::{self, *};
use sluice_core::command::{Command, Intent};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_tests::proxy::{Fault, Proxy, Seen};
use sluice_tests::*;

/// How long an ambiguous command may take to settle here: the shortened landing horizon, two
/// lookups a settle interval apart and the redispatch, with room for a slow machine.
const SETTLE: Duration = Duration::from_secs(60);

// ----------------------------------------------------------------------------- harness ----

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

fn skipped(what: &str) -> bool {
    if std::env::var("SLUICE_SKIP_EMULATORS").is_ok_and(|v| v == "1") {
        // Past libtest's capture, so the line shows in the test run's output.
        let _ = writeln!(
            std::io::stderr(),
            "SLUICE_SKIP_EMULATORS=1: the {what} example's test against its emulator is skipped"
        );
        return true;
    }
    false
}

/// An environment variable the emulators' start script exports.
fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: start the emulators with `eval \"$(scripts/emulators/start.sh)\"` \
             (scripts/test.sh does), or set SLUICE_SKIP_EMULATORS=1 to skip these tests"
        )
    })
}

/// A suffix of this test run's own, so runs and keys never meet those of an earlier run
/// against the same emulator.
fn tag() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

/// Where an example's catalog names its emulator's base URL.
enum Base<'a> {
    /// `[variables]` entries (which the environment would override).
    Variables(&'a [&'a str]),
    /// A URL written out in full (a catalog a `ToolApp` printed).
    Literal(&'a str),
}

/// An example's `catalog.toml` with its emulator's base URL replaced by `to` (the proxy's),
/// edited on the parsed document and validated as the services would.
fn example_catalog(
    name: &str,
    base: Base<'_>,
    to: &str,
    edit: impl FnOnce(&mut toml::Table),
) -> Catalog {
    let path = examples().join(name).join("catalog.toml");
    let mut text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} is readable: {e}", path.display()));
    if let Base::Literal(from) = base {
        assert!(text.contains(from), "{} names {from}", path.display());
        text = text.replace(from, to);
    }
    let mut table: toml::Table = toml::from_str(&text).expect("valid TOML");
    if let Base::Variables(names) = base {
        let variables = table
            .get_mut("variables")
            .and_then(toml::Value::as_table_mut)
            .unwrap_or_else(|| panic!("{} has [variables]", path.display()));
        for variable in names {
            assert!(
                variables.contains_key(*variable),
                "{} names variable {variable}",
                path.display()
            );
            variables.insert((*variable).to_owned(), toml::Value::String(to.to_owned()));
        }
    }
    table.insert("max_clock_skew_ms".into(), toml::Value::Integer(100));
    edit(&mut table);
    let text = toml::to_string(&table).expect("a TOML table serializes");
    Catalog::from_toml_str(&text, &format!("examples/{name}/catalog.toml (at {to})"))
        .unwrap_or_else(|e| panic!("examples/{name}/catalog.toml is valid: {e}"))
}

/// The `[[tool]]` table named `tool`.
fn tool_table<'t>(table: &'t mut toml::Table, tool: &str) -> &'t mut toml::Table {
    table
        .get_mut("tool")
        .and_then(toml::Value::as_array_mut)
        .expect("[[tool]] entries")
        .iter_mut()
        .filter_map(toml::Value::as_table_mut)
        .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(tool))
        .unwrap_or_else(|| panic!("no tool {tool}"))
}

/// Sets `[tool.<section>] key = value` of `tool`.
fn set(
    table: &mut toml::Table,
    tool: &str,
    section: &str,
    key: &str,
    value: impl Into<toml::Value>,
) {
    tool_table(table, tool)
        .entry(section.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .expect("a section is a table")
        .insert(key.to_owned(), value.into());
}

/// The horizons of `tool`, short: a 3 s call, 0.4 s for a late commit, 0.5 s between two
/// absences, 1 s to the last look, at most `max_checks` inconclusive lookups before STUCK.
fn quick(table: &mut toml::Table, tool: &str, max_checks: i64) {
    for (key, value) in [
        ("timeout_ms", 3_000),
        ("late_commit_ms", 400),
        ("settle_ms", 500),
        ("verify_after_ms", 1_000),
        ("max_checks", max_checks),
    ] {
        set(table, tool, "policy", key, value);
    }
}

/// Replaces a credential's secret references with files in `dir` holding `secrets` (a test
/// cannot set environment variables: the workspace forbids `unsafe`).
fn secrets_in_files(
    table: &mut toml::Table,
    credential: &str,
    secrets: &[(&str, &str)],
    dir: &Path,
) {
    let entry = table
        .get_mut("credentials")
        .and_then(toml::Value::as_table_mut)
        .and_then(|c| c.get_mut(credential))
        .and_then(toml::Value::as_table_mut)
        .unwrap_or_else(|| panic!("no credential {credential}"));
    for (key, value) in secrets {
        assert!(
            entry.contains_key(*key),
            "credential {credential} has no {key}"
        );
        let file = dir.join(format!("{credential}-{key}"));
        std::fs::write(&file, value).expect("a secret file");
        let mut reference = toml::Table::new();
        reference.insert("file".into(), file.display().to_string().into());
        entry.insert((*key).to_owned(), toml::Value::Table(reference));
    }
}

/// The pipeline in this process on a fresh ledger, with tokens; an admin speaks to it.
struct Sluice {
    pipeline: sluice_embedded::dev::Pipeline,
    admin: Agent,
    _data: tempfile::TempDir,
}

impl Sluice {
    async fn start(catalog: Catalog) -> Self {
        init_tracing();
        let data = tempfile::tempdir().expect("a temporary directory");
        let mut config = test_config(data.path());
        tokens::install(&mut config);
        let pipeline = start_pipeline(&config, catalog).await;
        let admin = Agent::new(&pipeline.url()).with_token(tokens::ADMIN);
        Self {
            pipeline,
            admin,
            _data: data,
        }
    }

    /// Submits one effect and waits until it settles (terminal, STUCK or BLOCKED).
    async fn run(&self, run: &str, decision: u32, tool: &str, args: Value) -> Command {
        self.admin
            .submit_created(&effect(run, decision, tool, 0, args))
            .await;
        self.admin
            .wait_settled_within(run, &key(decision, tool), SETTLE)
            .await
    }

    /// Rolls `run` back and waits until each of `keys` has reached `status`.
    async fn roll_back(&self, run: &str, keys: &[(String, CommandStatus)]) -> Vec<Command> {
        let accepted = self.admin.rollback(run, "the example's rollback").await;
        assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);
        let mut settled = Vec::new();
        for (key, status) in keys {
            let deadline = tokio::time::Instant::now() + SETTLE;
            loop {
                let command = self.admin.get(run, key).await;
                if command.status() == *status {
                    settled.push(command);
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{run}/{key} never became {status}: it is {}: {command:?}",
                    command.status()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        settled
    }

    async fn audit(&self, run: &str) -> Trail {
        verified_audit(self.pipeline.ctx.ledger.as_ref(), run).await
    }

    async fn stop(self) {
        self.pipeline
            .stop()
            .await
            .expect("every service stops cleanly");
    }
}

/// The command key of call 0 of `tool` at `decision`.
fn key(decision: u32, tool: &str) -> String {
    format!("d-{decision}/{tool}/0")
}

/// The idempotency key Sluice gives call 0 of `tool` at `decision` of `run`.
fn idem(run: &str, decision: u32, tool: &str) -> String {
    format!("{run}/{}", key(decision, tool))
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .expect("an HTTP client")
}

/// What reached the proxy for one effect: the requests of `method` on `path_prefix` whose path
/// or body holds `needle` (its key, its reference).
fn seen_for(proxy: &Proxy, method: &Method, path_prefix: &str, needle: &str) -> Vec<Seen> {
    proxy
        .seen()
        .into_iter()
        .filter(|s| s.method == *method && s.path.starts_with(path_prefix))
        .filter(|s| {
            s.path.contains(needle)
                || s.path.contains(&needle.replace('/', "%2F"))
                || String::from_utf8_lossy(&s.body).contains(needle)
        })
        .collect()
}

/// The faults the requests used up, in order; a dropped one was never forwarded, any other was.
fn faults(seen: &[Seen]) -> Vec<Option<Fault>> {
    for request in seen {
        assert_eq!(
            request.forwarded,
            request.fault != Some(Fault::DropBeforeArrival),
            "{request:#?}"
        );
    }
    seen.iter().map(|s| s.fault).collect()
}

// ------------------------------------------------------------------------------ email ----

/// Mailpit's own record, read with its API as a person would.
struct Mailpit {
    url: String,
    user: String,
    password: String,
    http: reqwest::Client,
}

impl Mailpit {
    fn from_env() -> Self {
        Self {
            url: env("SLUICE_EMU_MAILPIT_URL"),
            user: env("SLUICE_EMU_MAILPIT_USER"),
            password: env("SLUICE_EMU_MAILPIT_PASSWORD"),
            http: http(),
        }
    }

    async fn call(&self, request: reqwest::RequestBuilder) -> (StatusCode, String) {
        let response = request
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .expect("Mailpit answers");
        let status = response.status();
        (status, response.text().await.expect("a body"))
    }

    /// Sends a mail directly, not through Sluice; its Mailpit ID.
    async fn send_directly(&self, message_id: &str) -> String {
        let (status, text) = self
            .call(
                self.http
                    .post(format!("{}/api/v1/send", self.url))
                    .json(&json!({
                        "From": {"Email": "someone@example.com"},
                        "To": [{"Email": "ops@example.com"}],
                        "Subject": "not sent by Sluice",
                        "Text": "a bystander",
                        "Headers": {"Message-ID": format!("<{message_id}>")},
                    })),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let body: Value = serde_json::from_str(&text).expect("JSON");
        body["ID"].as_str().expect("an ID").to_owned()
    }

    /// The IDs of the messages whose Message-ID is exactly `message_id`.
    async fn with_message_id(&self, message_id: &str) -> Vec<String> {
        let (status, text) = self
            .call(
                self.http.get(
                    reqwest::Url::parse_with_params(
                        &format!("{}/api/v1/search", self.url),
                        &[
                            ("query", format!("message-id:{message_id}")),
                            ("limit", "1000".into()),
                        ],
                    )
                    .expect("a URL"),
                ),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let body: Value = serde_json::from_str(&text).expect("JSON");
        body["messages"]
            .as_array()
            .expect("messages")
            .iter()
            .filter(|m| m["MessageID"] == json!(message_id))
            .map(|m| m["ID"].as_str().expect("an ID").to_owned())
            .collect()
    }

    /// Whether the message with this Mailpit ID is still in the mailbox.
    async fn holds(&self, id: &str) -> bool {
        let (status, text) = self
            .call(self.http.get(format!("{}/api/v1/message/{id}", self.url)))
            .await;
        match status {
            StatusCode::OK => true,
            StatusCode::NOT_FOUND => false,
            other => panic!("GET message {id}: {other} {text}"),
        }
    }
}

/// The Message-ID examples/email gives the mail of `key`.
fn message_id(key: &str) -> String {
    format!("sluice.{key}@sluice.test")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_through_mailpit_is_sent_once_found_by_its_message_id_and_deleted_alone() {
    if skipped("email") {
        return;
    }
    let mailpit = Mailpit::from_env();
    let proxy = Proxy::start(&mailpit.url).await.expect("the proxy starts");
    let catalog = example_catalog(
        "email",
        Base::Variables(&["mailpit"]),
        &proxy.base_url(),
        |t| {
            quick(t, "email/send", 2);
        },
    );
    let sluice = Sluice::start(catalog).await;
    let tag = tag();
    let (run, other) = (format!("r-mail-{tag}"), format!("r-mail-other-{tag}"));
    let tool = "email/send";
    let mail =
        |subject: &str| json!({"to": "ops@example.com", "subject": subject, "text": "hello"});
    // A mail Sluice never sent, whose Message-ID holds that of Sluice's second mail: Mailpit's
    // message-id: search is a substring match and finds it, so only match_where's exact
    // comparison keeps it from passing for that mail (sent, and deleted on rollback).
    let bystander = mailpit
        .send_directly(&format!("fwd.{}", message_id(&idem(&run, 2, tool))))
        .await;

    // 1. The mail is stored, its answer is lost (503) and every lookup answers 503, which the
    //    catalog does not declare: inconclusive, never absent. STUCK after max_checks, for a
    //    person; never sent again.
    proxy.arm(Method::POST, "/api/v1/send", Fault::CommitThen503);
    for _ in 0..20 {
        proxy.arm(Method::GET, "/api/v1/search", Fault::CommitThen503);
    }
    let stuck = sluice.run(&run, 1, tool, mail("lookups fail")).await;
    proxy.disarm();
    assert_eq!(stuck.status(), Stuck, "{stuck:?}");
    assert_eq!(stuck.state.attempts, 1, "never resent without evidence");
    let one = mailpit
        .with_message_id(&message_id(&idem(&run, 1, tool)))
        .await;
    assert_eq!(one.len(), 1, "exactly one mail, not resent: {one:?}");

    // 2. Dropped before it reached Mailpit: the search finds nothing twice, past the landing
    //    horizon, so it is sent again under the same Message-ID. One mail.
    proxy.arm(Method::POST, "/api/v1/send", Fault::DropBeforeArrival);
    let dropped = sluice.run(&run, 2, tool, mail("dropped")).await;
    assert_eq!(dropped.status(), Confirmed, "{dropped:?}");
    assert_eq!(dropped.state.attempts, 2, "{dropped:?}");
    let two = mailpit
        .with_message_id(&message_id(&idem(&run, 2, tool)))
        .await;
    assert_eq!(two.len(), 1, "exactly one mail: {two:?}");
    assert_eq!(dropped.state.external_ref.as_ref(), Some(&two[0]));
    let sends = seen_for(&proxy, &Method::POST, "/api/v1/send", &idem(&run, 2, tool));
    assert_eq!(faults(&sends), [Some(Fault::DropBeforeArrival), None]);

    // 3. Stored, and the answer lost (503): the search finds it, with its ID. Sent once.
    proxy.arm(Method::POST, "/api/v1/send", Fault::CommitThen503);
    let lost = sluice.run(&run, 3, tool, mail("answer lost")).await;
    assert_eq!(lost.status(), Confirmed, "{lost:?}");
    assert_eq!(lost.state.attempts, 1, "{lost:?}");
    let three = mailpit
        .with_message_id(&message_id(&idem(&run, 3, tool)))
        .await;
    assert_eq!(three.len(), 1, "exactly one mail: {three:?}");
    assert_eq!(lost.state.external_ref.as_ref(), Some(&three[0]));
    let sends = seen_for(&proxy, &Method::POST, "/api/v1/send", &idem(&run, 3, tool));
    assert_eq!(faults(&sends), [Some(Fault::CommitThen503)]);

    // Another run's mail, which the rollback must not touch.
    let kept = sluice.run(&other, 1, tool, mail("another run")).await;
    assert_eq!(kept.status(), Confirmed, "{kept:?}");
    let kept_id = kept.state.external_ref.clone().expect("a reference");

    // A person finds the STUCK mail in Mailpit and resolves the command with that evidence.
    let resolved = sluice
        .admin
        .act(
            &run,
            &key(1, tool),
            "resolve",
            &json!({"outcome": "CONFIRMED", "external_ref": one[0],
                    "evidence": {"mailpit_id": one[0], "message_id": message_id(&idem(&run, 1, tool))},
                    "reason": "the mail is in Mailpit"}),
        )
        .await;
    assert_eq!(resolved.status, StatusCode::OK, "{}", resolved.text);

    // Roll back: each of the three mails is deleted by its own ID, last first; nothing else.
    let undone = sluice
        .roll_back(
            &run,
            &[
                (key(3, tool), Compensated),
                (key(2, tool), Compensated),
                (key(1, tool), Compensated),
            ],
        )
        .await;
    for (command, ids) in undone.iter().zip([&three, &two, &one]) {
        assert!(!mailpit.holds(&ids[0]).await, "{} was not deleted", ids[0]);
        assert!(!command.state.escalated, "{command:?}");
    }
    assert!(
        mailpit.holds(&bystander).await,
        "a mail Sluice never sent was deleted"
    );
    assert!(
        mailpit.holds(&kept_id).await,
        "another run's mail was deleted"
    );
    let deletes: Vec<Value> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.method == Method::DELETE)
        .map(|s| serde_json::from_slice(&s.body).expect("a JSON body"))
        .collect();
    assert_eq!(
        deletes,
        [
            json!({"IDs": [three[0]]}),
            json!({"IDs": [two[0]]}),
            json!({"IDs": [one[0]]})
        ],
        "each delete names exactly one message, last first"
    );
    sluice.audit(&run).await;
    sluice.stop().await;
}

// ------------------------------------------------------------------------------- rest ----

/// json-server's own record.
struct JsonServer {
    url: String,
    http: reqwest::Client,
}

impl JsonServer {
    async fn records(&self) -> Vec<Value> {
        let answer = self
            .http
            .get(format!("{}/records", self.url))
            .send()
            .await
            .expect("json-server answers");
        assert_eq!(answer.status(), StatusCode::OK);
        let body: Value = answer.json().await.expect("JSON");
        body.as_array().expect("an array").clone()
    }

    /// The records Sluice made under `key`.
    async fn with_key(&self, key: &str) -> Vec<Value> {
        self.records()
            .await
            .into_iter()
            .filter(|r| r["sluice_key"] == json!(key))
            .collect()
    }

    /// Deletes every record.
    async fn empty(&self) {
        for record in self.records().await {
            let answer = self
                .http
                .delete(format!("{}/records/{}", self.url, record["id"]))
                .send()
                .await
                .expect("json-server answers");
            assert_eq!(answer.status(), StatusCode::OK);
        }
    }

    async fn holds(&self, id: &Value) -> bool {
        self.records().await.iter().any(|r| r["id"] == *id)
    }

    async fn create_directly(&self, title: &str) -> Value {
        let answer = self
            .http
            .post(format!("{}/records", self.url))
            .json(&json!({"title": title, "amount_minor": 1}))
            .send()
            .await
            .expect("json-server answers");
        assert_eq!(answer.status(), StatusCode::CREATED);
        let body: Value = answer.json().await.expect("JSON");
        body["id"].clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_in_json_server_are_created_once_found_by_their_key_and_deleted_alone() {
    if skipped("rest") {
        return;
    }
    let server = JsonServer {
        url: env("SLUICE_EMU_JSON_SERVER_URL"),
        http: http(),
    };
    let proxy = Proxy::start(&server.url).await.expect("the proxy starts");
    let catalog = example_catalog(
        "rest",
        Base::Variables(&["records_api"]),
        &proxy.base_url(),
        |t| {
            quick(t, "records/create", 5);
        },
    );
    let sluice = Sluice::start(catalog).await;
    let tag = tag();
    let (run, other) = (format!("r-rest-{tag}"), format!("r-rest-other-{tag}"));
    let tool = "records/create";
    let record = |title: &str| json!({"title": title, "amount_minor": 1250});
    // json-server is this test's own: emptied, then a record Sluice never made, without a
    // sluice_key. While no record carries that field, json-server answers a lookup by it with
    // every record; only match_where keeps this one from passing for Sluice's first record.
    server.empty().await;
    let bystander = server.create_directly(&format!("bystander {tag}")).await;

    // 1. Dropped before it arrived: no record holds the key, twice, so it is created again.
    proxy.arm(Method::POST, "/records", Fault::DropBeforeArrival);
    let dropped = sluice.run(&run, 1, tool, record("dropped")).await;
    assert_eq!(dropped.status(), Confirmed, "{dropped:?}");
    assert_eq!(dropped.state.attempts, 2, "{dropped:?}");
    let one = server.with_key(&idem(&run, 1, tool)).await;
    assert_eq!(one.len(), 1, "exactly one record: {one:?}");
    assert_eq!(one[0]["amount_minor"], json!(1250), "numbers stay numbers");
    assert_eq!(
        dropped.state.external_ref.as_deref(),
        Some(one[0]["id"].to_string().as_str())
    );
    let posts = seen_for(&proxy, &Method::POST, "/records", &idem(&run, 1, tool));
    assert_eq!(faults(&posts), [Some(Fault::DropBeforeArrival), None]);

    // 2. Created, the answer lost (503): found by its sluice_key, with the server's id.
    proxy.arm(Method::POST, "/records", Fault::CommitThen503);
    let lost = sluice.run(&run, 2, tool, record("answer lost")).await;
    assert_eq!(lost.status(), Confirmed, "{lost:?}");
    assert_eq!(lost.state.attempts, 1, "{lost:?}");
    let two = server.with_key(&idem(&run, 2, tool)).await;
    assert_eq!(two.len(), 1, "exactly one record: {two:?}");
    assert_eq!(
        lost.state.external_ref.as_deref(),
        Some(two[0]["id"].to_string().as_str())
    );

    let kept = sluice.run(&other, 1, tool, record("another run")).await;
    assert_eq!(kept.status(), Confirmed, "{kept:?}");

    // Roll back. The first delete of record 2 runs but its answer is lost (503); the retried
    // delete finds nothing (404), which the catalog declares done.
    let id_two = two[0]["id"].to_string();
    proxy.arm(
        Method::DELETE,
        &format!("/records/{id_two}"),
        Fault::CommitThen503,
    );
    let undone = sluice
        .roll_back(
            &run,
            &[(key(2, tool), Compensated), (key(1, tool), Compensated)],
        )
        .await;
    assert!(undone.iter().all(|c| !c.state.escalated), "{undone:?}");
    assert!(
        !server.holds(&one[0]["id"]).await,
        "record 1 was not deleted"
    );
    assert!(
        !server.holds(&two[0]["id"]).await,
        "record 2 was not deleted"
    );
    assert!(
        server.holds(&bystander).await,
        "a record Sluice never made was deleted"
    );
    let kept_id: Value = serde_json::from_str(kept.state.external_ref.as_deref().expect("a ref"))
        .expect("a numeric id");
    assert!(
        server.holds(&kept_id).await,
        "another run's record was deleted"
    );
    let deletes: Vec<(String, Option<u16>)> = proxy
        .seen()
        .into_iter()
        .filter(|s| s.method == Method::DELETE)
        .map(|s| (s.path, s.upstream_status.map(|c| c.as_u16())))
        .collect();
    let id_one = one[0]["id"].to_string();
    assert_eq!(
        deletes,
        [
            (format!("/records/{id_two}"), Some(200)),
            (format!("/records/{id_two}"), Some(404)),
            (format!("/records/{id_one}"), Some(200)),
        ]
    );
    sluice.audit(&run).await;
    sluice.stop().await;
}

// -------------------------------------------------------------------------------- aws ----

/// moto's own record, read with calls signed by this test's own SigV4 signer (the AWS SDK's
/// `aws-sigv4`, set up as the AWS SDK sets it up for each service), not Sluice's connector.
struct Moto {
    url: String,
    access: String,
    secret: String,
    http: reqwest::Client,
}

impl Moto {
    /// One signed call; `path` from `/`.
    async fn signed(
        &self,
        service: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (StatusCode, String) {
        use aws_sigv4::http_request::{
            PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest,
            SigningSettings, UriPathNormalizationMode, sign,
        };
        use aws_sigv4::sign::v4;
        use aws_smithy_runtime_api::client::identity::Identity;

        let url = format!("{}{path}", self.url);
        let identity: Identity =
            aws_credential_types::Credentials::new(&self.access, &self.secret, None, None, "test")
                .into();
        let mut settings = SigningSettings::default();
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        if service == "s3" {
            settings.percent_encoding_mode = PercentEncodingMode::Single;
            settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        }
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region("us-east-1")
            .name(service)
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .expect("signing parameters")
            .into();
        let signable = SignableRequest::new(
            method,
            url.as_str(),
            headers.iter().copied(),
            SignableBody::Bytes(body),
        )
        .expect("a signable request");
        let (instructions, _) = sign(signable, &params).expect("signed").into_parts();
        let mut request = self.http.request(
            reqwest::Method::from_bytes(method.as_bytes()).expect("a method"),
            &url,
        );
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        for (name, value) in instructions.headers() {
            request = request.header(name, value);
        }
        let response = request
            .body(body.to_vec())
            .send()
            .await
            .expect("moto answers");
        let status = response.status();
        (status, response.text().await.expect("a body"))
    }

    async fn sqs(&self, action: &str, body: Value) -> Value {
        let target = format!("AmazonSQS.{action}");
        let (status, text) = self
            .signed(
                "sqs",
                "POST",
                "/",
                &[
                    ("content-type", "application/x-amz-json-1.0"),
                    ("x-amz-target", &target),
                ],
                body.to_string().as_bytes(),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{action}: {text}");
        serde_json::from_str(&text).expect("JSON")
    }

    fn queue(&self) -> String {
        format!("{}/123456789012/orders.fifo", self.url)
    }

    /// The deduplication ids of the messages on the queue, visible or not.
    async fn queued(&self) -> Vec<String> {
        let attributes = self
            .sqs(
                "GetQueueAttributes",
                json!({"QueueUrl": self.queue(), "AttributeNames": ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]}),
            )
            .await;
        let count = |name: &str| -> usize {
            attributes["Attributes"][name]
                .as_str()
                .and_then(|n| n.parse().ok())
                .expect("a count")
        };
        let total =
            count("ApproximateNumberOfMessages") + count("ApproximateNumberOfMessagesNotVisible");
        let received = self
            .sqs(
                "ReceiveMessage",
                json!({"QueueUrl": self.queue(), "MaxNumberOfMessages": 10, "VisibilityTimeout": 0,
                       "MessageSystemAttributeNames": ["MessageDeduplicationId"]}),
            )
            .await;
        let ids: Vec<String> = received["Messages"]
            .as_array()
            .map(|messages| {
                messages
                    .iter()
                    .map(|m| {
                        m["Attributes"]["MessageDeduplicationId"]
                            .as_str()
                            .expect("an id")
                            .to_owned()
                    })
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(
            ids.len(),
            total,
            "every queued message was read: {received}"
        );
        ids
    }

    /// The object at `key` (the object name, unencoded), if any.
    async fn object(&self, key: &str) -> Option<Value> {
        let path = format!("/sluice-reports/{}", key.replace('/', "%2F"));
        let (status, text) = self.signed("s3", "GET", &path, &[], b"").await;
        match status {
            StatusCode::OK => Some(serde_json::from_str(&text).expect("a JSON object")),
            StatusCode::NOT_FOUND => None,
            other => panic!("GET {path}: {other} {text}"),
        }
    }
}

/// Calls moto's IAM (query protocol) signed with `moto`'s key; the answer's XML.
async fn iam(moto: &Moto, form: &[(&str, &str)]) -> String {
    let mut body = form_urlencoded::Serializer::new(String::new());
    body.append_pair("Version", "2010-05-08");
    for (name, value) in form {
        body.append_pair(name, value);
    }
    let (status, text) = moto
        .signed(
            "iam",
            "POST",
            "/",
            &[("content-type", "application/x-www-form-urlencoded")],
            body.finish().as_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "IAM {form:?}: {text}");
    text
}

/// The text of the first `<tag>…</tag>` in `xml`.
fn xml_text(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no {tag} in {xml}"))
        + open.len();
    let end = start + xml[start..].find('<').expect("a closing tag");
    xml[start..end].to_owned()
}

/// moto emptied, its signature checks on (after the three IAM calls that make the user: the
/// access key's secret must then sign every call), the queue and the bucket made.
async fn moto_with_signature_checks(url: &str) -> Moto {
    let http = http();
    let reset = http
        .post(format!("{url}/moto-api/reset"))
        .send()
        .await
        .expect("moto answers");
    assert_eq!(reset.status(), StatusCode::OK);
    let checks = http
        .post(format!("{url}/moto-api/reset-auth"))
        .header("content-type", "text/plain")
        .body("3")
        .send()
        .await
        .expect("moto answers");
    assert_eq!(checks.status(), StatusCode::OK, "{:?}", checks.text().await);
    let setup = Moto {
        url: url.to_owned(),
        access: "AKIDSLUICESETUP".into(),
        secret: "unchecked".into(),
        http: http.clone(),
    };
    iam(&setup, &[("Action", "CreateUser"), ("UserName", "sluice")]).await;
    let key = iam(
        &setup,
        &[("Action", "CreateAccessKey"), ("UserName", "sluice")],
    )
    .await;
    let policy = json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]});
    iam(
        &setup,
        &[
            ("Action", "PutUserPolicy"),
            ("UserName", "sluice"),
            ("PolicyName", "everything"),
            ("PolicyDocument", &policy.to_string()),
        ],
    )
    .await;
    let moto = Moto {
        url: url.to_owned(),
        access: xml_text(&key, "AccessKeyId"),
        secret: xml_text(&key, "SecretAccessKey"),
        http,
    };
    // The checks are on: a wrong secret is refused.
    let forged = Moto {
        secret: "not-the-secret".into(),
        ..Moto {
            url: url.to_owned(),
            access: moto.access.clone(),
            secret: String::new(),
            http: moto.http.clone(),
        }
    };
    let (status, text) = forged
        .signed(
            "sqs",
            "POST",
            "/",
            &[
                ("content-type", "application/x-amz-json-1.0"),
                ("x-amz-target", "AmazonSQS.ListQueues"),
            ],
            b"{}",
        )
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "moto checks signatures: {text}"
    );
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    moto.sqs(
        "CreateQueue",
        json!({"QueueName": "orders.fifo", "Attributes": {"FifoQueue": "true"}}),
    )
    .await;
    let (status, text) = moto.signed("s3", "PUT", "/sluice-reports", &[], b"").await;
    assert_eq!(status, StatusCode::OK, "CreateBucket: {text}");
    moto
}

/// Turns moto's signature checks off again, as start.sh leaves it.
async fn moto_unchecked(url: &str) {
    let _ = http()
        .post(format!("{url}/moto-api/reset-auth"))
        .header("content-type", "text/plain")
        .body("inf")
        .send()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqs_and_s3_through_moto_are_signed_sent_once_and_only_s3_is_undone() {
    if skipped("aws") {
        return;
    }
    let url = env("SLUICE_EMU_MOTO_URL");
    let moto = moto_with_signature_checks(&url).await;
    let proxy = Proxy::start(&url).await.expect("the proxy starts");
    // The signature covers Host: moto must see the one Sluice signed (the proxy's).
    proxy.keep_host(true);
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let catalog = example_catalog(
        "aws",
        Base::Variables(&["sqs", "s3"]),
        &proxy.base_url(),
        |t| {
            for credential in ["aws_sqs", "aws_s3"] {
                secrets_in_files(
                    t,
                    credential,
                    &[
                        ("access_key_id", &moto.access),
                        ("secret_access_key", &moto.secret),
                    ],
                    secrets.path(),
                );
            }
            quick(t, "orders/enqueue", 5);
            quick(t, "reports/put", 5);
        },
    );
    let (enqueue, put) = ("orders/enqueue", "reports/put");
    assert_eq!(
        catalog
            .resolve(enqueue)
            .expect("declared")
            .policy()
            .idempotency_key_ttl_ms,
        Some(300_000),
        "SQS's deduplication window"
    );
    let sluice = Sluice::start(catalog).await;
    let tag = tag();
    let run = format!("r-aws-{tag}");
    let order = |id: &str| json!({"order_id": id, "event": format!("order {id} paid")});
    let report = |id: &str| json!({"report_id": id, "total_minor": 4200});
    let bystander = format!("reports/bystander-{tag}.json");
    let (status, text) = moto
        .signed(
            "s3",
            "PUT",
            &format!("/sluice-reports/{bystander}"),
            &[],
            b"{}",
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{text}");

    // 1. SQS, dropped before it arrived: resent with the same deduplication id. One message.
    proxy.arm(Method::POST, "/", Fault::DropBeforeArrival);
    let dropped = sluice.run(&run, 1, enqueue, order("o-1")).await;
    assert_eq!(dropped.status(), Confirmed, "{dropped:?}");
    assert_eq!(dropped.state.attempts, 2, "{dropped:?}");
    // 2. SQS, queued and the answer lost (503): resent, and SQS drops the copy. One message.
    proxy.arm(Method::POST, "/", Fault::CommitThen503);
    let lost = sluice.run(&run, 2, enqueue, order("o-2")).await;
    assert_eq!(lost.status(), Confirmed, "{lost:?}");
    assert_eq!(lost.state.attempts, 2, "{lost:?}");
    let sends = seen_for(&proxy, &Method::POST, "/", &idem(&run, 2, enqueue));
    assert_eq!(faults(&sends), [Some(Fault::CommitThen503), None]);
    assert!(
        sends
            .iter()
            .all(|s| s.upstream_status == Some(StatusCode::OK)),
        "both reached SQS"
    );
    let mut queued = moto.queued().await;
    queued.sort();
    assert_eq!(
        queued,
        [idem(&run, 1, enqueue), idem(&run, 2, enqueue)],
        "exactly one message per effect"
    );

    // 3. S3, dropped before it arrived: put again. 4. S3, stored and the answer lost: put
    //    again, the same object. One object each.
    proxy.arm(Method::PUT, "/sluice-reports/", Fault::DropBeforeArrival);
    let stored = sluice.run(&run, 3, put, report("q3")).await;
    for s in proxy.seen() {
        eprintln!(
            "DEBUG {} {} {:?} fwd={} up={:?}",
            s.method, s.path, s.fault, s.forwarded, s.upstream_status
        );
    }
    assert_eq!(stored.status(), Confirmed, "{stored:?}");
    assert_eq!(stored.state.attempts, 2, "{stored:?}");
    proxy.arm(Method::PUT, "/sluice-reports/", Fault::CommitThen503);
    let again = sluice.run(&run, 4, put, report("q4")).await;
    assert_eq!(again.status(), Confirmed, "{again:?}");
    for decision in [3, 4] {
        let object = moto
            .object(&format!("reports/{}.json", idem(&run, decision, put)))
            .await
            .expect("the object is stored");
        assert_eq!(object["sluice_key"], json!(idem(&run, decision, put)));
        assert_eq!(object["total_minor"], json!(4200));
    }

    // Roll back: the objects are deleted, last first; the messages stay (SQS cannot take one
    // back), NO_COMPENSATION and escalated to a person.
    let undone = sluice
        .roll_back(
            &run,
            &[
                (key(4, put), Compensated),
                (key(3, put), Compensated),
                (key(2, enqueue), NoCompensation),
                (key(1, enqueue), NoCompensation),
            ],
        )
        .await;
    assert!(!undone[0].state.escalated && !undone[1].state.escalated);
    assert!(
        undone[2].state.escalated && undone[3].state.escalated,
        "{undone:?}"
    );
    for decision in [3, 4] {
        let name = format!("reports/{}.json", idem(&run, decision, put));
        assert_eq!(moto.object(&name).await, None, "{name} was not deleted");
    }
    assert!(
        moto.object(&bystander).await.is_some(),
        "an object Sluice never stored was deleted"
    );
    assert_eq!(
        moto.queued().await.len(),
        2,
        "the messages are still queued"
    );
    let deletes = proxy
        .seen()
        .into_iter()
        .filter(|s| s.method == Method::DELETE)
        .count();
    assert_eq!(deletes, 2);
    sluice.audit(&run).await;
    sluice.stop().await;
    moto_unchecked(&url).await;
}

// ----------------------------------------------------------------------------- stripe ----

/// localstripe's own record.
struct Localstripe {
    url: String,
    http: reqwest::Client,
}

/// The Stripe key the adapter and the oracle use (localstripe takes any `sk_…`).
const STRIPE_KEY: &str = "sk_test_sluice_examples";

impl Localstripe {
    async fn get(&self, path: &str) -> Value {
        let answer = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(STRIPE_KEY)
            .send()
            .await
            .expect("localstripe answers");
        assert_eq!(answer.status(), StatusCode::OK, "GET {path}");
        answer.json().await.expect("JSON")
    }

    /// Every charge whose metadata holds `sluice_key`.
    async fn charges_with_key(&self, key: &str) -> Vec<Value> {
        let all = self.get("/v1/charges?limit=100000").await;
        all["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter(|c| c["metadata"]["sluice_key"] == json!(key))
            .cloned()
            .collect()
    }

    /// The refunds of charge `id`.
    async fn refunds(&self, id: &str) -> usize {
        let refunds = self
            .get(&format!("/v1/refunds?charge={id}&limit=100"))
            .await;
        refunds["data"].as_array().expect("data").len()
    }

    async fn charge_directly(&self, order: &str) -> String {
        let answer = self
            .http
            .post(format!("{}/v1/charges", self.url))
            .bearer_auth(STRIPE_KEY)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "amount=700&currency=eur&source=pm_card_visa&metadata%5Border_id%5D={order}"
            ))
            .send()
            .await
            .expect("localstripe answers");
        assert_eq!(answer.status(), StatusCode::OK);
        let body: Value = answer.json().await.expect("JSON");
        body["id"].as_str().expect("an id").to_owned()
    }
}

/// The Stripe adapter (examples/stripe/adapter.py) as a child process, killed when dropped.
struct Adapter {
    child: std::process::Child,
    url: String,
    log: PathBuf,
}

impl Drop for Adapter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `python` with `args` in examples/stripe; its standard output.
fn python_output(python: &str, args: &[&str], envs: &[(&str, &str)]) -> String {
    let output = std::process::Command::new(python)
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(examples().join("stripe"))
        .output()
        .unwrap_or_else(|e| panic!("{python} runs: {e}"));
    assert!(
        output.status.success(),
        "{python} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

async fn start_adapter(python: &str, signing_key: &str, stripe: &str, logs: &Path) -> Adapter {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = logs.join("adapter.log");
    let file = std::fs::File::create(&log).expect("a log file");
    let child = std::process::Command::new(python)
        .args(["adapter.py", "--port", &port.to_string()])
        .env("SLUICE_TOOL_SIGNING_KEYS", signing_key)
        .env("STRIPE_SECRET_KEY", STRIPE_KEY)
        .env("STRIPE_API_BASE", stripe)
        .current_dir(examples().join("stripe"))
        .stdout(file.try_clone().expect("a log file"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("{python} adapter.py starts: {e}"));
    let adapter = Adapter {
        child,
        url: format!("http://127.0.0.1:{port}"),
        log,
    };
    // Up once it answers; an unsigned request is refused.
    let ready = poll_for(Duration::from_secs(30), || async {
        let answer = http()
            .get(format!("{}/payments/charge", adapter.url))
            .send()
            .await
            .ok()?;
        Some(answer.status())
    })
    .await;
    assert_eq!(
        ready,
        Some(StatusCode::UNAUTHORIZED),
        "the adapter answers unsigned requests with 401; its log: {}",
        std::fs::read_to_string(&adapter.log).unwrap_or_default()
    );
    adapter
}

/// The committed examples/stripe/catalog.toml without its opening comment.
fn committed_stripe_catalog() -> String {
    let text = std::fs::read_to_string(examples().join("stripe/catalog.toml"))
        .expect("examples/stripe/catalog.toml");
    let body: Vec<&str> = text
        .lines()
        .skip_while(|line| line.starts_with('#') || line.trim().is_empty())
        .collect();
    body.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stripe_charges_through_the_signed_adapter_are_made_once_found_and_refunded_once() {
    if skipped("stripe") {
        return;
    }
    let stripe = Localstripe {
        url: env("SLUICE_EMU_LOCALSTRIPE_URL"),
        http: http(),
    };
    let python = env("SLUICE_EXAMPLES_PYTHON");
    let signing_key = python_output(
        &python,
        &[
            "-c",
            "from sluice.tool import new_signing_key; print(new_signing_key())",
        ],
        &[],
    )
    .trim()
    .to_owned();
    // The committed catalog is what the adapter's ToolApp prints.
    let printed = python_output(
        &python,
        &["-m", "sluice.tool", "adapter:app", "http://127.0.0.1:9010"],
        &[("SLUICE_TOOL_SIGNING_KEYS", &signing_key)],
    );
    assert_eq!(
        committed_stripe_catalog().trim(),
        printed.trim(),
        "regenerate examples/stripe/catalog.toml"
    );

    let logs = tempfile::tempdir().expect("a temporary directory");
    let adapter = start_adapter(&python, &signing_key, &stripe.url, logs.path()).await;
    let tag = tag();
    // Anyone else's call is refused before it is read: no charge.
    let stranger = http()
        .post(format!("{}/payments/charge", adapter.url))
        .header("idempotency-key", format!("stranger-{tag}"))
        .json(
            &json!({"amount": 5000, "currency": "eur", "source": "pm_card_visa", "order_id": "o"}),
        )
        .send()
        .await
        .expect("the adapter answers");
    assert_eq!(stranger.status(), StatusCode::UNAUTHORIZED);
    assert!(
        stripe
            .charges_with_key(&format!("stranger-{tag}"))
            .await
            .is_empty()
    );

    let proxy = Proxy::start(&adapter.url).await.expect("the proxy starts");
    let catalog = example_catalog(
        "stripe",
        Base::Literal("http://127.0.0.1:9010"),
        &proxy.base_url(),
        |t| {
            let file = logs.path().join("signing-keys");
            std::fs::write(&file, &signing_key).expect("a key file");
            let mut reference = toml::Table::new();
            reference.insert("file".into(), file.display().to_string().into());
            t.get_mut("credentials")
                .and_then(toml::Value::as_table_mut)
                .and_then(|c| c.get_mut("tool_services"))
                .and_then(toml::Value::as_table_mut)
                .expect("the tool_services credential")
                .insert(
                    "keys".into(),
                    toml::Value::Array(vec![toml::Value::Table(reference)]),
                );
            quick(t, "payments/charge", 5);
        },
    );
    let sluice = Sluice::start(catalog).await;
    let (run, other) = (format!("r-pay-{tag}"), format!("r-pay-other-{tag}"));
    let tool = "payments/charge";
    let pay = |order: &str, source: &str| json!({"amount": 2500, "currency": "eur", "source": source, "order_id": order});
    let bystander = stripe.charge_directly(&format!("bystander-{tag}")).await;

    // 1. Dropped before it reached the adapter: the adapter's lookup (every page of the charge
    //    list, filtered on metadata) finds nothing twice, so it is sent again. One charge.
    proxy.arm(Method::POST, "/payments/charge", Fault::DropBeforeArrival);
    let dropped = sluice.run(&run, 1, tool, pay("o-1", "pm_card_visa")).await;
    assert_eq!(dropped.status(), Confirmed, "{dropped:?}");
    assert_eq!(dropped.state.attempts, 2, "{dropped:?}");
    let one = stripe.charges_with_key(&idem(&run, 1, tool)).await;
    assert_eq!(one.len(), 1, "exactly one charge: {one:?}");
    assert_eq!(
        dropped.state.external_ref.as_ref(),
        one[0]["id"].as_str().map(str::to_owned).as_ref()
    );

    // 2. Charged, the answer lost (503): found by the lookup. One charge.
    proxy.arm(Method::POST, "/payments/charge", Fault::CommitThen503);
    let lost = sluice.run(&run, 2, tool, pay("o-2", "pm_card_visa")).await;
    assert_eq!(lost.status(), Confirmed, "{lost:?}");
    assert_eq!(lost.state.attempts, 1, "{lost:?}");
    let two = stripe.charges_with_key(&idem(&run, 2, tool)).await;
    assert_eq!(two.len(), 1, "exactly one charge: {two:?}");
    let charge_two = two[0]["id"].as_str().expect("an id").to_owned();
    assert_eq!(
        lost.state.external_ref.as_deref(),
        Some(charge_two.as_str())
    );

    // 3. A declined card: Stripe's 402 is a refusal (FAILED); the failed charge it stores is
    //    not a commit.
    let declined = sluice
        .run(&run, 3, tool, pay("o-3", "pm_card_chargeCustomerFail"))
        .await;
    assert_eq!(declined.status(), Failed, "{declined:?}");
    let three = stripe.charges_with_key(&idem(&run, 3, tool)).await;
    assert_eq!(three.len(), 1, "{three:?}");
    assert_eq!(three[0]["status"], json!("failed"));

    let kept = sluice
        .run(&other, 1, tool, pay("o-9", "pm_card_visa"))
        .await;
    assert_eq!(kept.status(), Confirmed, "{kept:?}");
    let kept_charge = kept.state.external_ref.clone().expect("a charge id");

    // Roll back: the refund of charge 2 is made and its answer lost (503); asked again, the
    // adapter answers with the refund already made. One refund per charge, nothing else.
    proxy.arm(
        Method::POST,
        "/payments/charge/compensate/",
        Fault::CommitThen503,
    );
    let undone = sluice
        .roll_back(
            &run,
            &[(key(2, tool), Compensated), (key(1, tool), Compensated)],
        )
        .await;
    assert!(undone.iter().all(|c| !c.state.escalated), "{undone:?}");
    let refunds = seen_for(
        &proxy,
        &Method::POST,
        "/payments/charge/compensate/",
        &charge_two,
    );
    assert_eq!(faults(&refunds), [Some(Fault::CommitThen503), None]);
    let charge_one = one[0]["id"].as_str().expect("an id");
    assert_eq!(
        stripe.refunds(&charge_two).await,
        1,
        "charge 2 refunded exactly once"
    );
    assert_eq!(
        stripe.refunds(charge_one).await,
        1,
        "charge 1 refunded exactly once"
    );
    assert_eq!(
        stripe.refunds(&bystander).await,
        0,
        "a charge Sluice never made was refunded"
    );
    assert_eq!(
        stripe.refunds(&kept_charge).await,
        0,
        "another run's charge was refunded"
    );
    sluice.audit(&run).await;
    sluice.stop().await;
    drop(adapter);
}

// ------------------------------------------------------------------ catalogs, dry run ----

/// A command of `tool` as the pipeline would record it, for a dry run.
fn dry_command(catalog: &Catalog, run: &str, tool: &str, args: Value) -> (Command, String) {
    let tool = catalog.resolve(tool).expect("declared");
    tool.validate_args(&args)
        .expect("the arguments fit the schema");
    let intent = Intent {
        run_id: RunId::parse(run).expect("valid"),
        command_key: CommandKey::new(1, tool.name().clone(), 0),
        semantics: tool.semantics(),
        business_key: tool.business_key(&args).expect("renders"),
        args,
        policy_version: "1".into(),
        max_attempts: 3,
        not_before: None,
    };
    let command = Command::from_intent(intent, Timestamp::from_millis(1_700_000_000_000), 10_000);
    let key = command.idempotency_key.to_string();
    (command, key)
}

/// Every example's catalog loads as the services load it at start: valid, and each lookup
/// within the reconciler's default budget per sweep item.
#[test]
fn every_example_catalog_loads() {
    for name in [
        "email/catalog.toml",
        "rest/catalog.toml",
        "aws/catalog.toml",
        "stripe/catalog.toml",
        "stripe/catalog.real-stripe.toml",
    ] {
        let path = examples().join(name);
        let catalog = Catalog::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!catalog.is_empty(), "{name}");
        sluice_assemble::check_sweep_budgets(&sluice_runtime::Config::default(), &catalog)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The real Stripe API cannot be reached from the tests: its catalog is checked to load and
/// to render the requests Stripe documents, as `sluice catalog requests` prints them.
#[test]
fn the_real_stripe_catalog_renders_the_requests_stripe_documents() {
    let catalog = Catalog::load(examples().join("stripe/catalog.real-stripe.toml"))
        .expect("catalog.real-stripe.toml loads");
    let tool = catalog.resolve("payments/charge").expect("declared");
    assert_eq!(
        tool.policy().idempotency_key_ttl_ms,
        Some(86_400_000),
        "Stripe's key window"
    );
    assert!(
        tool.dispatch().require_reference,
        "a refund needs the charge's id"
    );
    let (command, key) = dry_command(
        &catalog,
        "r-42",
        "payments/charge",
        json!({"amount": 2500, "currency": "eur", "source": "tok_visa", "order_id": "o-1"}),
    );
    // As after the charge committed: its reference is the charge's id.
    let mut command = command;
    command.state.external_ref = Some("ch_3Pq".into());
    let requests = preview::requests(tool, &command, Some("ch_3Pq"));
    let shown: Vec<preview::Preview> = requests
        .into_iter()
        .map(|(operation, request)| request.unwrap_or_else(|e| panic!("{operation:?}: {e}")))
        .collect();
    let header = |request: &preview::Preview, name: &str| -> Option<String> {
        request
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let [charge, search, refund] = &shown[..] else {
        panic!("dispatch, status check and compensate: {shown:#?}")
    };
    let form = |body: &Option<String>| -> Vec<(String, String)> {
        form_urlencoded::parse(body.as_deref().expect("a body").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    };

    // POST /v1/charges, a form body with nested metadata, the key in Idempotency-Key.
    assert_eq!(
        (charge.method.as_str(), charge.url.as_str()),
        ("POST", "https://api.stripe.com/v1/charges")
    );
    assert_eq!(
        header(charge, "content-type").as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(
        header(charge, "stripe-version").as_deref(),
        Some("2024-06-20")
    );
    assert_eq!(header(charge, "idempotency-key"), Some(key.clone()));
    assert_eq!(
        header(charge, "authorization").as_deref(),
        Some("Bearer <secret: env STRIPE_SECRET_KEY>"),
        "the secret is masked"
    );
    let sent = form(&charge.body);
    for pair in [
        ("amount", "2500"),
        ("currency", "eur"),
        ("source", "tok_visa"),
        ("description", "order o-1"),
        ("metadata[order_id]", "o-1"),
        ("metadata[sluice_key]", key.as_str()),
    ] {
        assert!(
            sent.contains(&(pair.0.to_owned(), pair.1.to_owned())),
            "{pair:?} in {sent:?}"
        );
    }

    // GET /v1/charges/search by the key in the metadata, succeeded charges only.
    assert_eq!(search.method, "GET");
    let url = reqwest::Url::parse(&search.url).expect("a URL");
    assert_eq!(url.path(), "/v1/charges/search");
    let query: Vec<(String, String)> = url
        .query_pairs()
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    assert!(
        query.contains(&(
            "query".into(),
            format!("metadata['sluice_key']:'{key}' AND status:'succeeded'")
        )),
        "{query:?}"
    );
    assert_eq!(header(search, "idempotency-key"), None);
    assert_eq!(
        header(search, "stripe-version").as_deref(),
        Some("2024-06-20")
    );

    // POST /v1/refunds of exactly that charge, under the compensation's own key.
    assert_eq!(
        (refund.method.as_str(), refund.url.as_str()),
        ("POST", "https://api.stripe.com/v1/refunds")
    );
    assert!(
        form(&refund.body).contains(&("charge".into(), "ch_3Pq".into())),
        "{:?}",
        refund.body
    );
    assert_eq!(
        header(refund, "idempotency-key"),
        Some(format!("{key}/compensate"))
    );
    for request in &shown {
        assert!(!request.to_http().contains("sk_"), "{}", request.to_http());
    }
}
