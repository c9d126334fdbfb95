//! How far a consumer group is behind on a topic: its committed offsets against the
//! partitions' high watermarks, read by a client that never joins the group (an offset fetch
//! needs no membership, so reading does not rebalance the dispatchers). One offset fetch for
//! all partitions and one watermark query per partition; a producer does this once a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use sluice_bus::{BusError, QueueDepth};

use crate::config::KafkaConfig;

/// How long one reading may take before it fails (a reading is retried a second later).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The offset readers, one per group, made on first use and kept.
#[derive(Default)]
pub(crate) struct LagReaders {
    readers: Mutex<HashMap<String, Arc<BaseConsumer>>>,
}

impl LagReaders {
    fn reader(&self, config: &KafkaConfig, group: &str) -> Result<Arc<BaseConsumer>, BusError> {
        let mut readers = self.readers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(reader) = readers.get(group) {
            return Ok(Arc::clone(reader));
        }
        let reader: BaseConsumer = config
            .lag_reader(group)
            .create()
            .map_err(|e| read_failed(group, e))?;
        let reader = Arc::new(reader);
        readers.insert(group.to_owned(), Arc::clone(&reader));
        Ok(reader)
    }

    /// `group`'s depth on `topic` (named `name`, with `partitions` partitions). A partition
    /// the group never committed on counts from its low watermark: all of it is waiting.
    pub(crate) async fn depth(
        &self,
        config: &KafkaConfig,
        name: &str,
        partitions: u32,
        group: &str,
    ) -> Result<QueueDepth, BusError> {
        let each = self.by_partition(config, name, partitions, group).await?;
        Ok(QueueDepth {
            waiting: each.iter().map(|p| p.waiting).sum(),
            taken: each.iter().map(|p| p.taken).sum(),
        })
    }

    /// [`LagReaders::depth`] partition by partition (index: the partition).
    pub(crate) async fn by_partition(
        &self,
        config: &KafkaConfig,
        name: &str,
        partitions: u32,
        group: &str,
    ) -> Result<Vec<QueueDepth>, BusError> {
        let reader = self.reader(config, group)?;
        let (name, group) = (name.to_owned(), group.to_owned());
        tokio::task::spawn_blocking(move || read(&reader, &name, partitions, &group))
            .await
            .map_err(|e| BusError::Backend {
                op: "queue_depth",
                topic: String::new(),
                source: e.to_string().into(),
            })?
    }
}

fn read(
    reader: &BaseConsumer,
    name: &str,
    partitions: u32,
    group: &str,
) -> Result<Vec<QueueDepth>, BusError> {
    let mut wanted = TopicPartitionList::new();
    for partition in 0..partitions {
        wanted.add_partition(name, partition_index(partition));
    }
    let committed = reader
        .committed_offsets(wanted, READ_TIMEOUT)
        .map_err(|e| read_failed(group, e))?;
    let mut each = Vec::with_capacity(usize::try_from(partitions).unwrap_or_default());
    for partition in 0..partitions {
        let index = partition_index(partition);
        let (low, high) = reader
            .fetch_watermarks(name, index, READ_TIMEOUT)
            .map_err(|e| read_failed(group, e))?;
        let done = match committed.find_partition(name, index).map(|p| p.offset()) {
            Some(Offset::Offset(offset)) => offset.clamp(low, high),
            _ => low,
        };
        each.push(QueueDepth {
            waiting: u64::try_from(high - done).unwrap_or(0),
            taken: u64::try_from(done).unwrap_or(0),
        });
    }
    Ok(each)
}

fn partition_index(partition: u32) -> i32 {
    i32::try_from(partition).unwrap_or(i32::MAX)
}

fn read_failed(group: &str, e: impl std::error::Error + Send + Sync + 'static) -> BusError {
    BusError::Backend {
        op: "queue_depth",
        topic: group.to_owned(),
        source: Box::new(e),
    }
}
