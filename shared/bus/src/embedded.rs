//! The in-process bus behind `sluice dev`: the [`Bus`] contract in memory, for one process.
//!
//! # Model
//!
//! Each topic has `partitions` logs; a log is the messages of one partition in offset order.
//! Each consumer group (per topic) keeps, per partition, its committed offset (everything
//! below it is acknowledged), its owner (one member or none), and whether the message at the
//! committed offset is in flight — handed out and not yet acknowledged. So a partition has at
//! most one message in flight per group, and that is always the one at the committed offset:
//! a partition's next message is handed out only after the previous one was acknowledged,
//! which is what keeps a run's messages in order.
//!
//! Partitions are assigned round robin over the members in the order they joined
//! (partition `p` to member `p % members`), recomputed whenever a member joins or leaves. A
//! partition that changes owner gets a new *generation* and loses its in-flight mark, so the
//! new owner is handed the unacknowledged message again (at-least-once), and an
//! acknowledgement from the old owner — which carries the old generation — is refused with
//! [`BusError::Revoked`]. A partition that keeps its owner keeps its in-flight message.
//!
//! # Concurrency
//!
//! All state sits behind one `std::sync::Mutex`. Every critical section is short, does no IO
//! and never awaits, which is the case where tokio recommends the standard mutex over its own;
//! it also lets a dropped [`Subscription`] leave its group synchronously in `Drop`, without
//! spawning a task that a shutting-down runtime might never run.
//!
//! Waiting is done with one [`Notify`] per member. A member that finds nothing to hand out
//! waits on its `Notify`; whoever changes what the member could be handed wakes it with
//! `notify_one`: a publish wakes each group's owner of the partition, an acknowledgement wakes
//! the owner, a rebalance and `close` wake every member concerned. `notify_one` stores a permit
//! when the member is not waiting yet, so a wake-up between the member's look at the state and
//! its wait is not lost; a wake-up is only a hint to look again, never a handover, so spurious
//! ones are harmless and [`Subscription::next`] stays cancel-safe. Nothing polls.
//!
//! # Memory
//!
//! The rule: a message may be dropped once every consumer group that has ever subscribed to
//! its topic has acknowledged it. After each acknowledgement the log's acknowledged prefix —
//! the offsets below the smallest committed offset of all the topic's groups on that
//! partition — is removed. Consequences, all deliberate:
//!
//! * a topic no group has subscribed to keeps everything (a group that joins later reads it
//!   all, like Kafka's `auto.offset.reset = earliest`), so every topic `sluice dev` publishes
//!   to should have a consumer — the DLQ included;
//! * a group keeps its committed offsets after its last member leaves (it may come back), so it
//!   holds back compaction meanwhile — use stable group names, not one per process start;
//! * a group that subscribes for the first time after a prefix was dropped starts at the oldest
//!   message still held.
//!
//! # Durability
//!
//! "Durably accepted" means appended to this process's log: a restart of the process loses
//! what was not yet handled. That is acceptable because the ledger, not the bus, is the source
//! of truth: the reconciler's sweeps republish commands that stall (docs/architecture.md,
//! "Delivery").

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use tokio::sync::{Notify, Semaphore};

use crate::{
    Acknowledge, Admission, Bus, BusError, DEFAULT_PREFIX, Delivery, DeliverySource, Header,
    Message, Published, Room, Subscription, Topic, partition_for, validate_group, validate_prefix,
};

/// Partitions per topic unless configured otherwise.
pub const DEFAULT_PARTITIONS: u32 = 8;
/// Most partitions a topic may have; more is no use in one process.
pub const MAX_PARTITIONS: u32 = 1024;
/// Largest message accepted (key, payload and headers), Kafka's default `message.max.bytes`,
/// so that what works in `sluice dev` also fits a default broker.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1_048_588;

/// Configuration of an [`EmbeddedBus`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedConfig {
    /// Prefix of every topic name.
    pub prefix: String,
    /// Partitions per topic, 1 to [`MAX_PARTITIONS`].
    pub partitions: u32,
    /// Admitted messages ([`Bus::publish_admitted`]) a topic holds unhandled before
    /// [`Bus::admit`] waits; `None`: no bound.
    pub admission: Option<u32>,
    /// Largest message accepted, counting key, payload and headers.
    pub max_message_bytes: usize,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
            partitions: DEFAULT_PARTITIONS,
            admission: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl EmbeddedConfig {
    pub fn validate(&self) -> Result<(), BusError> {
        validate_prefix(&self.prefix)?;
        if self.partitions == 0 || self.partitions > MAX_PARTITIONS {
            return Err(BusError::InvalidConfig {
                key: "partitions",
                why: format!("must be 1 to {MAX_PARTITIONS}, got {}", self.partitions),
            });
        }
        if self.admission == Some(0) {
            return Err(BusError::InvalidConfig {
                key: "admission",
                why: "must be at least 1 (leave it out for no bound)".into(),
            });
        }
        if self.max_message_bytes == 0 {
            return Err(BusError::InvalidConfig {
                key: "max_message_bytes",
                why: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}

/// The in-process bus. Cheap to clone; clones share the same topics and groups.
#[derive(Debug, Clone)]
pub struct EmbeddedBus {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Room for admitted messages, per topic (by [`Topic::index`]); empty without a bound.
    admission: Vec<Arc<Semaphore>>,
    prefix: String,
    partitions: u32,
    max_message_bytes: usize,
    state: Mutex<State>,
    traffic: crate::Traffic,
}

#[derive(Debug)]
struct State {
    closed: bool,
    /// Indexed by [`Topic::index`].
    topics: Vec<TopicState>,
    next_member_id: u64,
}

#[derive(Debug)]
struct TopicState {
    /// The full topic name, for errors and logs.
    name: String,
    logs: Vec<PartitionLog>,
    groups: HashMap<String, Group>,
}

/// The retained messages of one partition; `base` is the offset of the first.
#[derive(Debug, Default)]
struct PartitionLog {
    base: u64,
    records: VecDeque<Record>,
}

/// A message as stored: every group's delivery of it shares this one copy.
#[derive(Debug)]
struct Record {
    message: Arc<Message>,
    /// Published under an admission: its room comes back when it is dropped.
    admitted: bool,
}

#[derive(Debug)]
struct Group {
    /// In join order; partition `p` belongs to `members[p % members.len()]`.
    members: Vec<Member>,
    /// Indexed by partition.
    partitions: Vec<GroupPartition>,
    /// One bit per partition, set when it may have a message to hand out: set by whatever can
    /// make one deliverable (a publish, an acknowledgement, a rebalance), cleared by a member
    /// that looked and found none. A hint only — a member checks the partition before handing
    /// anything out — so a member's look costs the partitions with work, not all of them
    /// (with 256 partitions the full scan under the lock showed in profiles).
    maybe_ready: Vec<u64>,
}

#[derive(Debug)]
struct Member {
    id: u64,
    name: String,
    wake: Arc<Notify>,
}

#[derive(Debug)]
struct GroupPartition {
    /// Every offset below is acknowledged; the next to hand out.
    committed: u64,
    owner: Option<u64>,
    /// Changes with every change of owner; fences acknowledgements from a former owner.
    generation: u64,
    /// The message at `committed` was handed to the owner and is not acknowledged yet.
    in_flight: bool,
}

impl PartitionLog {
    fn end(&self) -> u64 {
        self.base + self.records.len() as u64
    }

    fn get(&self, offset: u64) -> Option<&Record> {
        let index = usize::try_from(offset.checked_sub(self.base)?).ok()?;
        self.records.get(index)
    }

    /// Drops the records below `offset`; returns how many of them were admitted.
    fn compact_to(&mut self, offset: u64) -> usize {
        if offset <= self.base {
            return 0;
        }
        let drop = usize::try_from(offset - self.base)
            .unwrap_or(usize::MAX)
            .min(self.records.len());
        let admitted = self.records.drain(..drop).filter(|r| r.admitted).count();
        self.base += drop as u64;
        // A VecDeque keeps its peak capacity; after a burst is consumed, give most of it back
        // so an idle `sluice dev` does not hold the memory of its busiest minute.
        if self.records.capacity() > 1024 && self.records.len() < self.records.capacity() / 4 {
            self.records.shrink_to(self.records.len() * 2);
        }
        admitted
    }
}

impl Group {
    fn new(logs: &[PartitionLog]) -> Self {
        Self {
            members: Vec::new(),
            maybe_ready: vec![u64::MAX; logs.len().div_ceil(64)],
            partitions: logs
                .iter()
                .map(|log| GroupPartition {
                    committed: log.base,
                    owner: None,
                    generation: 0,
                    in_flight: false,
                })
                .collect(),
        }
    }

    /// Reassigns the partitions over the current members and wakes them all. A partition that
    /// changes owner forgets its in-flight mark, so its unacknowledged message goes to the new
    /// owner; its generation changes, so the former owner's acknowledgement is refused.
    fn rebalance(&mut self) {
        let members = self.members.len();
        for (p, partition) in self.partitions.iter_mut().enumerate() {
            let owner = (members > 0).then(|| self.members[p % members].id);
            if partition.owner != owner {
                partition.owner = owner;
                partition.generation += 1;
                partition.in_flight = false;
            }
        }
        self.maybe_ready.fill(u64::MAX);
        for member in &self.members {
            member.wake.notify_one();
        }
    }

    /// Notes that partition `p` may have a message to hand out.
    fn mark(&mut self, p: usize) {
        self.maybe_ready[p / 64] |= 1 << (p % 64);
    }

    fn wake(&self, member_id: u64) {
        if let Some(member) = self.members.iter().find(|m| m.id == member_id) {
            member.wake.notify_one();
        }
    }
}

impl Shared {
    /// Locks the state. A poisoned lock is taken over rather than propagated: no critical
    /// section panics between two updates that must go together, and a panic here would
    /// otherwise turn every later `Drop` of a subscription into an abort.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl EmbeddedBus {
    pub fn new(config: EmbeddedConfig) -> Result<Self, BusError> {
        config.validate()?;
        let topics = Topic::ALL
            .iter()
            .map(|topic| TopicState {
                name: topic.name(&config.prefix),
                logs: (0..config.partitions)
                    .map(|_| PartitionLog::default())
                    .collect(),
                groups: HashMap::new(),
            })
            .collect();
        Ok(Self {
            shared: Arc::new(Shared {
                admission: config
                    .admission
                    .map(|room| {
                        Topic::ALL
                            .iter()
                            .map(|_| Arc::new(Semaphore::new(room as usize)))
                            .collect()
                    })
                    .unwrap_or_default(),
                prefix: config.prefix,
                partitions: config.partitions,
                max_message_bytes: config.max_message_bytes,
                traffic: crate::Traffic::default(),
                state: Mutex::new(State {
                    closed: false,
                    topics,
                    next_member_id: 0,
                }),
            }),
        })
    }

    /// Stores a message at the end of its partition's log and wakes the groups' owners of it.
    fn append(
        &self,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
        admitted: bool,
    ) -> Result<Published, BusError> {
        let bytes = key.len()
            + payload.len()
            + headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>();
        if bytes > self.shared.max_message_bytes {
            return Err(BusError::MessageTooLarge {
                topic: topic.name(&self.shared.prefix),
                key: key.chars().take(128).collect(),
                bytes,
                max: self.shared.max_message_bytes,
            });
        }
        let partition = partition_for(key.as_bytes(), self.shared.partitions);
        let p = partition as usize;
        self.shared.traffic.count_published(topic);

        let mut state = self.shared.lock();
        if state.closed {
            return Err(BusError::Closed);
        }
        let topic_state = &mut state.topics[topic.index()];
        let log = &mut topic_state.logs[p];
        let offset = log.end();
        log.records.push_back(Record {
            message: Arc::new(Message {
                topic,
                key: key.to_owned(),
                payload,
                headers,
            }),
            admitted,
        });
        // Each group's owner of the partition may now have something to do; if it is busy
        // with the partition's in-flight message, the wake-up only makes it look again.
        for group in topic_state.groups.values_mut() {
            group.mark(p);
            if let Some(owner) = group.partitions[p].owner {
                group.wake(owner);
            }
        }
        Ok(Published { partition, offset })
    }

    /// Shuts the bus down: every waiting and later [`Subscription::next`] returns `None`, and
    /// publishing, subscribing and acknowledging fail with [`BusError::Closed`].
    pub fn close(&self) {
        let mut state = self.shared.lock();
        state.closed = true;
        for topic in &state.topics {
            for group in topic.groups.values() {
                for member in &group.members {
                    member.wake.notify_one();
                }
            }
        }
    }

    /// Messages of `topic` held in memory, over all partitions.
    pub fn retained(&self, topic: Topic) -> usize {
        let state = self.shared.lock();
        state.topics[topic.index()]
            .logs
            .iter()
            .map(|log| log.records.len())
            .sum()
    }

    /// Messages of `topic` that `group` has not acknowledged yet (its consumer lag), or `None`
    /// if the group never subscribed.
    pub fn lag(&self, topic: Topic, group: &str) -> Option<u64> {
        self.partition_lags(topic, group)
            .map(|lags| lags.into_iter().sum())
    }

    /// [`EmbeddedBus::lag`] per partition.
    fn partition_lags(&self, topic: Topic, group: &str) -> Option<Vec<u64>> {
        let state = self.shared.lock();
        let topic = &state.topics[topic.index()];
        let group = topic.groups.get(group)?;
        Some(
            topic
                .logs
                .iter()
                .zip(&group.partitions)
                .map(|(log, partition)| log.end() - partition.committed)
                .collect(),
        )
    }
}

#[async_trait]
impl Bus for EmbeddedBus {
    fn traffic(&self) -> Option<crate::TrafficCounts> {
        Some(self.shared.traffic.read())
    }

    fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    fn messaging_system(&self) -> &'static str {
        "sluice_embedded"
    }

    /// A group that never subscribed has no partitions to be behind on yet: empty.
    async fn lag_by_partition(
        &self,
        topic: Topic,
        group: &str,
    ) -> Result<Option<Vec<u64>>, BusError> {
        Ok(Some(self.partition_lags(topic, group).unwrap_or_default()))
    }

    async fn partitions(&self, _topic: Topic) -> Result<u32, BusError> {
        Ok(self.shared.partitions)
    }

    async fn admit(&self, topic: Topic) -> Result<Admission, BusError> {
        let Some(room) = self.shared.admission.get(topic.index()) else {
            return Ok(Admission::unbounded());
        };
        // Fair: submissions are admitted in the order they asked.
        let permit = Arc::clone(room)
            .acquire_owned()
            .await
            .map_err(|_| BusError::Closed)?;
        Ok(Admission::bounded(permit))
    }

    async fn publish_admitted(
        &self,
        admission: Admission,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
    ) -> Result<Published, BusError> {
        let permit = admission.into_permit();
        sluice_faults::point!("bus.publish.pre");
        let published = self.append(topic, key, payload, headers, permit.is_some())?;
        sluice_faults::point!("bus.publish.post");
        // The room now belongs to the stored message, and comes back when it is dropped.
        if let Some(permit) = permit {
            permit.forget();
        }
        Ok(published)
    }

    async fn publish(
        &self,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
    ) -> Result<Published, BusError> {
        sluice_faults::point!("bus.publish.pre");
        let published = self.append(topic, key, payload, headers, false);
        sluice_faults::point!("bus.publish.post");
        published
    }

    async fn subscribe(
        &self,
        topic: Topic,
        group: &str,
        member: &str,
    ) -> Result<Subscription, BusError> {
        validate_group(group)?;
        let wake = Arc::new(Notify::new());
        let mut state = self.shared.lock();
        if state.closed {
            return Err(BusError::Closed);
        }
        let id = state.next_member_id;
        state.next_member_id += 1;
        let topic_state = &mut state.topics[topic.index()];
        let logs = &topic_state.logs;
        let group_state = topic_state
            .groups
            .entry(group.to_owned())
            .or_insert_with(|| Group::new(logs));
        group_state.members.push(Member {
            id,
            name: member.to_owned(),
            wake: Arc::clone(&wake),
        });
        group_state.rebalance();
        tracing::debug!(
            topic = %topic_state.name,
            group,
            member,
            members = group_state.members.len(),
            "member joined; partitions reassigned"
        );
        drop(state);

        let source = EmbeddedSource {
            shared: Arc::clone(&self.shared),
            topic,
            group: Arc::from(group),
            member_id: id,
            wake,
            cursor: 0,
        };
        Ok(Subscription::new(topic, group, member, Box::new(source)))
    }
}

/// One member's side of a subscription.
struct EmbeddedSource {
    shared: Arc<Shared>,
    topic: Topic,
    group: Arc<str>,
    member_id: u64,
    wake: Arc<Notify>,
    /// Where the next scan for a deliverable partition starts, so that a busy partition does
    /// not starve the others.
    cursor: usize,
}

impl fmt::Debug for EmbeddedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedSource")
            .field("topic", &self.topic)
            .field("group", &self.group)
            .field("member_id", &self.member_id)
            .finish_non_exhaustive()
    }
}

enum Take {
    Ready(Delivery),
    Nothing,
    Closed,
}

impl EmbeddedSource {
    /// Hands out the next message of an owned partition that has none in flight, if any.
    fn take(&mut self) -> Take {
        let mut state = self.shared.lock();
        if state.closed {
            return Take::Closed;
        }
        let TopicState { logs, groups, .. } = &mut state.topics[self.topic.index()];
        let Some(group) = groups.get_mut(&*self.group) else {
            // Groups are never removed while the bus lives; nothing to hand out otherwise.
            return Take::Nothing;
        };
        let count = group.partitions.len();
        let words = group.maybe_ready.len();
        let start = self.cursor % count;
        let mut word = start / 64;
        let mut from = !0u64 << (start % 64);
        // The marked partitions, in circular order from the cursor: the start word's bits from
        // the cursor on, the other words, then the start word's bits below the cursor.
        for step in 0..=words {
            let mut bits = group.maybe_ready[word] & from;
            if step == words {
                bits &= !(!0u64 << (start % 64));
            }
            while bits != 0 {
                let p = word * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let Some(partition) = group.partitions.get_mut(p) else {
                    // The last word's bits past the partitions.
                    break;
                };
                if partition.owner != Some(self.member_id) {
                    // Its owner's to take.
                    continue;
                }
                let record = if partition.in_flight {
                    None
                } else {
                    logs[p].get(partition.committed)
                };
                let Some(record) = record else {
                    // Nothing to hand out until an acknowledgement or a publish marks it again.
                    group.maybe_ready[word] &= !(1 << (p % 64));
                    continue;
                };
                partition.in_flight = true;
                group.maybe_ready[word] &= !(1 << (p % 64));
                self.cursor = p + 1;
                let offset = partition.committed;
                // `p` indexes a partition vector built from a `u32` count.
                let partition_id = u32::try_from(p).unwrap_or(u32::MAX);
                let ack = EmbeddedAck {
                    shared: Arc::clone(&self.shared),
                    topic: self.topic,
                    group: Arc::clone(&self.group),
                    partition: partition_id,
                    offset,
                    generation: partition.generation,
                };
                self.shared.traffic.count_fetched(self.topic);
                return Take::Ready(Delivery::new(
                    Arc::clone(&record.message),
                    partition_id,
                    offset,
                    Arc::new(ack),
                ));
            }
            word = (word + 1) % words;
            from = !0;
        }
        Take::Nothing
    }
}

#[async_trait]
impl DeliverySource for EmbeddedSource {
    async fn next(&mut self) -> Option<Delivery> {
        loop {
            match self.take() {
                Take::Ready(delivery) => return Some(delivery),
                Take::Closed => return None,
                // A wake-up that arrived since `take` released the lock is kept as a permit,
                // so this wait ends at once and the loop looks again.
                Take::Nothing => self.wake.notified().await,
            }
        }
    }

    fn assignment(&self) -> Vec<u32> {
        let state = self.shared.lock();
        let Some(group) = state.topics[self.topic.index()].groups.get(&*self.group) else {
            return Vec::new();
        };
        (0u32..)
            .zip(&group.partitions)
            .filter(|(_, partition)| partition.owner == Some(self.member_id))
            .map(|(p, _)| p)
            .collect()
    }
}

impl Drop for EmbeddedSource {
    /// Leaves the group: the member's partitions, with their unacknowledged messages, go to
    /// the remaining members (or wait for the next one to join).
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        let topic_state = &mut state.topics[self.topic.index()];
        let Some(group) = topic_state.groups.get_mut(&*self.group) else {
            return;
        };
        let Some(index) = group.members.iter().position(|m| m.id == self.member_id) else {
            return;
        };
        let member = group.members.remove(index);
        group.rebalance();
        tracing::debug!(
            topic = %topic_state.name,
            group = %self.group,
            member = %member.name,
            members = group.members.len(),
            "member left; partitions reassigned"
        );
    }
}

/// Acknowledges one delivery: remembers the generation it was handed out under.
#[derive(Debug)]
struct EmbeddedAck {
    shared: Arc<Shared>,
    topic: Topic,
    group: Arc<str>,
    partition: u32,
    offset: u64,
    generation: u64,
}

#[async_trait]
impl Acknowledge for EmbeddedAck {
    async fn ack(&self) -> Result<(), BusError> {
        self.acknowledge(false).map(drop)
    }

    async fn ack_keeping_room(&self) -> Result<Room, BusError> {
        let took = self.acknowledge(true)?;
        Ok(match self.shared.admission.get(self.topic.index()) {
            Some(bound) if took => Room::of(Arc::clone(bound)),
            _ => Room::none(),
        })
    }
}

impl EmbeddedAck {
    /// Acknowledges; with `keep_room`, takes the message's admission room off its record (so
    /// compaction does not give it back). Whether it took one.
    fn acknowledge(&self, keep_room: bool) -> Result<bool, BusError> {
        let mut state = self.shared.lock();
        if state.closed {
            return Err(BusError::Closed);
        }
        let p = self.partition as usize;
        let TopicState { name, logs, groups } = &mut state.topics[self.topic.index()];
        let not_in_flight = || BusError::NotInFlight {
            topic: name.clone(),
            group: self.group.to_string(),
            partition: self.partition,
            offset: self.offset,
        };
        let Some(group) = groups.get_mut(&*self.group) else {
            return Err(not_in_flight());
        };
        let Some(partition) = group.partitions.get_mut(p) else {
            return Err(not_in_flight());
        };
        if partition.generation == self.generation
            && partition.in_flight
            && partition.committed == self.offset
        {
            partition.committed += 1;
            partition.in_flight = false;
            // The room leaves with the caller: the record no longer gives it back.
            let took = keep_room
                && usize::try_from(self.offset.saturating_sub(logs[p].base))
                    .ok()
                    .filter(|_| self.offset >= logs[p].base)
                    .and_then(|at| logs[p].records.get_mut(at))
                    .is_some_and(|record| std::mem::replace(&mut record.admitted, false));
            let owner = partition.owner;
            group.mark(p);
            if let Some(owner) = owner {
                group.wake(owner);
            }
            // The acknowledged prefix every group of the topic is past can go.
            let low = groups
                .values()
                .map(|g| g.partitions[p].committed)
                .min()
                .unwrap_or(0);
            let admitted = logs[p].compact_to(low);
            if admitted > 0
                && let Some(room) = self.shared.admission.get(self.topic.index())
            {
                room.add_permits(admitted);
            }
            return Ok(took);
        }
        if self.offset < partition.committed {
            // Acknowledged before (by this delivery, or by the redelivery to a new owner).
            return Ok(false);
        }
        if partition.generation != self.generation {
            return Err(BusError::Revoked {
                topic: name.clone(),
                group: self.group.to_string(),
                partition: self.partition,
                offset: self.offset,
            });
        }
        Err(not_in_flight())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn bus(partitions: u32) -> EmbeddedBus {
        EmbeddedBus::new(EmbeddedConfig {
            partitions,
            ..EmbeddedConfig::default()
        })
        .expect("valid configuration")
    }

    #[test]
    fn configuration_is_validated_with_the_key_named() {
        for (config, key) in [
            (
                EmbeddedConfig {
                    partitions: 0,
                    ..EmbeddedConfig::default()
                },
                "partitions",
            ),
            (
                EmbeddedConfig {
                    partitions: MAX_PARTITIONS + 1,
                    ..EmbeddedConfig::default()
                },
                "partitions",
            ),
            (
                EmbeddedConfig {
                    prefix: "bad prefix".into(),
                    ..EmbeddedConfig::default()
                },
                "prefix",
            ),
            (
                EmbeddedConfig {
                    max_message_bytes: 0,
                    ..EmbeddedConfig::default()
                },
                "max_message_bytes",
            ),
        ] {
            match EmbeddedBus::new(config) {
                Err(BusError::InvalidConfig { key: named, .. }) => assert_eq!(named, key),
                other => panic!("expected an invalid `{key}`, got {other:?}"),
            }
        }
    }

    #[test]
    fn compaction_drops_only_the_acknowledged_prefix() {
        let mut log = PartitionLog::default();
        for i in 0..5u8 {
            log.records.push_back(Record {
                message: Arc::new(Message {
                    topic: Topic::Requested,
                    key: "k".into(),
                    payload: vec![i],
                    headers: vec![],
                }),
                admitted: i % 2 == 0,
            });
        }
        // Records 0, 2 and 4 were admitted: compaction counts the ones it drops.
        assert_eq!(log.compact_to(3), 2);
        assert_eq!((log.base, log.end()), (3, 5));
        assert!(log.get(2).is_none());
        assert_eq!(log.get(3).map(|r| r.message.payload.clone()), Some(vec![3]));
        assert_eq!(log.compact_to(1), 0); // behind the base: nothing happens
        assert_eq!((log.base, log.records.len()), (3, 2));
        // Past the end: everything goes, the base stops at the end.
        assert_eq!(log.compact_to(99), 1);
        assert_eq!((log.base, log.records.len()), (5, 0));
    }

    #[tokio::test]
    async fn assignment_is_round_robin_in_join_order() {
        let bus = bus(5);
        let a = bus.subscribe(Topic::Events, "g", "a").await.expect("join");
        assert_eq!(a.assignment(), vec![0, 1, 2, 3, 4]);
        let b = bus.subscribe(Topic::Events, "g", "b").await.expect("join");
        assert_eq!(a.assignment(), vec![0, 2, 4]);
        assert_eq!(b.assignment(), vec![1, 3]);
        drop(a);
        assert_eq!(b.assignment(), vec![0, 1, 2, 3, 4]);
        // Another group on the same topic is assigned independently.
        let c = bus
            .subscribe(Topic::Events, "other", "c")
            .await
            .expect("join");
        assert_eq!(c.assignment(), vec![0, 1, 2, 3, 4]);
    }

    /// The members' look for work follows the marks of partitions that may have some: across
    /// word boundaries (130 partitions), with two members of one group, messages published
    /// while their partition is in flight, and a second group reading the same messages. Every
    /// message is handed out once per group, each key's in order, and nothing is left over.
    #[tokio::test]
    async fn every_message_is_handed_out_once_per_group_in_key_order() {
        let bus = bus(130);
        let mut a = bus.subscribe(Topic::Events, "g", "a").await.expect("join");
        let mut b = bus.subscribe(Topic::Events, "g", "b").await.expect("join");
        let mut other = bus.subscribe(Topic::Events, "h", "c").await.expect("join");
        let keys: Vec<String> = (0..400).map(|i| format!("r-{i}")).collect();
        let publish = |round: usize| {
            let bus = bus.clone();
            let keys = keys.clone();
            async move {
                for key in &keys {
                    let payload = format!("{key}#{round}").into_bytes();
                    bus.publish(Topic::Events, key, payload, vec![])
                        .await
                        .expect("publish");
                }
            }
        };
        publish(0).await;
        let wait = Duration::from_millis(5);
        let mut seen: HashMap<&str, HashMap<String, usize>> = HashMap::new();
        let mut rounds_published = 1;
        loop {
            let mut handed = 0;
            for (group, source) in [("g", &mut a), ("g", &mut b), ("h", &mut other)] {
                // Hold a few deliveries before acknowledging, so publishes land on partitions
                // with a message in flight.
                let mut held = Vec::new();
                while held.len() < 25 {
                    match tokio::time::timeout(wait, source.next()).await {
                        Ok(Some(delivery)) => held.push(delivery),
                        _ => break,
                    }
                }
                handed += held.len();
                for delivery in held {
                    let text = String::from_utf8(delivery.payload().to_vec()).expect("utf-8");
                    let (key, round) = text.split_once('#').expect("key#round");
                    let round: usize = round.parse().expect("round");
                    let next = seen
                        .entry(group)
                        .or_default()
                        .entry(key.to_owned())
                        .or_insert(0);
                    assert_eq!(round, *next, "{group}: {key} out of order or repeated");
                    *next += 1;
                    delivery.ack().await.expect("ack");
                }
            }
            if rounds_published < 3 {
                publish(rounds_published).await;
                rounds_published += 1;
            } else if handed == 0 {
                break;
            }
        }
        for group in ["g", "h"] {
            let counts = &seen[group];
            assert_eq!(
                counts.len(),
                keys.len(),
                "{group}: every key was handed out"
            );
            assert!(
                counts.values().all(|&n| n == 3),
                "{group}: every message of every key once"
            );
        }
        assert_eq!(bus.lag(Topic::Events, "g"), Some(0));
        assert_eq!(bus.lag(Topic::Events, "h"), Some(0));
        assert_eq!(
            bus.retained(Topic::Events),
            0,
            "all acknowledged by both groups"
        );
    }

    /// A bus whose `Requested` topic admits `admission` messages, and a dispatcher in its group.
    async fn bounded_with_dispatcher(
        partitions: u32,
        admission: u32,
    ) -> (EmbeddedBus, Subscription) {
        let bus = EmbeddedBus::new(EmbeddedConfig {
            partitions,
            admission: Some(admission),
            ..EmbeddedConfig::default()
        })
        .expect("valid config");
        let consumer = bus
            .subscribe(Topic::Requested, "dispatcher", "d")
            .await
            .expect("join");
        (bus, consumer)
    }

    /// With room for two admitted messages, a third admission waits until one of the two has
    /// been handled; an admission dropped unused gives its room back, and a plain publish takes
    /// none.
    #[tokio::test]
    async fn admission_waits_for_the_consumers_to_handle_admitted_messages() {
        let (bus, mut consumer) = bounded_with_dispatcher(3, 2).await;
        let wait = Duration::from_millis(100);
        let unused = bus.admit(Topic::Requested).await.expect("room");
        drop(unused);
        for key in ["r-1", "r-2"] {
            let admission = bus.admit(Topic::Requested).await.expect("room");
            bus.publish_admitted(admission, Topic::Requested, key, b"x".to_vec(), vec![])
                .await
                .expect("publish");
        }
        bus.publish(Topic::Requested, "r-3", b"x".to_vec(), vec![])
            .await
            .expect("a plain publish takes no room");
        assert!(
            tokio::time::timeout(wait, bus.admit(Topic::Requested))
                .await
                .is_err(),
            "two admitted messages unhandled: no room"
        );
        assert!(
            tokio::time::timeout(wait, bus.admit(Topic::Events))
                .await
                .is_ok(),
            "each topic has room of its own"
        );
        // Handling the plain message gives no room back; handling an admitted one does.
        let mut admitted_handled = 0;
        for _ in 0..3 {
            let delivery = tokio::time::timeout(wait, consumer.next())
                .await
                .expect("a delivery")
                .expect("open");
            delivery.ack().await.expect("ack");
            if delivery.key() != "r-3" {
                admitted_handled += 1;
            }
            let room = tokio::time::timeout(wait, bus.admit(Topic::Requested)).await;
            assert_eq!(
                room.is_ok(),
                admitted_handled > 0,
                "after {} ({admitted_handled} admitted handled)",
                delivery.key()
            );
        }
    }

    /// A delivery acknowledged keeping its room frees its partition at once, but its room
    /// comes back only when the consumer drops it: what a consumer queued still counts.
    #[tokio::test]
    async fn a_room_kept_at_acknowledgement_comes_back_when_dropped() {
        let (bus, mut consumer) = bounded_with_dispatcher(1, 1).await;
        let wait = Duration::from_millis(100);
        let admission = bus.admit(Topic::Requested).await.expect("room");
        bus.publish_admitted(admission, Topic::Requested, "r-1", b"1".to_vec(), vec![])
            .await
            .expect("publish");
        bus.publish(Topic::Requested, "r-1", b"2".to_vec(), vec![])
            .await
            .expect("publish");
        let first = consumer.next().await.expect("open");
        let room = first.ack_keeping_room().await.expect("ack");
        let second = tokio::time::timeout(wait, consumer.next())
            .await
            .expect("the partition's next message, its first acknowledged")
            .expect("open");
        assert_eq!(second.payload(), b"2");
        assert!(
            tokio::time::timeout(wait, bus.admit(Topic::Requested))
                .await
                .is_err(),
            "the first message's room is held by the consumer"
        );
        // A plain message has no room to hand over; acknowledging it frees nothing.
        drop(second.ack_keeping_room().await.expect("ack"));
        assert!(
            tokio::time::timeout(wait, bus.admit(Topic::Requested))
                .await
                .is_err()
        );
        drop(room);
        assert!(
            tokio::time::timeout(wait, bus.admit(Topic::Requested))
                .await
                .is_ok(),
            "the room came back when the consumer dropped it"
        );
        // Acknowledged again: nothing more is handed over.
        drop(first.ack_keeping_room().await.expect("twice is harmless"));
    }

    /// What a benchmark reads to count the bus's work per effect.
    #[tokio::test]
    async fn traffic_counts_what_was_published_and_handed_out() {
        let bus = bus(2);
        let mut consumer = bus
            .subscribe(Topic::Requested, "dispatcher", "d")
            .await
            .expect("join");
        for key in ["r-1", "r-2"] {
            bus.publish(Topic::Requested, key, b"x".to_vec(), vec![])
                .await
                .expect("publish");
        }
        bus.publish(Topic::Events, "r-1", b"e".to_vec(), vec![])
            .await
            .expect("publish");
        consumer.next().await.expect("open");
        let counts = bus.traffic().expect("counted");
        assert_eq!(counts.published[Topic::Requested.index()], 2);
        assert_eq!(counts.published[Topic::Events.index()], 1);
        assert_eq!(counts.fetched[Topic::Requested.index()], 1);
        assert_eq!(counts.fetched[Topic::Events.index()], 0);
    }

    #[test]
    fn an_admission_bound_of_zero_is_refused() {
        let refused = EmbeddedBus::new(EmbeddedConfig {
            admission: Some(0),
            ..EmbeddedConfig::default()
        });
        assert!(matches!(
            refused,
            Err(BusError::InvalidConfig {
                key: "admission",
                ..
            })
        ));
    }
}
