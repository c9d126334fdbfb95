//! Approval links end to end on `sluice dev` (SQLite, real HTTP): a link for a BLOCKED wire
//! opens without a token, shows the command, approves it once with a reason recorded in the
//! audit chain as the link; a second use, an expired, a forged, an edited or a re-policied
//! link answers 410 and changes nothing; a rejection by link reaches the agent with its
//! reason; a command that is not BLOCKED gets no link.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_core::approval_link::{Binding, Claims, LinkKey};
use sluice_core::command::CommandStatus::*;
use sluice_core::time::Timestamp;
use sluice_tests::*;
use sluice_upstream::Faults;

const SECRET: &str = "a test key of at least thirty-two bytes!";

async fn harness() -> Harness {
    Harness::start_with(
        Faults::none(),
        |c| c,
        |config| config.approval_links.secret = Some(SECRET.into()),
    )
    .await
}

/// A wire above the approval threshold: recorded, then BLOCKED.
async fn blocked_wire(h: &Harness, run: &str, decision: u32) -> String {
    let created = h
        .agent
        .submit_created(&effect(
            run,
            decision,
            "payments/wire",
            0,
            wire_args(&format!("acc-{decision}"), 2_500_000),
        ))
        .await;
    let key = created.command_key.to_string();
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Blocked);
    key
}

async fn link(h: &Harness, run: &str, key: &str, body: &Value) -> Answer {
    h.agent.act(run, key, "approval-link", body).await
}

/// The path of a link's URL (`/approve/<token>`), checked to be on this producer.
fn path_of(h: &Harness, url: &str) -> String {
    let rest = url
        .strip_prefix(&h.pipeline.url())
        .unwrap_or_else(|| panic!("{url} starts with {}", h.pipeline.url()));
    assert!(rest.starts_with("/approve/v1."), "{rest}");
    rest.to_owned()
}

/// An unauthenticated browser-like request: no bearer token.
async fn open(h: &Harness, path: &str, json: bool) -> (StatusCode, String) {
    let mut request = reqwest::Client::new().get(format!("{}{path}", h.pipeline.url()));
    if json {
        request = request.header("Accept", "application/json");
    }
    let response = request.send().await.expect("an answer");
    let status = response.status();
    (status, response.text().await.expect("a body"))
}

async fn decide(h: &Harness, path: &str, decision: &str, reason: &str) -> (StatusCode, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", h.pipeline.url()))
        .json(&json!({"decision": decision, "reason": reason}))
        .send()
        .await
        .expect("an answer");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_approves_its_command_once_and_is_recorded_as_the_link() {
    let h = harness().await;
    let run = "r-link-approve";
    let key = blocked_wire(&h, run, 1).await;

    let issued = link(
        &h,
        run,
        &key,
        &json!({"for": "alice@example.com", "expires_in_s": 600}),
    )
    .await;
    assert_eq!(issued.status, StatusCode::CREATED, "{:?}", issued.body);
    let link_id = issued.body["link_id"].as_str().expect("link_id").to_owned();
    let path = path_of(&h, issued.body["url"].as_str().expect("url"));
    let token = path.trim_start_matches("/approve/").to_owned();

    // The page: the shell under the console's policy, and the command as JSON.
    let (status, page) = open(&h, &path, false).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(page.contains("/approve/assets/approve.js"), "{page}");
    let (status, body) = open(&h, &path, true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let shown: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(shown["command_key"], key.as_str());
    assert_eq!(shown["tool"], "payments/wire");
    assert_eq!(shown["args"]["amount_minor"], 2_500_000, "{shown}");
    assert_eq!(shown["link"]["for"], "alice@example.com");
    assert!(
        shown["blocked_because"]
            .as_str()
            .is_some_and(|w| !w.is_empty()),
        "{shown}"
    );

    let (status, decided) = decide(&h, &path, "approve", "checked the beneficiary").await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Confirmed);

    // Used: the page and a second decision answer 410 and change nothing.
    let (status, page) = open(&h, &path, false).await;
    assert_eq!(status, StatusCode::GONE);
    assert!(page.contains("already used"), "{page}");
    let (status, again) = decide(&h, &path, "reject", "changed my mind").await;
    assert_eq!(status, StatusCode::GONE, "{again}");
    assert_eq!(again["error"]["code"], "link_used", "{again}");
    assert_eq!(h.agent.get(run, &key).await.status(), Confirmed);

    // The audit chain: the link's issue by id (never its token) and the approval as the link.
    let trail = h.audit(run).await;
    let records = trail.of(&key);
    let approval = records
        .iter()
        .find(|e| e.record.to == Some(Approved))
        .expect("an approval record");
    assert_eq!(
        approval.record.actor,
        format!("link:{link_id} (for alice@example.com, issued by anonymous)")
    );
    assert!(
        approval.record.reason.contains("checked the beneficiary"),
        "{:?}",
        approval.record
    );
    assert!(records.iter().any(|e| {
        e.record
            .reason
            .contains(&format!("approval link {link_id} issued"))
    }));
    let all = serde_json::to_string(&trail.entries.iter().map(|e| &e.record).collect::<Vec<_>>())
        .expect("JSON");
    assert!(!all.contains(&token), "the token reached the audit chain");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejection_by_link_reaches_the_agent_with_its_reason() {
    let h = harness().await;
    let run = "r-link-reject";
    let key = blocked_wire(&h, run, 1).await;
    let issued = link(&h, run, &key, &json!({})).await;
    assert_eq!(issued.status, StatusCode::CREATED, "{:?}", issued.body);
    let path = path_of(&h, issued.body["url"].as_str().expect("url"));
    let (status, decided) = decide(&h, &path, "reject", "wrong beneficiary").await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    let command = h.agent.wait_settled(run, &key).await;
    assert_eq!(command.status(), Cancelled);
    let rejection = command.state.rejection.expect("a rejection");
    assert_eq!(rejection.reason, "wrong beneficiary");
    assert!(rejection.by.starts_with("link:"), "{}", rejection.by);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_forged_edited_and_repolicied_links_answer_410_and_change_nothing() {
    let h = harness().await;
    let run = "r-link-gone";
    let key = blocked_wire(&h, run, 1).await;
    let command = h.agent.get(run, &key).await;
    let signer = LinkKey::new(SECRET.as_bytes()).expect("key");
    let binding = Binding {
        run_id: run.into(),
        command_key: key.clone(),
        args_hash: command.args_hash.to_string(),
        policy_version: command.policy_version.to_string(),
    };
    let now = Timestamp::from_millis(
        i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("after 1970")
                .as_millis(),
        )
        .expect("fits"),
    );
    let token = |binding: Binding, at: Timestamp, key: &LinkKey| {
        key.sign(&Claims::new(
            uuid::Uuid::new_v4().to_string(),
            binding,
            at,
            60,
            "ops".into(),
            None,
        ))
    };
    // Issued two minutes ago for one: expired.
    let expired = token(binding.clone(), now.plus_millis(-120_000), &signer);
    let other_key = LinkKey::new(b"another key, thirty-two bytes long!").expect("key");
    let forged = token(binding.clone(), now, &other_key);
    let mut edited = binding.clone();
    edited.args_hash = "0".repeat(64);
    let edited = token(edited, now, &signer);
    let mut repolicied = binding.clone();
    repolicied.policy_version = "an-older-policy".into();
    let repolicied = token(repolicied, now, &signer);
    for (token, code, words) in [
        (expired, "link_expired", "expired"),
        (forged, "link_invalid", "not valid"),
        (edited, "link_edited", "arguments changed"),
        (repolicied, "link_repolicied", "policy changed"),
    ] {
        let path = format!("/approve/{token}");
        let (status, page) = open(&h, &path, false).await;
        assert_eq!(status, StatusCode::GONE, "{code}: {page}");
        assert!(page.contains(words), "{code}: {page}");
        let (status, answer) = decide(&h, &path, "approve", "should not apply").await;
        assert_eq!(status, StatusCode::GONE, "{code}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{answer}");
    }
    assert_eq!(h.agent.get(run, &key).await.status(), Blocked);
    assert!(
        h.audit(run)
            .await
            .of(&key)
            .iter()
            .all(|e| e.record.to != Some(Approved))
    );

    // The real binding, correctly signed, still works: only the differences were refused.
    let good = token(binding, now, &signer);
    let (status, answer) = decide(&h, &format!("/approve/{good}"), "approve", "fine").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_blocked_command_gets_a_link_and_bad_input_is_named() {
    let h = harness().await;
    let run = "r-link-input";
    let created = h
        .agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-small", 100),
        ))
        .await;
    let small = created.command_key.to_string();
    assert_eq!(h.agent.wait_settled(run, &small).await.status(), Confirmed);
    let refused = link(&h, run, &small, &json!({})).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert_eq!(refused.body["error"]["code"], "not_blocked");

    let key = blocked_wire(&h, run, 2).await;
    for (body, pointer) in [
        (json!({"expires_in_s": 5}), "/expires_in_s"),
        (json!({"expires_in_s": 8 * 24 * 3600}), "/expires_in_s"),
        (json!({"for": "  "}), "/for"),
    ] {
        let answer = link(&h, run, &key, &body).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {:?}",
            answer.body
        );
        assert_eq!(
            answer.body["error"]["details"]["pointer"], pointer,
            "{:?}",
            answer.body
        );
    }
    let unknown = link(&h, run, &key, &json!({"expiry": 60})).await;
    assert_eq!(
        unknown.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        unknown.body
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_key_no_link_is_issued() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-link-off";
    let key = blocked_wire(&h, run, 1).await;
    let answer = link(&h, run, &key, &json!({})).await;
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        answer.body
    );
    assert_eq!(answer.body["error"]["code"], "approval_links_off");
    h.stop().await;
}
