//! Webhooks end to end: a real HTTP receiver that checks every request's Standard Webhooks
//! signature (on its own: HMAC-SHA256 here, not the connector's signer), the pipeline pushing
//! to it, the receiver going away and coming back, Sluice itself crashing and restarting, and
//! `sluice webhooks test` against it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use sha2::Sha256;
use sluice_core::command::CommandStatus;
use sluice_core::webhook::{Delivery, DeliveryStatus};
use sluice_ledger::Ledger;
use sluice_runtime::config::WebhookConfig;
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

/// A signing key of 32 bytes.
fn key_bytes() -> Vec<u8> {
    (0u8..32)
        .map(|i| i.wrapping_mul(7).wrapping_add(3))
        .collect()
}

fn key_text() -> String {
    format!("whsec_{}", BASE64.encode(key_bytes()))
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    webhook_id: String,
    ce_type: String,
    ce_subject: String,
    ce_specversion: String,
    ce_reason: Option<String>,
    ce_dataschema: String,
    body: Value,
}

#[derive(Clone)]
struct Shared {
    key: Vec<u8>,
    got: Arc<Mutex<Vec<Received>>>,
    /// What the receiver answers a well-signed request.
    answer: Arc<AtomicU16>,
    /// Requests refused for their signature.
    forged: Arc<Mutex<usize>>,
}

/// Whether `headers` carry a valid Standard Webhooks signature of `body` under `key`, made
/// within five minutes.
fn signed(key: &[u8], headers: &HeaderMap, body: &[u8]) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let (Some(id), Some(timestamp), Some(signatures)) = (
        text("webhook-id"),
        text("webhook-timestamp"),
        text("webhook-signature"),
    ) else {
        return false;
    };
    let Ok(seconds) = timestamp.parse::<u64>() else {
        return false;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    if now.abs_diff(seconds) > 300 {
        return false;
    }
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()));
    signatures.split(' ').any(|s| s == expected)
}

async fn receive(
    State(shared): State<Shared>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if !signed(&shared.key, &headers, &body) {
        *shared.forged.lock().expect("lock") += 1;
        return StatusCode::UNAUTHORIZED;
    }
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let status = StatusCode::from_u16(shared.answer.load(Ordering::SeqCst)).expect("a status");
    if status.is_success() {
        shared.got.lock().expect("lock").push(Received {
            path: uri.path().to_owned(),
            webhook_id: text("webhook-id"),
            ce_type: text("ce-type"),
            ce_subject: text("ce-subject"),
            ce_specversion: text("ce-specversion"),
            ce_reason: headers
                .get("ce-reason")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            ce_dataschema: text("ce-dataschema"),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        });
    }
    status
}

/// A webhook receiver on loopback that can be stopped and started again on the same port.
struct Receiver {
    addr: SocketAddr,
    shared: Shared,
    server: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl Receiver {
    async fn start() -> Self {
        let shared = Shared {
            key: key_bytes(),
            got: Arc::default(),
            answer: Arc::new(AtomicU16::new(204)),
            forged: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("bound");
        let mut receiver = Self {
            addr,
            shared,
            server: None,
        };
        receiver.serve(listener);
        receiver
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .route("/{*path}", post(receive))
            .with_state(self.shared.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .expect("the receiver serves");
        });
        self.server = Some((stop, task));
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}/{path}", self.addr)
    }

    /// Stops listening: connections to its port are refused until [`Receiver::restart`].
    async fn stop(&mut self) {
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    /// Listens again on the same port.
    async fn restart(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("the port is free again");
        self.serve(listener);
    }

    fn got(&self) -> Vec<Received> {
        self.shared.got.lock().expect("lock").clone()
    }

    fn got_at(&self, path: &str) -> Vec<Received> {
        self.got().into_iter().filter(|r| r.path == path).collect()
    }

    fn forged(&self) -> usize {
        *self.shared.forged.lock().expect("lock")
    }
}

fn subscription(name: &str, url: String, types: &[&str]) -> WebhookConfig {
    WebhookConfig {
        name: name.into(),
        url,
        secret: key_text().into(),
        types: types.iter().map(|t| (*t).to_owned()).collect(),
        timeout_ms: 1_000,
        max_attempts: 50,
        first_backoff_ms: 100,
        max_backoff_ms: 400,
    }
}

/// A bank that books every wire and answers 5xx, and whose status checks never answer: a
/// wire ends STUCK after one look.
fn stuck_bank() -> Faults {
    Faults::none()
        .with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThen5xx, 1.0),
        )
        .with_status_inconclusive(1.0)
}

fn stuck_wires(c: CatalogEdit) -> CatalogEdit {
    c.dispatch("payments/wire", "timeout_ms", 400)
        .policy("payments/wire", "lease_ttl_ms", 2_000)
        .policy("payments/wire", "settle_ms", 300)
        .policy("payments/wire", "max_checks", 1)
}

async fn deliveries(ledger: &dyn Ledger, webhook: &str) -> Vec<Delivery> {
    ledger.webhook_list(webhook, 100).await.expect("listed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_wire_pushes_one_signed_cloud_event_and_its_escalation() {
    let receiver = Receiver::start().await;
    let (stuck_url, escalated_url) = (receiver.url("stuck"), receiver.url("escalated"));
    let h = Harness::start_with(stuck_bank(), stuck_wires, |config| {
        config.webhooks = vec![
            // Named without a version, as before types had one: takes version 1.
            subscription("on-call", stuck_url, &["dev.sluice.effect.stuck"]),
            subscription(
                "escalations",
                escalated_url,
                &["dev.sluice.effect.escalated.v1"],
            ),
        ];
    })
    .await;
    let (run, key) = ("r-webhook-stuck", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-wh", 5_000),
        ))
        .await;
    let wire = h.agent.wait_settled(run, key).await;
    assert_eq!(wire.status(), CommandStatus::Stuck, "{wire:?}");

    let pushed = eventually("the STUCK event reaches the receiver", DEADLINE, || async {
        let got = receiver.got_at("/stuck");
        (!got.is_empty()).then_some(got)
    })
    .await;
    let event = &pushed[0];
    assert_eq!(event.ce_type, "dev.sluice.effect.stuck.v1");
    assert_eq!(event.ce_specversion, "1.0");
    assert_eq!(event.ce_subject, format!("{run}/{key}"));
    assert_eq!(
        event.ce_dataschema,
        "https://sluice.dev/schemas/events/dev.sluice.effect.stuck.v1.json"
    );
    assert_eq!(event.body["status"], "STUCK", "the projection as data");
    assert_eq!(event.body["run_id"], run);
    assert!(
        event.body.get("args").is_none() && event.body.get("lease").is_none(),
        "no arguments, no lease: {}",
        event.body
    );
    let escalation = eventually("the escalation reaches the receiver", DEADLINE, || async {
        receiver.got_at("/escalated").into_iter().next()
    })
    .await;
    assert_eq!(escalation.ce_subject, format!("{run}/{key}"));
    assert_eq!(escalation.ce_type, "dev.sluice.effect.escalated.v1");
    assert_eq!(
        escalation.body["escalation_reason"].as_str(),
        escalation.ce_reason.as_deref(),
        "the reason is in the data too"
    );
    assert!(
        escalation
            .ce_reason
            .as_deref()
            .is_some_and(|r| !r.is_empty()),
        "the reason travels in ce-reason: {escalation:?}"
    );

    // Once: nothing more arrives for the STUCK event, and the ledger says delivered.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(receiver.got_at("/stuck").len(), 1, "{:?}", receiver.got());
    assert_eq!(receiver.forged(), 0, "every request was signed");
    let kept = deliveries(h.ctx().ledger.as_ref(), "on-call").await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].status, DeliveryStatus::Delivered);
    assert_eq!(kept[0].attempts, 1);
    assert_eq!(kept[0].id(), event.webhook_id, "webhook-id is the event id");
    assert_eq!(
        event.webhook_id,
        sluice_core::webhook::event_id(
            run,
            key,
            "dev.sluice.effect.stuck",
            wire.state.updated_at,
            wire.epoch().get()
        ),
        "derived from the transition, as the catch-up at start rebuilds it"
    );
    let metrics = &h.ctx().metrics;
    assert_eq!(
        metrics
            .webhook_deliveries
            .with_label_values(&["on-call", "delivered"])
            .get(),
        1
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_is_delivered_once_after_its_receiver_restarts() {
    let mut receiver = Receiver::start().await;
    let url = receiver.url("events");
    receiver.stop().await;
    let h = Harness::start_with(
        Faults::none(),
        |c| c,
        |config| {
            config.webhooks = vec![subscription("ops", url, &["dev.sluice.effect.confirmed"])];
        },
    )
    .await;
    let (run, key) = ("r-webhook-restart", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-rs", 7_000),
        ))
        .await;
    assert_eq!(
        h.agent.wait_settled(run, key).await.status(),
        CommandStatus::Confirmed
    );

    // Down: attempts fail (connection refused) and are kept with their error.
    let ledger = Arc::clone(&h.ctx().ledger);
    let waiting = eventually(
        "three attempts against the receiver that is down",
        DEADLINE,
        || {
            let ledger = Arc::clone(&ledger);
            async move {
                let kept = deliveries(ledger.as_ref(), "ops").await;
                kept.first()
                    .filter(|d| d.attempts >= 3 && d.status == DeliveryStatus::Pending)
                    .cloned()
            }
        },
    )
    .await;
    assert!(
        waiting
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("connect")),
        "{waiting:?}"
    );
    assert!(receiver.got().is_empty());

    // Back: delivered, once.
    receiver.restart().await;
    let delivered = eventually("delivered after the restart", DEADLINE, || {
        let ledger = Arc::clone(&ledger);
        async move {
            let kept = deliveries(ledger.as_ref(), "ops").await;
            kept.first()
                .filter(|d| d.status == DeliveryStatus::Delivered)
                .cloned()
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].ce_type, "dev.sluice.effect.confirmed.v1");
    assert_eq!(got[0].webhook_id, delivered.id());
    assert!(delivered.attempts > waiting.attempts, "{delivered:?}");
    assert_eq!(delivered.last_error, None);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_accepted_survives_a_crash_of_sluice() {
    init_tracing();
    let mut receiver = Receiver::start().await;
    let url = receiver.url("events");
    receiver.stop().await;
    let upstream = start_upstream(Faults::none()).await;
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = test_config(data.path());
    config.webhooks = vec![subscription("ops", url, &["dev.sluice.effect.confirmed"])];
    let catalog = || example_catalog(&upstream.base_url());

    let first = Detached::start(&config, catalog()).await;
    let agent = Agent::new(&first.url);
    let (run, key) = ("r-webhook-crash", "d-1/payments/wire/0");
    agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-cr", 9_000),
        ))
        .await;
    assert_eq!(
        agent.wait_settled(run, key).await.status(),
        CommandStatus::Confirmed
    );
    // The delivery is in the ledger, attempted against the receiver that is down.
    let outside = open_ledger(data.path());
    eventually("the delivery is stored and attempted", DEADLINE, || async {
        let kept = deliveries(&outside, "ops").await;
        kept.first().filter(|d| d.attempts >= 1).cloned()
    })
    .await;
    first.crash();
    drop(outside);

    // Sluice comes back (the embedded bus empty), and so does the receiver.
    receiver.restart().await;
    let second = start_pipeline(&config, catalog()).await;
    let ledger = Arc::clone(&second.ctx.ledger);
    eventually("delivered by the restarted process", DEADLINE, || {
        let ledger = Arc::clone(&ledger);
        async move {
            let kept = deliveries(ledger.as_ref(), "ops").await;
            kept.first()
                .filter(|d| d.status == DeliveryStatus::Delivered)
                .cloned()
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let got = receiver.got();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].ce_subject, format!("{run}/{key}"));
    second.stop().await.expect("every service stops cleanly");
    upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_test_sends_a_signed_event_and_prints_the_answer() {
    let receiver = Receiver::start().await;
    let hook = subscription("ops", receiver.url("test"), &["dev.sluice.effect.stuck"]);
    let report = sluice_cli::webhooks_cmd::test(&hook)
        .await
        .expect("accepted");
    assert!(report.contains("answered HTTP 204"), "{report}");
    let got = receiver.got();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].ce_type, "dev.sluice.webhook.test");
    assert_eq!(got[0].body["webhook"], "ops");
    assert!(report.contains(&got[0].webhook_id), "{report}");

    // A receiver that refuses: the answer is printed and the command fails.
    receiver.shared.answer.store(503, Ordering::SeqCst);
    let refused = sluice_cli::webhooks_cmd::test(&hook)
        .await
        .expect_err("refused");
    assert!(refused.contains("HTTP 503"), "{refused}");
    // A wrong key: the receiver's own check refuses it.
    let mut forged = hook.clone();
    forged.secret = format!("whsec_{}", BASE64.encode([9u8; 32])).into();
    receiver.shared.answer.store(204, Ordering::SeqCst);
    let refused = sluice_cli::webhooks_cmd::test(&forged)
        .await
        .expect_err("forged");
    assert!(refused.contains("HTTP 401"), "{refused}");
    assert_eq!(receiver.forged(), 1);
    // Nobody listening: said so, without the URL's secrets (there are none here).
    let mut nowhere = hook.clone();
    nowhere.url = "http://127.0.0.1:9/none".into();
    let refused = sluice_cli::webhooks_cmd::test(&nowhere)
        .await
        .expect_err("down");
    assert!(refused.contains("no answer"), "{refused}");
    assert!(!refused.contains(&key_text()), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_wire_never_pushed_is_pushed_when_the_deliverer_starts_and_only_once() {
    let receiver = Receiver::start().await;
    // No subscription yet: the STUCK event is published and nobody takes it (as when a
    // process dies between the transition and its publish).
    let Harness {
        upstream,
        pipeline,
        agent,
        mut config,
        data,
    } = Harness::start(stuck_bank(), stuck_wires).await;
    let (run, key) = ("r-webhook-catch-up", "d-1/payments/wire/0");
    agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-cu", 5_000),
        ))
        .await;
    assert_eq!(
        agent.wait_settled(run, key).await.status(),
        CommandStatus::Stuck
    );
    pipeline.stop().await.expect("every service stops cleanly");
    assert!(receiver.got().is_empty());

    config.webhooks = vec![subscription(
        "on-call",
        receiver.url("stuck"),
        &["dev.sluice.effect.stuck"],
    )];
    let catalog = || stuck_wires(CatalogEdit::example(&upstream.base_url())).build();
    let second = start_pipeline(&config, catalog()).await;
    let pushed = eventually("the STUCK wire pushed at start", DEADLINE, || async {
        receiver.got().into_iter().next()
    })
    .await;
    assert_eq!(pushed.ce_type, "dev.sluice.effect.stuck.v1");
    assert_eq!(pushed.ce_subject, format!("{run}/{key}"));
    assert_eq!(pushed.body["status"], "STUCK");
    second.stop().await.expect("every service stops cleanly");

    // Another start finds it delivered: not pushed again.
    let third = start_pipeline(&config, catalog()).await;
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(receiver.got().len(), 1, "{:?}", receiver.got());
    third.stop().await.expect("every service stops cleanly");
    upstream.shutdown().await;
    drop(data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_given_up_is_listed_and_sent_again_by_retry() {
    let mut receiver = Receiver::start().await;
    let url = receiver.url("events");
    receiver.stop().await;
    let h = Harness::start_with(
        Faults::none(),
        |c| c,
        |config| {
            let mut hook = subscription("ops", url, &["dev.sluice.effect.confirmed"]);
            hook.max_attempts = 2;
            config.webhooks = vec![hook];
        },
    )
    .await;
    let (run, key) = ("r-webhook-retry", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-rt", 3_000),
        ))
        .await;
    h.agent.wait_settled(run, key).await;
    let ledger = Arc::clone(&h.ctx().ledger);
    let failed = eventually("given up after two attempts", DEADLINE, || {
        let ledger = Arc::clone(&ledger);
        async move {
            let kept = deliveries(ledger.as_ref(), "ops").await;
            kept.first()
                .filter(|d| d.status == DeliveryStatus::Failed)
                .cloned()
        }
    })
    .await;
    assert_eq!(failed.attempts, 2);
    let listed = sluice_cli::webhooks_cmd::list(&h.config, "ops", 10)
        .await
        .expect("listed");
    assert!(
        listed.contains("0 pending, 0 delivered, 1 failed"),
        "{listed}"
    );
    assert!(listed.contains(failed.id()), "{listed}");

    receiver.restart().await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        receiver.got().is_empty(),
        "a FAILED delivery waits for a person"
    );
    let answer = sluice_cli::webhooks_cmd::retry(&h.config, "ops", None)
        .await
        .expect("retried");
    assert!(answer.contains("1 deliveries pending again"), "{answer}");
    eventually("delivered once retried", DEADLINE, || async {
        (receiver.got().len() == 1).then_some(())
    })
    .await;
    let listed = sluice_cli::webhooks_cmd::list(&h.config, "ops", 10)
        .await
        .expect("listed");
    assert!(
        listed.contains("0 pending, 1 delivered, 0 failed"),
        "{listed}"
    );
    let unknown = sluice_cli::webhooks_cmd::retry(&h.config, "ops", Some("no-such-event"))
        .await
        .expect_err("no such delivery");
    assert!(unknown.contains("no-such-event"), "{unknown}");
    h.stop().await;
}
