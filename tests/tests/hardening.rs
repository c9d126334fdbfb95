//! The API's hardening against the real server: open mode only by an explicit, loopback-only
//! choice; bodies only as JSON (415); requests only to the server's own names (421: DNS
//! rebinding), browser requests only from the server's own origin or a listed one, and no
//! other site's page loading it but by a link (403); long polls bounded per caller and in all
//! (503 with `Retry-After`, nothing recorded); `/readyz` that tells whether the ledger answers
//! and never why.

use sluice_ledger::{AuditStore, CommandStore, ShardStore};
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
impl CommandStore for Unreachable {
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

    async fn close_run(
        &self,
        run: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<sluice_ledger::Closing, LedgerError> {
        self.0.close_run(run, draft, at).await
    }

    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<PurgeReport, LedgerError> {
        self.0
            .purge(older_than, max_runs, actor, now, dry_run)
            .await
    }
}

#[async_trait]
impl AuditStore for Unreachable {
    async fn audit_append(
        &self,
        run: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        self.0.audit_append(run, draft, at).await
    }

    async fn audit_read(&self, run: &RunId) -> Result<AuditTrail, LedgerError> {
        self.0.audit_read(run).await
    }
}

#[async_trait]
impl ShardStore for Unreachable {
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
}

#[async_trait]
impl sluice_ledger::FlowStore for Unreachable {
    async fn flow_controls(&self) -> Result<Vec<sluice_core::flow::FlowControl>, LedgerError> {
        self.0.flow_controls().await
    }

    async fn write_flow_control(
        &self,
        guard: u64,
        next: sluice_core::flow::FlowControl,
    ) -> Result<sluice_ledger::FlowCas, LedgerError> {
        self.0.write_flow_control(guard, next).await
    }
}

#[async_trait]
impl sluice_ledger::LinkStore for Unreachable {
    async fn link_consume(
        &self,
        link_id: &str,
        run_id: &RunId,
        command_key: &CommandKey,
        at: Timestamp,
    ) -> Result<bool, LedgerError> {
        self.0.link_consume(link_id, run_id, command_key, at).await
    }
}

#[async_trait]
impl sluice_ledger::WebhookStore for Unreachable {
    async fn webhook_enqueue(
        &self,
        delivery: &sluice_core::webhook::Delivery,
    ) -> Result<bool, LedgerError> {
        self.0.webhook_enqueue(delivery).await
    }

    async fn webhook_due(
        &self,
        webhook: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<sluice_core::webhook::Delivery>, LedgerError> {
        self.0.webhook_due(webhook, now, limit).await
    }

    async fn webhook_update(
        &self,
        next: &sluice_core::webhook::Delivery,
        expected: u64,
    ) -> Result<bool, LedgerError> {
        self.0.webhook_update(next, expected).await
    }

    async fn webhook_list(
        &self,
        webhook: &str,
        limit: usize,
    ) -> Result<Vec<sluice_core::webhook::Delivery>, LedgerError> {
        self.0.webhook_list(webhook, limit).await
    }
}

#[async_trait]
impl sluice_ledger::EvidenceStore for Unreachable {
    async fn evidence_put(
        &self,
        record: &sluice_core::evidence::EvidenceRecord,
    ) -> Result<Option<sluice_core::evidence::EvidenceRecord>, LedgerError> {
        self.0.evidence_put(record).await
    }

    async fn evidence_settle(
        &self,
        record: &sluice_core::evidence::EvidenceRecord,
    ) -> Result<(), LedgerError> {
        self.0.evidence_settle(record).await
    }

    async fn evidence_held(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<sluice_core::evidence::EvidenceRecord>, LedgerError> {
        self.0.evidence_held(idempotency_key).await
    }

    async fn evidence_list(
        &self,
        source: &str,
        limit: usize,
    ) -> Result<Vec<sluice_core::evidence::EvidenceRecord>, LedgerError> {
        self.0.evidence_list(source, limit).await
    }

    async fn reference_put(
        &self,
        tool: &sluice_core::ids::ToolName,
        reference: &str,
        key: &sluice_core::ids::IdempotencyKey,
    ) -> Result<sluice_core::ids::IdempotencyKey, LedgerError> {
        self.0.reference_put(tool, reference, key).await
    }

    async fn reference_get(
        &self,
        tool: &sluice_core::ids::ToolName,
        reference: &str,
    ) -> Result<Option<sluice_core::ids::IdempotencyKey>, LedgerError> {
        self.0.reference_get(tool, reference).await
    }
}

#[async_trait]
impl sluice_ledger::BudgetStore for Unreachable {
    async fn budget_hold(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Held, LedgerError> {
        self.0
            .budget_hold(run_id, command_key, tag, lines, mode)
            .await
    }

    async fn budget_rehold(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Held, LedgerError> {
        self.0
            .budget_rehold(run_id, command_key, tag, lines, mode)
            .await
    }

    async fn budget_supersede(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        keep: &str,
    ) -> Result<(), LedgerError> {
        self.0.budget_supersede(run_id, command_key, keep).await
    }

    async fn budget_unhold(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        tag: &str,
    ) -> Result<(), LedgerError> {
        self.0.budget_unhold(run_id, command_key, tag).await
    }

    async fn reserve_held(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Budgeted, LedgerError> {
        let budgeted = self
            .0
            .reserve_held(command, audit, confined, tag, lines, mode)
            .await?;
        Ok(budgeted)
    }

    async fn budget_counters(
        &self,
        budget: &str,
        window_start: i64,
    ) -> Result<Vec<sluice_core::budget::BudgetCounter>, LedgerError> {
        self.0.budget_counters(budget, window_start).await
    }

    async fn budget_used_by_others(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        counters: &[String],
    ) -> Result<Vec<i64>, LedgerError> {
        self.0
            .budget_used_by_others(run_id, command_key, counters)
            .await
    }
}

impl Ledger for Unreachable {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_tells_whether_the_ledger_answers_and_never_why() {
    let upstream = start_upstream(Faults::none()).await;
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());
    let catalog = sluice_tests::example_catalog(&upstream.base_url());
    let mut ctx = sluice_assemble::assemble(&config, catalog)
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

/// A GET as a browser sends it, with `host` and the other `(name, value)` headers; the status
/// and body.
async fn browser_get(base: &str, path: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    let (status, _, body) = raw(base, reqwest::Method::GET, path, headers, None).await;
    (status, body)
}

/// DNS rebinding: a page at a name its author controls (`rebind.example`), made to resolve to
/// 127.0.0.1 after it loaded, is same-origin with the API as far as the browser knows. Its
/// `fetch` then reaches the producer with `Host: rebind.example:<port>` and, on a GET, no
/// `Origin` at all — so in open mode it could read every run. The producer answers only to the
/// names it is reached by (loopback names, IP addresses, `producer.allowed_hosts`): any other
/// `Host` is refused with 421 before any route, naming the key that allows it. A request a
/// browser marks as sent from another site (`Sec-Fetch-Site`) without an allowed `Origin` is
/// refused too (403), unless it is a navigation (a link to the console).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_a_name_that_is_not_the_servers_is_refused() {
    let harness = Harness::start_with(
        Faults::none(),
        |edit| edit,
        |config| config.producer.console = Some(true),
    )
    .await;
    let base = harness.agent.base().to_owned();
    let port = base.rsplit(':').next().expect("a port").to_owned();
    harness
        .agent
        .submit_created(&effect("r-secret", 1, "email/send", 0, email_args("hi")))
        .await;
    let rebound = format!("rebind.example:{port}");
    let rebound_origin = format!("http://{rebound}");

    // What the attacker's page asks: reads (no Origin on a same-origin GET), a submission
    // (with its own origin), the console, the metrics, a long poll.
    for (method, path, headers) in [
        ("GET", "/v1/runs", vec![("host", rebound.as_str())]),
        (
            "GET",
            "/v1/runs/r-secret/effects",
            vec![("host", rebound.as_str())],
        ),
        (
            "GET",
            "/v1/runs/r-secret/effects/d-1%2Femail%2Fsend%2F0?wait=5s",
            vec![("host", rebound.as_str())],
        ),
        ("GET", "/metrics", vec![("host", rebound.as_str())]),
        ("GET", "/ui/", vec![("host", rebound.as_str())]),
        ("GET", "/healthz", vec![("host", "REBIND.example")]),
        (
            "POST",
            "/v1/effects",
            vec![
                ("host", rebound.as_str()),
                ("origin", rebound_origin.as_str()),
                ("content-type", "application/json"),
            ],
        ),
    ] {
        let body = (method == "POST")
            .then(|| effect("r-rebound", 1, "email/send", 0, email_args("x")).to_string());
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let (status, _, answer) = raw(&base, method, path, &headers, body.as_deref()).await;
        assert_eq!(
            status,
            StatusCode::MISDIRECTED_REQUEST,
            "{path} {headers:?}: {answer}"
        );
        assert_eq!(
            answer["error"]["code"],
            json!("host_not_allowed"),
            "{answer}"
        );
        assert_eq!(answer["error"]["details"]["refused"], json!("host"));
        assert_eq!(
            answer["error"]["details"]["config_key"],
            json!("producer.allowed_hosts")
        );
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.to_ascii_lowercase().contains("rebind.example")
                && message.contains("producer.allowed_hosts"),
            "the refusal says what was refused and what allows it: {message}"
        );
    }
    assert!(
        harness.agent.commands("r-rebound", None).await.is_empty(),
        "nothing recorded"
    );

    // The names the producer is reached by: loopback names and IP addresses, with or without
    // a port (a port forward or a proxy changes it).
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        "LocalHost".to_owned(),
        format!("[::1]:{port}"),
        "10.1.2.3:8700".to_owned(),
        "[fd00::17]".to_owned(),
    ] {
        let (status, answer) = browser_get(&base, "/v1/runs", &[("host", &host)]).await;
        assert_eq!(status, StatusCode::OK, "{host}: {answer}");
    }

    // A page of another site that loads an API URL as an image or a script (no Origin on a
    // no-cors GET) is refused; a link followed to the console is a navigation and served.
    let (status, answer) = browser_get(
        &base,
        "/v1/runs/r-secret/effects/d-1%2Femail%2Fsend%2F0?wait=20s",
        &[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "no-cors"),
            ("sec-fetch-dest", "image"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(answer["error"]["code"], json!("cross_site"), "{answer}");
    assert_eq!(
        answer["error"]["details"]["refused"],
        json!("sec-fetch-site")
    );
    assert_eq!(
        answer["error"]["details"]["config_key"],
        json!("producer.allowed_origins")
    );
    for (site, mode, dest) in [
        ("cross-site", "navigate", "document"),
        ("same-origin", "cors", "empty"),
        ("none", "navigate", "document"),
    ] {
        let (status, _) = browser_get(
            &base,
            "/ui/",
            &[
                ("sec-fetch-site", site),
                ("sec-fetch-mode", mode),
                ("sec-fetch-dest", dest),
            ],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{site} {mode} {dest}");
    }
    harness.stop().await;

    // With tokens too: a rebound page has no token, but /metrics and the console need none.
    // A deployment reached by a name lists it: that name is served (any port, or the one
    // given), its own origin too, and nothing that merely ends or starts like it.
    let harness = Harness::start_with(
        Faults::none(),
        |edit| edit,
        |config| {
            tokens::install(config);
            config.producer.console = Some(true);
            config.producer.allowed_hosts =
                vec!["sluice-producer".into(), "ops.example.com:8443".into()];
        },
    )
    .await;
    let base = harness.agent.base().to_owned();
    let port = base.rsplit(':').next().expect("a port").to_owned();
    let rebound = format!("rebind.example:{port}");
    let rebound_origin = format!("http://{rebound}");
    for path in ["/metrics", "/ui/js/api.js"] {
        let (status, answer) = browser_get(
            &base,
            path,
            &[("host", &rebound), ("origin", &rebound_origin)],
        )
        .await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{path}: {answer}");
    }
    let admin = format!("Bearer {}", tokens::ADMIN);
    for host in [
        "sluice-producer:8700",
        "sluice-producer",
        "SLUICE-PRODUCER:80",
        "ops.example.com:8443",
    ] {
        let own = format!("http://{host}");
        let (status, answer) = browser_get(
            &base,
            "/v1/runs",
            &[("host", host), ("origin", &own), ("authorization", &admin)],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{host}: {answer}");
    }
    for host in [
        "sluice-producer.rebind.example",
        "rebind-sluice-producer:8700",
        "ops.example.com",
        "ops.example.com:8700",
    ] {
        let (status, answer) = browser_get(&base, "/metrics", &[("host", host)]).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}: {answer}");
    }
    harness.stop().await;

    // An entry that is not a host name stops the producer at start, naming it.
    let upstream = start_upstream(Faults::none()).await;
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = test_config(data.path());
    config.producer.allowed_hosts = vec!["https://sluice.example.com".into()];
    let err = config.validate().expect_err("a URL is not a host name");
    assert!(
        err.to_string().contains("producer.allowed_hosts[0]"),
        "{err}"
    );
    let pipeline =
        start_pipeline(&config, sluice_tests::example_catalog(&upstream.base_url())).await;
    let stopped = tokio::time::timeout(DEADLINE, pipeline.wait())
        .await
        .expect("the pipeline stops by itself");
    let refused = stopped.expect_err("the producer refused to start");
    assert!(refused.contains("producer.allowed_hosts[0]"), "{refused}");
    upstream.shutdown().await;
}

/// The names the shipped deployments reach the API by are answered: `k8s/producer.yaml`'s
/// `SLUICE_PRODUCER__ALLOWED_HOSTS` (the Service's names, qualified by the namespace the pod
/// reads from the downward API) loaded with `k8s/config/sluice.toml`, and `deploy/compose.yaml`'s
/// for its network. Probes and Prometheus come by the pod's IP, the host's curl by localhost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployments_names_are_answered() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| std::fs::read_to_string(root.join(path)).expect(path);
    let producer: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&read("k8s/producer.yaml")).expect("YAML");
    let env = producer
        .iter()
        .find(|doc| doc["kind"] == "Deployment")
        .and_then(|doc| doc["spec"]["template"]["spec"]["containers"][0]["env"].as_array())
        .expect("the producer's environment");
    let k8s_hosts = env
        .iter()
        .find(|e| e["name"] == "SLUICE_PRODUCER__ALLOWED_HOSTS")
        .and_then(|e| e["value"].as_str())
        .expect("SLUICE_PRODUCER__ALLOWED_HOSTS")
        .replace("$(POD_NAMESPACE)", "payments");
    let tokens = "[{ name = \"ops\", role = \"admin\", token = \"admin-token-0123456789\" }]";
    let k8s = sluice_runtime::Config::load(
        Some(&root.join("k8s/config/sluice.toml")),
        [
            ("SLUICE_PRODUCER__ALLOWED_HOSTS".to_owned(), k8s_hosts),
            ("SLUICE_AUTH__TOKENS".to_owned(), tokens.to_owned()),
        ],
    )
    .expect("the Kubernetes configuration with the producer's environment");
    let compose: serde_json::Value =
        serde_saphyr::from_str(&read("deploy/compose.yaml")).expect("YAML");
    let compose_hosts: Vec<String> = toml::from_str::<toml::Table>(&format!(
        "v = {}",
        compose["services"]["producer"]["environment"]["SLUICE_PRODUCER__ALLOWED_HOSTS"]
            .as_str()
            .expect("SLUICE_PRODUCER__ALLOWED_HOSTS")
    ))
    .expect("a TOML array")["v"]
        .as_array()
        .expect("an array")
        .iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();

    for (hosts, served, refused) in [
        (
            k8s.producer.allowed_hosts.clone(),
            vec![
                "sluice-producer:8700",
                "sluice-producer.payments:8700",
                "sluice-producer.payments.svc:8700",
                "sluice-producer.payments.svc.cluster.local:8700",
                "10.244.1.7:8700",
            ],
            vec!["sluice-producer.other:8700", "sluice.example.com"],
        ),
        (
            compose_hosts,
            vec!["producer:8700", "localhost:8700", "172.18.0.5:8700"],
            vec!["sluice-producer:8700"],
        ),
    ] {
        let harness = Harness::start_with(
            Faults::none(),
            |edit| edit,
            |config| {
                tokens::install(config);
                config.producer.allowed_hosts = hosts.clone();
            },
        )
        .await;
        let base = harness.agent.base().to_owned();
        let admin = format!("Bearer {}", tokens::ADMIN);
        for host in &served {
            for path in ["/readyz", "/metrics", "/v1/runs"] {
                let (status, answer) =
                    browser_get(&base, path, &[("host", host), ("authorization", &admin)]).await;
                assert_eq!(
                    status,
                    StatusCode::OK,
                    "{host}{path} with {hosts:?}: {answer}"
                );
            }
        }
        for host in &refused {
            let (status, answer) = browser_get(&base, "/readyz", &[("host", host)]).await;
            assert_eq!(
                status,
                StatusCode::MISDIRECTED_REQUEST,
                "{host} with {hosts:?}: {answer}"
            );
        }
        harness.stop().await;
    }
}
