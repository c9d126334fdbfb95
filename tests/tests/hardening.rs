//! The API's hardening against the real server: open mode only by an explicit, loopback-only
//! choice; bodies only as JSON (415); browser requests only from the server's own origin or a
//! listed one (403); long polls bounded per caller and in all (503 with `Retry-After`,
//! nothing recorded); `/readyz` that tells whether the ledger answers and never why.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_core::audit::{AuditDraft, AuditEntry};
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::time::Timestamp;
use sluice_ledger::{
    AuditTrail, Cas, Claim, DueItem, Ledger, LedgerError, Member, PurgeReport, Reserved, RunCursor,
    RunSummary, ShardCas, ShardLease, SweepView, Transition,
};
use sluice_runtime::Shutdown;
use sluice_tests::{
    ANY_PORT, Agent, DEADLINE, Harness, effect, email_args, eventually, start_pipeline,
    start_upstream, test_config, tokens,
};
use sluice_upstream::Faults;

/// A raw request: `method` on `path` with `headers` and a body, the answer's status, headers
/// and body.
async fn raw(
    base: &str,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body.to_owned());
    }
    let response = request.send().await.expect("the producer answers");
    let (status, headers) = (response.status(), response.headers().clone());
    let text = response.text().await.expect("a body");
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn host_of(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_without_tokens_starts_only_when_told_to_and_only_on_loopback() {
    let upstream = start_upstream(Faults::none()).await;
    let data = tempfile::tempdir().expect("a temporary directory");
    let catalog = sluice_tests::example_catalog(&upstream.base_url());

    // No tokens, no `producer.open`: the producer refuses to serve and the pipeline stops.
    let mut config = test_config(data.path());
    config.producer.open = false;
    config
        .validate()
        .expect("valid: tokens can still be added (sluice dev does)");
    let pipeline = start_pipeline(&config, catalog.clone()).await;
    let url = pipeline.url();
    let stopped = tokio::time::timeout(DEADLINE, pipeline.wait())
        .await
        .expect("the pipeline stops by itself");
    let refused = stopped.expect_err("the producer refused to start");
    assert!(
        refused.contains("producer.open") && refused.contains("auth.tokens"),
        "the refusal names the way out: {refused}"
    );
    assert!(
        reqwest::get(format!("{url}/healthz")).await.is_err(),
        "nothing listens"
    );

    // Open beyond loopback, or open with tokens: refused at load, naming the key.
    let mut beyond = test_config(data.path());
    beyond.producer.listen = "0.0.0.0:8700".parse().expect("an address");
    let err = beyond.validate().expect_err("open on 0.0.0.0");
    assert!(err.to_string().contains("producer.open"), "{err}");
    let mut both = test_config(data.path());
    tokens::install(&mut both);
    both.producer.open = true;
    let err = both.validate().expect_err("open with tokens");
    assert!(err.to_string().contains("producer.open"), "{err}");

    // Open on loopback by choice: every caller is the anonymous admin.
    let config = test_config(data.path());
    let pipeline = start_pipeline(&config, catalog).await;
    let whoami = Agent::new(&pipeline.url())
        .call("GET", "/v1/whoami", None)
        .await;
    assert_eq!(whoami.status, StatusCode::OK, "{}", whoami.text);
    assert_eq!(whoami.body["authenticated"], json!(false));
    pipeline.stop().await.expect("a clean stop");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_declared_json_is_refused_before_anything_is_recorded() {
    // Open mode: the case where nothing else (no token) stands between a page and the API.
    let harness = Harness::start(Faults::none(), |edit| edit).await;
    let base = harness.agent.base().to_owned();
    let submission = effect("r-ct", 1, "email/send", 0, email_args("hi")).to_string();
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
    ] {
        let headers: Vec<(&str, &str)> = content_type
            .map(|ct| vec![("content-type", ct)])
            .unwrap_or_default();
        let (status, _, body) = raw(
            &base,
            reqwest::Method::POST,
            "/v1/effects",
            &headers,
            Some(&submission),
        )
        .await;
        assert_eq!(
            status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
        assert_eq!(body["error"]["code"], json!("unsupported_media_type"));
        // An operator action and a purge too.
        for path in [
            "/v1/runs/r-ct/rollback",
            "/v1/audit/purge",
            "/v1/runs/r-ct/effects/d-1%2Femail%2Fsend%2F0:cancel",
        ] {
            let (status, _, _) = raw(
                &base,
                reqwest::Method::POST,
                path,
                &headers,
                Some(r#"{"reason": "a page asked"}"#),
            )
            .await;
            assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{path}");
        }
    }
    let listed = harness.agent.list("r-ct", None).await;
    assert_eq!(
        listed.body["effects"],
        json!([]),
        "nothing was recorded: {}",
        listed.text
    );
    // Declared JSON (with a charset) is served.
    let (status, _, body) = raw(
        &base,
        reqwest::Method::POST,
        "/v1/effects",
        &[("content-type", "application/json; charset=utf-8")],
        Some(&submission),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn browser_requests_from_other_origins_are_refused() {
    let harness = Harness::start_with(
        Faults::none(),
        |edit| edit,
        |config| {
            config.producer.allowed_origins = vec!["https://console.example.com".into()];
        },
    )
    .await;
    let base = harness.agent.base().to_owned();
    let json = ("content-type", "application/json");
    let submit = |n: u32| effect("r-origin", n, "email/send", 0, email_args("hi")).to_string();

    // Another site's page: refused whatever it asks, reads included, and nothing recorded.
    for origin in ["https://evil.example", "null", "http://127.0.0.1:1"] {
        let (status, _, body) = raw(
            &base,
            reqwest::Method::POST,
            "/v1/effects",
            &[json, ("origin", origin)],
            Some(&submit(1)),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}");
        assert_eq!(body["error"]["code"], json!("cross_origin"));
        let (status, _, _) = raw(
            &base,
            reqwest::Method::GET,
            "/v1/runs",
            &[("origin", origin)],
            None,
        )
        .await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{origin} reads nothing either"
        );
        let (status, headers, _) = raw(
            &base,
            reqwest::Method::OPTIONS,
            "/v1/effects",
            &[
                ("origin", origin),
                ("access-control-request-method", "POST"),
            ],
            None,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "no preflight for {origin}");
        assert!(!headers.contains_key("access-control-allow-origin"));
    }
    let listed = harness.agent.list("r-origin", None).await;
    assert_eq!(listed.body["effects"], json!([]), "{}", listed.text);

    // The server's own origin (the console at /ui): served, no CORS headers needed.
    let own = format!("http://{}", host_of(&base));
    let (status, headers, body) = raw(
        &base,
        reqwest::Method::POST,
        "/v1/effects",
        &[json, ("origin", &own)],
        Some(&submit(1)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(!headers.contains_key("access-control-allow-origin"));

    // A listed origin: its preflight is answered, and its answers carry CORS headers.
    let listed = "https://console.example.com";
    let (status, headers, _) = raw(
        &base,
        reqwest::Method::OPTIONS,
        "/v1/effects",
        &[
            ("origin", listed),
            ("access-control-request-method", "POST"),
            (
                "access-control-request-headers",
                "authorization, content-type",
            ),
        ],
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(headers["access-control-allow-origin"], listed);
    assert!(
        headers["access-control-allow-headers"]
            .to_str()
            .expect("text")
            .contains("authorization")
    );
    let (status, headers, body) = raw(
        &base,
        reqwest::Method::POST,
        "/v1/effects",
        &[json, ("origin", listed)],
        Some(&submit(2)),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(headers["access-control-allow-origin"], listed);
    harness.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_are_bounded_per_caller_and_in_all() {
    let harness = Harness::start_with(
        Faults::none(),
        |edit| edit,
        |config| {
            tokens::install(config);
            config.producer.max_waits = 2;
            config.producer.max_waits_per_principal = 1;
        },
    )
    .await;
    let a = harness.agent.with_token(tokens::AGENT_A);
    let b = harness.agent.with_token(tokens::AGENT_B);
    let admin = harness.agent.with_token(tokens::ADMIN);
    // Due in 3 s: a wait of 20 s on it is held until then (and the dispatch after).
    let scheduled = |run: &str| {
        let mut effect = effect(run, 1, "email/send", 0, email_args("later"));
        effect["delay_ms"] = json!(3_000);
        effect
    };
    let key = "d-1/email/send/0";
    let path = |run: &str| {
        format!(
            "/v1/runs/{run}/effects/{}?wait=20s",
            sluice_tests::encode_key(key)
        )
    };
    for (agent, run) in [(&a, "r-wait-a"), (&b, "r-wait-b")] {
        let created = agent.submit(&scheduled(run)).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    }
    let metrics = Arc::clone(&harness.ctx().metrics);
    let waiting = |n: i64| {
        let metrics = Arc::clone(&metrics);
        move || {
            let metrics = Arc::clone(&metrics);
            async move { (metrics.waiting_requests.get() == n).then_some(()) }
        }
    };

    // A's first long poll is held...
    let first = tokio::spawn({
        let (a, path) = (a.clone(), path("r-wait-a"));
        async move { a.call("GET", &path, None).await }
    });
    eventually("A's long poll is held", DEADLINE, waiting(1)).await;
    // ... and its second is refused, though a plain read is not.
    let second = a.call("GET", &path("r-wait-a"), None).await;
    assert_eq!(
        second.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        second.text
    );
    assert_eq!(second.error_code(), "too_many_waits");
    assert!(
        second.text.contains("max_waits_per_principal"),
        "{}",
        second.text
    );
    let plain = a
        .call(
            "GET",
            &format!(
                "/v1/runs/r-wait-a/effects/{}",
                sluice_tests::encode_key(key)
            ),
            None,
        )
        .await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.text);

    // B has a place of its own; then the bound in all is reached.
    let held_b = tokio::spawn({
        let (b, path) = (b.clone(), path("r-wait-b"));
        async move { b.call("GET", &path, None).await }
    });
    eventually("B's long poll is held", DEADLINE, waiting(2)).await;
    // A submission that would wait is refused before it is recorded, with Retry-After.
    let response = reqwest::Client::new()
        .post(format!("{}/v1/effects", harness.agent.base()))
        .bearer_auth(tokens::ADMIN)
        .header("prefer", "wait=10")
        .json(&effect("r-wait-admin", 1, "email/send", 0, email_args("x")))
        .send()
        .await
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "1");
    let text = response.text().await.expect("a body");
    assert!(
        text.contains("too_many_waits") && text.contains("producer.max_waits"),
        "{text}"
    );
    let nothing = admin.list("r-wait-admin", None).await;
    assert_eq!(nothing.body["effects"], json!([]), "{}", nothing.text);

    // Once A's poll is answered its place is free again.
    let first = first.await.expect("A's poll ends");
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    assert_eq!(first.command().status(), CommandStatus::Confirmed);
    let again = a.call("GET", &path("r-wait-a"), None).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    held_b.await.expect("B's poll ends");
    assert_eq!(harness.ctx().metrics.waiting_requests.get(), 0);
    harness.stop().await;
}

/// A ledger whose reads of the run list fail the way a CQL cluster out of reach does, with a
/// message naming hosts and a keyspace; everything else is the real SQLite ledger.
#[derive(Debug)]
struct Unreachable(Arc<dyn Ledger>);

const INTERNAL: &str = "10.20.30.40:9042 keyspace sluice_prod_secret";

#[async_trait]
impl Ledger for Unreachable {
    async fn reserve(&self, command: Command, audit: AuditDraft) -> Result<Reserved, LedgerError> {
        self.0.reserve(command, audit).await
    }
    async fn reserve_own(
        &self,
        command: Command,
        audit: AuditDraft,
    ) -> Result<Reserved, LedgerError> {
        self.0.reserve_own(command, audit).await
    }
    async fn transition(&self, transition: Transition) -> Result<Cas, LedgerError> {
        self.0.transition(transition).await
    }
    async fn get(&self, run: &RunId, key: &CommandKey) -> Result<Option<Command>, LedgerError> {
        self.0.get(run, key).await
    }
    async fn list_run(
        &self,
        run: &RunId,
        status: Option<CommandStatus>,
    ) -> Result<Vec<Command>, LedgerError> {
        self.0.list_run(run, status).await
    }
    async fn list_runs(
        &self,
        _: Timestamp,
        _: Option<&RunCursor>,
        _: usize,
    ) -> Result<Vec<RunSummary>, LedgerError> {
        Err(LedgerError::Storage {
            op: "list_runs",
            source: format!("no node answered: {INTERNAL}").into(),
        })
    }
    async fn claim_business_key(
        &self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run: &RunId,
        key: &CommandKey,
    ) -> Result<Claim, LedgerError> {
        self.0
            .claim_business_key(tool, business_key, run, key)
            .await
    }
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<DueItem>, LedgerError> {
        self.0.due(now, limit).await
    }
    fn due_shards(&self) -> u32 {
        self.0.due_shards()
    }
    async fn due_in(
        &self,
        now: Timestamp,
        limit: usize,
        shards: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError> {
        self.0.due_in(now, limit, shards).await
    }
    async fn sweep_view(&self, group: &str, shards: u32) -> Result<SweepView, LedgerError> {
        self.0.sweep_view(group, shards).await
    }
    async fn write_shard_lease(
        &self,
        group: &str,
        guard: Option<u64>,
        next: ShardLease,
    ) -> Result<ShardCas, LedgerError> {
        self.0.write_shard_lease(group, guard, next).await
    }
    async fn announce(&self, group: &str, member: Member) -> Result<(), LedgerError> {
        self.0.announce(group, member).await
    }
    async fn audit_append(
        &self,
        run: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        self.0.audit_append(run, draft, at).await
    }
    async fn close_run(
        &self,
        run: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        self.0.close_run(run, draft, at).await
    }
    async fn audit_read(&self, run: &RunId) -> Result<AuditTrail, LedgerError> {
        self.0.audit_read(run).await
    }
    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
    ) -> Result<PurgeReport, LedgerError> {
        self.0.purge(older_than, max_runs, actor, now).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_tells_whether_the_ledger_answers_and_never_why() {
    let upstream = start_upstream(Faults::none()).await;
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());
    let catalog = sluice_tests::example_catalog(&upstream.base_url());
    let mut ctx = sluice_runtime::assemble::assemble(&config, catalog)
        .await
        .expect("a context");
    ctx.ledger = Arc::new(Unreachable(Arc::clone(&ctx.ledger)));

    // The producer's.
    let shutdown = Shutdown::new();
    let listener = tokio::net::TcpListener::bind(ANY_PORT)
        .await
        .expect("a port");
    let producer = format!("http://{}", listener.local_addr().expect("an address"));
    let served = tokio::spawn({
        let (ctx, config, shutdown) = (ctx.clone(), config.clone(), shutdown.clone());
        async move { sluice_producer::serve(ctx, &config, listener, shutdown).await }
    });
    // The operations endpoint of the dispatcher, reconciler and compensator.
    let listener = tokio::net::TcpListener::bind(ANY_PORT)
        .await
        .expect("a port");
    let ops = format!("http://{}", listener.local_addr().expect("an address"));
    let ops_served = tokio::spawn({
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        async move {
            axum::serve(listener, sluice_runtime::ops::router(ctx))
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
        }
    });
    for base in [&producer, &ops] {
        let response = eventually("the endpoint answers", DEADLINE, || async {
            reqwest::get(format!("{base}/readyz")).await.ok()
        })
        .await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{base}");
        let text = response.text().await.expect("a body");
        assert_eq!(text, "not ready: the ledger does not answer", "{base}");
        assert!(!text.contains("10.20.30.40") && !text.contains("sluice_prod_secret"));
        let health = reqwest::get(format!("{base}/healthz"))
            .await
            .expect("an answer");
        assert_eq!(
            health.status(),
            StatusCode::OK,
            "the process itself is fine"
        );
    }
    shutdown.cancel();
    served
        .await
        .expect("the producer task ends")
        .expect("it served");
    ops_served
        .await
        .expect("the ops task ends")
        .expect("it served");
    upstream.shutdown().await;
}
