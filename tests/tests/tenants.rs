//! Tenants over real HTTP against the real pipeline (docs/decisions.md, "Tenants"): a
//! submission is recorded under its caller, or a tenant the caller's token may name (403 for
//! one it may not, 422 for a malformed one); the tenant is returned by reads and listings and
//! filters them; and a tenant holding its whole quota of effects in flight is refused with 429
//! and `Retry-After`, nothing recorded, until its effects settle.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_core::ids::RunId;
use sluice_core::time::Timestamp;
use sluice_ledger::Ledger;
use sluice_runtime::Config;
use sluice_runtime::config::{Role, TokenConfig};
use sluice_tests::tokens::{ADMIN, AGENT_A};
use sluice_tests::*;
use sluice_upstream::Faults;

/// A platform's token: submits for itself and for two of its customers.
const PLATFORM: &str = "platform-token-0123456789";

/// The suite's tokens (agent-a, operator-1, admin-1, …) and the platform; `acme` may hold two
/// effects in flight, every other tenant any number.
fn tenants(config: &mut Config) {
    tokens::install(config);
    config.auth.tokens.push(TokenConfig {
        name: "platform".into(),
        role: Role::Agent,
        token: Some(PLATFORM.into()),
        token_sha256: None,
        tenants: vec!["acme".into(), "globex".into()],
    });
    config.tenants.quotas.insert("acme".into(), 2);
    config.tenants.retry_after_ms = Some(2_500);
}

fn for_tenant(mut effect: Value, tenant: &str) -> Value {
    effect["tenant"] = json!(tenant);
    effect
}

/// Every command and every audit record in the ledger.
async fn recorded(ledger: &dyn Ledger) -> (usize, usize) {
    let runs = ledger
        .list_runs(Timestamp::from_millis(0), None, usize::MAX)
        .await
        .expect("runs listed");
    let (mut commands, mut audit) = (0, 0);
    for run in runs {
        commands += ledger
            .list_run(&run.run_id, None)
            .await
            .expect("run read")
            .len();
        audit += ledger
            .audit_read(&run.run_id)
            .await
            .expect("audit read")
            .entries
            .len();
    }
    (commands, audit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_is_recorded_under_its_caller_or_a_tenant_it_may_name() {
    let h = Harness::start_with(Faults::none(), |c| c, tenants).await;
    let agent = h.agent.with_token(AGENT_A);
    let platform = h.agent.with_token(PLATFORM);
    let admin = h.agent.with_token(ADMIN);

    // A token says which tenants it may name.
    let me = platform.call("GET", "/v1/whoami", None).await;
    assert_eq!(me.body["tenants"], json!(["acme", "globex"]), "{}", me.text);

    // Named by no one: the caller's own.
    let own = agent
        .submit_created(&effect("r-own", 1, "email/send", 0, email_args("own")))
        .await;
    assert_eq!(own.tenant(), "agent-a");
    let read = agent
        .get_path("r-own", &encode_key("d-1/email/send/0"), None)
        .await;
    assert_eq!(read.body["tenant"], "agent-a", "{}", read.text);

    // A tenant the token may name, stored beside the submitter.
    let acme = platform
        .submit(&for_tenant(
            effect("r-acme", 1, "email/send", 0, email_args("acme")),
            "acme",
        ))
        .await;
    assert_eq!(acme.status, StatusCode::CREATED, "{}", acme.text);
    assert_eq!(acme.body["tenant"], "acme");
    assert_eq!(acme.body["submitted_by"], "platform");
    let stored = ledger_get(h.ctx().ledger.as_ref(), "r-acme", "d-1/email/send/0")
        .await
        .expect("recorded");
    assert_eq!(stored.tenant(), "acme");

    // One it may not name: 403 naming it, nothing recorded.
    let refused = platform
        .submit(&for_tenant(
            effect("r-initech", 1, "email/send", 0, email_args("initech")),
            "initech",
        ))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);
    let said = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        said.contains("initech") && said.contains("acme, globex"),
        "{said}"
    );
    let refused = agent
        .submit(&for_tenant(
            effect("r-own", 2, "email/send", 0, email_args("as acme")),
            "acme",
        ))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.text);
    // A malformed one: 422 pointing at it.
    let malformed = platform
        .submit(&for_tenant(
            effect("r-initech", 1, "email/send", 0, email_args("initech")),
            "acme corp",
        ))
        .await;
    assert_eq!(
        malformed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        malformed.text
    );
    assert_eq!(malformed.body["error"]["details"]["pointer"], "/tenant");
    for key in ["d-1/email/send/0", "d-2/email/send/0"] {
        assert!(
            ledger_get(h.ctx().ledger.as_ref(), "r-initech", key)
                .await
                .is_none()
        );
    }
    assert!(
        ledger_get(h.ctx().ledger.as_ref(), "r-own", "d-2/email/send/0")
            .await
            .is_none()
    );

    // Listings return it and filter by it.
    let listed = admin.call("GET", "/v1/effects?tenant=acme", None).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    let runs: Vec<&str> = listed.body["effects"]
        .as_array()
        .expect("effects")
        .iter()
        .map(|e| e["run_id"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(runs, vec!["r-acme"]);
    let all = admin.call("GET", "/v1/effects", None).await;
    let mut tenants: Vec<&str> = all.body["effects"]
        .as_array()
        .expect("effects")
        .iter()
        .map(|e| e["tenant"].as_str().unwrap_or_default())
        .collect();
    tenants.sort_unstable();
    assert_eq!(tenants, vec!["acme", "agent-a"]);
    let bad = admin.call("GET", "/v1/effects?tenant=a%20b", None).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.text);
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_quota_is_refused_with_nothing_recorded_until_its_effects_settle() {
    let h = Harness::start_with(Faults::none(), |c| c, tenants).await;
    let platform = h.agent.with_token(PLATFORM);
    let admin = h.agent.with_token(ADMIN);
    let ledger = h.ctx().ledger.as_ref();
    // Two effects of acme's, scheduled a few seconds ahead: in flight (not final) meanwhile.
    let scheduled = |run: &str| {
        let mut effect = for_tenant(effect(run, 1, "email/send", 0, email_args(run)), "acme");
        effect["delay_ms"] = json!(4_000);
        effect
    };
    for run in ["r-q1", "r-q2"] {
        let answer = platform.submit(&scheduled(run)).await;
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text);
    }

    let before = recorded(ledger).await;
    let refused = platform.submit(&scheduled("r-q3")).await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.text
    );
    assert_eq!(refused.error_code(), "tenant_over_quota");
    assert_eq!(refused.headers["retry-after"], "3", "2.5 s, rounded up");
    let said = refused.body["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        said.contains("tenant acme")
            && said.contains("2 effects in flight")
            && said.contains("quota is 2"),
        "{said}"
    );
    let details = &refused.body["error"]["details"];
    assert_eq!(
        (&details["tenant"], &details["quota"], &details["in_flight"]),
        (&json!("acme"), &json!(2), &json!(2))
    );
    // Nothing recorded: no command, no audit record, no run.
    assert_eq!(recorded(ledger).await, before);
    let q3 = RunId::parse("r-q3").expect("a run id");
    assert!(ledger.list_run(&q3, None).await.expect("read").is_empty());
    assert!(
        ledger
            .audit_read(&q3)
            .await
            .expect("read")
            .entries
            .is_empty()
    );

    // The quota is acme's alone; and a submission already recorded is answered as before.
    let globex = platform
        .submit(&for_tenant(
            effect("r-g1", 1, "email/send", 0, email_args("g1")),
            "globex",
        ))
        .await;
    assert_eq!(globex.status, StatusCode::CREATED, "{}", globex.text);
    let again = platform.submit(&scheduled("r-q1")).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);

    // The metrics say what is in flight and what was refused, by tenant.
    let metrics = admin.call("GET", "/metrics", None).await;
    assert!(
        metrics
            .text
            .contains("sluice_tenant_submissions_refused_total{tenant=\"acme\"} 1"),
        "{}",
        metrics.text
    );
    assert!(
        metrics
            .text
            .contains("sluice_tenant_effects_in_flight{tenant=\"acme\"} 2"),
        "{}",
        metrics.text
    );

    // Once acme's effects reach a final status, its submissions are admitted again.
    for run in ["r-q1", "r-q2"] {
        let settled = platform.wait_settled(run, "d-1/email/send/0").await;
        assert_eq!(
            settled.status(),
            sluice_core::command::CommandStatus::Confirmed
        );
    }
    let admitted = platform.submit(&scheduled("r-q3")).await;
    assert_eq!(admitted.status, StatusCode::CREATED, "{}", admitted.text);
    assert_eq!(admitted.body["tenant"], "acme");
    h.stop().await;
}

/// A batch's runs are submitted at once: the quota holds across concurrent submissions to one
/// producer (admissions under way count), each refused item answered 429 in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_submissions_of_one_tenant_cannot_all_pass_on_one_count() {
    let h = Harness::start_with(Faults::none(), |c| c, tenants).await;
    let platform = h.agent.with_token(PLATFORM);
    let effects: Vec<Value> = (0..6)
        .map(|i| {
            let run = format!("r-batch-{i}");
            let mut effect = for_tenant(effect(&run, 1, "email/send", 0, email_args(&run)), "acme");
            effect["delay_ms"] = json!(60_000);
            effect
        })
        .collect();
    let answer = platform.batch(effects).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let statuses: Vec<u64> = answer.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        2,
        "exactly the quota admitted: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        4,
        "{statuses:?}"
    );
    let (commands, _) = recorded(h.ctx().ledger.as_ref()).await;
    assert_eq!(commands, 2, "only the admitted are recorded");
    let refused = answer.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["status"] == 429)
        .expect("a refusal");
    assert_eq!(refused["error"]["code"], "tenant_over_quota");
    assert_eq!(refused["error"]["details"]["retry_after_s"], 3);
    h.stop().await;
}
