//! The HTTP connector against real HTTP upstreams on 127.0.0.1.
//!
//! Each test starts its own upstream on a fresh port: an axum server whose replies the test
//! scripts and which records every request exactly as it arrived (method, raw path and query,
//! headers, body), or a raw TCP listener for the failures axum would never produce (a
//! connection closed without an answer, a body cut short). Tools come from catalog TOML
//! pointing at that port, commands from `Command::from_intent`, as the services build them.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};
use sluice_connector::{CompensationTarget, Connector, HttpConnector, HttpOptions, StatusReport};
use sluice_core::catalog::{Catalog, Tool};
use sluice_core::command::{Command, Intent, Observation};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};
use sluice_core::time::Timestamp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------------------------------------
// The upstream
// ---------------------------------------------------------------------------------------------

/// One request as the upstream received it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    /// Path and query exactly as sent, percent-encoding included.
    target: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| {
            value
                .to_str()
                .expect("the connector sends only visible ASCII in these tests")
        })
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("the connector sends a JSON body")
    }
}

/// What the upstream answers.
#[derive(Debug, Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    /// Wait this long before answering.
    delay: Duration,
}

impl Reply {
    fn new(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    fn json(status: u16, body: Value) -> Self {
        Self::new(status, body.to_string()).header("content-type", "application/json")
    }

    fn header(mut self, name: &'static str, value: &str) -> Self {
        self.headers.push((name, value.to_owned()));
        self
    }

    fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Respond = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;

#[derive(Clone)]
struct UpstreamState {
    seen: Arc<Mutex<Vec<Seen>>>,
    respond: Respond,
}

/// A real HTTP server on 127.0.0.1:<random port>, answering every request with `respond`.
struct Upstream {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    async fn start(respond: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = UpstreamState {
            seen: Arc::clone(&seen),
            respond: Arc::new(respond),
        };
        let app = Router::new().fallback(record_and_reply).with_state(state);
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the test upstream serves until the test ends");
        });
        Self {
            base: format!("http://{addr}"),
            seen,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .expect("no test thread panics while holding the lock")
            .clone()
    }

    fn only(&self) -> Seen {
        let seen = self.seen();
        assert_eq!(seen.len(), 1, "expected exactly one request, got {seen:#?}");
        seen.into_iter().next().expect("checked above")
    }
}

async fn record_and_reply(State(state): State<UpstreamState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, 4 * 1024 * 1024)
        .await
        .expect("test bodies are small");
    let seen = Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default(),
        headers: parts.headers,
        body: body.to_vec(),
    };
    // Recorded before the reply is computed or delayed: a test whose call times out can still
    // see that the request did arrive.
    state
        .seen
        .lock()
        .expect("no test thread panics while holding the lock")
        .push(seen.clone());
    let reply = (state.respond)(&seen);
    tokio::time::sleep(reply.delay).await;
    let mut response = Response::builder().status(reply.status);
    for (name, value) in &reply.headers {
        response = response.header(*name, value);
    }
    response
        .body(Body::from(reply.body))
        .expect("the scripted reply is a valid response")
}

/// A port with nothing listening on it: bound once, then released.
async fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    listener
        .local_addr()
        .expect("a bound listener has an address")
        .port()
}

/// Reads one HTTP/1.1 request (headers and a Content-Length body) from a raw socket.
async fn read_request(socket: &mut TcpStream) -> String {
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        let read = socket
            .read(&mut chunk)
            .await
            .expect("the client sends a request");
        assert!(read > 0, "the client closed before sending a full request");
        buffer.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&buffer);
        let Some(end) = text.find("\r\n\r\n") else {
            continue;
        };
        let length = text[..end]
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        if buffer.len() >= end + 4 + length {
            return String::from_utf8_lossy(&buffer).into_owned();
        }
    }
}

/// A raw upstream that reads one full request, optionally writes `answer`, then closes the
/// connection. Returns its base URL and the request it read.
async fn raw_upstream(answer: &'static [u8]) -> (String, tokio::task::JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free loopback port");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    let handle = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("the connector connects");
        let request = read_request(&mut socket).await;
        socket
            .write_all(answer)
            .await
            .expect("the connector is still reading");
        // Dropping the socket closes the connection with nothing (more) said.
        drop(socket);
        request
    });
    (format!("http://{addr}"), handle)
}

// ---------------------------------------------------------------------------------------------
// Tools and commands
// ---------------------------------------------------------------------------------------------

/// A NON_IDEMPOTENT wire tool with all three connectors, pointed at a test upstream.
#[derive(Debug, Clone, Copy)]
struct Wire<'a> {
    base: &'a str,
    /// Path and query of the dispatch URL template.
    dispatch_path: &'a str,
    /// Extra `[tool.dispatch]` lines (a reference source).
    dispatch_extra: &'a str,
    dispatch_timeout_ms: u64,
    status_timeout_ms: u64,
    status_check: bool,
    compensate: bool,
}

impl<'a> Wire<'a> {
    fn at(base: &'a str) -> Self {
        Self {
            base,
            dispatch_path: "/wires",
            dispatch_extra: "",
            dispatch_timeout_ms: 2_000,
            status_timeout_ms: 2_000,
            status_check: true,
            compensate: true,
        }
    }

    fn tool(self) -> Tool {
        let mut text = String::from(
            r#"
            [[tool]]
            name = "payments/wire"
            semantics = "NON_IDEMPOTENT"
            business_key = "{account}:{amount_minor}"
            schema = { type = "object", required = ["account", "amount_minor", "memo"], properties = { account = { type = "string" }, amount_minor = { type = "integer" }, memo = { type = "string" } } }
            [tool.dispatch]
            url = "BASE_DISPATCH_PATH"
            timeout_ms = DISPATCH_TIMEOUT
            DISPATCH_EXTRA
            "#,
        );
        if self.status_check {
            text.push_str(
                r#"
                [tool.status_check]
                url = "BASE/wires/by-key/{business_key}?run={run_id}"
                timeout_ms = STATUS_TIMEOUT
                absent_status = [404]
                duplicate_status = [409]
                "#,
            );
        }
        if self.compensate {
            text.push_str(
                r#"
                [tool.compensate]
                url = "BASE/wires/{external_ref}/reverse"
                "#,
            );
        }
        tool_from(
            &text
                .replace("_DISPATCH_PATH", self.dispatch_path)
                .replace("BASE", self.base)
                .replace("DISPATCH_TIMEOUT", &self.dispatch_timeout_ms.to_string())
                .replace("STATUS_TIMEOUT", &self.status_timeout_ms.to_string())
                .replace("DISPATCH_EXTRA", self.dispatch_extra),
        )
    }
}

/// The wire tool with its defaults, at `base`.
fn wire_tool(base: &str) -> Tool {
    Wire::at(base).tool()
}

fn tool_from(text: &str) -> Tool {
    let catalog =
        Catalog::from_toml_str(text, "test-catalog.toml").expect("the test catalog is valid");
    catalog.tools()[0].clone()
}

fn args() -> Value {
    json!({"account": "acc 1", "amount_minor": 125000, "memo": "rent"})
}

/// The command an agent's call `d-3/<tool>/0` in run `r-abc` becomes.
fn command_for(tool: &Tool, args: Value) -> Command {
    tool.validate_args(&args)
        .expect("the test arguments fit the schema");
    let intent = Intent {
        run_id: RunId::parse("r-abc").expect("valid run id"),
        command_key: CommandKey::new(3, tool.name().clone(), 0),
        semantics: tool.semantics(),
        business_key: tool.business_key(&args).expect("renders"),
        args,
        policy_version: "1".into(),
        max_attempts: 3,
        not_before: None,
    };
    Command::from_intent(intent, Timestamp::from_millis(1_700_000_000_000), 10_000)
}

fn connector() -> HttpConnector {
    HttpConnector::new().expect("the HTTP client builds")
}

// ---------------------------------------------------------------------------------------------
// Dispatch
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_2xx_dispatch_commits_with_the_body_reference_and_sends_the_contract_headers() {
    let upstream =
        Upstream::start(|_| Reply::json(201, json!({"id": "w-1", "state": "sent"}))).await;
    let tool = wire_tool(&upstream.base);
    let command = command_for(&tool, args());

    let outcome = connector().dispatch(&tool, &command).await;

    assert_eq!(
        outcome,
        DispatchOutcome::Committed {
            external_ref: Some("w-1".into()),
            result: Some(Arc::new(json!({"id": "w-1", "state": "sent"}))),
        }
    );
    let seen = upstream.only();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.target, "/wires");
    assert_eq!(
        seen.header("idempotency-key"),
        Some("r-abc/d-3/payments/wire/0")
    );
    assert_eq!(seen.header("x-sluice-run-id"), Some("r-abc"));
    assert_eq!(
        seen.header("x-sluice-command-key"),
        Some("d-3/payments/wire/0")
    );
    assert_eq!(seen.header("x-sluice-business-key"), Some("acc 1:125000"));
    assert_eq!(seen.header("content-type"), Some("application/json"));
    assert_eq!(seen.json(), args(), "the body is the command's arguments");
    assert!(
        seen.headers.get("authorization").is_none(),
        "no credentials are invented"
    );
}

#[tokio::test]
async fn a_tool_without_a_business_key_sends_no_business_key_header() {
    let upstream = Upstream::start(|_| Reply::json(200, json!({"id": "t-1"}))).await;
    let tool = tool_from(&format!(
        r#"
        [[tool]]
        name = "tickets/open"
        semantics = "IDEMPOTENT"
        schema = {{ type = "object" }}
        [tool.dispatch]
        url = "{}/tickets"
        "#,
        upstream.base
    ));
    let command = command_for(&tool, json!({"title": "disk full"}));

    let outcome = connector().dispatch(&tool, &command).await;

    assert!(
        matches!(outcome, DispatchOutcome::Committed { .. }),
        "{outcome:?}"
    );
    let seen = upstream.only();
    assert_eq!(
        seen.header("idempotency-key"),
        Some("r-abc/d-3/tickets/open/0")
    );
    assert_eq!(seen.header("x-sluice-business-key"), None);
}

#[tokio::test]
async fn the_reference_can_come_from_a_header_and_a_text_result_is_kept_as_a_string() {
    let upstream = Upstream::start(|_| {
        Reply::new(202, "queued for settlement").header("location", "/wires/w-9")
    })
    .await;
    let tool = Wire {
        dispatch_extra: r#"reference_header = "Location""#,
        ..Wire::at(&upstream.base)
    }
    .tool();
    let command = command_for(&tool, args());

    let outcome = connector().dispatch(&tool, &command).await;

    assert_eq!(
        outcome,
        DispatchOutcome::Committed {
            external_ref: Some("/wires/w-9".into()),
            result: Some(Arc::new(json!("queued for settlement"))),
        }
    );
}

#[tokio::test]
async fn a_nested_reference_pointer_reads_numbers_as_their_text() {
    let upstream = Upstream::start(|_| Reply::json(200, json!({"data": {"wire": 4711}}))).await;
    let tool = Wire {
        dispatch_extra: r#"reference_pointer = "/data/wire""#,
        ..Wire::at(&upstream.base)
    }
    .tool();

    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    let DispatchOutcome::Committed { external_ref, .. } = outcome else {
        panic!("expected committed, got {outcome:?}");
    };
    assert_eq!(external_ref.as_deref(), Some("4711"));
}

#[tokio::test]
async fn definitive_4xx_answers_are_refusals_with_the_status_and_a_capped_excerpt() {
    for code in [400_u16, 401, 403, 404, 409, 422] {
        let upstream =
            Upstream::start(move |_| Reply::json(code, json!({"error": "insufficient funds"})))
                .await;
        let tool = wire_tool(&upstream.base);

        let outcome = connector()
            .dispatch(&tool, &command_for(&tool, args()))
            .await;

        assert_eq!(
            outcome,
            DispatchOutcome::Refused {
                reason: format!(r#"HTTP {code}: {{"error":"insufficient funds"}}"#)
            },
            "HTTP {code}"
        );
        assert_eq!(
            upstream.seen().len(),
            1,
            "a refusal is not retried by the connector"
        );
    }

    let upstream = Upstream::start(|_| Reply::new(400, "e".repeat(100_000))).await;
    let tool = wire_tool(&upstream.base);
    let DispatchOutcome::Refused { reason } = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await
    else {
        panic!("400 is a refusal");
    };
    assert!(reason.starts_with("HTTP 400: eee"), "{reason}");
    assert!(
        reason.len() <= "HTTP 400: ".len() + 512 + '…'.len_utf8(),
        "excerpt capped: {} bytes",
        reason.len()
    );
}

#[tokio::test]
async fn not_now_4xx_and_5xx_answers_are_ambiguous_not_refused() {
    for code in [408_u16, 425, 429, 500, 502, 503, 504] {
        let upstream = Upstream::start(move |_| Reply::new(code, "try later")).await;
        let tool = wire_tool(&upstream.base);

        let outcome = connector()
            .dispatch(&tool, &command_for(&tool, args()))
            .await;

        assert_eq!(
            outcome,
            DispatchOutcome::Ambiguous {
                reason: format!("HTTP {code}: try later")
            },
            "HTTP {code}"
        );
        assert_eq!(
            upstream.seen().len(),
            1,
            "HTTP {code} is not retried by the connector"
        );
    }
}

/// A 429 or 503 with `Retry-After` (seconds or an HTTP-date), and a 403 with it (GitHub's
/// secondary rate limit), ask for a later call: the connector reports the delay and leaves the
/// decision to the core. Without the header, or with one that is not a delay, the answer is
/// read as before.
#[tokio::test]
async fn a_429_503_or_403_with_retry_after_asks_for_a_later_call() {
    let in_a_minute = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(61));
    let cases: [(u16, String, i64, bool); 4] = [
        (429, "1".into(), 1_000, false),
        (503, "120".into(), 120_000, false),
        (403, "60".into(), 60_000, true),
        (429, in_a_minute, 60_000, false),
    ];
    for (code, retry_after, at_least_ms, refusal) in cases {
        let header = retry_after.clone();
        let upstream =
            Upstream::start(move |_| Reply::new(code, "slow down").header("retry-after", &header))
                .await;
        let tool = wire_tool(&upstream.base);
        let outcome = connector()
            .dispatch(&tool, &command_for(&tool, args()))
            .await;
        let DispatchOutcome::RateLimited {
            reason,
            retry_after_ms,
            refusal: read_as_refusal,
        } = outcome
        else {
            panic!("HTTP {code} Retry-After {retry_after}: {outcome:?}");
        };
        assert!(
            // An HTTP-date counts whole seconds.
            (at_least_ms - 1_000..=at_least_ms + 1_000).contains(&retry_after_ms),
            "HTTP {code} Retry-After {retry_after}: {retry_after_ms} ms"
        );
        assert_eq!(read_as_refusal, refusal, "HTTP {code}");
        assert!(
            reason.starts_with(&format!("HTTP {code}: slow down")),
            "{reason}"
        );
        assert_eq!(
            upstream.seen().len(),
            1,
            "the connector does not wait or retry"
        );
    }
    // Without the header, or with one that is no delay: as before.
    for (code, header) in [
        (429_u16, None),
        (429, Some("-1")),
        (503, Some("soon")),
        (500, Some("1")),
    ] {
        let upstream = Upstream::start(move |_| {
            let reply = Reply::new(code, "later");
            match header {
                Some(value) => reply.header("retry-after", value),
                None => reply,
            }
        })
        .await;
        let tool = wire_tool(&upstream.base);
        let outcome = connector()
            .dispatch(&tool, &command_for(&tool, args()))
            .await;
        assert!(
            matches!(outcome, DispatchOutcome::Ambiguous { .. }),
            "HTTP {code} Retry-After {header:?}: {outcome:?}"
        );
    }
    let upstream = Upstream::start(|_| Reply::new(403, "forbidden")).await;
    let tool = wire_tool(&upstream.base);
    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;
    assert!(
        matches!(outcome, DispatchOutcome::Refused { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_status_check_answered_429_with_retry_after_is_inconclusive_and_carries_the_delay() {
    let (report, _) = check(Reply::new(429, "slow down").header("retry-after", "2")).await;
    assert_eq!(report.observation, Observation::Inconclusive);
    assert_eq!(report.retry_after_ms, Some(2_000));
    assert_eq!(report.evidence["http_status"], json!(429));
    assert_eq!(report.evidence["retry_after_ms"], json!(2_000));
    let event: sluice_core::machine::Event = report.into();
    assert!(
        matches!(
            event,
            sluice_core::machine::Event::Observed {
                retry_after_ms: Some(2_000),
                ..
            }
        ),
        "{event:?}"
    );
    // A status the tool declares wins: its 404 is absent whatever the headers say.
    let (report, _) = check(Reply::new(404, "none").header("retry-after", "2")).await;
    assert_eq!(report.observation, Observation::Absent);
    assert_eq!(report.retry_after_ms, None);
    // Without the header: an inconclusive look, counted as before.
    let (report, _) = check(Reply::new(503, "down")).await;
    assert_eq!(report.observation, Observation::Inconclusive);
    assert_eq!(report.retry_after_ms, None);
}

/// An upstream that answers 409 while a request with the same idempotency key is in progress
/// (Stripe, the IETF idempotency-key draft) declares it: such a 409 is ambiguous, so the
/// earlier request's commit is reconciled instead of the command being recorded FAILED.
#[tokio::test]
async fn a_status_the_tool_declares_in_progress_is_ambiguous_not_refused() {
    let upstream = Upstream::start(|_| {
        Reply::json(
            409,
            json!({"error": "a request with this idempotency key is in progress"}),
        )
    })
    .await;
    let tool = Wire {
        dispatch_extra: "in_progress_status = [409]",
        ..Wire::at(&upstream.base)
    }
    .tool();
    assert_eq!(tool.dispatch().in_progress_status, [409]);

    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    let DispatchOutcome::Ambiguous { reason } = outcome else {
        panic!("a declared in-progress 409 is ambiguous: {outcome:?}");
    };
    assert!(reason.starts_with("HTTP 409: "), "{reason}");
    assert!(reason.contains("still in progress upstream"), "{reason}");
    // Without the declaration the same answer is a refusal, as the wire contract has it.
    let plain = wire_tool(&upstream.base);
    assert!(matches!(
        connector()
            .dispatch(&plain, &command_for(&plain, args()))
            .await,
        DispatchOutcome::Refused { .. }
    ));
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_is_ambiguous() {
    let upstream = Upstream::start(|seen| {
        if seen.target == "/wires" {
            Reply::new(303, "").header("location", "/elsewhere")
        } else {
            Reply::json(200, json!({"id": "via-redirect"}))
        }
    })
    .await;
    let tool = wire_tool(&upstream.base);

    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    assert!(
        matches!(outcome, DispatchOutcome::Ambiguous { ref reason } if reason.starts_with("HTTP 303")),
        "{outcome:?}"
    );
    assert_eq!(
        upstream.only().target,
        "/wires",
        "the redirect was not followed"
    );
}

#[tokio::test]
async fn an_answer_slower_than_the_tool_timeout_is_ambiguous() {
    let upstream =
        Upstream::start(|_| Reply::json(201, json!({"id": "late"})).after(Duration::from_secs(5)))
            .await;
    let fast = Wire {
        dispatch_timeout_ms: 300,
        ..Wire::at(&upstream.base)
    }
    .tool();

    let started = Instant::now();
    let outcome = connector()
        .dispatch(&fast, &command_for(&fast, args()))
        .await;
    let took = started.elapsed();

    let DispatchOutcome::Ambiguous { reason } = outcome else {
        panic!("expected ambiguous, got {outcome:?}");
    };
    assert!(reason.contains("no answer within 300 ms"), "{reason}");
    assert!(
        took < Duration::from_secs(3),
        "the tool's timeout applies, took {took:?}"
    );
    assert_eq!(
        upstream.seen().len(),
        1,
        "the request did reach the upstream"
    );
}

#[tokio::test]
async fn a_connection_closed_after_the_request_without_an_answer_is_ambiguous() {
    let (base, upstream) = raw_upstream(b"").await;
    let tool = wire_tool(&base);

    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    let DispatchOutcome::Ambiguous { reason } = outcome else {
        panic!("expected ambiguous, got {outcome:?}");
    };
    assert!(reason.contains("after the request was sent"), "{reason}");
    let request = upstream.await.expect("the raw upstream read the request");
    assert!(request.starts_with("POST /wires HTTP/1.1\r\n"), "{request}");
    assert!(
        request
            .to_ascii_lowercase()
            .contains("idempotency-key: r-abc/d-3/payments/wire/0"),
        "the whole request was sent before the close: {request}"
    );
}

#[tokio::test]
async fn a_2xx_whose_body_is_cut_off_is_ambiguous() {
    let (base, upstream) = raw_upstream(
        b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\": \"w",
    )
    .await;
    let tool = wire_tool(&base);

    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    let DispatchOutcome::Ambiguous { reason } = outcome else {
        panic!("expected ambiguous, got {outcome:?}");
    };
    assert!(
        reason.starts_with("HTTP 201, but the response body was cut off"),
        "{reason}"
    );
    upstream.await.expect("the raw upstream read the request");
}

#[tokio::test]
async fn nothing_listening_is_not_sent() {
    let port = free_port().await;
    let tool = wire_tool(&format!("http://127.0.0.1:{port}"));

    let started = Instant::now();
    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    let DispatchOutcome::NotSent { reason } = outcome else {
        panic!("expected not sent, got {outcome:?}");
    };
    assert!(
        reason.starts_with("not sent: could not connect"),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a refused connect fails fast"
    );
}

#[tokio::test]
async fn an_unresolvable_host_is_not_sent() {
    // `.invalid` is reserved (RFC 6761) and never resolves. The timeout is generous so that a
    // slow resolver still fails the lookup (a connect error) before the call's budget runs out.
    let tool = Wire {
        dispatch_timeout_ms: 20_000,
        ..Wire::at("http://sluice-upstream.invalid")
    }
    .tool();

    let outcome = connector()
        .dispatch(&tool, &command_for(&tool, args()))
        .await;

    assert!(
        matches!(outcome, DispatchOutcome::NotSent { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn url_templates_percent_encode_argument_fields() {
    let upstream = Upstream::start(|_| Reply::json(200, json!({"id": "x"}))).await;
    let tool = Wire {
        dispatch_path: "/accounts/{account}/wires?memo={memo}",
        ..Wire::at(&upstream.base)
    }
    .tool();
    let command = command_for(
        &tool,
        json!({"account": "acc 1/é", "amount_minor": 5, "memo": "a&b=c"}),
    );

    let outcome = connector().dispatch(&tool, &command).await;

    assert!(
        matches!(outcome, DispatchOutcome::Committed { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        upstream.only().target,
        "/accounts/acc%201%2F%C3%A9/wires?memo=a%26b%3Dc"
    );
}

#[tokio::test]
async fn a_response_larger_than_the_cap_is_read_only_up_to_the_cap() {
    let upstream = Upstream::start(|_| Reply::new(200, "z".repeat(200_000))).await;
    // A reference is not required here, so the capped body's effect is a commit.
    let tool = Wire {
        dispatch_extra: "require_reference = false",
        ..Wire::at(&upstream.base)
    }
    .tool();
    let connector = HttpConnector::with_options(HttpOptions {
        max_response_bytes: 1024,
        ..HttpOptions::default()
    })
    .expect("the HTTP client builds");

    let outcome = connector.dispatch(&tool, &command_for(&tool, args())).await;

    let DispatchOutcome::Committed {
        external_ref,
        result,
    } = outcome
    else {
        panic!("expected committed, got {outcome:?}");
    };
    assert_eq!(external_ref, None);
    assert_eq!(result, Some(Arc::new(Value::String("z".repeat(1024)))));
}

// ---------------------------------------------------------------------------------------------
// Status check
// ---------------------------------------------------------------------------------------------

async fn check(reply: Reply) -> (StatusReport, Seen) {
    let upstream = Upstream::start(move |_| reply.clone()).await;
    let tool = wire_tool(&upstream.base);
    let report = connector()
        .status_check(&tool, &command_for(&tool, args()))
        .await;
    (report, upstream.only())
}

#[tokio::test]
async fn a_2xx_status_answer_is_present_with_its_reference() {
    let (report, seen) = check(Reply::json(200, json!({"id": "w-1", "state": "settled"}))).await;

    assert_eq!(report.observation, Observation::Present);
    assert_eq!(report.external_ref.as_deref(), Some("w-1"));
    assert_eq!(report.evidence["http_status"], json!(200));
    assert_eq!(report.evidence["request"]["method"], json!("GET"));
    assert_eq!(seen.method, "GET");
    assert_eq!(
        seen.target, "/wires/by-key/acc%201%3A125000?run=r-abc",
        "the business key is one percent-encoded path segment"
    );
    assert_eq!(
        seen.header("idempotency-key"),
        Some("r-abc/d-3/payments/wire/0")
    );
    assert_eq!(seen.header("x-sluice-run-id"), Some("r-abc"));
    assert_eq!(
        seen.header("x-sluice-command-key"),
        Some("d-3/payments/wire/0")
    );
    assert_eq!(seen.header("x-sluice-business-key"), Some("acc 1:125000"));
    assert!(seen.body.is_empty(), "a GET carries no body");
}

#[tokio::test]
async fn a_404_status_answer_is_absent() {
    let (report, _) = check(Reply::new(404, "no such wire")).await;

    assert_eq!(report.observation, Observation::Absent);
    assert_eq!(report.external_ref, None);
    assert_eq!(report.evidence["http_status"], json!(404));
    assert_eq!(report.evidence["body"], json!("no such wire"));
}

#[tokio::test]
async fn a_409_status_answer_is_a_duplicate_with_every_commit_in_evidence() {
    let (report, _) = check(Reply::json(409, json!({"refs": ["w-1", "w-2"]}))).await;

    assert_eq!(report.observation, Observation::Duplicate);
    assert_eq!(report.external_ref.as_deref(), Some("w-1"));
    assert_eq!(report.evidence["refs"], json!(["w-1", "w-2"]));
    assert_eq!(report.extra_commits(), ["w-2"]);
}

#[tokio::test]
async fn other_status_answers_are_inconclusive_with_the_status_and_an_excerpt() {
    for code in [500_u16, 503, 400, 429] {
        let (report, _) = check(Reply::new(code, "x".repeat(5_000))).await;

        assert_eq!(report.observation, Observation::Inconclusive, "HTTP {code}");
        assert_eq!(report.external_ref, None);
        assert_eq!(report.evidence["http_status"], json!(code));
        assert_eq!(report.evidence["body_truncated"], json!(true));
        let body = report.evidence["body"].as_str().expect("an excerpt");
        assert!(
            body.len() <= 512 + '…'.len_utf8(),
            "excerpt capped: {}",
            body.len()
        );
    }
}

#[tokio::test]
async fn a_status_check_that_times_out_or_cannot_connect_is_inconclusive() {
    let upstream =
        Upstream::start(|_| Reply::json(200, json!({"id": "w"})).after(Duration::from_secs(5)))
            .await;
    let tool = Wire {
        status_timeout_ms: 200,
        ..Wire::at(&upstream.base)
    }
    .tool();
    assert_eq!(
        tool.status_check().map(|endpoint| endpoint.timeout_ms),
        Some(200)
    );

    let report = connector()
        .status_check(&tool, &command_for(&tool, args()))
        .await;

    assert_eq!(report.observation, Observation::Inconclusive);
    assert_eq!(report.evidence["timed_out"], json!(true));

    let port = free_port().await;
    let tool = wire_tool(&format!("http://127.0.0.1:{port}"));
    let report = connector()
        .status_check(&tool, &command_for(&tool, args()))
        .await;
    assert_eq!(report.observation, Observation::Inconclusive);
    assert_eq!(report.evidence["timed_out"], json!(false));
    let error = report.evidence["error"]
        .as_str()
        .expect("the transport error");
    assert!(error.contains("could not connect"), "{error}");
}

#[tokio::test]
async fn a_tool_without_a_status_check_is_inconclusive_and_says_why() {
    let upstream = Upstream::start(|_| Reply::new(200, "")).await;
    let tool = Wire {
        status_check: false,
        ..Wire::at(&upstream.base)
    }
    .tool();
    assert!(tool.status_check().is_none());

    let report = connector()
        .status_check(&tool, &command_for(&tool, args()))
        .await;

    assert_eq!(report.observation, Observation::Inconclusive);
    assert_eq!(
        report.evidence["error"],
        json!("tool payments/wire declares no status_check, so the effect cannot be observed")
    );
    assert!(upstream.seen().is_empty(), "nothing is sent");
}

// ---------------------------------------------------------------------------------------------
// Compensate
// ---------------------------------------------------------------------------------------------

fn confirmed(tool: &Tool, external_ref: &str) -> Command {
    let mut command = command_for(tool, args());
    command.state.external_ref = Some(external_ref.to_owned());
    command
}

#[tokio::test]
async fn a_2xx_compensation_is_done_and_sends_args_and_reference() {
    let upstream = Upstream::start(|_| Reply::json(200, json!({"id": "rev-1"}))).await;
    let tool = wire_tool(&upstream.base);
    let command = confirmed(&tool, "w/1");

    let outcome = connector()
        .compensate(&tool, &command, CompensationTarget::OwnCommit)
        .await;

    assert_eq!(
        outcome,
        CompensationOutcome::Done {
            reference: Some("rev-1".into())
        }
    );
    let seen = upstream.only();
    assert_eq!(seen.method, "POST");
    assert_eq!(
        seen.target, "/wires/w%2F1/reverse",
        "the reference is one path segment"
    );
    assert_eq!(seen.json(), json!({"args": args(), "external_ref": "w/1"}));
    // A key of its own, tied to the dispatch by a header: an upstream that refuses a key
    // reused on another endpoint accepts it.
    assert_eq!(
        seen.header("idempotency-key"),
        Some("r-abc/d-3/payments/wire/0/compensate")
    );
    assert_eq!(
        seen.header("x-sluice-dispatch-idempotency-key"),
        Some("r-abc/d-3/payments/wire/0")
    );
    assert_eq!(seen.header("x-sluice-run-id"), Some("r-abc"));
    assert_eq!(
        seen.header("x-sluice-command-key"),
        Some("d-3/payments/wire/0")
    );
    assert_eq!(seen.header("x-sluice-business-key"), Some("acc 1:125000"));
}

#[tokio::test]
async fn an_extra_commit_is_compensated_by_its_own_reference() {
    let upstream = Upstream::start(|_| Reply::new(204, "")).await;
    let tool = wire_tool(&upstream.base);
    let command = confirmed(&tool, "w-1");

    let outcome = connector()
        .compensate(
            &tool,
            &command,
            CompensationTarget::ExtraCommit {
                external_ref: "w-2".into(),
            },
        )
        .await;

    assert_eq!(outcome, CompensationOutcome::Done { reference: None });
    let seen = upstream.only();
    assert_eq!(seen.target, "/wires/w-2/reverse");
    assert_eq!(seen.json()["external_ref"], json!("w-2"));
    assert_eq!(
        seen.header("idempotency-key"),
        Some("r-abc/d-3/payments/wire/0/compensate/w-2"),
        "each extra commit's compensation has a key of its own"
    );
}

#[tokio::test]
async fn a_4xx_compensation_is_impossible() {
    let upstream = Upstream::start(|_| Reply::new(422, "wire already settled")).await;
    let tool = wire_tool(&upstream.base);

    let outcome = connector()
        .compensate(
            &tool,
            &confirmed(&tool, "w-1"),
            CompensationTarget::OwnCommit,
        )
        .await;

    assert_eq!(
        outcome,
        CompensationOutcome::Impossible {
            reason: "HTTP 422: wire already settled".into()
        }
    );
}

/// A compensation answered 429 (or 503, or GitHub's 403) with `Retry-After` says when to call
/// again: the outcome carries the delay for the core to wait out; without the header it is a
/// plain retry (a 403 a refusal), as before.
#[tokio::test]
async fn a_rate_limited_compensation_carries_its_retry_after() {
    for (code, header, expected) in [
        (429, Some("2"), Some(2_000)),
        (503, Some("1"), Some(1_000)),
        (403, Some("3"), Some(3_000)),
        (429, None, None),
    ] {
        let upstream = Upstream::start(move |_| {
            let reply = Reply::new(code, "slow down");
            match header {
                Some(value) => reply.header("retry-after", value),
                None => reply,
            }
        })
        .await;
        let tool = wire_tool(&upstream.base);
        let outcome = connector()
            .compensate(
                &tool,
                &confirmed(&tool, "w-1"),
                CompensationTarget::OwnCommit,
            )
            .await;
        match outcome {
            CompensationOutcome::Retry { retry_after_ms, .. } => {
                assert_eq!(retry_after_ms, expected, "{code} {header:?}");
            }
            other => panic!("{code} {header:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_5xx_or_unreachable_compensation_is_retried() {
    let upstream = Upstream::start(|_| Reply::new(503, "maintenance")).await;
    let tool = wire_tool(&upstream.base);

    let outcome = connector()
        .compensate(
            &tool,
            &confirmed(&tool, "w-1"),
            CompensationTarget::OwnCommit,
        )
        .await;

    assert_eq!(
        outcome,
        CompensationOutcome::Retry {
            reason: "HTTP 503: maintenance".into(),
            retry_after_ms: None,
        }
    );

    let port = free_port().await;
    let tool = wire_tool(&format!("http://127.0.0.1:{port}"));
    let outcome = connector()
        .compensate(
            &tool,
            &confirmed(&tool, "w-1"),
            CompensationTarget::OwnCommit,
        )
        .await;
    assert!(
        matches!(outcome, CompensationOutcome::Retry { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn compensating_a_commit_without_a_reference_or_a_tool_without_compensate_is_impossible() {
    let upstream = Upstream::start(|_| Reply::new(200, "")).await;
    let tool = wire_tool(&upstream.base);
    let never_confirmed = command_for(&tool, args());

    let outcome = connector()
        .compensate(&tool, &never_confirmed, CompensationTarget::OwnCommit)
        .await;

    let CompensationOutcome::Impossible { reason } = outcome else {
        panic!("expected impossible, got {outcome:?}");
    };
    assert!(reason.contains("external_ref"), "{reason}");

    let tool = Wire {
        compensate: false,
        ..Wire::at(&upstream.base)
    }
    .tool();
    assert!(tool.compensate().is_none());
    let outcome = connector()
        .compensate(
            &tool,
            &confirmed(&tool, "w-1"),
            CompensationTarget::OwnCommit,
        )
        .await;
    assert_eq!(
        outcome,
        CompensationOutcome::Impossible {
            reason: "tool payments/wire declares no compensate, so the commit cannot be undone automatically".into()
        }
    );
    assert!(upstream.seen().is_empty(), "nothing is sent");
}

#[tokio::test]
async fn the_connector_is_usable_as_a_shared_trait_object() {
    let upstream = Upstream::start(|_| Reply::json(200, json!({"id": "w-1"}))).await;
    let tool = wire_tool(&upstream.base);
    let shared: Arc<dyn Connector> = Arc::new(connector());

    let calls = (0..4).map(|_| {
        let shared = Arc::clone(&shared);
        let tool = tool.clone();
        tokio::spawn(async move { shared.dispatch(&tool, &command_for(&tool, args())).await })
    });
    for call in calls {
        let outcome = call.await.expect("the dispatch task completes");
        assert!(
            matches!(outcome, DispatchOutcome::Committed { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(upstream.seen().len(), 4);
    assert!(format!("{shared:?}").contains("HttpConnector"));
}

#[test]
fn the_status_report_becomes_the_machine_event() {
    let report = StatusReport {
        observation: Observation::Duplicate,
        external_ref: Some("w-1".into()),
        evidence: json!({"refs": ["w-1", "w-2"]}),
        retry_after_ms: None,
        record: None,
    };
    let event: sluice_core::machine::Event = report.into();
    assert_eq!(
        event,
        sluice_core::machine::Event::Observed {
            observation: Observation::Duplicate,
            external_ref: Some("w-1".into()),
            evidence: json!({"refs": ["w-1", "w-2"]}),
            extra_refs: vec!["w-2".into()],
            retry_after_ms: None,
            record: None,
        }
    );
}
