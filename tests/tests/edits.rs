//! Edit and approve end to end on `sluice dev` (SQLite, the bank upstream over HTTP): an
//! approver corrects a BLOCKED wire's amount and beneficiary as they approve it. Schema, policy
//! and budget are checked on the edit before anything changes; the wire is sent once, with the
//! edited arguments, under the same key; the budget hold moves to the edited amount; the agent
//! re-driving with what it first submitted (or with the edit) is answered with the edited
//! command, anything else is still refused; the audit chain records the revision.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_core::command::CommandStatus::*;
use sluice_tests::*;
use sluice_upstream::Faults;

async fn counter(h: &Harness, budget: &str, scope_value: &str) -> (i64, u64) {
    let answer = h.agent.call("GET", "/v1/budgets", None).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    answer.body["budgets"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|b| b["name"] == budget)
        .and_then(|b| {
            b["counters"]
                .as_array()
                .expect("counters")
                .iter()
                .find(|c| c["scope_value"] == scope_value)
                .cloned()
        })
        .map_or((0, 0), |c| {
            (
                c["used"].as_i64().expect("used"),
                c["holds"].as_u64().expect("holds"),
            )
        })
}

fn edited_args(amount: i64, beneficiary: &str) -> Value {
    let mut args = wire_args("acc-1", amount);
    args["beneficiary"] = json!(beneficiary);
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approver_edits_a_blocked_wire_and_it_is_sent_once_with_the_edit_under_its_key() {
    let h = Harness::start(Faults::none(), |c| {
        c.budget(
            "daily_wires",
            r#"
tools = ["payments/wire"]
scope = "tenant"
window = "day"
limits = { EUR = 3000000 }
on_exceed = "deny"
"#,
        )
        .rule(
            None,
            r#"
name = "closed-account"
when = "args.beneficiary == 'b-closed'"
then = "deny"
reason = "the beneficiary's account is closed"
tools = ["payments/wire"]
"#,
        )
    })
    .await;
    let run = "r-edit";
    let tenant = "anonymous";
    let submitted = effect(run, 1, "payments/wire", 0, wire_args("acc-1", 1_500_000));
    let blocked = h.agent.submit_created(&submitted).await;
    let key = blocked.command_key.to_string();
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Blocked);
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_500_000, 1));

    // Refused edits change nothing: a schema violation (422 naming the pointer), a deny rule
    // (409 policy_denied), an amount past the budget (409 budget_exceeded, with its figures).
    let mut bad = wire_args("acc-1", 900_000);
    bad["amount_minor"] = json!("nine hundred");
    let invalid = h
        .agent
        .act(run, &key, "approve", &json!({"reason": "fix", "args": bad}))
        .await;
    assert_eq!(
        invalid.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{:?}",
        invalid.body
    );
    assert_eq!(invalid.error_code(), "invalid_arguments");
    assert_eq!(
        invalid.body["error"]["details"]["violations"][0]["pointer"], "/args/amount_minor",
        "{:?}",
        invalid.body
    );
    let denied = h
        .agent
        .act(
            run,
            &key,
            "approve",
            &json!({"reason": "fix", "args": edited_args(900_000, "b-closed")}),
        )
        .await;
    assert_eq!(denied.status, StatusCode::CONFLICT, "{:?}", denied.body);
    assert_eq!(denied.error_code(), "policy_denied");
    assert!(
        denied.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("account is closed")),
        "{:?}",
        denied.body
    );
    let over = h
        .agent
        .act(
            run,
            &key,
            "approve",
            &json!({"reason": "fix", "args": edited_args(3_100_000, "b-7")}),
        )
        .await;
    assert_eq!(over.status, StatusCode::CONFLICT, "{:?}", over.body);
    assert_eq!(over.error_code(), "budget_exceeded");
    let details = &over.body["error"]["details"];
    assert_eq!(
        (
            &details["budget"],
            &details["limit"],
            &details["used"],
            &details["amount"]
        ),
        (
            &json!("daily_wires"),
            &json!(3_000_000),
            &json!(0),
            &json!(3_100_000)
        ),
        "the command's own hold is not counted against its edit: {:?}",
        over.body
    );
    let unchanged = h.agent.wait_settled(run, &key).await;
    assert_eq!(unchanged.status(), Blocked);
    assert!(unchanged.state.revisions.is_empty());
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_500_000, 1));

    // The edit: 1,600,000 to b-7 (above the approval threshold: this approval covers it).
    // Approved, the hold moved, sent once with the edit.
    let approved = h
        .agent
        .act(
            run,
            &key,
            "approve",
            &json!({"reason": "the invoice says 16,000.00 to b-7", "args": edited_args(1_600_000, "b-7")}),
        )
        .await;
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    assert_eq!(approved.body["to"], "APPROVED");
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_600_000, 1));
    let done = h.agent.wait_settled(run, &key).await;
    assert_eq!(done.status(), Confirmed, "{done:?}");
    assert_eq!(h.upstream.stats().wires, 1);
    let booked = reqwest::get(format!(
        "{}/bank/wires/by-key/{}",
        h.upstream.base_url(),
        wire_business_key("acc-1", 1_500_000)
    ))
    .await
    .expect("the bank answers")
    .json::<Value>()
    .await
    .expect("a wire");
    assert_eq!(
        (&booked["amount_minor"], &booked["beneficiary"]),
        (&json!(1_600_000), &json!("b-7")),
        "the bank got the edited wire: {booked:?}"
    );
    assert_eq!(
        booked["idempotency_key"],
        json!(done.idempotency_key.to_string())
    );

    // GET shows the revision: who, why, which pointers, old → new; the identity stays.
    let shown = h
        .agent
        .call(
            "GET",
            &format!("/v1/runs/{run}/effects/{}", encode_key(&key)),
            None,
        )
        .await;
    assert_eq!(shown.status, StatusCode::OK);
    let revision = &shown.body["revisions"][0];
    assert_eq!(revision["number"], 1, "{:?}", shown.body);
    assert_eq!(revision["reason"], "the invoice says 16,000.00 to b-7");
    assert_eq!(revision["previous_hash"], shown.body["args_hash"]);
    assert_eq!(revision["args"]["amount_minor"], 1_600_000);
    let changes: Vec<(&str, &Value, &Value)> = revision["changes"]
        .as_array()
        .expect("changes")
        .iter()
        .map(|c| {
            (
                c["pointer"].as_str().expect("pointer"),
                &c["old"],
                &c["new"],
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            ("/amount_minor", &json!(1_500_000), &json!(1_600_000)),
            ("/beneficiary", &json!("b-9"), &json!("b-7")),
        ]
    );
    assert_eq!(
        shown.body["args"]["amount_minor"], 1_500_000,
        "as submitted"
    );

    // The agent re-driving: with what it submitted, or with the edit, gets the edited command
    // (the edit's amount held afresh would pass the budget: 1.6M + 1.6M; it is the command's
    // own, so it is answered, not refused); anything else is drift. Nothing more is held or
    // sent.
    for again in [
        submitted.clone(),
        effect(run, 1, "payments/wire", 0, edited_args(1_600_000, "b-7")),
    ] {
        let answer = h.agent.submit(&again).await;
        assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
        assert_eq!(answer.body["status"], "CONFIRMED", "{:?}", answer.body);
        assert_eq!(answer.body["revisions"][0]["number"], 1);
    }
    let drift = h
        .agent
        .submit(&effect(
            run,
            1,
            "payments/wire",
            0,
            edited_args(800_000, "b-7"),
        ))
        .await;
    assert_eq!(drift.status, StatusCode::CONFLICT, "{:?}", drift.body);
    assert_eq!(drift.error_code(), "argument_drift");
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_600_000, 1));
    assert_eq!(h.upstream.stats().wires, 1);

    // The audit chain: the approval with the revision's hashes and pointers, and its reason.
    let trail = h.audit(run).await;
    let approval = trail
        .of(&key)
        .into_iter()
        .find(|e| e.record.to == Some(Approved))
        .expect("the approval is audited");
    assert!(
        approval
            .record
            .reason
            .contains("revision 1: /amount_minor, /beneficiary")
            && approval.record.reason.contains("the invoice says"),
        "{}",
        approval.record.reason
    );
    assert_eq!(approval.record.evidence["args_hash"], revision["args_hash"]);
    assert_eq!(
        approval.record.evidence["previous_hash"],
        shown.body["args_hash"]
    );
    h.stop().await;
}
