//! Sweep shards: which due-index shard a run is filed under, and which shards a reconciler
//! leases, renews, gives back and sweeps, decided from the leases and members it read. Pure:
//! the reconciler carries the plan out with the ledger's epoch compare-and-set, so two
//! reconcilers that decide from different reads can both try a shard, and only one gets it
//! (docs/architecture.md, "Sweep shards").

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// The shard of the due index a run's commands are filed under: FNV-1a of the run id modulo
/// the shard count. The CQL ledger files its due entries by it; the SQLite ledger filters its
/// due query by it; both must agree with what a reconciler leases.
pub fn shard_of(run_id: &str, shards: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in run_id.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash % shards.max(1)
}

/// A shard's lease as stored: who holds it, under which epoch, until when. A lease whose
/// `expires_at` has passed is free (giving a lease back sets it to the time of release).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLease {
    pub shard: u32,
    pub holder: String,
    pub epoch: u64,
    pub expires_at: Timestamp,
}

impl ShardLease {
    /// Whether the lease is still held at `now`.
    pub fn live(&self, now: Timestamp) -> bool {
        self.expires_at > now
    }
}

/// A reconciler that announced itself: it counts in the split until `expires_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub expires_at: Timestamp,
}

/// How long leases last and when they are renewed or no longer swept under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardTimes {
    /// A taken or renewed lease lasts this long.
    pub ttl_ms: i64,
    /// A held lease with less than this left is renewed.
    pub renew_below_ms: i64,
    /// The clock-skew bound: a taker may see a lease lapse this much before its holder does.
    pub skew_ms: i64,
    /// The shortest sweep worth starting: a lease with less than this plus the skew bound
    /// left is not swept under.
    pub min_sweep_ms: i64,
}

impl ShardTimes {
    /// The times for a lease of `ttl_ms` and a clock-skew bound of `skew_ms`: renewed once
    /// half of it is gone, swept under while more than the skew bound and a second are left.
    pub fn new(ttl_ms: i64, skew_ms: i64) -> Self {
        let ttl_ms = ttl_ms.max(2);
        let skew_ms = skew_ms.clamp(0, ttl_ms / 2);
        Self {
            ttl_ms,
            renew_below_ms: ttl_ms / 2,
            skew_ms,
            min_sweep_ms: 1_000.min(ttl_ms / 2 - skew_ms),
        }
    }

    /// When a member's announcement made at `now` lapses unless renewed.
    pub fn member_expiry(&self, now: Timestamp) -> Timestamp {
        now.plus_millis(self.ttl_ms)
    }

    /// A held lease is swept under only while more than this is left.
    pub fn margin_ms(&self) -> i64 {
        self.skew_ms + self.min_sweep_ms
    }

    /// How long a sweep begun at `now` under `leases` may run: until the earliest of them is
    /// within the skew bound of its expiry, so no taker can see it lapse while the sweep
    /// still runs. `None` when there is no lease, or one is no longer usable.
    pub fn sweep_budget_ms<'a>(
        &self,
        now: Timestamp,
        leases: impl IntoIterator<Item = &'a ShardLease>,
    ) -> Option<i64> {
        let left = leases
            .into_iter()
            .map(|lease| lease.expires_at.millis_since(now))
            .min()?;
        (left > self.margin_ms()).then_some(left - self.skew_ms)
    }
}

/// A write the plan asks for. Every one is a compare-and-set on the shard's lease epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardMove {
    /// Take a free shard: `guard` is the epoch read (`None`: the shard was never leased).
    Take { shard: u32, guard: Option<u64> },
    /// Move the expiry of a lease this reconciler holds.
    Renew { shard: u32, epoch: u64 },
    /// Give back a lease this reconciler holds and should not (the split moved).
    Release { shard: u32, epoch: u64 },
}

impl ShardMove {
    pub fn shard(&self) -> u32 {
        match self {
            Self::Take { shard, .. } | Self::Renew { shard, .. } | Self::Release { shard, .. } => {
                *shard
            }
        }
    }

    /// The guard and the lease to write for this move by `me` at `now`.
    pub fn write(&self, me: &str, now: Timestamp, times: &ShardTimes) -> (Option<u64>, ShardLease) {
        let lease = |shard, epoch, expires_at| ShardLease {
            shard,
            holder: me.to_owned(),
            epoch,
            expires_at,
        };
        match *self {
            Self::Take { shard, guard } => (
                guard,
                lease(
                    shard,
                    guard.map_or(1, |e| e + 1),
                    now.plus_millis(times.ttl_ms),
                ),
            ),
            Self::Renew { shard, epoch } => (
                Some(epoch),
                lease(shard, epoch, now.plus_millis(times.ttl_ms)),
            ),
            Self::Release { shard, epoch } => (Some(epoch), lease(shard, epoch, now)),
        }
    }
}

/// What a reconciler does with the shards this round.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShardPlan {
    /// The writes to make, releases first (a shard given back is free for the others at once).
    pub moves: Vec<ShardMove>,
    /// How many shards this reconciler should hold once the split settles.
    pub target: usize,
}

/// The live members at `now`, sorted: every announced member not expired, every holder of a
/// live lease (a member whose announcement was lost still holds its shards), and `me`.
pub fn live_members(
    me: &str,
    now: Timestamp,
    leases: &[ShardLease],
    members: &[Member],
) -> Vec<String> {
    let mut live: Vec<String> = members
        .iter()
        .filter(|m| m.expires_at > now)
        .map(|m| m.name.clone())
        .chain(
            leases
                .iter()
                .filter(|l| l.live(now))
                .map(|l| l.holder.clone()),
        )
        .chain(std::iter::once(me.to_owned()))
        .collect();
    live.sort();
    live.dedup();
    live
}

/// How many of `shards` the member at `index` of `live` holders should hold: an even split,
/// the first `shards % n` members one more. Sums to `shards` over the members.
pub fn fair_share(shards: u32, live: usize, index: usize) -> usize {
    let (shards, live) = (shards as usize, live.max(1));
    shards / live + usize::from(index < shards % live)
}

/// Decides which of `shards` due-index shards `me` takes, renews and gives back, from the
/// leases and members read at `now`.
///
/// * Each live member's share is [`fair_share`] by its place among the live members, so every
///   member that read the same rows computes the same split, and the shares add up to all
///   shards: when one is below its share another is above it and gives shards back.
/// * `me` keeps the shards it holds (lowest first) up to its share, renews those with less
///   than `renew_below_ms` left, and gives back the rest.
/// * It takes free shards (never leased, or expired — a dead member's lapse) up to its share,
///   searching from an offset of its own so members do not all race for the same shard. A
///   shard another member holds is never taken before its lease lapses.
pub fn plan(
    shards: u32,
    me: &str,
    now: Timestamp,
    leases: &[ShardLease],
    members: &[Member],
    times: &ShardTimes,
) -> ShardPlan {
    let live = live_members(me, now, leases, members);
    let index = live.iter().position(|m| m == me).unwrap_or(0);
    let target = fair_share(shards, live.len(), index);
    let mut by_shard: Vec<Option<&ShardLease>> = vec![None; shards as usize];
    for lease in leases.iter().filter(|l| l.shard < shards) {
        // One row per shard; the highest epoch wins should a read ever show two.
        let slot = &mut by_shard[lease.shard as usize];
        if slot.is_none_or(|held| held.epoch < lease.epoch) {
            *slot = Some(lease);
        }
    }
    let mine: Vec<&ShardLease> = by_shard
        .iter()
        .flatten()
        .filter(|l| l.holder == me && l.live(now))
        .copied()
        .collect();
    let mut moves = Vec::new();
    for lease in mine.iter().skip(target) {
        moves.push(ShardMove::Release {
            shard: lease.shard,
            epoch: lease.epoch,
        });
    }
    for lease in mine.iter().take(target) {
        if lease.expires_at.millis_since(now) < times.renew_below_ms {
            moves.push(ShardMove::Renew {
                shard: lease.shard,
                epoch: lease.epoch,
            });
        }
    }
    let wanted = target.saturating_sub(mine.len());
    if wanted > 0 && shards > 0 {
        let start = index * shards as usize / live.len().max(1);
        let free = (0..shards as usize)
            .map(|i| (start + i) % shards as usize)
            .filter_map(|s| match by_shard[s] {
                None => Some(ShardMove::Take {
                    shard: s as u32,
                    guard: None,
                }),
                Some(lease) if !lease.live(now) => Some(ShardMove::Take {
                    shard: s as u32,
                    guard: Some(lease.epoch),
                }),
                Some(_) => None,
            })
            .take(wanted);
        moves.extend(free);
    }
    ShardPlan { moves, target }
}

/// The shards `me` may sweep at `now`: those it holds with more than the margin left.
pub fn sweepable(me: &str, now: Timestamp, held: &[ShardLease], times: &ShardTimes) -> Vec<u32> {
    let mut shards: Vec<u32> = held
        .iter()
        .filter(|l| l.holder == me && l.expires_at.millis_since(now) > times.margin_ms())
        .map(|l| l.shard)
        .collect();
    shards.sort_unstable();
    shards.dedup();
    shards
}

#[cfg(test)]
mod tests;

/// What a look needs beyond its status check's own timeout: its claim before and the write of
/// what it found after.
pub const LOOK_WRITE_MARGIN_MS: u64 = 1_000;

/// The status checks of `catalog` that cannot fit the sweep's item budget, each as an error
/// naming the tool, the keys and what would fit. A sweep waits for one item at most
/// `item_timeout_ms`; a look that needs longer is not cut off (it runs on in a task of its own,
/// see the reconciler), but the sweep stops waiting for it and its slot is given to another
/// item, so a deployment where that is the normal case is refused at start rather than left
/// to surprise.
///
/// The shard leases' time left, which also cuts a sweep short, is not held against a look:
/// the sweep is cut so that two reconcilers never sweep one shard at once, and a look is
/// fenced by its own claim on the command (held for two check timeouts), so a look that
/// outlives its sweep's shard lease is never started twice.
pub fn looks_that_do_not_fit(
    catalog: &crate::catalog::Catalog,
    item_timeout_ms: u64,
) -> Vec<String> {
    catalog
        .tools()
        .iter()
        .filter_map(|tool| {
            let check = tool.status_check()?;
            let needs = check.timeout_ms.saturating_add(LOOK_WRITE_MARGIN_MS);
            if needs <= item_timeout_ms {
                return None;
            }
            Some(format!(
                "tool {}: status_check.timeout_ms ({} ms) plus {LOOK_WRITE_MARGIN_MS} ms for its writes does not fit reconciler.sweep_item_timeout_ms ({item_timeout_ms} ms); set it to at least {needs} ms or lower the check's timeout",
                tool.name(),
                check.timeout_ms,
            ))
        })
        .collect()
}
