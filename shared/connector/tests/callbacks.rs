//! The callback URL an asynchronous tool's dispatch gives its upstream, against a real HTTP
//! upstream on 127.0.0.1 that records what it receives: the URL in the body and the header is
//! `<public_url>/v1/callbacks/<token>`, the token verifies under the key to the attempt's run,
//! command key, lease epoch and expiry; the URL echoed in the answer is not kept; and a tool
//! that does not name it is sent exactly as before.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice_connector::{CallbackSigner, Connector, HttpConnector};
use sluice_core::Secret;
use sluice_core::callback::{self, Claims, EXPIRY_MARGIN_MS};
use sluice_core::catalog::{Catalog, Tool};
use sluice_core::command::{Command, Intent};
use sluice_core::ids::{CommandKey, LeaseEpoch, RunId};
use sluice_core::machine::DispatchOutcome;
use sluice_core::time::{ManualClock, Timestamp};
use tokio::net::TcpListener;

const KEY: &str = "callback-test-key-0123456789abcdef";
const NOW: i64 = 1_700_000_000_000;
const DEADLINE_MS: i64 = 600_000;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    headers: HeaderMap,
    body: Value,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Answers every request 202, echoing the body it was sent (as some providers do).
async fn record(State(log): State<Log>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = to_bytes(body, 1 << 20).await.expect("a small body");
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    log.lock().expect("unpoisoned").push(Seen {
        headers: parts.headers,
        body: body.clone(),
    });
    (
        StatusCode::ACCEPTED,
        axum::Json(json!({"job": "j-1", "received": body})),
    )
        .into_response()
}

async fn upstream() -> (String, Log) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let addr = listener.local_addr().expect("an address");
    let log = Log::default();
    let app = Router::new().fallback(record).with_state(Arc::clone(&log));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), log)
}

fn tool(base: &str, dispatch: &str) -> Tool {
    let text = format!(
        r#"
        [[tool]]
        name = "payouts/send"
        semantics = "IDEMPOTENT"
        schema = {{ type = "object", required = ["amount"], properties = {{ amount = {{ type = "integer" }} }} }}
        [tool.dispatch]
        url = "{base}/payouts"
        {dispatch}
        [tool.async]
        accepted_status = [202]
        deadline_ms = {DEADLINE_MS}
        then = "escalate"
        outcome_pointer = "/status"
        present = ["succeeded"]
        "#
    );
    Catalog::from_toml_str(&text, "psp.toml")
        .expect("valid")
        .tools()[0]
        .clone()
}

fn command(tool: &Tool, epoch: u64) -> Command {
    let mut command = Command::from_intent(
        Intent {
            run_id: RunId::parse("r-abc").expect("valid"),
            command_key: CommandKey::new(3, tool.name().clone(), 0),
            semantics: tool.semantics(),
            args: json!({"amount": 5}),
            business_key: None,
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        Timestamp::from_millis(NOW - 1_000),
        10_000,
    );
    command.state.lease.epoch = LeaseEpoch::new(epoch);
    command
}

fn connector(clock: Arc<ManualClock>) -> HttpConnector {
    let signer = CallbackSigner::new(Secret::new(KEY), "https://sluice.example.com/", clock)
        .expect("a long enough key");
    HttpConnector::new()
        .expect("the client builds")
        .with_callbacks(signer)
}

#[tokio::test]
async fn the_dispatch_carries_a_callback_url_whose_token_verifies_to_the_attempt() {
    let (base, log) = upstream().await;
    let tool = tool(
        &base,
        r#"body = { amount = "{args.amount}", notify = { url = "{callback_url}" } }
        headers = { "X-Callback-Url" = "{callback_url}" }"#,
    );
    assert!(tool.uses_callback_url());
    let clock = Arc::new(ManualClock::starting_at(Timestamp::from_millis(NOW)));
    let connector = connector(Arc::clone(&clock));
    assert!(
        !format!("{connector:?}").contains(KEY),
        "the key is never printed"
    );

    let outcome = connector.dispatch(&tool, &command(&tool, 5)).await;
    let seen = log.lock().expect("unpoisoned").clone();
    assert_eq!(seen.len(), 1);
    let url = seen[0].body["notify"]["url"]
        .as_str()
        .expect("the URL in the body")
        .to_owned();
    assert_eq!(seen[0].body["amount"], 5);
    assert_eq!(
        seen[0]
            .headers
            .get("x-callback-url")
            .and_then(|v| v.to_str().ok()),
        Some(url.as_str()),
        "the same URL in the header"
    );
    let token = url
        .strip_prefix("https://sluice.example.com/v1/callbacks/")
        .expect("under the public URL");
    let claims = callback::verify(KEY.as_bytes(), token, Timestamp::from_millis(NOW))
        .expect("signed by the key");
    assert_eq!(
        claims,
        Claims {
            r: "r-abc".into(),
            k: "d-3/payouts/send/0".into(),
            e: 5,
            x: NOW + DEADLINE_MS + EXPIRY_MARGIN_MS,
        }
    );
    assert!(
        callback::verify(
            b"another-key-0123456789abcdef0123",
            token,
            Timestamp::from_millis(NOW)
        )
        .is_err()
    );
    // The answer echoed the URL: what the dispatch keeps does not hold the token.
    let DispatchOutcome::Accepted { reason, .. } = outcome else {
        panic!("202 is accepted: {outcome:?}");
    };
    assert!(reason.contains("<redacted>"), "{reason}");
    assert!(!reason.contains(token), "{reason}");

    // The next attempt (a later epoch, a later time) gets a URL of its own.
    clock.advance(std::time::Duration::from_secs(60));
    connector.dispatch(&tool, &command(&tool, 6)).await;
    let second = log.lock().expect("unpoisoned")[1].body["notify"]["url"]
        .as_str()
        .expect("a URL")
        .to_owned();
    assert_ne!(second, url);
    let token = second.rsplit('/').next().expect("a token");
    let claims = callback::verify(KEY.as_bytes(), token, Timestamp::from_millis(NOW))
        .expect("signed by the key");
    assert_eq!(claims.e, 6);
    assert_eq!(claims.x, NOW + 60_000 + DEADLINE_MS + EXPIRY_MARGIN_MS);
}

#[tokio::test]
async fn a_tool_that_does_not_name_it_is_sent_as_before() {
    let (base, log) = upstream().await;
    let plain = tool(&base, "");
    assert!(!plain.uses_callback_url());
    let clock = Arc::new(ManualClock::starting_at(Timestamp::from_millis(NOW)));
    let with_signer = connector(clock);
    let without = HttpConnector::new().expect("the client builds");
    with_signer.dispatch(&plain, &command(&plain, 1)).await;
    without.dispatch(&plain, &command(&plain, 1)).await;
    let seen = log.lock().expect("unpoisoned").clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].body,
        json!({"amount": 5}),
        "the arguments, as before"
    );
    assert_eq!(seen[0].body, seen[1].body);
    let names = |s: &Seen| {
        let mut names: Vec<String> = s
            .headers
            .keys()
            .map(|name| name.as_str().to_owned())
            .filter(|name| name != "traceparent")
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&seen[0]), names(&seen[1]));
    assert!(
        !serde_json::to_string(&seen[0].body)
            .expect("JSON")
            .contains("/v1/callbacks/")
    );
}

#[tokio::test]
async fn a_tool_naming_it_without_a_signer_is_not_sent_and_says_why() {
    let (base, log) = upstream().await;
    let tool = tool(&base, r#"body = { notify = "{callback_url}" }"#);
    let outcome = HttpConnector::new()
        .expect("the client builds")
        .dispatch(&tool, &command(&tool, 1))
        .await;
    let DispatchOutcome::NotSent { reason } = outcome else {
        panic!("not sent: {outcome:?}");
    };
    assert!(reason.contains("callback_url"), "{reason}");
    assert!(log.lock().expect("unpoisoned").is_empty());
}
