//! The bus's topics at start, as `bus.kafka.create_topics` says: the metadata is read first
//! (by a client that never has a topic auto-created), then the missing topics are created
//! (`if_missing`), every topic is asked for (`always`), or nothing is created and a missing or
//! differently partitioned topic stops the service (`never`). Then it waits until every
//! partition has a leader.
//!
//! Why read first: a broker with an authorizer answers CreateTopics from a user without the
//! `CREATE` permission with `TOPIC_AUTHORIZATION_FAILED` even for a topic that exists, so a
//! service that always asks cannot run as a user that only reads and writes.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use sluice_bus::BusError;
use tokio::time::Instant;

use crate::config::{CreateTopics, KafkaConfig};

/// Between two looks at the metadata while topics are being created.
const METADATA_RETRY: Duration = Duration::from_millis(200);

/// What the metadata says of one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// It exists with this many partitions, each with a leader.
    Ready(u32),
    /// It exists (or is being created) but not every partition has a leader yet.
    Leaderless,
    /// The broker does not know it.
    Missing,
    /// The user may not see it: no `DESCRIBE` on the topic.
    Hidden,
}

fn backend(op: &'static str, topic: &str, error: KafkaError) -> BusError {
    BusError::Backend {
        op,
        topic: topic.to_owned(),
        source: Box::new(error),
    }
}

/// Makes the topics `names` usable as `config.create_topics` says and returns their
/// partition counts once every partition has a leader.
pub(crate) async fn prepare(
    admin: &AdminClient<DefaultClientContext>,
    config: &KafkaConfig,
    names: &[String; 5],
    deadline: Instant,
) -> Result<[u32; 5], BusError> {
    let reader: BaseConsumer = config
        .metadata_reader()
        .create()
        .map_err(|e| backend("connect", &config.prefix, e))?;
    let reader = std::sync::Arc::new(reader);
    let found = survey(&reader, names, deadline).await?;
    for (name, found) in names.iter().zip(found) {
        if found == Found::Hidden {
            return Err(BusError::Forbidden {
                operation: "DESCRIBE",
                resource: format!("topic {name}"),
                why: "every service reads its topics' metadata at start; grant DESCRIBE (READ \
                      or WRITE imply it) on the topics of the prefix"
                    .to_owned(),
            });
        }
    }
    let to_create: Vec<&str> = match config.create_topics {
        CreateTopics::Always => names.iter().map(String::as_str).collect(),
        CreateTopics::IfMissing => names
            .iter()
            .zip(found)
            .filter(|(_, found)| *found == Found::Missing)
            .map(|(name, _)| name.as_str())
            .collect(),
        CreateTopics::Never => {
            refuse_what_is_not_there(config, names, &found)?;
            Vec::new()
        }
    };
    if !to_create.is_empty() {
        create(admin, config, &to_create, deadline).await?;
    }
    wait_for_leaders(&reader, config, names, deadline).await
}

/// With `create_topics = "never"`: every topic must exist with the configured partitions.
fn refuse_what_is_not_there(
    config: &KafkaConfig,
    names: &[String; 5],
    found: &[Found; 5],
) -> Result<(), BusError> {
    for (name, found) in names.iter().zip(found) {
        match *found {
            Found::Missing => {
                return Err(BusError::InvalidConfig {
                    key: "create_topics",
                    why: format!(
                        "topic {name} does not exist and `never` forbids creating it: run \
                         `sluice migrate`, or create it with {} partitions, or set \
                         create_topics = \"if_missing\"",
                        config.partitions
                    ),
                });
            }
            Found::Ready(count) if count != config.partitions => {
                return Err(BusError::InvalidConfig {
                    key: "create_topics",
                    why: format!(
                        "topic {name} has {count} partitions, bus.partitions says {}: with \
                         `never` they must agree (set bus.partitions = {count}, or recreate \
                         the topic with {} partitions)",
                        config.partitions, config.partitions
                    ),
                });
            }
            _ => {}
        }
    }
    Ok(())
}

/// Reads what the metadata says of each topic (one request per topic: one that names a topic
/// tells a missing topic from a hidden one).
async fn survey(
    reader: &std::sync::Arc<BaseConsumer>,
    names: &[String; 5],
    deadline: Instant,
) -> Result<[Found; 5], BusError> {
    let mut found = [Found::Missing; 5];
    for (index, name) in names.iter().enumerate() {
        let client = std::sync::Arc::clone(reader);
        let topic = name.clone();
        let timeout = deadline.saturating_duration_since(Instant::now());
        found[index] = tokio::task::spawn_blocking(move || {
            let metadata = client.fetch_metadata(Some(&topic), timeout)?;
            Ok::<_, KafkaError>(metadata.topics().iter().find(|t| t.name() == topic).map_or(
                Found::Missing,
                |t| {
                    match t.error().map(RDKafkaErrorCode::from) {
                        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => Found::Missing,
                        Some(RDKafkaErrorCode::TopicAuthorizationFailed) => Found::Hidden,
                        Some(_) => Found::Leaderless,
                        None if t.partitions().is_empty() => Found::Missing,
                        None if t
                            .partitions()
                            .iter()
                            .all(|p| p.error().is_none() && p.leader() >= 0) =>
                        {
                            Found::Ready(u32::try_from(t.partitions().len()).unwrap_or(0))
                        }
                        None => Found::Leaderless,
                    }
                },
            ))
        })
        .await
        .unwrap_or(Err(KafkaError::Canceled))
        .map_err(|e| backend("connect", name, e))?;
    }
    Ok(found)
}

/// Asks the broker to create `names`; one that exists already is fine (another service
/// created it first).
async fn create(
    admin: &AdminClient<DefaultClientContext>,
    config: &KafkaConfig,
    names: &[&str],
    deadline: Instant,
) -> Result<(), BusError> {
    // -1 asks for the broker's `default.replication.factor`.
    let replication = config.replication_factor.map_or(-1, i32::from);
    let partitions = i32::try_from(config.partitions).unwrap_or(i32::MAX);
    let max_bytes = config.wire_max_message_bytes().to_string();
    let min_insync = config.min_insync_replicas.map(|n| n.to_string());
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|name| {
            let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication))
                .set("max.message.bytes", &max_bytes);
            match &min_insync {
                Some(n) => topic.set("min.insync.replicas", n),
                None => topic,
            }
        })
        .collect();
    let timeout = deadline.saturating_duration_since(Instant::now());
    let options = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let results = admin
        .create_topics(&topics, &options)
        .await
        .map_err(|e| backend("create topics", &config.prefix, e))?;
    for result in results {
        match result {
            Ok(topic) => tracing::info!(topic, partitions, "topic created"),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(topic, "topic exists");
            }
            Err((topic, RDKafkaErrorCode::TopicAuthorizationFailed)) => {
                let why = match config.create_topics {
                    CreateTopics::Always => format!(
                        "bus.kafka.create_topics = \"always\" asks the broker to create {topic} \
                         at every start, which an authorizing broker refuses without CREATE \
                         even when the topic exists: grant CREATE, or set create_topics = \
                         \"if_missing\" (or \"never\") and create the topics beforehand"
                    ),
                    _ => format!(
                        "topic {topic} does not exist and this user may not create it: create \
                         it beforehand with {} partitions (`sluice migrate` as a user holding \
                         CREATE, or the platform's tooling), or grant CREATE",
                        config.partitions
                    ),
                };
                return Err(BusError::Forbidden {
                    operation: "CREATE",
                    resource: format!("topic {topic}"),
                    why,
                });
            }
            Err((topic, RDKafkaErrorCode::InvalidReplicationFactor)) => {
                return Err(BusError::InvalidConfig {
                    key: "replication_factor",
                    why: format!(
                        "{:?} cannot be met by the cluster for topic {topic}",
                        config.replication_factor
                    ),
                });
            }
            Err((topic, RDKafkaErrorCode::InvalidPartitions)) => {
                return Err(BusError::InvalidConfig {
                    key: "partitions",
                    why: format!(
                        "the cluster refused {} partitions for topic {topic}",
                        config.partitions
                    ),
                });
            }
            Err((topic, code)) => {
                return Err(backend("create topic", &topic, KafkaError::AdminOp(code)));
            }
        }
    }
    Ok(())
}

/// Waits until the metadata shows every topic with a leader for each partition, and returns
/// the partition counts. A freshly created topic takes a moment to get its leaders; until then
/// a publish would wait and a consumer would see no partitions.
async fn wait_for_leaders(
    reader: &std::sync::Arc<BaseConsumer>,
    config: &KafkaConfig,
    names: &[String; 5],
    deadline: Instant,
) -> Result<[u32; 5], BusError> {
    loop {
        let found = survey(reader, names, deadline).await?;
        if let Some(counts) = ready(&found) {
            for (name, count) in names.iter().zip(counts) {
                if count != config.partitions {
                    tracing::warn!(
                        topic = %name,
                        count,
                        configured = config.partitions,
                        "the topic existed with another partition count; keeping its own"
                    );
                }
            }
            return Ok(counts);
        }
        if Instant::now() >= deadline {
            let waiting = names
                .iter()
                .zip(found)
                .find(|(_, found)| !matches!(found, Found::Ready(_)))
                .map_or(config.prefix.as_str(), |(name, _)| name.as_str());
            return Err(backend(
                "connect",
                waiting,
                KafkaError::MetadataFetch(RDKafkaErrorCode::LeaderNotAvailable),
            ));
        }
        tokio::time::sleep(METADATA_RETRY).await;
    }
}

fn ready(found: &[Found; 5]) -> Option<[u32; 5]> {
    let mut counts = [0u32; 5];
    for (count, found) in counts.iter_mut().zip(found) {
        let Found::Ready(n) = found else {
            return None;
        };
        *count = *n;
    }
    Some(counts)
}
