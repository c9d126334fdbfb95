//! Sweep shards: each reconciler leases the due-index shards it sweeps (the core's
//! `sweep::plan` decides which, the ledger's epoch compare-and-set picks one taker), renews
//! them, sweeps only those with time left, and gives them back when it stops. A reconciler
//! that dies stops renewing; its leases lapse and the others take its shards
//! (docs/architecture.md, "Sweep shards").

use std::time::Duration;

use sluice_core::sweep::{self, ShardMove, ShardTimes};
use sluice_core::time::Timestamp;
use sluice_ledger::{Ledger, LedgerError, Member, ShardCas, ShardLease};

/// The sweep group of all reconcilers sharing a ledger.
pub const SWEEP_GROUP: &str = "sluice-reconciler";

/// One reconciler's side of the split: its name and the leases it holds.
#[derive(Debug)]
pub struct ShardKeeper {
    me: String,
    group: String,
    times: ShardTimes,
    held: Vec<ShardLease>,
}

impl ShardKeeper {
    pub fn new(me: impl Into<String>, group: impl Into<String>, times: ShardTimes) -> Self {
        Self {
            me: me.into(),
            group: group.into(),
            times,
            held: Vec::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.me
    }

    /// The leases held after the last round (some may have lapsed since).
    pub fn held(&self) -> &[ShardLease] {
        &self.held
    }

    /// One round of the split at `now`: announce this member, read the leases and members,
    /// and make the writes the core's plan asks for. A write that loses its compare-and-set
    /// is left for the next round, decided again on what is stored then.
    pub async fn round(&mut self, ledger: &dyn Ledger, now: Timestamp) -> Result<(), LedgerError> {
        let shards = ledger.due_shards();
        ledger
            .announce(
                &self.group,
                Member {
                    name: self.me.clone(),
                    expires_at: self.times.member_expiry(now),
                },
            )
            .await?;
        let view = ledger.sweep_view(&self.group, shards).await?;
        self.held = view
            .leases
            .iter()
            .filter(|l| l.holder == self.me && l.live(now))
            .cloned()
            .collect();
        let plan = sweep::plan(
            shards,
            &self.me,
            now,
            &view.leases,
            &view.members,
            &self.times,
        );
        for step in plan.moves {
            let (guard, next) = step.write(&self.me, now, &self.times);
            let shard = step.shard();
            let written = ledger.write_shard_lease(&self.group, guard, next).await?;
            self.held.retain(|l| l.shard != shard);
            match (&step, written) {
                (ShardMove::Release { .. }, ShardCas::Applied(_)) => {}
                (_, ShardCas::Applied(lease)) => self.held.push(lease),
                (_, ShardCas::Conflict(stored)) => {
                    tracing::debug!(
                        shard,
                        ?stored,
                        "shard lease moved on; deciding again next round"
                    );
                }
            }
        }
        self.held.sort_by_key(|l| l.shard);
        Ok(())
    }

    /// The shards to sweep at `now` and how long the sweep may run, or `None` when this
    /// member holds none it may sweep under.
    pub fn sweepable(&self, now: Timestamp) -> Option<(Vec<u32>, Duration)> {
        let shards = sweep::sweepable(&self.me, now, &self.held, &self.times);
        let leases = self.held.iter().filter(|l| shards.contains(&l.shard));
        let budget = self.times.sweep_budget_ms(now, leases)?;
        Some((
            shards,
            Duration::from_millis(u64::try_from(budget).unwrap_or(0)),
        ))
    }

    /// Gives back every lease held and withdraws the announcement, so the others take the
    /// shards at their next round instead of after the leases lapse.
    pub async fn leave(&mut self, ledger: &dyn Ledger, now: Timestamp) -> Result<(), LedgerError> {
        for lease in std::mem::take(&mut self.held) {
            let step = ShardMove::Release {
                shard: lease.shard,
                epoch: lease.epoch,
            };
            let (guard, next) = step.write(&self.me, now, &self.times);
            ledger.write_shard_lease(&self.group, guard, next).await?;
        }
        ledger
            .announce(
                &self.group,
                Member {
                    name: self.me.clone(),
                    expires_at: now,
                },
            )
            .await
    }
}

/// A name for this reconciler in the split, unique per start.
pub fn member_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("reconciler-{}-{}", std::process::id(), &id[..8])
}
