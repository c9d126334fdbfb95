//! What the reconciler's tests share: a pipeline context on a real SQLite file, the embedded
//! bus, the system clock and a real HTTP connector.

use std::path::Path;
use std::sync::Arc;

use sluice_bus::{Bus, EmbeddedBus, EmbeddedConfig};
use sluice_core::catalog::Catalog;
use sluice_core::command::Command;
use sluice_core::machine::{self, Event};
use sluice_core::time::{SystemClock, Timestamp};
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{Ledger, Transition};
use sluice_runtime::{Context, Metrics};

/// A context over a new ledger in `dir`, serving `catalog`.
pub fn context(dir: &Path, catalog: Catalog) -> Context {
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(SqliteConfig::in_dir(dir)).expect("ledger"));
    let bus: Arc<dyn Bus> =
        Arc::new(EmbeddedBus::new(EmbeddedConfig::default()).expect("embedded bus"));
    Context {
        ledger,
        bus,
        catalog: Arc::new(catalog),
        connector: Arc::new(sluice_connector::HttpConnector::new().expect("connector")),
        clock: Arc::new(SystemClock),
        metrics: Arc::new(Metrics::new()),
        flow: sluice_runtime::flow::Flow::new(),
        copies: None,
        local_events: Default::default(),
    }
}

/// Reserves `wanted` and leases it as a dispatcher would at `at`: the LEASED command.
pub async fn reserve_and_lease(
    ctx: &Context,
    wanted: Command,
    rules: &machine::Rules,
    at: Timestamp,
) -> Command {
    let audit = wanted.reservation_audit("test");
    let pending = ctx
        .ledger
        .reserve(wanted, audit)
        .await
        .expect("reserve")
        .into_command();
    let lease = machine::apply(
        &pending.state,
        rules,
        &Event::Lease {
            owner: "d-1".into(),
        },
        at,
    )
    .expect("leases");
    ctx.ledger
        .acquire_lease(Transition::from_step(&pending, &lease, "test"))
        .await
        .expect("lease")
        .applied()
        .cloned()
        .expect("uncontended")
}
