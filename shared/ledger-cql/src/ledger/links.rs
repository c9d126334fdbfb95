//! The audit records' own rows: each written in its run's partition by the LWT that fixed it
//! (`trips::lwt_linked`), read back, and what settles an audited LWT whose outcome was unknown;
//! records of builds before schema 007 in `audit`, inserted after their LWT; and the stale due
//! entry a transition leaves (docs/cql.md, "Write protocol").

use super::*;

impl CqlLedger {
    /// The values of `insert_audit` for a record.
    pub(super) fn link_values<'l>(
        run: &'l str,
        link: &'l Link,
    ) -> (&'l str, i64, &'l str, &'l str, &'l str, Option<Uuid>) {
        (
            run,
            link.seq,
            link.record.as_str(),
            link.prev_hash.as_str(),
            link.hash.as_str(),
            link.write_id,
        )
    }

    pub(super) async fn insert_link(
        &self,
        op: Op,
        run: &str,
        link: &Link,
    ) -> Result<(), LedgerError> {
        self.plain(
            op,
            "insert audit record",
            &self.inner.st.insert_audit,
            Self::link_values(run, link),
        )
        .await?;
        self.mark_flushed(run, link.seq);
        Ok(())
    }

    /// Deletes the due entry a transition moved its command off (`at`, under `key`), so the
    /// sweep does not have to find it stale later (a read and a delete). Best effort: an entry
    /// filed in another bucket (due already when it was filed) or a delete that fails is left
    /// to the sweep, which checks every entry it finds.
    pub(super) async fn delete_stale_due(&self, op: Op, run: &str, key: &str, at: i64) {
        // Deletes what was written before now: a later filing of the same entry survives.
        let deleted_before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let minute = minute_of(Timestamp::from_millis(at));
        let shard = shard_of(run, self.inner.config.due_shards);
        let values = (deleted_before, minute, shard, at, run, key);
        if let Err(e) = self
            .plain(
                op,
                "delete stale due entry",
                &self.inner.st.delete_due,
                values,
            )
            .await
        {
            tracing::debug!(run_id = run, command_key = key, error = %e,
                "stale due entry not deleted; the sweep drops it");
        }
    }

    /// A run's audit records from `floor` on, as their rows in its partition hold them.
    pub(super) async fn read_links(
        &self,
        op: Op,
        run: &str,
        floor: i64,
    ) -> Result<Vec<Link>, LedgerError> {
        let rows = self
            .paged(
                op,
                "read audit records",
                &self.inner.st.read_links,
                (run, link_key(floor)),
                Kind::Plain,
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                Some(Link {
                    seq: link_seq(row.text("command_key")?)?,
                    record: row.text("link_record")?.to_owned(),
                    prev_hash: row.text("link_prev")?.to_owned(),
                    hash: row.text("link_hash")?.to_owned(),
                    write_id: row.uuid("write_id"),
                })
            })
            .collect())
    }

    /// Settles an audited LWT whose outcome was unknown: did the record at `seq` come from
    /// the LWT `write_id`? The record's row is written by that LWT and nothing else, so a
    /// SERIAL read of it (which completes any round still in flight) decides.
    pub(super) async fn settle_audited(
        &self,
        op: Op,
        run: &str,
        write_id: Uuid,
        seq: i64,
    ) -> Result<bool, LedgerError> {
        let key = link_key(seq);
        let mut last_error = None;
        for attempt in 0..3 {
            match self
                .paged(
                    op,
                    "settle unknown outcome",
                    &self.inner.st.read_link_serial,
                    (run, key.as_str()),
                    Kind::Serial,
                )
                .await
            {
                Ok(rows) => {
                    return Ok(rows.first().and_then(|row| row.uuid("write_id")) == Some(write_id));
                }
                Err(e) => {
                    last_error = Some(e);
                    back_off(attempt + 3).await;
                }
            }
        }
        Err(storage_msg(
            "settle unknown outcome",
            format!(
                "an LWT on run {run} timed out and the SERIAL read that settles it failed too ({}); its outcome is unknown, read the command before acting",
                last_error.map(|e| e.to_string()).unwrap_or_default()
            ),
        ))
    }
}

#[async_trait::async_trait]
impl sluice_ledger::LinkStore for CqlLedger {
    async fn link_consume(
        &self,
        link_id: &str,
        run_id: &RunId,
        command_key: &CommandKey,
        at: Timestamp,
    ) -> Result<bool, LedgerError> {
        self.put_link_use(link_id, run_id.as_str(), command_key.as_str(), at)
            .await
    }
}
