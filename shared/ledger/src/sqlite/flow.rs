//! The embedded ledger's flow controls (`crate::FlowStore`): every control read whole on a
//! pooled read connection, each write a compare-and-set on its version through the writer
//! (`writer/flow.rs`).

use async_trait::async_trait;

use sluice_core::flow::FlowControl;

use super::SqliteLedger;
use super::schema::map_err;
use super::writer::{Op, Reply};
use crate::{FlowCas, LedgerError};

#[async_trait]
impl crate::FlowStore for SqliteLedger {
    async fn flow_controls(&self) -> Result<Vec<FlowControl>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        self.read("flow_controls", move |conn| {
            let failed = |e| map_err(e, "flow_controls", &path, &config);
            let rows: Vec<(i64, String)> = conn
                .prepare_cached("SELECT version, body FROM flow_controls ORDER BY name")
                .and_then(|mut stmt| {
                    stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(failed)?;
            Ok(rows
                .into_iter()
                .filter_map(|(version, body)| {
                    let mut control: FlowControl = serde_json::from_str(&body).ok()?;
                    control.version = u64::try_from(version).unwrap_or(0);
                    Some(control)
                })
                .collect())
        })
        .await
    }

    async fn write_flow_control(
        &self,
        guard: u64,
        next: FlowControl,
    ) -> Result<FlowCas, LedgerError> {
        crate::flow::validate(&next)?;
        match self.submit(Op::FlowControl { guard, next }).await?.result? {
            Reply::Flow(cas) => Ok(cas),
            _ => Err(LedgerError::Closed),
        }
    }
}
