//! The configuration of a [`KafkaBus`](crate::KafkaBus), validated once, and the librdkafka
//! properties it turns into. The properties the delivery contract depends on are set here and
//! cannot be overridden through [`KafkaConfig::extra`].

use std::collections::BTreeMap;
use std::time::Duration;

#[cfg(feature = "librdkafka")]
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use sluice_bus::{
    BusError, DEFAULT_PREFIX, default_group_prefix, validate_group_prefix, validate_prefix,
};

use crate::membership::{self, GroupProtocol};
use crate::security::{KafkaSecurity, OWNED_PROPERTIES};

/// Brokers used unless configured otherwise.
pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";
/// Partitions per topic unless configured otherwise (the embedded bus's default too).
pub const DEFAULT_PARTITIONS: u32 = 8;
/// Most partitions a topic may be created with.
pub const MAX_PARTITIONS: u32 = 10_000;
/// Largest message accepted unless configured otherwise, counting key, payload and header
/// names and values: librdkafka's default `message.max.bytes`, which a broker with default
/// settings accepts once the record batch framing is added.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_000_000;
/// Largest `max_message_bytes` allowed.
pub const MAX_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Framing a record batch adds around a message's key, payload and headers, with room to
/// spare; added to `max_message_bytes` for librdkafka's own limit and the topics' limit so that
/// neither refuses a message this bus accepted.
#[cfg(feature = "librdkafka")]
const FRAMING_BYTES: usize = 16 * 1024;

/// librdkafka properties that [`KafkaConfig::extra`] may not set: they are what makes the bus
/// keep its contract (partitioning, durability, offsets stored only on acknowledgement, a new
/// group starting at the oldest message), or they have their own field.
const RESERVED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set `brokers` instead"),
    ("metadata.broker.list", "set `brokers` instead"),
    ("client.id", "set `client_id` instead"),
    ("group.id", "the group is given to `subscribe`"),
    ("message.max.bytes", "set `max_message_bytes` instead"),
    (
        "partitioner",
        "murmur2_random keeps partitions equal to the Java client's",
    ),
    (
        "enable.idempotence",
        "the producer must be idempotent (no duplicates or reordering on retry)",
    ),
    ("acks", "every publish waits for all in-sync replicas"),
    (
        "request.required.acks",
        "every publish waits for all in-sync replicas",
    ),
    (
        "enable.auto.offset.store",
        "offsets are stored only when a delivery is acknowledged",
    ),
    (
        "enable.auto.commit",
        "stored (acknowledged) offsets are committed automatically and on rebalance",
    ),
    (
        "auto.offset.reset",
        "a new group starts at the oldest message (the bus contract)",
    ),
    (
        "enable.partition.eof",
        "end-of-partition events are not deliveries",
    ),
];

/// Whether a service creates the bus's topics at start (`bus.kafka.create_topics`).
///
/// A broker with an authorizer answers CreateTopics from a user without the `CREATE`
/// permission with `TOPIC_AUTHORIZATION_FAILED` even when the topic exists, so only `always`
/// needs that permission when the topics are there; `sluice migrate` creates missing topics
/// whatever this says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CreateTopics {
    /// Ask the broker to create every topic at each start (an existing one is kept): the
    /// user needs `CREATE` on the topics.
    Always,
    /// Read the metadata first and create only the topics that are missing: with the topics
    /// present, the user needs no `CREATE`.
    #[default]
    IfMissing,
    /// Never create: a missing topic, or one whose partition count differs from
    /// `bus.partitions`, stops the service with an error naming the topic. For platforms that
    /// create topics with their own tooling (Strimzi `KafkaTopic`, Terraform).
    Never,
}

impl CreateTopics {
    /// The value as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "always",
            Self::IfMissing => "if_missing",
            Self::Never => "never",
        }
    }
}

/// How to reach Kafka and lay out the topics.
///
/// Every field is checked by [`KafkaConfig::validate`], which names the offending key. `Debug`
/// names the `extra` properties but not their values, and hides the passwords of `security`.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port` separated by commas.
    pub brokers: String,
    /// Prefix of every topic name (`sluice.` gives `sluice.requested`, …).
    pub prefix: String,
    /// Partitions of each topic created at start. A topic that already exists keeps its own
    /// count, which [`Bus::partitions`](sluice_bus::Bus::partitions) reports.
    pub partitions: u32,
    /// Replicas of each topic created at start; `None` takes the broker's
    /// `default.replication.factor`. Use 1 against a single broker.
    pub replication_factor: Option<u16>,
    /// `min.insync.replicas` of each topic created at start: with `acks=all`, a publish is
    /// acknowledged once this many replicas have it, and refused when fewer are in sync.
    /// `None` takes the broker's default. At most `replication_factor` when both are set.
    pub min_insync_replicas: Option<u16>,
    /// Client id reported to the brokers; consumers add their member name to it.
    pub client_id: String,
    /// Whether [`KafkaBus::connect`](crate::KafkaBus::connect) creates topics.
    pub create_topics: CreateTopics,
    /// Prefix of the pipeline's consumer group ids (`<prefix>dispatcher`, …); `None` derives
    /// it from the topic prefix ([`default_group_prefix`]).
    pub group_prefix: Option<String>,
    /// Largest message accepted, counting key, payload, header names and values; a larger one
    /// is refused with [`BusError::MessageTooLarge`] before anything is sent.
    pub max_message_bytes: usize,
    /// How long [`KafkaBus::connect`](crate::KafkaBus::connect) waits for the brokers to
    /// answer and the topics to be ready.
    pub start_timeout: Duration,
    /// TLS and SASL for every client (`security.protocol`, `sasl.*`, `ssl.*`).
    pub security: KafkaSecurity,
    /// Further librdkafka properties for the producer and every consumer (e.g.
    /// `session.timeout.ms`, `linger.ms`). A property meant for only one of them is ignored by
    /// the other with a warning in the log. Those the contract depends on, and those
    /// `security` sets, are refused.
    pub extra: BTreeMap<String, String>,
    /// How consumers rebalance (`crate::membership`): cooperative by default.
    pub group_protocol: GroupProtocol,
    /// Static membership: each consumer's `group.instance.id` is derived from this (a pod
    /// name), so a restart within the session timeout keeps its partitions without a
    /// rebalance. `None`: dynamic members.
    pub instance_id: Option<String>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("prefix", &self.prefix)
            .field("partitions", &self.partitions)
            .field("replication_factor", &self.replication_factor)
            .field("client_id", &self.client_id)
            .field("create_topics", &self.create_topics)
            .field("group_prefix", &self.group_prefix)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("start_timeout", &self.start_timeout)
            .field("security", &self.security)
            .field("extra", &self.extra.keys().collect::<Vec<_>>())
            .field("group_protocol", &self.group_protocol)
            .field("instance_id", &self.instance_id)
            .finish()
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: DEFAULT_BROKERS.to_owned(),
            prefix: DEFAULT_PREFIX.to_owned(),
            partitions: DEFAULT_PARTITIONS,
            replication_factor: None,
            min_insync_replicas: None,
            client_id: "sluice".to_owned(),
            create_topics: CreateTopics::default(),
            group_prefix: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            start_timeout: Duration::from_secs(30),
            security: KafkaSecurity::default(),
            extra: BTreeMap::new(),
            group_protocol: GroupProtocol::default(),
            instance_id: None,
        }
    }
}

fn invalid(key: &'static str, why: impl Into<String>) -> BusError {
    BusError::InvalidConfig {
        key,
        why: why.into(),
    }
}

impl KafkaConfig {
    /// The prefix of the pipeline's consumer group ids: the configured one, or the one derived
    /// from the topic prefix.
    pub fn group_prefix(&self) -> String {
        self.group_prefix
            .clone()
            .unwrap_or_else(|| default_group_prefix(&self.prefix))
    }

    /// Checks every field; the error names the key and says what is expected.
    pub fn validate(&self) -> Result<(), BusError> {
        let brokers: Vec<&str> = self.brokers.split(',').map(str::trim).collect();
        if brokers.iter().any(|b| b.is_empty()) {
            return Err(invalid(
                "brokers",
                format!(
                    "{:?} must list host:port pairs separated by commas",
                    self.brokers
                ),
            ));
        }
        if let Some(bad) = brokers
            .iter()
            .find(|b| b.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(invalid(
                "brokers",
                format!("{bad:?} is not a host:port pair"),
            ));
        }
        validate_prefix(&self.prefix)?;
        if let Some(prefix) = &self.group_prefix {
            validate_group_prefix(prefix)?;
        }
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(invalid(
                "partitions",
                format!("must be 1 to {MAX_PARTITIONS}, got {}", self.partitions),
            ));
        }
        if self.replication_factor == Some(0) {
            return Err(invalid(
                "replication_factor",
                "must be at least 1 (or unset for the broker's default)",
            ));
        }
        match (self.min_insync_replicas, self.replication_factor) {
            (Some(0), _) => {
                return Err(invalid(
                    "min_insync_replicas",
                    "must be at least 1 (or unset for the broker's default)",
                ));
            }
            (Some(min), Some(rf)) if min > rf => {
                return Err(invalid(
                    "min_insync_replicas",
                    format!(
                        "{min} is more than replication_factor {rf}: no publish could be acknowledged"
                    ),
                ));
            }
            _ => {}
        }
        if self.client_id.is_empty()
            || !self
                .client_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid(
                "client_id",
                format!(
                    "{:?} must be non-empty letters, digits and . _ -",
                    self.client_id
                ),
            ));
        }
        if self.max_message_bytes == 0 || self.max_message_bytes > MAX_MAX_MESSAGE_BYTES {
            return Err(invalid(
                "max_message_bytes",
                format!(
                    "must be 1 to {MAX_MAX_MESSAGE_BYTES}, got {}",
                    self.max_message_bytes
                ),
            ));
        }
        if self.start_timeout.is_zero() {
            return Err(invalid("start_timeout", "must be longer than zero"));
        }
        for (name, value) in &self.extra {
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    "extra",
                    format!("{name:?} is not a librdkafka property name"),
                ));
            }
            if let Some((_, why)) = RESERVED
                .iter()
                .chain(OWNED_PROPERTIES)
                .chain(membership::OWNED_PROPERTIES)
                .find(|(reserved, _)| reserved == name)
            {
                return Err(invalid(
                    "extra",
                    format!("`{name}` may not be set here: {why}"),
                ));
            }
            if value.chars().any(char::is_control) {
                return Err(invalid(
                    "extra",
                    format!("the value of `{name}` contains control characters"),
                ));
            }
        }
        membership::validate(self)?;
        self.security.validate()
    }

    #[cfg(feature = "librdkafka")]
    /// librdkafka's limit on one message and the topics' `max.message.bytes`: ours plus the
    /// record batch framing, so that only this bus's own check refuses a message.
    pub(crate) fn wire_max_message_bytes(&self) -> usize {
        self.max_message_bytes + FRAMING_BYTES
    }

    #[cfg(feature = "librdkafka")]
    /// What every client shares: the brokers, the security settings, then `extra`.
    fn base(&self, client_id: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.brokers)
            .set("client.id", client_id);
        self.security.apply(&mut config);
        for (name, value) in &self.extra {
            config.set(name, value);
        }
        config
    }

    #[cfg(feature = "librdkafka")]
    /// The producer: idempotent, `acks=all`, Kafka's murmur2 partitioner.
    pub(crate) fn producer(&self) -> ClientConfig {
        let mut config = self.base(&self.client_id);
        config
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("partitioner", "murmur2_random")
            .set(
                "message.max.bytes",
                self.wire_max_message_bytes().to_string(),
            );
        config
    }

    #[cfg(feature = "librdkafka")]
    /// The admin client that creates (and in tests deletes) the topics.
    pub(crate) fn admin(&self) -> ClientConfig {
        self.base(&format!("{}-admin", self.client_id))
    }

    #[cfg(feature = "librdkafka")]
    /// The client that reads the topics' metadata at start: it never asks the broker to
    /// create a topic it names (librdkafka's producers do by default, which on a broker with
    /// `auto.create.topics.enable` would make a missing topic with the broker's defaults).
    pub(crate) fn metadata_reader(&self) -> ClientConfig {
        let mut config = self.base(&format!("{}-admin", self.client_id));
        config.set("allow.auto.create.topics", "false");
        config
    }

    #[cfg(feature = "librdkafka")]
    /// A consumer in `group`: offsets are stored by the bus when a delivery is acknowledged,
    /// and librdkafka commits what was stored (every second, and on revoke and close); the bus
    /// also commits synchronously on revoke and close. Every second rather than librdkafka's
    /// five: the committed offsets are what a producer's admission reads as the group's queue
    /// (`lag.rs`), and each second between commits counts a second of finished work as waiting.
    /// It costs one offset commit per member and second.
    ///
    /// `instance` is the member's `group.instance.id` (static membership), if any.
    pub(crate) fn consumer(
        &self,
        group: &str,
        member: &str,
        instance: Option<&str>,
    ) -> ClientConfig {
        let member: String = member
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let mut config = self.base(&format!("{}-{member}", self.client_id));
        config
            .set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("auto.commit.interval.ms", "1000")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        for (name, value) in membership::protocol_properties(self.group_protocol) {
            config.set(*name, *value);
        }
        if self.group_protocol != GroupProtocol::Consumer
            && !self.extra.contains_key("heartbeat.interval.ms")
        {
            config.set("heartbeat.interval.ms", membership::DEFAULT_HEARTBEAT_MS);
        }
        if let Some(instance) = instance {
            config.set("group.instance.id", instance);
        }
        config
    }
}

impl KafkaConfig {
    #[cfg(feature = "librdkafka")]
    /// A reader of `group`'s committed offsets (`lag.rs`): it names the group to fetch its
    /// offsets but never subscribes, so it never joins it, and never commits.
    pub(crate) fn lag_reader(&self, group: &str) -> ClientConfig {
        let mut config = self.base(&format!("{}-lag", self.client_id));
        config
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        config
    }

    #[cfg(feature = "librdkafka")]
    /// A watcher ([`sluice_bus::Bus::watch`]): assigned partitions, never a group member.
    /// librdkafka wants a `group.id` to `assign()`, so it gets one that no member ever joins
    /// and no offset is ever committed for (`enable.auto.commit` off): the broker never
    /// records it as a group. It is named under the group prefix, so the ACLs on the install's
    /// groups cover it and two installs never share it.
    pub(crate) fn watcher(&self, member: &str) -> ClientConfig {
        let _ = member;
        let mut config = self.base(&format!("{}-watch", self.client_id));
        config
            .set("group.id", format!("{}watch-unjoined", self.group_prefix()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "latest")
            .set("enable.partition.eof", "false");
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(config: KafkaConfig) -> &'static str {
        match config.validate() {
            Err(BusError::InvalidConfig { key, .. }) => key,
            other => panic!("expected an invalid configuration, got {other:?}"),
        }
    }

    #[test]
    fn the_default_is_valid() {
        KafkaConfig::default()
            .validate()
            .expect("the default configuration is valid");
    }

    #[test]
    fn each_bad_value_names_its_key() {
        let d = KafkaConfig::default;
        let cases = [
            (
                KafkaConfig {
                    brokers: String::new(),
                    ..d()
                },
                "brokers",
            ),
            (
                KafkaConfig {
                    brokers: "a:1,,b:2".into(),
                    ..d()
                },
                "brokers",
            ),
            (
                KafkaConfig {
                    brokers: "a :1".into(),
                    ..d()
                },
                "brokers",
            ),
            (
                KafkaConfig {
                    prefix: "no spaces".into(),
                    ..d()
                },
                "prefix",
            ),
            (
                KafkaConfig {
                    partitions: 0,
                    ..d()
                },
                "partitions",
            ),
            (
                KafkaConfig {
                    partitions: MAX_PARTITIONS + 1,
                    ..d()
                },
                "partitions",
            ),
            (
                KafkaConfig {
                    replication_factor: Some(0),
                    ..d()
                },
                "replication_factor",
            ),
            (
                KafkaConfig {
                    min_insync_replicas: Some(0),
                    ..d()
                },
                "min_insync_replicas",
            ),
            (
                KafkaConfig {
                    replication_factor: Some(2),
                    min_insync_replicas: Some(3),
                    ..d()
                },
                "min_insync_replicas",
            ),
            (
                KafkaConfig {
                    client_id: String::new(),
                    ..d()
                },
                "client_id",
            ),
            (
                KafkaConfig {
                    group_prefix: Some(String::new()),
                    ..d()
                },
                "group_prefix",
            ),
            (
                KafkaConfig {
                    group_prefix: Some("a b".into()),
                    ..d()
                },
                "group_prefix",
            ),
            (
                KafkaConfig {
                    client_id: "a/b".into(),
                    ..d()
                },
                "client_id",
            ),
            (
                KafkaConfig {
                    max_message_bytes: 0,
                    ..d()
                },
                "max_message_bytes",
            ),
            (
                KafkaConfig {
                    start_timeout: Duration::ZERO,
                    ..d()
                },
                "start_timeout",
            ),
        ];
        for (config, key) in cases {
            assert_eq!(key_of(config), key);
        }
    }

    #[test]
    fn extra_may_not_override_the_contract() {
        for name in [
            "enable.auto.offset.store",
            "enable.idempotence",
            "acks",
            "partitioner",
            "group.id",
            "auto.offset.reset",
            "security.protocol",
            "sasl.password",
            "ssl.ca.location",
        ] {
            let config = KafkaConfig {
                extra: BTreeMap::from([(name.to_owned(), "x".to_owned())]),
                ..KafkaConfig::default()
            };
            match config.validate() {
                Err(BusError::InvalidConfig { key: "extra", why }) => {
                    assert!(why.contains(name), "{why:?} names {name}");
                }
                other => panic!("{name} was accepted: {other:?}"),
            }
        }
        let fine = KafkaConfig {
            extra: BTreeMap::from([("session.timeout.ms".to_owned(), "6000".to_owned())]),
            ..KafkaConfig::default()
        };
        fine.validate().expect("tuning properties are allowed");
    }

    #[test]
    fn clients_get_the_contract_properties() {
        let config = KafkaConfig {
            extra: BTreeMap::from([("linger.ms".to_owned(), "1".to_owned())]),
            ..KafkaConfig::default()
        };
        let producer = config.producer();
        assert_eq!(producer.get("partitioner"), Some("murmur2_random"));
        assert_eq!(producer.get("enable.idempotence"), Some("true"));
        assert_eq!(producer.get("acks"), Some("all"));
        assert_eq!(producer.get("linger.ms"), Some("1"));
        let consumer = config.consumer("g", "m 1/x", None);
        assert_eq!(consumer.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(consumer.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(consumer.get("group.id"), Some("g"));
        assert_eq!(consumer.get("client.id"), Some("sluice-m_1_x"));
    }
}
