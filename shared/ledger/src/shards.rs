//! Sweep-shard leases in the ledger: the rows by which reconcilers split the due index's
//! shards ([`sluice_core::sweep`] decides; the ledger stores with an epoch compare-and-set,
//! like a command's lease), and the members that announce themselves to the split.

use serde::{Deserialize, Serialize};

pub use sluice_core::sweep::{Member, ShardLease};

use crate::LedgerError;

/// What a reconciler reads before it plans: a group's shard leases and its members.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SweepView {
    /// One per shard ever leased, in shard order.
    pub leases: Vec<ShardLease>,
    /// Every member that announced itself and is not long gone (expired ones may be listed).
    pub members: Vec<Member>,
}

/// The outcome of a shard lease write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardCas {
    /// Written; this is the lease as stored now.
    Applied(ShardLease),
    /// The stored epoch was not the guard; this is the lease as stored (`None`: never leased).
    Conflict(Option<ShardLease>),
}

impl ShardCas {
    pub fn is_applied(&self) -> bool {
        matches!(self, Self::Applied(_))
    }
}

/// Checks a shard lease write before it is made: the epoch never goes back, a first lease
/// has an epoch, and the group and holder are named.
pub fn validate(group: &str, guard: Option<u64>, next: &ShardLease) -> Result<(), LedgerError> {
    let why = if group.is_empty() || group.len() > 128 {
        Some("a sweep group is named by 1 to 128 bytes")
    } else if next.holder.is_empty() || next.holder.len() > 256 {
        Some("a shard lease holder is named by 1 to 256 bytes")
    } else if guard.is_some_and(|epoch| next.epoch < epoch) {
        Some("a shard lease epoch may not go back")
    } else if guard.is_none() && next.epoch == 0 {
        Some("a first shard lease has an epoch of at least 1")
    } else {
        None
    };
    match why {
        Some(why) => Err(LedgerError::InvalidRequest {
            run_id: format!("sweep group {group}"),
            command_key: format!("shard {}", next.shard),
            why: why.to_owned(),
        }),
        None => Ok(()),
    }
}
