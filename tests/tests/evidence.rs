//! Evidence by webhook end to end on `sluice dev` (SQLite), with a signed test sender: the
//! test signs its requests itself (the `hmac` crate, Standard Webhooks' `id.timestamp.body`),
//! independent of the verifier under test. The demo bank commits a wire and loses the answer,
//! its status check answers 503 every time, so the wire waits UNKNOWN — until the bank's
//! signed `wire.booked` event settles it CONFIRMED, once, however often it is sent. Forged,
//! unsigned and stale requests are refused and leave nothing behind; an event naming no
//! command is recorded unmatched and listed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_core::command::CommandStatus::*;
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

/// The bank's signing key (`whsec_` + base64 of 32 bytes), in the file the catalog names.
const KEY: &str = "whsec_c2x1aWNlLWV2aWRlbmNlLXRlc3Qta2V5LTMyYnl0ZXM=";

fn with_evidence(c: CatalogEdit, key_file: &std::path::Path) -> CatalogEdit {
    let source: toml::Table = toml::from_str(&format!(
        r#"
[bank]
scheme = "standard_webhooks"
secret = {{ file = "{}" }}
tolerance_s = 60
"#,
        key_file.display()
    ))
    .expect("the source's TOML parses");
    let declared: toml::Table = toml::from_str(
        r#"
source = "bank"
key_pointer = "/data/idempotency_key"
reference_pointer = "/data/id"
outcome_pointer = "/type"
present = ["wire.booked"]
failed = ["wire.rejected"]
"#,
    )
    .expect("the evidence TOML parses");
    c.top("evidence_sources", source)
        .tool_key("payments/wire", "evidence", declared)
        .dispatch("payments/wire", "timeout_ms", 400)
        .policy("payments/wire", "lease_ttl_ms", 2_000)
        .policy("payments/wire", "late_commit_ms", 100)
        // The lookup answers 503 throughout: the wire waits UNKNOWN for the webhook.
        .policy("payments/wire", "max_checks", 1_000)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// The Standard Webhooks signature of `id.timestamp.body` under `key`.
fn sign(key: &str, id: &str, timestamp: u64, body: &[u8]) -> String {
    let bytes = BASE64
        .decode(key.trim_start_matches("whsec_"))
        .expect("a base64 key");
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&bytes).expect("any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

struct Sent {
    status: StatusCode,
    body: Value,
}

/// POSTs `event` to `/v1/evidence/{source}` signed with `key` at `timestamp` (no signature
/// with `key` = `None`).
async fn send(
    base: &str,
    source: &str,
    id: &str,
    event: &Value,
    key: Option<&str>,
    timestamp: u64,
) -> Sent {
    let body = serde_json::to_vec(event).expect("JSON");
    let mut request = reqwest::Client::new()
        .post(format!("{base}/v1/evidence/{source}"))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string());
    if let Some(key) = key {
        request = request.header("webhook-signature", sign(key, id, timestamp, &body));
    }
    let answer = request.body(body).send().await.expect("an answer");
    let status = answer.status();
    let body = answer.json().await.unwrap_or(Value::Null);
    Sent { status, body }
}

fn booked(idempotency_key: &str, wire_id: &str) -> Value {
    json!({
        "type": "wire.booked",
        "data": {"id": wire_id, "idempotency_key": idempotency_key, "amount_minor": 5_000}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_webhook_settles_an_unknown_wire_once_and_forgeries_change_nothing() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("bank.key");
    std::fs::write(&key_file, format!("{KEY}\n")).expect("the key file is written");
    let faults = Faults::none()
        .with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThenTimeout, 1.0),
        )
        .with_timeout_sleep(Duration::from_secs(2))
        .with_status_inconclusive(1.0);
    let h = Harness::start(faults, |c| with_evidence(c, &key_file)).await;
    let base = h.pipeline.url();
    let run = "r-evidence-1";
    let key = "d-1/payments/wire/0";
    let idempotency_key = format!("{run}/{key}");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ev-1", 5_000),
        ))
        .await;
    let unknown = h
        .agent
        .wait_until(run, key, "UNKNOWN", |c| c.status() == Unknown)
        .await;
    assert!(unknown.state.external_ref.is_none());
    // Looked up in vain at least once (a 503): still UNKNOWN.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.agent.get(run, key).await.status(), Unknown);

    let event = booked(&idempotency_key, "w-by-webhook-1");
    let now = unix_now();
    // Forged, unsigned, stale, unknown source: refused, nothing recorded, nothing applied.
    let forged = send(
        &base,
        "bank",
        "msg_1",
        &event,
        Some("whsec_Zm9yZ2VkLWtleS1mb3JnZWQta2V5LWZvcmdlZC1rZXk="),
        now,
    )
    .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED, "{:?}", forged.body);
    assert_eq!(
        forged.body["error"]["code"], "bad_signature",
        "{:?}",
        forged.body
    );
    let unsigned = send(&base, "bank", "msg_1", &event, None, now).await;
    assert_eq!(unsigned.status, StatusCode::UNAUTHORIZED);
    assert!(
        unsigned.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("webhook-signature")),
        "the refusal says what was wrong: {:?}",
        unsigned.body
    );
    let stale = send(&base, "bank", "msg_1", &event, Some(KEY), now - 600).await;
    assert_eq!(stale.status, StatusCode::UNAUTHORIZED);
    assert!(
        stale.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("tolerance")),
        "{:?}",
        stale.body
    );
    let unknown_source = send(&base, "acme", "msg_1", &event, Some(KEY), now).await;
    assert_eq!(unknown_source.status, StatusCode::NOT_FOUND);
    let listed = h.agent.call("GET", "/v1/evidence?source=bank", None).await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    assert_eq!(
        listed.body["evidence"],
        json!([]),
        "a forgery is recorded nowhere"
    );
    assert_eq!(h.agent.get(run, key).await.status(), Unknown);

    // The genuine event settles the wire as a lookup's `present` would.
    let applied = send(&base, "bank", "msg_1", &event, Some(KEY), now).await;
    assert_eq!(applied.status, StatusCode::OK, "{:?}", applied.body);
    assert_eq!(applied.body["result"], "applied", "{:?}", applied.body);
    assert_eq!(applied.body["idempotency_key"], idempotency_key.as_str());
    let wire = h.agent.get(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(wire.state.external_ref.as_deref(), Some("w-by-webhook-1"));
    assert_eq!(
        wire.state.attempts, 1,
        "confirmed without a second dispatch"
    );

    // Sent again (a sender's retry): answered 200 `replay`, never applied twice.
    for _ in 0..3 {
        let again = send(&base, "bank", "msg_1", &event, Some(KEY), unix_now()).await;
        assert_eq!(again.status, StatusCode::OK);
        assert_eq!(again.body["result"], "replay", "{:?}", again.body);
        assert_eq!(again.body["disposition"], "applied");
    }
    let trail = h.audit(run).await;
    let by_webhook: Vec<_> = trail
        .of(key)
        .into_iter()
        .filter(|e| e.record.actor == "evidence:bank")
        .collect();
    assert_eq!(by_webhook.len(), 1, "one record of the webhook: {trail:?}");
    let record = &by_webhook[0].record;
    assert_eq!((record.from, record.to), (Some(Unknown), Some(Confirmed)));
    assert!(
        record.reason.starts_with("evidence bank/msg_1 (present)"),
        "{}",
        record.reason
    );
    assert_eq!(
        record.evidence["event"], event,
        "the event is the record's evidence"
    );
    assert_eq!(record.evidence["event_id"], "msg_1");

    // A `wire.rejected` for the CONFIRMED wire goes to a person; the wire stays CONFIRMED.
    let rejected = json!({"type": "wire.rejected", "data": {"id": "w-by-webhook-1", "idempotency_key": idempotency_key}});
    let contradicted = send(&base, "bank", "msg_2", &rejected, Some(KEY), unix_now()).await;
    assert_eq!(
        contradicted.body["result"], "applied",
        "{:?}",
        contradicted.body
    );
    let wire = h.agent.get(run, key).await;
    assert_eq!(wire.status(), Confirmed);
    assert!(wire.state.escalated, "a person is asked: {wire:?}");

    // An event naming no command Sluice knows: recorded unmatched, listed for an admin.
    let stray = booked("r-nobody/d-1/payments/wire/0", "w-stray");
    let unmatched = send(&base, "bank", "msg_3", &stray, Some(KEY), unix_now()).await;
    assert_eq!(unmatched.status, StatusCode::OK);
    assert_eq!(
        unmatched.body["result"], "unmatched",
        "{:?}",
        unmatched.body
    );
    let listed = h.agent.call("GET", "/v1/evidence?source=bank", None).await;
    let ids: Vec<&str> = listed.body["evidence"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["event_id"].as_str().expect("an id"))
        .collect();
    assert_eq!(ids, ["msg_3", "msg_2", "msg_1"], "{:?}", listed.body);
    assert_eq!(listed.body["evidence"][0]["disposition"], "unmatched");

    let metrics = h.agent.call("GET", "/metrics", None).await;
    let text = &metrics.text;
    for (result, at_least) in [
        ("bad_signature", 3),
        ("replay", 3),
        ("applied", 2),
        ("unmatched", 1),
    ] {
        let line =
            format!("sluice_evidence_received_total{{result=\"{result}\",source=\"bank\"}} ");
        let count: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} in the metrics"));
        assert!(count >= at_least, "{line}{count}");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_comes_before_the_dispatch_answer_settles_the_wire_once_it_is_unknown() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("bank.key");
    std::fs::write(&key_file, KEY).expect("the key file is written");
    // The bank commits and holds its answer past the call's timeout (1.5 s): the wire is
    // LEASED meanwhile. Its lookup answers 503 throughout.
    let faults = Faults::none()
        .with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThenTimeout, 1.0),
        )
        .with_timeout_sleep(Duration::from_secs(4))
        .with_status_inconclusive(1.0);
    let h = Harness::start(faults, |c| {
        with_evidence(c, &key_file)
            .dispatch("payments/wire", "timeout_ms", 1_500)
            .policy("payments/wire", "lease_ttl_ms", 4_000)
    })
    .await;
    let base = h.pipeline.url();
    let run = "r-evidence-early";
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ev-2", 5_000),
        ))
        .await;
    h.agent
        .wait_until(run, key, "LEASED", |c| c.status() == Leased)
        .await;
    let event = booked(&format!("{run}/{key}"), "w-early-1");
    let early = send(&base, "bank", "msg_early", &event, Some(KEY), unix_now()).await;
    assert_eq!(early.status, StatusCode::OK, "{:?}", early.body);
    assert_eq!(early.body["result"], "recorded", "{:?}", early.body);
    assert!(
        early.body["note"]
            .as_str()
            .is_some_and(|n| n.contains("LEASED")),
        "{:?}",
        early.body
    );
    // The call times out: UNKNOWN, and the look applies the event kept for it.
    let wire = h
        .agent
        .wait_until(run, key, "CONFIRMED", |c| c.status() == Confirmed)
        .await;
    assert_eq!(wire.state.external_ref.as_deref(), Some("w-early-1"));
    assert_eq!(wire.state.attempts, 1);
    let trail = h.audit(run).await;
    let settled: Vec<_> = trail
        .of(key)
        .into_iter()
        .filter(|e| e.record.to == Some(Confirmed))
        .collect();
    assert_eq!(settled.len(), 1, "{trail:?}");
    assert_eq!(settled[0].record.from, Some(Unknown));
    assert!(
        settled[0]
            .record
            .reason
            .starts_with("evidence bank/msg_early (present)"),
        "{}",
        settled[0].record.reason
    );
    assert_eq!(settled[0].record.evidence["event"], event);
    // Applied now, and a repeat of it is a replay.
    let listed = h.agent.call("GET", "/v1/evidence?source=bank", None).await;
    assert_eq!(
        listed.body["evidence"][0]["disposition"], "applied",
        "{:?}",
        listed.body
    );
    let again = send(&base, "bank", "msg_early", &event, Some(KEY), unix_now()).await;
    assert_eq!(again.body["result"], "replay");
    h.stop().await;
}

/// localstripe's own webhooks, signed by its own code (`Stripe-Signature: t=…,v1=…`), settle a
/// wire waiting UNKNOWN: the payment intent carries the wire's idempotency key in its
/// `metadata`, as a Stripe tool's request puts it there. (localstripe sends
/// `payment_intent.*`, `customer.*` and `invoice.*` events, not `charge.*`; it sends each once,
/// a second after the change, and does not retry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn localstripes_signed_payment_intent_webhook_settles_an_unknown_wire() {
    if std::env::var("SLUICE_SKIP_EMULATORS").is_ok_and(|v| v == "1") {
        eprintln!("SLUICE_SKIP_EMULATORS=1: localstripe's webhooks not tested");
        return;
    }
    let stripe = std::env::var("SLUICE_EMU_LOCALSTRIPE_URL").unwrap_or_else(|_| {
        panic!(
            "SLUICE_EMU_LOCALSTRIPE_URL is not set: start the emulators with \
             `eval \"$(scripts/emulators/start.sh)\"` (scripts/test.sh does), or set \
             SLUICE_SKIP_EMULATORS=1 to skip this test"
        )
    });
    let secret = format!("whsec_localstripe_{}", uuid::Uuid::new_v4().simple());
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("stripe.key");
    std::fs::write(&key_file, &secret).expect("the key file is written");
    let faults = Faults::none()
        .with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThenTimeout, 1.0),
        )
        .with_timeout_sleep(Duration::from_secs(2))
        .with_status_inconclusive(1.0);
    let h = Harness::start(faults, |c| {
        let source: toml::Table = toml::from_str(&format!(
            "[stripe]\nscheme = \"stripe\"\nsecret = {{ file = \"{}\" }}\n",
            key_file.display()
        ))
        .expect("the source's TOML parses");
        let declared: toml::Table = toml::from_str(
            r#"
source = "stripe"
key_pointer = "/data/object/metadata/sluice_key"
reference_pointer = "/data/object/id"
outcome_pointer = "/type"
present = ["payment_intent.succeeded"]
failed = ["payment_intent.payment_failed"]
"#,
        )
        .expect("the evidence TOML parses");
        c.top("evidence_sources", source)
            .tool_key("payments/wire", "evidence", declared)
            .dispatch("payments/wire", "timeout_ms", 400)
            .policy("payments/wire", "lease_ttl_ms", 2_000)
            .policy("payments/wire", "late_commit_ms", 100)
            .policy("payments/wire", "max_checks", 1_000)
    })
    .await;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
    let client = reqwest::Client::new();
    let form = |path: &str, pairs: Vec<(String, String)>| {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        client
            .post(format!("{stripe}{path}"))
            .bearer_auth("sk_test_sluice")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
    };
    let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    // localstripe posts its payment intents' events to this producer, signed with `secret`.
    let hook = form(
        &format!("/_config/webhooks/sluice-evidence-{tag}"),
        pairs(&[
            ("url", &format!("{}/v1/evidence/stripe", h.pipeline.url())),
            ("secret", &secret),
            ("events[0]", "payment_intent.succeeded"),
            ("events[1]", "payment_intent.payment_failed"),
        ]),
    )
    .send()
    .await
    .expect("localstripe answers");
    assert!(hook.status().is_success(), "{:?}", hook.text().await);

    let run = format!("r-localstripe-{tag}");
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            &run,
            1,
            "payments/wire",
            0,
            wire_args(&format!("acc-ls-{tag}"), 5_000),
        ))
        .await;
    h.agent
        .wait_until(&run, key, "UNKNOWN", |c| c.status() == Unknown)
        .await;

    let method: Value = form(
        "/v1/payment_methods",
        pairs(&[
            ("type", "card"),
            ("card[number]", "4242424242424242"),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2034"),
            ("card[cvc]", "123"),
        ]),
    )
    .send()
    .await
    .expect("localstripe answers")
    .json()
    .await
    .expect("a payment method");
    let method = method["id"]
        .as_str()
        .expect("a payment method id")
        .to_owned();
    let intent: Value = form(
        "/v1/payment_intents",
        pairs(&[
            ("amount", "5000"),
            ("currency", "eur"),
            ("payment_method", &method),
            ("confirm", "true"),
            ("metadata[sluice_key]", &format!("{run}/{key}")),
        ]),
    )
    .send()
    .await
    .expect("localstripe answers")
    .json()
    .await
    .expect("a payment intent");
    let intent_id = intent["id"].as_str().expect("an intent id").to_owned();
    assert_eq!(intent["status"], "succeeded", "{intent}");

    let wire = h
        .agent
        .wait_until(&run, key, "CONFIRMED", |c| c.status() == Confirmed)
        .await;
    assert_eq!(wire.state.external_ref.as_deref(), Some(intent_id.as_str()));
    let trail = h.audit(&run).await;
    let by_webhook: Vec<_> = trail
        .of(key)
        .into_iter()
        .filter(|e| e.record.actor == "evidence:stripe")
        .collect();
    assert_eq!(by_webhook.len(), 1, "{trail:?}");
    assert_eq!(
        by_webhook[0].record.evidence["event"]["type"],
        "payment_intent.succeeded"
    );
    assert_eq!(
        by_webhook[0].record.evidence["event"]["data"]["object"]["id"],
        intent_id.as_str()
    );
    h.stop().await;
}

/// A payment provider that accepts every wire with `202 Accepted` and tells the outcome
/// later: a real HTTP server on a free port, counting the calls it takes.
async fn accepting_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    accepting_upstream_answering(json!({"job": "j-1", "status": "processing"})).await
}

/// The same, answering every call `202` with `body`.
async fn accepting_upstream_answering(
    body: Value,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::any(move || {
            let counted = Arc::clone(&counted);
            let body = body.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                (axum::http::StatusCode::ACCEPTED, axum::Json(body))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/wires"), calls)
}

/// `[tool.async]` for the wire: 202 means accepted, the outcome comes within `deadline_ms`.
fn accepted_by(c: CatalogEdit, url: &str, deadline_ms: i64, then: &str) -> CatalogEdit {
    let declared: toml::Table = toml::from_str(&format!(
        "accepted_status = [202]\ndeadline_ms = {deadline_ms}\nthen = \"{then}\""
    ))
    .expect("the async TOML parses");
    c.tool_key("payments/wire", "async", declared)
        .dispatch("payments/wire", "url", url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_wire_waits_for_its_webhook_and_is_not_looked_up_before_the_deadline() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("bank.key");
    std::fs::write(&key_file, format!("{KEY}\n")).expect("the key file is written");
    let (url, calls) = accepting_upstream().await;
    // The bank's lookup would find nothing (no wire was booked there): a look before the
    // deadline would be seen as checks on the command.
    let h = Harness::start(Faults::none(), |c| {
        accepted_by(with_evidence(c, &key_file), &url, 60_000, "look")
    })
    .await;
    let base = h.pipeline.url();
    let run = "r-async-1";
    let key = "d-1/payments/wire/0";
    let idempotency_key = format!("{run}/{key}");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-as-1", 5_000),
        ))
        .await;
    let waiting = h
        .agent
        .wait_until(run, key, "UNKNOWN", |c| c.status() == Unknown)
        .await;
    assert!(
        waiting.state.awaiting_callback.is_some(),
        "waiting for the outcome: {waiting:?}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let still = h.agent.get(run, key).await;
    assert_eq!(still.status(), Unknown);
    assert_eq!(
        still.state.checks, 0,
        "not looked up before the deadline: {still:?}"
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "sent once"
    );

    let event = booked(&idempotency_key, "w-async-1");
    let applied = send(&base, "bank", "msg_async_1", &event, Some(KEY), unix_now()).await;
    assert_eq!(applied.body["result"], "applied", "{:?}", applied.body);
    let wire = h.agent.get(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(wire.state.external_ref.as_deref(), Some("w-async-1"));
    assert!(wire.state.awaiting_callback.is_none());
    let again = send(&base, "bank", "msg_async_1", &event, Some(KEY), unix_now()).await;
    assert_eq!(again.body["result"], "replay", "{:?}", again.body);
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "never sent again"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_accepted_wire_whose_outcome_never_comes_goes_to_a_person_at_the_deadline() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("bank.key");
    std::fs::write(&key_file, format!("{KEY}\n")).expect("the key file is written");
    let (url, calls) = accepting_upstream().await;
    let h = Harness::start(Faults::none(), |c| {
        accepted_by(with_evidence(c, &key_file), &url, 1_500, "escalate")
    })
    .await;
    let run = "r-async-2";
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-as-2", 5_000),
        ))
        .await;
    h.agent
        .wait_until(run, key, "UNKNOWN", |c| c.status() == Unknown)
        .await;
    let stuck = h
        .agent
        .wait_until(run, key, "STUCK", |c| c.status() == Stuck)
        .await;
    assert!(stuck.state.escalated);
    assert_eq!(stuck.state.checks, 0, "a person, not a lookup: {stuck:?}");
    let trail = h.audit(run).await;
    let escalation = trail
        .of(key)
        .into_iter()
        .find(|e| e.record.to == Some(Stuck))
        .expect("the escalation is in the audit chain");
    assert_eq!(escalation.record.from, Some(Unknown));
    assert!(
        escalation.record.reason.contains("by the deadline"),
        "{}",
        escalation.record.reason
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "never sent again"
    );
    h.stop().await;
}

/// `[tool.evidence]` for a provider whose events name the job by its own id and never echo
/// the idempotency key: matched by reference only.
fn with_evidence_by_reference(c: CatalogEdit, key_file: &std::path::Path) -> CatalogEdit {
    let source: toml::Table = toml::from_str(&format!(
        "[psp]\nscheme = \"standard_webhooks\"\nsecret = {{ file = \"{}\" }}\ntolerance_s = 60\n",
        key_file.display()
    ))
    .expect("the source's TOML parses");
    let declared: toml::Table = toml::from_str(
        r#"
source = "psp"
reference_pointer = "/data/object/id"
outcome_pointer = "/type"
present = ["job.succeeded"]
failed = ["job.failed"]
"#,
    )
    .expect("the evidence TOML parses");
    c.top("evidence_sources", source)
        .tool_key("payments/wire", "evidence", declared)
}

fn job_event(id: &str, job: &str) -> Value {
    json!({"id": id, "type": "job.succeeded", "data": {"object": {"id": job}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_naming_the_job_by_its_id_settles_the_accepted_wire_without_the_key() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("psp.key");
    std::fs::write(&key_file, format!("{KEY}\n")).expect("the key file is written");
    let (url, calls) =
        accepting_upstream_answering(json!({"id": "job_7", "status": "pending"})).await;
    let h = Harness::start(Faults::none(), |c| {
        accepted_by(
            with_evidence_by_reference(c, &key_file),
            &url,
            60_000,
            "look",
        )
    })
    .await;
    let base = h.pipeline.url();
    let run = "r-by-ref-1";
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ref-1", 5_000),
        ))
        .await;
    let waiting = h
        .agent
        .wait_until(run, key, "UNKNOWN", |c| c.status() == Unknown)
        .await;
    assert!(waiting.state.awaiting_callback.is_some(), "{waiting:?}");
    assert_eq!(
        waiting.state.external_ref.as_deref(),
        Some("job_7"),
        "the 202's job id is kept: {waiting:?}"
    );

    // No key anywhere in the event: the job's id names the wire.
    let event = job_event("evt_1", "job_7");
    assert!(!event.to_string().contains(run), "the event carries no key");
    let applied = send(&base, "psp", "evt_1", &event, Some(KEY), unix_now()).await;
    assert_eq!(applied.status, StatusCode::OK, "{:?}", applied.body);
    assert_eq!(applied.body["result"], "applied", "{:?}", applied.body);
    assert_eq!(
        applied.body["idempotency_key"],
        format!("{run}/{key}").as_str()
    );
    let wire = h.agent.get(run, key).await;
    assert_eq!(wire.status(), Confirmed, "{wire:?}");
    assert_eq!(wire.state.external_ref.as_deref(), Some("job_7"));
    assert_eq!(
        wire.state.checks, 0,
        "settled before the deadline, unlooked-up"
    );
    assert!(wire.state.awaiting_callback.is_none());
    let trail = h.audit(run).await;
    let by_webhook: Vec<_> = trail
        .of(key)
        .into_iter()
        .filter(|e| e.record.actor == "evidence:psp")
        .collect();
    assert_eq!(by_webhook.len(), 1, "{trail:?}");
    assert_eq!(
        (by_webhook[0].record.from, by_webhook[0].record.to),
        (Some(Unknown), Some(Confirmed))
    );
    assert_eq!(by_webhook[0].record.evidence["event"], event);

    // A second copy: a replay, never applied twice.
    let again = send(&base, "psp", "evt_1", &event, Some(KEY), unix_now()).await;
    assert_eq!(again.body["result"], "replay", "{:?}", again.body);

    // A job no command stored: unmatched, and the note says what was tried.
    let stray = send(
        &base,
        "psp",
        "evt_2",
        &job_event("evt_2", "job_9"),
        Some(KEY),
        unix_now(),
    )
    .await;
    assert_eq!(stray.status, StatusCode::OK);
    assert_eq!(stray.body["result"], "unmatched", "{:?}", stray.body);
    let note = stray.body["note"].as_str().expect("a note");
    assert!(
        note.contains("reference \"job_9\" of payments/wire") && note.contains("no command"),
        "{note}"
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "sent once"
    );
    h.stop().await;
}

/// The index is written wherever a command comes to store a new reference — here a person's
/// resolution — and an entry is only a hint: an event naming a reference the command no
/// longer stores is not applied to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_naming_a_reference_its_command_no_longer_stores_is_unmatched() {
    let secrets = tempfile::tempdir().expect("a temporary directory");
    let key_file = secrets.path().join("psp.key");
    std::fs::write(&key_file, format!("{KEY}\n")).expect("the key file is written");
    let (url, _calls) =
        accepting_upstream_answering(json!({"id": "job_7", "status": "pending"})).await;
    let h = Harness::start(Faults::none(), |c| {
        accepted_by(
            with_evidence_by_reference(c, &key_file),
            &url,
            1_500,
            "escalate",
        )
    })
    .await;
    let base = h.pipeline.url();
    let run = "r-by-ref-2";
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ref-2", 5_000),
        ))
        .await;
    let stuck = h
        .agent
        .wait_until(run, key, "STUCK", |c| c.status() == Stuck)
        .await;
    assert_eq!(stuck.state.external_ref.as_deref(), Some("job_7"));
    // A person finds the wire booked under another reference.
    let resolved = h
        .agent
        .act(
            run,
            key,
            "resolve",
            &json!({"outcome": "CONFIRMED", "external_ref": "w-manual",
                    "evidence": {"bank_statement": "line 9"}, "reason": "on the statement"}),
        )
        .await;
    assert_eq!(resolved.status, StatusCode::OK, "{}", resolved.text);
    let wire = h.agent.get(run, key).await;
    assert_eq!(wire.state.external_ref.as_deref(), Some("w-manual"));

    // The job's id still points at the wire in the index, but the wire's own reference
    // disagrees: unmatched, and said so.
    let stale = send(
        &base,
        "psp",
        "evt_old",
        &job_event("evt_old", "job_7"),
        Some(KEY),
        unix_now(),
    )
    .await;
    assert_eq!(stale.body["result"], "unmatched", "{:?}", stale.body);
    let note = stale.body["note"].as_str().expect("a note");
    assert!(
        note.contains(&format!("indexed to {run}/{key}"))
            && note.contains("disagrees")
            && note.contains("w-manual"),
        "{note}"
    );
    // The person's reference was indexed on its way into the command: an event naming it
    // finds the wire (CONFIRMED already, so kept, not applied).
    let named = send(
        &base,
        "psp",
        "evt_new",
        &job_event("evt_new", "w-manual"),
        Some(KEY),
        unix_now(),
    )
    .await;
    assert_eq!(named.body["result"], "recorded", "{:?}", named.body);
    assert_eq!(
        named.body["idempotency_key"],
        format!("{run}/{key}").as_str()
    );
    assert_eq!(h.agent.get(run, key).await.status(), Confirmed);
    h.stop().await;
}
