//! The audit records' own rows: inserting a record after the LWT that fixed it (with the
//! stale due entry's delete in the same batch) and settling an audited LWT whose outcome was
//! unknown (docs/cql.md, "Write protocol").

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

    /// Inserts the record an applied LWT fixed. A failure here loses nothing (the record is
    /// in `audit_pending` until the repair rule writes it), so it is logged, not returned.
    pub(super) async fn insert_own(&self, op: Op, run: &str, sealed: &SealedLink, write_id: Uuid) {
        let link = Link::sealed(sealed, write_id);
        sluice_faults::point!("ledger.audit_link.pre");
        let inserted = self.insert_link(op, run, &link).await;
        sluice_faults::point!("ledger.audit_link.post");
        if let Err(e) = inserted {
            tracing::warn!(run_id = run, seq = link.seq, error = %e,
                "audit record not inserted yet; the next writer or reader of the run repairs it");
        }
    }

    /// [`CqlLedger::insert_own`] after a transition that moved the command's due time off
    /// `stale_due` (the key and the old time): the old due entry is deleted in the same UNLOGGED
    /// BATCH as the record, so the sweep does not have to find it stale later (a read and a
    /// delete). Best effort: an entry filed in another bucket (due already when it was filed)
    /// or a batch that fails is left to the sweep, which checks every entry it finds.
    pub(super) async fn after_transition(
        &self,
        op: Op,
        run: &str,
        sealed: &SealedLink,
        write_id: Uuid,
        stale_due: Option<(&str, i64)>,
    ) {
        let size = sealed.canonical.len() + sealed.prev_hash.len() + sealed.hash.len();
        let Some((key, due_at)) = stale_due.filter(|_| size <= BATCH_RECORD_BYTES) else {
            return self.insert_own(op, run, sealed, write_id).await;
        };
        let link = Link::sealed(sealed, write_id);
        // Deletes what was written before now: a later filing of the same entry survives.
        let deleted_before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let st = &self.inner.st;
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(st.insert_audit.clone());
        batch.append_statement(st.delete_due.clone());
        batch.set_is_idempotent(true);
        let minute = minute_of(Timestamp::from_millis(due_at));
        let shard = shard_of(run, self.inner.config.due_shards);
        let values = (
            Self::link_values(run, &link),
            (deleted_before, minute, shard, due_at, run, key),
        );
        sluice_faults::point!("ledger.audit_link.pre");
        let trip = self.inner.stats.round_trip(op, Kind::Plain);
        let inserted = self.inner.session.batch(&batch, values).await;
        drop(trip);
        sluice_faults::point!("ledger.audit_link.post");
        match inserted {
            Ok(_) => self.mark_flushed(run, link.seq),
            Err(e) => tracing::warn!(run_id = run, seq = link.seq, error = %e,
                "audit record not inserted yet; the next writer or reader of the run repairs it"),
        }
    }

    /// Settles an audited LWT whose outcome was unknown: did the record at `seq` come from
    /// the LWT `write_id`?
    pub(super) async fn settle_audited(
        &self,
        op: Op,
        run: &str,
        write_id: Uuid,
        seq: i64,
    ) -> Result<bool, LedgerError> {
        let mut last_error = None;
        for attempt in 0..3 {
            match self.read_head(op, run, true).await {
                Ok(head) => {
                    let Some(stored) = head.stored_seq else {
                        return Ok(false);
                    };
                    if stored == seq + 1 {
                        return Ok(head.pending.and_then(|p| p.write_id) == Some(write_id));
                    }
                    if stored <= seq {
                        return Ok(false);
                    }
                    // The head moved on, so the record at `seq` is in `audit` (repair rule).
                    let rows = self
                        .plain(
                            op,
                            "read audit record",
                            &self.inner.st.read_audit_one,
                            (run, seq),
                        )
                        .await?;
                    return match rows.first() {
                        Some(row) => Ok(row.uuid("write_id") == Some(write_id)),
                        None => Err(storage_msg(
                            "settle unknown outcome",
                            format!("audit record {seq} of run {run} is missing"),
                        )),
                    };
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
