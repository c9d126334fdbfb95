//! Asynchronous tools' callback URLs end to end on `sluice dev` (SQLite): a payment provider
//! (a real HTTP server in the test) answers each wire `202 Accepted` and, a moment later, POSTs
//! the outcome to the callback URL the wire's request gave it. The wire is settled by that
//! callback — CONFIRMED with the provider's reference, or FAILED — before its deadline and
//! without a look; the same callback again is a replay that changes nothing; a forged, expired
//! or progress-only callback changes nothing either. A callback that comes before the wire's
//! own 202 is recorded waits for it; one that finds the wire not waiting yet is kept and
//! settles it at the deadline's look. The test signs its own tokens with the
//! `hmac` crate, independent of the verifier under test, under the key it configures.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;
use sluice_core::command::CommandStatus::*;
use sluice_tests::*;
use sluice_upstream::Faults;

/// `[callbacks] secret` of the pipeline under test.
const KEY: &str = "callbacks-e2e-key-0123456789abcdef0123";
const DEADLINE_MS: i64 = 60_000;

/// What the provider did with one wire.
#[derive(Debug, Clone)]
struct Given {
    account: String,
    /// The callback URL the wire's request carried.
    url: String,
    /// The answer to the provider's own callback, once it made it.
    answered: Option<(u16, Value)>,
}

type Log = Arc<Mutex<Vec<Given>>>;

/// The provider: answers every wire 202 and, 300 ms later (at once, before its 202, for an
/// account ending in `-now` or `-slow`), POSTs to its callback URL what the account asks for — `acc-ok…` succeeded (with
/// the provider's id), `acc-fail…` failed — and for any other account never calls back.
async fn provider() -> (String, Log) {
    let log = Log::default();
    let kept = Arc::clone(&log);
    let app = axum::Router::new().route(
        "/payouts",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, axum::Json(body): axum::Json<Value>| {
                let log = Arc::clone(&kept);
                async move {
                    let url = headers
                        .get("x-callback-url")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let account = body["account"].as_str().unwrap_or_default().to_owned();
                    let index = {
                        let mut log = log.lock().expect("unpoisoned");
                        log.push(Given {
                            account: account.clone(),
                            url: url.clone(),
                            answered: None,
                        });
                        log.len() - 1
                    };
                    let outcome = if account.starts_with("acc-ok") {
                        Some(json!({"status": "succeeded", "id": "po_1"}))
                    } else if account.starts_with("acc-fail") {
                        Some(json!({"status": "failed", "reason": "beneficiary closed"}))
                    } else {
                        None
                    };
                    // `…-now` calls back at once and holds its 202 a moment: the callback
                    // comes while the attempt's answer is not recorded yet; `…-slow` holds it
                    // past the callback's wait for it.
                    let hold = if account.ends_with("-now") {
                        300
                    } else if account.ends_with("-slow") {
                        4_000
                    } else {
                        0
                    };
                    let delay = if hold > 0 { 0 } else { 300 };
                    if let Some(outcome) = outcome {
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(delay)).await;
                            let answer = post(&url, &outcome).await;
                            log.lock().expect("unpoisoned")[index].answered = Some(answer);
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    (
                        axum::http::StatusCode::ACCEPTED,
                        axum::Json(json!({"job": format!("j-{index}"), "status": "processing"})),
                    )
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/payouts"), log)
}

/// POSTs `body` as JSON to `url`: the status and the JSON answer.
async fn post(url: &str, body: &Value) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .expect("an answer");
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// A token for `claims`, signed with `key` as the format says: base64url(JSON) "." base64url(
/// HMAC-SHA256(key, JSON)).
fn signed(key: &str, claims: &Value) -> String {
    let payload = serde_json::to_vec(claims).expect("JSON");
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key.as_bytes()).expect("any key");
    mac.update(&payload);
    format!(
        "{}.{}",
        B64.encode(&payload),
        B64.encode(mac.finalize().into_bytes())
    )
}

/// The wire as an asynchronous tool at the provider, awaited `deadline_ms`: its request
/// carries `{callback_url}` in a header, the callback's `/status` says the outcome and `/id`
/// the reference.
fn asynchronous(c: CatalogEdit, url: &str, deadline_ms: i64) -> CatalogEdit {
    let declared: toml::Table = toml::from_str(&format!(
        r#"
accepted_status = [202]
deadline_ms = {deadline_ms}
then = "look"
outcome_pointer = "/status"
present = ["succeeded"]
failed = ["failed"]
reference_pointer = "/id"
"#
    ))
    .expect("the async TOML parses");
    let headers: toml::Table =
        toml::from_str("\"X-Callback-Url\" = \"{callback_url}\"").expect("headers");
    c.tool_key("payments/wire", "async", declared)
        .dispatch("payments/wire", "url", url)
        .dispatch("payments/wire", "headers", headers)
        .policy("payments/wire", "verify_after_commit", false)
}

async fn start(url: &str) -> Harness {
    start_within(url, DEADLINE_MS).await
}

async fn start_within(url: &str, deadline_ms: i64) -> Harness {
    Harness::start_with(
        Faults::none(),
        |c| asynchronous(c, url, deadline_ms),
        |config| config.callbacks.secret = Some(KEY.into()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_confirms_the_accepted_wire_before_its_deadline_once_and_forgeries_change_nothing()
 {
    let (url, given) = provider().await;
    let h = start(&url).await;
    let base = h.pipeline.url();
    let run = "r-cb-1";
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ok-1", 5_000),
        ))
        .await;
    let wire = h
        .agent
        .wait_until(run, key, "CONFIRMED", |c| c.status() == Confirmed)
        .await;
    assert_eq!(wire.state.external_ref.as_deref(), Some("po_1"));
    assert_eq!(wire.state.checks, 0, "settled without a look: {wire:?}");
    assert!(wire.state.awaiting_callback.is_none());
    let first = given.lock().expect("unpoisoned")[0].clone();
    assert_eq!(first.account, "acc-ok-1");
    assert!(
        first.url.starts_with(&format!("{base}/v1/callbacks/")),
        "{} under {base}",
        first.url
    );
    let (status, answer) = first.answered.clone().expect("the provider called back");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["result"], "applied", "{answer}");
    assert_eq!(answer["source"], "callback:payments/wire");
    assert_eq!(answer["idempotency_key"], format!("{run}/{key}"));
    assert_eq!(answer["outcome"], "present");
    let token = first.url.rsplit('/').next().expect("a token").to_owned();

    // The same callback again: a replay, nothing changes.
    let (status, again) = post(&first.url, &json!({"status": "succeeded", "id": "po_1"})).await;
    assert_eq!((status, again["result"].clone()), (200, json!("replay")));
    let (status, again) = post(&first.url, &json!({"status": "failed"})).await;
    assert_eq!(
        (status, again["result"].clone()),
        (200, json!("replay")),
        "once used, the URL says nothing more: {again}"
    );
    assert_eq!(h.agent.get(run, key).await.status(), Confirmed);

    let trail = h.audit(run).await;
    let confirmed: Vec<_> = trail
        .of(key)
        .into_iter()
        .filter(|e| e.record.to == Some(Confirmed))
        .collect();
    assert_eq!(confirmed.len(), 1, "one audit record: {trail:?}");
    assert_eq!(confirmed[0].record.from, Some(Unknown));
    assert!(
        confirmed[0]
            .record
            .reason
            .starts_with("evidence callback:payments/wire/cb_"),
        "{}",
        confirmed[0].record.reason
    );
    let evidence = &confirmed[0].record.evidence;
    assert_eq!(
        evidence["event"]["body"],
        json!({"status": "succeeded", "id": "po_1"})
    );
    assert!(
        evidence["event"]["epoch"].as_u64().is_some_and(|e| e >= 1),
        "the attempt's epoch is kept: {evidence}"
    );
    assert!(
        !format!("{trail:?}").contains(&token),
        "the token is nowhere in the audit chain"
    );

    // Forged: claims for the same command under another key, or altered claims.
    let (payload, _) = token.split_once('.').expect("two parts");
    let claims: Value =
        serde_json::from_slice(&B64.decode(payload).expect("base64url")).expect("JSON claims");
    let callbacks = format!("{base}/v1/callbacks");
    let other_key = signed("another-key-0123456789abcdef012345", &claims);
    let (status, refused) = post(
        &format!("{callbacks}/{other_key}"),
        &json!({"status": "failed"}),
    )
    .await;
    assert_eq!(status, 401, "{refused}");
    assert_eq!(refused["error"]["code"], "bad_token");
    let message = refused["error"]["message"].as_str().unwrap_or_default();
    assert!(
        !message.contains(&other_key) && !message.contains(KEY),
        "{message}"
    );
    for forged in ["x", "abc.def", &format!("{payload}.AAAA")] {
        let (status, _) = post(
            &format!("{callbacks}/{forged}"),
            &json!({"status": "failed"}),
        )
        .await;
        assert_eq!(status, 401, "{forged}");
    }
    // A token Sluice would have signed for a command it does not hold: recorded, unmatched.
    let stray = signed(
        KEY,
        &json!({"r": "r-nobody", "k": key, "e": 1, "x": claims["x"]}),
    );
    let (status, unmatched) = post(
        &format!("{callbacks}/{stray}"),
        &json!({"status": "succeeded"}),
    )
    .await;
    assert_eq!(status, 404, "{unmatched}");
    assert_eq!(unmatched["error"]["code"], "unmatched");

    let listed = h
        .agent
        .call("GET", "/v1/evidence?source=callback:payments/wire", None)
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{:?}", listed.body);
    let dispositions: Vec<&str> = listed.body["evidence"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["disposition"].as_str().expect("a disposition"))
        .collect();
    assert_eq!(dispositions, ["unmatched", "applied"], "{:?}", listed.body);
    assert!(!listed.text.contains(&token), "the token is not listed");

    let metrics = h.agent.call("GET", "/metrics", None).await;
    for (source, result) in [
        ("callback:payments/wire", "applied"),
        ("callback:payments/wire", "replay"),
        ("callback:payments/wire", "unmatched"),
        ("callback", "bad_signature"),
    ] {
        let line =
            format!("sluice_evidence_received_total{{result=\"{result}\",source=\"{source}\"}} ");
        assert!(
            metrics.text.lines().any(|l| l.starts_with(&line)),
            "{line} in the metrics"
        );
    }
    assert_eq!(given.lock().expect("unpoisoned").len(), 1, "sent once");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_callback_fails_the_wire_and_an_expired_or_progress_one_changes_nothing() {
    let (url, given) = provider().await;
    let h = start(&url).await;
    let base = h.pipeline.url();
    let key = "d-1/payments/wire/0";

    // A callback racing its own 202: applied once the answer is recorded, not kept for the
    // deadline.
    let racing = "r-cb-now";
    h.agent
        .submit_created(&effect(
            racing,
            1,
            "payments/wire",
            0,
            wire_args("acc-ok-now", 5_000),
        ))
        .await;
    let raced = h
        .agent
        .wait_until(racing, key, "CONFIRMED", |c| c.status() == Confirmed)
        .await;
    assert_eq!(raced.state.checks, 0, "no look: {raced:?}");
    let answered = eventually(
        "the provider's callback is answered",
        Duration::from_secs(5),
        || {
            let given = Arc::clone(&given);
            async move {
                given
                    .lock()
                    .expect("unpoisoned")
                    .iter()
                    .find(|g| g.account == "acc-ok-now")
                    .and_then(|g| g.answered.clone())
            }
        },
    )
    .await;
    assert_eq!(answered.1["result"], "applied", "{answered:?}");

    let failing = "r-cb-fail";
    h.agent
        .submit_created(&effect(
            failing,
            1,
            "payments/wire",
            0,
            wire_args("acc-fail-1", 5_000),
        ))
        .await;
    let failed = h
        .agent
        .wait_until(failing, key, "FAILED", |c| c.status() == Failed)
        .await;
    assert_eq!(failed.state.checks, 0, "no look: {failed:?}");
    let trail = h.audit(failing).await;
    let end = trail.find(key, Unknown, Failed);
    assert!(
        end.record.reason.contains("the accepted job failed"),
        "{}",
        end.record.reason
    );

    // A wire whose provider never calls back waits for its deadline.
    let silent = "r-cb-silent";
    h.agent
        .submit_created(&effect(
            silent,
            1,
            "payments/wire",
            0,
            wire_args("acc-quiet-1", 5_000),
        ))
        .await;
    let waiting = h
        .agent
        .wait_until(silent, key, "UNKNOWN", |c| c.status() == Unknown)
        .await;
    assert!(waiting.state.awaiting_callback.is_some());
    let url = eventually(
        "the provider is given its URL",
        Duration::from_secs(5),
        || {
            let given = Arc::clone(&given);
            async move {
                given
                    .lock()
                    .expect("unpoisoned")
                    .iter()
                    .find(|g| g.account == "acc-quiet-1")
                    .map(|g| g.url.clone())
            }
        },
    )
    .await;
    let token = url.rsplit('/').next().expect("a token").to_owned();
    let (payload, _) = token.split_once('.').expect("two parts");
    let mut claims: Value =
        serde_json::from_slice(&B64.decode(payload).expect("base64url")).expect("JSON claims");

    // Its token, expired (signed by the same key): gone, nothing recorded, nothing changed.
    claims["x"] = json!(1_000);
    let expired = token_for(&claims);
    let (status, gone) = post(
        &format!("{base}/v1/callbacks/{expired}"),
        &json!({"status": "succeeded", "id": "po_9"}),
    )
    .await;
    assert_eq!(status, 410, "{gone}");
    assert_eq!(gone["error"]["code"], "callback_expired");
    // Too large a body: refused before anything is read.
    let (status, large) = post(
        &url,
        &json!({"status": "succeeded", "pad": "x".repeat(300_000)}),
    )
    .await;
    assert_eq!(status, 413, "{large}");
    // A progress report: not recorded, the URL stays usable.
    let (status, progress) = post(&url, &json!({"status": "processing"})).await;
    assert_eq!(status, 200, "{progress}");
    assert_eq!(progress["result"], "ignored", "{progress}");
    let still = h.agent.get(silent, key).await;
    assert_eq!(still.status(), Unknown, "{still:?}");
    assert!(still.state.awaiting_callback.is_some());
    let listed = h
        .agent
        .call("GET", "/v1/evidence?source=callback:payments/wire", None)
        .await;
    let ids: Vec<&str> = listed.body["evidence"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|r| r["idempotency_key"] == format!("{silent}/{key}"))
        .map(|r| r["event_id"].as_str().expect("an id"))
        .collect();
    assert!(ids.is_empty(), "nothing recorded for it: {:?}", listed.body);
    // The final word on the same URL still settles it.
    let (status, applied) = post(&url, &json!({"status": "succeeded", "id": "po_7"})).await;
    assert_eq!((status, applied["result"].clone()), (200, json!("applied")));
    let wire = h.agent.get(silent, key).await;
    assert_eq!(wire.status(), Confirmed);
    assert_eq!(wire.state.external_ref.as_deref(), Some("po_7"));
    h.stop().await;
}

fn token_for(claims: &Value) -> String {
    signed(KEY, claims)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_callback_that_finds_its_wire_not_waiting_yet_is_kept_and_settles_it_at_the_deadline() {
    let (url, given) = provider().await;
    let h = start_within(&url, 1_000).await;
    let run = "r-cb-slow";
    let key = "d-1/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ok-slow", 5_000),
        ))
        .await;
    // The provider calls back at once and answers the wire 4 s later: the callback waits for
    // that answer 3 s, then is kept for the wire.
    let answered = eventually(
        "the provider's callback is answered",
        Duration::from_secs(10),
        || {
            let given = Arc::clone(&given);
            async move {
                given
                    .lock()
                    .expect("unpoisoned")
                    .first()
                    .and_then(|g| g.answered.clone())
            }
        },
    )
    .await;
    assert_eq!(answered.0, 200, "{answered:?}");
    assert_eq!(answered.1["result"], "recorded", "{answered:?}");
    assert!(
        answered.1["note"]
            .as_str()
            .is_some_and(|n| n.contains("LEASED")),
        "{answered:?}"
    );
    // Accepted, then at its deadline the kept callback answers the look.
    let wire = h
        .agent
        .wait_until(run, key, "CONFIRMED", |c| c.status() == Confirmed)
        .await;
    assert_eq!(wire.state.external_ref.as_deref(), Some("po_1"));
    let trail = h.audit(run).await;
    let settled = trail.find(key, Unknown, Confirmed);
    assert!(
        settled
            .record
            .reason
            .starts_with("evidence callback:payments/wire/cb_"),
        "{}",
        settled.record.reason
    );
    let listed = h
        .agent
        .call("GET", "/v1/evidence?source=callback:payments/wire", None)
        .await;
    assert_eq!(
        listed.body["evidence"][0]["disposition"], "applied",
        "{:?}",
        listed.body
    );
    h.stop().await;
}
