//! Settings of the CQL ledger: where the cluster is, which keyspace, how the keyspace is
//! replicated, which consistency levels the reads, writes and lightweight transactions use.

use std::collections::BTreeMap;
use std::fmt;

#[cfg(feature = "driver")]
use scylla::frame::types::{Consistency as DriverConsistency, SerialConsistency};
use serde::{Deserialize, Serialize};

use crate::CqlError;
pub use crate::tls::CqlTls;
pub use sluice_core::secret::Secret;

/// How the keyspace is replicated when `migrate` creates it (an existing keyspace is left as
/// it is: changing replication is an operator's decision, with a repair after it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case", deny_unknown_fields)]
pub enum Replication {
    /// `SimpleStrategy`: one replication factor for the whole cluster. Tests and one-DC dev.
    Simple { replication_factor: u32 },
    /// `NetworkTopologyStrategy`: a replication factor per datacenter. Production.
    NetworkTopology { datacenters: BTreeMap<String, u32> },
}

impl Default for Replication {
    fn default() -> Self {
        Self::Simple {
            replication_factor: 1,
        }
    }
}

impl fmt::Display for Replication {
    /// The CQL map of `WITH replication = …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Simple { replication_factor } => write!(
                f,
                "{{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}"
            ),
            Self::NetworkTopology { datacenters } => {
                f.write_str("{'class': 'NetworkTopologyStrategy'")?;
                for (dc, rf) in datacenters {
                    write!(f, ", '{dc}': {rf}")?;
                }
                f.write_str("}")
            }
        }
    }
}

impl Replication {
    pub(crate) fn validate(&self) -> Result<(), CqlError> {
        let bad = |why: String| {
            Err(CqlError::Config {
                key: "replication",
                why,
            })
        };
        match self {
            Self::Simple {
                replication_factor: 0,
            } => bad("replication_factor must be at least 1".into()),
            Self::Simple { .. } => Ok(()),
            Self::NetworkTopology { datacenters } if datacenters.is_empty() => {
                bad("name at least one datacenter".into())
            }
            Self::NetworkTopology { datacenters } => {
                for (dc, rf) in datacenters {
                    let plain = !dc.is_empty()
                        && dc
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
                    if !plain {
                        return bad(format!("datacenter name {dc:?} is not a plain name"));
                    }
                    if *rf == 0 {
                        return bad(format!("datacenter {dc} has replication factor 0"));
                    }
                }
                Ok(())
            }
        }
    }
}

/// Whether `migrate` asks ScyllaDB for a keyspace without tablets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tablets {
    /// No tablets clause: what Cassandra needs (it does not know the option).
    #[default]
    ServerDefault,
    /// `AND tablets = {'enabled': false}`: ScyllaDB does not run lightweight transactions in a
    /// keyspace with tablets, and recent versions enable them by default.
    Disabled,
}

impl Tablets {
    /// The clause after `WITH replication = …` in `CREATE KEYSPACE`.
    pub(crate) fn clause(self) -> &'static str {
        match self {
            Self::ServerDefault => "",
            Self::Disabled => " AND tablets = {'enabled': false}",
        }
    }
}

/// Consistency of plain reads and writes and of the commit phase of a lightweight transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// A majority of all replicas.
    #[default]
    Quorum,
    /// A majority of the replicas in the local datacenter (multi-DC deployments).
    LocalQuorum,
}

impl Consistency {
    #[cfg(feature = "driver")]
    pub(crate) fn driver(self) -> DriverConsistency {
        match self {
            Self::Quorum => DriverConsistency::Quorum,
            Self::LocalQuorum => DriverConsistency::LocalQuorum,
        }
    }
}

/// Consistency of the Paxos phase of a lightweight transaction, and of the linearizable reads
/// that settle an LWT whose outcome is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Serial {
    /// Linearizable across all datacenters.
    #[default]
    Serial,
    /// Linearizable within the local datacenter only: cheaper, and correct as long as every
    /// writer of a run is in the same datacenter.
    LocalSerial,
}

impl Serial {
    #[cfg(feature = "driver")]
    pub(crate) fn driver(self) -> SerialConsistency {
        match self {
            Self::Serial => SerialConsistency::Serial,
            Self::LocalSerial => SerialConsistency::LocalSerial,
        }
    }

    /// The same level as a read consistency (a SERIAL read).
    #[cfg(feature = "driver")]
    pub(crate) fn as_read(self) -> DriverConsistency {
        match self {
            Self::Serial => DriverConsistency::Serial,
            Self::LocalSerial => DriverConsistency::LocalSerial,
        }
    }
}

/// Settings of the CQL ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CqlConfig {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Credentials for a cluster with authentication on (`PasswordAuthenticator`). Keep the
    /// password out of the file: `SLUICE_LEDGER__CQL__PASSWORD`, or
    /// `password = { file = "…" }` / `{ env = "…" }` (see `sluice_runtime::config`).
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// TLS to the nodes (`[ledger.cql.tls]`); off unless enabled.
    pub tls: CqlTls,
    pub keyspace: String,
    pub replication: Replication,
    /// `disabled` on ScyllaDB (LWT needs a keyspace without tablets).
    pub tablets: Tablets,
    /// Apply the schema when connecting. Off where services may not run DDL: then
    /// `sluice migrate` (or [`crate::migrate`]) must have run first.
    pub migrate_on_start: bool,
    pub consistency: Consistency,
    pub serial_consistency: Serial,
    /// Client-side limit of one request, in milliseconds. An LWT that hits it has an unknown
    /// outcome and is settled by a SERIAL read.
    pub request_timeout_ms: u64,
    /// Client-side limit of a lightweight transaction, in milliseconds; 0 for
    /// `request_timeout_ms`. A Paxos round takes several replica round trips, so it may be
    /// given longer than a plain request (and tests set it tiny to force unknown outcomes).
    pub lwt_timeout_ms: u64,
    /// How long to wait after an LWT's outcome became unknown before the SERIAL read that
    /// settles it. A client-side timeout does not stop a request already sent: it may still be
    /// queued at the coordinator and start its Paxos round after an immediate read. Waiting
    /// out the server's own limits (Cassandra: `cas_contention_timeout` 1 s plus
    /// `write_request_timeout` 2 s by default) leaves it no time to apply afterwards.
    pub unknown_settle_delay_ms: u64,
    pub connect_timeout_ms: u64,
    /// Shards of the due index per minute. Fixed for the life of a keyspace: entries are
    /// filed by `fnv1a(run_id) % due_shards`.
    pub due_shards: u32,
    /// Sweep cursors stay this many minutes behind the clock: a writer whose clock lags by
    /// less than this (or that stalls less than this between computing and writing an entry)
    /// is never missed.
    pub sweep_lag_minutes: i64,
    /// Business keys expire this many days plus one after their claim, a backstop for keys
    /// a purge did not reach; 0 (the default) keeps them until their run is purged. Not the
    /// runs' retention: that is `reconciler.retention_days` (30 days by default), carried out
    /// by the reconciler's scheduled purge, which removes a run's keys with it.
    pub retention_days: u32,
    /// A business key whose holder does not exist (a reservation that died between its claim
    /// and its insert) may be taken over after this long, in milliseconds.
    pub orphan_claim_grace_ms: u64,
    /// Attempts of one operation under contention on the run's audit head before giving up.
    pub max_attempts: u32,
}

impl Default for CqlConfig {
    fn default() -> Self {
        Self {
            nodes: vec!["127.0.0.1:9042".into()],
            username: None,
            password: None,
            tls: CqlTls::default(),
            keyspace: "sluice".into(),
            replication: Replication::default(),
            tablets: Tablets::default(),
            migrate_on_start: true,
            consistency: Consistency::default(),
            serial_consistency: Serial::default(),
            request_timeout_ms: 10_000,
            lwt_timeout_ms: 0,
            unknown_settle_delay_ms: 3_500,
            connect_timeout_ms: 5_000,
            due_shards: 4,
            sweep_lag_minutes: 5,
            retention_days: 0,
            orphan_claim_grace_ms: 30_000,
            max_attempts: 64,
        }
    }
}

impl CqlConfig {
    /// Checks every setting once, naming the key that is wrong.
    pub fn validate(&self) -> Result<(), CqlError> {
        if self.password.is_some() && self.username.is_none() {
            return Err(CqlError::Config {
                key: "password",
                why: "is set without a username".into(),
            });
        }
        if self.username.as_deref() == Some("") {
            return Err(CqlError::Config {
                key: "username",
                why: "is empty: leave it out for a cluster without authentication".into(),
            });
        }
        self.tls.validate()?;
        if self.nodes.is_empty() {
            return Err(CqlError::Config {
                key: "nodes",
                why: "name at least one contact point (host:port)".into(),
            });
        }
        validate_keyspace(&self.keyspace)?;
        self.replication.validate()?;
        let positive = [
            ("request_timeout_ms", self.request_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("due_shards", u64::from(self.due_shards)),
            ("max_attempts", u64::from(self.max_attempts)),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err(CqlError::Config {
                    key,
                    why: "must be greater than 0".into(),
                });
            }
        }
        if self.due_shards > 1024 {
            return Err(CqlError::Config {
                key: "due_shards",
                why: "at most 1024 (every sweep reads each shard)".into(),
            });
        }
        if !(1..=1440).contains(&self.sweep_lag_minutes) {
            return Err(CqlError::Config {
                key: "sweep_lag_minutes",
                why: "between 1 and 1440".into(),
            });
        }
        Ok(())
    }

    /// TTL of a business key claim in seconds; 0 for none.
    #[cfg(feature = "driver")]
    pub(crate) fn business_key_ttl(&self) -> i32 {
        if self.retention_days == 0 {
            return 0;
        }
        let days = i64::from(self.retention_days) + 1;
        i32::try_from(days * 86_400).unwrap_or(i32::MAX)
    }
}

/// A keyspace name CQL accepts unquoted, checked because it is spliced into statements.
pub fn validate_keyspace(keyspace: &str) -> Result<(), CqlError> {
    let ok = !keyspace.is_empty()
        && keyspace.len() <= 48
        && keyspace.starts_with(|c: char| c.is_ascii_lowercase())
        && keyspace
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(CqlError::Config {
            key: "keyspace",
            why: format!(
                "{keyspace:?} is not a keyspace name: use 1-48 of a-z, 0-9 and _, starting with a letter"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replication_renders_as_a_cql_map() {
        assert_eq!(
            Replication::default().to_string(),
            "{'class': 'SimpleStrategy', 'replication_factor': 1}"
        );
        let nts = Replication::NetworkTopology {
            datacenters: [("dc1".to_owned(), 3), ("dc2".to_owned(), 2)].into(),
        };
        assert_eq!(
            nts.to_string(),
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3, 'dc2': 2}"
        );
    }

    #[test]
    fn bad_settings_are_named() {
        let mut config = CqlConfig {
            keyspace: "Sluice-prod".into(),
            ..CqlConfig::default()
        };
        let err = config.validate().expect_err("bad keyspace");
        assert!(err.to_string().contains("keyspace"), "{err}");
        config.keyspace = "sluice".into();
        config.replication = Replication::NetworkTopology {
            datacenters: [("dc1'; DROP".to_owned(), 3)].into(),
        };
        let err = config.validate().expect_err("bad dc");
        assert!(err.to_string().contains("replication"), "{err}");
        config.replication = Replication::default();
        config.due_shards = 0;
        assert!(config.validate().is_err());
        config.due_shards = 4;
        config.validate().expect("defaults are valid");
    }

    #[test]
    fn passwords_do_not_reach_debug() {
        let config = CqlConfig {
            username: Some("sluice".into()),
            password: Some(Secret::new("hunter2")),
            ..CqlConfig::default()
        };
        config.validate().expect("valid");
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("sluice"),
            "{shown}"
        );
        let orphan = CqlConfig {
            password: Some(Secret::new("x")),
            ..CqlConfig::default()
        };
        assert!(orphan.validate().is_err());
    }

    #[test]
    fn business_keys_outlive_retention_by_a_day() {
        let mut config = CqlConfig::default();
        assert_eq!(config.business_key_ttl(), 0);
        config.retention_days = 30;
        assert_eq!(config.business_key_ttl(), 31 * 86_400);
    }
}
