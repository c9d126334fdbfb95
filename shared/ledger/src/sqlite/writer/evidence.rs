//! The writer's evidence operations: an insert if absent on (source, event id) that hands back
//! the stored record when there is one, and the rewrite of a record once carried out. Records
//! past the retention are deleted by the next insert for their source. Also the reference
//! index: an insert if absent on (tool, reference) that hands back the command it holds, and
//! the removal of a purged run's entries.

use rusqlite::{OptionalExtension, params};

use sluice_core::evidence::{Disposition, EvidenceRecord};

use super::{ReferenceEntry, Reply, Writer};
use crate::evidence::EVIDENCE_RETENTION_MS;

fn text(record: &EvidenceRecord) -> String {
    serde_json::to_string(record).unwrap_or_default()
}

/// The command a record is held for: set while it is kept unapplied, so the index holds only
/// those.
fn held_for(record: &EvidenceRecord) -> Option<&str> {
    (record.disposition == Disposition::Recorded)
        .then_some(record.idempotency_key.as_deref())
        .flatten()
}

impl Writer {
    pub(super) fn evidence_put(
        &mut self,
        record: &EvidenceRecord,
    ) -> Result<Option<String>, rusqlite::Error> {
        let stored: Option<String> = self
            .conn
            .prepare_cached(
                "SELECT record FROM evidence_events WHERE source = ?1 AND event_id = ?2",
            )?
            .query_row(params![record.source, record.event_id], |row| row.get(0))
            .optional()?;
        if stored.is_some() {
            return Ok(stored);
        }
        self.conn
            .prepare_cached(
                "INSERT INTO evidence_events (source, event_id, received_at, record) \
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                record.source,
                record.event_id,
                record.received_at.as_millis(),
                text(record),
            ])?;
        self.conn
            .prepare_cached("DELETE FROM evidence_events WHERE source = ?1 AND received_at < ?2")?
            .execute(params![
                record.source,
                record.received_at.as_millis() - EVIDENCE_RETENTION_MS
            ])?;
        Ok(None)
    }

    pub(super) fn evidence_settle(
        &mut self,
        record: &EvidenceRecord,
    ) -> Result<(), rusqlite::Error> {
        self.conn
            .prepare_cached(
                "UPDATE evidence_events SET record = ?3, held_for = ?4 \
                 WHERE source = ?1 AND event_id = ?2",
            )?
            .execute(params![
                record.source,
                record.event_id,
                text(record),
                held_for(record),
            ])?;
        Ok(())
    }
}

impl Writer {
    /// Indexes the entry's reference to its command unless the reference is indexed; the
    /// run id and command key it is indexed to now (the first writer's).
    pub(super) fn reference_put(
        &mut self,
        entry: &ReferenceEntry,
    ) -> Result<Reply, rusqlite::Error> {
        let ReferenceEntry {
            tool,
            reference,
            run_id,
            command_key,
        } = entry;
        self.conn
            .prepare_cached(
                "INSERT INTO evidence_references (tool, reference, run_id, command_key) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (tool, reference) DO NOTHING",
            )?
            .execute(params![tool, reference, run_id, command_key])?;
        let (run, key) = self
            .conn
            .prepare_cached(
                "SELECT run_id, command_key FROM evidence_references \
                 WHERE tool = ?1 AND reference = ?2",
            )?
            .query_row(params![tool, reference], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?;
        Ok(Reply::Reference(run, key))
    }

    /// Removes the entries that name commands of `run_id`, which is being purged.
    pub(super) fn purge_references(&mut self, run_id: &str) -> Result<(), rusqlite::Error> {
        self.conn
            .prepare_cached("DELETE FROM evidence_references WHERE run_id = ?1")?
            .execute([run_id])?;
        Ok(())
    }
}
