//! `due`: the walk over the time-bucketed due index, its per-shard cursors and floors and the
//! lazy deletion of stale entries (docs/cql.md, "Due index").

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use futures::StreamExt;

use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_ledger::{DueItem, LedgerError};

use super::{CqlLedger, FAN_OUT};
use crate::codec::{Fields, MINUTE_MS, minute_of, parse_status};
use crate::stats::{Kind, Op};

/// How far behind a sweep's `now` the next sweep of a shard starts: an entry that lands within
/// this of its due time (by the sweeping process's clock) is read by the next sweep.
const FLOOR_OVERLAP_MS: i64 = 5_000;

/// How often a shard is read whole, from its cursor: what finds an entry that landed later than
/// [`FLOOR_OVERLAP_MS`] after its due time (a stalled writer, a skewed clock, an entry carried
/// forward by another process), and the only reads that move cursors.
const WHOLE_EVERY_MS: i64 = 30_000;

/// How long after it was written an entry that looks stale is kept. A writer files a
/// transition's entry before its LWT, so until the LWT is decided the row may still show the
/// old due time (or no command, for a reservation): an LWT whose outcome was unknown is settled
/// by a SERIAL read seconds later, after a node's death. Deleted then, the entry would be gone
/// when the LWT lands, and the command due with nothing to find it. Kept, it is read again by
/// the next whole read of its shard, and deleted there once it is older than this. Far longer
/// than a writer keeps an LWT undecided (its attempts, each within the driver's timeout).
const STALE_AFTER_MS: i64 = 120_000;

/// Per shard, where this process's last sweep of it left off.
#[derive(Debug, Clone, Copy)]
struct Floor {
    /// Every entry due at or before this that had landed by that sweep was stale (and
    /// deleted) or quarantined: the next sweep reads only past it. A live entry holds it back
    /// to just before its due time, so a command still due is read again every sweep.
    after: i64,
    /// When (the sweep's `now`) the shard was last read whole.
    whole_at: i64,
}

/// Each shard's [`Floor`], kept by this process only: a shard it has not swept lately (just
/// taken over, or never) is read whole.
#[derive(Debug, Default)]
pub(super) struct Floors(Mutex<HashMap<u32, Floor>>);

impl Floors {
    fn get(&self, shard: u32) -> Option<Floor> {
        self.0
            .lock()
            .ok()
            .and_then(|floors| floors.get(&shard).copied())
    }

    fn set(&self, shard: u32, floor: Option<Floor>) {
        if let Ok(mut floors) = self.0.lock() {
            match floor {
                Some(floor) => floors.insert(shard, floor),
                None => floors.remove(&shard),
            };
        }
    }
}

/// What one sweep reads of a shard: from which bucket, and past which due time.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Read from the shard's cursor, every entry: the only kind of read that moves a cursor.
    whole: bool,
    from_minute: i64,
    /// Only entries due after this are read (`i64::MIN` for a whole read).
    after: i64,
}

impl Plan {
    fn for_shard(floor: Option<Floor>, cursor: i64, now: i64) -> Self {
        match floor {
            Some(floor)
                if floor.whole_at <= now
                    && now - floor.whole_at < WHOLE_EVERY_MS
                    && floor.after <= now =>
            {
                Self {
                    whole: false,
                    from_minute: cursor.max(floor.after.div_euclid(MINUTE_MS)),
                    after: floor.after,
                }
            }
            Some(_) | None => Self {
                whole: true,
                from_minute: cursor,
                after: i64::MIN,
            },
        }
    }

    /// The floor this plan leaves: `complete` when the walk reached `now`'s bucket (a walk cut
    /// short by the limit leaves the floor as it was), `held` the earliest due time of a live
    /// entry read in the shard.
    fn next_floor(
        self,
        before: Option<Floor>,
        complete: bool,
        held: Option<i64>,
        now: i64,
    ) -> Option<Floor> {
        if !complete {
            return before.filter(|_| !self.whole);
        }
        let after = (now - FLOOR_OVERLAP_MS).min(held.map_or(i64::MAX, |due| due - 1));
        let whole_at = match before {
            Some(before) if !self.whole => before.whole_at,
            _ => now,
        };
        Some(Floor { after, whole_at })
    }
}

/// A due entry as read.
#[derive(Debug, Clone)]
struct DueEntry {
    minute: i64,
    shard: i32,
    due_at: i64,
    run_id: String,
    command_key: String,
    written: i64,
}

/// What a due entry stands for.
enum Checked {
    /// The command, due at exactly the entry's time.
    Due(DueItem),
    /// Nothing: the command is gone or due at another time.
    Stale,
    /// Nothing yet, but written less than [`STALE_AFTER_MS`] ago: its transition may still
    /// land. Kept, and its bucket is not passed.
    Young,
    /// A command due at the entry's time that cannot be decoded: not returned, but the entry
    /// is kept (and carried forward like a live one) so a repaired row, or a build that can
    /// read it, takes it up again. `status` as stored, for the carried entry's hint.
    Quarantined { status: String },
}

impl CqlLedger {
    /// Whether an entry written at `written` (its write time, in microseconds) is younger
    /// than [`STALE_AFTER_MS`] by this ledger's clock.
    fn young(&self, written: i64) -> bool {
        self.now().as_millis() - written.div_euclid(1_000) < STALE_AFTER_MS
    }

    async fn cursors(&self, op: Op) -> Result<Vec<i64>, LedgerError> {
        let shards = self.inner.config.due_shards;
        let ids: Vec<i32> = (0..i32::try_from(shards).unwrap_or(1)).collect();
        let rows = self
            .plain(
                op,
                "read sweep cursors",
                &self.inner.st.read_cursors,
                (ids,),
            )
            .await?;
        let mut cursors = vec![self.inner.due_origin; shards as usize];
        for row in rows {
            if let (Some(shard), Some(minute)) = (row.int("shard"), row.bigint("minute"))
                && let Some(slot) = usize::try_from(shard).ok().and_then(|s| cursors.get_mut(s))
            {
                *slot = minute.max(self.inner.due_origin);
            }
        }
        Ok(cursors)
    }

    /// Whether the entry still stands for the command: the command is due at exactly its
    /// time. A command this ledger cannot decode (quarantined before, or with a status, run id
    /// or key it cannot parse now) is quarantined, never an error of the sweep; one of a
    /// status only a newer build knows is kept the same way, but not quarantined.
    async fn check_due(
        &self,
        op: Op,
        run: &str,
        key: &str,
        due_at: i64,
    ) -> Result<Checked, LedgerError> {
        let rows = self
            .plain(
                op,
                "check due entry",
                &self.inner.st.read_due_at,
                (run, key),
            )
            .await?;
        let Some(status) = rows
            .first()
            .filter(|row| row.bigint("due_at") == Some(due_at))
            .and_then(|row| row.text("status"))
        else {
            // The command is gone, or due at another time: the entry is stale.
            return Ok(Checked::Stale);
        };
        let quarantined = || Checked::Quarantined {
            status: status.to_owned(),
        };
        if self.inner.quarantine.holds(run, key) {
            return Ok(quarantined());
        }
        let parsed = RunId::parse(run)
            .map_err(|e| e.to_string())
            .and_then(|run_id| {
                CommandKey::parse(key)
                    .map(|key| (run_id, key))
                    .map_err(|e| e.to_string())
            })
            .and_then(|(run_id, key)| {
                parse_status(run, status)
                    .map(|status| (run_id, key, status))
                    .map_err(|e| e.to_string())
            });
        Ok(match parsed {
            Ok((run_id, command_key, status)) => Checked::Due(DueItem {
                run_id,
                command_key,
                status,
                due_at: Timestamp::from_millis(due_at),
            }),
            // Kept in the due index, like a quarantined entry, for a newer build to act on.
            Err(_) if sluice_ledger::stored::is_newer_status(status) => {
                self.inner.quarantine.left_for_newer(run, key, status);
                quarantined()
            }
            Err(why) => {
                self.inner.quarantine.set_aside(run, key, &why);
                quarantined()
            }
        })
    }

    /// [`sluice_ledger::ShardStore::due`], documented there.
    pub(super) async fn sweep_due(
        &self,
        now: Timestamp,
        limit: usize,
        only: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError> {
        let op = Op::Due;
        self.inner.stats.call(op);
        let config = &self.inner.config;
        let clock_minute = minute_of(self.now());
        // Buckets before this can get no new entries (writers file due entries in their own
        // minute at the earliest), so a cursor may pass them once they are empty.
        let settled_before = clock_minute - config.sweep_lag_minutes;
        let mut cursors = self.cursors(op).await?;
        // The shards this caller sweeps (the ones whose sweep leases it holds): the others
        // are neither read nor have their cursors moved.
        let mut selected = vec![false; cursors.len()];
        for &shard in only {
            if let Some(slot) = usize::try_from(shard)
                .ok()
                .and_then(|s| selected.get_mut(s))
            {
                *slot = true;
            }
        }
        let now_ms = now.as_millis();
        let plans: Vec<Option<Plan>> = cursors
            .iter()
            .enumerate()
            .map(|(shard, &cursor)| {
                selected[shard].then(|| {
                    let floor = self.inner.floors.get(shard_u32(shard));
                    Plan::for_shard(floor, cursor, now_ms)
                })
            })
            .collect();
        let Some(start) = plans.iter().flatten().map(|plan| plan.from_minute).min() else {
            return Ok(Vec::new());
        };
        let last = minute_of(now);
        // Per shard: whether every bucket walked so far was read whole and left empty.
        let mut clean: Vec<bool> = plans.iter().map(|p| p.is_some_and(|p| p.whole)).collect();
        let mut moved = vec![false; cursors.len()];
        // Per shard: the earliest due time of a live entry read.
        let mut held: Vec<Option<i64>> = vec![None; cursors.len()];
        let mut items: Vec<DueItem> = Vec::new();
        let mut seen = HashSet::new();
        let mut minute = start;
        while minute <= last && items.len() < limit {
            let shards: Vec<(i32, i64)> = plans
                .iter()
                .enumerate()
                .filter_map(|(s, plan)| plan.filter(|p| p.from_minute <= minute).map(|p| (s, p)))
                .filter_map(|(s, plan)| i32::try_from(s).ok().map(|s| (s, plan.after)))
                .collect();
            let buckets: Vec<Result<(i32, Vec<Fields>), LedgerError>> =
                futures::stream::iter(shards)
                    .map(|(shard, after)| async move {
                        self.paged(
                            op,
                            "read due bucket",
                            &self.inner.st.read_due,
                            (minute, shard, after, now_ms),
                            Kind::Plain,
                        )
                        .await
                        .map(|rows| (shard, rows))
                    })
                    .buffered(FAN_OUT)
                    .collect()
                    .await;
            // A bucket holds entries due before its minute ends (an entry is filed in its due
            // minute, or the writer's if that is later). The read stops at `now`, so only a
            // bucket that ended by `now` was read whole and can be found empty.
            let read_whole = (minute + 1) * MINUTE_MS <= now_ms + 1;
            let mut entries = Vec::new();
            for bucket in buckets {
                let (shard, rows) = bucket?;
                let index = usize::try_from(shard).unwrap_or(0);
                if !read_whole {
                    clean[index] = false;
                }
                for row in rows {
                    let (Some(due_at), Some(run), Some(key)) = (
                        row.bigint("due_at"),
                        row.text("run_id"),
                        row.text("command_key"),
                    ) else {
                        continue;
                    };
                    if due_at > now_ms {
                        // Not due for this caller: the bucket is not done with.
                        clean[index] = false;
                        continue;
                    }
                    entries.push(DueEntry {
                        minute,
                        shard,
                        due_at,
                        run_id: run.to_owned(),
                        command_key: key.to_owned(),
                        written: row.bigint("written").unwrap_or(0),
                    });
                }
            }
            let checked: Vec<Result<(DueEntry, Checked), LedgerError>> =
                futures::stream::iter(entries)
                    .map(|entry| async move {
                        let checked = self
                            .check_due(op, &entry.run_id, &entry.command_key, entry.due_at)
                            .await?;
                        let checked = match checked {
                            Checked::Stale if self.young(entry.written) => Checked::Young,
                            checked => checked,
                        };
                        if matches!(checked, Checked::Young) {
                            return Ok((entry, checked));
                        }
                        let live = match &checked {
                            Checked::Due(item) => Some(item.status.as_str()),
                            Checked::Quarantined { status } => Some(status.as_str()),
                            Checked::Stale | Checked::Young => None,
                        };
                        let carry = live.is_some() && entry.minute < settled_before;
                        if live.is_none() || carry {
                            if let Some(status) = live.filter(|_| carry) {
                                self.write_due(
                                    op,
                                    &entry.run_id,
                                    &entry.command_key,
                                    Timestamp::from_millis(entry.due_at),
                                    status,
                                )
                                .await?;
                            }
                            // With the entry's own write time: a rewrite of the same entry
                            // (the command due at this time again) is newer and survives.
                            self.plain(
                                op,
                                "delete due entry",
                                &self.inner.st.delete_due,
                                (
                                    entry.written,
                                    entry.minute,
                                    entry.shard,
                                    entry.due_at,
                                    entry.run_id.as_str(),
                                    entry.command_key.as_str(),
                                ),
                            )
                            .await?;
                        }
                        Ok((entry, checked))
                    })
                    .buffer_unordered(FAN_OUT)
                    .collect()
                    .await;
            for result in checked {
                let (entry, checked) = result?;
                match checked {
                    Checked::Stale => continue,
                    Checked::Young => {
                        // Kept: the bucket is not empty, so the cursor stays and the shard's
                        // whole reads see the entry again.
                        if let Some(slot) = usize::try_from(entry.shard)
                            .ok()
                            .and_then(|s| clean.get_mut(s))
                        {
                            *slot = false;
                        }
                        continue;
                    }
                    Checked::Due(_) | Checked::Quarantined { .. } => {}
                }
                if matches!(checked, Checked::Due(_))
                    && let Some(slot) = usize::try_from(entry.shard)
                        .ok()
                        .and_then(|s| held.get_mut(s))
                {
                    *slot = Some(slot.map_or(entry.due_at, |due| due.min(entry.due_at)));
                }
                if entry.minute >= settled_before {
                    // Stays in this bucket: the bucket is not empty.
                    if let Some(slot) = usize::try_from(entry.shard)
                        .ok()
                        .and_then(|s| clean.get_mut(s))
                    {
                        *slot = false;
                    }
                }
                if let Checked::Due(item) = checked
                    && seen.insert((item.run_id.clone(), item.command_key.clone()))
                {
                    items.push(item);
                }
            }
            for (shard, cursor) in cursors.iter_mut().enumerate() {
                if *cursor == minute && clean[shard] && minute < settled_before {
                    *cursor = minute + 1;
                    moved[shard] = true;
                } else if *cursor <= minute {
                    clean[shard] = false;
                }
            }
            minute += 1;
        }
        let complete = minute > last;
        for (shard, plan) in plans.iter().enumerate() {
            if let Some(plan) = plan {
                let shard_id = shard_u32(shard);
                let before = self.inner.floors.get(shard_id);
                let floor = plan.next_floor(before, complete, held[shard], now_ms);
                self.inner.floors.set(shard_id, floor);
            }
        }
        for (shard, cursor) in cursors.iter().enumerate() {
            if moved[shard] {
                let shard = i32::try_from(shard).unwrap_or(0);
                self.plain(
                    op,
                    "move sweep cursor",
                    &self.inner.st.write_cursor,
                    (*cursor, shard),
                )
                .await?;
            }
        }
        items.sort_by(|a, b| {
            (a.due_at, a.run_id.as_str(), a.command_key.to_string()).cmp(&(
                b.due_at,
                b.run_id.as_str(),
                b.command_key.to_string(),
            ))
        });
        items.truncate(limit);
        Ok(items)
    }
}

fn shard_u32(shard: usize) -> u32 {
    u32::try_from(shard).unwrap_or(u32::MAX)
}
