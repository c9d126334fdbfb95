//! How a consumer takes part in its group: the rebalance protocol ([`GroupProtocol`]) and
//! static membership (`group.instance.id` from [`KafkaConfig::instance_id`]).
//!
//! # Why cooperative by default
//!
//! With the classic protocol's eager assignors (`range`, `roundrobin`, librdkafka's default),
//! every join or leave revokes *every* partition of *every* member, and nothing is consumed
//! until the group has synced again: one dispatcher added by an autoscaler pauses all of the
//! group's partitions. `cooperative-sticky` moves only the partitions that change owner, in
//! two rounds; the others keep flowing. It runs on every broker since Kafka 2.4 (MSK,
//! Confluent, Aiven, Redpanda, Strimzi), which is why it is the default rather than the
//! KIP-848 `consumer` protocol: that one is better still (the broker assigns, no group-wide
//! barrier, online migration of a classic group) but needs Kafka 4.0 or later, so it is a
//! choice (`group_protocol = "consumer"`). docs/decisions.md has the whole reasoning.
//!
//! # Static membership
//!
//! With `instance_id` set, each consumer gets a `group.instance.id` derived from it: a member
//! that restarts within `session.timeout.ms` takes its partitions back without a rebalance
//! (librdkafka sends no LeaveGroup for a static member). One process runs several consumers
//! (one per service and topic; the all-in-one runs all four), and Kafka fences a second member
//! with the same id, so the id is `<instance_id>.<group>`, with `-2`, `-3`, … for a further
//! live consumer of the same group in the same process (the first free number, so a restarted
//! process gets the same ids back).

use serde::{Deserialize, Serialize};
use sluice_bus::BusError;

use crate::config::KafkaConfig;

/// Longest [`KafkaConfig::instance_id`]: a Kubernetes pod name fits (63), and the group name
/// and a suffix still fit in Kafka's 249 characters.
pub const MAX_INSTANCE_ID: usize = 128;
/// Kafka refuses a `group.instance.id` longer than this.
#[cfg(feature = "librdkafka")]
const KAFKA_MAX_INSTANCE_ID: usize = 249;

/// The consumer group protocol and assignment (`bus.kafka.group_protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupProtocol {
    /// The classic protocol with `cooperative-sticky`: a rebalance revokes only the
    /// partitions that move. Any broker since Kafka 2.4.
    #[default]
    Cooperative,
    /// The classic protocol with librdkafka's eager `range,roundrobin`: every rebalance
    /// revokes every partition of every member. What Sluice did before cooperative
    /// rebalancing; kept to roll back to, and to measure against.
    Eager,
    /// KIP-848's `consumer` protocol: the broker assigns, incrementally, with no group-wide
    /// barrier. Kafka 4.0 or later (and a group coordinator that has it enabled).
    Consumer,
}

/// librdkafka properties the group protocol owns, with the reason `extra` may not set them.
pub(crate) const OWNED_PROPERTIES: &[(&str, &str)] = &[
    ("group.protocol", "set `group_protocol` instead"),
    (
        "partition.assignment.strategy",
        "set `group_protocol` (cooperative or eager) instead",
    ),
    ("group.instance.id", "set `instance_id` instead"),
];

/// Properties the KIP-848 protocol takes from the broker, not the client.
const CLASSIC_ONLY: &[&str] = &[
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
];

fn invalid(key: &'static str, why: impl Into<String>) -> BusError {
    BusError::InvalidConfig {
        key,
        why: why.into(),
    }
}

/// Checks `instance_id` and what `extra` sets against `group_protocol`.
pub(crate) fn validate(config: &KafkaConfig) -> Result<(), BusError> {
    if let Some(id) = &config.instance_id {
        if id.is_empty() || id.len() > MAX_INSTANCE_ID {
            return Err(invalid(
                "instance_id",
                format!(
                    "must be 1 to {MAX_INSTANCE_ID} characters (a pod name), or unset for no static membership; got {} characters",
                    id.len()
                ),
            ));
        }
        if let Some(bad) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(invalid(
                "instance_id",
                format!(
                    "{id:?} contains {bad:?}: use letters, digits, '.', '_' and '-' (a pod name)"
                ),
            ));
        }
    }
    if config.group_protocol == GroupProtocol::Consumer
        && let Some(name) = CLASSIC_ONLY
            .iter()
            .find(|name| config.extra.contains_key(**name))
    {
        return Err(invalid(
            "extra",
            format!(
                "`{name}` is not a client setting with group_protocol = \"consumer\": the broker sets it (group.consumer.*); remove it or use group_protocol = \"cooperative\""
            ),
        ));
    }
    Ok(())
}

/// The classic protocol's heartbeat unless `extra` sets one. A member learns that its group
/// is rebalancing from a heartbeat's answer, and a cooperative rebalance takes two rounds, so a
/// partition that moves waits up to two heartbeat intervals: with librdkafka's 3 s, the slowest
/// effect while a dispatcher joined took 3.7 s, with 1 s 0.9 s (docs/scaling.md,
/// "Rebalances"). It costs one small request per member and second.
pub const DEFAULT_HEARTBEAT_MS: &str = "1000";

/// The consumer properties for `config.group_protocol`.
#[cfg(feature = "librdkafka")]
pub(crate) fn protocol_properties(
    protocol: GroupProtocol,
) -> &'static [(&'static str, &'static str)] {
    match protocol {
        GroupProtocol::Cooperative => &[
            ("group.protocol", "classic"),
            ("partition.assignment.strategy", "cooperative-sticky"),
        ],
        GroupProtocol::Eager => &[
            ("group.protocol", "classic"),
            ("partition.assignment.strategy", "range,roundrobin"),
        ],
        GroupProtocol::Consumer => &[("group.protocol", "consumer")],
    }
}

/// The `group.instance.id` of the `nth` (from 1) live consumer of `group` in this process.
#[cfg(feature = "librdkafka")]
pub(crate) fn instance_id(base: &str, group: &str, nth: u32) -> String {
    let suffix = if nth > 1 {
        format!("-{nth}")
    } else {
        String::new()
    };
    let room = KAFKA_MAX_INSTANCE_ID - base.len() - 1 - suffix.len();
    let group: String = group
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(room)
        .collect();
    format!("{base}.{group}{suffix}")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn with(instance_id: Option<&str>, protocol: GroupProtocol, extra: &[&str]) -> KafkaConfig {
        KafkaConfig {
            instance_id: instance_id.map(str::to_owned),
            group_protocol: protocol,
            extra: extra
                .iter()
                .map(|name| ((*name).to_owned(), "1".to_owned()))
                .collect::<BTreeMap<_, _>>(),
            ..KafkaConfig::default()
        }
    }

    fn why(config: &KafkaConfig, key: &str) -> String {
        match config.validate() {
            Err(BusError::InvalidConfig { key: k, why }) if k == key => why,
            other => panic!("expected {key} to be refused, got {other:?}"),
        }
    }

    #[test]
    fn instance_ids_are_checked() {
        with(
            Some("sluice-dispatcher-7d9f-abcde"),
            GroupProtocol::Cooperative,
            &[],
        )
        .validate()
        .expect("a pod name is a valid instance id");
        assert!(
            why(
                &with(Some(""), GroupProtocol::Cooperative, &[]),
                "instance_id"
            )
            .contains("1 to")
        );
        assert!(
            why(
                &with(Some("a b"), GroupProtocol::Cooperative, &[]),
                "instance_id"
            )
            .contains("' '")
        );
        let long = "x".repeat(MAX_INSTANCE_ID + 1);
        why(
            &with(Some(&long), GroupProtocol::Cooperative, &[]),
            "instance_id",
        );
    }

    #[test]
    fn extra_may_not_set_what_the_protocol_owns() {
        for name in [
            "group.protocol",
            "partition.assignment.strategy",
            "group.instance.id",
        ] {
            assert!(why(&with(None, GroupProtocol::Cooperative, &[name]), "extra").contains(name));
        }
        let session = why(
            &with(None, GroupProtocol::Consumer, &["session.timeout.ms"]),
            "extra",
        );
        assert!(session.contains("session.timeout.ms") && session.contains("group.consumer"));
        with(None, GroupProtocol::Cooperative, &["session.timeout.ms"])
            .validate()
            .expect("the classic protocol takes its session timeout from the client");
    }

    #[cfg(feature = "librdkafka")]
    #[test]
    fn each_consumer_of_a_process_gets_its_own_id() {
        assert_eq!(
            instance_id("pod-0", "sluice-dispatcher", 1),
            "pod-0.sluice-dispatcher"
        );
        assert_eq!(
            instance_id("pod-0", "sluice-dispatcher", 2),
            "pod-0.sluice-dispatcher-2"
        );
        assert_eq!(instance_id("pod-0", "a group/x", 1), "pod-0.a_group_x");
        let long = instance_id(&"p".repeat(MAX_INSTANCE_ID), &"g".repeat(255), 12);
        assert_eq!(long.len(), KAFKA_MAX_INSTANCE_ID);
        assert!(long.ends_with("-12"));
    }

    #[cfg(feature = "librdkafka")]
    #[test]
    fn consumers_get_the_protocol_and_the_instance_id() {
        let config = with(Some("pod-0"), GroupProtocol::Cooperative, &[]);
        let consumer = config.consumer("g", "m", Some("pod-0.g"));
        assert_eq!(
            consumer.get("partition.assignment.strategy"),
            Some("cooperative-sticky")
        );
        assert_eq!(consumer.get("group.protocol"), Some("classic"));
        assert_eq!(consumer.get("group.instance.id"), Some("pod-0.g"));
        assert_eq!(
            consumer.get("heartbeat.interval.ms"),
            Some(DEFAULT_HEARTBEAT_MS)
        );
        let tuned = with(None, GroupProtocol::Cooperative, &["heartbeat.interval.ms"]);
        assert_eq!(
            tuned.consumer("g", "m", None).get("heartbeat.interval.ms"),
            Some("1"),
            "extra's heartbeat wins"
        );
        let kip848 = with(None, GroupProtocol::Consumer, &[]).consumer("g", "m", None);
        assert_eq!(kip848.get("group.protocol"), Some("consumer"));
        assert_eq!(kip848.get("partition.assignment.strategy"), None);
        assert_eq!(kip848.get("group.instance.id"), None);
        assert_eq!(
            kip848.get("heartbeat.interval.ms"),
            None,
            "the broker's, under KIP-848"
        );
        let eager = with(None, GroupProtocol::Eager, &[]).consumer("g", "m", None);
        assert_eq!(
            eager.get("partition.assignment.strategy"),
            Some("range,roundrobin")
        );
    }
}
