//! The writer's flow-control operation: a control's compare-and-set on its version, in the
//! batch's write transaction like every other write.

use rusqlite::{OptionalExtension, params};
use sluice_core::flow::FlowControl;

use super::Writer;
use crate::FlowCas;

impl Writer {
    pub(super) fn write_flow_control(
        &mut self,
        guard: u64,
        next: &FlowControl,
    ) -> Result<FlowCas, rusqlite::Error> {
        let stored: Option<(i64, String)> = self
            .conn
            .prepare_cached("SELECT version, body FROM flow_controls WHERE name = ?1")?
            .query_row(params![next.name], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        let stored = stored.and_then(|(version, body)| {
            let mut control: FlowControl = serde_json::from_str(&body).ok()?;
            control.version = u64::try_from(version).unwrap_or(0);
            Some(control)
        });
        if stored.as_ref().map_or(0, |control| control.version) != guard {
            return Ok(FlowCas::Conflict(stored));
        }
        let mut written = next.clone();
        written.version = guard + 1;
        let body = serde_json::to_string(&written).unwrap_or_default();
        self.conn
            .prepare_cached(
                "INSERT INTO flow_controls (name, version, body) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (name) DO UPDATE SET version = excluded.version, body = excluded.body",
            )?
            .execute(params![
                written.name,
                i64::try_from(written.version).unwrap_or(i64::MAX),
                body
            ])?;
        Ok(FlowCas::Applied(written))
    }
}
