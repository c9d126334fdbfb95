//! Traces end to end: one effect submitted with a W3C `traceparent` is one trace, exported over
//! OTLP to a real OpenTelemetry Collector and read back from the collector's file exporter;
//! its spans carry OpenTelemetry's semantic-convention attributes (HTTP server and client,
//! messaging, database, the GenAI `execute_tool` span), and the services' JSON log lines carry
//! the trace and span ids the collector got (docs/operations.md, "Telemetry").
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
use sluice_runtime::config::{LogFormat, TelemetryConfig};
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

/// The log lines the services wrote (JSON, one per line), kept for the test to read.
#[derive(Debug, Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("not poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().expect("not poisoned").clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"))
            })
            .collect()
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
    // The services' JSON logs, Sluice's debug lines included, captured.
    let logs = Captured::default();
    sluice_runtime::telemetry::init_writing_to(
        &TelemetryConfig {
            log_level: "warn,sluice=debug".into(),
            log_format: LogFormat::Json,
            otlp_endpoint: Some(collector.endpoint.clone()),
            service_name: Some("sluice-trace-test".into()),
            ..TelemetryConfig::default()
        },
        {
            let logs = logs.clone();
            move || logs.clone()
        },
    );

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
    // The consumer lag of each group and partition, on the metrics endpoint (the embedded
    // bus's offsets, read every few seconds): nothing is left behind once the effect settled.
    let lag =
        r#"sluice_consumer_lag{group="sluice-dispatcher",partition="0",topic="sluice.requested"}"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = reqwest::get(format!("{}/metrics", pipeline.url()))
            .await
            .expect("the producer answers /metrics")
            .text()
            .await
            .expect("a text body");
        if text.lines().any(|line| line == format!("{lag} 0")) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no {lag} 0 on /metrics:\n{}",
            text.lines()
                .filter(|l| l.contains("consumer_lag"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
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
        "send sluice.requested",
        "process sluice.requested",
        "lease commands",
        "execute_tool payments/wire",
        "POST",
        "finalize commands",
        "GET",
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
            .find(|s| s.name == name)
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
    let has = |span: &Span, attributes: &[(&str, &str)]| {
        for (key, value) in attributes {
            assert_eq!(
                span.attribute(key).as_deref(),
                Some(*value),
                "{} {key}: {}",
                span.name,
                span.attributes
            );
        }
    };
    // Producer: the API's server span is the child of the agent's span.
    let request = one("POST /v1/effects");
    assert_eq!(request.parent, AGENT_SPAN);
    assert_eq!(request.kind, 2, "a server span");
    has(
        &request,
        &[
            ("http.request.method", "POST"),
            ("http.route", "/v1/effects"),
            ("http.response.status_code", "201"),
        ],
    );
    let reserve = one("reserve");
    assert_eq!(reserve.parent, request.span_id);
    has(
        &reserve,
        &[
            ("run_id", "r-traced"),
            ("command_key", "d-1/payments/wire/0"),
            ("tool", "payments/wire"),
        ],
    );
    // The dispatch request's publish: a producer span, the full topic name.
    let send = one("send sluice.requested");
    assert_eq!(send.kind, 4, "a producer span");
    assert_eq!(send.parent, reserve.span_id);
    has(
        &send,
        &[
            ("messaging.system", "sluice_embedded"),
            ("messaging.operation.type", "send"),
            ("messaging.destination.name", "sluice.requested"),
            ("messaging.kafka.message.key", "r-traced"),
        ],
    );
    assert!(
        send.attribute("messaging.destination.partition.id")
            .is_some(),
        "{send:?}"
    );
    // Dispatcher: its consumer span is the child of the producer's span through the message.
    let process = one("process sluice.requested");
    assert_eq!(process.kind, 5, "a consumer span");
    assert_eq!(process.parent, reserve.span_id);
    has(
        &process,
        &[
            ("messaging.system", "sluice_embedded"),
            ("messaging.operation.type", "process"),
            ("messaging.destination.name", "sluice.requested"),
            (
                "messaging.destination.partition.id",
                &send
                    .attribute("messaging.destination.partition.id")
                    .expect("checked"),
            ),
            ("messaging.kafka.message.key", "r-traced"),
            ("messaging.consumer.group.name", "sluice-dispatcher"),
            ("sluice.work", "dispatch"),
            ("outcome", "CONFIRMED"),
        ],
    );
    // The ledger's writes: database client spans.
    let lease = one("lease commands");
    assert_eq!(lease.kind, 3, "a client span");
    assert!(descends(&lease, &process), "{lease:?}");
    let ledger = [
        ("db.system.name", "sqlite"),
        ("db.namespace", "main"),
        ("db.collection.name", "commands"),
    ];
    has(&lease, &ledger);
    has(
        &lease,
        &[("db.operation.name", "lease"), ("outcome", "LEASED")],
    );
    // The tool call: GenAI's execute_tool span around the HTTP request's client span, whose
    // id the request carried.
    let tool_call = one("execute_tool payments/wire");
    assert!(descends(&tool_call, &process), "{tool_call:?}");
    has(
        &tool_call,
        &[
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "payments/wire"),
            ("gen_ai.tool.call.id", "r-traced/d-1/payments/wire/0"),
            ("outcome", "committed"),
        ],
    );
    let call = one("POST");
    assert_eq!(call.kind, 3, "a client span");
    assert_eq!(call.parent, tool_call.span_id);
    assert_eq!(
        call.span_id,
        dispatch.2.as_deref().expect("checked")[36..52]
    );
    has(
        &call,
        &[
            ("http.request.method", "POST"),
            ("http.response.status_code", "200"),
            ("server.address", "127.0.0.1"),
            ("server.port", &upstream.port().to_string()),
            ("url.full", &format!("http://{upstream}/bank/wires")),
            ("sluice.call", "dispatch"),
            ("outcome", "committed"),
        ],
    );
    let finalize = one("finalize commands");
    assert!(descends(&finalize, &process), "{finalize:?}");
    has(&finalize, &ledger);
    has(
        &finalize,
        &[("db.operation.name", "finalize"), ("outcome", "CONFIRMED")],
    );
    // The reconciler's last look, started by a sweep with no message: parented on the context
    // stored with the command (the reservation's span), in the same trace.
    let check = trace
        .iter()
        .find(|s| s.attribute("sluice.call").as_deref() == Some("status_check"))
        .expect("a status check's span")
        .clone();
    assert_eq!(check.name, "GET");
    assert_eq!(check.kind, 3, "a client span");
    assert_eq!(check.span_id, lookup.2.as_deref().expect("checked")[36..52]);
    has(
        &check,
        &[
            ("http.request.method", "GET"),
            ("http.response.status_code", "200"),
            ("outcome", "present"),
        ],
    );
    // The lookup's path is the business key, made of the arguments: left out.
    has(
        &check,
        &[(
            "url.full",
            &format!("http://{upstream}/bank/wires/by-key/REDACTED"),
        )],
    );
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

    // The logs join the trace: a line written in a span carries the ids the collector has it
    // under — the dispatch's outcome, logged in the tool call's span, names that span.
    let lines = logs.lines();
    let committed = lines
        .iter()
        .find(|line| line["fields"]["message"] == "dispatch committed")
        .unwrap_or_else(|| panic!("no `dispatch committed` line in {} lines", lines.len()));
    assert_eq!(committed["trace_id"], TRACE_ID, "{committed}");
    assert_eq!(
        committed["span_id"],
        tool_call.span_id.as_str(),
        "{committed}"
    );
    // Every line of the effect's trace names a span the collector got.
    let ours: Vec<&Value> = lines
        .iter()
        .filter(|line| line["trace_id"] == TRACE_ID)
        .collect();
    assert!(ours.len() > 1, "{ours:?}");
    for line in ours {
        let span = line["span_id"]
            .as_str()
            .expect("a span id beside the trace id");
        assert!(by_id(span).is_some(), "{line} names a span not exported");
    }
    drop(collector);
}
