//! Bus errors. Each names the topic, group, partition or offset it concerns and what to do.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BusError {
    /// A configuration value is unusable; `key` is its name in the configuration.
    #[error("invalid bus configuration `{key}`: {why}")]
    InvalidConfig { key: &'static str, why: String },
    /// A consumer group name is unusable.
    #[error("invalid consumer group {group:?}: {why}")]
    InvalidGroup { group: String, why: &'static str },
    /// The message is larger than the bus accepts. Nothing was published.
    #[error(
        "message for {topic} with key {key:?} is {bytes} bytes, more than the {max} bytes the bus accepts; nothing was published"
    )]
    MessageTooLarge {
        topic: String,
        key: String,
        bytes: usize,
        max: usize,
    },
    /// The partition moved to another member of the group after this delivery was handed out;
    /// the message is redelivered to the new owner.
    #[error(
        "partition {partition} of {topic} was revoked from this member of group {group}; offset {offset} is redelivered to the new owner"
    )]
    Revoked {
        topic: String,
        group: String,
        partition: u32,
        offset: u64,
    },
    /// The delivery is not the one in flight on its partition (it was not handed out by this
    /// bus, or not yet).
    #[error("offset {offset} of {topic} partition {partition} is not in flight for group {group}")]
    NotInFlight {
        topic: String,
        group: String,
        partition: u32,
        offset: u64,
    },
    /// The broker or client failed during `op`; whether a publish was accepted is unknown, so
    /// publish again (handlers are idempotent).
    #[error("bus {op} on {topic} failed: {source}")]
    Backend {
        op: &'static str,
        topic: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The broker refused the bus's user a permission it needs (an ACL is missing): what to
    /// grant, on which resource, and what it is needed for.
    #[error("the bus user lacks the {operation} permission on {resource}: {why}")]
    Forbidden {
        operation: &'static str,
        resource: String,
        why: String,
    },
    /// The bus was closed (shutdown).
    #[error("the bus is closed")]
    Closed,
}

impl BusError {
    /// Worth trying the same request again later.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Backend { .. })
    }
}
