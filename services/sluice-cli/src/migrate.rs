//! `sluice migrate`: prepares the configured ledger and bus before any service starts, for
//! deployments where the services themselves may not run DDL (`ledger.cql.migrate_on_start =
//! false`) or create topics.

use std::sync::Arc;

use futures::future::BoxFuture;
use sluice_assemble::{AssembleError, open_bus, open_ledger};
use sluice_bus::Topic;
use sluice_core::time::SystemClock;
use sluice_ledger_cql::{SCHEMA_VERSION, record_statements, schema_statements};
use sluice_runtime::Config;
use sluice_runtime::config::{BusKind, CreateTopics, LedgerKind};

/// What `migrate` did, one line per part.
pub fn run(config: Config) -> BoxFuture<'static, Result<Vec<String>, AssembleError>> {
    Box::pin(run_body(config))
}

async fn run_body(mut config: Config) -> Result<Vec<String>, AssembleError> {
    let mut done = Vec::new();
    match config.ledger.kind {
        LedgerKind::Sqlite => {
            open_ledger(&config, Arc::new(SystemClock)).await?;
            done.push(format!(
                "ledger: SQLite schema ready in {}",
                config.ledger.data_dir.display()
            ));
        }
        LedgerKind::Cql => {
            config.ledger.cql.migrate_on_start = true;
            open_ledger(&config, Arc::new(SystemClock)).await?;
            done.push(format!(
                "ledger: keyspace {} at schema version {SCHEMA_VERSION} on {} (every statement prepared)",
                config.ledger.cql.keyspace,
                config.ledger.cql.nodes.join(",")
            ));
        }
    }
    match config.bus.kind {
        BusKind::Embedded => done.push("bus: embedded, nothing to create".into()),
        BusKind::Kafka => {
            // The one place that creates topics whatever the services are told: `never` is
            // for the services, and `always` stays as it is (it creates the missing ones too).
            if config.bus.kafka.create_topics == CreateTopics::Never {
                config.bus.kafka.create_topics = CreateTopics::IfMissing;
            }
            let bus = open_bus(&config).await?;
            let partitions = bus.partitions(Topic::Requested).await?;
            done.push(format!(
                "bus: topics {}* ready on {} ({partitions} partitions each)",
                config.bus.topic_prefix, config.bus.kafka.brokers,
            ));
        }
    }
    Ok(done)
}

/// The CQL statements `migrate` applies, for a DBA who applies them by hand, then those that
/// record them as applied (the services check the record at start).
pub fn cql_statements(config: &Config) -> Vec<String> {
    let cql = &config.ledger.cql;
    let mut statements = schema_statements(&cql.keyspace, &cql.replication, cql.tablets);
    let now = sluice_core::time::Clock::now(&SystemClock).as_millis();
    statements.extend(record_statements(&cql.keyspace, now));
    statements
}
