//! A member's permission to its group, checked before it joins: an authorizing broker answers
//! a JoinGroup from a user without `READ` on the group asynchronously, as an error a running
//! consumer only logs, so a service would start and never consume. An OffsetFetch for the
//! group (which needs `DESCRIBE` on the group, implied by `READ`, and on the topic; its
//! coordinator lookup is refused without it) turns that into a start error naming the
//! permission.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{ClientContext, TopicPartitionList};
use sluice_bus::BusError;

use crate::config::KafkaConfig;

/// How long one offset fetch may take. A broker that refuses the group answers the coordinator
/// lookup with an error librdkafka reports on the client's queue while the fetch waits, so the
/// fetch is kept short and the queue read between tries.
const TRY_TIMEOUT: Duration = Duration::from_secs(2);
/// Tries before the check gives up without a verdict (a broker that does not answer is not a
/// refusal; the consumer finds out the rest itself).
const TRIES: usize = 4;

/// The error codes librdkafka reported on the client's queue.
#[derive(Default)]
struct Reported(Mutex<Vec<RDKafkaErrorCode>>);

impl Reported {
    fn keep(&self, error: &KafkaError) {
        if let Some(code) = error.rdkafka_error_code() {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(code);
        }
    }

    fn refusal(&self) -> Option<RDKafkaErrorCode> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .copied()
            .find(|code| is_refusal(*code))
    }
}

impl ClientContext for Reported {
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!(%error, reason, "the group check saw an error");
        self.keep(&error);
    }
}

impl ConsumerContext for Reported {}

fn is_refusal(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::GroupAuthorizationFailed | RDKafkaErrorCode::TopicAuthorizationFailed
    )
}

/// Fails with [`BusError::Forbidden`] when the broker refuses this user `group` or the topic
/// `name`; any other answer (including none) lets the member join.
pub(crate) async fn check_group(
    config: &KafkaConfig,
    name: &str,
    partitions: u32,
    group: &str,
) -> Result<(), BusError> {
    let reader: BaseConsumer<Reported> = config
        .lag_reader(group)
        .create_with_context(Reported::default())
        .map_err(|error| BusError::Backend {
            op: "subscribe",
            topic: name.to_owned(),
            source: Box::new(error),
        })?;
    let topic = name.to_owned();
    let refused = tokio::task::spawn_blocking(move || {
        let mut wanted = TopicPartitionList::new();
        for partition in 0..partitions {
            wanted.add_partition(&topic, i32::try_from(partition).unwrap_or(i32::MAX));
        }
        for _ in 0..TRIES {
            match reader.committed_offsets(wanted.clone(), TRY_TIMEOUT) {
                Ok(list) => {
                    return list
                        .elements()
                        .iter()
                        .find_map(|p| p.error().err()?.rdkafka_error_code())
                        .filter(|code| is_refusal(*code));
                }
                Err(error) => reader.context().keep(&error),
            }
            // Serve what librdkafka queued meanwhile (the coordinator lookup's refusal).
            for _ in 0..50 {
                match reader.poll(Duration::from_millis(20)) {
                    Some(Err(error)) => reader.context().keep(&error),
                    Some(Ok(_)) => {}
                    None => break,
                }
            }
            if let Some(code) = reader.context().refusal() {
                return Some(code);
            }
        }
        None
    })
    .await
    .unwrap_or(None);
    match refused {
        Some(RDKafkaErrorCode::GroupAuthorizationFailed) => Err(BusError::Forbidden {
            operation: "READ",
            resource: format!("group {group}"),
            why: format!(
                "a consumer of {name} joins this group and commits its offsets in it; grant READ \
                 on the group (or on the groups prefixed with bus.kafka.group_prefix)"
            ),
        }),
        Some(_) => Err(BusError::Forbidden {
            operation: "READ",
            resource: format!("topic {name}"),
            why: format!("the members of group {group} consume it; grant READ on the topic"),
        }),
        None => Ok(()),
    }
}
