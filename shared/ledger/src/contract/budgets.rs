//! The contract of spend budgets' holds: checked and written in one atomic step (racing holds
//! never pass a limit), keyed by the command (a repeated hold counts once), and following the
//! command's status in the ledger's own transition write (FAILED and CANCELLED release, an
//! approval makes a deferred hold count).

use std::sync::Arc;

use serde_json::json;

use sluice_core::budget::{BudgetLine, OnExceed, Scope, Window, counter_key};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{Event, Operator};

use super::{command, fresh_run, reserve_new, step};
use crate::{Held, HoldMode, Ledger};

/// A budget name (and so a counter) no other check or concurrent test process uses.
pub(super) fn fresh_budget(label: &str) -> String {
    fresh_run(label).to_string().to_ascii_lowercase()
}

pub(super) fn line(budget: &str, amount: i64, limit: i64) -> BudgetLine {
    BudgetLine {
        budget: budget.to_owned(),
        counter: counter_key(budget, "acme", 0, "EUR"),
        scope: Scope::Tenant,
        scope_value: "acme".into(),
        window: Window::Total,
        window_start: 0,
        currency: "EUR".into(),
        amount,
        limit,
        on_exceed: OnExceed::Deny,
    }
}

pub(super) async fn used(ledger: &dyn Ledger, budget: &str) -> (i64, u64) {
    let counters = ledger.budget_counters(budget, 0).await.expect("counters");
    assert!(counters.len() <= 1, "one scope and currency: {counters:?}");
    counters
        .first()
        .map_or((0, 0), |counter| (counter.used, counter.holds))
}

const TAG: &str = "hash:agent";

pub(super) fn key(i: u32) -> CommandKey {
    CommandKey::new(i, "payments/wire".parse().expect("a tool"), 0)
}

pub(super) async fn hold(ledger: &dyn Ledger, run: &RunId, i: u32, line: &BudgetLine) -> Held {
    ledger
        .budget_hold(
            run,
            &key(i),
            TAG,
            std::slice::from_ref(line),
            HoldMode::Enforce,
        )
        .await
        .expect("hold")
}

pub async fn budget_holds_fit_up_to_the_limit_once_per_command(ledger: Arc<dyn Ledger>) {
    let budget = fresh_budget("budget");
    let run = fresh_run("budget");
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 600, 1000)).await,
        Held::Fresh
    );
    // The same command again (a retried admission, a second producer): counted once.
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 600, 1000)).await,
        Held::Already
    );
    assert_eq!(used(&*ledger, &budget).await, (600, 1));
    // Another submission under the same key (other arguments, another agent) holds apart, and
    // giving back its hold (its reservation was refused) leaves the first one's.
    let other = ledger
        .budget_hold(
            &run,
            &key(1),
            "other-hash:other-agent",
            &[line(&budget, 300, 1000)],
            HoldMode::Enforce,
        )
        .await
        .expect("hold");
    assert_eq!(other, Held::Fresh);
    assert_eq!(used(&*ledger, &budget).await, (900, 2));
    ledger
        .budget_unhold(&run, &key(1), "other-hash:other-agent")
        .await
        .expect("unhold");
    assert_eq!(used(&*ledger, &budget).await, (600, 1));
    let Held::Exceeded {
        line: over,
        used: at,
    } = hold(&*ledger, &run, 2, &line(&budget, 500, 1000)).await
    else {
        panic!("600 + 500 passes 1000");
    };
    assert_eq!((over.amount, at), (500, 600));
    assert_eq!(used(&*ledger, &budget).await, (600, 1), "nothing written");
    assert_eq!(
        hold(&*ledger, &run, 3, &line(&budget, 400, 1000)).await,
        Held::Fresh,
        "exactly up to the limit fits"
    );
    assert_eq!(used(&*ledger, &budget).await, (1000, 2));
    // An admission whose command was not recorded gives its room back, and may hold again.
    ledger
        .budget_unhold(&run, &key(3), TAG)
        .await
        .expect("unhold");
    ledger
        .budget_unhold(&run, &key(3), TAG)
        .await
        .expect("unhold");
    assert_eq!(used(&*ledger, &budget).await, (600, 1));
    assert_eq!(
        hold(&*ledger, &run, 3, &line(&budget, 400, 1000)).await,
        Held::Fresh
    );
    // A deferred hold counts nothing.
    let deferred = ledger
        .budget_hold(
            &run,
            &key(4),
            TAG,
            &[line(&budget, 5000, 1000)],
            HoldMode::Defer,
        )
        .await
        .expect("defer");
    assert_eq!(deferred, Held::Fresh);
    assert_eq!(used(&*ledger, &budget).await, (1000, 2));
}

pub async fn thirty_two_racing_holds_never_pass_the_limit(ledger: Arc<dyn Ledger>) {
    let budget = fresh_budget("budget-race");
    let run = fresh_run("budget-race");
    // 32 commands of 100 against 1000, each admitted twice at once: ten fit, each once.
    let mut tasks = Vec::new();
    for i in 0..64u32 {
        let ledger = ledger.clone();
        let run = run.clone();
        let line = line(&budget, 100, 1000);
        tasks.push(tokio::spawn(async move {
            (i % 32, hold(&*ledger, &run, i % 32, &line).await)
        }));
    }
    let mut fresh = std::collections::BTreeSet::new();
    for task in tasks {
        let (i, held) = task.await.expect("task");
        if held == Held::Fresh {
            assert!(fresh.insert(i), "command {i} held twice");
        }
    }
    assert_eq!(fresh.len(), 10, "ten of 100 fit 1000: {fresh:?}");
    assert_eq!(used(&*ledger, &budget).await, (1000, 10));
}

fn operator() -> Operator {
    Operator {
        actor: "ops@example.com".into(),
        reason: "checked".into(),
    }
}

pub async fn budget_holds_follow_the_command_status(ledger: Arc<dyn Ledger>) {
    let budget = fresh_budget("budget-status");
    let run = fresh_run("budget-status");
    // Denied at dispatch: FAILED, nothing spent, the hold released.
    let denied = reserve_new(
        &*ledger,
        command(&run, 1, "payments/wire", 0, json!({"amount_minor": 700})),
    )
    .await;
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 700, 1000)).await,
        Held::Fresh
    );
    assert_eq!(used(&*ledger, &budget).await, (700, 1));
    let failed = ledger
        .transition(step(
            &denied,
            Event::Deny {
                reason: "no".into(),
                epoch: None,
            },
        ))
        .await
        .expect("deny");
    assert!(failed.is_applied());
    assert_eq!(used(&*ledger, &budget).await, (0, 0), "released on FAILED");
    // A later command fits in the room given back; a hold after the release counts nothing.
    assert_eq!(
        hold(&*ledger, &run, 2, &line(&budget, 1000, 1000)).await,
        Held::Fresh
    );
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 700, 1000)).await,
        Held::Already
    );
    assert_eq!(used(&*ledger, &budget).await, (1000, 1));

    // Recorded past the limit, BLOCKED for a person: counts once approved, released once
    // cancelled.
    let blocked = reserve_new(
        &*ledger,
        command(&run, 3, "payments/wire", 0, json!({"amount_minor": 300})),
    )
    .await;
    let deferred = ledger
        .budget_hold(
            &run,
            &blocked.command_key,
            TAG,
            &[line(&budget, 300, 1000)],
            HoldMode::Defer,
        )
        .await
        .expect("defer");
    assert_eq!(deferred, Held::Fresh);
    let blocked = ledger
        .transition(step(
            &blocked,
            Event::Block {
                reason: "over budget".into(),
                epoch: None,
            },
        ))
        .await
        .expect("block")
        .applied()
        .cloned()
        .expect("applied");
    assert_eq!(
        used(&*ledger, &budget).await,
        (1000, 1),
        "deferred: not counted"
    );
    let approved = ledger
        .transition(step(
            &blocked,
            Event::Approve {
                operator: operator(),
                policy_version: "1".into(),
                revision: None,
            },
        ))
        .await
        .expect("approve")
        .applied()
        .cloned()
        .expect("applied");
    assert_eq!(
        used(&*ledger, &budget).await,
        (1300, 2),
        "approved past the limit: a person decided"
    );
    let cancelled = ledger
        .transition(step(
            &approved,
            Event::Cancel {
                operator: operator(),
            },
        ))
        .await
        .expect("cancel");
    assert!(cancelled.is_applied());
    assert_eq!(
        used(&*ledger, &budget).await,
        (1000, 1),
        "released on CANCELLED"
    );
}

pub async fn a_reservation_and_its_holds_are_one_step(ledger: Arc<dyn Ledger>) {
    use crate::{Budgeted, LedgerError, Reserved};
    let budget = fresh_budget("budget-reserve");
    let run = fresh_run("budget-reserve");
    let reserve = |i: u32, amount: i64, tag: &'static str| {
        let ledger = ledger.clone();
        let budget = budget.clone();
        let command = command(&run, i, "payments/wire", 0, json!({"amount_minor": amount}));
        async move {
            let audit = command.reservation_audit("contract");
            ledger
                .reserve_held(
                    command,
                    audit,
                    false,
                    tag,
                    &[line(&budget, amount, 1000)],
                    HoldMode::Enforce,
                )
                .await
        }
    };
    let Ok(Budgeted::Recorded {
        reserved,
        held: Held::Fresh,
    }) = reserve(1, 700, TAG).await
    else {
        panic!("the first reservation holds and records");
    };
    let Reserved::Created(first) = *reserved else {
        panic!("a new command: {reserved:?}");
    };
    assert_eq!(used(&*ledger, &budget).await, (700, 1));
    // The same submission again: the stored command, held once.
    let again = reserve(1, 700, TAG).await.expect("replay");
    assert!(
        matches!(&again, Budgeted::Recorded { reserved, held: Held::Already } if matches!(&**reserved, Reserved::Existing(c) if c.command_key == first.command_key)),
        "{again:?}"
    );
    assert_eq!(used(&*ledger, &budget).await, (700, 1));
    // Over the limit: neither a hold nor a command.
    let over = reserve(2, 400, TAG).await.expect("answered");
    assert!(
        matches!(over, Budgeted::Exceeded { used: 700, .. }),
        "{over:?}"
    );
    let missing = ledger.get(&run, &key(2)).await.expect("read");
    assert!(missing.is_none(), "nothing recorded: {missing:?}");
    assert_eq!(used(&*ledger, &budget).await, (700, 1));
    // The same key with other arguments (and so another tag): refused as drift, its hold given
    // back, the recorded command's kept.
    let drift = reserve(1, 200, "other-hash:agent").await;
    assert!(
        matches!(drift, Err(LedgerError::ArgumentDrift { .. })),
        "{drift:?}"
    );
    assert_eq!(used(&*ledger, &budget).await, (700, 1));
}

pub async fn what_others_hold_leaves_out_the_commands_own_holds(ledger: Arc<dyn Ledger>) {
    let budget = fresh_budget("budget-others");
    let run = fresh_run("budget-others");
    let counter = line(&budget, 0, 1000).counter;
    let others = |i: u32| {
        let ledger = Arc::clone(&ledger);
        let (run, counter) = (run.clone(), counter.clone());
        async move {
            ledger
                .budget_used_by_others(&run, &key(i), std::slice::from_ref(&counter))
                .await
                .expect("read")
        }
    };
    // A counter never written: nothing held.
    assert_eq!(others(1).await, vec![0]);
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 300, 1000)).await,
        Held::Fresh
    );
    assert_eq!(
        hold(&*ledger, &run, 2, &line(&budget, 200, 1000)).await,
        Held::Fresh
    );
    // Each command sees what the other holds, never its own hold; a third sees both.
    assert_eq!(others(1).await, vec![200]);
    assert_eq!(others(2).await, vec![300]);
    assert_eq!(others(3).await, vec![500]);
    // A deferred hold counts nothing, for others as for itself.
    let deferred = ledger
        .budget_hold(
            &run,
            &key(4),
            TAG,
            &[line(&budget, 900, 1000)],
            HoldMode::Defer,
        )
        .await
        .expect("defer");
    assert_eq!(deferred, Held::Fresh);
    assert_eq!(others(4).await, vec![500]);
    assert_eq!(others(1).await, vec![200]);
}

pub async fn a_purge_removes_holds_of_ended_windows_and_keeps_total_ones(ledger: Arc<dyn Ledger>) {
    use sluice_core::budget::ended_windows_start_by;

    let budget = fresh_budget("budget-purge");
    let run = fresh_run("budget-purge");
    let spent = reserve_new(
        &*ledger,
        command(&run, 1, "payments/wire", 0, json!({"amount_minor": 100})),
    )
    .await;
    // The day before yesterday's window (ended), and the budget's `total` counter.
    let day = 86_400_000;
    let ended_start = (ended_windows_start_by(super::now()) - day).div_euclid(day) * day;
    let ended = BudgetLine {
        counter: counter_key(&budget, "acme", ended_start, "EUR"),
        window: Window::Day,
        window_start: ended_start,
        ..line(&budget, 100, 1000)
    };
    let total = line(&budget, 100, 1000);
    let held = ledger
        .budget_hold(
            &run,
            &spent.command_key,
            TAG,
            &[ended.clone(), total.clone()],
            HoldMode::Enforce,
        )
        .await
        .expect("hold");
    assert_eq!(held, Held::Fresh);
    let leased = super::lease(&*ledger, &spent, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    ledger
        .finalize(step(&leased, super::committed(leased.epoch(), json!({}))))
        .await
        .expect("confirmed");
    let counter_at = |start: i64| {
        let ledger = Arc::clone(&ledger);
        let budget = budget.clone();
        async move {
            let counters = ledger
                .budget_counters(&budget, start)
                .await
                .expect("counters");
            counters
                .first()
                .map(|counter| (counter.used, counter.holds))
        }
    };
    assert_eq!(counter_at(ended_start).await, Some((100, 1)));
    assert_eq!(counter_at(0).await, Some((100, 1)));

    let cutoff = super::now().plus_millis(1_000);
    let mut removed = None;
    // Other tests' finished runs may be purged too; loop until ours is gone.
    for _ in 0..100 {
        let preview = ledger
            .purge(cutoff, 10_000, "retention", super::now(), true)
            .await
            .expect("dry run");
        let batch = ledger
            .purge(cutoff, 10_000, "retention", super::now(), false)
            .await
            .expect("purge");
        if batch.checkpoints.iter().any(|c| c.run_id == run) {
            assert!(
                preview.budget_holds >= 1,
                "the dry run counts the holds a purge would remove: {preview:?}"
            );
            removed = Some(batch.budget_holds);
            break;
        }
        assert!(batch.runs > 0, "our finished run was not purged");
    }
    let removed = removed.expect("our run purged");
    assert!(removed >= 1, "the ended window's hold removed: {removed}");
    // The ended window's spend stays what it was, with no hold left behind it; the `total`
    // budget's hold stays, counted.
    assert_eq!(counter_at(ended_start).await, Some((100, 0)));
    assert_eq!(counter_at(0).await, Some((100, 1)));
}
