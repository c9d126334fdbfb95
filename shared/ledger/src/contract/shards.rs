//! The contract of sweep-shard leases: the epoch compare-and-set (one winner of any race, a
//! stale epoch never writes), members' announcements, and the due index read by shard.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::json;

use sluice_core::command::CommandStatus;
use sluice_core::sweep::shard_of;
use sluice_core::time::Timestamp;

use super::{command, fresh_run, now, reserve_new};
use crate::{Ledger, LedgerError, Member, ShardCas, ShardLease};

/// A sweep group no other check (or concurrent test process) uses.
fn fresh_group(label: &str) -> String {
    fresh_run(label).to_string()
}

fn lease(shard: u32, holder: &str, epoch: u64, expires_at: Timestamp) -> ShardLease {
    ShardLease {
        shard,
        holder: holder.into(),
        epoch,
        expires_at,
    }
}

pub async fn shard_leases_are_taken_renewed_and_released_under_their_epoch(
    ledger: Arc<dyn Ledger>,
) {
    let group = fresh_group("shards");
    let t = now();
    let empty = ledger.sweep_view(&group, 8).await.expect("view");
    assert!(empty.leases.is_empty() && empty.members.is_empty());

    let first = lease(3, "a", 1, t.plus_millis(10_000));
    let taken = ledger
        .write_shard_lease(&group, None, first.clone())
        .await
        .expect("take");
    assert_eq!(taken, ShardCas::Applied(first.clone()));
    // A shard already leased is not taken "if never leased".
    let again = ledger
        .write_shard_lease(&group, None, lease(3, "b", 1, t.plus_millis(10_000)))
        .await
        .expect("take again");
    assert_eq!(again, ShardCas::Conflict(Some(first.clone())));

    let renewed = lease(3, "a", 1, t.plus_millis(20_000));
    assert!(
        ledger
            .write_shard_lease(&group, Some(1), renewed.clone())
            .await
            .expect("renew")
            .is_applied()
    );
    let view = ledger.sweep_view(&group, 8).await.expect("view");
    assert_eq!(view.leases, vec![renewed.clone()]);
    assert!(
        ledger
            .sweep_view(&group, 3)
            .await
            .expect("view")
            .leases
            .is_empty(),
        "shards past the count are not read"
    );

    // Given back, then taken over under the next epoch: the old holder's epoch is fenced.
    let released = lease(3, "a", 1, t);
    assert!(
        ledger
            .write_shard_lease(&group, Some(1), released)
            .await
            .expect("release")
            .is_applied()
    );
    let took_over = lease(3, "b", 2, t.plus_millis(10_000));
    assert!(
        ledger
            .write_shard_lease(&group, Some(1), took_over.clone())
            .await
            .expect("take over")
            .is_applied()
    );
    let stale = ledger
        .write_shard_lease(&group, Some(1), lease(3, "a", 1, t.plus_millis(30_000)))
        .await
        .expect("stale renew");
    assert_eq!(stale, ShardCas::Conflict(Some(took_over)));

    let back = ledger
        .write_shard_lease(&group, Some(2), lease(3, "b", 1, t))
        .await;
    assert!(
        matches!(back, Err(LedgerError::InvalidRequest { .. })),
        "an epoch never goes back: {back:?}"
    );
    let zero = ledger
        .write_shard_lease(&group, None, lease(4, "b", 0, t))
        .await;
    assert!(matches!(zero, Err(LedgerError::InvalidRequest { .. })));
}

pub async fn sixteen_racing_shard_takers_have_one_winner(ledger: Arc<dyn Ledger>) {
    let group = fresh_group("race");
    let t = now();
    let race = |guard: Option<u64>, epoch: u64| {
        let (ledger, group) = (Arc::clone(&ledger), group.clone());
        async move {
            let tasks: Vec<_> = (0..16)
                .map(|i| {
                    let (ledger, group) = (Arc::clone(&ledger), group.clone());
                    tokio::spawn(async move {
                        let next = lease(0, &format!("m{i}"), epoch, t.plus_millis(10_000));
                        ledger.write_shard_lease(&group, guard, next).await
                    })
                })
                .collect();
            let mut winners = Vec::new();
            for task in tasks {
                match task.await.expect("task").expect("write") {
                    ShardCas::Applied(lease) => winners.push(lease),
                    ShardCas::Conflict(stored) => {
                        assert!(stored.is_some(), "a conflict names the lease as stored")
                    }
                }
            }
            winners
        }
    };
    let first = race(None, 1).await;
    assert_eq!(first.len(), 1, "one taker of a free shard: {first:?}");
    let second = race(Some(1), 2).await;
    assert_eq!(second.len(), 1, "one taker of a lapsed lease: {second:?}");
    let view = ledger.sweep_view(&group, 1).await.expect("view");
    assert_eq!(view.leases, second);
}

pub async fn sweep_members_are_announced_and_withdrawn(ledger: Arc<dyn Ledger>) {
    let group = fresh_group("members");
    let t = now();
    for name in ["r-1", "r-2"] {
        ledger
            .announce(
                &group,
                Member {
                    name: name.into(),
                    expires_at: t.plus_millis(10_000),
                },
            )
            .await
            .expect("announce");
    }
    ledger
        .announce(
            &group,
            Member {
                name: "r-1".into(),
                expires_at: t,
            },
        )
        .await
        .expect("withdraw");
    let mut members = ledger.sweep_view(&group, 4).await.expect("view").members;
    members.sort_by(|a, b| a.name.cmp(&b.name));
    let live: Vec<&str> = members
        .iter()
        .filter(|m| m.expires_at > t)
        .map(|m| m.name.as_str())
        .collect();
    assert_eq!(live, vec!["r-2"], "{members:?}");
    assert!(
        members.iter().all(|m| m.name != "r-1" || m.expires_at == t),
        "a withdrawn member is gone or expired: {members:?}"
    );
}

pub async fn due_in_returns_only_the_listed_shards(ledger: Arc<dyn Ledger>) {
    let shards = ledger.due_shards();
    assert!(shards >= 2, "a ledger has shards to split ({shards})");
    // Runs until two fall in different shards.
    let mut runs = Vec::new();
    let mut seen = HashSet::new();
    while runs.len() < 2 {
        let run = fresh_run("by-shard");
        if seen.insert(shard_of(run.as_str(), shards)) {
            runs.push(run);
        }
    }
    let mut due_at = None;
    for run in &runs {
        let pending = reserve_new(&*ledger, command(run, 1, "email/send", 0, json!({}))).await;
        assert_eq!(pending.status(), CommandStatus::Pending);
        due_at = due_at.max(pending.state.due_at);
    }
    let at = due_at.expect("PENDING is due when stale");
    let ours = |items: Vec<crate::DueItem>| -> Vec<String> {
        items
            .into_iter()
            .filter(|item| runs.contains(&item.run_id))
            .map(|item| item.run_id.to_string())
            .collect()
    };
    for run in &runs {
        let shard = shard_of(run.as_str(), shards);
        let found = ours(ledger.due_in(at, 100_000, &[shard]).await.expect("due_in"));
        assert_eq!(found, vec![run.to_string()], "shard {shard}");
    }
    let all: Vec<u32> = runs.iter().map(|r| shard_of(r.as_str(), shards)).collect();
    assert_eq!(
        ours(ledger.due_in(at, 100_000, &all).await.expect("due_in")).len(),
        2
    );
    assert!(
        ours(ledger.due_in(at, 100_000, &[]).await.expect("due_in")).is_empty(),
        "no shards, nothing due"
    );
    assert_eq!(ours(ledger.due(at, 100_000).await.expect("due")).len(), 2);
}
