//! Evidence records on CQL (`sluice_ledger::EvidenceStore`): one partition per source; the
//! first write an LWT `IF NOT EXISTS` whose unknown outcome, or refusal, is settled by a
//! SERIAL read of the row (its `write_id` says whose write is stored); the rewrite once carried
//! out an LWT `IF EXISTS`; every write with the retention as TTL (docs/cql.md, "Evidence").
//!
//! The reference index: one partition per (tool, reference), written by an LWT `IF NOT
//! EXISTS` whose refusal carries the holder's key, and whose unknown outcome is settled by a
//! SERIAL read (whoever's key is stored is the answer); read by a plain read.

use uuid::Uuid;

use sluice_core::evidence::{Disposition, EvidenceRecord};
use sluice_core::ids::{IdempotencyKey, ToolName};
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

/// The key an index row holds; a row without one is damage, said so.
fn indexed(tool: &ToolName, reference: &str, row: &Fields) -> Result<IdempotencyKey, LedgerError> {
    let text = row.text("idempotency_key").unwrap_or_default();
    IdempotencyKey::parse(text).map_err(|e| LedgerError::Storage {
        op: "reference",
        source: format!(
            "the reference index's entry for {reference:?} of tool {tool} holds no idempotency key ({e})"
        )
        .into(),
    })
}

impl CqlLedger {
    pub(super) async fn put_reference(
        &self,
        tool: &ToolName,
        reference: &str,
        key: &IdempotencyKey,
    ) -> Result<IdempotencyKey, LedgerError> {
        let op = Op::Reference;
        self.inner.stats.call(op);
        let tool_text = tool.to_string();
        let answer = self
            .lwt(
                op,
                "index reference",
                &self.inner.st.put_reference,
                (
                    tool_text.as_str(),
                    reference,
                    key.to_string(),
                    self.inner.config.business_key_ttl(),
                ),
            )
            .await?;
        match answer {
            Lwt::Applied => Ok(key.clone()),
            // The row as stored: the holder's key.
            Lwt::NotApplied(row) => indexed(tool, reference, &row),
            Lwt::Unknown => {
                let rows = self
                    .paged(
                        op,
                        "read reference",
                        &self.inner.st.read_reference_serial,
                        (tool_text.as_str(), reference),
                        Kind::Serial,
                    )
                    .await?;
                match rows.first() {
                    Some(row) => indexed(tool, reference, row),
                    None => Err(LedgerError::Storage {
                        op: "reference_put",
                        source: format!(
                            "reference {reference:?} of tool {tool}: the write's outcome is unknown and no row is stored"
                        )
                        .into(),
                    }),
                }
            }
        }
    }

    pub(super) async fn get_reference(
        &self,
        tool: &ToolName,
        reference: &str,
    ) -> Result<Option<IdempotencyKey>, LedgerError> {
        let op = Op::Reference;
        self.inner.stats.call(op);
        let tool_text = tool.to_string();
        let rows = self
            .plain(
                op,
                "read reference",
                &self.inner.st.read_reference,
                (tool_text.as_str(), reference),
            )
            .await?;
        rows.first()
            .map(|row| indexed(tool, reference, row))
            .transpose()
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

    async fn reference_put(
        &self,
        tool: &ToolName,
        reference: &str,
        key: &IdempotencyKey,
    ) -> Result<IdempotencyKey, LedgerError> {
        self.put_reference(tool, reference, key).await
    }

    async fn reference_get(
        &self,
        tool: &ToolName,
        reference: &str,
    ) -> Result<Option<IdempotencyKey>, LedgerError> {
        self.get_reference(tool, reference).await
    }
}
