//! The embedded ledger's [`ShardStore`]: commands due in a set of shards (the shard is a
//! filter on the due query, `sluice_core::sweep::shard_of` of the run id), and a sweep group's
//! shard leases and members. Writes of leases and members go through the writer
//! (`writer/shards.rs`).

use std::sync::Arc;

use rusqlite::params;

use sluice_core::ids::{CommandKey, RunId};
use sluice_core::sweep::shard_of;
use sluice_core::time::Timestamp;

use async_trait::async_trait;

use super::schema::map_err;
use super::writer::{Op, Reply};
use super::{DUE_SHARDS, SqliteLedger};
use crate::{DueItem, LedgerError, Member, ShardCas, ShardLease, ShardStore, SweepView};

impl SqliteLedger {
    /// [`crate::ShardStore::due_in`]: due commands, earliest first, of runs in `shards`.
    pub(super) async fn due_in_shards(
        &self,
        now: Timestamp,
        limit: usize,
        shards: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let quarantine = Arc::clone(&self.inner.quarantine);
        let mut selected = [false; DUE_SHARDS as usize];
        for &shard in shards.iter().filter(|&&s| s < DUE_SHARDS) {
            selected[shard as usize] = true;
        }
        let every = selected.iter().all(|&s| s);
        if !selected.iter().any(|&s| s) || limit == 0 {
            return Ok(Vec::new());
        }
        self.read("due", move |conn| {
            let failed = |e| map_err(e, "due", &path, &config);
            // Rows stream from the due index in time order; those of other shards, those
            // quarantined and those of a newer build's status are passed over, so neither takes the place of a command that can
            // be swept.
            let mut stmt = conn
                .prepare_cached(
                    "SELECT run_id, command_key, status, due_at FROM commands \
                     WHERE due_at IS NOT NULL AND due_at <= ?1 ORDER BY due_at",
                )
                .map_err(failed)?;
            let mut rows = stmt.query(params![now.as_millis()]).map_err(failed)?;
            let mut items = Vec::new();
            while items.len() < limit {
                let Some(row) = rows.next().map_err(failed)? else {
                    break;
                };
                let (run, key, status, due_at): (String, String, String, i64) = (
                    row.get(0).map_err(failed)?,
                    row.get(1).map_err(failed)?,
                    row.get(2).map_err(failed)?,
                    row.get(3).map_err(failed)?,
                );
                if !every && !selected[shard_of(&run, DUE_SHARDS) as usize] {
                    continue;
                }
                if quarantine.holds(&run, &key) {
                    continue;
                }
                let parsed = RunId::parse(&run)
                    .map_err(|e| e.to_string())
                    .and_then(|run_id| {
                        CommandKey::parse(&key)
                            .map(|key| (run_id, key))
                            .map_err(|e| e.to_string())
                    })
                    .and_then(|(run_id, key)| {
                        status
                            .parse()
                            .map(|status| (run_id, key, status))
                            .map_err(|e: sluice_core::command::UnknownStatus| e.to_string())
                    });
                match parsed {
                    Ok((run_id, command_key, status)) => items.push(DueItem {
                        run_id,
                        command_key,
                        status,
                        due_at: Timestamp::from_millis(due_at),
                    }),
                    // Left in the due index for a newer build, which can read its status.
                    Err(_) if crate::stored::is_newer_status(&status) => {
                        quarantine.left_for_newer(&run, &key, &status);
                    }
                    Err(why) => quarantine.set_aside(&run, &key, &why),
                }
            }
            Ok(items)
        })
        .await
    }

    /// [`crate::ShardStore::sweep_view`].
    pub(super) async fn read_sweep_view(
        &self,
        group: &str,
        shards: u32,
    ) -> Result<SweepView, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let group = group.to_owned();
        self.read("sweep_view", move |conn| {
            let failed = |e| map_err(e, "sweep_view", &path, &config);
            let leases = conn
                .prepare_cached(
                    "SELECT shard, holder, epoch, expires_at FROM sweep_shards \
                     WHERE sweep_group = ?1 AND shard < ?2 ORDER BY shard",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![group, shards], |row| {
                        Ok(ShardLease {
                            shard: row.get(0)?,
                            holder: row.get(1)?,
                            epoch: u64::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
                            expires_at: Timestamp::from_millis(row.get(3)?),
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(failed)?;
            let members = conn
                .prepare_cached(
                    "SELECT name, expires_at FROM sweep_members WHERE sweep_group = ?1 \
                     ORDER BY name",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![group], |row| {
                        Ok(Member {
                            name: row.get(0)?,
                            expires_at: Timestamp::from_millis(row.get(1)?),
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()
                })
                .map_err(failed)?;
            Ok(SweepView { leases, members })
        })
        .await
    }
}

#[async_trait]
impl ShardStore for SqliteLedger {
    fn due_shards(&self) -> u32 {
        DUE_SHARDS
    }

    async fn due_in(
        &self,
        now: Timestamp,
        limit: usize,
        shards: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError> {
        self.due_in_shards(now, limit, shards).await
    }

    async fn sweep_view(&self, group: &str, shards: u32) -> Result<SweepView, LedgerError> {
        self.read_sweep_view(group, shards).await
    }

    async fn write_shard_lease(
        &self,
        group: &str,
        guard: Option<u64>,
        next: ShardLease,
    ) -> Result<ShardCas, LedgerError> {
        crate::shards::validate(group, guard, &next)?;
        let op = Op::ShardLease {
            group: group.to_owned(),
            guard,
            next,
        };
        match self.submit(op).await?.result? {
            Reply::Shard(cas) => Ok(cas),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn announce(&self, group: &str, member: Member) -> Result<(), LedgerError> {
        let op = Op::Announce {
            group: group.to_owned(),
            member,
        };
        match self.submit(op).await?.result? {
            Reply::Announced => Ok(()),
            _ => Err(LedgerError::Closed),
        }
    }
}
