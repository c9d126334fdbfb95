//! The Sluice bus on Apache Kafka (docs/architecture.md, "Services and topics"): [`KafkaBus`]
//! implements the [`Bus`](sluice_bus::Bus) port with rdkafka and its bundled librdkafka, and passes
//! the bus contract suite against a real broker.
//!
//! * [`config`] — [`KafkaConfig`], validated once, and the librdkafka properties it sets.
//! * [`security`] — [`KafkaSecurity`]: TLS and SASL (PLAIN, SCRAM, OAUTHBEARER with OIDC
//!   client credentials) of every client.
//! * `probe` — the first contact, which reports an authentication or TLS failure by name.
//! * [`membership`] — [`GroupProtocol`] (cooperative rebalancing by default) and static
//!   membership from [`KafkaConfig::instance_id`].
//! * `bus` — [`KafkaBus`]: the producer, subscriptions.
//! * `topics` — the topics at start, as [`KafkaConfig::create_topics`] says.
//! * [`consumer`] — one group member: its driver task, the per-partition hand-out and the
//!   rebalance and shutdown handling. Its module documentation explains the hard cases.
//!
//! # Guarantees and how they are kept
//!
//! * **Topics** `<prefix>requested|unknown|compensate|events|dlq` are looked up at start and,
//!   as [`KafkaConfig::create_topics`] says, created through the admin API when absent (an
//!   existing one is kept as it is) with the configured partition count and replication
//!   factor, or required to exist. With the topics present no CreateTopics is sent, so a user
//!   holding only READ, WRITE and DESCRIBE can run the services.
//! * **Consumer groups** are named `<group prefix><role>` ([`sluice_bus::Group`]); the group
//!   prefix is derived from the topic prefix unless configured.
//! * **Partitioning** is librdkafka's `murmur2_random`: a keyed message goes to
//!   [`partition_for`](sluice_bus::partition_for)`(key, partitions)`, the partition the Java
//!   client picks.
//! * **Publishing** uses an idempotent producer with `acks=all`: [`Bus::publish`] returns
//!   once every in-sync replica has the message, and retries neither duplicate nor reorder
//!   messages. Headers travel as Kafka headers, in order. A message larger than
//!   [`KafkaConfig::max_message_bytes`] is refused before anything is sent.
//! * **Consuming** is at-least-once with per-partition order: a member is handed a
//!   partition's next message only after it acknowledged the previous one. Automatic offset
//!   store is off; an acknowledgement stores the offset after the message, librdkafka commits
//!   stored offsets periodically, and the bus commits them synchronously when partitions are
//!   revoked and when a member leaves. An acknowledgement after the partition moved is refused
//!   with [`BusError::Revoked`](sluice_bus::BusError::Revoked).
//! * **Dead letters** are not the bus's job: the services publish them to `Topic::Dlq` with the
//!   reason in a header (`sluice_runtime::messages`).
//!
//! [`Bus::publish`]: sluice_bus::Bus::publish

#[cfg(feature = "librdkafka")]
mod access;
#[cfg(feature = "librdkafka")]
mod bus;
pub mod config;
#[cfg(feature = "librdkafka")]
pub mod consumer;
#[cfg(feature = "librdkafka")]
mod lag;
pub mod membership;
#[cfg(feature = "librdkafka")]
mod probe;
pub mod security;
#[cfg(feature = "librdkafka")]
mod topics;
#[cfg(feature = "librdkafka")]
mod watch;

#[cfg(feature = "librdkafka")]
pub use bus::KafkaBus;
pub use config::{CreateTopics, KafkaConfig};
pub use membership::GroupProtocol;
pub use security::{
    KafkaOauth, KafkaSasl, KafkaSecurity, KafkaTls, SaslMechanism, SecurityProtocol,
};
