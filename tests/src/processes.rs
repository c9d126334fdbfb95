//! What the tests that run the services as processes of their own share: a free loopback port,
//! and the configuration of services on CQL and Kafka (`tests/tests/distributed.rs` on the
//! single-node engines, `tests/tests/cluster.rs` on the 3-node clusters).

use std::path::{Path, PathBuf};

use sluice_ledger_cql::CqlConfig;
use sluice_runtime::Config;
use sluice_runtime::config::{BusKind, LedgerKind};

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Names a configuration's keyspace and topics: `{keyspace}_{secs}_{unique}` (the CQL suites
/// drop keyspaces of their prefixes older than ten minutes) and `{topics}-{unique}.`.
#[derive(Debug)]
pub struct Names<'a> {
    pub keyspace: &'a str,
    pub topics: &'a str,
}

/// The services on the CQL `nodes` and the Kafka `brokers`, with `catalog`: the schema applied
/// by `sluice migrate` beforehand (as in production, where services may not run DDL), 8
/// partitions, a killed member's partitions freed after 6 s (the broker's floor), sweeps every
/// 200 ms, the API open on a free loopback port (by choice, on loopback only). `adjust` changes
/// the rest; the result is validated and written to `dir/sluice.toml`.
pub fn services_config(
    dir: &Path,
    catalog: PathBuf,
    nodes: Vec<String>,
    brokers: &str,
    names: &Names<'_>,
    adjust: impl FnOnce(&mut Config),
) -> (PathBuf, Config) {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut config = Config::default();
    config.catalog.path = Some(catalog);
    config.ledger.kind = LedgerKind::Cql;
    config.ledger.cql = CqlConfig {
        nodes,
        keyspace: format!("{}_{secs}_{}", names.keyspace, &unique[..10]),
        migrate_on_start: false,
        ..CqlConfig::default()
    };
    config.bus.kind = BusKind::Kafka;
    config.bus.topic_prefix = format!("{}-{}.", names.topics, &unique[..8]);
    config.bus.partitions = 8;
    config.bus.kafka.brokers = brokers.to_owned();
    config
        .bus
        .kafka
        .extra
        .insert("session.timeout.ms".into(), "6000".into());
    config.producer.listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    config.producer.open = true;
    config.reconciler.sweep_interval_ms = 200;
    adjust(&mut config);
    config
        .validate()
        .expect("the services' configuration is valid");
    let path = dir.join("sluice.toml");
    std::fs::write(
        &path,
        toml::to_string(&config).expect("the configuration serialises"),
    )
    .expect("write the configuration");
    (path, config)
}

/// Gives every service reading the configuration at `path` one copy key (`[[bus.copy_keys]]`),
/// as a deployment should: the dispatcher then acts on the signed copy of each command in its
/// requests instead of reading it. A written configuration holds no secret, so the key is a
/// file in `dir` the services read.
pub fn add_copy_key(dir: &Path, path: &Path) {
    let key = dir.join("copy.key");
    std::fs::write(&key, uuid::Uuid::new_v4().simple().to_string().repeat(2)).expect("a key");
    let mut text = std::fs::read_to_string(path).expect("the configuration");
    text.push_str(&format!(
        "\n[[bus.copy_keys]]\nid = \"test\"\nsecret = {{ file = {:?} }}\n",
        key.display().to_string()
    ));
    std::fs::write(path, text).expect("the configuration with its copy key");
}
