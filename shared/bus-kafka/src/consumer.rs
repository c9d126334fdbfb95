//! One member of a consumer group: a librdkafka consumer driven by its own task, and the
//! per-partition hand-out that turns Kafka's fetches into the bus contract — at-least-once, a
//! partition's next message only after the previous one was acknowledged, offsets stored only
//! on acknowledgement, acknowledged offsets committed before a partition moves or the member
//! leaves.
//!
//! # Shape
//!
//! * The **driver** task owns the consumer's polling: it receives messages and serves the
//!   rebalance callbacks (librdkafka runs them from the poll), so the member keeps its place in
//!   the group whatever the caller does — a member whose caller does not ask for the next
//!   message for a while (a slow handler) is still heartbeating and rebalancing.
//! * Received messages go to their partition's **queue** in `MemberState`. `KafkaSource`
//!   (behind [`Subscription::next`](sluice_bus::Subscription::next)) hands out the head of a queue whose partition has nothing
//!   in flight, and marks it in flight; `KafkaAck` clears the mark, stores the next offset in
//!   librdkafka and wakes `next`. Handing out happens under the state lock and only when the
//!   `next` future completes, so `next` is cancel-safe.
//! * A queue holds at most [`MAX_QUEUED`] messages or [`MAX_QUEUED_BYTES`]; past that the
//!   partition is paused in librdkafka, and resumed once the queue is down to a quarter. A
//!   pause makes librdkafka drop what it prefetched for the partition and fetch again, on
//!   resume, from just after the last message it gave us — nothing is skipped or repeated.
//!
//! # Rebalances
//!
//! Rebalancing is cooperative by default (`crate::membership`): librdkafka calls the
//! rebalance callback with *incremental* lists — only the partitions that leave this member on
//! revoke, only those that join it on assign — and rdkafka's default `rebalance` answers with
//! `incremental_unassign`/`incremental_assign` (with eager assignment, the revoke list is the
//! whole assignment and the answer is a full `assign`). Everything below works per partition in
//! the lists, so it holds for both: a partition the member keeps across a rebalance is in
//! neither list, keeps its queue, its in-flight delivery and its generation, and goes on
//! flowing while the group moves the others.
//!
//! Every assignment of a partition to this member gets a fresh *generation*. A delivery
//! carries the generation it was handed out under, and its acknowledgement is refused with
//! [`BusError::Revoked`] unless the partition is still assigned under that generation: after a
//! revoke the message is (or will be) delivered to the partition's next owner, which is what
//! the contract says.
//!
//! On **revoke** (run by librdkafka from the driver's poll, before the partitions are
//! unassigned): under the state lock, the revoked partitions (and only they) are forgotten — queue, in-flight
//! mark and all — and their acknowledged offsets collected; then, outside the lock, those
//! offsets are committed synchronously, so the next owner starts right after the last
//! acknowledged message. An acknowledgement that took the lock first was stored and is in that
//! commit; one that comes after finds the partition gone and gets `Revoked`. Partitions that
//! were *lost* (the session expired) are not committed: the group has moved on without us.
//!
//! librdkafka does the same on its own: with `enable.auto.commit` it commits the stored offsets
//! of the partitions it unassigns and holds the rebalance until that commit is done
//! (`rdkafka_assignment.c`). Either commit alone keeps acknowledged messages from coming back
//! (`tests/kafka.rs` checks it with periodic commits out of the way, and it was checked with
//! each one switched off); the bus's own is there so that the guarantee does not rest on a
//! librdkafka detail, and so that it is logged.
//!
//! On **assign** (after librdkafka took the partitions): each newly assigned partition gets
//! an empty queue under a new generation and is resumed, because librdkafka keeps an
//! application pause across an unassign and would otherwise never fetch a partition that was
//! paused when it was revoked and then assigned back. Fetching starts at the group's committed offset (or the oldest
//! message for a new group).
//!
//! # Leaving
//!
//! Dropping the [`Subscription`](sluice_bus::Subscription) (or closing the bus) stops the driver, which marks the member
//! closed under the lock (so later acknowledgements get `Revoked` and `next` returns `None`),
//! commits every acknowledged offset synchronously and then closes the consumer — leaving the
//! group, so its partitions move to the remaining members at once. The blocking part runs on
//! a blocking thread. If the runtime is torn down before the driver gets to that, dropping the
//! consumer still closes it, and the revoke callback commits what was acknowledged.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message as _};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use sluice_bus::{Acknowledge, BusError, Delivery, DeliverySource, Message, Topic};
use tokio::runtime::RuntimeFlavor;
use tokio::sync::{Notify, oneshot, watch};

/// Most messages queued per partition before the partition is paused.
pub const MAX_QUEUED: usize = 512;
/// Most bytes (keys, payloads, headers) queued per partition before the partition is paused.
pub const MAX_QUEUED_BYTES: usize = 8 * 1024 * 1024;

/// The consumer type: librdkafka's async consumer with this member's callbacks.
pub(crate) type KafkaConsumer = StreamConsumer<MemberContext>;

/// What one member knows, shared by its driver, its source, its acknowledgements and the
/// rebalance callbacks.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) topic: Topic,
    pub(crate) topic_name: String,
    pub(crate) group: String,
    pub(crate) name: String,
    state: Mutex<MemberState>,
    /// The bus handle's counts: every message received is counted fetched.
    traffic: Arc<sluice_bus::Traffic>,
    /// Wakes `next`: a message was queued, acknowledged, the assignment changed or the member
    /// closed. `notify_one` keeps a permit if `next` is not waiting yet, so a wake-up between
    /// its look at the state and its wait is not lost; a wake-up is only a hint to look again.
    wake: Notify,
}

#[derive(Debug, Default)]
struct MemberState {
    closed: bool,
    /// Source of generations; each assignment of a partition takes the next.
    generations: u64,
    /// The partitions assigned to this member now.
    partitions: BTreeMap<u32, Owned>,
    /// Where the next scan for a message to hand out starts, so that one busy partition does
    /// not starve the others.
    cursor: u32,
}

/// A partition assigned to this member.
#[derive(Debug)]
struct Owned {
    generation: u64,
    queue: VecDeque<Received>,
    queued_bytes: usize,
    /// The offset handed out and not acknowledged yet.
    in_flight: Option<u64>,
    /// The offset after the last acknowledged message in this assignment: what is stored in
    /// librdkafka and committed on revoke and close.
    acked: Option<u64>,
    paused: bool,
}

#[derive(Debug)]
struct Received {
    offset: u64,
    message: Message,
}

impl Received {
    fn bytes(&self) -> usize {
        self.message.key.len()
            + self.message.payload.len()
            + self
                .message
                .headers
                .iter()
                .map(|(name, value)| name.len() + value.len())
                .sum::<usize>()
    }
}

impl Member {
    pub(crate) fn new(
        topic: Topic,
        topic_name: String,
        group: &str,
        name: &str,
        traffic: Arc<sluice_bus::Traffic>,
    ) -> Self {
        Self {
            topic,
            topic_name,
            group: group.to_owned(),
            name: name.to_owned(),
            state: Mutex::new(MemberState::default()),
            traffic,
            wake: Notify::new(),
        }
    }

    /// Locks the state. A poisoned lock is taken over: no critical section panics between two
    /// updates that must go together, and propagating the poison would turn the rebalance
    /// callback (called from C) into an abort.
    fn lock(&self) -> MutexGuard<'_, MemberState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn partition_list(
        &self,
        entries: impl IntoIterator<Item = (u32, Option<u64>)>,
    ) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for (partition, offset) in entries {
            let partition = i32::try_from(partition).unwrap_or(i32::MAX);
            match offset.and_then(|o| i64::try_from(o).ok()) {
                Some(offset) => {
                    // Only fails for an out-of-range partition, which the list just added.
                    let _ = list.add_partition_offset(
                        &self.topic_name,
                        partition,
                        Offset::Offset(offset),
                    );
                }
                None => {
                    list.add_partition(&self.topic_name, partition);
                }
            }
        }
        list
    }

    /// The partitions of this member's topic in a rebalance list.
    fn partitions_in(&self, list: &TopicPartitionList) -> Vec<u32> {
        list.elements_for_topic(&self.topic_name)
            .iter()
            .filter_map(|element| u32::try_from(element.partition()).ok())
            .collect()
    }

    /// Queues a message the driver received; pauses its partition when the queue is full.
    fn received(&self, consumer: &KafkaConsumer, message: &BorrowedMessage<'_>) {
        let (Ok(partition), Ok(offset)) = (
            u32::try_from(message.partition()),
            u64::try_from(message.offset()),
        ) else {
            tracing::warn!(
                topic = %self.topic_name,
                partition = message.partition(),
                offset = message.offset(),
                "ignoring a message with a negative partition or offset"
            );
            return;
        };
        self.traffic.count_fetched(self.topic);
        let received = Received {
            offset,
            message: Message {
                topic: self.topic,
                // A key from another producer that is not UTF-8 is kept as closely as a
                // `String` can; every Sluice key is a run id.
                key: message
                    .key()
                    .map(|key| String::from_utf8_lossy(key).into_owned())
                    .unwrap_or_default(),
                payload: message.payload().unwrap_or_default().to_vec(),
                headers: message
                    .headers()
                    .map(|headers| {
                        headers
                            .iter()
                            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default(),
            },
        };

        let mut state = self.lock();
        if state.closed {
            return;
        }
        let Some(owned) = state.partitions.get_mut(&partition) else {
            // librdkafka discards what was fetched before a revoke, so this is not expected;
            // if it happens, the partition's owner fetches the message from the committed offset.
            tracing::debug!(topic = %self.topic_name, partition, offset, "dropping a message of a partition not assigned");
            return;
        };
        owned.queued_bytes += received.bytes();
        owned.queue.push_back(received);
        if !owned.paused
            && (owned.queue.len() >= MAX_QUEUED || owned.queued_bytes >= MAX_QUEUED_BYTES)
        {
            match consumer.pause(&self.partition_list([(partition, None)])) {
                Ok(()) => owned.paused = true,
                Err(error) => tracing::warn!(
                    topic = %self.topic_name,
                    partition,
                    error = %error,
                    "could not pause a partition with a full queue"
                ),
            }
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The revoke half of a rebalance: forget the partitions, commit what was acknowledged.
    fn revoke(&self, consumer: &BaseConsumer<MemberContext>, revoked: &TopicPartitionList) {
        let partitions = self.partitions_in(revoked);
        let mut acked = Vec::new();
        let mut in_flight = Vec::new();
        {
            let mut state = self.lock();
            for partition in &partitions {
                if let Some(owned) = state.partitions.remove(partition) {
                    if let Some(next) = owned.acked {
                        acked.push((*partition, Some(next)));
                    }
                    if let Some(offset) = owned.in_flight {
                        in_flight.push((*partition, offset));
                    }
                }
            }
        }
        self.wake.notify_one();
        let lost = consumer.assignment_lost();
        tracing::debug!(
            topic = %self.topic_name,
            group = %self.group,
            member = %self.name,
            ?partitions,
            ?in_flight,
            lost,
            "partitions revoked; in-flight messages go to the next owner"
        );
        if lost || acked.is_empty() {
            return;
        }
        self.commit(consumer, self.partition_list(acked), "revoke");
    }

    /// The assign half of a rebalance: fresh queues under new generations.
    fn assign(&self, consumer: &BaseConsumer<MemberContext>, assigned: &TopicPartitionList) {
        let partitions = self.partitions_in(assigned);
        {
            let mut state = self.lock();
            if state.closed {
                return;
            }
            for &partition in &partitions {
                state.generations += 1;
                let generation = state.generations;
                state.partitions.insert(
                    partition,
                    Owned {
                        generation,
                        queue: VecDeque::new(),
                        queued_bytes: 0,
                        in_flight: None,
                        acked: None,
                        paused: false,
                    },
                );
            }
        }
        // A resume of a partition that is not paused does nothing in librdkafka.
        if let Err(error) =
            consumer.resume(&self.partition_list(partitions.iter().map(|&p| (p, None))))
        {
            tracing::warn!(topic = %self.topic_name, error = %error, "could not resume assigned partitions");
        }
        tracing::debug!(
            topic = %self.topic_name,
            group = %self.group,
            member = %self.name,
            ?partitions,
            "partitions assigned"
        );
        self.wake.notify_one();
    }

    /// Marks the member closed and returns the acknowledged offsets to commit.
    fn close(&self) -> TopicPartitionList {
        let acked: Vec<(u32, Option<u64>)> = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.partitions)
                .into_iter()
                .filter_map(|(partition, owned)| Some((partition, Some(owned.acked?))))
                .collect()
        };
        self.wake.notify_one();
        self.partition_list(acked)
    }

    /// Commits `offsets` synchronously. The revoke callback runs inside the driver's poll, on
    /// an async worker, and a commit waits for the group coordinator (normally a millisecond or
    /// two, up to `socket.timeout.ms` when it is unreachable), so on a multi-thread runtime the
    /// worker hands its other tasks over while it waits.
    fn commit<C: Consumer<MemberContext>>(
        &self,
        consumer: &C,
        offsets: TopicPartitionList,
        why: &str,
    ) {
        let commit = || consumer.commit(&offsets, CommitMode::Sync);
        let committed = match tokio::runtime::Handle::try_current() {
            Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(commit)
            }
            _ => commit(),
        };
        match committed {
            Ok(()) => tracing::debug!(
                topic = %self.topic_name,
                group = %self.group,
                member = %self.name,
                offsets = ?offsets.to_topic_map(),
                why,
                "acknowledged offsets committed"
            ),
            // The messages after the last committed offset are delivered again: at-least-once.
            Err(error) => tracing::warn!(
                topic = %self.topic_name,
                group = %self.group,
                member = %self.name,
                why,
                error = %error,
                "could not commit acknowledged offsets; those messages will be delivered again"
            ),
        }
    }
}

/// The consumer's callbacks: rebalances go to the [`Member`].
pub(crate) struct MemberContext {
    pub(crate) member: Arc<Member>,
}

impl ClientContext for MemberContext {}

impl ConsumerContext for MemberContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(revoked) => self.member.revoke(consumer, revoked),
            Rebalance::Assign(_) => {}
            Rebalance::Error(error) => tracing::warn!(
                topic = %self.member.topic_name,
                group = %self.member.group,
                error = %error,
                "rebalance failed"
            ),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(assigned) = rebalance {
            self.member.assign(consumer, assigned);
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        match result {
            // An automatic commit with nothing new stored.
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(
                topic = %self.member.topic_name,
                group = %self.member.group,
                offsets = ?offsets.to_topic_map(),
                error = %error,
                "offset commit failed"
            ),
        }
    }
}

/// The `group.instance.id`s of one bus handle's live members. A member keeps its id until its
/// consumer is closed, so a member that replaces it in the same process (a re-subscription)
/// does not fence it, and gets the same id back.
#[derive(Debug, Default)]
pub(crate) struct InstanceIds {
    live: Mutex<BTreeSet<String>>,
}

/// A live member's `group.instance.id`, given back when dropped.
#[derive(Debug)]
pub(crate) struct InstanceId {
    pub(crate) id: String,
    ids: Arc<InstanceIds>,
}

impl InstanceIds {
    /// The first id derived from `base` that no live member of this handle uses in `group`.
    pub(crate) fn take(ids: &Arc<Self>, base: &str, group: &str) -> InstanceId {
        let mut live = ids.live.lock().unwrap_or_else(PoisonError::into_inner);
        let id = (1..)
            .map(|nth| crate::membership::instance_id(base, group, nth))
            .find(|id| !live.contains(id))
            .unwrap_or_else(|| crate::membership::instance_id(base, group, u32::MAX));
        live.insert(id.clone());
        InstanceId {
            id,
            ids: Arc::clone(ids),
        }
    }
}

impl Drop for InstanceId {
    fn drop(&mut self) {
        self.ids
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// Runs the member: polls the consumer (messages and rebalance callbacks) until the
/// subscription is dropped (`left` completes) or the bus is closed, then leaves the group.
pub(crate) async fn drive(
    consumer: Arc<KafkaConsumer>,
    member: Arc<Member>,
    mut left: oneshot::Receiver<()>,
    mut bus_closed: watch::Receiver<bool>,
    instance: Option<InstanceId>,
) {
    loop {
        tokio::select! {
            biased;
            _ = &mut left => break,
            () = closed(&mut bus_closed) => break,
            received = consumer.recv() => match received {
                Ok(message) => member.received(&consumer, &message),
                Err(KafkaError::MessageConsumptionFatal(code)) => {
                    // With static membership: another consumer joined with this member's
                    // group.instance.id and fenced it. The consumer is unusable; the
                    // subscription ends (`next` returns `None`) and the service stops on it.
                    tracing::error!(
                        topic = %member.topic_name,
                        group = %member.group,
                        member = %member.name,
                        instance = ?instance.as_ref().map(|i| &i.id),
                        error = %code,
                        "the consumer failed for good (fenced by another member with the same group.instance.id? give every process its own bus.kafka.instance_id); leaving"
                    );
                    break;
                }
                Err(error) => {
                    // Transient by nature (a broker went away, a topic is not there yet):
                    // librdkafka keeps retrying on its own. The pause keeps an error that
                    // repeats from turning into a busy loop.
                    tracing::warn!(
                        topic = %member.topic_name,
                        group = %member.group,
                        member = %member.name,
                        error = %error,
                        "consumer error"
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    let offsets = member.close();
    let leaving = Arc::clone(&member);
    // Committing and leaving the group block on broker round trips.
    let left = tokio::task::spawn_blocking(move || {
        if offsets.count() > 0 {
            leaving.commit(&*consumer, offsets, "close");
        }
        // The last reference: dropping it closes the consumer, which leaves the group (a
        // static member does not leave: it keeps its partitions for the session timeout).
        drop(consumer);
        // Only now may another member of this process take the same group.instance.id.
        drop(instance);
    })
    .await;
    if let Err(error) = left {
        tracing::warn!(topic = %member.topic_name, group = %member.group, error = %error, "closing the consumer failed");
    }
    tracing::debug!(topic = %member.topic_name, group = %member.group, member = %member.name, "left the group");
}

/// Completes once the bus is closed; never if the bus is dropped without closing.
async fn closed(bus_closed: &mut watch::Receiver<bool>) {
    if bus_closed.wait_for(|closed| *closed).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The caller's side of a member: hands out messages, one in flight per partition.
pub(crate) struct KafkaSource {
    pub(crate) member: Arc<Member>,
    /// Weak, so that the driver holds the last strong reference and closes the consumer.
    pub(crate) consumer: Weak<KafkaConsumer>,
    /// Dropped with the source, which tells the driver to leave the group.
    pub(crate) _leave: oneshot::Sender<()>,
}

impl fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topic", &self.member.topic_name)
            .field("group", &self.member.group)
            .field("member", &self.member.name)
            .finish_non_exhaustive()
    }
}

enum Take {
    Ready(Delivery),
    Nothing,
    Closed,
}

impl KafkaSource {
    /// Hands out the head of a queue whose partition has nothing in flight, if any.
    fn take(&self) -> Take {
        let mut state = self.member.lock();
        if state.closed {
            return Take::Closed;
        }
        let cursor = state.cursor;
        let Some(partition) = state
            .partitions
            .range(cursor..)
            .chain(state.partitions.range(..cursor))
            .find(|(_, owned)| owned.in_flight.is_none() && !owned.queue.is_empty())
            .map(|(&partition, _)| partition)
        else {
            return Take::Nothing;
        };
        state.cursor = partition.wrapping_add(1);
        let Some(owned) = state.partitions.get_mut(&partition) else {
            return Take::Nothing;
        };
        let Some(received) = owned.queue.pop_front() else {
            return Take::Nothing;
        };
        owned.queued_bytes -= received.bytes();
        owned.in_flight = Some(received.offset);
        if owned.paused
            && owned.queue.len() <= MAX_QUEUED / 4
            && owned.queued_bytes <= MAX_QUEUED_BYTES / 4
        {
            // The consumer is gone only once the member is closed, which was checked above.
            if let Some(consumer) = self.consumer.upgrade() {
                match consumer.resume(&self.member.partition_list([(partition, None)])) {
                    Ok(()) => owned.paused = false,
                    Err(error) => tracing::warn!(
                        topic = %self.member.topic_name,
                        partition,
                        error = %error,
                        "could not resume a partition"
                    ),
                }
            }
        }
        let ack = KafkaAck {
            member: Arc::clone(&self.member),
            consumer: Weak::clone(&self.consumer),
            partition,
            offset: received.offset,
            generation: owned.generation,
            done: AtomicBool::new(false),
        };
        Take::Ready(Delivery::new(
            received.message,
            partition,
            received.offset,
            Arc::new(ack),
        ))
    }
}

#[async_trait]
impl DeliverySource for KafkaSource {
    async fn next(&mut self) -> Option<Delivery> {
        loop {
            match self.take() {
                Take::Ready(delivery) => return Some(delivery),
                Take::Closed => return None,
                Take::Nothing => self.member.wake.notified().await,
            }
        }
    }

    fn assignment(&self) -> Vec<u32> {
        self.member.lock().partitions.keys().copied().collect()
    }
}

/// Acknowledges one delivery, fenced by the generation it was handed out under.
#[derive(Debug)]
struct KafkaAck {
    member: Arc<Member>,
    consumer: Weak<KafkaConsumer>,
    partition: u32,
    offset: u64,
    generation: u64,
    /// Acknowledged already: a second acknowledgement (of this delivery or a clone) is a no-op.
    done: AtomicBool,
}

impl KafkaAck {
    fn revoked(&self) -> BusError {
        BusError::Revoked {
            topic: self.member.topic_name.clone(),
            group: self.member.group.clone(),
            partition: self.partition,
            offset: self.offset,
        }
    }
}

#[async_trait]
impl Acknowledge for KafkaAck {
    async fn ack(&self) -> Result<(), BusError> {
        if self.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut state = self.member.lock();
        if state.closed {
            return Err(self.revoked());
        }
        let Some(owned) = state.partitions.get_mut(&self.partition) else {
            return Err(self.revoked());
        };
        if owned.generation != self.generation {
            return Err(self.revoked());
        }
        if owned.in_flight != Some(self.offset) {
            return Err(BusError::NotInFlight {
                topic: self.member.topic_name.clone(),
                group: self.member.group.clone(),
                partition: self.partition,
                offset: self.offset,
            });
        }
        // Not closed, so the driver still holds the consumer; it drops it only after marking
        // the member closed under this lock, so this reference is never the last.
        let Some(consumer) = self.consumer.upgrade() else {
            return Err(self.revoked());
        };
        let next = self.offset + 1;
        // Stored under the lock: a revoke either runs before (and this is refused above) or
        // after (and commits this offset).
        match consumer.store_offsets(&self.member.partition_list([(self.partition, Some(next))])) {
            Ok(()) => {}
            Err(KafkaError::StoreOffset(
                RDKafkaErrorCode::State | RDKafkaErrorCode::UnknownPartition,
            )) => {
                return Err(self.revoked());
            }
            Err(error) => {
                return Err(BusError::Backend {
                    op: "ack",
                    topic: self.member.topic_name.clone(),
                    source: Box::new(error),
                });
            }
        }
        drop(consumer);
        owned.in_flight = None;
        owned.acked = Some(next);
        self.done.store(true, Ordering::Release);
        drop(state);
        self.member.wake.notify_one();
        Ok(())
    }
}
