//! The web console's server side over real HTTP: `/ui` serves the embedded assets with the
//! security headers (a Content-Security-Policy forbidding inline script, no framing, no
//! sniffing, no referrer) only when `producer.console` is on; and `GET /v1/events/stream`
//! checks roles (an agent only its own runs), bounds its open streams, delivers a lifecycle
//! event when an effect settles (or, as a summary, the runs that moved), and ends its streams
//! when the producer stops.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;
use sluice_tests::tokens::{ADMIN, AGENT_A, AGENT_B, OPERATOR};
use sluice_tests::*;
use sluice_upstream::Faults;

fn console_on(config: &mut sluice_runtime::Config) {
    tokens::install(config);
    config.producer.console = Some(true);
    config.producer.max_event_streams = 5;
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .build()
        .expect("a plain HTTP client builds")
}

/// An open event stream, read event by event.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    async fn open(base: &str, token: &str, query: &str) -> Result<Self, (StatusCode, String)> {
        let response = client()
            .get(format!("{base}/v1/events/stream{query}"))
            .bearer_auth(token)
            .send()
            .await
            .expect("the producer answers");
        if response.status() != StatusCode::OK {
            let status = response.status();
            return Err((status, response.text().await.unwrap_or_default()));
        }
        let kind = response.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        Ok(Self {
            response,
            buffer: String::new(),
        })
    }

    /// The next event (type, data), `None` when the stream ended; fails after `DEADLINE`.
    async fn next(&mut self) -> Option<(String, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut kind = "message".to_owned();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        kind = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                let data = serde_json::from_str(&data).expect("event data is JSON");
                return Some((kind, data));
            }
            let chunk = tokio::time::timeout(DEADLINE, self.response.chunk())
                .await
                .expect("an event within the deadline")
                .expect("the stream reads");
            match chunk {
                Some(bytes) => self
                    .buffer
                    .push_str(std::str::from_utf8(&bytes).expect("UTF-8")),
                None => return None,
            }
        }
    }

    /// Reads effect events until one for `key` in `status`; every event read goes to `seen`.
    async fn until(&mut self, key: &str, status: &str, seen: &mut Vec<Value>) -> Value {
        loop {
            let (kind, data) = self.next().await.expect("the stream stays open");
            if kind != "effect" {
                continue;
            }
            seen.push(data.clone());
            if data["command_key"] == key && data["status"] == status {
                return data;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_its_security_headers_only_when_enabled() {
    let h = Harness::start_with(Faults::none(), |c| c, console_on).await;
    let base = h.pipeline.url();
    let http = client();
    for (path, kind) in [
        ("/ui", "text/html"),
        ("/ui/", "text/html"),
        ("/ui/style.css", "text/css"),
        ("/ui/js/main.js", "text/javascript"),
        ("/ui/js/live.js", "text/javascript"),
    ] {
        // No token needed: the page holds no data; every call it makes needs one.
        let answer = http
            .get(format!("{base}{path}"))
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), StatusCode::OK, "{path}");
        let headers = answer.headers().clone();
        let header = |name: &str| {
            headers
                .get(name)
                .unwrap_or_else(|| panic!("{path} has no {name}"))
                .to_str()
                .expect("ascii")
                .to_owned()
        };
        assert!(header("content-type").starts_with(kind), "{path}");
        let csp = header("content-security-policy");
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp} lacks {directive}");
        }
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert_eq!(header("referrer-policy"), "no-referrer");
        assert_eq!(header("x-frame-options"), "DENY");
        assert!(headers.get("set-cookie").is_none(), "{path} sets a cookie");
        let body = answer.text().await.expect("a body");
        assert!(!body.is_empty());
        if path.ends_with("/ui/") {
            assert!(body.contains(r#"<script type="module" src="/ui/js/main.js"></script>"#));
        }
    }
    let missing = http
        .get(format!("{base}/ui/js/nothing.js"))
        .send()
        .await
        .expect("answer");
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    assert!(missing.headers().contains_key("content-security-policy"));
    h.stop().await;

    // The producer's default: no console.
    let h = Harness::start_with(Faults::none(), |c| c, tokens::install).await;
    let answer = http
        .get(format!("{}/ui/", h.pipeline.url()))
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), StatusCode::NOT_FOUND);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_checks_roles_and_delivers_an_event_when_an_effect_settles() {
    let h = Harness::start_with(Faults::none(), |c| c, console_on).await;
    let base = h.pipeline.url();
    let agent_a = h.agent.with_token(AGENT_A);
    let agent_b = h.agent.with_token(AGENT_B);
    agent_a
        .submit_created(&effect("r-a", 1, "email/send", 0, email_args("first")))
        .await;
    agent_b
        .submit_created(&effect("r-b", 1, "email/send", 0, email_args("b's")))
        .await;
    agent_a.wait_settled("r-a", "d-1/email/send/0").await;
    agent_b.wait_settled("r-b", "d-1/email/send/0").await;

    // Roles: no token, another agent's run, a run id that is no id.
    let denied = |who: &str, query: &str| {
        let (base, who, query) = (base.clone(), who.to_owned(), query.to_owned());
        async move {
            match Stream::open(&base, &who, &query).await {
                Ok(_) => panic!("{query} opened"),
                Err((status, _)) => status,
            }
        }
    };
    assert_eq!(
        denied("not-a-token-0123456789", "").await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(denied(AGENT_B, "?run_id=r-a").await, StatusCode::FORBIDDEN);
    assert_eq!(
        denied(AGENT_A, "?run_id=no%20such").await,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        denied(OPERATOR, "?follow=1").await,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    // Allowed: the agent on its own run, an operator on every run, agent B on all of its own.
    let mut own = Stream::open(&base, AGENT_A, "?run_id=r-a")
        .await
        .expect("an agent streams its own run");
    let mut all = Stream::open(&base, OPERATOR, "")
        .await
        .expect("an operator streams every run");
    let mut b_only = Stream::open(&base, AGENT_B, "")
        .await
        .expect("an agent streams its own runs");
    // Summaries: at most one `changed` a second, naming the runs that moved.
    let mut operator_summary = Stream::open(&base, OPERATOR, "?summary=true")
        .await
        .expect("an operator streams a summary");
    let mut b_summary = Stream::open(&base, AGENT_B, "?summary=true")
        .await
        .expect("an agent streams a summary of its own runs");
    for stream in [
        &mut own,
        &mut all,
        &mut b_only,
        &mut operator_summary,
        &mut b_summary,
    ] {
        let (kind, ready) = stream.next().await.expect("the stream opens");
        assert_eq!(kind, "ready", "{ready}");
    }
    // The bound: five streams are open, the sixth is refused.
    let (status, body) = match Stream::open(&base, ADMIN, "").await {
        Ok(_) => panic!("a sixth stream opened past producer.max_event_streams = 5"),
        Err(refused) => refused,
    };
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(body.contains("too_many_streams"), "{body}");

    // An effect settles: each stream that may see it gets its events, the others do not.
    agent_b
        .submit_created(&effect("r-b", 2, "email/send", 0, email_args("b again")))
        .await;
    agent_a
        .submit_created(&effect("r-a", 2, "email/send", 0, email_args("second")))
        .await;
    let mut seen_by_a = Vec::new();
    let settled = own
        .until("d-2/email/send/0", "CONFIRMED", &mut seen_by_a)
        .await;
    assert_eq!(settled["run_id"], "r-a");
    assert!(settled["external_ref"].is_string(), "{settled}");
    assert!(
        seen_by_a.iter().all(|c| c["run_id"] == "r-a"),
        "{seen_by_a:?}"
    );
    let mut seen_by_operator = Vec::new();
    all.until("d-2/email/send/0", "CONFIRMED", &mut seen_by_operator)
        .await;
    let mut seen_by_b = Vec::new();
    b_only
        .until("d-2/email/send/0", "CONFIRMED", &mut seen_by_b)
        .await;
    assert!(
        seen_by_b
            .iter()
            .all(|c| c["run_id"] == "r-b" && c["submitted_by"] == "agent-b"),
        "agent B saw another agent's effects: {seen_by_b:?}"
    );
    let mut summarised = std::collections::BTreeSet::new();
    while !(summarised.contains("r-a") && summarised.contains("r-b")) {
        let (kind, data) = operator_summary
            .next()
            .await
            .expect("the summary stays open");
        assert_eq!(kind, "changed", "{data}");
        assert!(data["events"].as_u64() > Some(0), "{data}");
        summarised.extend(
            data["runs"]
                .as_array()
                .expect("runs")
                .iter()
                .map(|r| r.as_str().expect("a run id").to_owned()),
        );
    }
    let (kind, data) = b_summary.next().await.expect("the summary stays open");
    assert_eq!(kind, "changed", "{data}");
    assert_eq!(data["runs"], serde_json::json!(["r-b"]), "{data}");

    // Across runs, an agent lists only the effects it submitted (its own runs).
    let listed = agent_b.call("GET", "/v1/effects", None).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    let listed = listed.body["effects"].as_array().expect("effects").clone();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed
            .iter()
            .all(|c| c["run_id"] == "r-b" && c["submitted_by"] == "agent-b"),
        "{listed:?}"
    );
    let everything = h
        .agent
        .with_token(OPERATOR)
        .call("GET", "/v1/effects", None)
        .await;
    assert_eq!(everything.body["effects"].as_array().map(Vec::len), Some(4));

    // A closed stream gives its slot back.
    drop(b_only);
    drop(b_summary);
    let mut again = None;
    for _ in 0..50 {
        if let Ok(stream) = Stream::open(&base, ADMIN, "").await {
            again = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(again.is_some(), "a closed stream's slot is reused");

    // Stopping the producer ends the open streams instead of waiting for them.
    tokio::time::timeout(Duration::from_secs(15), h.stop())
        .await
        .expect("the pipeline stops with streams open");
    assert!(own.next().await.is_none(), "the stream ends at shutdown");
}

/// Effects that reached `status`, summed over the overview's minutes.
fn settled(overview: &Value, status: &str) -> u64 {
    overview["minutes"]
        .as_array()
        .expect("minutes")
        .iter()
        .map(|m| m["settled"][status].as_u64().unwrap_or(0))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_reads_the_overview_money_fields_and_rolled_back_runs() {
    let h = Harness::start_with(Faults::none(), |c| c, console_on).await;
    let operator = h.agent.with_token(OPERATOR);
    let agent = h.agent.with_token(AGENT_A);

    // The overview covers every run: an operator or an admin, not an agent, not a stranger.
    assert_eq!(
        agent.call("GET", "/v1/overview", None).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        h.agent
            .with_token("not-a-token-0123456789")
            .call("GET", "/v1/overview", None)
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    let quiet = operator.call("GET", "/v1/overview", None).await;
    assert_eq!(quiet.status, StatusCode::OK, "{}", quiet.text);
    assert_eq!(settled(&quiet.body, "CONFIRMED"), 0, "{}", quiet.text);

    // Two effects confirm in one run, a large wire waits BLOCKED in another.
    agent
        .submit_created(&effect("r-ov-1", 1, "email/send", 0, email_args("one")))
        .await;
    agent
        .submit_created(&effect(
            "r-ov-1",
            2,
            "tickets/create",
            0,
            ticket_args("two"),
        ))
        .await;
    agent
        .submit_created(&effect(
            "r-ov-2",
            1,
            "payments/wire",
            0,
            wire_args("acc-ov", 2_000_000),
        ))
        .await;
    agent.wait_settled("r-ov-1", "d-1/email/send/0").await;
    agent.wait_settled("r-ov-1", "d-2/tickets/create/0").await;
    // Both counted, not only stored: a transition is counted after its write returns, so the
    // overview may lag the ledger `wait_settled` reads by a moment.
    let blocked = eventually("the wire is BLOCKED", DEADLINE, || async {
        let now = operator.call("GET", "/v1/overview", None).await.body;
        let last = now["minutes"].as_array()?.last()?.clone();
        (last["blocked"] == 1 && settled(&now, "CONFIRMED") == 2).then_some(now)
    })
    .await;
    assert_eq!(blocked["gauges"], true, "{blocked}");
    assert_eq!(settled(&blocked, "CONFIRMED"), 2, "{blocked}");
    let last = blocked["minutes"]
        .as_array()
        .expect("minutes")
        .last()
        .cloned();
    let last = last.expect("the minute under way");
    assert_eq!(last["partial"], true, "{last}");
    assert_eq!(
        (last["stuck"].as_u64(), last["unknown"].as_u64()),
        (Some(0), Some(0))
    );

    // A rolled-back run is marked in the run listing, and its compensations are counted.
    let admin = h.agent.with_token(ADMIN);
    let begun = admin.rollback("r-ov-1", "customer cancelled").await;
    assert_eq!(begun.status, StatusCode::ACCEPTED, "{}", begun.text);
    eventually("the ticket is compensated", DEADLINE, || async {
        let now = operator.call("GET", "/v1/overview", None).await.body;
        (settled(&now, "COMPENSATED") == 1).then_some(())
    })
    .await;
    let runs = operator.call("GET", "/v1/runs", None).await;
    let rolled_back = |run: &str| {
        runs.body["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .find(|r| r["run_id"] == run)
            .map(|r| r["rolled_back_at"].is_string())
    };
    assert_eq!(rolled_back("r-ov-1"), Some(true), "{}", runs.text);
    assert_eq!(rolled_back("r-ov-2"), Some(false), "{}", runs.text);

    // The catalog's money field, for the console to show "EUR 20,000.00".
    let wire = agent.call("GET", "/v1/tools/payments/wire", None).await;
    assert_eq!(
        wire.body["money"]["amount_minor"],
        serde_json::json!({"currency": "EUR", "minor_units": 2}),
        "{}",
        wire.text
    );
    h.stop().await;
}
