//! The writer's evidence operations: an insert if absent on (source, event id) that hands back
//! the stored record when there is one, and the rewrite of a record once carried out. Records
//! past the retention are deleted by the next insert for their source.

use rusqlite::{OptionalExtension, params};

use sluice_core::evidence::{Disposition, EvidenceRecord};

use super::Writer;
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
