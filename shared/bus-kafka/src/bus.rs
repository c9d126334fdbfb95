//! [`KafkaBus`]: the topics (made ready at start, see [`crate::topics`]), the producer, and one consumer per
//! subscription (see [`crate::consumer`] for how a member hands out and acknowledges).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use sluice_bus::{
    Bus, BusError, Header, Published, QueueDepth, Subscription, Topic, validate_group,
};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::KafkaConfig;
use crate::consumer::{InstanceIds, KafkaConsumer, KafkaSource, Member, MemberContext, drive};
use crate::lag::LagReaders;

/// How long a publish may wait for room in librdkafka's local queue before it fails; the
/// delivery itself is bounded by librdkafka's `message.timeout.ms`.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`KafkaBus::close`] waits for unsent messages.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(30);

/// The bus on Kafka. Cheap to clone; clones share the producer and the topics.
#[derive(Clone)]
pub struct KafkaBus {
    inner: Arc<Inner>,
}

struct Inner {
    config: KafkaConfig,
    /// Indexed by [`Topic::index`].
    names: [String; 5],
    /// Indexed by [`Topic::index`]: the partition counts found at start.
    partitions: [u32; 5],
    producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    closed: watch::Sender<bool>,
    /// The members' driver tasks, awaited by [`KafkaBus::close`].
    drivers: Mutex<Vec<JoinHandle<()>>>,
    /// Readers of consumer groups' committed offsets, for [`Bus::queue_depth`].
    lag: LagReaders,
    /// Messages published and fetched through this handle, for [`Bus::traffic`].
    traffic: Arc<sluice_bus::Traffic>,
    /// The `group.instance.id`s of this handle's live members (static membership).
    instances: Arc<InstanceIds>,
}

impl fmt::Debug for KafkaBus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaBus")
            .field("brokers", &self.inner.config.brokers)
            .field("prefix", &self.inner.config.prefix)
            .field("partitions", &self.inner.partitions)
            .finish_non_exhaustive()
    }
}

fn backend(op: &'static str, topic: &str, error: KafkaError) -> BusError {
    BusError::Backend {
        op,
        topic: topic.to_owned(),
        source: Box::new(error),
    }
}

impl KafkaBus {
    /// Validates `config`, checks that a broker answers, creates the topics as
    /// `config.create_topics` says and waits until every topic has a leader for each
    /// partition.
    ///
    /// Fails with [`BusError::InvalidConfig`] naming the key for a bad value (a replication
    /// factor larger than the cluster, or with `create_topics = never` a missing or differently
    /// partitioned topic), [`BusError::Forbidden`] naming the permission the user lacks, or
    /// [`BusError::Backend`] if no broker answered or the topics did not become ready within
    /// `config.start_timeout`.
    pub async fn connect(config: KafkaConfig) -> Result<Self, BusError> {
        config.validate()?;
        let deadline = Instant::now() + config.start_timeout;
        let names = Topic::ALL.map(|topic| topic.name(&config.prefix));
        let producer: FutureProducer = config
            .producer()
            .create()
            .map_err(|e| backend("connect", &config.prefix, e))?;
        let admin: AdminClient<DefaultClientContext> = config
            .admin()
            .create()
            .map_err(|e| backend("connect", &config.prefix, e))?;

        // A broker that does not answer (or refuses the credentials or the certificate) shows
        // here, named, rather than as a topic timeout.
        let timeout = deadline.saturating_duration_since(Instant::now());
        crate::probe::brokers_answer(&config, timeout).await?;

        let partitions = crate::topics::prepare(&admin, &config, &names, deadline).await?;
        tracing::info!(
            brokers = %config.brokers,
            prefix = %config.prefix,
            ?partitions,
            "kafka bus ready"
        );
        let (closed, _) = watch::channel(false);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                names,
                partitions,
                producer,
                admin,
                closed,
                drivers: Mutex::new(Vec::new()),
                instances: Arc::default(),
                lag: LagReaders::default(),
                traffic: Arc::default(),
            }),
        })
    }

    /// The configuration the bus was started with.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// Shuts the bus down: publishing and subscribing fail with [`BusError::Closed`], every
    /// member commits what was acknowledged and leaves its group (its `next` then returns
    /// `None`, its later acknowledgements are refused), and messages not yet sent are flushed.
    /// Returns once all of that is done.
    pub async fn close(&self) {
        self.inner.closed.send_replace(true);
        let drivers = std::mem::take(
            &mut *self
                .inner
                .drivers
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for driver in drivers {
            if let Err(error) = driver.await {
                tracing::warn!(error = %error, "a consumer driver failed");
            }
        }
        let producer = self.inner.producer.clone();
        if let Err(error) = blocking(move || producer.flush(FLUSH_TIMEOUT)).await {
            tracing::warn!(error = %error, "unsent messages were not flushed");
        }
    }

    /// Deletes this bus's topics and everything in them. For tests and tooling; the services
    /// never delete topics.
    pub async fn delete_topics(&self) -> Result<(), BusError> {
        let names: Vec<&str> = self.inner.names.iter().map(String::as_str).collect();
        let options = AdminOptions::new().operation_timeout(Some(self.inner.config.start_timeout));
        let results = self
            .inner
            .admin
            .delete_topics(&names, &options)
            .await
            .map_err(|e| backend("delete topics", &self.inner.config.prefix, e))?;
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((topic, code)) => {
                    return Err(backend("delete topic", &topic, KafkaError::AdminOp(code)));
                }
            }
        }
        Ok(())
    }

    fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }
}

/// Runs a blocking librdkafka call (metadata, flush, commit) off the async workers.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, KafkaError> + Send + 'static,
) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(call)
        .await
        .unwrap_or(Err(KafkaError::Canceled))
}

fn message_bytes(key: &str, payload: &[u8], headers: &[Header]) -> usize {
    key.len()
        + payload.len()
        + headers
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum::<usize>()
}

#[async_trait]
impl Bus for KafkaBus {
    fn prefix(&self) -> &str {
        &self.inner.config.prefix
    }

    fn messaging_system(&self) -> &'static str {
        "kafka"
    }

    fn topic_name(&self, topic: Topic) -> String {
        self.inner.names[topic.index()].clone()
    }

    fn group_prefix(&self) -> String {
        self.inner.config.group_prefix()
    }

    async fn partitions(&self, topic: Topic) -> Result<u32, BusError> {
        Ok(self.inner.partitions[topic.index()])
    }

    async fn publish(
        &self,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
    ) -> Result<Published, BusError> {
        if self.is_closed() {
            return Err(BusError::Closed);
        }
        let name = &self.inner.names[topic.index()];
        let bytes = message_bytes(key, &payload, &headers);
        let max = self.inner.config.max_message_bytes;
        let too_large = || BusError::MessageTooLarge {
            topic: name.clone(),
            key: key.chars().take(128).collect(),
            bytes,
            max,
        };
        if bytes > max {
            return Err(too_large());
        }
        let headers = headers.iter().fold(
            OwnedHeaders::new_with_capacity(headers.len()),
            |kafka, (name, value)| {
                kafka.insert(KafkaHeader {
                    key: name,
                    value: Some(value.as_slice()),
                })
            },
        );
        let record = FutureRecord::to(name)
            .key(key)
            .payload(payload.as_slice())
            .headers(headers);
        // Partitioned by librdkafka's murmur2_random, which is `partition_for` for a key.
        sluice_faults::point!("bus.publish.pre");
        let sent = self.inner.producer.send(record, QUEUE_TIMEOUT).await;
        sluice_faults::point!("bus.publish.post");
        match sent {
            Ok(delivery) => {
                self.inner.traffic.count_published(topic);
                let (Ok(partition), Ok(offset)) = (
                    u32::try_from(delivery.partition),
                    u64::try_from(delivery.offset),
                ) else {
                    return Err(backend(
                        "publish",
                        name,
                        KafkaError::MessageProduction(RDKafkaErrorCode::Fail),
                    ));
                };
                Ok(Published { partition, offset })
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                Err(too_large())
            }
            Err((error, _)) => Err(backend("publish", name, error)),
        }
    }

    async fn subscribe(
        &self,
        topic: Topic,
        group: &str,
        member: &str,
    ) -> Result<Subscription, BusError> {
        validate_group(group)?;
        if self.is_closed() {
            return Err(BusError::Closed);
        }
        let name = self.inner.names[topic.index()].clone();
        crate::access::check_group(
            &self.inner.config,
            &name,
            self.inner.partitions[topic.index()],
            group,
        )
        .await?;
        let shared = Arc::new(Member::new(
            topic,
            name.clone(),
            group,
            member,
            Arc::clone(&self.inner.traffic),
        ));
        let instance = self
            .inner
            .config
            .instance_id
            .as_deref()
            .map(|base| InstanceIds::take(&self.inner.instances, base, group));
        let consumer: KafkaConsumer = self
            .inner
            .config
            .consumer(group, member, instance.as_ref().map(|i| i.id.as_str()))
            .create_with_context(MemberContext {
                member: Arc::clone(&shared),
            })
            .map_err(|e| backend("subscribe", &name, e))?;
        consumer
            .subscribe(&[&name])
            .map_err(|e| backend("subscribe", &name, e))?;
        let consumer = Arc::new(consumer);
        let (leave, left) = oneshot::channel();
        let source = KafkaSource {
            member: Arc::clone(&shared),
            consumer: Arc::downgrade(&consumer),
            _leave: leave,
        };
        let instance_id = instance.as_ref().map(|i| i.id.clone());
        let driver = tokio::spawn(drive(
            consumer,
            shared,
            left,
            self.inner.closed.subscribe(),
            instance,
        ));
        {
            let mut drivers = self
                .inner
                .drivers
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            drivers.retain(|driver| !driver.is_finished());
            drivers.push(driver);
        }
        tracing::debug!(topic = %name, group, member, instance = ?instance_id, "joined the group");
        Ok(Subscription::new(topic, group, member, Box::new(source)))
    }

    fn backlog(&self) -> u64 {
        u64::try_from(self.inner.producer.in_flight_count()).unwrap_or(0)
    }

    fn traffic(&self) -> Option<sluice_bus::TrafficCounts> {
        Some(self.inner.traffic.read())
    }

    async fn queue_depth(&self, topic: Topic, group: &str) -> Result<Option<QueueDepth>, BusError> {
        validate_group(group)?;
        if self.is_closed() {
            return Err(BusError::Closed);
        }
        self.inner
            .lag
            .depth(
                &self.inner.config,
                &self.inner.names[topic.index()],
                self.inner.partitions[topic.index()],
                group,
            )
            .await
            .map(Some)
    }

    async fn lag_by_partition(
        &self,
        topic: Topic,
        group: &str,
    ) -> Result<Option<Vec<u64>>, BusError> {
        validate_group(group)?;
        if self.is_closed() {
            return Err(BusError::Closed);
        }
        let each = self
            .inner
            .lag
            .by_partition(
                &self.inner.config,
                &self.inner.names[topic.index()],
                self.inner.partitions[topic.index()],
                group,
            )
            .await?;
        Ok(Some(each.into_iter().map(|p| p.waiting).collect()))
    }

    async fn watch(&self, topic: Topic, member: &str) -> Result<Subscription, BusError> {
        if self.is_closed() {
            return Err(BusError::Closed);
        }
        crate::watch::watch(
            &self.inner.config,
            topic,
            &self.inner.names[topic.index()],
            self.inner.partitions[topic.index()],
            member,
            self.inner.closed.subscribe(),
            Arc::clone(&self.inner.traffic),
        )
    }
}
