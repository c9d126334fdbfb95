//! Spend budgets end to end on `sluice dev` (SQLite): a wire that would pass a `deny` budget is
//! refused with nothing recorded; room comes back when a held wire ends FAILED (denied at
//! dispatch) or CANCELLED (rejected by a person), and a later wire fits in it; a retried
//! submission holds once; past a `require_approval` budget the wire is recorded BLOCKED and
//! counts once approved. `GET /v1/budgets` shows each counter.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_bus::Topic;
use sluice_core::command::CommandStatus::*;
use sluice_runtime::messages::header;
use sluice_tests::*;
use sluice_upstream::Faults;

/// The counter of `budget` for `scope_value` in `GET /v1/budgets`: (used, holds).
async fn counter(h: &Harness, budget: &str, scope_value: &str) -> (i64, u64) {
    let answer = h.agent.call("GET", "/v1/budgets", None).await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.body);
    let budget = answer.body["budgets"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|b| b["name"] == budget)
        .unwrap_or_else(|| panic!("budget {budget} listed: {:?}", answer.body))
        .clone();
    budget["counters"]
        .as_array()
        .expect("counters")
        .iter()
        .find(|c| c["scope_value"] == scope_value && c["currency"] == "EUR")
        .map_or((0, 0), |c| {
            (
                c["used"].as_i64().expect("used"),
                c["holds"].as_u64().expect("holds"),
            )
        })
}

fn wire(run: &str, decision: u32, account: &str, amount: i64) -> Value {
    effect(
        run,
        decision,
        "payments/wire",
        0,
        wire_args(account, amount),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_budget_refuses_what_would_pass_it_and_gets_room_back_from_failed_and_cancelled() {
    let h = Harness::start(Faults::none(), |c| {
        c.budget(
            "daily_wires",
            r#"
tools = ["payments/*"]
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
when = "args.account == 'acc-closed'"
then = "deny"
tools = ["payments/wire"]
"#,
        )
    })
    .await;
    let run = "r-budget-deny";
    let tenant = "anonymous";

    // 1,000,000 (at the approval threshold): held and sent.
    let first = h
        .agent
        .submit_created(&wire(run, 1, "acc-1", 1_000_000))
        .await;
    let sent = h
        .agent
        .wait_settled(run, &first.command_key.to_string())
        .await;
    assert_eq!(sent.status(), Confirmed, "{sent:?}");
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_000_000, 1));

    // 1,500,000: above the threshold, so BLOCKED for a person, but held all the same.
    let big = h
        .agent
        .submit_created(&wire(run, 2, "acc-2", 1_500_000))
        .await;
    let big_key = big.command_key.to_string();
    assert_eq!(h.agent.wait_settled(run, &big_key).await.status(), Blocked);
    assert_eq!(counter(&h, "daily_wires", tenant).await, (2_500_000, 2));

    // 600,000 more would pass 3,000,000: refused, nothing recorded.
    let over = h.agent.submit(&wire(run, 3, "acc-3", 600_000)).await;
    assert_eq!(over.status, StatusCode::CONFLICT, "{:?}", over.body);
    assert_eq!(over.error_code(), "budget_exceeded");
    let details = &over.body["error"]["details"];
    assert_eq!(details["budget"], "daily_wires", "{:?}", over.body);
    assert_eq!(details["used"], 2_500_000);
    assert_eq!(details["limit"], 3_000_000);
    let missing = h
        .agent
        .call(
            "GET",
            &format!(
                "/v1/runs/{run}/effects/{}",
                encode_key("d-3/payments/wire/0")
            ),
            None,
        )
        .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{:?}", missing.body);
    assert_eq!(h.upstream.stats().wires, 1);

    // Rejected: CANCELLED, and its 1,500,000 is given back.
    let rejected = h
        .agent
        .act(
            run,
            &big_key,
            "reject",
            &json!({"reason": "wrong beneficiary"}),
        )
        .await;
    assert_eq!(rejected.status, StatusCode::OK, "{:?}", rejected.body);
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_000_000, 1));

    // The refused wire fits now, as a new submission of the same key.
    let third = h
        .agent
        .submit_created(&wire(run, 3, "acc-3", 600_000))
        .await;
    let third = h
        .agent
        .wait_settled(run, &third.command_key.to_string())
        .await;
    assert_eq!(third.status(), Confirmed);
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_600_000, 2));

    // Held at admission, denied at dispatch by a rule: FAILED, and given back.
    let closed = h
        .agent
        .submit_created(&wire(run, 4, "acc-closed", 1_000_000))
        .await;
    let closed = h
        .agent
        .wait_settled(run, &closed.command_key.to_string())
        .await;
    assert_eq!(closed.status(), Failed, "{closed:?}");
    assert_eq!(counter(&h, "daily_wires", tenant).await, (1_600_000, 2));

    // A wire that fits only in the room the FAILED one gave back; submitted twice (a retry),
    // held once.
    let last = wire(run, 5, "acc-5", 1_400_000);
    let created = h.agent.submit_created(&last).await;
    let again = h.agent.submit(&last).await;
    assert_eq!(again.status, StatusCode::OK, "{:?}", again.body);
    assert_eq!(counter(&h, "daily_wires", tenant).await, (3_000_000, 3));
    // Above the approval threshold: approve it, it is sent, and still counted once.
    let key = created.command_key.to_string();
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Blocked);
    let approved = h
        .agent
        .act(run, &key, "approve", &json!({"reason": "checked"}))
        .await;
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Confirmed);
    assert_eq!(counter(&h, "daily_wires", tenant).await, (3_000_000, 3));
    assert_eq!(h.upstream.stats().wires, 3, "{:?}", h.upstream.stats());

    let text = h.agent.call("GET", "/metrics", None).await.text;
    for line in [
        "sluice_budget_admissions_total{budget=\"daily_wires\",outcome=\"denied\"} 1",
        "sluice_budget_admissions_total{budget=\"daily_wires\",outcome=\"held\"} 5",
        "sluice_budget_held_minor{budget=\"daily_wires\",currency=\"EUR\"} 3000000",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_a_require_approval_budget_a_wire_waits_blocked_and_counts_once_approved() {
    let h = Harness::start(Faults::none(), |c| {
        c.budget(
            "per_run",
            r#"
tools = ["payments/wire"]
field = "amount_minor"
scope = "run"
window = "total"
limits = { EUR = 500000 }
on_exceed = "require_approval"
"#,
        )
    })
    .await;
    let mut events = h
        .ctx()
        .bus
        .subscribe(Topic::Events, "e2e-budget-events", "e2e-budget-events-1")
        .await
        .expect("an outside consumer subscribes to the events");
    let run = "r-budget-approval";
    let first = h
        .agent
        .submit_created(&wire(run, 1, "acc-1", 400_000))
        .await;
    let first = h
        .agent
        .wait_settled(run, &first.command_key.to_string())
        .await;
    assert_eq!(first.status(), Confirmed);
    assert_eq!(counter(&h, "per_run", run).await, (400_000, 1));

    // 200,000 more passes 500,000: recorded BLOCKED at once, not counted yet.
    let over = h
        .agent
        .submit_created(&wire(run, 2, "acc-2", 200_000))
        .await;
    assert_eq!(over.status(), Blocked, "{over:?}");
    let key = over.command_key.to_string();
    assert_eq!(counter(&h, "per_run", run).await, (400_000, 1));
    // Approvers hear of it as of any blocked command: a `blocked` event from the producer.
    let blocked = loop {
        let delivery = tokio::time::timeout(DEADLINE, events.next())
            .await
            .expect("a lifecycle event within the deadline")
            .expect("the bus is open");
        let headers = &delivery.message.headers;
        let kind = (
            header(headers, "ce_type").map(str::to_owned),
            header(headers, "ce_source").map(str::to_owned),
        );
        let ours = header(headers, "ce_subject") == Some(format!("{run}/{key}").as_str());
        delivery.ack().await.expect("acknowledged");
        if ours {
            break kind;
        }
    };
    assert_eq!(
        blocked,
        (
            Some("dev.sluice.effect.blocked.v1".to_owned()),
            Some("/sluice/producer".to_owned())
        )
    );
    let trail = h.audit(run).await;
    assert_eq!(trail.path(&key), vec![(None, Some(Blocked))]);
    let reason = &trail.of(&key)[0].record.reason;
    assert!(
        reason.contains("budget per_run would pass its limit: 400000 EUR held of 500000"),
        "{reason}"
    );
    // Another run has its own counter.
    let other = "r-budget-approval-2";
    let elsewhere = h
        .agent
        .submit_created(&wire(other, 1, "acc-3", 450_000))
        .await;
    assert_eq!(elsewhere.status(), Pending);
    assert_eq!(counter(&h, "per_run", other).await, (450_000, 1));

    // Approved: counted (past the limit: a person decided), then sent.
    let approved = h
        .agent
        .act(run, &key, "approve", &json!({"reason": "one-off"}))
        .await;
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    assert_eq!(counter(&h, "per_run", run).await, (600_000, 2));
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Confirmed);
    assert_eq!(counter(&h, "per_run", run).await, (600_000, 2));
    h.stop().await;
}

/// A rule over budget state: "a wire that takes the day's wires past 80% of their budget needs
/// a person". The second wire proves the dispatcher's evaluation leaves out the wire's own
/// hold (with it, 2,700,000 of 3,000,000 would block it there); the third is blocked at
/// submission with the rule's reason, and an approval sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_over_the_days_spend_blocks_the_wire_that_takes_it_past_eighty_percent() {
    let h = Harness::start(Faults::none(), |c| {
        c.budget(
            "daily_wires",
            r#"
tools = ["payments/*"]
scope = "tenant"
window = "day"
limits = { EUR = 3000000 }
on_exceed = "deny"
"#,
        )
        .rule(
            Some("payments/wire"),
            r#"
name = "most-of-the-day"
when = "budgets.daily_wires.used + budgets.daily_wires.amount > budgets.daily_wires.limit * 8 / 10"
then = "require_approval"
reason = "takes the day's wires past 80% of their budget"
"#,
        )
    })
    .await;
    let run = "r-budget-rule";
    for decision in [1, 2] {
        let wire = h
            .agent
            .submit_created(&wire(run, decision, &format!("acc-{decision}"), 900_000))
            .await;
        let settled = h
            .agent
            .wait_settled(run, &wire.command_key.to_string())
            .await;
        assert_eq!(settled.status(), Confirmed, "wire {decision}: {settled:?}");
    }
    assert_eq!(
        counter(&h, "daily_wires", "anonymous").await,
        (1_800_000, 2)
    );

    let third = h
        .agent
        .submit_created(&wire(run, 3, "acc-3", 900_000))
        .await;
    let key = third.command_key.to_string();
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Blocked);
    let trail = h.audit(run).await;
    let reason = &trail.of(&key).last().expect("audited").record.reason;
    assert!(
        reason.contains("rule most-of-the-day: takes the day's wires past 80% of their budget"),
        "{reason}"
    );
    // Held all the same (it fits the budget): the rule asks for a person, it is not the limit.
    assert_eq!(
        counter(&h, "daily_wires", "anonymous").await,
        (2_700_000, 3)
    );
    let approved = h
        .agent
        .act(
            run,
            &key,
            "approve",
            &json!({"reason": "month-end payroll"}),
        )
        .await;
    assert_eq!(approved.status, StatusCode::OK, "{:?}", approved.body);
    assert_eq!(h.agent.wait_settled(run, &key).await.status(), Confirmed);
    assert_eq!(h.upstream.stats().wires, 3);
    h.stop().await;
}
