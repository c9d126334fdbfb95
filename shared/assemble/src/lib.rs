//! Builds a service [`Context`] from a [`Config`]: the ledger, the bus, the connector and the
//! catalog it names. The only crate that names a concrete ledger or bus: the services hold
//! `Arc<dyn Ledger>` and `Arc<dyn Bus>`.
//!
//! The distributed engines are features: `cql` (the ScyllaDB / Cassandra ledger) and `kafka`
//! (the Kafka bus, on librdkafka and a vendored OpenSSL built from source). A binary built
//! without one still parses and checks its settings, and refuses at start, naming the feature,
//! a configuration that asks for it.

use std::sync::Arc;

pub mod service;

use futures::future::BoxFuture;
use sluice_bus::{Bus, BusError, EmbeddedBus, EmbeddedConfig};
#[cfg(feature = "kafka")]
use sluice_bus_kafka::KafkaBus;
use sluice_connector::{
    CallbackSigner, Connector, ConnectorError, HttpConnector, McpConnector, Routed,
};
use sluice_core::catalog::{Catalog, CatalogError};
use sluice_core::time::{Clock, SystemClock};
use sluice_ledger::LedgerError;
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger_cql::CqlError;
#[cfg(feature = "cql")]
use sluice_ledger_cql::{CqlLedger, connect_session};
use thiserror::Error;

use sluice_runtime::config::{BusKind, CatalogConfig, Config, LedgerKind};
use sluice_runtime::gauges::GaugedLedger;
use sluice_runtime::{Context, Metrics};

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
    /// The configuration asks for an engine this binary was built without.
    #[error(transparent)]
    NotBuilt(#[from] NotBuilt),
    /// A secret the catalog's credentials reference cannot be read, or a key is malformed:
    /// refused at start rather than at the first call.
    /// A status check cannot fit the reconciler's sweep budgets.
    #[error("the catalog does not fit the reconciler's configuration: {}", problems.join("; "))]
    SweepBudget { problems: Vec<String> },
    #[error("the catalog's credentials cannot be used: {}", problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Credentials {
        problems: Vec<sluice_connector::credentials::CredentialError>,
    },
    /// A tool names `{callback_url}` and the configuration has no `[callbacks]` to sign it with.
    #[error(
        "{catalog}: tool {} names {{callback_url}} in its dispatch, but [callbacks] is not configured: set callbacks.secret (at least 32 bytes) and callbacks.public_url (the address upstreams reach the producer's API at), the same on every producer and dispatcher",
        tools.join(", tool ")
    )]
    CallbacksOff { catalog: String, tools: Vec<String> },
    #[error("[callbacks]: {0}")]
    Callbacks(String),
}

/// An engine the configuration names that this binary was built without.
#[derive(Debug, Error)]
#[error(
    "{key} = \"{kind}\" needs a sluice built with the `{feature}` feature: cargo build --release -p sluice --features distributed (this build has the embedded ledger and bus only)"
)]
pub struct NotBuilt {
    pub key: &'static str,
    pub kind: &'static str,
    pub feature: &'static str,
}

impl NotBuilt {
    const CQL: Self = Self {
        key: "ledger.kind",
        kind: "cql",
        feature: "cql",
    };
    const KAFKA: Self = Self {
        key: "bus.kind",
        kind: "kafka",
        feature: "kafka",
    };
}

/// Refuses, before anything starts, a configuration that names an engine this binary lacks.
pub fn check_built(config: &Config) -> Result<(), NotBuilt> {
    if config.ledger.kind == LedgerKind::Cql && !cfg!(feature = "cql") {
        return Err(NotBuilt::CQL);
    }
    if config.bus.kind == BusKind::Kafka && !cfg!(feature = "kafka") {
        return Err(NotBuilt::KAFKA);
    }
    Ok(())
}

/// Loads the configured catalog, or the example one.
pub fn load_catalog(config: &CatalogConfig) -> Result<Catalog, CatalogError> {
    match &config.path {
        Some(path) => Catalog::load(path),
        None => Catalog::from_toml_str(EXAMPLE_CATALOG, "deploy/catalog.toml (built in)"),
    }
}

/// What [`connect_tools`] gives: the catalog with its MCP servers' tools added, and the
/// connector that calls them.
pub type Connected = (Catalog, Arc<dyn Connector>);

/// The connector for `catalog`'s tools, and the catalog with the allowed tools of its MCP
/// servers added: each declared server is connected and its tools listed (bounded retries,
/// then an error naming the server and why), and the connections stay open for the calls.
/// Every secret the catalog references is checked first. `callbacks` signs the callback URLs
/// of the tools that name `{callback_url}`.
pub fn connect_tools(
    catalog: Catalog,
    callbacks: Option<CallbackSigner>,
) -> BoxFuture<'static, Result<Connected, AssembleError>> {
    Box::pin(connect_tools_body(catalog, callbacks))
}

async fn connect_tools_body(
    catalog: Catalog,
    callbacks: Option<CallbackSigner>,
) -> Result<(Catalog, Arc<dyn Connector>), AssembleError> {
    let mut http = HttpConnector::new()?;
    if let Some(signer) = callbacks {
        http = http.with_callbacks(signer);
    }
    http.secrets()
        .check(&catalog)
        .map_err(|problems| AssembleError::Credentials { problems })?;
    if catalog.mcp_servers().is_empty() {
        return Ok((catalog, Arc::new(http)));
    }
    let mcp = McpConnector::new(&catalog, http.shared_secrets());
    let catalog = sluice_connector::mcp::discover(catalog, &mcp).await?;
    Ok((catalog, Arc::new(Routed { http, mcp })))
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
pub fn open_ledger(
    config: &Config,
    clock: Arc<dyn Clock>,
) -> BoxFuture<'_, Result<Arc<dyn sluice_ledger::Ledger>, AssembleError>> {
    Box::pin(open_ledger_body(config, clock))
}

async fn open_ledger_body(
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
        #[cfg(feature = "cql")]
        LedgerKind::Cql => Ok(Arc::new(
            // Boxed: the driver's connect future is deep, and every caller's would inline it.
            Box::pin(CqlLedger::connect_with_clock(
                config.ledger.cql.clone(),
                clock,
            ))
            .await?,
        )),
        #[cfg(not(feature = "cql"))]
        LedgerKind::Cql => Err(NotBuilt::CQL.into()),
    }
}

/// Opens the configured bus: the in-process one, or Kafka (creating absent topics).
pub fn open_bus(config: &Config) -> BoxFuture<'_, Result<Arc<dyn Bus>, AssembleError>> {
    Box::pin(open_bus_body(config))
}

async fn open_bus_body(config: &Config) -> Result<Arc<dyn Bus>, AssembleError> {
    match config.bus.kind {
        BusKind::Embedded => Ok(Arc::new(EmbeddedBus::new(EmbeddedConfig {
            prefix: config.bus.topic_prefix.clone(),
            partitions: config.bus.partitions,
            admission: (config.bus.admission > 0).then_some(config.bus.admission),
            ..EmbeddedConfig::default()
        })?)),
        #[cfg(feature = "kafka")]
        BusKind::Kafka => Ok(Arc::new(
            Box::pin(KafkaBus::connect(config.bus.kafka_config())).await?,
        )),
        #[cfg(not(feature = "kafka"))]
        BusKind::Kafka => Err(NotBuilt::KAFKA.into()),
    }
}

/// Deletes the configured bus's topics and everything in them: Kafka's; the embedded bus keeps
/// nothing beyond its process. For tooling that made topics of its own (`sluice bench`); the
/// services never delete topics.
pub async fn delete_topics(config: &Config) -> Result<(), AssembleError> {
    match config.bus.kind {
        BusKind::Embedded => Ok(()),
        #[cfg(not(feature = "kafka"))]
        BusKind::Kafka => Err(NotBuilt::KAFKA.into()),
        #[cfg(feature = "kafka")]
        BusKind::Kafka => {
            let bus = Box::pin(KafkaBus::connect(config.bus.kafka_config())).await?;
            let deleted = bus.delete_topics().await;
            bus.close().await;
            Ok(deleted?)
        }
    }
}

/// Drops the configured CQL keyspace and everything in it; nothing for SQLite (its directory
/// is the caller's to remove). For tooling that made a keyspace of its own (`sluice bench`).
pub async fn drop_keyspace(config: &Config) -> Result<(), AssembleError> {
    match config.ledger.kind {
        LedgerKind::Sqlite => Ok(()),
        #[cfg(not(feature = "cql"))]
        LedgerKind::Cql => Err(NotBuilt::CQL.into()),
        #[cfg(feature = "cql")]
        LedgerKind::Cql => {
            let session = Box::pin(connect_session(&config.ledger.cql)).await?;
            Ok(sluice_ledger_cql::drop_keyspace(&session, &config.ledger.cql.keyspace).await?)
        }
    }
}

/// Everything a service needs, from configuration, with `catalog` already loaded.
pub fn assemble(
    config: &Config,
    catalog: Catalog,
) -> BoxFuture<'_, Result<Context, AssembleError>> {
    Box::pin(assemble_body(config, catalog))
}

async fn assemble_body(config: &Config, catalog: Catalog) -> Result<Context, AssembleError> {
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

/// Refuses a catalog with a tool that names `{callback_url}` when `[callbacks]` is not
/// configured (every one is named), and gives the signer of callback URLs when it is.
pub fn callback_signer(
    config: &Config,
    catalog: &Catalog,
    clock: &Arc<dyn Clock>,
) -> Result<Option<CallbackSigner>, AssembleError> {
    match (&config.callbacks.secret, config.callbacks.base()) {
        (Some(secret), Some(base)) => CallbackSigner::new(secret.clone(), base, Arc::clone(clock))
            .map(Some)
            .map_err(AssembleError::Callbacks),
        _ => {
            let tools: Vec<String> = catalog
                .tools()
                .iter()
                .filter(|tool| tool.uses_callback_url())
                .map(|tool| tool.name().to_string())
                .collect();
            if tools.is_empty() {
                Ok(None)
            } else {
                Err(AssembleError::CallbacksOff {
                    catalog: catalog.source_name().to_owned(),
                    tools,
                })
            }
        }
    }
}

/// [`assemble`] for one service in a process of its own: the whole process, its ledger handle
/// included, runs on the clock `SLUICE_FAULT_CLOCK_SKEW_MS` gives `service` in a fault run
/// (the system clock otherwise; see `sluice_faults::clock_for`).
pub fn assemble_service<'a>(
    config: &'a Config,
    catalog: Catalog,
    service: &'a str,
) -> BoxFuture<'a, Result<Context, AssembleError>> {
    Box::pin(assemble_service_body(config, catalog, service))
}

async fn assemble_service_body(
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
    check_built(config)?;
    let callbacks = callback_signer(config, &catalog, &clock)?;
    let (catalog, connector) = connect_tools(catalog, callbacks).await?;
    if !catalog.mcp_servers().is_empty() {
        // The servers' lookups are known only now.
        check_sweep_budgets(config, &catalog)?;
    }
    let ledger = open_ledger(config, Arc::clone(&clock)).await?;
    let metrics = Metrics::new();
    metrics.observe_ledger(Arc::clone(&ledger));
    metrics.observe_catalog(&catalog);
    // The same figures count each tenant's effects in flight for its quota (`[tenants]`, read
    // by the producer's admission): kept wherever quotas are configured, exported or not.
    let quotas = config.tenants.has_quotas();
    let ledger = if config.metrics.command_gauges || quotas {
        let counted = GaugedLedger::wrap(ledger, metrics.commands.clone());
        if config.metrics.command_gauges {
            metrics.observe_commands(Arc::clone(&clock));
        }
        metrics.observe_tenants();
        tokio::spawn(metrics.commands.clone().keep_seeded(
            Arc::downgrade(&counted),
            config.command_gauges_refresh(),
            Arc::clone(&clock),
        ));
        counted
    } else {
        ledger
    };
    Ok(Context {
        ledger,
        bus: open_bus(config).await?,
        catalog: Arc::new(catalog),
        connector,
        clock,
        metrics: Arc::new(metrics),
        flow: sluice_runtime::flow::Flow::new(),
        // On Kafka only: in one process the producer's writes are the dispatcher's own
        // ledger hints already (`CommandStore::cached`).
        copies: (config.bus.kind == BusKind::Kafka)
            .then(|| sluice_runtime::copies::Copies::new(&config.bus.copy_keys))
            .flatten()
            .map(Arc::new),
        local_events: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distributed() -> Config {
        let mut config = Config::default();
        config.ledger.kind = LedgerKind::Cql;
        config.bus.kind = BusKind::Kafka;
        config
    }

    /// The embedded default needs no engine feature.
    #[test]
    fn the_embedded_default_is_always_built() {
        assert!(check_built(&Config::default()).is_ok());
    }

    /// A build without the engines refuses a configuration naming them, before anything
    /// starts, with the key, the feature and the command that builds it. (Run by `cargo test -p
    /// sluice-assemble`; the workspace's test build has every engine.)
    #[cfg(not(feature = "cql"))]
    #[test]
    fn a_build_without_cql_names_the_feature() {
        let refused = check_built(&distributed()).expect_err("no CQL in this build");
        let said = refused.to_string();
        assert!(said.contains("ledger.kind = \"cql\""), "{said}");
        assert!(said.contains("--features distributed"), "{said}");
    }

    #[cfg(all(feature = "cql", not(feature = "kafka")))]
    #[test]
    fn a_build_without_kafka_names_the_feature() {
        let refused = check_built(&distributed()).expect_err("no Kafka in this build");
        assert!(refused.to_string().contains("bus.kind = \"kafka\""));
    }

    /// A catalog whose tool names `{callback_url}` needs `[callbacks]`; with it, a signer.
    #[test]
    fn a_tool_naming_its_callback_url_needs_callbacks_configured() {
        let text = r#"
            [[tool]]
            name = "payouts/send"
            semantics = "IDEMPOTENT"
            schema = { type = "object" }
            [tool.dispatch]
            url = "http://psp/payouts"
            body = { notify = "{callback_url}" }
            [tool.async]
            accepted_status = [202]
            deadline_ms = 60000
            then = "escalate"
            outcome_pointer = "/status"
            present = ["succeeded"]
        "#;
        let catalog = Catalog::from_toml_str(text, "psp.toml").expect("valid");
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let refused = callback_signer(&Config::default(), &catalog, &clock)
            .expect_err("no [callbacks]")
            .to_string();
        assert!(
            refused.contains("psp.toml")
                && refused.contains("payouts/send")
                && refused.contains("[callbacks]")
                && refused.contains("callbacks.public_url"),
            "{refused}"
        );
        let mut config = Config::default();
        config.callbacks.secret = Some("k".repeat(32).into());
        config.callbacks.public_url = Some("https://sluice.example.com".into());
        assert!(
            callback_signer(&config, &catalog, &clock)
                .expect("configured")
                .is_some()
        );
        // A catalog that names it nowhere needs nothing.
        let plain = Catalog::from_toml_str(EXAMPLE_CATALOG, "deploy/catalog.toml").expect("valid");
        assert!(
            callback_signer(&Config::default(), &plain, &clock)
                .expect("nothing to sign")
                .is_none()
        );
    }

    #[cfg(all(feature = "cql", feature = "kafka"))]
    #[test]
    fn a_distributed_build_takes_both_engines() {
        assert!(check_built(&distributed()).is_ok());
    }
}
