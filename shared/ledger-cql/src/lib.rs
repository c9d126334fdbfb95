//! The Sluice command ledger on ScyllaDB / Cassandra ([`CqlLedger`]), with its schema
//! ([`migrate`]) and its round-trip counters ([`CqlStats`]).
//!
//! * [`config`] — [`CqlConfig`]: nodes, keyspace, replication, consistency levels.
//! * [`schema`] — `schemas/cql/*.cql`, applied idempotently by [`migrate`].
//! * `ledger` — the [`sluice_ledger::Ledger`] implementation: one lightweight transaction per
//!   contract write on one run's partition, the audit head in static columns.
//! * [`stats`] — LWT / SERIAL / plain round trips per operation.
//! * `tls` — [`CqlTls`]: TLS to the nodes on rustls, client certificates optional.
//!
//! It passes the same contract suite as the embedded SQLite ledger
//! (`sluice_ledger::ledger_contract_tests!`), against a real Cassandra 5 node in
//! `tests/cassandra.rs`. docs/cql.md explains the schema, the write protocol and where
//! ScyllaDB differs.

#[cfg(feature = "driver")]
mod codec;
pub mod config;
mod error;
#[cfg(feature = "driver")]
mod ledger;
pub mod schema;
#[cfg(feature = "driver")]
mod statements;
#[cfg(feature = "driver")]
pub mod stats;
mod tls;

pub use config::{Consistency, CqlConfig, CqlTls, Replication, Secret, Serial, Tablets};
pub use error::CqlError;
#[cfg(feature = "driver")]
pub use ledger::{CqlLedger, connect_session};
pub use schema::{
    AppliedFile, SCHEMA_VERSION, file_checksum, record_statements, schema_files, schema_statements,
};
#[cfg(feature = "driver")]
pub use schema::{applied_files, check as check_schema, drop_keyspace, migrate, migrate_with};
#[cfg(feature = "driver")]
pub use stats::{CqlStats, Op, OpCounts, StatsSnapshot};
