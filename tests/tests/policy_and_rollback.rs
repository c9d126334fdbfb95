//! Policy and rollback end to end: a wire above the approval threshold is BLOCKED and never
//! reaches the bank; a run rollback compensates the run's confirmed effects one at a time in
//! reverse journal order, escalates what cannot be undone and leaves reads alone; policy rules
//! deny or block what their conditions name, with the rule as the reason.

use reqwest::StatusCode;
use sluice_core::command::CommandStatus::*;
use sluice_tests::*;
use sluice_upstream::Faults;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wire_above_the_approval_threshold_is_blocked_and_never_sent() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-approval";
    let big = "d-1/payments/wire/0";
    let created = h
        .agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-big", 2_000_000),
        ))
        .await;
    assert_eq!(
        created.status(),
        Pending,
        "policy is the dispatcher's to apply"
    );
    let blocked = h.agent.wait_settled(run, big).await;
    assert_eq!(blocked.status(), Blocked, "{blocked:?}");
    assert_eq!(blocked.state.attempts, 0, "never leased, never sent");

    // A later wire of the same run exactly at the threshold (not above it) goes through: the
    // dispatcher has handled the run past the blocked one, which still has not moved.
    let at_threshold = "d-2/payments/wire/0";
    h.agent
        .submit_created(&effect(
            run,
            2,
            "payments/wire",
            0,
            wire_args("acc-edge", 1_000_000),
        ))
        .await;
    let sent = h.agent.wait_settled(run, at_threshold).await;
    assert_eq!(sent.status(), Confirmed, "{sent:?}");
    let still = h.agent.get(run, big).await;
    assert_eq!(still.status(), Blocked);
    assert_eq!(
        still.state.lease, blocked.state.lease,
        "no lease was ever taken"
    );

    let stats = h.upstream.stats();
    assert_eq!(
        stats.standing_wires(&wire_business_key("acc-big", 2_000_000)),
        0,
        "the bank never saw the blocked wire: {stats:?}"
    );
    assert_eq!(stats.wires, 1, "only the wire at the threshold: {stats:?}");
    let listed: Vec<String> = h
        .agent
        .commands(run, Some("BLOCKED"))
        .await
        .iter()
        .map(|c| c.command_key.to_string())
        .collect();
    assert_eq!(listed, [big]);

    let trail = h.audit(run).await;
    assert_eq!(
        trail.path(big),
        vec![(None, Some(Pending)), (Some(Pending), Some(Blocked))],
        "{:#?}",
        trail.describe(big)
    );
    let block = trail.find(big, Pending, Blocked);
    assert_eq!(block.record.actor, "dispatcher");
    assert!(
        block.record.reason.contains("blocked by policy"),
        "{}",
        block.record.reason
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_rules_deny_and_block_what_they_name_and_the_rest_goes_through() {
    let h = Harness::start(Faults::none(), |c| {
        c.rule(
            None,
            r#"
name = "sanctioned"
tools = ["payments/*"]
when = "args.account.startsWith('acc-sanctioned')"
then = "deny"
reason = "the account is on the sanctions list"
"#,
        )
        .rule(
            Some("payments/wire"),
            r#"
name = "mid-size"
when = "args.amount_minor > 500000"
then = "require_approval"
"#,
        )
    })
    .await;
    let run = "r-rules";
    let wires = [
        ("acc-sanctioned-1", 100, "d-1/payments/wire/0"),
        ("acc-mid", 600_000, "d-2/payments/wire/0"),
        ("acc-small", 100, "d-3/payments/wire/0"),
    ];
    for (decision, (account, amount, _)) in (1..).zip(wires) {
        h.agent
            .submit_created(&effect(
                run,
                decision,
                "payments/wire",
                0,
                wire_args(account, amount),
            ))
            .await;
    }
    let denied = h.agent.wait_settled(run, wires[0].2).await;
    let blocked = h.agent.wait_settled(run, wires[1].2).await;
    let sent = h.agent.wait_settled(run, wires[2].2).await;
    assert_eq!(sent.status(), Confirmed, "{sent:?}");
    assert_eq!(blocked.status(), Blocked, "{blocked:?}");
    assert_ne!(denied.status(), Confirmed, "{denied:?}");
    assert_eq!(denied.state.attempts, 0, "a denied wire is never sent");

    let trail = h.audit(run).await;
    let denied_reasons = trail.describe(wires[0].2).join("\n");
    assert!(
        denied_reasons.contains("rule sanctioned: the account is on the sanctions list"),
        "{denied_reasons}"
    );
    let block = trail.find(wires[1].2, Pending, Blocked);
    assert!(
        block.record.reason.contains("rule mid-size"),
        "{}",
        block.record.reason
    );

    let stats = h.upstream.stats();
    assert_eq!(
        stats.wires, 1,
        "only the small wire reached the bank: {stats:?}"
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_compensates_in_reverse_journal_order_and_escalates_what_it_cannot_undo() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-rollback";
    let (ticket, wire, email, search) = (
        "d-1/tickets/create/0",
        "d-2/payments/wire/0",
        "d-3/email/send/0",
        "d-4/search/lookup/0",
    );
    h.agent
        .submit_created(&effect(
            run,
            1,
            "tickets/create",
            0,
            ticket_args("incident"),
        ))
        .await;
    h.agent
        .submit_created(&effect(
            run,
            2,
            "payments/wire",
            0,
            wire_args("acc-rb", 9_900),
        ))
        .await;
    h.agent
        .submit_created(&effect(run, 3, "email/send", 0, email_args("refunded")))
        .await;
    h.agent
        .submit_created(&effect(run, 4, "search/lookup", 0, search_args("refunds")))
        .await;
    for key in [ticket, wire, email, search] {
        let command = h.agent.wait_settled(run, key).await;
        assert_eq!(command.status(), Confirmed, "{key}: {command:?}");
    }

    let missing = h.agent.rollback("r-nothing-here", "abort").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.text);
    let no_reason = h.agent.rollback(run, "  ").await;
    assert_eq!(
        no_reason.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        no_reason.text
    );

    let accepted = h.agent.rollback(run, "the agent went off the rails").await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);

    // The ticket is first in the journal, so it is compensated last.
    let ticket_after = h
        .agent
        .wait_until(run, ticket, "COMPENSATED", |c| c.status() == Compensated)
        .await;
    let wire_after = h
        .agent
        .wait_until(run, wire, "COMPENSATED", |c| c.status() == Compensated)
        .await;
    let email_after = h
        .agent
        .wait_until(run, email, "NO_COMPENSATION", |c| {
            c.status() == NoCompensation
        })
        .await;
    let search_after = h.agent.get(run, search).await;
    assert!(
        email_after.state.escalated,
        "an unsent email cannot be unsent"
    );
    assert_eq!(
        search_after.status(),
        Confirmed,
        "a read has nothing to undo"
    );
    assert!(search_after.state.compensation.is_none());

    let wire_comp = wire_after.state.compensation.clone().expect("recorded");
    let ticket_comp = ticket_after.state.compensation.clone().expect("recorded");
    assert_eq!(wire_comp.reference.as_deref(), Some("rev-1"));
    assert_eq!(ticket_comp.reference.as_deref(), Some("t-1"));
    for comp in [&wire_comp, &ticket_comp] {
        let ended = comp.ended_at.expect("an end time");
        assert!(comp.started_at <= ended, "{comp:?}");
        assert_eq!(comp.attempts, 1);
    }
    assert!(
        wire_comp.ended_at.expect("ended") <= ticket_comp.started_at,
        "one at a time, the wire (later in the journal) first: wire {wire_comp:?}, ticket {ticket_comp:?}"
    );

    let stats = h.upstream.stats();
    assert_eq!(stats.wires_reversed, 1, "{stats:?}");
    assert_eq!(stats.standing_wires(&wire_business_key("acc-rb", 9_900)), 0);
    assert_eq!(stats.tickets_closed, 1, "{stats:?}");
    assert_eq!((stats.emails, stats.searches), (1, 1));

    // The chain verifies and orders it all: the rollback request, then email, wire and ticket.
    let trail = h.audit(run).await;
    let rollback = trail
        .entries
        .iter()
        .find(|e| e.record.command_key.is_none())
        .expect("a run-level rollback record");
    assert!(
        rollback.record.reason.starts_with("run rollback:"),
        "{rollback:?}"
    );
    assert_eq!(rollback.record.actor, "e2e-operator");
    let seq = |key: &str, from, to| trail.find(key, from, to).record.seq;
    // The rollback is begun durably (every command to undo marked, last first), then the
    // compensations run one at a time in the same order.
    let order = [
        rollback.record.seq,
        seq(email, Confirmed, NoCompensation),
        seq(wire, Confirmed, Compensating),
        seq(ticket, Confirmed, Compensating),
        seq(wire, Compensating, Compensated),
        seq(ticket, Compensating, Compensated),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "reverse journal order, one compensation at a time: {order:?}; {:#?}",
        trail
            .entries
            .iter()
            .map(|e| format!(
                "#{} {:?} {:?}->{:?}",
                e.record.seq, e.record.command_key, e.record.from, e.record.to
            ))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        trail.path(search).last(),
        Some(&(Some(Leased), Some(Confirmed))),
        "the search was left alone: {:#?}",
        trail.describe(search)
    );
    assert_eq!(
        trail.find(wire, Compensating, Compensated).record.actor,
        "compensator"
    );
    h.stop().await;
}

/// Four rollbacks of one run sent at once compensate each command once: one reversal at the
/// bank, one closed ticket, and every compensation recorded once in the audit chain; the run
/// is closed once (one rollback record), and a rollback that found it rolled back says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollbacks_sent_at_once_compensate_each_command_once() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-rollback-race";
    let (ticket, wire) = ("d-1/tickets/create/0", "d-2/payments/wire/0");
    h.agent
        .submit_created(&effect(run, 1, "tickets/create", 0, ticket_args("race")))
        .await;
    h.agent
        .submit_created(&effect(
            run,
            2,
            "payments/wire",
            0,
            wire_args("acc-race", 4_200),
        ))
        .await;
    for key in [ticket, wire] {
        assert_eq!(h.agent.wait_settled(run, key).await.status(), Confirmed);
    }

    let rollbacks = (0..4).map(|i| {
        let agent = &h.agent;
        async move { agent.rollback(run, &format!("abort {i}")).await }
    });
    for answer in futures::future::join_all(rollbacks).await {
        assert!(
            answer.status == StatusCode::ACCEPTED
                || answer.status == StatusCode::CONFLICT
                || (answer.status == StatusCode::OK && answer.text.contains("already rolled back")),
            "{} {}",
            answer.status,
            answer.text
        );
    }
    for key in [ticket, wire] {
        h.agent
            .wait_until(run, key, "COMPENSATED", |c| c.status() == Compensated)
            .await;
    }
    // Time for any second compensation to happen, if one were under way.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let stats = h.upstream.stats();
    assert_eq!(stats.wires_reversed, 1, "{stats:?}");
    assert_eq!(stats.tickets_closed, 1, "{stats:?}");
    let chain = h.audit(run).await;
    for key in [ticket, wire] {
        let compensated = chain
            .of(key)
            .into_iter()
            .filter(|e| e.record.to == Some(Compensated))
            .count();
        assert_eq!(compensated, 1, "{key}: {:#?}", chain.describe(key));
    }
    let closings = chain
        .entries
        .iter()
        .filter(|e| e.record.command_key.is_none() && e.record.reason.starts_with("run rollback"))
        .count();
    assert_eq!(closings, 1, "one rollback record for four rollbacks");
    h.stop().await;
}

/// A rolled-back run is shut: the agent's next effect in it is refused with 409
/// `run_rolled_back` and never runs, a retry of an effect it already had still answers 200,
/// and other runs go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_run_takes_no_new_effects() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-shut";
    let first = effect(run, 1, "email/send", 0, email_args("before"));
    h.agent.submit_created(&first).await;
    let key = "d-1/email/send/0";
    assert_eq!(h.agent.wait_settled(run, key).await.status(), Confirmed);
    let accepted = h.agent.rollback(run, "went off the rails").await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.text);

    let after = h
        .agent
        .submit(&effect(run, 2, "email/send", 0, email_args("after")))
        .await;
    assert_eq!(after.status, StatusCode::CONFLICT, "{}", after.text);
    assert_eq!(after.error_code(), "run_rolled_back", "{}", after.text);
    let retry = h.agent.submit(&first).await;
    assert_eq!(retry.status, StatusCode::OK, "{}", retry.text);
    assert_eq!(
        h.agent.commands(run, None).await.len(),
        1,
        "nothing new was recorded in the run"
    );
    h.agent
        .submit_created(&effect(
            "r-shut-other",
            1,
            "email/send",
            0,
            email_args("elsewhere"),
        ))
        .await;
    let elsewhere = h.agent.wait_settled("r-shut-other", key).await;
    assert_eq!(elsewhere.status(), Confirmed, "other runs go on");
    assert_eq!(
        h.upstream.stats().emails,
        2,
        "the first email and the other run's; the refused one was never sent"
    );
    h.stop().await;
}
