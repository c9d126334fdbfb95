//! Builds a service [`Context`] from a [`Config`]: the ledger, the bus, the connector and the
//! catalog it names.

use std::sync::Arc;

use sluice_bus::{Bus, BusError, EmbeddedBus, EmbeddedConfig};
use sluice_bus_kafka::KafkaBus;
use sluice_connector::{ConnectorError, HttpConnector};
use sluice_core::catalog::{Catalog, CatalogError};
use sluice_core::time::{Clock, SystemClock};
use sluice_ledger::LedgerError;
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger_cql::{CqlError, CqlLedger, connect_session};
use thiserror::Error;

use crate::config::{BusKind, CatalogConfig, Config, LedgerKind};
use crate::gauges::GaugedLedger;
use crate::{Context, Metrics};

/// The example catalog shipped in `deploy/catalog.toml`, used when no catalog is configured.
pub const EXAMPLE_CATALOG: &str = include_str!("../../../deploy/catalog.toml");

#[derive(Debug, Error)]
pub enum AssembleError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Cql(#[from] CqlError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    #[error(transparent)]
    Faults(#[from] sluice_faults::FaultsError),
    /// A secret the catalog's credentials reference cannot be read, or a key is malformed:
    /// refused at start rather than at the first call.
    /// A status check cannot fit the reconciler's sweep budgets.
    #[error("the catalog does not fit the reconciler's configuration: {}", problems.join("; "))]
    SweepBudget { problems: Vec<String> },
    #[error("the catalog's credentials cannot be used: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Credentials {
        problems: Vec<sluice_connector::credentials::CredentialError>,
    },
}

/// Loads the configured catalog, or the example one.
pub fn load_catalog(config: &CatalogConfig) -> Result<Catalog, CatalogError> {
    match &config.path {
        Some(path) => Catalog::load(path),
        None => Catalog::from_toml_str(EXAMPLE_CATALOG, "deploy/catalog.toml (built in)"),
    }
}

/// Where the example catalog expects its upstream (the demo upstream's default address).
pub const EXAMPLE_UPSTREAM: &str = "http://127.0.0.1:8787";

/// The example catalog with its upstream at `base_url` (e.g. `http://127.0.0.1:41234`), for
/// the demo and tests that start the demo upstream on a free port.
pub fn example_catalog_at(base_url: &str) -> Result<Catalog, CatalogError> {
    let text = EXAMPLE_CATALOG.replace(EXAMPLE_UPSTREAM, base_url.trim_end_matches('/'));
    Catalog::from_toml_str(&text, "deploy/catalog.toml (built in)")
}

/// Opens the configured ledger: the SQLite file, or a session to the CQL cluster (applying
/// the schema first when `ledger.cql.migrate_on_start` is set).
pub async fn open_ledger(
    config: &Config,
    clock: Arc<dyn Clock>,
) -> Result<Arc<dyn sluice_ledger::Ledger>, AssembleError> {
    match config.ledger.kind {
        LedgerKind::Sqlite => {
            let sqlite = SqliteConfig {
                durability: config.ledger.durability,
                busy_timeout_ms: config.ledger.busy_timeout_ms,
                commit_gather_us: config.ledger.commit_gather_us,
                writer_nice: Some(config.ledger.writer_nice),
                ..SqliteConfig::in_dir(&config.ledger.data_dir)
            };
            Ok(Arc::new(SqliteLedger::open_with_clock(sqlite, clock)?))
        }
        LedgerKind::Cql => Ok(Arc::new(
            // Boxed: the driver's connect future is deep, and every caller's would inline it.
            Box::pin(CqlLedger::connect_with_clock(
                config.ledger.cql.clone(),
                clock,
            ))
            .await?,
        )),
    }
}

/// Opens the configured bus: the in-process one, or Kafka (creating absent topics).
pub async fn open_bus(config: &Config) -> Result<Arc<dyn Bus>, BusError> {
    match config.bus.kind {
        BusKind::Embedded => Ok(Arc::new(EmbeddedBus::new(EmbeddedConfig {
            prefix: config.bus.topic_prefix.clone(),
            partitions: config.bus.partitions,
            admission: (config.bus.admission > 0).then_some(config.bus.admission),
            ..EmbeddedConfig::default()
        })?)),
        BusKind::Kafka => Ok(Arc::new(
            Box::pin(KafkaBus::connect(config.bus.kafka_config())).await?,
        )),
    }
}

/// Deletes the configured bus's topics and everything in them: Kafka's; the embedded bus keeps
/// nothing beyond its process. For tooling that made topics of its own (`sluice bench`); the
/// services never delete topics.
pub async fn delete_topics(config: &Config) -> Result<(), BusError> {
    match config.bus.kind {
        BusKind::Embedded => Ok(()),
        BusKind::Kafka => {
            let bus = Box::pin(KafkaBus::connect(config.bus.kafka_config())).await?;
            let deleted = bus.delete_topics().await;
            bus.close().await;
            deleted
        }
    }
}

/// Drops the configured CQL keyspace and everything in it; nothing for SQLite (its directory
/// is the caller's to remove). For tooling that made a keyspace of its own (`sluice bench`).
pub async fn drop_keyspace(config: &Config) -> Result<(), CqlError> {
    match config.ledger.kind {
        LedgerKind::Sqlite => Ok(()),
        LedgerKind::Cql => {
            let session = Box::pin(connect_session(&config.ledger.cql)).await?;
            sluice_ledger_cql::drop_keyspace(&session, &config.ledger.cql.keyspace).await
        }
    }
}

/// Everything a service needs, from configuration, with `catalog` already loaded.
pub async fn assemble(config: &Config, catalog: Catalog) -> Result<Context, AssembleError> {
    check_sweep_budgets(config, &catalog)?;
    assemble_with_clock(config, catalog, Arc::new(SystemClock)).await
}

/// Refuses a catalog whose status checks cannot fit the reconciler's sweep budgets
/// (`sluice_core::sweep::looks_that_do_not_fit`): checked where a reconciler runs.
pub fn check_sweep_budgets(config: &Config, catalog: &Catalog) -> Result<(), AssembleError> {
    let problems =
        sluice_core::sweep::looks_that_do_not_fit(catalog, config.reconciler.sweep_item_timeout_ms);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(AssembleError::SweepBudget { problems })
    }
}

/// [`assemble`] for one service in a process of its own: the whole process, its ledger handle
/// included, runs on the clock `SLUICE_FAULT_CLOCK_SKEW_MS` gives `service` in a fault run
/// (the system clock otherwise; see `sluice_faults::clock_for`).
pub async fn assemble_service(
    config: &Config,
    catalog: Catalog,
    service: &str,
) -> Result<Context, AssembleError> {
    if service == "reconciler" {
        check_sweep_budgets(config, &catalog)?;
    }
    let clock = sluice_faults::clock_for(service)?;
    assemble_with_clock(config, catalog, clock).await
}

/// [`assemble`] on `clock`, which the ledger and the services read "now" from.
pub async fn assemble_with_clock(
    config: &Config,
    catalog: Catalog,
    clock: Arc<dyn Clock>,
) -> Result<Context, AssembleError> {
    let ledger = open_ledger(config, Arc::clone(&clock)).await?;
    let metrics = Metrics::new();
    metrics.observe_ledger(Arc::clone(&ledger));
    metrics.observe_catalog(&catalog);
    let ledger = if config.metrics.command_gauges {
        let counted = GaugedLedger::wrap(ledger, metrics.commands.clone());
        metrics.observe_commands(Arc::clone(&clock));
        tokio::spawn(metrics.commands.clone().keep_seeded(
            Arc::downgrade(&counted),
            config.command_gauges_refresh(),
            Arc::clone(&clock),
        ));
        counted
    } else {
        ledger
    };
    let connector = HttpConnector::new()?;
    connector
        .secrets()
        .check(&catalog)
        .map_err(|problems| AssembleError::Credentials { problems })?;
    Ok(Context {
        ledger,
        bus: open_bus(config).await?,
        catalog: Arc::new(catalog),
        connector: Arc::new(connector),
        clock,
        metrics: Arc::new(metrics),
    })
}
