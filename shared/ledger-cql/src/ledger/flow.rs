//! Flow controls on CQL: one partition holding every control, each row written only by LWTs on
//! its version (`IF NOT EXISTS` for a name never written), an unknown outcome settled by a
//! SERIAL read of the LWT's `write_id` (docs/cql.md, "Flow controls").

use uuid::Uuid;

use sluice_core::flow::FlowControl;
use sluice_ledger::{FlowCas, LedgerError};

use super::{CqlLedger, Lwt};
use crate::codec::Fields;
use crate::stats::{Kind, Op};

/// The one partition of `flow_controls`.
const SCOPE: &str = "flow";

fn control_of(row: &Fields) -> Option<FlowControl> {
    let mut control: FlowControl = serde_json::from_str(row.text("body")?).ok()?;
    control.name = row.text("name")?.to_owned();
    control.version = u64::try_from(row.bigint("version")?).ok()?;
    Some(control)
}

impl CqlLedger {
    /// [`sluice_ledger::FlowStore::flow_controls`]: one read of the partition.
    pub(super) async fn read_flow_controls(&self) -> Result<Vec<FlowControl>, LedgerError> {
        let op = Op::Flow;
        self.inner.stats.call(op);
        let rows = self
            .paged(
                op,
                "read flow controls",
                &self.inner.st.read_flow,
                (SCOPE,),
                Kind::Plain,
            )
            .await?;
        Ok(rows.iter().filter_map(control_of).collect())
    }

    /// [`sluice_ledger::FlowStore::write_flow_control`].
    pub(super) async fn put_flow_control(
        &self,
        guard: u64,
        next: FlowControl,
    ) -> Result<FlowCas, LedgerError> {
        sluice_ledger::flow::validate(&next)?;
        let op = Op::Flow;
        self.inner.stats.call(op);
        let as_bigint = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut written = next;
        written.version = guard + 1;
        let body = serde_json::to_string(&written).unwrap_or_default();
        let write_id = Uuid::new_v4();
        let name = written.name.as_str();
        let version = as_bigint(written.version);
        let answer = if guard == 0 {
            self.lwt(
                op,
                "create flow control",
                &self.inner.st.create_flow,
                (SCOPE, name, version, body.as_str(), write_id),
            )
            .await?
        } else {
            self.lwt(
                op,
                "write flow control",
                &self.inner.st.write_flow,
                (
                    version,
                    body.as_str(),
                    write_id,
                    SCOPE,
                    name,
                    as_bigint(guard),
                ),
            )
            .await?
        };
        match answer {
            Lwt::Applied => Ok(FlowCas::Applied(written)),
            Lwt::NotApplied(_) | Lwt::Unknown => {
                let rows = self
                    .paged(
                        op,
                        "read flow control",
                        &self.inner.st.read_flow_serial,
                        (SCOPE, name),
                        Kind::Serial,
                    )
                    .await?;
                let stored = rows
                    .first()
                    .and_then(|row| Some((control_of(row)?, row.uuid("write_id"))));
                Ok(match stored {
                    Some((control, Some(id))) if id == write_id => FlowCas::Applied(control),
                    other => FlowCas::Conflict(other.map(|(control, _)| control)),
                })
            }
        }
    }
}
