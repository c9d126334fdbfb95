//! The embedded ledger's evidence records (`crate::EvidenceStore`): reads on a pooled read
//! connection, writes through the writer (`writer/evidence.rs`).

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use sluice_core::evidence::EvidenceRecord;
use sluice_core::ids::{CommandKey, IdempotencyKey, RunId, ToolName};

use super::SqliteLedger;
use super::schema::map_err;
use super::writer::{Op, ReferenceEntry, Reply};
use crate::{EvidenceStore, LedgerError};

pub(super) fn decoded(source: &str, record: &str) -> Option<EvidenceRecord> {
    match serde_json::from_str(record) {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::warn!(source, error = %e, "a stored evidence record cannot be read; skipped");
            None
        }
    }
}

#[async_trait]
impl EvidenceStore for SqliteLedger {
    async fn evidence_put(
        &self,
        record: &EvidenceRecord,
    ) -> Result<Option<EvidenceRecord>, LedgerError> {
        match self
            .submit(Op::EvidencePut(Box::new(record.clone())))
            .await?
            .result?
        {
            Reply::Evidence(stored) => Ok(stored.and_then(|text| decoded(&record.source, &text))),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn evidence_settle(&self, record: &EvidenceRecord) -> Result<(), LedgerError> {
        match self
            .submit(Op::EvidenceSettle(Box::new(record.clone())))
            .await?
            .result?
        {
            Reply::Evidence(_) => Ok(()),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn evidence_held(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<EvidenceRecord>, LedgerError> {
        const HELD: &str = "SELECT source, record FROM evidence_events \
             WHERE held_for = ?1 ORDER BY received_at";
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let key = idempotency_key.to_owned();
        self.read("evidence_held", move |conn| {
            let failed = |e| map_err(e, "evidence_held", &path, &config);
            let mut stmt = conn.prepare_cached(HELD).map_err(failed)?;
            let rows = stmt
                .query_map(params![key], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                })
                .map_err(failed)?
                .collect::<Result<Vec<(String, String)>, _>>()
                .map_err(failed)?;
            Ok(rows
                .iter()
                .filter_map(|(source, record)| decoded(source, record))
                .collect())
        })
        .await
    }

    async fn evidence_list(
        &self,
        source: &str,
        limit: usize,
    ) -> Result<Vec<EvidenceRecord>, LedgerError> {
        const LIST: &str = "SELECT record FROM evidence_events \
             WHERE source = ?1 ORDER BY received_at DESC LIMIT ?2";
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let source = source.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read("evidence_list", move |conn| {
            let failed = |e| map_err(e, "evidence_list", &path, &config);
            let mut stmt = conn.prepare_cached(LIST).map_err(failed)?;
            let records = stmt
                .query_map(params![source, limit], |row| row.get::<_, String>(0))
                .map_err(failed)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(failed)?;
            Ok(records
                .iter()
                .filter_map(|record| decoded(&source, record))
                .collect())
        })
        .await
    }

    async fn reference_put(
        &self,
        tool: &ToolName,
        reference: &str,
        key: &IdempotencyKey,
    ) -> Result<IdempotencyKey, LedgerError> {
        let op = Op::ReferencePut(ReferenceEntry {
            tool: tool.to_string(),
            reference: reference.to_owned(),
            run_id: key.run_id().to_string(),
            command_key: key.command_key().to_string(),
        });
        match self.submit(op).await?.result? {
            Reply::Reference(run_id, command_key) => indexed(&run_id, &command_key),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn reference_get(
        &self,
        tool: &ToolName,
        reference: &str,
    ) -> Result<Option<IdempotencyKey>, LedgerError> {
        const GET: &str = "SELECT run_id, command_key FROM evidence_references \
             WHERE tool = ?1 AND reference = ?2";
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let (tool, reference) = (tool.to_string(), reference.to_owned());
        self.read("reference_get", move |conn| {
            let failed = |e| map_err(e, "reference_get", &path, &config);
            let row: Option<(String, String)> = conn
                .prepare_cached(GET)
                .map_err(failed)?
                .query_row(params![tool, reference], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()
                .map_err(failed)?;
            row.map(|(run_id, command_key)| indexed(&run_id, &command_key))
                .transpose()
        })
        .await
    }
}

/// The key an index row names; a row that does not hold one is damage, said so.
fn indexed(run_id: &str, command_key: &str) -> Result<IdempotencyKey, LedgerError> {
    let bad = |why: String| LedgerError::Decode {
        what: "evidence reference",
        run_id: run_id.to_owned(),
        why,
    };
    Ok(IdempotencyKey::new(
        RunId::parse(run_id).map_err(|e| bad(e.to_string()))?,
        CommandKey::parse(command_key).map_err(|e| bad(e.to_string()))?,
    ))
}
