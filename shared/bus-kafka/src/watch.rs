//! Watching a topic outside any consumer group: a consumer `assign()`ed every partition at
//! its end, that never joins a group and never commits. What a producer needs to wake its
//! long polls: the events from now on, on every replica, at no cost to the broker's group
//! coordinator; a restart neither replays the topic nor leaves a group behind. Missing an
//! event is harmless to it (its waiters re-read the ledger).

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::{Offset, TopicPartitionList};
use sluice_bus::{Acknowledge, BusError, Delivery, DeliverySource, Message, Subscription, Topic};
use tokio::sync::watch;

use crate::config::KafkaConfig;

/// A watcher's deliveries: acknowledging one does nothing (there is no group to commit for).
#[derive(Debug)]
struct NoAck;

#[async_trait]
impl Acknowledge for NoAck {
    async fn ack(&self) -> Result<(), BusError> {
        Ok(())
    }
}

struct WatchSource {
    consumer: StreamConsumer,
    topic: Topic,
    name: String,
    partitions: Vec<u32>,
    closed: watch::Receiver<bool>,
    ack: Arc<dyn Acknowledge>,
    traffic: Arc<sluice_bus::Traffic>,
}

impl fmt::Debug for WatchSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchSource")
            .field("topic", &self.name)
            .field("partitions", &self.partitions.len())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl DeliverySource for WatchSource {
    async fn next(&mut self) -> Option<Delivery> {
        loop {
            if *self.closed.borrow() {
                return None;
            }
            let received = tokio::select! {
                changed = self.closed.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    continue;
                }
                received = self.consumer.recv() => received,
            };
            let message = match received {
                Ok(message) => {
                    self.traffic.count_fetched(self.topic);
                    message
                }
                Err(error) => {
                    tracing::debug!(topic = %self.name, %error, "watch: a fetch failed; librdkafka retries");
                    continue;
                }
            };
            let (Ok(partition), Ok(offset)) = (
                u32::try_from(message.partition()),
                u64::try_from(message.offset()),
            ) else {
                continue;
            };
            let owned = Message {
                topic: self.topic,
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
            };
            return Some(Delivery::new(
                owned,
                partition,
                offset,
                Arc::clone(&self.ack),
            ));
        }
    }

    fn assignment(&self) -> Vec<u32> {
        self.partitions.clone()
    }
}

/// A subscription to `name` (`partitions` of it) from its end, for `member`.
pub(crate) fn watch(
    config: &KafkaConfig,
    topic: Topic,
    name: &str,
    partitions: u32,
    member: &str,
    closed: watch::Receiver<bool>,
    traffic: Arc<sluice_bus::Traffic>,
) -> Result<Subscription, BusError> {
    let backend = |error| BusError::Backend {
        op: "watch",
        topic: name.to_owned(),
        source: Box::new(error),
    };
    let consumer: StreamConsumer = config.watcher(member).create().map_err(backend)?;
    let mut list = TopicPartitionList::new();
    for partition in 0..partitions {
        let partition = i32::try_from(partition).unwrap_or(i32::MAX);
        list.add_partition_offset(name, partition, Offset::End)
            .map_err(backend)?;
    }
    consumer.assign(&list).map_err(backend)?;
    tracing::debug!(topic = %name, member, partitions, "watching from the end, in no group");
    let source = WatchSource {
        consumer,
        topic,
        name: name.to_owned(),
        partitions: (0..partitions).collect(),
        closed,
        ack: Arc::new(NoAck),
        traffic,
    };
    Ok(Subscription::new(topic, "", member, Box::new(source)))
}
