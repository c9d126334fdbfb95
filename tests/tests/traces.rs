//! Traces end to end: one effect submitted with a W3C `traceparent` is one trace, exported over
//! OTLP to a real OpenTelemetry Collector and read back from the collector's file exporter.
//!
//! The collector is the one `scripts/otelcol/install.sh` builds from the Go module proxy (an
//! OTLP receiver and the file exporter); its path is `SLUICE_OTELCOL_BIN`, else the cache's.
//! Without it the test is skipped with a message saying how to get it; `scripts/test.sh`
//! installs it. The pipeline runs in this process on the embedded bus, but every hop between
//! services goes through a bus message and its headers (each consumer's span is parented on
//! the message's `traceparent`, nothing else), and the upstream is a loopback server of this
//! test that records the `traceparent` of each request it gets.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::{Request, State};
use serde_json::{Value, json};
use sluice_runtime::config::TelemetryConfig;
use sluice_tests::processes::free_port;
use sluice_tests::*;

/// The agent's trace: the test's own trace id and span id.
const TRACE_ID: &str = "5e1c0ffee0ddba11deadbeefcafe0001";
const AGENT_SPAN: &str = "a9e117ace0ffee01";

fn collector_or_skip() -> Option<PathBuf> {
    let path = std::env::var_os("SLUICE_OTELCOL_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            let home = std::env::var_os("HOME")?;
            Some(Path::new(&home).join(".cache/sluice/otelcol/v0.161.0/sluice-otelcol"))
        })?;
    if path.exists() {
        return Some(path);
    }
    let _ = writeln!(
        std::io::stderr(),
        "no OpenTelemetry Collector at {}: the trace export test is skipped \
         (scripts/otelcol/install.sh builds one; scripts/test.sh runs it)",
        path.display()
    );
    None
}

/// The collector process; killed when dropped.
struct Collector {
    child: Child,
    log: PathBuf,
    output: PathBuf,
    endpoint: String,
}

impl Collector {
    fn start(bin: &Path, dir: &Path) -> Self {
        let port = free_port();
        let output = dir.join("traces.jsonl");
        let config = dir.join("otelcol.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{port}\n\
                 exporters:\n  file:\n    path: {}\n    format: json\n    flush_interval: 100ms\n\
                 service:\n  telemetry:\n    metrics:\n      level: none\n  pipelines:\n    traces:\n      receivers: [otlp]\n      exporters: [file]\n",
                output.display()
            ),
        )
        .expect("the collector's configuration is written");
        let log = dir.join("otelcol.log");
        let out = std::fs::File::create(&log).expect("a log file");
        let err = out.try_clone().expect("a second handle");
        let child = Process::new(bin)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("the collector starts");
        let collector = Self {
            child,
            log,
            output,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the collector did not listen within 30 s:\n{}",
                collector.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        collector
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every span the file exporter wrote so far, flattened.
    fn spans(&self) -> Vec<Span> {
        let text = std::fs::read_to_string(&self.output).unwrap_or_default();
        let mut spans = Vec::new();
        for line in text.lines().filter(|line| !line.trim().is_empty()) {
            let Ok(batch) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            for resource in batch["resourceSpans"].as_array().into_iter().flatten() {
                let service = resource["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["key"] == "service.name")
                    .and_then(|a| a["value"]["stringValue"].as_str())
                    .unwrap_or_default()
                    .to_owned();
                for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                    for span in scope["spans"].as_array().into_iter().flatten() {
                        spans.push(Span::of(span, &service));
                    }
                }
            }
        }
        spans
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone)]
struct Span {
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    kind: i64,
    service: String,
    attributes: Value,
}

impl Span {
    fn of(span: &Value, service: &str) -> Self {
        let text = |key: &str| span[key].as_str().unwrap_or_default().to_owned();
        Self {
            trace_id: text("traceId"),
            span_id: text("spanId"),
            parent: text("parentSpanId"),
            name: text("name"),
            kind: span["kind"].as_i64().unwrap_or_default(),
            service: service.to_owned(),
            attributes: span["attributes"].clone(),
        }
    }

    /// The attribute's last value (a field recorded again is exported again).
    fn attribute(&self, key: &str) -> Option<String> {
        self.attributes
            .as_array()?
            .iter()
            .rev()
            .find(|a| a["key"] == key)
            .map(|a| {
                let value = &a["value"];
                value["stringValue"]
                    .as_str()
                    .map(str::to_owned)
                    .or_else(|| value["intValue"].as_str().map(str::to_owned))
                    .unwrap_or_else(|| value.to_string())
            })
    }
}

/// One request the upstream saw: its method, path and `traceparent`.
type SeenRequest = (String, String, Option<String>);

/// What the upstream saw, in order.
#[derive(Debug, Clone, Default)]
struct Seen(Arc<Mutex<Vec<SeenRequest>>>);

/// A loopback upstream: every request is a success naming reference `w-1` (a wire's dispatch,
/// and its status check finding it), and is recorded.
async fn start_recorder() -> (Seen, SocketAddr) {
    async fn answer(State(seen): State<Seen>, request: Request) -> Json<Value> {
        let traceparent = request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        seen.0.lock().expect("not poisoned").push((
            request.method().to_string(),
            request.uri().path().to_owned(),
            traceparent,
        ));
        Json(json!({ "id": "w-1", "status": "settled" }))
    }
    let seen = Seen::default();
    let app = axum::Router::new()
        .fallback(answer)
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("bound");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (seen, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_effect_is_one_trace_from_the_agents_call_to_the_upstream_and_back() {
    let Some(bin) = collector_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let collector = Collector::start(&bin, dir.path());
    sluice_runtime::telemetry::init(&TelemetryConfig {
        log_level: std::env::var("SLUICE_TEST_LOG").unwrap_or_else(|_| "warn".into()),
        otlp_endpoint: Some(collector.endpoint.clone()),
        service_name: Some("sluice-trace-test".into()),
        ..TelemetryConfig::default()
    });

    let (seen, upstream) = start_recorder().await;
    // A NON_IDEMPOTENT wire, so the dispatcher takes a lease of its own, with its last look
    // soon after the commit, so the reconciler's status check joins the trace too.
    let catalog = CatalogEdit::example(&format!("http://{upstream}"))
        .policy("payments/wire", "late_commit_ms", 500_i64)
        .policy("payments/wire", "settle_ms", 300_i64)
        .policy("payments/wire", "verify_after_ms", 1_000_i64)
        .build();
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());
    let pipeline = start_pipeline(&config, catalog).await;

    let traceparent = format!("00-{TRACE_ID}-{AGENT_SPAN}-01");
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/effects", pipeline.url()))
        .header("traceparent", &traceparent)
        .header("tracestate", "agent=run-7")
        .header("prefer", "wait=20")
        .json(&json!({
            "run_id": "r-traced", "decision": 1, "tool": "payments/wire", "call_idx": 0,
            "args": {"account": "acc-1", "amount_minor": 1250, "beneficiary": "b-9", "date": "2026-11-25"}
        }))
        .send()
        .await
        .expect("the submission is answered");
    assert_eq!(answer.status(), 201, "{:?}", answer.text().await);
    let command: Value = answer.json().await.expect("JSON");
    assert_eq!(command["status"], "CONFIRMED", "{command}");
    // The last look: the reconciler's status check, `verify_after_ms` after the commit.
    let agent = Agent::new(&pipeline.url());
    let deadline = Instant::now() + DEADLINE;
    loop {
        let command = agent.get("r-traced", "d-1/payments/wire/0").await;
        if !command.state.verify_pending {
            break;
        }
        assert!(Instant::now() < deadline, "the last look never came");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    pipeline.stop().await.expect("the pipeline stops");
    sluice_runtime::telemetry::shutdown();

    // The upstream saw the agent's trace on every call, each call under a span of its own.
    let seen = seen.0.lock().expect("not poisoned").clone();
    let dispatch = seen
        .iter()
        .find(|(method, path, _)| method == "POST" && path == "/bank/wires")
        .expect("the wire was dispatched");
    let lookup = seen
        .iter()
        .find(|(method, path, _)| method == "GET" && path.starts_with("/bank/wires/by-key/"))
        .expect("the wire was looked up");
    for (method, path, header) in [dispatch, lookup] {
        let header = header
            .as_deref()
            .unwrap_or_else(|| panic!("{method} {path} carried no traceparent"));
        assert_eq!(&header[3..35], TRACE_ID, "{method} {path}: {header}");
        assert_ne!(
            &header[36..52],
            AGENT_SPAN,
            "{method} {path}: a span of its own"
        );
    }

    // The collector got one trace: the agent's, from the API to the upstream call and back.
    let deadline = Instant::now() + Duration::from_secs(20);
    let wanted = [
        "POST /v1/effects",
        "reserve",
        "dispatch",
        "lease",
        "upstream.dispatch",
        "finalize",
        "upstream.status_check",
    ];
    let trace = loop {
        let trace: Vec<Span> = collector
            .spans()
            .into_iter()
            .filter(|span| span.trace_id == TRACE_ID)
            .collect();
        if wanted
            .iter()
            .all(|name| trace.iter().any(|s| s.name == *name))
        {
            break trace;
        }
        assert!(
            Instant::now() < deadline,
            "spans of the trace exported: {:?}\ncollector log:\n{}",
            trace.iter().map(|s| &s.name).collect::<Vec<_>>(),
            collector.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let one = |name: &str| {
        trace
            .iter()
            .find(|s| s.name == name && (name != "dispatch" || s.kind == 5))
            .unwrap_or_else(|| panic!("no {name} span"))
            .clone()
    };
    let by_id = |id: &str| trace.iter().find(|s| s.span_id == id).cloned();
    let descends = |span: &Span, from: &Span| {
        let mut ancestor = span.parent.clone();
        for _ in 0..10 {
            if ancestor == from.span_id {
                return true;
            }
            match by_id(&ancestor) {
                Some(parent) => ancestor = parent.parent,
                None => return false,
            }
        }
        false
    };
    // Producer: the API's server span is the child of the agent's span.
    let request = one("POST /v1/effects");
    assert_eq!(request.parent, AGENT_SPAN);
    assert_eq!(request.kind, 2, "a server span");
    let reserve = one("reserve");
    assert_eq!(reserve.parent, request.span_id);
    assert_eq!(reserve.attribute("run_id").as_deref(), Some("r-traced"));
    assert_eq!(
        reserve.attribute("command_key").as_deref(),
        Some("d-1/payments/wire/0")
    );
    assert_eq!(reserve.attribute("tool").as_deref(), Some("payments/wire"));
    // Dispatcher: its consumer span is the child of the producer's span through the message.
    let dispatch_span = one("dispatch");
    assert_eq!(dispatch_span.kind, 5, "a consumer span");
    assert_eq!(dispatch_span.parent, reserve.span_id);
    assert_eq!(
        dispatch_span.attribute("outcome").as_deref(),
        Some("CONFIRMED")
    );
    let lease = one("lease");
    assert!(descends(&lease, &dispatch_span), "{lease:?}");
    assert_eq!(lease.attribute("outcome").as_deref(), Some("LEASED"));
    // The upstream call: a client span whose id the request carried.
    let call = one("upstream.dispatch");
    assert_eq!(call.kind, 3, "a client span");
    assert!(descends(&call, &dispatch_span), "{call:?}");
    assert_eq!(
        call.span_id,
        dispatch.2.as_deref().expect("checked")[36..52]
    );
    assert_eq!(call.attribute("outcome").as_deref(), Some("committed"));
    let finalize = one("finalize");
    assert!(descends(&finalize, &dispatch_span), "{finalize:?}");
    assert_eq!(finalize.attribute("outcome").as_deref(), Some("CONFIRMED"));
    // The reconciler's last look, started by a sweep with no message: parented on the context
    // stored with the command (the reservation's span), in the same trace.
    let check = one("upstream.status_check");
    assert_eq!(check.span_id, lookup.2.as_deref().expect("checked")[36..52]);
    assert_eq!(check.attribute("outcome").as_deref(), Some("present"));
    assert!(descends(&check, &reserve), "{check:?}");
    // Only Sluice's spans, and never the arguments.
    for span in &trace {
        assert_eq!(span.service, "sluice-trace-test");
        let text = span.attributes.to_string();
        assert!(
            !text.contains("acc-1") && !text.contains("b-9"),
            "{} carries arguments: {text}",
            span.name
        );
    }
    drop(collector);
}
