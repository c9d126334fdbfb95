//! The MCP connector against real MCP servers: the notebook server written here
//! (`support/mcp_fixture.rs`, rmcp's server side), served over streamable HTTP in this process
//! and over stdio by the `sluice-mcp-fixture` binary. Each test checks the server's own state.

// Shared with the other side (stdio binary, HTTP tests): each uses a part.
#[allow(dead_code)]
#[path = "support/mcp_fixture.rs"]
mod mcp_fixture;

use std::path::Path;
use std::time::{Duration, Instant};

use mcp_fixture::{Note, Notebook};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use sluice_connector::credentials::Secrets;
use sluice_connector::mcp::{McpConnector, discover};
use sluice_connector::{CompensationTarget, Connector};
use sluice_core::catalog::{Catalog, SemanticsSource, Tool};
use sluice_core::command::{Command, EffectSemantics, Intent, Observation};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};
use sluice_core::time::Timestamp;

/// Serves `notebook` over streamable HTTP on a free loopback port; its `/mcp` URL.
async fn serve_http(notebook: Notebook) -> String {
    let config = StreamableHttpServerConfig::default();
    let service: StreamableHttpService<Notebook, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(notebook.clone()), Default::default(), config);
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let address = listener.local_addr().expect("bound");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{address}/mcp")
}

/// The catalog's overrides of the notebook's tools, under `[mcp_servers.<server>]`.
fn overrides(server: &str) -> String {
    format!(
        r#"
[mcp_servers.{server}.tools.append]
key_argument = "idempotency_key"
set_arguments = {{ text = "{{args.text}} [key {{idempotency_key}}]" }}
reference_pointer = "/id"
[mcp_servers.{server}.tools.append.status_check]
tool = "notes"
contains = "[key {{idempotency_key}}]"
[mcp_servers.{server}.tools.append.compensate]
tool = "remove"
arguments = {{ id = "{{external_ref}}" }}

[mcp_servers.{server}.tools.append_slow]
set_arguments = {{ text = "{{args.text}} [key {{idempotency_key}}]" }}
[mcp_servers.{server}.tools.append_slow.status_check]
tool = "notes"
matches = "/items"
match_reference_pointer = "/id"
match_where = {{ "/text" = "{{args.text}} [key {{idempotency_key}}]" }}

[mcp_servers.{server}.tools.explode]
semantics = "IDEMPOTENT"
on_error = "unknown"
"#
    )
}

const ALLOW: &str = r#"allow = ["append", "append_slow", "notes", "refuse", "explode"]"#;

async fn loaded(text: &str) -> (Catalog, McpConnector) {
    let catalog = Catalog::from_toml_str(text, "mcp-test.toml").expect("the catalog parses");
    let connector = McpConnector::new(&catalog, std::sync::Arc::new(Secrets::new()));
    let catalog = discover(catalog, &connector)
        .await
        .expect("the server lists its tools");
    (catalog, connector)
}

async fn over_http(notebook: &Notebook) -> (Catalog, McpConnector) {
    let url = serve_http(notebook.clone()).await;
    let text = format!(
        "[mcp_servers.notebook]\nurl = \"{url}\"\ntimeout_ms = 5000\n{ALLOW}\n{}",
        overrides("notebook")
    );
    loaded(&text).await
}

/// The stdio notebook: the fixture binary with its state in `dir`.
async fn over_stdio(dir: &Path) -> (Catalog, McpConnector) {
    // The token's secret is a variable cargo sets for this test process (its package name).
    let text = format!(
        r#"[credentials.token]
kind = "bearer"
token = {{ env = "CARGO_PKG_NAME" }}
[mcp_servers.notebook]
command = "{}"
env = {{ FIXTURE_STATE = "{}", FIXTURE_PID = "{}" }}
env_credentials = {{ FIXTURE_TOKEN = "token" }}
timeout_ms = 5000
{ALLOW}
{}"#,
        env!("CARGO_BIN_EXE_sluice-mcp-fixture"),
        dir.join("notes.json").display(),
        dir.join("pid").display(),
        overrides("notebook")
    );
    loaded(&text).await
}

fn stored_notes(dir: &Path) -> Vec<Note> {
    std::fs::read_to_string(dir.join("notes.json"))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

fn tool<'a>(catalog: &'a Catalog, name: &str) -> &'a Tool {
    catalog.resolve(name).expect("the tool is in the catalog")
}

/// The command an agent's call `d-3/<tool>/<call>` in run `r-mcp` becomes.
fn command_for(tool: &Tool, call: u32, args: Value) -> Command {
    tool.validate_args(&args)
        .expect("the arguments fit the server's schema");
    let intent = Intent {
        run_id: RunId::parse("r-mcp").expect("valid run id"),
        command_key: CommandKey::new(3, tool.name().clone(), call),
        semantics: tool.semantics(),
        business_key: None,
        args,
        policy_version: "1".into(),
        max_attempts: 3,
        not_before: None,
    };
    Command::from_intent(intent, Timestamp::from_millis(1_700_000_000_000), 10_000)
}

#[tokio::test]
async fn the_allowed_tools_load_with_semantics_from_annotations_or_the_catalog() {
    let notebook = Notebook::in_memory();
    let (catalog, _connector) = over_http(&notebook).await;
    let names: Vec<String> = catalog
        .tools()
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "notebook/append",
            "notebook/append_slow",
            "notebook/notes",
            "notebook/refuse",
            "notebook/explode"
        ]
    );
    assert!(
        catalog.resolve("notebook/remove").is_err(),
        "listed, not allowed"
    );
    let notes = tool(&catalog, "notebook/notes");
    assert_eq!(notes.semantics(), EffectSemantics::ObserveOnly);
    assert_eq!(notes.semantics_source(), SemanticsSource::Annotation);
    let append = tool(&catalog, "notebook/append");
    assert_eq!(
        append.semantics(),
        EffectSemantics::NonIdempotent,
        "no annotations"
    );
    let explode = tool(&catalog, "notebook/explode");
    assert_eq!(explode.semantics(), EffectSemantics::Idempotent);
    assert_eq!(explode.semantics_source(), SemanticsSource::Catalog);
    assert_eq!(append.upstream(), "mcp:notebook");
}

#[tokio::test]
async fn a_dispatch_carries_the_keys_in_meta_and_overwrites_the_models_key_argument() {
    let notebook = Notebook::in_memory();
    let (catalog, connector) = over_http(&notebook).await;
    let append = tool(&catalog, "notebook/append");
    let command = command_for(
        append,
        0,
        json!({"text": "buy milk", "idempotency_key": "the model's own"}),
    );
    let outcome = connector.dispatch(append, &command).await;
    let DispatchOutcome::Committed {
        external_ref,
        result,
    } = outcome
    else {
        panic!("committed: {outcome:?}")
    };
    assert_eq!(external_ref.as_deref(), Some("n-1"));
    let result = result.expect("the result is kept");
    assert_eq!(result["structuredContent"]["id"], "n-1");

    let notes = notebook.notes();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let key = command.idempotency_key.to_string();
    assert_eq!(notes[0].key_argument.as_deref(), Some(key.as_str()));
    assert_eq!(notes[0].text, format!("buy milk [key {key}]"));
    let meta = &notes[0].meta;
    assert_eq!(meta["dev.sluice/idempotency_key"], key.as_str());
    assert_eq!(meta["dev.sluice/run_id"], "r-mcp");
    assert_eq!(
        meta["dev.sluice/command_key"],
        command.command_key.to_string().as_str()
    );
}

#[tokio::test]
async fn is_error_and_json_rpc_errors_read_as_declared() {
    let notebook = Notebook::in_memory();
    let (catalog, connector) = over_http(&notebook).await;
    let refuse = tool(&catalog, "notebook/refuse");
    let outcome = connector
        .dispatch(refuse, &command_for(refuse, 0, json!({})))
        .await;
    let DispatchOutcome::Refused { reason } = &outcome else {
        panic!("isError reads as refused by default: {outcome:?}")
    };
    assert!(reason.contains("no such branch"), "{reason}");

    // on_error = "unknown": a server error other than the protocol's may have acted.
    let explode = tool(&catalog, "notebook/explode");
    let outcome = connector
        .dispatch(explode, &command_for(explode, 0, json!({})))
        .await;
    let DispatchOutcome::Ambiguous { reason } = &outcome else {
        panic!("on_error = unknown: {outcome:?}")
    };
    assert!(
        reason.contains("-32000") && reason.contains("on fire"),
        "{reason}"
    );

    // The protocol's own errors say nothing ran, whatever on_error says.
    let outcome = connector
        .dispatch(explode, &command_for(explode, 1, json!({"code": -32602})))
        .await;
    let DispatchOutcome::Refused { reason } = &outcome else {
        panic!("-32602 is a refusal: {outcome:?}")
    };
    assert!(reason.contains("-32602"), "{reason}");
}

#[tokio::test]
async fn a_lookup_by_contains_finds_the_effect_once_and_absent_before() {
    let notebook = Notebook::in_memory();
    let (catalog, connector) = over_http(&notebook).await;
    let append = tool(&catalog, "notebook/append");
    let first = command_for(append, 0, json!({"text": "call the bank"}));
    let second = command_for(append, 1, json!({"text": "call the bank"}));

    let before = connector.status_check(append, &first).await;
    assert_eq!(before.observation, Observation::Absent, "{before:?}");
    assert!(matches!(
        connector.dispatch(append, &first).await,
        DispatchOutcome::Committed { .. }
    ));
    let after = connector.status_check(append, &first).await;
    assert_eq!(after.observation, Observation::Present, "{after:?}");
    assert_eq!(after.evidence["mcp_tool"], "notes");
    assert_eq!(after.evidence["matches"], 1);
    // The same text under another key is another effect.
    let other = connector.status_check(append, &second).await;
    assert_eq!(other.observation, Observation::Absent, "{other:?}");
}

#[tokio::test]
async fn a_lookup_by_matches_reads_the_json_as_an_http_lookup_does() {
    let notebook = Notebook::in_memory();
    let (catalog, connector) = over_http(&notebook).await;
    let slow = tool(&catalog, "notebook/append_slow");
    let command = command_for(slow, 0, json!({"text": "water plants", "delay_ms": 0}));
    let absent = connector.status_check(slow, &command).await;
    assert_eq!(absent.observation, Observation::Absent, "{absent:?}");
    assert!(matches!(
        connector.dispatch(slow, &command).await,
        DispatchOutcome::Committed { .. }
    ));
    let present = connector.status_check(slow, &command).await;
    assert_eq!(present.observation, Observation::Present, "{present:?}");
    assert_eq!(present.external_ref.as_deref(), Some("n-1"));
    assert_eq!(
        present.record.as_ref().map(|r| r["id"].clone()),
        Some(json!("n-1"))
    );
    assert!(
        present.evidence.get("http_status").is_none(),
        "{}",
        present.evidence
    );
}

#[tokio::test]
async fn a_compensation_calls_the_servers_undo_tool_with_the_reference() {
    let notebook = Notebook::in_memory();
    let (catalog, connector) = over_http(&notebook).await;
    let append = tool(&catalog, "notebook/append");
    let mut command = command_for(append, 0, json!({"text": "to undo"}));
    let DispatchOutcome::Committed { external_ref, .. } =
        connector.dispatch(append, &command).await
    else {
        panic!("committed")
    };
    command.state.external_ref = external_ref;
    assert_eq!(notebook.notes().len(), 1);
    let undone = connector
        .compensate(append, &command, CompensationTarget::OwnCommit)
        .await;
    assert_eq!(undone, CompensationOutcome::Done { reference: None });
    assert!(notebook.notes().is_empty(), "removed on the server");
    // Undoing it again: the server says there is no such note — a person must look.
    let again = connector
        .compensate(append, &command, CompensationTarget::OwnCommit)
        .await;
    assert!(
        matches!(again, CompensationOutcome::Impossible { .. }),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_stdio_server_killed_mid_call_is_ambiguous_and_the_lookup_finds_the_effect_after_a_restart()
 {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (catalog, connector) = over_stdio(dir.path()).await;
    let slow = tool(&catalog, "notebook/append_slow");
    let command = command_for(slow, 0, json!({"text": "pay rent", "delay_ms": 30000}));

    let call = {
        let connector = connector.clone();
        let tool = slow.clone();
        let command = command.clone();
        tokio::spawn(async move { connector.dispatch(&tool, &command).await })
    };
    // The server acted (the note is stored), and has not answered: kill it now.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stored_notes(dir.path()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the server never stored the note"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = std::fs::read_to_string(dir.path().join("pid")).expect("the server wrote its pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", pid.trim()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let outcome = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends when the child dies, not at its timeout")
        .expect("the task ran");
    let DispatchOutcome::Ambiguous { reason } = &outcome else {
        panic!("a call cut off after it was written is ambiguous: {outcome:?}")
    };
    assert!(!reason.is_empty());

    // The lookup starts the server again and finds the one note the killed call left.
    let found = connector.status_check(slow, &command).await;
    assert_eq!(found.observation, Observation::Present, "{found:?}");
    let new_pid = std::fs::read_to_string(dir.path().join("pid")).expect("restarted");
    assert_ne!(new_pid.trim(), pid.trim(), "a new child");
    assert_eq!(stored_notes(dir.path()).len(), 1);
    connector.close().await;
}

#[tokio::test]
async fn a_call_slower_than_the_timeout_is_ambiguous() {
    let notebook = Notebook::in_memory();
    let url = serve_http(notebook.clone()).await;
    let text = format!(
        "[mcp_servers.notebook]\nurl = \"{url}\"\ntimeout_ms = 300\n{ALLOW}\n{}",
        overrides("notebook")
    );
    let (catalog, connector) = loaded(&text).await;
    let slow = tool(&catalog, "notebook/append_slow");
    let command = command_for(slow, 0, json!({"text": "late", "delay_ms": 2000}));
    let started = Instant::now();
    let outcome = connector.dispatch(slow, &command).await;
    assert!(
        matches!(outcome, DispatchOutcome::Ambiguous { .. }),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "cut at the timeout"
    );
    assert_eq!(notebook.notes().len(), 1, "the server acted all the same");
}

#[tokio::test]
async fn a_server_that_cannot_be_started_is_a_load_error_naming_it_and_a_call_is_not_sent() {
    let text = format!(
        "[mcp_servers.nowhere]\ncommand = \"/nonexistent/mcp-server\"\ntimeout_ms = 1000\n{ALLOW}"
    );
    let catalog = Catalog::from_toml_str(&text, "mcp-test.toml").expect("parses");
    let connector = McpConnector::new(&catalog, std::sync::Arc::new(Secrets::new()));
    let error = discover(catalog, &connector)
        .await
        .expect_err("cannot start");
    let said = error.to_string();
    assert!(
        said.starts_with(
            "mcp-test.toml: mcp server nowhere: cannot list its tools after 3 attempts"
        ) && said.contains("/nonexistent/mcp-server"),
        "{said}"
    );

    // A tool of a server that cannot be reached at call time: not sent.
    let notebook = Notebook::in_memory();
    let (catalog, _) = over_http(&notebook).await;
    let append = tool(&catalog, "notebook/append");
    let unreachable = McpConnector::new(
        &Catalog::from_toml_str(
            &format!("[mcp_servers.notebook]\nurl = \"http://127.0.0.1:9/mcp\"\ntimeout_ms = 1000\n{ALLOW}"),
            "other.toml",
        )
        .expect("parses"),
        std::sync::Arc::new(Secrets::new()),
    );
    let outcome = unreachable
        .dispatch(append, &command_for(append, 0, json!({"text": "x"})))
        .await;
    assert!(
        matches!(outcome, DispatchOutcome::NotSent { .. }),
        "{outcome:?}"
    );
    assert!(notebook.notes().is_empty());
}

#[tokio::test]
async fn a_stdio_server_gets_its_env_and_credentials_and_none_of_sluices_environment() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (catalog, connector) = over_stdio(dir.path()).await;
    let append = tool(&catalog, "notebook/append");
    let outcome = connector
        .dispatch(append, &command_for(append, 0, json!({"text": "env"})))
        .await;
    assert!(
        matches!(outcome, DispatchOutcome::Committed { .. }),
        "{outcome:?}"
    );
    let notes = stored_notes(dir.path());
    let note = &notes[0];
    assert_eq!(
        note.token.as_deref(),
        Some(env!("CARGO_PKG_NAME")),
        "env_credentials"
    );
    assert!(
        note.env.iter().any(|name| name == "FIXTURE_STATE"),
        "env: {:?}",
        note.env
    );
    assert!(note.env.iter().any(|name| name == "PATH"), "{:?}", note.env);
    // Cargo sets these for this test process; the server must not inherit them.
    for name in ["CARGO_PKG_NAME", "CARGO_MANIFEST_DIR"] {
        assert!(std::env::var_os(name).is_some(), "{name} is set here");
        assert!(
            !note.env.iter().any(|seen| seen == name),
            "{name} leaked: {:?}",
            note.env
        );
    }
    connector.close().await;
}

#[tokio::test]
async fn an_http_server_gets_the_credential_on_every_request() {
    let notebook = Notebook::in_memory();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Option<String>>::new()));
    let config = StreamableHttpServerConfig::default();
    let served = notebook.clone();
    let service: StreamableHttpService<Notebook, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(served.clone()), Default::default(), config);
    let recorder = std::sync::Arc::clone(&seen);
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let recorder = std::sync::Arc::clone(&recorder);
                    async move {
                        let header = request
                            .headers()
                            .get("authorization")
                            .and_then(|value| value.to_str().ok())
                            .map(str::to_owned);
                        recorder.lock().expect("not poisoned").push(header);
                        next.run(request).await
                    }
                },
            ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("bound");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    let text = format!(
        r#"[credentials.vendor]
kind = "bearer"
token = {{ env = "CARGO_PKG_NAME" }}
[mcp_servers.notebook]
url = "http://{address}/mcp"
credential = "vendor"
timeout_ms = 5000
{ALLOW}
{}"#,
        overrides("notebook")
    );
    let (catalog, connector) = loaded(&text).await;
    let append = tool(&catalog, "notebook/append");
    let outcome = connector
        .dispatch(
            append,
            &command_for(append, 0, json!({"text": "with a token"})),
        )
        .await;
    assert!(
        matches!(outcome, DispatchOutcome::Committed { .. }),
        "{outcome:?}"
    );
    let seen = seen.lock().expect("not poisoned").clone();
    let expected = format!("Bearer {}", env!("CARGO_PKG_NAME"));
    assert!(seen.len() >= 3, "handshake, list and call: {seen:?}");
    assert!(
        seen.iter()
            .all(|header| header.as_deref() == Some(expected.as_str())),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_call_to_an_http_server_that_went_away_is_not_sent() {
    let notebook = Notebook::in_memory();
    let stop = tokio_util::sync::CancellationToken::new();
    // The server's own streams end with it, so the graceful shutdown does not wait on them.
    let config = StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    let served = notebook.clone();
    let service: StreamableHttpService<Notebook, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(served.clone()), Default::default(), config);
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let address = listener.local_addr().expect("bound");
    let stopped = stop.clone();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { stopped.cancelled().await })
            .await;
    });
    let text = format!(
        "[mcp_servers.notebook]\nurl = \"http://{address}/mcp\"\ntimeout_ms = 2000\n{ALLOW}\n{}",
        overrides("notebook")
    );
    let (catalog, connector) = loaded(&text).await;
    let append = tool(&catalog, "notebook/append");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops")
        .expect("the server task ends");
    let outcome = connector
        .dispatch(
            append,
            &command_for(append, 0, json!({"text": "nobody home"})),
        )
        .await;
    assert!(
        matches!(outcome, DispatchOutcome::NotSent { .. }),
        "{outcome:?}"
    );
    assert!(notebook.notes().is_empty());
}
