//! Sweep-shard leases on CQL: one partition per (group, shard), written only by LWTs on the
//! lease's epoch (`IF NOT EXISTS` for a shard never leased), an unknown outcome settled by a
//! SERIAL read of the LWT's `write_id`; members announced by plain writes with a TTL
//! (docs/cql.md, "Sweep shards").

use uuid::Uuid;

use sluice_core::time::Timestamp;
use sluice_ledger::{LedgerError, Member, ShardCas, ShardLease, SweepView};

use super::{CqlLedger, Lwt};
use crate::codec::Fields;
use crate::stats::{Kind, Op};

/// An announcement outlives its expiry by this much before Cassandra drops it, so a member
/// that stopped is listed (expired) for a while and then forgotten.
const MEMBER_TTL_S: i32 = 3_600;

fn lease_of(row: &Fields) -> Option<ShardLease> {
    Some(ShardLease {
        shard: u32::try_from(row.int("shard")?).ok()?,
        holder: row.text("holder")?.to_owned(),
        epoch: u64::try_from(row.bigint("epoch")?).ok()?,
        expires_at: Timestamp::from_millis(row.bigint("expires_at")?),
    })
}

impl CqlLedger {
    /// [`sluice_ledger::ShardStore::sweep_view`]: one read of the group's shard partitions and
    /// one of its members' partition.
    pub(super) async fn read_sweep_view(
        &self,
        group: &str,
        shards: u32,
    ) -> Result<SweepView, LedgerError> {
        let op = Op::Sweep;
        self.inner.stats.call(op);
        let ids: Vec<i32> = (0..shards).filter_map(|s| i32::try_from(s).ok()).collect();
        let rows = self
            .paged(
                op,
                "read shard leases",
                &self.inner.st.read_shards,
                (group, ids),
                Kind::Plain,
            )
            .await?;
        let mut leases: Vec<ShardLease> = rows.iter().filter_map(lease_of).collect();
        leases.sort_by_key(|lease| lease.shard);
        let rows = self
            .paged(
                op,
                "read sweep members",
                &self.inner.st.read_members,
                (group,),
                Kind::Plain,
            )
            .await?;
        let members = rows
            .iter()
            .filter_map(|row| {
                Some(Member {
                    name: row.text("name")?.to_owned(),
                    expires_at: Timestamp::from_millis(row.bigint("expires_at")?),
                })
            })
            .collect();
        Ok(SweepView { leases, members })
    }

    /// The lease as stored, read at SERIAL: after a write, it shows whether the write applied.
    async fn read_shard_serial(
        &self,
        group: &str,
        shard: i32,
    ) -> Result<Option<(ShardLease, Option<Uuid>)>, LedgerError> {
        let rows = self
            .paged(
                Op::Sweep,
                "read shard lease",
                &self.inner.st.read_shard_serial,
                (group, shard),
                Kind::Serial,
            )
            .await?;
        Ok(rows
            .first()
            .and_then(|row| Some((lease_of(row)?, row.uuid("write_id")))))
    }

    /// [`sluice_ledger::ShardStore::write_shard_lease`].
    pub(super) async fn put_shard_lease(
        &self,
        group: &str,
        guard: Option<u64>,
        next: ShardLease,
    ) -> Result<ShardCas, LedgerError> {
        sluice_ledger::shards::validate(group, guard, &next)?;
        let op = Op::Sweep;
        self.inner.stats.call(op);
        let shard = i32::try_from(next.shard).map_err(|_| LedgerError::InvalidRequest {
            run_id: format!("sweep group {group}"),
            command_key: format!("shard {}", next.shard),
            why: "a shard number fits an int".into(),
        })?;
        let as_bigint = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let write_id = Uuid::new_v4();
        let (epoch, expires) = (as_bigint(next.epoch), next.expires_at.as_millis());
        let holder = next.holder.as_str();
        let answer = match guard {
            None => {
                self.lwt(
                    op,
                    "take shard lease",
                    &self.inner.st.take_shard,
                    (group, shard, holder, epoch, expires, write_id),
                )
                .await?
            }
            Some(guard) => {
                self.lwt(
                    op,
                    "write shard lease",
                    &self.inner.st.write_shard,
                    (
                        holder,
                        epoch,
                        expires,
                        write_id,
                        group,
                        shard,
                        as_bigint(guard),
                    ),
                )
                .await?
            }
        };
        match answer {
            Lwt::Applied => Ok(ShardCas::Applied(next)),
            Lwt::NotApplied(_) | Lwt::Unknown => {
                // Not applied: the answer holds only the condition's columns, so read the
                // lease whole. Unknown: the SERIAL read settles it by the write's id.
                let stored = self.read_shard_serial(group, shard).await?;
                Ok(match stored {
                    Some((lease, Some(id))) if id == write_id => ShardCas::Applied(lease),
                    other => ShardCas::Conflict(other.map(|(lease, _)| lease)),
                })
            }
        }
    }

    /// [`sluice_ledger::ShardStore::announce`].
    pub(super) async fn put_member(&self, group: &str, member: Member) -> Result<(), LedgerError> {
        let op = Op::Sweep;
        self.inner.stats.call(op);
        self.plain(
            op,
            "announce sweep member",
            &self.inner.st.announce,
            (
                group,
                member.name.as_str(),
                member.expires_at.as_millis(),
                MEMBER_TTL_S,
            ),
        )
        .await?;
        Ok(())
    }
}
