//! The ledger file's schema and its upgrades, opening a connection, and the mapping between
//! stored rows (JSON text, SQLite errors) and the ledger's types. A file that is not a Sluice
//! ledger, or that a newer build wrote, is refused before anything is written to it.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode};
use serde::{Deserialize, Serialize};

use sluice_core::command::{Command, CommandStatus};

use super::SqliteConfig;
use crate::LedgerError;

/// `PRAGMA application_id` of a Sluice ledger: "SLCE".
const APPLICATION_ID: i64 = 0x534C_4345;
/// Schema version this build writes.
const SCHEMA_VERSION: i64 = 2;
/// From schema version 1: a run can be closed (a rollback shuts it to new commands).
const MIGRATE_1_TO_2: &str = "ALTER TABLE runs ADD COLUMN closed_at INTEGER;";
/// Sweep-shard leases and the reconcilers that split them (`crate::shards`). Created on every
/// open, not by a version step: the tables are new and apart from everything else, so a file
/// of any version takes them, and a build without them never looks.
const SWEEP_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sweep_shards (
    sweep_group TEXT    NOT NULL,
    shard       INTEGER NOT NULL,
    holder      TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (sweep_group, shard)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sweep_members (
    sweep_group TEXT    NOT NULL,
    name        TEXT    NOT NULL,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (sweep_group, name)
) WITHOUT ROWID;
";

/// Flow controls (`crate::flow`): created on every open like the sweep's tables, for the same
/// reasons.
const FLOW_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS flow_controls (
    name    TEXT    NOT NULL PRIMARY KEY,
    version INTEGER NOT NULL,
    body    TEXT    NOT NULL
) WITHOUT ROWID;
";

/// Spend budgets' counters and holds (`crate::BudgetStore`), created on every open like the
/// sweep tables. A counter's `used` is the sum of its `held` holds' amounts, kept in the same
/// write transaction as every change of a hold.
const BUDGET_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS budget_counters (
    counter      TEXT    NOT NULL PRIMARY KEY,
    budget       TEXT    NOT NULL,
    scope_value  TEXT    NOT NULL,
    window_start INTEGER NOT NULL,
    currency     TEXT    NOT NULL,
    used         INTEGER NOT NULL,
    holds        INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS budget_counters_window ON budget_counters (budget, window_start);
CREATE TABLE IF NOT EXISTS budget_holds (
    run_id      TEXT    NOT NULL,
    command_key TEXT    NOT NULL,
    tag         TEXT    NOT NULL,
    counter     TEXT    NOT NULL,
    amount      INTEGER NOT NULL,
    state       TEXT    NOT NULL,
    PRIMARY KEY (run_id, command_key, tag, counter)
) WITHOUT ROWID;
";

/// Webhook deliveries (`crate::WebhookStore`), created on every open like the sweep tables.
/// `record` is the delivery as JSON; the other columns are what the writes and reads select on.
const WEBHOOK_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS webhook_deliveries (
    webhook    TEXT    NOT NULL,
    event_id   TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    status     TEXT    NOT NULL,
    next_at    INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    record     TEXT    NOT NULL,
    PRIMARY KEY (webhook, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS webhook_deliveries_due
    ON webhook_deliveries (webhook, status, next_at);
";

/// Evidence received by webhook (`crate::EvidenceStore`), created on every open like the
/// webhook tables. `record` is the record as JSON.
const EVIDENCE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS evidence_events (
    source          TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    received_at     INTEGER NOT NULL,
    held_for        TEXT,
    record          TEXT    NOT NULL,
    PRIMARY KEY (source, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS evidence_events_received
    ON evidence_events (source, received_at);
CREATE INDEX IF NOT EXISTS evidence_events_held
    ON evidence_events (held_for) WHERE held_for IS NOT NULL;
";

/// The reference index of evidence matched by the upstream's reference
/// (`crate::EvidenceStore::reference_put`), created on every open like the sweep tables: the
/// first command to index a (tool, reference) holds it; its rows go with their run's purge.
const REFERENCE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS evidence_references (
    tool        TEXT    NOT NULL,
    reference   TEXT    NOT NULL,
    run_id      TEXT    NOT NULL,
    command_key TEXT    NOT NULL,
    PRIMARY KEY (tool, reference)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS evidence_references_run ON evidence_references (run_id);
";

/// Approval links' uses (`crate::LinkStore`), created on every open like the sweep tables.
const LINK_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS approval_link_uses (
    link_id     TEXT    NOT NULL PRIMARY KEY,
    run_id      TEXT    NOT NULL,
    command_key TEXT    NOT NULL,
    used_at     INTEGER NOT NULL
) WITHOUT ROWID;
";

// Layout notes. Run ids are random, so every index keyed by run id puts each write on a
// random page, and a group commit then rewrites pages all over the file. Instead each run gets
// a `run_seq` (the rowid of its `runs` row) when it is first seen: runs are created over time
// and do most of their work soon after, so rows and index entries keyed by `run_seq` land on a
// few recent pages. Only `runs_id` (run id → run_seq) is random, and it changes once per run.
// A run's audit head is the last row of its chain, and whether it is finished is read from its
// commands, so no per-run row is rewritten on every transition.
// `commands` and `audit` are rowid tables, appended at the end. Journal order within a run is
// sorted in memory (a run has few commands).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    run_seq    INTEGER PRIMARY KEY,
    run_id     TEXT    NOT NULL,
    created_at INTEGER NOT NULL,
    closed_at  INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS runs_id ON runs (run_id);
CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at);
CREATE TABLE IF NOT EXISTS commands (
    run_seq     INTEGER NOT NULL,
    run_id      TEXT    NOT NULL,
    command_key TEXT    NOT NULL,
    decision    INTEGER NOT NULL,
    call_idx    INTEGER NOT NULL,
    status      TEXT    NOT NULL,
    lease_epoch INTEGER NOT NULL,
    due_at      INTEGER,
    args_hash   TEXT    NOT NULL,
    identity    TEXT    NOT NULL,
    state       TEXT    NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS commands_key ON commands (run_seq, command_key);
CREATE INDEX IF NOT EXISTS commands_due ON commands (due_at) WHERE due_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS audit (
    run_seq   INTEGER NOT NULL,
    seq       INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    record    TEXT    NOT NULL,
    prev_hash TEXT    NOT NULL,
    hash      TEXT    NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS audit_chain ON audit (run_seq, seq);
CREATE TABLE IF NOT EXISTS business_keys (
    tool         TEXT    NOT NULL,
    business_key TEXT    NOT NULL,
    run_id       TEXT    NOT NULL,
    command_key  TEXT    NOT NULL,
    claimed_at   INTEGER NOT NULL,
    PRIMARY KEY (tool, business_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS business_keys_run ON business_keys (run_id);
CREATE TABLE IF NOT EXISTS checkpoints (
    run_id    TEXT    NOT NULL PRIMARY KEY,
    last_hash TEXT    NOT NULL,
    count     INTEGER NOT NULL,
    purged_at INTEGER NOT NULL
) WITHOUT ROWID;
";

/// The terminal statuses as an SQL list: `('CONFIRMED', …)`.
pub(super) static TERMINAL_STATUSES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let names: Vec<String> = CommandStatus::ALL
        .iter()
        .filter(|status| status.is_terminal())
        .map(|status| format!("'{}'", status.as_str()))
        .collect();
    format!("({})", names.join(", "))
});

/// The time of a run's last audit record (run `r`), for read queries.
pub(super) const LAST_AUDIT_AT: &str =
    "(SELECT a.at FROM audit a WHERE a.run_seq = r.run_seq ORDER BY a.seq DESC LIMIT 1)";

/// The `run_seq` of a run id, for read queries.
pub(super) const RUN_SEQ: &str = "(SELECT run_seq FROM runs WHERE run_id = ?1)";

pub(super) fn open_connection(
    path: &Path,
    config: &SqliteConfig,
) -> Result<Connection, LedgerError> {
    let conn = Connection::open(path).map_err(|e| map_err(e, "open", path, config))?;
    conn.busy_timeout(Duration::from_millis(config.busy_timeout_ms))
        .map_err(|e| map_err(e, "open", path, config))?;
    // Every statement the writer uses stays prepared (the default cache holds only 16).
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Checks that the file is ours (or empty), turns WAL on and creates the schema.
pub(super) fn prepare_schema(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let corrupt = |why: String| LedgerError::Corrupt {
        path: path.to_owned(),
        why,
    };
    let not_a_ledger = |e: rusqlite::Error| match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => corrupt("the file is not an SQLite database".into()),
        Some(ErrorCode::DatabaseCorrupt) => corrupt("the database file is damaged".into()),
        _ => LedgerError::Storage {
            op: "open",
            source: Box::new(e),
        },
    };
    let app_id: i64 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .map_err(not_a_ledger)?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(not_a_ledger)?;
    let tables: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_master", [], |row| row.get(0))
        .map_err(not_a_ledger)?;
    if app_id != APPLICATION_ID && (app_id != 0 || tables > 0) {
        return Err(corrupt(format!(
            "it belongs to another application (application_id {app_id:#x}, {tables} schema objects)"
        )));
    }
    if version > SCHEMA_VERSION {
        return Err(LedgerError::SchemaTooNew {
            path: path.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))
        .map_err(not_a_ledger)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(corrupt(format!("cannot switch to WAL mode (got {mode})")));
    }
    if version < SCHEMA_VERSION {
        // The immediate lock makes concurrent first opens by several processes safe: the
        // version is read again under it, so the second one finds the schema in place.
        let upgrade = || -> Result<(), rusqlite::Error> {
            conn.execute_batch("BEGIN IMMEDIATE")?;
            let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
            if version == 0 {
                conn.execute_batch(SCHEMA)?;
            }
            if version == 1 {
                conn.execute_batch(MIGRATE_1_TO_2)?;
            }
            conn.execute_batch(&format!(
                "PRAGMA application_id = {APPLICATION_ID}; \
                 PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))
        };
        upgrade().map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            not_a_ledger(e)
        })?;
    }
    conn.execute_batch(SWEEP_SCHEMA).map_err(not_a_ledger)?;
    conn.execute_batch(LINK_SCHEMA).map_err(not_a_ledger)?;
    conn.execute_batch(FLOW_SCHEMA).map_err(not_a_ledger)?;
    conn.execute_batch(WEBHOOK_SCHEMA).map_err(not_a_ledger)?;
    conn.execute_batch(EVIDENCE_SCHEMA).map_err(not_a_ledger)?;
    conn.execute_batch(REFERENCE_SCHEMA).map_err(not_a_ledger)?;
    conn.execute_batch(BUDGET_SCHEMA).map_err(not_a_ledger)?;
    Ok(())
}

/// Maps a SQLite error to the ledger error a caller can act on.
pub(super) fn map_err(
    e: rusqlite::Error,
    op: &'static str,
    path: &Path,
    config: &SqliteConfig,
) -> LedgerError {
    match e.sqlite_error_code() {
        Some(ErrorCode::DiskFull) => LedgerError::Full {
            path: path.to_owned(),
        },
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => LedgerError::Locked {
            path: path.to_owned(),
            timeout_ms: config.busy_timeout_ms,
        },
        Some(ErrorCode::NotADatabase) => LedgerError::Corrupt {
            path: path.to_owned(),
            why: "the file is not an SQLite database".into(),
        },
        Some(ErrorCode::DatabaseCorrupt) => LedgerError::Corrupt {
            path: path.to_owned(),
            why: "the database file is damaged".into(),
        },
        Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => {
            LedgerError::Open {
                path: path.to_owned(),
                source: std::io::Error::other(e),
            }
        }
        _ => LedgerError::Storage {
            op,
            source: Box::new(e),
        },
    }
}

pub(super) fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    run_id: &str,
    text: &str,
) -> Result<T, LedgerError> {
    serde_json::from_str(text).map_err(|e| LedgerError::Decode {
        what,
        run_id: run_id.to_owned(),
        why: e.to_string(),
    })
}

pub(super) fn encode<T: Serialize>(value: &T) -> String {
    // Serializing our own types to a String cannot fail: they hold no maps with non-string
    // keys and no failing Serialize impls.
    serde_json::to_string(value).unwrap_or_default()
}

/// A stored command ([`crate::stored::command`]): one that does not decode is
/// [`LedgerError::UndecodableCommand`], one of a newer build's status
/// [`LedgerError::NewerCommand`].
pub(super) fn row_command(
    run_id: &str,
    command_key: &str,
    identity: &str,
    state: &str,
) -> Result<Command, LedgerError> {
    crate::stored::command(run_id, command_key, identity, state)
}
