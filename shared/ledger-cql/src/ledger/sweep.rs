//! `due`: the walk over the time-bucketed due index, its per-shard cursors and the lazy
//! deletion of stale entries (docs/cql.md, "Due index").

use std::collections::HashSet;

use futures::StreamExt;

use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_ledger::{DueItem, LedgerError};

use super::{CqlLedger, FAN_OUT};
use crate::codec::{Fields, MINUTE_MS, minute_of, parse_status};
use crate::stats::{Kind, Op};

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
    /// A command due at the entry's time that cannot be decoded: not returned, but the entry
    /// is kept (and carried forward like a live one) so a repaired row, or a build that can
    /// read it, takes it up again. `status` as stored, for the carried entry's hint.
    Quarantined { status: String },
}

impl CqlLedger {
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
    /// or key it cannot parse now) is quarantined, never an error of the sweep.
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
            Err(why) => {
                self.inner.quarantine.set_aside(run, key, &why);
                quarantined()
            }
        })
    }

    /// [`sluice_ledger::Ledger::due`], documented there.
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
        let start = cursors
            .iter()
            .zip(&selected)
            .filter(|(_, selected)| **selected)
            .map(|(cursor, _)| *cursor)
            .min();
        let Some(start) = start else {
            return Ok(Vec::new());
        };
        let last = minute_of(now);
        // Per shard: whether every bucket walked so far was left empty.
        let mut clean = selected.clone();
        let mut moved = vec![false; cursors.len()];
        let mut items: Vec<DueItem> = Vec::new();
        let mut seen = HashSet::new();
        let mut minute = start;
        while minute <= last && items.len() < limit {
            let shards: Vec<i32> = (0..cursors.len())
                .filter(|&s| selected[s] && cursors[s] <= minute)
                .filter_map(|s| i32::try_from(s).ok())
                .collect();
            let buckets: Vec<Result<(i32, Vec<Fields>), LedgerError>> =
                futures::stream::iter(shards)
                    .map(|shard| async move {
                        self.paged(
                            op,
                            "read due bucket",
                            &self.inner.st.read_due,
                            (minute, shard, now.as_millis()),
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
            let read_whole = (minute + 1) * MINUTE_MS <= now.as_millis() + 1;
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
                    if due_at > now.as_millis() {
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
                        let live = match &checked {
                            Checked::Due(item) => Some(item.status.as_str()),
                            Checked::Quarantined { status } => Some(status.as_str()),
                            Checked::Stale => None,
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
                if matches!(checked, Checked::Stale) {
                    continue;
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
