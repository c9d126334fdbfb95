//! One configuration for every service, layered: defaults → TOML file → `SLUICE_` environment
//! (`__` between nesting levels, e.g. `SLUICE_PRODUCER__LISTEN=0.0.0.0:8700`) → flags, then
//! validated once. Every error names the key that is wrong.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
pub use sluice_bus_kafka::{
    CreateTopics, KafkaOauth, KafkaSasl, KafkaTls, SaslMechanism, SecurityProtocol,
};
use sluice_bus_kafka::{GroupProtocol, KafkaConfig, KafkaSecurity};
use sluice_ledger::sqlite::Durability;
use sluice_ledger_cql::CqlConfig;
use thiserror::Error;

mod api;
mod callbacks;
mod copies;
mod links;
mod secrets;
mod tenants;
pub use api::{AuthConfig, MIN_TOKEN_CHARS, ProducerConfig, Role, ServerTls, TokenConfig};
pub use tenants::{DEFAULT_QUOTA_RETRY_AFTER_MS, TenantsConfig};
mod webhooks;
pub use callbacks::CallbacksConfig;
pub use copies::{CopyKey, MAX_COPY_KEYS, MIN_COPY_KEY_BYTES};
pub use links::ApprovalLinksConfig;
pub use webhooks::WebhookConfig;

/// The environment prefix of configuration overrides.
pub const ENV_PREFIX: &str = "SLUICE_";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub ledger: LedgerConfig,
    pub bus: BusConfig,
    pub catalog: CatalogConfig,
    pub producer: ProducerConfig,
    pub dispatcher: DispatcherConfig,
    pub reconciler: ReconcilerConfig,
    pub compensator: CompensatorConfig,
    pub telemetry: TelemetryConfig,
    pub auth: AuthConfig,
    pub metrics: MetricsConfig,
    /// Per-tenant quotas of effects in flight (the producer's admission).
    pub tenants: TenantsConfig,
    /// Webhook subscriptions (`[[webhooks]]`, `webhooks.rs`).
    pub webhooks: Vec<WebhookConfig>,
    /// Approval links' key and address (`[approval_links]`, `links.rs`).
    pub approval_links: ApprovalLinksConfig,
    /// Asynchronous tools' callback URLs: their key and address (`[callbacks]`,
    /// `callbacks.rs`).
    pub callbacks: CallbacksConfig,
}

/// The state gauges (`sluice_commands`, `sluice_oldest_command_age_seconds`): kept in memory
/// at each ledger write this process makes, read from the ledger at start (docs/architecture.md,
/// "Observability").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Keep and export the state gauges. In a deployment of many processes, turn them on in
    /// the one that reports them (the reconciler in `deploy/` and `k8s/`) and off elsewhere.
    pub command_gauges: bool,
    /// Read the gauges' figures from the ledger again this often, in milliseconds; 0 reads
    /// them only at start. Unset: 0 on the embedded bus (one process makes every write, so
    /// its own count is the whole count), 60 000 on Kafka (other processes write too). Each
    /// read lists the runs and reads those with unresolved commands.
    pub command_gauges_refresh_ms: Option<u64>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            command_gauges: true,
            command_gauges_refresh_ms: None,
        }
    }
}

/// `metrics.command_gauges_refresh_ms` on Kafka unless configured.
pub const KAFKA_GAUGES_REFRESH_MS: u64 = 60_000;

impl Config {
    /// How often the state gauges are read from the ledger again; `None`: only at start.
    pub fn command_gauges_refresh(&self) -> Option<std::time::Duration> {
        let ms = self
            .metrics
            .command_gauges_refresh_ms
            .unwrap_or(match self.bus.kind {
                BusKind::Embedded => 0,
                BusKind::Kafka => KAFKA_GAUGES_REFRESH_MS,
            });
        (ms > 0).then(|| std::time::Duration::from_millis(ms))
    }
}

/// Which ledger, and its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LedgerConfig {
    pub kind: LedgerKind,
    /// The embedded ledger's directory.
    pub data_dir: PathBuf,
    pub durability: Durability,
    pub busy_timeout_ms: u64,
    /// How long the embedded ledger's writer lets a small batch wait for company while it is
    /// busy, in microseconds (0: commit at once); see `sluice_ledger::sqlite::GATHER_BELOW`.
    pub commit_gather_us: u64,
    /// The embedded ledger's writer thread's nice value, -20 to 19 (default -10: ahead of the
    /// threads that feed it; lowering it needs `CAP_SYS_NICE`, and without it the writer says
    /// so and keeps the process's). See `sluice_ledger::sqlite::DEFAULT_WRITER_NICE`.
    pub writer_nice: i32,
    /// The CQL ledger (`kind = "cql"`): ScyllaDB or Cassandra, see docs/cql.md.
    pub cql: CqlConfig,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            kind: LedgerKind::Sqlite,
            data_dir: PathBuf::from(sluice_ledger::sqlite::DEFAULT_DATA_DIR),
            durability: Durability::Full,
            busy_timeout_ms: 5_000,
            commit_gather_us: sluice_ledger::sqlite::DEFAULT_COMMIT_GATHER_US,
            writer_nice: sluice_ledger::sqlite::DEFAULT_WRITER_NICE,
            cql: CqlConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LedgerKind {
    /// The embedded ledger: one SQLite file under `data_dir`, for one machine.
    Sqlite,
    /// ScyllaDB or Cassandra (`[ledger.cql]`), shared by services on many machines.
    Cql,
}

/// The longest `ledger.commit_gather_us`: every write of a busy ledger may wait this long.
pub const MAX_COMMIT_GATHER_US: u64 = 10_000;

/// `bus.partitions` and `dispatcher.concurrency` of the embedded bus unless configured. Its
/// partitions cost nothing, and with 64 the pipeline waited on its lanes rather than its CPU:
/// `sluice bench --mode batch --no-paced --effects 40000` 17.3k–18.4k effects/s at 64,
/// 19.2k–19.7k at 128, 20.3k–20.4k at 256 (2026-11-24).
pub const EMBEDDED_PARTITIONS: u32 = 256;
/// `bus.partitions` and `dispatcher.concurrency` with `bus.kind = "kafka"` unless configured:
/// a broker's cost per fetch grows with the partitions in it (docs/cql.md).
pub const KAFKA_PARTITIONS: u32 = 64;

/// `bus.admission` unless configured: with `sluice bench --mode batch`, 128 beat 256, 64 and
/// 1024 once the ledger's writer gathered its commits (docs/decisions.md, "Admission").
pub const DEFAULT_ADMISSION: u32 = 128;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BusConfig {
    pub kind: BusKind,
    pub topic_prefix: String,
    pub partitions: u32,
    /// The embedded bus only: new submissions wait while this many of their dispatch
    /// requests are published and not yet handled by the dispatcher (0: no bound). Keeps a
    /// burst from piling up in memory, where every queued effect costs more to finish. Kafka
    /// keeps its backlog on disk and ignores it.
    pub admission: u32,
    /// The Kafka bus (`kind = "kafka"`).
    pub kafka: KafkaSettings,
    /// Kafka only: keys that sign the command's copy in each dispatch request, so the
    /// dispatcher does not read it (`copies`); none: requests carry no copy. Not written out
    /// when empty (a dumped configuration cannot hold their secrets anyway).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub copy_keys: Vec<CopyKey>,
}

impl Default for BusConfig {
    fn default() -> Self {
        Self {
            kind: BusKind::Embedded,
            topic_prefix: "sluice.".into(),
            // A partition hands out one message at a time, so partitions bound how many runs
            // each service works on at once. This is the embedded bus's default; Kafka's is
            // `KAFKA_PARTITIONS` (see `Config::load`).
            partitions: EMBEDDED_PARTITIONS,
            admission: DEFAULT_ADMISSION,
            kafka: KafkaSettings::default(),
            copy_keys: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusKind {
    /// Topics inside this process: only for all four services in one process (`sluice dev`).
    Embedded,
    /// Apache Kafka or a Kafka-protocol broker (`[bus.kafka]`), shared by every process.
    Kafka,
}

/// How to reach Kafka. Topic names and counts come from `[bus]` (`topic_prefix`,
/// `partitions`).
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaSettings {
    /// Bootstrap brokers, `host:port` separated by commas.
    pub brokers: String,
    /// Replicas of each topic created at start; unset takes the broker's default.
    pub replication_factor: Option<u16>,
    /// `min.insync.replicas` of each topic created at start (with `acks=all`, the replicas a
    /// publish waits for); unset takes the broker's default.
    pub min_insync_replicas: Option<u16>,
    pub client_id: String,
    /// Whether a service creates topics at start: `if_missing` (default: reads the metadata
    /// and creates only missing topics, so a user without `CREATE` can run the services once
    /// the topics exist), `always` (asks at every start; needs `CREATE`), `never` (a missing
    /// topic or another partition count stops the service). `sluice migrate` creates missing
    /// topics whatever this says.
    pub create_topics: CreateTopics,
    /// Prefix of the consumer group ids (`<prefix>dispatcher`, `<prefix>reconciler`,
    /// `<prefix>compensator`, `<prefix>webhooks`). Unset: the topic prefix with its trailing
    /// `.`, `_` or `-` turned into `-` (`sluice.` gives `sluice-`).
    pub group_prefix: Option<String>,
    /// Largest message accepted, in bytes.
    pub max_message_bytes: usize,
    /// How long a service waits at start for the brokers and its topics.
    pub start_timeout_ms: u64,
    /// `plaintext` (default), `ssl`, `sasl_plaintext` or `sasl_ssl`.
    pub security_protocol: SecurityProtocol,
    /// `[bus.kafka.sasl]`: mechanism (`plain`, `scram_sha_256`, `scram_sha_512`), username,
    /// password. Required by the `sasl_*` protocols.
    pub sasl: Option<KafkaSasl>,
    /// `[bus.kafka.oauthbearer]`: SASL/OAUTHBEARER with OIDC client credentials
    /// (`token_endpoint_url`, `client_id`, `client_secret` by reference, `scope`,
    /// `extensions`), instead of `[bus.kafka.sasl]`.
    pub oauthbearer: Option<KafkaOauth>,
    /// `[bus.kafka.tls]`: `ca_file`, `cert_file`/`key_file`, `key_password`,
    /// `verify_hostname`. Used by `ssl` and `sasl_ssl`.
    pub tls: KafkaTls,
    /// Further librdkafka properties (`linger.ms`, `session.timeout.ms`, …). Values are never
    /// logged: they may hold secrets.
    pub extra: BTreeMap<String, String>,
    /// How consumer groups rebalance: `cooperative` (default: only the partitions that move
    /// are revoked), `eager` (every partition of every member, as before) or `consumer`
    /// (KIP-848, Kafka 4.0 or later).
    pub group_protocol: GroupProtocol,
    /// Static group membership: a stable name of this process (the pod name, as
    /// k8s/static-membership sets it). A consumer that restarts within `session.timeout.ms`
    /// under it keeps its partitions without a rebalance; one that stops for good holds them
    /// until then. Unset: dynamic membership. Never the same in two live processes.
    pub instance_id: Option<String>,
}

impl Default for KafkaSettings {
    fn default() -> Self {
        let kafka = KafkaConfig::default();
        Self {
            brokers: kafka.brokers,
            replication_factor: kafka.replication_factor,
            min_insync_replicas: kafka.min_insync_replicas,
            client_id: kafka.client_id,
            create_topics: kafka.create_topics,
            group_prefix: kafka.group_prefix,
            max_message_bytes: kafka.max_message_bytes,
            start_timeout_ms: u64::try_from(kafka.start_timeout.as_millis()).unwrap_or(u64::MAX),
            security_protocol: kafka.security.protocol,
            sasl: kafka.security.sasl,
            oauthbearer: kafka.security.oauthbearer,
            tls: kafka.security.tls,
            extra: kafka.extra,
            group_protocol: kafka.group_protocol,
            instance_id: kafka.instance_id,
        }
    }
}

impl std::fmt::Debug for KafkaSettings {
    /// Names the `extra` properties but not their values (they may hold secrets); the SASL
    /// password and the key's passphrase are `Secret`s.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSettings")
            .field("brokers", &self.brokers)
            .field("replication_factor", &self.replication_factor)
            .field("min_insync_replicas", &self.min_insync_replicas)
            .field("client_id", &self.client_id)
            .field("create_topics", &self.create_topics)
            .field("group_prefix", &self.group_prefix)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("start_timeout_ms", &self.start_timeout_ms)
            .field("security_protocol", &self.security_protocol)
            .field("sasl", &self.sasl)
            .field("oauthbearer", &self.oauthbearer)
            .field("tls", &self.tls)
            .field("extra", &self.extra.keys().collect::<Vec<_>>())
            .field("group_protocol", &self.group_protocol)
            .field("instance_id", &self.instance_id)
            .finish()
    }
}

impl BusConfig {
    /// The Kafka bus's settings, from `[bus]` and `[bus.kafka]`.
    pub fn kafka_config(&self) -> KafkaConfig {
        KafkaConfig {
            brokers: self.kafka.brokers.clone(),
            prefix: self.topic_prefix.clone(),
            partitions: self.partitions,
            replication_factor: self.kafka.replication_factor,
            min_insync_replicas: self.kafka.min_insync_replicas,
            client_id: self.kafka.client_id.clone(),
            create_topics: self.kafka.create_topics,
            group_prefix: self.kafka.group_prefix.clone(),
            max_message_bytes: self.kafka.max_message_bytes,
            start_timeout: std::time::Duration::from_millis(self.kafka.start_timeout_ms),
            security: KafkaSecurity {
                protocol: self.kafka.security_protocol,
                sasl: self.kafka.sasl.clone(),
                tls: self.kafka.tls.clone(),
                oauthbearer: self.kafka.oauthbearer.clone(),
            },
            extra: self.kafka.extra.clone(),
            group_protocol: self.kafka.group_protocol,
            instance_id: self.kafka.instance_id.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogConfig {
    /// The tool catalog; `None` uses the example catalog built into the binary.
    pub path: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatcherConfig {
    /// Calls made at the same time (a run's own commands go one at a time).
    pub concurrency: usize,
    /// Fair dispatch between tenants: how many dispatch requests are read ahead of the
    /// workers, into one lane per tenant that the workers serve in turn
    /// (docs/decisions.md, "Tenants"). 0 turns it off: each partition's requests are then
    /// handled one after another, in the order they were published, whatever their tenant.
    pub queue: usize,
    /// The name this dispatcher leases under; default `<host>-<pid>`.
    pub owner: Option<String>,
}

/// `dispatcher.queue` unless configured: more than the embedded bus's admission bound, so the
/// bus is drained into the lanes and a new tenant's request is never behind a full partition.
pub const DEFAULT_DISPATCH_QUEUE: usize = 1_024;

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            concurrency: EMBEDDED_PARTITIONS as usize,
            queue: DEFAULT_DISPATCH_QUEUE,
            owner: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReconcilerConfig {
    pub concurrency: usize,
    /// How often the sweeps read the due index.
    pub sweep_interval_ms: u64,
    /// Most due items handled per sweep.
    pub sweep_batch: usize,
    /// Due items a sweep handles at once.
    pub sweep_concurrency: usize,
    /// The longest one due item may take (a status check that hangs is given up after it;
    /// its claim or due time brings the command back).
    pub sweep_item_timeout_ms: u64,
    /// How long a lease on a due-index shard lasts; renewed once half of it is gone. A
    /// reconciler that dies leaves its shards to the others after at most this long.
    pub shard_lease_ms: u64,
    /// This reconciler's name in the shard split; unique per start when unset.
    pub name: Option<String>,
    /// Finished runs unchanged this many days are purged by the reconciler's schedule (their
    /// audit checkpoint kept); 0 keeps everything, by choice. Default 30
    /// (`sluice_core::retention::DEFAULT_RETENTION_DAYS`).
    pub retention_days: u32,
    /// Retention in milliseconds instead of days, for tests and benches that compress time;
    /// unset in production.
    pub retention_ms: Option<u64>,
    /// How often a purge is due; one reconciler purges per interval (a lease in the ledger).
    pub purge_every_ms: u64,
    /// Runs removed per purge call (each call one ledger operation; on SQLite the writer is
    /// busy for its length).
    pub purge_batch: usize,
}

impl ReconcilerConfig {
    /// Retention as the core reads it, with the clock-skew bound `skew_ms`.
    pub fn retention(&self, skew_ms: i64) -> sluice_core::retention::Retention {
        let keep_ms = match self.retention_ms {
            Some(ms) => i64::try_from(ms).unwrap_or(i64::MAX),
            None => i64::from(self.retention_days).saturating_mul(86_400_000),
        };
        sluice_core::retention::Retention {
            keep_ms,
            every_ms: i64::try_from(self.purge_every_ms).unwrap_or(i64::MAX),
            skew_ms,
        }
    }
}

impl Default for ReconcilerConfig {
    fn default() -> Self {
        Self {
            concurrency: 32,
            sweep_interval_ms: 1_000,
            sweep_batch: 1_000,
            sweep_concurrency: 16,
            // A status check's default timeout (10 s) and the write of what it found.
            sweep_item_timeout_ms: 15_000,
            shard_lease_ms: 10_000,
            name: None,
            retention_days: sluice_core::retention::DEFAULT_RETENTION_DAYS,
            retention_ms: None,
            purge_every_ms: sluice_core::retention::DEFAULT_PURGE_EVERY_MS,
            purge_batch: 500,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompensatorConfig {
    pub concurrency: usize,
}

impl Default for CompensatorConfig {
    fn default() -> Self {
        Self { concurrency: 16 }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// A `tracing` filter such as `info` or `sluice=debug,info`.
    pub log_level: String,
    /// Where the dispatcher, reconciler and compensator serve `/metrics`, `/healthz` and
    /// `/readyz` (e.g. `0.0.0.0:9464`); unset serves nothing. The producer serves them on its
    /// API address.
    pub listen: Option<SocketAddr>,
    /// Where spans are exported over OTLP http/protobuf, e.g. `http://collector:4318` (the
    /// `/v1/traces` path is added when the URL names none). Unset: the standard
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`) if set, else no export at all.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of exported spans; unset: the binary's name (`OTEL_SERVICE_NAME`
    /// wins over both).
    pub service_name: Option<String>,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: LogFormat::Text,
            log_level: "info".into(),
            listen: None,
            otlp_endpoint: None,
            service_name: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration that cannot be used.
#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{source_name}: {message}")]
    Parse {
        source_name: String,
        message: String,
    },
    #[error("environment variable {var}: {message}")]
    Env { var: String, message: String },
    #[error("configuration key {key}: {message}")]
    Invalid { key: String, message: String },
}

impl Config {
    /// Loads the file (if any), then the `SLUICE_` variables of `env`, then reads the secrets
    /// given as `{ file = … }` or `{ env = … }` (variables from the process's environment),
    /// then validates.
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, ConfigError> {
        Self::load_with(file, env, &|var| std::env::var(var).ok())
    }

    /// [`Config::load`] with secret references `{ env = … }` looked up by `lookup`.
    pub fn load_with(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let mut table = toml::Table::new();
        let mut source_name = String::from("defaults");
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_owned(),
                source,
            })?;
            table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                source_name: path.display().to_string(),
                message: e.message().to_owned(),
            })?;
            source_name = path.display().to_string();
        }
        // Only `SLUICE_<SECTION>__<KEY>` names are configuration: every key lives in a
        // section, and other `SLUICE_` variables (test settings, scripts) are left alone.
        let overrides: BTreeMap<String, String> = env
            .into_iter()
            .filter(|(var, _)| var.starts_with(ENV_PREFIX) && var.contains("__"))
            .collect();
        for (var, value) in &overrides {
            apply_env(&mut table, var, value)?;
        }
        if !overrides.is_empty() {
            source_name = format!("{source_name} with SLUICE_ overrides");
        }
        kafka_defaults(&mut table);
        secrets::resolve(&mut table, lookup)?;
        let config: Config =
            toml::Table::try_into(table).map_err(|e: toml::de::Error| ConfigError::Parse {
                source_name,
                message: keyed_message(&e),
            })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks what types alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: &str| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message: message.to_owned(),
            })
        };
        webhooks::validate(&self.webhooks)?;
        self.approval_links.validate()?;
        self.callbacks.validate()?;
        copies::validate(&self.bus.copy_keys)?;
        if self.bus.partitions == 0 || self.bus.partitions > 4_096 {
            return invalid("bus.partitions", "must be between 1 and 4096");
        }
        if self.bus.topic_prefix.is_empty()
            || !self
                .bus
                .topic_prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return invalid(
                "bus.topic_prefix",
                "must be non-empty and use only letters, digits, '.', '_' and '-'",
            );
        }
        if let Some(endpoint) = &self.telemetry.otlp_endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return invalid(
                "telemetry.otlp_endpoint",
                "must be an http:// or https:// URL (OTLP over http/protobuf)",
            );
        }
        if self.ledger.kind == LedgerKind::Cql {
            self.ledger.cql.validate().map_err(|e| match e {
                sluice_ledger_cql::CqlError::Config { key, why } => ConfigError::Invalid {
                    key: format!("ledger.cql.{key}"),
                    message: why,
                },
                other => ConfigError::Invalid {
                    key: "ledger.cql".into(),
                    message: other.to_string(),
                },
            })?;
        }
        if self.bus.kind == BusKind::Kafka {
            self.bus.kafka_config().validate().map_err(|e| match e {
                sluice_bus::BusError::InvalidConfig { key, why } => ConfigError::Invalid {
                    key: match key {
                        "prefix" => "bus.topic_prefix".into(),
                        "partitions" => "bus.partitions".into(),
                        "start_timeout" => "bus.kafka.start_timeout_ms".into(),
                        key => format!("bus.kafka.{key}"),
                    },
                    message: why,
                },
                other => ConfigError::Invalid {
                    key: "bus.kafka".into(),
                    message: other.to_string(),
                },
            })?;
        }
        if self.ledger.commit_gather_us > MAX_COMMIT_GATHER_US {
            return invalid(
                "ledger.commit_gather_us",
                &format!("must be at most {MAX_COMMIT_GATHER_US} (microseconds)"),
            );
        }
        if !(-20..=19).contains(&self.ledger.writer_nice) {
            return invalid("ledger.writer_nice", "must be between -20 and 19");
        }
        if self.producer.max_body_bytes < 1_024 {
            return invalid("producer.max_body_bytes", "must be at least 1024");
        }
        if self.producer.max_batch == 0 {
            return invalid("producer.max_batch", "must be at least 1");
        }
        for (key, value) in [
            ("dispatcher.concurrency", self.dispatcher.concurrency),
            ("reconciler.concurrency", self.reconciler.concurrency),
            ("reconciler.sweep_batch", self.reconciler.sweep_batch),
            (
                "reconciler.sweep_concurrency",
                self.reconciler.sweep_concurrency,
            ),
            ("compensator.concurrency", self.compensator.concurrency),
        ] {
            if value == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        if self
            .metrics
            .command_gauges_refresh_ms
            .is_some_and(|ms| ms > 0 && ms < 1_000)
        {
            return invalid(
                "metrics.command_gauges_refresh_ms",
                "must be 0 (only at start) or at least 1000: each refresh reads the ledger",
            );
        }
        if self.reconciler.sweep_interval_ms < 10 {
            return invalid("reconciler.sweep_interval_ms", "must be at least 10");
        }
        if self.reconciler.shard_lease_ms < self.reconciler.sweep_interval_ms.saturating_mul(3)
            || self.reconciler.shard_lease_ms < 3_000
        {
            return invalid(
                "reconciler.shard_lease_ms",
                "must be at least 3 s and three sweep intervals, so a lease is renewed before it lapses",
            );
        }
        if self.reconciler.sweep_item_timeout_ms == 0 {
            return invalid("reconciler.sweep_item_timeout_ms", "must be at least 1");
        }
        if self.reconciler.retention_ms == Some(0) {
            return invalid(
                "reconciler.retention_ms",
                "is 0: leave it out and set reconciler.retention_days = 0 to keep everything",
            );
        }
        if self.reconciler.retention_days > 36_500 {
            return invalid(
                "reconciler.retention_days",
                "is over 100 years: set 0 to keep everything",
            );
        }
        if self.reconciler.purge_every_ms < 1_000 {
            return invalid(
                "reconciler.purge_every_ms",
                "must be at least 1000: each purge reads the runs past the retention",
            );
        }
        if !(1..=10_000).contains(&self.reconciler.purge_batch) {
            return invalid(
                "reconciler.purge_batch",
                "must be 1-10000 runs per purge call",
            );
        }
        self.auth.validate(self.producer.listen)?;
        self.producer.validate(&self.auth)?;
        self.tenants.validate()?;
        Ok(())
    }
}

/// With `bus.kind = "kafka"`, the partitions and the dispatcher's concurrency the file and
/// the environment leave out default to [`KAFKA_PARTITIONS`] rather than the embedded bus's.
fn kafka_defaults(table: &mut toml::Table) {
    let kafka = table
        .get("bus")
        .and_then(|bus| bus.get("kind"))
        .and_then(toml::Value::as_str)
        == Some("kafka");
    if !kafka {
        return;
    }
    for (section, key) in [("bus", "partitions"), ("dispatcher", "concurrency")] {
        if let Some(section) = table
            .entry(section)
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
        {
            section
                .entry(key)
                .or_insert(toml::Value::Integer(i64::from(KAFKA_PARTITIONS)));
        }
    }
}

/// Sets `SLUICE_A__B=value` as `a.b = value` in `table`: the value is read as a TOML value
/// when it parses as one (numbers, booleans, arrays), else taken as a string.
fn apply_env(table: &mut toml::Table, var: &str, value: &str) -> Result<(), ConfigError> {
    let env_error = |message: &str| ConfigError::Env {
        var: var.to_owned(),
        message: message.to_owned(),
    };
    let path: Vec<String> = var[ENV_PREFIX.len()..]
        .split("__")
        .map(str::to_ascii_lowercase)
        .collect();
    if path.iter().any(String::is_empty) {
        return Err(env_error("has an empty key segment"));
    }
    let (last, parents) = path.split_last().ok_or_else(|| env_error("names no key"))?;
    // A password is a string even when it looks like a number (or like a `{ file = … }`
    // reference: a variable holds the secret itself).
    let secret = secrets::is_secret_name(last);
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|_| !secret)
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let mut node = table;
    for segment in parents {
        let entry = node
            .entry(segment.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = entry
            .as_table_mut()
            .ok_or_else(|| env_error(&format!("{segment} is not a section")))?;
    }
    node.insert(last.clone(), parsed);
    Ok(())
}

/// A deserialisation error's message, led by the key it is about (`producer.listen: invalid
/// socket address syntax`): the error of a table carries its key only in its display.
fn keyed_message(error: &toml::de::Error) -> String {
    let display = error.to_string();
    let key = display
        .lines()
        .find_map(|line| line.strip_prefix("in `")?.strip_suffix('`'));
    match key {
        Some(key) => format!("{key}: {}", error.message()),
        None => error.message().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_validate_and_listen_on_loopback() {
        let config = Config::load(None, env(&[])).expect("defaults are valid");
        assert!(config.producer.listen.ip().is_loopback());
        assert_eq!(config.ledger.kind, LedgerKind::Sqlite);
    }

    #[test]
    fn file_then_environment_then_validation() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "[producer]\nlisten = \"127.0.0.1:9000\"\n[bus]\npartitions = 4\n",
        )
        .expect("write");
        let config = Config::load(
            Some(&path),
            env(&[
                ("SLUICE_BUS__PARTITIONS", "16"),
                ("SLUICE_LEDGER__DATA_DIR", "/tmp/x"),
                ("OTHER", "ignored"),
            ]),
        )
        .expect("valid");
        assert_eq!(config.producer.listen.port(), 9000);
        assert_eq!(
            config.bus.partitions, 16,
            "the environment wins over the file"
        );
        assert_eq!(config.ledger.data_dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn lanes_default_by_bus_kind_and_configured_ones_stay() {
        let dir = tempfile::tempdir().expect("dir");
        let load = |text: &str| {
            let path = dir.path().join("lanes.toml");
            std::fs::write(&path, text).expect("write");
            Config::load(Some(&path), env(&[])).expect("valid")
        };
        let embedded = Config::load(None, env(&[])).expect("defaults");
        assert_eq!(embedded.bus.partitions, EMBEDDED_PARTITIONS);
        assert_eq!(
            embedded.dispatcher.concurrency,
            EMBEDDED_PARTITIONS as usize
        );
        assert_eq!(embedded, Config::default());

        let kafka = load("[bus]\nkind = \"kafka\"\n");
        assert_eq!(kafka.bus.partitions, KAFKA_PARTITIONS);
        assert_eq!(kafka.dispatcher.concurrency, KAFKA_PARTITIONS as usize);

        let chosen =
            load("[bus]\nkind = \"kafka\"\npartitions = 12\n[dispatcher]\nconcurrency = 5\n");
        assert_eq!(chosen.bus.partitions, 12);
        assert_eq!(chosen.dispatcher.concurrency, 5);
    }

    #[test]
    fn group_membership_comes_from_the_file_and_the_pod_name() {
        let defaults = Config::load(None, env(&[("SLUICE_BUS__KIND", "kafka")])).expect("valid");
        assert_eq!(
            defaults.bus.kafka.group_protocol,
            GroupProtocol::Cooperative
        );
        assert_eq!(defaults.bus.kafka_config().instance_id, None);

        // What k8s/static-membership sets from the pod name (the downward API's metadata.name).
        let pod = Config::load(
            None,
            env(&[
                ("SLUICE_BUS__KIND", "kafka"),
                (
                    "SLUICE_BUS__KAFKA__INSTANCE_ID",
                    "sluice-dispatcher-7c9d8-x2x4z",
                ),
                ("SLUICE_BUS__KAFKA__GROUP_PROTOCOL", "consumer"),
            ]),
        )
        .expect("valid");
        let kafka = pod.bus.kafka_config();
        assert_eq!(
            kafka.instance_id.as_deref(),
            Some("sluice-dispatcher-7c9d8-x2x4z")
        );
        assert_eq!(kafka.group_protocol, GroupProtocol::Consumer);

        let bad = Config::load(
            None,
            env(&[
                ("SLUICE_BUS__KIND", "kafka"),
                ("SLUICE_BUS__KAFKA__INSTANCE_ID", "pod name"),
            ]),
        )
        .expect_err("a space is not in a pod name");
        assert!(bad.to_string().contains("bus.kafka.instance_id"), "{bad}");
        let unknown = Config::load(
            None,
            env(&[
                ("SLUICE_BUS__KIND", "kafka"),
                ("SLUICE_BUS__KAFKA__GROUP_PROTOCOL", "sticky"),
            ]),
        )
        .expect_err("not a protocol");
        assert!(unknown.to_string().contains("group_protocol"), "{unknown}");
    }

    #[test]
    fn auth_tokens_are_checked_and_never_shown() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        let write = |text: &str| std::fs::write(&path, text).expect("write");
        write(
            "[[auth.tokens]]\nname = \"ops\"\nrole = \"admin\"\ntoken = \"s3cret-s3cret-s3cret\"\n",
        );
        let config = Config::load(Some(&path), env(&[])).expect("valid");
        assert_eq!(config.auth.tokens[0].role, Role::Admin);
        let shown = format!(
            "{config:?} {}",
            toml::to_string(&config).expect("serializes")
        );
        assert!(!shown.contains("s3cret"), "a token leaked: {shown}");

        write("[[auth.tokens]]\nname = \"ops\"\nrole = \"admin\"\ntoken = \"short\"\n");
        let err = Config::load(Some(&path), env(&[])).expect_err("short token");
        assert!(err.to_string().contains("auth.tokens[0].token"), "{err}");
        write(
            "[[auth.tokens]]\nname = \"ops\"\nrole = \"root\"\ntoken = \"s3cret-s3cret-s3cret\"\n",
        );
        Config::load(Some(&path), env(&[])).expect_err("unknown role");
        write(
            "[[auth.tokens]]\nname = \"a\"\nrole = \"agent\"\ntoken = \"s3cret-s3cret-s3cret\"\n\
             [[auth.tokens]]\nname = \"b\"\nrole = \"admin\"\ntoken = \"s3cret-s3cret-s3cret\"\n",
        );
        let err = Config::load(Some(&path), env(&[])).expect_err("duplicate token");
        assert!(err.to_string().contains("auth.tokens[1].token"), "{err}");

        let err = Config::load(None, env(&[("SLUICE_PRODUCER__LISTEN", "0.0.0.0:8700")]))
            .expect_err("open API beyond loopback");
        assert!(err.to_string().contains("auth.tokens"), "{err}");
    }

    /// The tenants a token may name and the quotas are tenant names, each error naming its
    /// key; a tenant without a quota of its own gets the default.
    #[test]
    fn tenants_and_their_quotas_are_checked() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        let write = |text: &str| std::fs::write(&path, text).expect("write");
        let token = "[[auth.tokens]]\nname = \"platform\"\nrole = \"agent\"\n\
                     token = \"s3cret-s3cret-s3cret\"\n";
        write(&format!(
            "{token}tenants = [\"acme\", \"globex\"]\n\
             [tenants]\ndefault_quota = 100\nretry_after_ms = 2500\n[tenants.quotas]\nacme = 5\n"
        ));
        let config = Config::load(Some(&path), env(&[])).expect("valid");
        assert_eq!(config.auth.tokens[0].tenants, vec!["acme", "globex"]);
        assert_eq!(
            (
                config.tenants.quota_of("acme"),
                config.tenants.quota_of("globex"),
                config.tenants.retry_after_ms()
            ),
            (Some(5), Some(100), 2_500)
        );
        assert!(config.tenants.has_quotas());
        assert!(!Config::default().tenants.has_quotas());
        assert_eq!(Config::default().tenants.quota_of("acme"), None);

        write(&format!("{token}tenants = [\"acme\", \"acme corp\"]\n"));
        let err = Config::load(Some(&path), env(&[])).expect_err("malformed tenant");
        assert!(
            err.to_string().contains("auth.tokens[0].tenants[1]"),
            "{err}"
        );
        write(&format!("{token}[tenants.quotas]\n\"a/b\" = 1\n"));
        let err = Config::load(Some(&path), env(&[])).expect_err("malformed quota key");
        assert!(err.to_string().contains("tenants.quotas.a/b"), "{err}");
        write(&format!("{token}[tenants]\nretry_after_ms = 86400000\n"));
        let err = Config::load(Some(&path), env(&[])).expect_err("a day");
        assert!(err.to_string().contains("tenants.retry_after_ms"), "{err}");
    }

    #[test]
    fn errors_name_the_key() {
        let err =
            Config::load(None, env(&[("SLUICE_BUS__PARTITION", "3")])).expect_err("unknown key");
        assert!(err.to_string().contains("partition"), "{err}");
        let err = Config::load(None, env(&[("SLUICE_BUS__PARTITIONS", "0")])).expect_err("zero");
        let otlp = Config::load(
            None,
            env(&[("SLUICE_TELEMETRY__OTLP_ENDPOINT", "collector:4318")]),
        )
        .expect_err("not a URL");
        assert!(
            otlp.to_string().contains("telemetry.otlp_endpoint"),
            "{otlp}"
        );
        let otlp = Config::load(
            None,
            env(&[("SLUICE_TELEMETRY__OTLP_ENDPOINT", "http://collector:4318")]),
        )
        .expect("an OTLP endpoint");
        assert_eq!(
            otlp.telemetry.otlp_endpoint.as_deref(),
            Some("http://collector:4318")
        );
        assert!(err.to_string().contains("bus.partitions"), "{err}");
        let err = Config::load(None, env(&[("SLUICE_LEDGER__COMMIT_GATHER_US", "20000")]))
            .expect_err("too long a wait");
        assert!(err.to_string().contains("ledger.commit_gather_us"), "{err}");
        let err = Config::load(None, env(&[("SLUICE_LEDGER__WRITER_NICE", "-21")]))
            .expect_err("below the lowest nice value");
        assert!(err.to_string().contains("ledger.writer_nice"), "{err}");
        let ok = Config::load(None, env(&[("SLUICE_LEDGER__COMMIT_GATHER_US", "0")]));
        assert_eq!(ok.expect("no wait is valid").ledger.commit_gather_us, 0);
        let err = Config::load(None, env(&[("SLUICE_PRODUCER__LISTEN", "nowhere")]))
            .expect_err("bad address");
        assert!(
            err.to_string().contains("listen") || err.to_string().contains("address"),
            "{err}"
        );
    }

    #[test]
    fn kafka_topic_creation_and_group_prefix_are_read_and_checked() {
        let kafka = Config::load(None, env(&[("SLUICE_BUS__KIND", "kafka")]))
            .expect("the defaults")
            .bus
            .kafka_config();
        assert_eq!(kafka.create_topics, CreateTopics::IfMissing);
        assert_eq!(kafka.group_prefix(), "sluice-");
        let staging = Config::load(
            None,
            env(&[
                ("SLUICE_BUS__KIND", "kafka"),
                ("SLUICE_BUS__TOPIC_PREFIX", "staging."),
                ("SLUICE_BUS__KAFKA__CREATE_TOPICS", "never"),
            ]),
        )
        .expect("valid")
        .bus
        .kafka_config();
        assert_eq!(staging.create_topics, CreateTopics::Never);
        assert_eq!(staging.group_prefix(), "staging-");
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "[bus]\nkind = \"kafka\"\n[bus.kafka]\ncreate_topics = \"always\"\n\
             group_prefix = \"team-a.sluice-\"\n",
        )
        .expect("write");
        let file = Config::load(Some(&path), env(&[]))
            .expect("valid")
            .bus
            .kafka_config();
        assert_eq!(file.create_topics, CreateTopics::Always);
        assert_eq!(file.group_prefix(), "team-a.sluice-");
        std::fs::write(
            &path,
            "[bus]\nkind = \"kafka\"\n[bus.kafka]\nsecurity_protocol = \"sasl_ssl\"\n\
             [bus.kafka.oauthbearer]\ntoken_endpoint_url = \"https://idp.example.com/token\"\n\
             client_id = \"sluice\"\nclient_secret = { env = \"OIDC_SECRET\" }\n",
        )
        .expect("write");
        let oauth = Config::load_with(Some(&path), env(&[]), &|var| {
            (var == "OIDC_SECRET").then(|| "oidc-s3cret".to_owned())
        })
        .expect("valid");
        let kafka = oauth.bus.kafka_config();
        let token = kafka.security.oauthbearer.as_ref().expect("oauthbearer");
        assert_eq!(token.client_secret.expose(), "oidc-s3cret");
        assert!(!format!("{oauth:?}").contains("oidc-s3cret"));
        for (var, value, key) in [
            (
                "SLUICE_BUS__KAFKA__CREATE_TOPICS",
                "sometimes",
                "create_topics",
            ),
            (
                "SLUICE_BUS__KAFKA__GROUP_PREFIX",
                "a b",
                "bus.kafka.group_prefix",
            ),
        ] {
            let err = Config::load(None, env(&[("SLUICE_BUS__KIND", "kafka"), (var, value)]))
                .expect_err(value);
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn distributed_kinds_read_their_sections_and_hide_secrets() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "[ledger]\nkind = \"cql\"\n[ledger.cql]\nnodes = [\"10.0.0.1:9042\"]\nkeyspace = \"prod\"\n\
             [bus]\nkind = \"kafka\"\npartitions = 12\n[bus.kafka]\nbrokers = \"k1:9092,k2:9092\"\n\
             [bus.kafka.extra]\n\"ssl.keystore.password\" = \"hunter2\"\n",
        )
        .expect("write");
        let config = Config::load(Some(&path), env(&[])).expect("valid");
        assert_eq!(config.ledger.kind, LedgerKind::Cql);
        assert_eq!(config.ledger.cql.keyspace, "prod");
        let kafka = config.bus.kafka_config();
        assert_eq!(kafka.brokers, "k1:9092,k2:9092");
        assert_eq!(kafka.partitions, 12);
        let shown = format!("{config:?}");
        assert!(shown.contains("ssl.keystore.password"), "{shown}");
        assert!(
            !shown.contains("hunter2"),
            "a secret reached Debug: {shown}"
        );

        let with_password = Config::load(
            Some(&path),
            env(&[
                ("SLUICE_LEDGER__CQL__USERNAME", "sluice"),
                ("SLUICE_LEDGER__CQL__PASSWORD", "123456"),
            ]),
        )
        .expect("a numeric-looking password is a string");
        assert!(!format!("{with_password:?}").contains("123456"));
        let err = Config::load(
            Some(&path),
            env(&[("SLUICE_LEDGER__CQL__KEYSPACE", "Bad-Name")]),
        )
        .expect_err("a bad keyspace");
        assert!(err.to_string().contains("ledger.cql"), "{err}");
        let err = Config::load(
            Some(&path),
            env(&[("SLUICE_BUS__KAFKA__BROKERS", "a:1,,b:2")]),
        )
        .expect_err("bad brokers");
        assert!(err.to_string().contains("bus.kafka"), "{err}");
    }

    #[test]
    fn tls_and_sasl_settings_load_from_files_and_never_show_their_secrets() {
        let dir = tempfile::tempdir().expect("dir");
        let secret_file = dir.path().join("kafka-password");
        std::fs::write(&secret_file, "kafka-s3cret\n").expect("write");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").expect("write");
        let (cert, key) = (dir.path().join("api.crt"), dir.path().join("api.key"));
        std::fs::write(&cert, "").expect("write");
        std::fs::write(&key, "").expect("write");
        let path = dir.path().join("sluice.toml");
        let text = format!(
            "[bus]\nkind = \"kafka\"\n[bus.kafka]\nsecurity_protocol = \"sasl_ssl\"\n\
             [bus.kafka.sasl]\nmechanism = \"scram_sha_512\"\nusername = \"sluice\"\n\
             password = {{ file = {secret:?} }}\n[bus.kafka.tls]\nca_file = {ca:?}\n\
             [ledger]\nkind = \"cql\"\n[ledger.cql]\nusername = \"sluice\"\n\
             password = {{ env = \"SLUICE_TEST_CQL_SECRET\" }}\n\
             [ledger.cql.tls]\nenabled = true\nca_file = {ca:?}\n\
             [producer.tls]\ncert_file = {cert:?}\nkey_file = {key:?}\n",
            secret = secret_file.display().to_string(),
            ca = ca.display().to_string(),
            cert = cert.display().to_string(),
            key = key.display().to_string(),
        );
        std::fs::write(&path, text).expect("write");
        let lookup = |var: &str| (var == "SLUICE_TEST_CQL_SECRET").then(|| "cql-s3cret".to_owned());
        let config = Config::load_with(Some(&path), env(&[]), &lookup).expect("valid");
        let kafka = config.bus.kafka_config();
        let sasl = kafka.security.sasl.as_ref().expect("sasl");
        assert_eq!(
            sasl.password.expose(),
            "kafka-s3cret",
            "the file's line break is dropped"
        );
        assert_eq!(
            config.ledger.cql.password.as_ref().map(|p| p.expose()),
            Some("cql-s3cret")
        );
        assert!(config.producer.tls.is_some());
        let shown = format!(
            "{config:?} {kafka:?} {}",
            toml::to_string(&config).expect("serializes")
        );
        for secret in ["kafka-s3cret", "cql-s3cret"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }

        // Bad input names the field.
        let err = Config::load_with(
            Some(&path),
            env(&[("SLUICE_BUS__KAFKA__SECURITY_PROTOCOL", "ssl")]),
            &lookup,
        )
        .expect_err("SASL settings without a SASL protocol");
        assert!(
            err.to_string().contains("bus.kafka.security_protocol"),
            "{err}"
        );
        let err = Config::load_with(
            Some(&path),
            env(&[("SLUICE_BUS__KAFKA__TLS__CA_FILE", "/nowhere/ca.pem")]),
            &lookup,
        )
        .expect_err("a CA file that is not there");
        assert!(err.to_string().contains("bus.kafka.tls.ca_file"), "{err}");
        let err = Config::load_with(
            Some(&path),
            env(&[(
                "SLUICE_LEDGER__CQL__TLS__CERT_FILE",
                cert.to_str().expect("utf-8"),
            )]),
            &lookup,
        )
        .expect_err("a client certificate without its key");
        assert!(err.to_string().contains("ledger.cql.tls.key_file"), "{err}");
        let err = Config::load_with(
            Some(&path),
            env(&[("SLUICE_PRODUCER__TLS__KEY_FILE", "/nowhere/key.pem")]),
            &lookup,
        )
        .expect_err("an API key that is not there");
        assert!(err.to_string().contains("producer.tls.key_file"), "{err}");
        let err = Config::load_with(Some(&path), env(&[]), &|_| None)
            .expect_err("the variable holding the CQL password is unset");
        assert!(err.to_string().contains("ledger.cql.password"), "{err}");
        let err = Config::load_with(
            Some(&path),
            env(&[("SLUICE_BUS__KAFKA__EXTRA__SASL.PASSWORD", "x")]),
            &lookup,
        )
        .expect_err("extra may not set what the typed settings own");
        assert!(err.to_string().contains("sasl.password"), "{err}");
        assert!(!err.to_string().contains("kafka-s3cret"), "{err}");
    }

    #[test]
    fn the_shipped_distributed_example_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/distributed.toml");
        let config = Config::load(Some(&path), env(&[])).expect("deploy/distributed.toml");
        assert_eq!(config.ledger.kind, LedgerKind::Cql);
        assert_eq!(config.bus.kind, BusKind::Kafka);
        assert!(!config.ledger.cql.migrate_on_start);
    }

    #[test]
    fn the_kubernetes_config_validates_with_tokens_from_the_environment() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../k8s/config/sluice.toml");
        let tokens = "[{ name = \"ops\", role = \"admin\", token_sha256 = \"\
                      9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\" }]";
        let config = Config::load(Some(&path), env(&[("SLUICE_AUTH__TOKENS", tokens)]))
            .expect("k8s/config/sluice.toml with SLUICE_AUTH__TOKENS");
        assert_eq!(config.auth.tokens.len(), 1);
        let err = Config::load(Some(&path), env(&[])).expect_err("an open API on 0.0.0.0");
        assert!(err.to_string().contains("auth.tokens"), "{err}");
    }
}
