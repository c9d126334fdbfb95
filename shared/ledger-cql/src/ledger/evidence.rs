//! Evidence records on CQL (`sluice_ledger::EvidenceStore`): one partition per source; the
//! first write an LWT `IF NOT EXISTS` whose unknown outcome, or refusal, is settled by a
//! SERIAL read of the row (its `write_id` says whose write is stored); the rewrite once carried
//! out an LWT `IF EXISTS`; every write with the retention as TTL (docs/cql.md, "Evidence").

use uuid::Uuid;

use sluice_core::evidence::{Disposition, EvidenceRecord};
use sluice_ledger::{EVIDENCE_RETENTION_MS, LedgerError};

use super::{CqlLedger, Lwt};
use crate::codec::Fields;
use crate::stats::{Kind, Op};

fn ttl_s() -> i32 {
    i32::try_from(EVIDENCE_RETENTION_MS / 1_000).unwrap_or(i32::MAX)
}

fn decoded(source: &str, row: &Fields) -> Option<EvidenceRecord> {
    let record = row.text("record")?;
    match serde_json::from_str(record) {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::warn!(source, error = %e, "a stored evidence record cannot be read; skipped");
            None
        }
    }
}

impl CqlLedger {
    pub(super) async fn put_evidence(
        &self,
        record: &EvidenceRecord,
    ) -> Result<Option<EvidenceRecord>, LedgerError> {
        let op = Op::Evidence;
        self.inner.stats.call(op);
        let write_id = Uuid::new_v4();
        let text = serde_json::to_string(record).unwrap_or_default();
        let answer = self
            .lwt(
                op,
                "store evidence",
                &self.inner.st.put_evidence,
                (
                    record.source.as_str(),
                    record.event_id.as_str(),
                    record.received_at.as_millis(),
                    text,
                    write_id,
                    ttl_s(),
                ),
            )
            .await?;
        if matches!(answer, Lwt::Applied) {
            return Ok(None);
        }
        // Refused (stored before) or unknown (stored by this write, perhaps): the row says.
        let rows = self
            .paged(
                op,
                "read evidence",
                &self.inner.st.read_evidence_serial,
                (record.source.as_str(), record.event_id.as_str()),
                Kind::Serial,
            )
            .await?;
        match rows.first() {
            Some(row) if row.uuid("write_id") == Some(write_id) => Ok(None),
            Some(row) => Ok(decoded(&record.source, row)),
            None => Err(LedgerError::Storage {
                op: "evidence_put",
                source: format!(
                    "evidence {}/{}: the write's outcome is unknown and no row is stored",
                    record.source, record.event_id
                )
                .into(),
            }),
        }
    }

    pub(super) async fn settle_evidence(&self, record: &EvidenceRecord) -> Result<(), LedgerError> {
        let op = Op::Evidence;
        self.inner.stats.call(op);
        let text = serde_json::to_string(record).unwrap_or_default();
        // Not applied only when the row is gone (past its TTL): nothing to rewrite then.
        self.lwt(
            op,
            "settle evidence",
            &self.inner.st.settle_evidence,
            (
                ttl_s(),
                text,
                record.source.as_str(),
                record.event_id.as_str(),
            ),
        )
        .await?;
        // The index of what is held for a command: written while the record is kept
        // unapplied, removed once it is applied (plain writes: the record above is the truth,
        // the index only says where to look).
        if let Some(key) = record.idempotency_key.as_deref() {
            if record.disposition == Disposition::Recorded {
                self.plain(
                    op,
                    "hold evidence",
                    &self.inner.st.hold_evidence,
                    (
                        key,
                        record.source.as_str(),
                        record.event_id.as_str(),
                        record.received_at.as_millis(),
                        serde_json::to_string(record).unwrap_or_default(),
                        ttl_s(),
                    ),
                )
                .await?;
            } else {
                self.plain(
                    op,
                    "unhold evidence",
                    &self.inner.st.unhold_evidence,
                    (key, record.source.as_str(), record.event_id.as_str()),
                )
                .await?;
            }
        }
        Ok(())
    }

    pub(super) async fn read_evidence_held(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<EvidenceRecord>, LedgerError> {
        let op = Op::Evidence;
        self.inner.stats.call(op);
        let rows = self
            .paged(
                op,
                "read held evidence",
                &self.inner.st.read_evidence_held,
                (idempotency_key,),
                Kind::Plain,
            )
            .await?;
        let mut held: Vec<EvidenceRecord> = rows
            .iter()
            .filter_map(|r| decoded(idempotency_key, r))
            .filter(|r| r.disposition == Disposition::Recorded)
            .collect();
        held.sort_by_key(|r| r.received_at);
        Ok(held)
    }

    pub(super) async fn read_evidence_list(
        &self,
        source: &str,
        limit: usize,
    ) -> Result<Vec<EvidenceRecord>, LedgerError> {
        let op = Op::Evidence;
        self.inner.stats.call(op);
        let rows = self
            .paged(
                op,
                "list evidence",
                &self.inner.st.list_evidence,
                (source,),
                Kind::Plain,
            )
            .await?;
        let mut listed: Vec<EvidenceRecord> =
            rows.iter().filter_map(|r| decoded(source, r)).collect();
        listed.sort_by_key(|r| std::cmp::Reverse(r.received_at));
        listed.truncate(limit);
        Ok(listed)
    }
}

#[async_trait::async_trait]
impl sluice_ledger::EvidenceStore for CqlLedger {
    async fn evidence_put(
        &self,
        record: &EvidenceRecord,
    ) -> Result<Option<EvidenceRecord>, LedgerError> {
        self.put_evidence(record).await
    }

    async fn evidence_settle(&self, record: &EvidenceRecord) -> Result<(), LedgerError> {
        self.settle_evidence(record).await
    }

    async fn evidence_held(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<EvidenceRecord>, LedgerError> {
        self.read_evidence_held(idempotency_key).await
    }

    async fn evidence_list(
        &self,
        source: &str,
        limit: usize,
    ) -> Result<Vec<EvidenceRecord>, LedgerError> {
        self.read_evidence_list(source, limit).await
    }
}
