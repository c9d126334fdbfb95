//! The contract of taking over a reservation's lease that ran short
//! (`sluice_core::machine::reservation_lease_lapsing`): a LEASED-to-LEASED write under the
//! next epoch, one winner of any race, and the old holder fenced.

use std::sync::Arc;

use serde_json::json;

use sluice_core::command::{Command, EffectSemantics};
use sluice_core::ids::LeaseEpoch;
use sluice_core::machine::{self, DispatchOutcome, Event, Rules};
use sluice_core::policy::PolicyDecision;

use super::{command, fresh_run, now, reserve_new};
use crate::{Cas, Ledger, Transition};

/// Sixteen dispatchers find one email's reservation lease past its time at once (its request
/// was redelivered while it waited): exactly one takes it over, and the reservation's epoch can
/// no longer write an outcome.
pub async fn sixteen_dispatchers_taking_over_a_lapsed_reservation_lease_have_one_winner(
    ledger: Arc<dyn Ledger>,
) {
    let run = fresh_run("take-over");
    let rules = Rules::defaults(EffectSemantics::Idempotent);
    let reserved = command(&run, 0, "email/send", 0, json!({"to": "a@example.com"}))
        .leased_at_reservation(&rules, &PolicyDecision::Allow, now());
    let reserved = reserve_new(&*ledger, reserved).await;
    let lapsed = reserved
        .state
        .lease
        .expires_at
        .expect("a reservation lease has an expiry")
        .plus_millis(1);
    let take = |command: &Command, owner: &str| {
        let event = Event::Lease {
            owner: owner.into(),
        };
        let step = machine::apply(&command.state, &rules, &event, lapsed)
            .unwrap_or_else(|refusal| panic!("take-over refused: {refusal}"));
        Transition::from_step(command, &step, owner)
    };
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (ledger, write) = (Arc::clone(&ledger), take(&reserved, &format!("d-{i}")));
            tokio::spawn(async move { ledger.acquire_lease(write).await.expect("write") })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        if let Cas::Applied(taken) = task.await.expect("task") {
            winners.push(taken);
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one dispatcher takes the lease over"
    );
    let stored = ledger
        .get(&run, &reserved.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(stored, winners[0]);
    assert_eq!(stored.epoch(), LeaseEpoch::new(2));
    assert_eq!(stored.state.attempts, 2);

    // The reservation's epoch is fenced: its outcome is refused by the core before any write.
    let stale = Event::Dispatched {
        epoch: reserved.epoch(),
        sent_at: now(),
        outcome: DispatchOutcome::Committed {
            external_ref: Some("m-1".into()),
            result: None,
        },
    };
    assert!(machine::apply(&stored.state, &rules, &stale, lapsed).is_err());
    // And a write built on the reservation's view loses its compare-and-set.
    assert!(
        !ledger
            .acquire_lease(take(&reserved, "late"))
            .await
            .expect("write")
            .is_applied()
    );
}
