//! Errors of setting the CQL ledger up. Errors of ledger operations are
//! [`sluice_ledger::LedgerError`]s, like those of every other ledger.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CqlError {
    /// A setting is wrong; the key names it.
    #[error("invalid CQL ledger setting `{key}`: {why}")]
    Config { key: &'static str, why: String },
    /// No node of the cluster answered.
    #[error(
        "cannot connect to the CQL cluster at {nodes}; check that it runs and that the addresses are right"
    )]
    #[cfg(feature = "driver")]
    Connect {
        nodes: String,
        #[source]
        source: Box<scylla::errors::NewSessionError>,
    },
    /// A schema statement failed.
    #[error("schema migration of keyspace {keyspace} failed at: {statement}")]
    Migrate {
        keyspace: String,
        statement: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The keyspace has no Sluice schema, or one from a newer Sluice.
    #[error("keyspace {keyspace} {why}")]
    Schema { keyspace: String, why: String },
    /// The keyspace was migrated by a newer Sluice than this binary: a binary rolled back past
    /// a migration, or started before the roll reached it.
    #[error(
        "keyspace {keyspace} has ledger schema version {found}, newer than this build's {supported}; run a Sluice build of schema version {found} or later (a rollback past a migration needs the keyspace restored from before it: docs/operations.md, \"Upgrading Sluice\")"
    )]
    SchemaTooNew {
        keyspace: String,
        found: i64,
        supported: i64,
    },
    /// A schema file recorded as applied does not match this build's copy of it.
    #[error(
        "keyspace {keyspace} recorded schema file {file} with checksum {recorded}, but this build's {file} has {expected}: a released schema file was changed, or another build migrated the keyspace; restore the file as released or migrate with the build that applied it"
    )]
    ChecksumMismatch {
        keyspace: String,
        file: String,
        recorded: String,
        expected: String,
    },
    /// A statement could not be prepared (the schema is not the one this build expects).
    #[error(
        "cannot prepare a ledger statement on keyspace {keyspace} (a table this build needs may be \
         missing: run `sluice migrate`): {statement}"
    )]
    #[cfg(feature = "driver")]
    Prepare {
        keyspace: String,
        statement: String,
        #[source]
        source: Box<scylla::errors::PrepareError>,
    },
}
