//! The writer's sweep-shard operations: a shard lease's compare-and-set on its epoch, and a
//! member's announcement. In the batch's write transaction like every other write, so racing
//! writers with the same guard, in this process or another on the file, apply one at a time.

use rusqlite::{OptionalExtension, params};

use super::Writer;
use crate::{Member, ShardCas, ShardLease};

/// Announcements of members gone this long are deleted by the next announcement.
const FORGET_MEMBERS_AFTER_MS: i64 = 3_600_000;

impl Writer {
    fn read_shard_lease(
        &self,
        group: &str,
        shard: u32,
    ) -> Result<Option<ShardLease>, rusqlite::Error> {
        self.conn
            .prepare_cached(
                "SELECT holder, epoch, expires_at FROM sweep_shards \
                 WHERE sweep_group = ?1 AND shard = ?2",
            )?
            .query_row(params![group, shard], |row| {
                Ok(ShardLease {
                    shard,
                    holder: row.get(0)?,
                    epoch: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                    expires_at: sluice_core::time::Timestamp::from_millis(row.get(2)?),
                })
            })
            .optional()
    }

    pub(super) fn write_shard_lease(
        &mut self,
        group: &str,
        guard: Option<u64>,
        next: &ShardLease,
    ) -> Result<ShardCas, rusqlite::Error> {
        let stored = self.read_shard_lease(group, next.shard)?;
        if stored.as_ref().map(|lease| lease.epoch) != guard {
            return Ok(ShardCas::Conflict(stored));
        }
        self.conn
            .prepare_cached(
                "INSERT INTO sweep_shards (sweep_group, shard, holder, epoch, expires_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (sweep_group, shard) DO UPDATE SET \
                 holder = excluded.holder, epoch = excluded.epoch, expires_at = excluded.expires_at",
            )?
            .execute(params![
                group,
                next.shard,
                next.holder,
                i64::try_from(next.epoch).unwrap_or(i64::MAX),
                next.expires_at.as_millis()
            ])?;
        Ok(ShardCas::Applied(next.clone()))
    }

    pub(super) fn announce(&mut self, group: &str, member: &Member) -> Result<(), rusqlite::Error> {
        self.conn
            .prepare_cached(
                "INSERT INTO sweep_members (sweep_group, name, expires_at) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (sweep_group, name) DO UPDATE SET expires_at = excluded.expires_at",
            )?
            .execute(params![group, member.name, member.expires_at.as_millis()])?;
        self.conn
            .prepare_cached("DELETE FROM sweep_members WHERE sweep_group = ?1 AND expires_at < ?2")?
            .execute(params![
                group,
                member.expires_at.as_millis() - FORGET_MEMBERS_AFTER_MS
            ])?;
        Ok(())
    }
}
