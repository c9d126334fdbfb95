//! A member's permission to its group, checked before it joins: an authorizing broker answers
//! a JoinGroup from a user without `READ` on the group asynchronously, as an error a running
//! consumer only logs, so a service would start and never consume. One OffsetFetch for the
//! group (which needs `DESCRIBE` on the group, implied by `READ`, and on the topic) turns that
//! into a start error naming the permission.

use std::time::Duration;

use rdkafka::TopicPartitionList;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use sluice_bus::BusError;

use crate::config::KafkaConfig;

/// How long the check may take; a broker that does not answer in time is not a refusal, and
/// the consumer finds out the rest itself.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Fails with [`BusError::Forbidden`] when the broker refuses this user `group` or the topic
/// `name`; any other answer (including none) lets the member join.
pub(crate) async fn check_group(
    config: &KafkaConfig,
    name: &str,
    partitions: u32,
    group: &str,
) -> Result<(), BusError> {
    let reader: BaseConsumer = match config.lag_reader(group).create() {
        Ok(reader) => reader,
        Err(error) => {
            return Err(BusError::Backend {
                op: "subscribe",
                topic: name.to_owned(),
                source: Box::new(error),
            });
        }
    };
    let topic = name.to_owned();
    let answer = tokio::task::spawn_blocking(move || {
        let mut wanted = TopicPartitionList::new();
        for partition in 0..partitions {
            wanted.add_partition(&topic, i32::try_from(partition).unwrap_or(i32::MAX));
        }
        reader.committed_offsets(wanted, CHECK_TIMEOUT)
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled));
    let refused = match answer {
        Err(KafkaError::OffsetFetch(code)) => code,
        Ok(list) => match list.elements().iter().find_map(|p| p.error().err()) {
            Some(KafkaError::OffsetFetch(code)) => code,
            _ => return Ok(()),
        },
        Err(error) => {
            tracing::debug!(group, topic = name, %error, "the group check got no answer");
            return Ok(());
        }
    };
    match refused {
        RDKafkaErrorCode::GroupAuthorizationFailed => Err(BusError::Forbidden {
            operation: "READ",
            resource: format!("group {group}"),
            why: format!(
                "a consumer of {name} joins this group and commits its offsets in it; grant READ \
                 on the group (or on the groups prefixed with bus.kafka.group_prefix)"
            ),
        }),
        RDKafkaErrorCode::TopicAuthorizationFailed => Err(BusError::Forbidden {
            operation: "READ",
            resource: format!("topic {name}"),
            why: format!("the members of group {group} consume it; grant READ on the topic"),
        }),
        code => {
            tracing::debug!(
                group,
                topic = name,
                ?code,
                "the group check was answered with an error"
            );
            Ok(())
        }
    }
}
