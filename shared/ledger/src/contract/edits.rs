//! The contract of an edit's budget move (`BudgetStore::budget_rehold` and `budget_supersede`,
//! `sluice_core::revision`): the edited amount fits when the counter's spend without the
//! command's own hold leaves room for it; the old hold counts until superseded and never again
//! after (no status change brings it back, and a re-submission of the submitted arguments finds
//! it, so holds nothing afresh); the edit's hold then follows the command's status as any.

use std::sync::Arc;

use serde_json::json;

use sluice_core::budget::revision_tag;
use sluice_core::machine::{Event, Operator};

use super::budgets::{fresh_budget, hold, key, line, used};
use super::{command, fresh_run, reserve_new, step};
use crate::{Held, HoldMode, Ledger};

pub async fn an_edit_moves_the_commands_hold_to_the_edited_amount(ledger: Arc<dyn Ledger>) {
    let budget = fresh_budget("budget-edit");
    let run = fresh_run("budget-edit");
    let edited = reserve_new(
        &*ledger,
        command(&run, 1, "payments/wire", 0, json!({"amount_minor": 700})),
    )
    .await;
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 700, 1000)).await,
        Held::Fresh
    );
    assert_eq!(
        hold(&*ledger, &run, 2, &line(&budget, 200, 1000)).await,
        Held::Fresh
    );
    assert_eq!(used(&*ledger, &budget).await, (900, 2));
    let rehold = |tag: String, amount: i64| {
        let (ledger, run, budget) = (ledger.clone(), run.clone(), budget.clone());
        async move {
            ledger
                .budget_rehold(
                    &run,
                    &key(1),
                    &tag,
                    &[line(&budget, amount, 1000)],
                    HoldMode::Enforce,
                )
                .await
                .expect("rehold")
        }
    };
    // 800 fits: 900 held less this command's 700, plus 800, is 1000. Both count until the
    // edit is written: more than spent, never less.
    let first = revision_tag(1, "h1");
    assert_eq!(rehold(first.clone(), 800).await, Held::Fresh);
    assert_eq!(rehold(first.clone(), 800).await, Held::Already);
    assert_eq!(used(&*ledger, &budget).await, (1700, 3));
    for _ in 0..2 {
        ledger
            .budget_supersede(&run, &key(1), &first)
            .await
            .expect("supersede");
        assert_eq!(
            used(&*ledger, &budget).await,
            (1000, 2),
            "the old hold gone"
        );
    }
    // The submitted arguments re-submitted: their hold is found (moved), nothing held afresh.
    assert_eq!(
        hold(&*ledger, &run, 1, &line(&budget, 700, 1000)).await,
        Held::Already
    );
    assert_eq!(used(&*ledger, &budget).await, (1000, 2));
    // A second edit to 900 does not fit: 1000 less 800 is 200, plus 900. Nothing changes.
    let second = revision_tag(2, "h2");
    assert_eq!(
        rehold(second.clone(), 900).await,
        Held::Exceeded {
            line: Box::new(line(&budget, 900, 1000)),
            used: 200
        }
    );
    assert_eq!(used(&*ledger, &budget).await, (1000, 2));
    // The edit's hold follows the status; the moved one never comes back.
    let operator = Operator {
        actor: "ops@example.com".into(),
        reason: "checked".into(),
    };
    let failed = ledger
        .transition(step(
            &edited,
            Event::Deny {
                reason: "no".into(),
                epoch: None,
            },
        ))
        .await
        .expect("deny")
        .applied()
        .cloned()
        .expect("applied");
    assert_eq!(
        used(&*ledger, &budget).await,
        (200, 1),
        "released on FAILED"
    );
    let replayed = ledger
        .transition(step(
            &failed,
            Event::Replay {
                operator,
                evidence: None,
            },
        ))
        .await
        .expect("replay");
    assert!(replayed.is_applied());
    assert_eq!(
        used(&*ledger, &budget).await,
        (1000, 2),
        "a replay takes the edit's hold back, not the moved one"
    );
}
