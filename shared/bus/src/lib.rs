//! The message bus: how the four services hand work to each other (docs/architecture.md,
//! "Services and topics").
//!
//! * [`Bus`] — the port: publish keyed messages, subscribe as a member of a consumer group.
//! * [`partitioner`] — Kafka's default partitioner for keyed messages (murmur2), so Java, Go
//!   and Rust producers put a run on the same partition.
//! * [`embedded`] — the in-process implementation behind `sluice dev`.
//! * `contract` — the one contract suite every implementation must pass; compiled for tests
//!   only (the `contract` feature, which the implementations' tests turn on as a
//!   dev-dependency).
//!
//! # The contract
//!
//! A topic ([`Topic`], named under a configurable prefix, default `sluice.`) has a fixed number
//! of partitions. A message's partition is [`partition_for`]`(key, partitions)`; every message
//! is keyed by its run id, so all of a run's messages share one partition and keep the order
//! they were published in.
//!
//! A subscription is a member of a consumer group on one topic. The group's members split the
//! partitions between them — each partition is owned by one member at a time, and ownership
//! moves (a rebalance) when members join or leave. Different groups are independent: each gets
//! every message.
//!
//! Delivery is at-least-once and ordered per partition: a member is handed a partition's next
//! message only after it acknowledged the previous one, so a run's messages are processed one
//! after another while different partitions proceed concurrently. A message that was handed
//! out but not acknowledged when its partition moved (the member left, or a rebalance gave the
//! partition to another member) is delivered again to the partition's next owner. Handlers
//! must therefore be idempotent, which they are in Sluice: every one is a compare-and-set
//! against the ledger, and the ledger — not the bus — is the source of truth.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

#[cfg(any(test, feature = "contract"))]
pub mod contract;
pub mod embedded;
mod error;
pub mod partitioner;

pub use embedded::{EmbeddedBus, EmbeddedConfig};
pub use error::BusError;
pub use partitioner::{murmur2, partition_for};

/// The topic prefix used unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "sluice.";

/// Longest topic name Kafka accepts.
pub const MAX_TOPIC_NAME_LEN: usize = 249;

/// The topics of the pipeline (docs/architecture.md, "Services and topics").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Topic {
    /// Dispatch requests: producer and reconciler → dispatcher.
    Requested,
    /// Commands whose outcome is ambiguous: dispatcher → reconciler.
    Unknown,
    /// Run rollbacks and duplicate clean-ups: reconciler → compensator.
    Compensate,
    /// Lifecycle events (CloudEvents) for outside consumers and long-polling producers.
    Events,
    /// Messages that failed to parse or validate, with the reason; never silently dropped.
    Dlq,
}

impl Topic {
    /// Every topic, in a fixed order.
    pub const ALL: [Self; 5] = [
        Self::Requested,
        Self::Unknown,
        Self::Compensate,
        Self::Events,
        Self::Dlq,
    ];

    /// The name without the prefix.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Unknown => "unknown",
            Self::Compensate => "compensate",
            Self::Events => "events",
            Self::Dlq => "dlq",
        }
    }

    /// The full topic name under `prefix`, e.g. `sluice.requested`.
    pub fn name(self, prefix: &str) -> String {
        format!("{prefix}{}", self.suffix())
    }

    /// The position in [`Topic::ALL`], for implementations that keep per-topic state in arrays.
    pub fn index(self) -> usize {
        match self {
            Self::Requested => 0,
            Self::Unknown => 1,
            Self::Compensate => 2,
            Self::Events => 3,
            Self::Dlq => 4,
        }
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

/// Checks a topic prefix: Kafka topic names are `[A-Za-z0-9._-]`, at most 249 characters.
pub fn validate_prefix(prefix: &str) -> Result<(), BusError> {
    let longest = Topic::ALL
        .iter()
        .map(|topic| topic.suffix().len())
        .max()
        .unwrap_or_default();
    if prefix.len() + longest > MAX_TOPIC_NAME_LEN {
        return Err(BusError::InvalidConfig {
            key: "prefix",
            why: format!(
                "{prefix:?} makes topic names longer than {MAX_TOPIC_NAME_LEN} characters"
            ),
        });
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(BusError::InvalidConfig {
            key: "prefix",
            why: format!("{prefix:?} may contain only letters, digits and . _ -"),
        });
    }
    Ok(())
}

/// A header: a name and an opaque value. Names may repeat; order is kept.
pub type Header = (String, Vec<u8>);

/// One message as published and as delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: Topic,
    /// The partitioning key: the run id (a DLQ message may carry whatever key arrived).
    pub key: String,
    pub payload: Vec<u8>,
    pub headers: Vec<Header>,
}

impl Message {
    /// The value of the last header named `name` (Kafka's `lastHeader`).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_slice())
    }
}

/// Where a published message was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    pub partition: u32,
    pub offset: u64,
}

/// Acknowledges one delivery: the implementation side of [`Delivery::ack`].
#[async_trait]
pub trait Acknowledge: Send + Sync + fmt::Debug + 'static {
    /// Commits the delivery's offset for its group. See [`Delivery::ack`] for the contract.
    async fn ack(&self) -> Result<(), BusError>;

    /// [`Acknowledge::ack`], and the admission room the message was published under (see
    /// [`Bus::admit`]) handed to the caller instead of given back. A bus without an admission
    /// bound hands over no room.
    async fn ack_keeping_room(&self) -> Result<Room, BusError> {
        self.ack().await.map(|()| Room::none())
    }
}

/// Messages a bus handle published and fetched, per topic (indexed by [`Topic::index`]),
/// since it was made: what a benchmark divides by its effects to count the bus's work per
/// effect. Fetched counts every message a member of this handle received from the bus (on
/// Kafka, from the brokers), handed out or not.
#[derive(Debug, Default)]
pub struct Traffic {
    published: [std::sync::atomic::AtomicU64; 5],
    fetched: [std::sync::atomic::AtomicU64; 5],
}

/// A reading of [`Traffic`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficCounts {
    pub published: [u64; 5],
    pub fetched: [u64; 5],
}

impl Traffic {
    pub fn count_published(&self, topic: Topic) {
        self.published[topic.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn count_fetched(&self, topic: Topic) {
        self.fetched[topic.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn read(&self) -> TrafficCounts {
        let load = |counts: &[std::sync::atomic::AtomicU64; 5]| {
            std::array::from_fn(|i| counts[i].load(std::sync::atomic::Ordering::Relaxed))
        };
        TrafficCounts {
            published: load(&self.published),
            fetched: load(&self.fetched),
        }
    }
}

/// Room in a bus's admission bound, taken over from an acknowledged delivery
/// ([`Delivery::ack_keeping_room`]): given back when dropped. A consumer that queues a message
/// after acknowledging it holds its room until the work is done, so what waits in its queue
/// still counts toward the bound new submissions wait for.
#[derive(Debug, Default)]
pub struct Room(Option<Arc<tokio::sync::Semaphore>>);

impl Room {
    /// No room: the bus has no bound, or the message was not published under an admission.
    pub fn none() -> Self {
        Self(None)
    }

    /// For implementations: one unit of `bound`, given back to it when dropped.
    pub fn of(bound: Arc<tokio::sync::Semaphore>) -> Self {
        Self(Some(bound))
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        if let Some(bound) = self.0.take() {
            bound.add_permits(1);
        }
    }
}

/// A message handed to one member of a group, to be acknowledged once handled.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Shared with the bus's log and with clones of this delivery (a handler retried with a
    /// clone copies no payload).
    pub message: Arc<Message>,
    pub partition: u32,
    pub offset: u64,
    acknowledge: Arc<dyn Acknowledge>,
}

impl Delivery {
    /// For implementations: a delivery acknowledged through `acknowledge`.
    pub fn new(
        message: impl Into<Arc<Message>>,
        partition: u32,
        offset: u64,
        acknowledge: Arc<dyn Acknowledge>,
    ) -> Self {
        Self {
            message: message.into(),
            partition,
            offset,
            acknowledge,
        }
    }

    pub fn key(&self) -> &str {
        &self.message.key
    }

    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    /// Commits this message for the group: it will not be delivered to the group again, and
    /// the member is handed the partition's next message.
    ///
    /// Acknowledge only after the work the message asked for is durable (the ledger write).
    /// Acknowledging twice is harmless. If the partition moved to another member since the
    /// message was handed out, the acknowledgement is refused with [`BusError::Revoked`] and
    /// the message is (or was) delivered to the new owner; a handler may log that and go on,
    /// since its ledger write is a compare-and-set that the redelivery will find done.
    pub async fn ack(&self) -> Result<(), BusError> {
        // Every bus's acknowledgements pass here.
        sluice_faults::point!("bus.ack.pre");
        let acked = self.acknowledge.ack().await;
        sluice_faults::point!("bus.ack.post");
        acked
    }

    /// [`Delivery::ack`] for a consumer that queues the message to handle it later: its
    /// admission room (see [`Bus::admit`]) is not given back but handed over, to be dropped
    /// when the work is done. Acknowledged first, the partition's next message can be handed
    /// out while this one waits; the message is then lost with the consumer's process, so it
    /// fits only work the ledger brings back when due.
    pub async fn ack_keeping_room(&self) -> Result<Room, BusError> {
        sluice_faults::point!("bus.ack.pre");
        let acked = self.acknowledge.ack_keeping_room().await;
        sluice_faults::point!("bus.ack.post");
        acked
    }
}

/// The implementation side of a [`Subscription`].
#[async_trait]
pub trait DeliverySource: Send + Sync + fmt::Debug + 'static {
    /// The next delivery; `None` once the bus is closed. Must be cancel-safe.
    async fn next(&mut self) -> Option<Delivery>;

    /// The partitions this member owns now.
    fn assignment(&self) -> Vec<u32>;
}

/// One member of a consumer group on one topic. Dropping it leaves the group: its partitions
/// move to the remaining members, with its unacknowledged messages.
#[derive(Debug)]
pub struct Subscription {
    topic: Topic,
    group: String,
    member: String,
    source: Box<dyn DeliverySource>,
}

impl Subscription {
    /// For implementations: a subscription fed by `source`.
    pub fn new(
        topic: Topic,
        group: impl Into<String>,
        member: impl Into<String>,
        source: Box<dyn DeliverySource>,
    ) -> Self {
        Self {
            topic,
            group: group.into(),
            member: member.into(),
            source,
        }
    }

    /// Waits for the next message of a partition this member owns whose previous message was
    /// acknowledged. Returns `None` once the bus is closed.
    ///
    /// Cancel-safe: dropping the future (in a `select!` with a shutdown signal, a timeout)
    /// loses nothing — a message is handed out only when the future completes.
    pub async fn next(&mut self) -> Option<Delivery> {
        self.source.next().await
    }

    /// The same as [`Delivery::ack`].
    pub async fn ack(&self, delivery: &Delivery) -> Result<(), BusError> {
        delivery.ack().await
    }

    /// The partitions this member owns now (it changes on rebalances).
    pub fn assignment(&self) -> Vec<u32> {
        self.source.assignment()
    }

    pub fn topic(&self) -> Topic {
        self.topic
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub fn member(&self) -> &str {
        &self.member
    }
}

/// The consumer groups of the pipeline. On a bus each is named `<group prefix><role>`
/// ([`Bus::group_id`]): a second install on the same cluster, with another prefix, never joins
/// or reads the first one's groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// All dispatchers, on `requested`: the group whose queue a producer reads for admission.
    Dispatchers,
    /// All reconcilers, on `unknown`.
    Reconcilers,
    /// All compensators, on `compensate`.
    Compensators,
    /// The reconcilers' webhook intake, on `events`.
    Webhooks,
}

impl Group {
    /// Every group, in a fixed order.
    pub const ALL: [Self; 4] = [
        Self::Dispatchers,
        Self::Reconcilers,
        Self::Compensators,
        Self::Webhooks,
    ];

    /// The name after the group prefix.
    pub fn role(self) -> &'static str {
        match self {
            Self::Dispatchers => "dispatcher",
            Self::Reconcilers => "reconciler",
            Self::Compensators => "compensator",
            Self::Webhooks => "webhooks",
        }
    }

    /// The group id under `group_prefix`, e.g. `sluice-dispatcher`.
    pub fn id(self, group_prefix: &str) -> String {
        format!("{group_prefix}{}", self.role())
    }
}

/// The group prefix of an install whose topics are named under `topic_prefix`, unless one is
/// configured: the topic prefix with a trailing `.`, `_` or `-` turned into `-` (one is added
/// when it ends in neither), so `sluice.` keeps the groups of earlier releases
/// (`sluice-dispatcher`, …) and `staging.` gives `staging-dispatcher`, …; an empty topic prefix
/// gives `sluice-`.
pub fn default_group_prefix(topic_prefix: &str) -> String {
    let stem = topic_prefix
        .strip_suffix(['.', '_', '-'])
        .unwrap_or(topic_prefix);
    if stem.is_empty() {
        "sluice-".to_owned()
    } else {
        format!("{stem}-")
    }
}

/// Checks a group prefix: the group ids it makes must be valid ([`validate_group`]) and, so
/// that ACLs on the prefix work, use only letters, digits and `. _ -`.
pub fn validate_group_prefix(prefix: &str) -> Result<(), BusError> {
    let invalid = |why: String| BusError::InvalidConfig {
        key: "group_prefix",
        why,
    };
    if prefix.is_empty() {
        return Err(invalid(
            "must not be empty: the groups of two installs on one cluster would be the same \
             (leave it unset to derive it from the topic prefix)"
                .to_owned(),
        ));
    }
    if !prefix
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(invalid(format!(
            "{prefix:?} may contain only letters, digits and . _ -"
        )));
    }
    let longest = Group::ALL
        .iter()
        .map(|group| group.role().len())
        .max()
        .unwrap_or_default();
    if prefix.len() + longest > 255 {
        return Err(invalid(format!(
            "{prefix:?} makes group ids longer than 255 bytes"
        )));
    }
    Ok(())
}

/// The dispatchers' group id under the default prefix `sluice.` (`sluice-dispatcher`). The
/// services ask the bus for the id instead ([`Bus::group_id`]), which follows the configured
/// prefixes.
pub const DISPATCHERS: &str = "sluice-dispatcher";

/// How much of a topic a consumer group has yet to take on, as the bus last read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDepth {
    /// Messages published and not yet committed by the group, all partitions summed: what it
    /// has still to take on, and what it took on since its last commit.
    pub waiting: u64,
    /// Messages the group has committed, all partitions summed. It only rises while the group
    /// works, so two readings give the group's rate.
    pub taken: u64,
}

/// The message bus port. See the crate documentation for the delivery contract.
#[async_trait]
pub trait Bus: Send + Sync + fmt::Debug + 'static {
    /// The prefix of every topic name, e.g. `sluice.`.
    fn prefix(&self) -> &str;

    /// The bus as trace spans name it, OpenTelemetry's `messaging.system`: `kafka`, or
    /// `sluice_embedded` for the in-process bus.
    fn messaging_system(&self) -> &'static str {
        "other"
    }

    /// The full name of `topic` on this bus.
    fn topic_name(&self, topic: Topic) -> String {
        topic.name(self.prefix())
    }

    /// The prefix of the pipeline's consumer group ids; unless the bus is configured with
    /// one, [`default_group_prefix`] of the topic prefix.
    fn group_prefix(&self) -> String {
        default_group_prefix(self.prefix())
    }

    /// The id of `group` on this bus: the group prefix and the group's role.
    fn group_id(&self, group: Group) -> String {
        group.id(&self.group_prefix())
    }

    /// The number of partitions of `topic`.
    async fn partitions(&self, topic: Topic) -> Result<u32, BusError>;

    /// Appends a message to partition [`partition_for`]`(key, partitions)`. Returns once the
    /// bus has durably accepted it; messages with the same key published one after another
    /// (each awaited) are delivered in that order.
    async fn publish(
        &self,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
    ) -> Result<Published, BusError>;

    /// Waits until `topic` has room for one more *admitted* message: one published with
    /// [`Bus::publish_admitted`] that its consumers have not all handled yet. A bus without an
    /// admission bound (Kafka keeps its backlog on disk) answers at once. The room is held by
    /// the returned [`Admission`] until it is published with, or dropped.
    ///
    /// This is for new work entering the pipeline (a submission), never for a handler that
    /// publishes while it holds a delivery: the room comes back only as deliveries are handled.
    async fn admit(&self, _topic: Topic) -> Result<Admission, BusError> {
        Ok(Admission::unbounded())
    }

    /// [`Bus::publish`] under `admission`, whose room the message keeps until every group has
    /// acknowledged it.
    async fn publish_admitted(
        &self,
        admission: Admission,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
    ) -> Result<Published, BusError> {
        drop(admission);
        self.publish(topic, key, payload, headers).await
    }

    /// Joins consumer group `group` on `topic` as `member` (a name for logs). A group seen for
    /// the first time starts at the oldest message the bus still holds; a known group resumes
    /// after its last acknowledged message of each partition.
    async fn subscribe(
        &self,
        topic: Topic,
        group: &str,
        member: &str,
    ) -> Result<Subscription, BusError>;

    /// Messages published by this handle and not yet stored by the bus: how far behind the
    /// bus is, for admission (`sluice_core::load::admit`). 0 for a bus that does not queue.
    fn backlog(&self) -> u64 {
        0
    }

    /// What this handle published and fetched so far, per topic; `None` for a bus that does
    /// not count.
    fn traffic(&self) -> Option<TrafficCounts> {
        None
    }

    /// How far `group` is behind on `topic`, read from the bus itself (for a producer's
    /// admission, `sluice_core::load::admit_queue`); `None` for a bus that has no such figure
    /// (the embedded bus bounds its queue at publish instead, `Bus::admit`).
    async fn queue_depth(
        &self,
        _topic: Topic,
        _group: &str,
    ) -> Result<Option<QueueDepth>, BusError> {
        Ok(None)
    }

    /// `group`'s lag on each partition of `topic` (index: the partition), read from the bus
    /// itself: messages published and not yet committed by the group. For the
    /// `sluice_consumer_lag` metric; `None` for a bus that has no such figure.
    async fn lag_by_partition(
        &self,
        _topic: Topic,
        _group: &str,
    ) -> Result<Option<Vec<u64>>, BusError> {
        Ok(None)
    }

    /// Reads `topic` from now on, in no consumer group: every partition, from its end at the
    /// time of the call; acknowledging does nothing. For a reader that needs only what
    /// happens while it runs (a producer waking its long polls), so that starting one neither
    /// replays the topic nor leaves a group behind, whatever the number of replicas. It may
    /// miss a message published around the call. The default joins a group named after
    /// `member` (the embedded bus lives and dies with its process: there is nothing older
    /// to replay, and nothing is left behind).
    async fn watch(&self, topic: Topic, member: &str) -> Result<Subscription, BusError> {
        self.subscribe(topic, &format!("watch-{member}"), member)
            .await
    }
}

/// Room for one admitted message (see [`Bus::admit`]); dropped unused, the room is given back.
#[derive(Debug)]
pub struct Admission {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Admission {
    /// An admission of a bus without a bound.
    pub fn unbounded() -> Self {
        Self { permit: None }
    }

    /// For implementations: an admission holding `permit`.
    pub fn bounded(permit: tokio::sync::OwnedSemaphorePermit) -> Self {
        Self {
            permit: Some(permit),
        }
    }

    /// For implementations: the permit, to be forgotten once its message is stored.
    pub fn into_permit(self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.permit
    }
}

/// Checks a consumer group name: not empty, at most 255 bytes, no control characters.
pub fn validate_group(group: &str) -> Result<(), BusError> {
    let why = if group.is_empty() {
        "must not be empty"
    } else if group.len() > 255 {
        "must be at most 255 bytes"
    } else if group.chars().any(char::is_control) {
        "must not contain control characters"
    } else {
        return Ok(());
    };
    Err(BusError::InvalidGroup {
        group: group.chars().take(64).collect(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_the_design() {
        let names: Vec<String> = Topic::ALL.iter().map(|t| t.name(DEFAULT_PREFIX)).collect();
        assert_eq!(
            names,
            [
                "sluice.requested",
                "sluice.unknown",
                "sluice.compensate",
                "sluice.events",
                "sluice.dlq"
            ]
        );
        assert_eq!(Topic::Events.name("acme-"), "acme-events");
        for (i, topic) in Topic::ALL.iter().enumerate() {
            assert_eq!(topic.index(), i);
        }
    }

    #[test]
    fn prefixes_and_groups_are_checked() {
        assert!(validate_prefix("sluice.").is_ok());
        assert!(validate_prefix("").is_ok());
        assert!(matches!(
            validate_prefix("sluice/"),
            Err(BusError::InvalidConfig { key: "prefix", .. })
        ));
        assert!(validate_prefix(&"p".repeat(MAX_TOPIC_NAME_LEN)).is_err());
        assert!(validate_group("dispatcher").is_ok());
        assert!(validate_group("").is_err());
        assert!(validate_group("a\nb").is_err());
        assert!(validate_group(&"g".repeat(256)).is_err());
    }

    #[test]
    fn group_ids_follow_the_topic_prefix_unless_configured() {
        assert_eq!(
            Group::Dispatchers.id(&default_group_prefix("sluice.")),
            DISPATCHERS
        );
        let ids = |topic_prefix: &str| -> Vec<String> {
            Group::ALL
                .iter()
                .map(|group| group.id(&default_group_prefix(topic_prefix)))
                .collect()
        };
        assert_eq!(
            ids("sluice."),
            [
                "sluice-dispatcher",
                "sluice-reconciler",
                "sluice-compensator",
                "sluice-webhooks"
            ]
        );
        assert_eq!(ids("staging.")[0], "staging-dispatcher");
        assert_eq!(ids("team-a_")[1], "team-a-reconciler");
        assert_eq!(ids("acme")[2], "acme-compensator");
        assert_eq!(ids("")[0], "sluice-dispatcher");
        assert!(validate_group_prefix("staging-").is_ok());
        for bad in ["", "a b-", "x/", &"g".repeat(250)] {
            assert!(
                matches!(
                    validate_group_prefix(bad),
                    Err(BusError::InvalidConfig {
                        key: "group_prefix",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_last_header_of_a_name_wins() {
        let message = Message {
            topic: Topic::Events,
            key: "r-1".into(),
            payload: vec![],
            headers: vec![
                ("a".into(), b"1".to_vec()),
                ("b".into(), b"x".to_vec()),
                ("a".into(), b"2".to_vec()),
            ],
        };
        assert_eq!(message.header("a"), Some(&b"2"[..]));
        assert_eq!(message.header("b"), Some(&b"x"[..]));
        assert_eq!(message.header("c"), None);
    }
}
