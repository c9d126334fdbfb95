//! The embedded ledger: one SQLite file in WAL mode, one writer thread with group commit.
//!
//! Writes go through a channel to a single writer thread. The writer takes every request
//! waiting (up to `max_batch`), applies them in one `BEGIN IMMEDIATE` transaction and commits
//! once, then answers each caller: a caller hears "applied" only after its write is durable, and
//! one fsync serves the whole batch. While the ledger is busy, a batch found small waits up to
//! `commit_gather_us` for company before it commits (see [`GATHER_BELOW`]). Compare-and-set is
//! an `UPDATE … WHERE status = ? AND lease_epoch = ?` that changed one row.
//!
//! Failure handling: logical refusals (argument drift, a guard that no longer holds) are
//! decided before anything is written, so they never disturb the batch. A storage error (disk
//! full, lock timeout, corruption) rolls the whole batch back and each request is then retried
//! alone, so the caller whose request cannot be written gets the error and the others are not
//! punished for it. No request is ever half-applied.
//!
//! Several processes may share the file: each has its own writer, and SQLite's lock serialises
//! them (waiting up to `busy_timeout`). The writer caches each run's audit head; it drops the
//! cache whenever `PRAGMA data_version` shows that another connection wrote in between.
//! Reads run on a small pool of connections on the blocking thread pool and never wait for the
//! writer. A checkpointer thread copies the WAL into the database file beside the writer, so no
//! commit waits for a checkpoint (see `Checkpointer`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, DEFAULT_NAME, ErrorCode, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, oneshot};

use sluice_core::audit::{
    AuditDraft, AuditEntry, AuditRecord, ChainHead, Checkpoint, PreparedRecord, SealedLink,
};
use sluice_core::command::{Command, CommandState, CommandStatus};
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::time::{Clock, SystemClock, Timestamp};

use crate::identity::Identity;
use crate::quarantine::Quarantine;
use crate::{
    AuditTrail, Cas, Claim, DueItem, Ledger, LedgerError, PurgeReport, Reserved, RunSummary,
    SYSTEM_RUN, Transition, cap_result,
};

/// The directory the embedded ledger lives in unless configured otherwise.
pub const DEFAULT_DATA_DIR: &str = ".sluice";
/// The ledger's file name inside the data directory.
pub const LEDGER_FILE: &str = "ledger.db";
/// The writer's page cache, in KiB (2,048 pages of 4 KiB).
///
/// Big enough to hold every page a group commit dirties (a few hundred) until the commit, so
/// nothing spills to the WAL mid-transaction; the writer's reads are of pages written moments
/// ago. Not bigger: when a B-tree page splits, SQLite renumbers pages through a key far past
/// the end of the file, and the commit then walks the whole cache to drop that key. With
/// 64 MiB that walk showed as 2.3% of the CPU in `perf`, and 8 MiB ran 40k-effect batch
/// passes 7% faster than 64 MiB (eight alternating runs, all won; 2026-11-24).
const WRITER_CACHE_KIB: i64 = 8 * 1024;

/// `PRAGMA application_id` of a Sluice ledger: "SLCE".
const APPLICATION_ID: i64 = 0x534C_4345;
/// Schema version this build writes.
const SCHEMA_VERSION: i64 = 2;
/// From schema version 1: a run can be closed (a rollback shuts it to new commands).
const MIGRATE_1_TO_2: &str = "ALTER TABLE runs ADD COLUMN closed_at INTEGER;";
/// The checkpointer thread copies the WAL into the database each time the log grows by this
/// many frames (pages) past the first step; fewer, larger checkpoints copy a page that changes
/// often fewer times.
const CHECKPOINT_STEP: i32 = 2_048;
/// WAL frames after which the writer finishes the checkpoint itself, so that the log restarts.
const RESTART_FRAMES: i32 = 8_192;

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
static TERMINAL_STATUSES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let names: Vec<String> = CommandStatus::ALL
        .iter()
        .filter(|status| status.is_terminal())
        .map(|status| format!("'{}'", status.as_str()))
        .collect();
    format!("({})", names.join(", "))
});

/// The time of a run's last audit record (run `r`), for read queries.
const LAST_AUDIT_AT: &str =
    "(SELECT a.at FROM audit a WHERE a.run_seq = r.run_seq ORDER BY a.seq DESC LIMIT 1)";

/// The `run_seq` of a run id, for read queries.
const RUN_SEQ: &str = "(SELECT run_seq FROM runs WHERE run_id = ?1)";

/// How hard SQLite syncs a commit to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Durability {
    /// fsync on every commit (every group): a confirmed write survives power loss.
    #[default]
    Full,
    /// fsync at checkpoints only: survives a process crash, may lose the last commits on power
    /// loss. For benchmarks and throwaway environments.
    Normal,
}

/// Settings of the embedded ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SqliteConfig {
    /// The data directory; the file is `<data_dir>/ledger.db`.
    pub data_dir: PathBuf,
    /// How long to wait for another process's lock before giving up, in milliseconds.
    pub busy_timeout_ms: u64,
    /// Most requests committed in one transaction.
    pub max_batch: usize,
    /// Requests waiting for the writer before callers are slowed down.
    pub queue_capacity: usize,
    pub durability: Durability,
    /// Upper bound of the file in pages (4 KiB); `None` for no limit but the disk's.
    pub max_pages: Option<u64>,
    /// How long a small batch waits for more requests while the ledger is busy, in
    /// microseconds; 0 commits every batch at once (see [`GATHER_BELOW`]).
    pub commit_gather_us: u64,
    /// The writer thread's nice value, -20 to 19; `None` leaves it as the process's. See
    /// [`DEFAULT_WRITER_NICE`].
    pub writer_nice: Option<i32>,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            busy_timeout_ms: 5_000,
            max_batch: 2_048,
            queue_capacity: 16_384,
            durability: Durability::Full,
            max_pages: None,
            commit_gather_us: DEFAULT_COMMIT_GATHER_US,
            writer_nice: Some(DEFAULT_WRITER_NICE),
        }
    }
}

impl SqliteConfig {
    pub fn in_dir(data_dir: impl Into<PathBuf>) -> Self {
        Self {
            data_dir: data_dir.into(),
            ..Self::default()
        }
    }

    pub fn path(&self) -> PathBuf {
        self.data_dir.join(LEDGER_FILE)
    }
}

/// The embedded ledger. Cheap to clone; all clones share the writer and the readers.
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    config: SqliteConfig,
    writer: mpsc::Sender<Job>,
    readers: Mutex<Vec<Connection>>,
    /// One permit per read connection: a read waits for a pooled connection rather than
    /// opening a new one (and a new blocking thread) when many arrive at once.
    read_slots: Arc<Semaphore>,
    /// Commands this process left waiting for dispatch: see [`Ledger::cached`].
    waiting: Mutex<Waiting>,
    clock: Arc<dyn Clock>,
    /// Commands found undecodable: `due` skips them.
    quarantine: Arc<Quarantine>,
}

/// Read connections kept open, and reads run at once.
const MAX_READERS: usize = 8;

/// A batch of fewer requests than this, found by a writer that committed within
/// [`BUSY_WITHIN`], waits `commit_gather_us` for more before it commits.
///
/// Under load the writer's answers wake their callers a few at a time, and their next writes
/// trickle in: without the wait, a commit of one to four requests (four pages or more, and an
/// fsync) followed most large ones. With `sluice bench --mode batch --no-paced --effects 40000`,
/// 830 of 2,054 commits held at most four requests, writing 4 WAL pages per request against 0.7 in
/// batches of 65 or more; waiting 400 µs roughly halved the commits. A writer that was idle
/// commits a lone request at once, so the wait costs latency only when the ledger is busy.
pub const GATHER_BELOW: usize = 32;
/// The writer counts as busy this long after a commit.
pub const BUSY_WITHIN: Duration = Duration::from_millis(2);
/// `commit_gather_us` unless configured.
pub const DEFAULT_COMMIT_GATHER_US: u64 = 400;

/// The writer thread's nice value unless configured: ahead of the threads that feed it.
///
/// Every write of the process goes through the one writer thread, and on a machine whose cores
/// are all busy it waited for a core like any other thread: in a 40,000-effect `sluice bench`
/// batch pass on 2 cores it spent 714 ms runnable but not running, against 994 ms running,
/// while everything in flight waited for its answers and the cores went idle 13% of the time.
/// A lower nice value lets it run as soon as it has work. Lowering it needs `CAP_SYS_NICE` (or
/// an `RLIMIT_NICE` allowing it); without, the writer logs that and runs at the process's.
pub const DEFAULT_WRITER_NICE: i32 = -10;

/// At most this many commands are kept in [`Inner::waiting`]; past it the map starts afresh.
const MAX_WAITING: usize = 65_536;

/// The commands behind [`Ledger::cached`], by a hash of their run id and command key, so that
/// noting a command (every reservation and transition) builds no key. Two commands whose
/// hashes collide take turns in one slot: the cache is a hint, and a miss costs a read.
#[derive(Default)]
struct Waiting {
    /// A collision only costs a cache miss, so the fast, randomly seeded hash will do.
    hasher: foldhash::fast::RandomState,
    commands: HashMap<u64, Noted>,
}

/// A waiting command, with a hash of its stored identity text when this process wrote it.
struct Noted {
    command: Command,
    /// Lets the command's next transition reuse this identity instead of decoding the stored
    /// one: it does when the text the writer read back hashes the same.
    identity: Option<u64>,
}

impl std::fmt::Debug for Waiting {
    // The count only: the commands carry their arguments, which stay out of debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("commands", &self.commands.len())
            .finish()
    }
}

impl Waiting {
    fn slot(&self, run_id: &RunId, command_key: &CommandKey) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, (run_id, command_key))
    }

    fn identity_hash(&self, identity: &str) -> u64 {
        std::hash::BuildHasher::hash_one(&self.hasher, identity)
    }

    /// Keeps `command`; `identity` is its stored identity text, when the caller has it.
    fn insert(&mut self, command: Command, identity: Option<&str>) {
        if self.commands.len() >= MAX_WAITING {
            self.commands.clear();
        }
        let slot = self.slot(&command.run_id, &command.command_key);
        let identity = identity.map(|text| self.identity_hash(text));
        self.commands.insert(slot, Noted { command, identity });
    }

    fn get(&self, run_id: &RunId, command_key: &CommandKey) -> Option<&Command> {
        let slot = self.slot(run_id, command_key);
        self.at(slot, run_id, command_key)
            .map(|noted| &noted.command)
    }

    /// The entry in `slot`, if it holds this very command (a collision may hold another).
    fn at(&self, slot: u64, run_id: &RunId, command_key: &CommandKey) -> Option<&Noted> {
        self.commands
            .get(&slot)
            .filter(|n| &n.command.run_id == run_id && &n.command.command_key == command_key)
    }

    /// Takes the command out, if kept with its identity's hash.
    fn take(&mut self, run_id: &RunId, command_key: &CommandKey) -> Option<(Command, u64)> {
        let slot = self.slot(run_id, command_key);
        let hash = self.at(slot, run_id, command_key)?.identity?;
        let noted = self.commands.remove(&slot)?;
        Some((noted.command, hash))
    }

    fn remove(&mut self, run_id: &RunId, command_key: &CommandKey) {
        let slot = self.slot(run_id, command_key);
        if self.at(slot, run_id, command_key).is_some() {
            self.commands.remove(&slot);
        }
    }
}

/// A stored row as text; decoded by the caller, off the writer thread.
type RawRow = (String, String);

/// A write request. Everything the writer needs as text (the command key, the JSON columns, the
/// audit record's canonical form) is computed by the caller, so the single writer thread
/// spends its time on SQL only; and the request goes back to the caller with the answer, so
/// the caller, not the writer, frees it.
enum Op {
    Reserve {
        command: Box<Command>,
        key: String,
        audit: PreparedRecord,
        identity: String,
        state: String,
        /// Refuse if the run holds another submitter's command (`Ledger::reserve_own`).
        confined: bool,
    },
    Transition {
        transition: Box<Transition>,
        key: String,
        state: String,
        audit: Option<PreparedRecord>,
    },
    Claim {
        tool: ToolName,
        business_key: BusinessKey,
        run_id: RunId,
        command_key: CommandKey,
        at: Timestamp,
    },
    Append(PreparedRecord),
    /// A run-level record that also closes the run.
    Close(PreparedRecord),
    Purge {
        older_than: Timestamp,
        max_runs: usize,
        actor: String,
        now: Timestamp,
    },
}

enum ReserveReply {
    Created,
    Existing(RawRow),
    /// The holder of the business key: its run, its key and its row.
    Held(String, String, RawRow),
}

enum CasReply {
    Applied { identity: String },
    Conflict(Option<RawRow>),
}

enum Reply {
    Reserved(ReserveReply),
    Cas(CasReply),
    Claim(Claim),
    Entry(AuditEntry),
    Purged(PurgeReport),
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Answer>,
}

/// The writer's answer, with the request handed back.
struct Answer {
    op: Op,
    result: Result<Reply, LedgerError>,
}

impl SqliteLedger {
    /// Opens (creating if needed) the ledger in `config.data_dir`, on the system clock.
    pub fn open(config: SqliteConfig) -> Result<Self, LedgerError> {
        Self::open_with_clock(config, Arc::new(SystemClock))
    }

    /// Opens the ledger with a clock of the caller's (for the time of run records).
    pub fn open_with_clock(
        config: SqliteConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LedgerError> {
        let path = config.path();
        std::fs::create_dir_all(&config.data_dir).map_err(|source| LedgerError::Open {
            path: config.data_dir.clone(),
            source,
        })?;
        let conn = open_connection(&path, &config)?;
        prepare_schema(&conn, &path)?;
        let (writer, rx) = mpsc::channel(config.queue_capacity.max(1));
        let checkpointer = Checkpointer::start(&path, &config)?;
        let writer_state = Writer {
            conn,
            path: path.clone(),
            config: config.clone(),
            heads: HashMap::default(),
            data_version: None,
            checkpointer,
        };
        std::thread::Builder::new()
            .name("sluice-ledger-writer".into())
            .spawn(move || writer_state.run(rx))
            .map_err(|source| LedgerError::Open {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                config,
                writer,
                readers: Mutex::new(Vec::new()),
                read_slots: Arc::new(Semaphore::new(MAX_READERS)),
                waiting: Mutex::new(Waiting::default()),
                clock,
                quarantine: Arc::new(Quarantine::default()),
            }),
        })
    }

    /// The file this ledger lives in.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Remembers `command` as this process wrote or saw it last, if it waits for dispatch;
    /// forgets it otherwise.
    fn note(&self, command: &Command) {
        self.note_stored(command, None);
    }

    /// The waiting cache's hash of a stored identity text.
    fn identity_hash(&self, identity: &str) -> Option<u64> {
        let waiting = self.inner.waiting.lock().ok()?;
        Some(waiting.identity_hash(identity))
    }

    /// [`Self::note`] for a command whose stored identity text is `identity`.
    fn note_stored(&self, command: &Command, identity: Option<&str>) {
        let Ok(mut waiting) = self.inner.waiting.lock() else {
            return;
        };
        if command.awaits_dispatch() {
            waiting.insert(command.clone(), identity);
        } else {
            waiting.remove(&command.run_id, &command.command_key);
        }
    }

    /// Sends a run-level record (`Op::Append`, `Op::Close`) to the writer; its chain entry.
    async fn entry(&self, op: Op) -> Result<AuditEntry, LedgerError> {
        match self.submit(op).await?.result? {
            Reply::Entry(entry) => Ok(entry),
            _ => Err(LedgerError::Closed),
        }
    }

    /// Sends `op` to the writer; the answer comes once its transaction committed.
    async fn submit(&self, op: Op) -> Result<Answer, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .writer
            .send(Job { op, reply })
            .await
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)
    }

    /// Reserves `command`; `confined` refuses a run holding another submitter's command.
    async fn reserve_as(
        &self,
        mut command: Command,
        audit: AuditDraft,
        confined: bool,
    ) -> Result<Reserved, LedgerError> {
        command.state.result = cap_result(command.state.result.take());
        let identity = encode(&Identity::of(&command));
        let state = encode(&command.state);
        let audit = PreparedRecord::new(&command.run_id, audit, command.state.updated_at);
        let op = Op::Reserve {
            key: command.command_key.to_string(),
            command: Box::new(command),
            audit,
            identity,
            state,
            confined,
        };
        sluice_faults::point!("ledger.reserve.pre");
        let answer = self.submit(op).await?;
        sluice_faults::point!("ledger.reserve.post");
        let Answer {
            op: Op::Reserve {
                command, identity, ..
            },
            result,
        } = answer
        else {
            // The writer hands back the request it was given.
            return Err(LedgerError::Closed);
        };
        let run = command.run_id.as_str();
        match result? {
            Reply::Reserved(ReserveReply::Created) => {
                self.note_stored(&command, Some(&identity));
                Ok(Reserved::Created(*command))
            }
            Reply::Reserved(ReserveReply::Existing((identity, state))) => {
                let key = command.command_key.as_str();
                row_command(run, key, &identity, &state)
                    .map(Reserved::Existing)
                    .map_err(|e| self.inner.quarantine.note(e))
            }
            Reply::Reserved(ReserveReply::Held(run, key, (identity, state))) => {
                row_command(&run, &key, &identity, &state)
                    .map(Reserved::BusinessKeyHeld)
                    .map_err(|e| self.inner.quarantine.note(e))
            }
            _ => Err(LedgerError::Closed),
        }
    }

    /// Runs `read` on a pooled read connection on the blocking pool.
    async fn read<T, F>(&self, op: &'static str, read: F) -> Result<T, LedgerError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, LedgerError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        let slot = Arc::clone(&self.inner.read_slots)
            .acquire_owned()
            .await
            .map_err(|_| LedgerError::Closed)?;
        tokio::task::spawn_blocking(move || {
            let _slot = slot;
            let pooled = inner.readers.lock().map_err(|_| LedgerError::Closed)?.pop();
            let conn = match pooled {
                Some(conn) => conn,
                None => {
                    let conn = open_connection(&inner.path, &inner.config)?;
                    conn.pragma_update(None, "query_only", true)
                        .map_err(|e| map_err(e, op, &inner.path, &inner.config))?;
                    conn
                }
            };
            let result = read(&conn);
            if let Ok(mut pool) = inner.readers.lock()
                && pool.len() < MAX_READERS
            {
                pool.push(conn);
            }
            result
        })
        .await
        .map_err(|join| LedgerError::Storage {
            op,
            source: Box::new(join),
        })?
    }
}

fn open_connection(path: &Path, config: &SqliteConfig) -> Result<Connection, LedgerError> {
    let conn = Connection::open(path).map_err(|e| map_err(e, "open", path, config))?;
    conn.busy_timeout(Duration::from_millis(config.busy_timeout_ms))
        .map_err(|e| map_err(e, "open", path, config))?;
    // Every statement the writer uses stays prepared (the default cache holds only 16).
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Checks that the file is ours (or empty), turns WAL on and creates the schema.
fn prepare_schema(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
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
    Ok(())
}

/// Maps a SQLite error to the ledger error a caller can act on.
fn map_err(
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

fn decode<T: for<'de> Deserialize<'de>>(
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

fn encode<T: Serialize>(value: &T) -> String {
    // Serializing our own types to a String cannot fail: they hold no maps with non-string
    // keys and no failing Serialize impls.
    serde_json::to_string(value).unwrap_or_default()
}

/// A stored command; one that does not decode is [`LedgerError::UndecodableCommand`].
fn row_command(
    run_id: &str,
    command_key: &str,
    identity: &str,
    state: &str,
) -> Result<Command, LedgerError> {
    let undecodable = |what: &'static str, e: serde_json::Error| LedgerError::UndecodableCommand {
        run_id: run_id.to_owned(),
        command_key: command_key.to_owned(),
        what,
        why: e.to_string(),
    };
    let identity: Identity =
        serde_json::from_str(identity).map_err(|e| undecodable("command", e))?;
    let state: CommandState =
        serde_json::from_str(state).map_err(|e| undecodable("command state", e))?;
    Ok(identity.with_state(state))
}

/// Copies the WAL into the database file on a thread of its own, off the writer's path.
///
/// SQLite's automatic checkpoint runs inside the COMMIT that crosses the threshold: the writer
/// copies thousands of pages and fsyncs the database file while every caller of that batch waits
/// for its answer, and the next batch waits behind it. Here the writer's WAL hook only counts
/// frames; every `CHECKPOINT_STEP` frames past the first step, a passive checkpoint (which never
/// blocks the writer) runs on the checkpointer's own connection. A passive checkpoint cannot
/// catch up with a log that keeps growing, and the log only restarts once it is fully copied, so
/// past `RESTART_FRAMES` the writer finishes the copy itself between batches (most of it is done by
/// then). Durability is unchanged: a commit is durable once its WAL frames are synced; the
/// checkpoint syncs the database file before the log may be reused, as before.
#[derive(Debug)]
struct Checkpointer {
    /// Frames in the WAL after the writer's last commit, as its WAL hook reported.
    wal_frames: Arc<AtomicI32>,
    /// Wakes the checkpointer thread; a full channel means a wake-up is already pending.
    wake: std::sync::mpsc::SyncSender<()>,
    /// `wal_frames / CHECKPOINT_STEP` when the checkpointer was last woken.
    woken_step: i32,
}

impl Checkpointer {
    fn start(path: &Path, config: &SqliteConfig) -> Result<Self, LedgerError> {
        let conn = open_connection(path, config)?;
        // A connection finds out that the file is in WAL mode when it first reads it; until
        // then a checkpoint on it does nothing.
        let _: String = conn
            .pragma_query_value(None, "journal_mode", |row| row.get(0))
            .map_err(|e| map_err(e, "open", path, config))?;
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        let log_path = path.to_owned();
        std::thread::Builder::new()
            .name("sluice-ledger-checkpointer".into())
            .spawn(move || {
                // Ends when the writer drops its sender.
                while woken.recv().is_ok() {
                    let checkpoint = conn.wal_checkpoint_v2(DEFAULT_NAME, CheckpointMode::PASSIVE);
                    if let Err(e) = checkpoint {
                        let path = log_path.display();
                        tracing::debug!(error = %e, %path, "ledger checkpoint did not run");
                    }
                }
            })
            .map_err(|source| LedgerError::Open {
                path: path.to_owned(),
                source,
            })?;
        Ok(Self {
            wal_frames: Arc::new(AtomicI32::new(0)),
            wake,
            woken_step: 0,
        })
    }
}

/// Inner result of a write: the outer error aborts the batch, the inner one is the caller's.
type WriteResult<T> = Result<Result<T, LedgerError>, rusqlite::Error>;

struct Writer {
    conn: Connection,
    path: PathBuf,
    config: SqliteConfig,
    /// Audit head per run, valid while `data_version` is unchanged.
    /// Keyed by agent-chosen run ids: foldhash's quality variant, randomly seeded per process.
    heads: HashMap<RunId, RunHead, foldhash::quality::RandomState>,
    data_version: Option<i64>,
    checkpointer: Checkpointer,
}

/// What [`Writer::insert_command`] did.
#[derive(Debug)]
enum Inserted {
    Yes,
    /// The key was taken.
    Exists,
    /// The run is closed; nothing was written.
    RunClosed,
}

#[derive(Debug, Clone)]
struct RunHead {
    run_seq: i64,
    chain: ChainHead,
    /// Closed by a rollback: no new commands.
    closed: bool,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Job>) {
        if let Some(nice) = self.config.writer_nice {
            let thread = rustix::thread::gettid();
            // On Linux a thread id names the thread alone for `setpriority`.
            match rustix::process::setpriority_process(Some(thread), nice) {
                Ok(()) => tracing::debug!(nice, "ledger writer priority set"),
                Err(e) => tracing::info!(
                    nice,
                    error = %e,
                    "ledger writer runs at the process's priority (raising it needs CAP_SYS_NICE)"
                ),
            }
        }
        if let Some(pages) = self.config.max_pages
            && let Err(e) = self.conn.pragma_update(
                None,
                "max_page_count",
                i64::try_from(pages).unwrap_or(i64::MAX),
            )
        {
            tracing::warn!(error = %e, "cannot set the ledger size limit");
        }
        let sync = match self.config.durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        if let Err(e) = self.conn.pragma_update(None, "synchronous", sync) {
            tracing::warn!(error = %e, "cannot set ledger durability");
        }
        for (pragma, value) in [("cache_size", -WRITER_CACHE_KIB), ("temp_store", 2)] {
            if let Err(e) = self.conn.pragma_update(None, pragma, value) {
                tracing::warn!(error = %e, pragma, "cannot tune the ledger writer");
            }
        }
        // Replaces SQLite's automatic checkpoint (see `Checkpointer`).
        let wal_frames = Arc::clone(&self.checkpointer.wal_frames);
        if let Err(e) = self.conn.wal_hook(Some(move |_: &mut _, frames| {
            wal_frames.store(frames, Ordering::Relaxed);
            Ok(())
        })) {
            tracing::warn!(
                error = %e,
                "cannot watch the ledger's WAL; SQLite checkpoints by itself"
            );
        }
        let gather = Duration::from_micros(self.config.commit_gather_us);
        let mut last_commit: Option<std::time::Instant> = None;
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            self.take_waiting(&mut rx, &mut batch);
            let busy = last_commit.is_some_and(|at| at.elapsed() < BUSY_WITHIN);
            if busy && !gather.is_zero() && batch.len() < GATHER_BELOW {
                std::thread::sleep(gather);
                self.take_waiting(&mut rx, &mut batch);
            }
            self.run_batch(batch);
            last_commit = Some(std::time::Instant::now());
            self.checkpoint();
        }
        tracing::debug!(path = %self.path.display(), "ledger writer stopped");
    }

    /// Adds the requests already waiting to `batch`, up to `max_batch`.
    fn take_waiting(&self, rx: &mut mpsc::Receiver<Job>, batch: &mut Vec<Job>) {
        while batch.len() < self.config.max_batch {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
    }

    /// Between batches, after the callers have their answers: starts or finishes a checkpoint.
    fn checkpoint(&mut self) {
        let frames = self.checkpointer.wal_frames.load(Ordering::Relaxed);
        if frames >= RESTART_FRAMES {
            // Busy if the checkpointer is copying right now; then the next batch tries again.
            match self
                .conn
                .wal_checkpoint_v2(DEFAULT_NAME, CheckpointMode::PASSIVE)
            {
                Ok(_) => {}
                Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {}
                Err(e) => {
                    let path = self.path.display();
                    tracing::warn!(error = %e, %path, "ledger checkpoint failed");
                }
            }
        } else {
            let step = frames / CHECKPOINT_STEP;
            if step >= 2 && step != self.checkpointer.woken_step {
                let _ = self.checkpointer.wake.try_send(());
            }
            self.checkpointer.woken_step = step;
        }
    }

    fn run_batch(&mut self, batch: Vec<Job>) {
        match self.try_batch(&batch) {
            Ok(replies) => {
                for (job, result) in batch.into_iter().zip(replies) {
                    // A caller that stopped waiting does not need its answer.
                    let _ = job.reply.send(Answer { op: job.op, result });
                }
            }
            Err(e) if batch.len() == 1 => {
                let error = map_err(e, "write", &self.path, &self.config);
                for job in batch {
                    let result = Err(clone_error(&error));
                    let _ = job.reply.send(Answer { op: job.op, result });
                }
            }
            Err(_) => {
                // Find the request that cannot be written; the others commit on their own.
                for job in batch {
                    self.run_batch(vec![job]);
                }
            }
        }
    }

    fn try_batch(
        &mut self,
        batch: &[Job],
    ) -> Result<Vec<Result<Reply, LedgerError>>, rusqlite::Error> {
        self.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        // Our own commits leave our `data_version` as it is; it moves only when another
        // connection commits. So the value read under the write lock is the one to compare with
        // at the next batch (read after our COMMIT, it could already include another process's
        // commit and hide it).
        let version: i64 = self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |row| row.get(0))?;
        if self.data_version != Some(version) {
            // Another connection committed since our last transaction: our cache may be stale.
            self.heads.clear();
        }
        let applied = (|| {
            let mut replies = Vec::with_capacity(batch.len());
            for job in batch {
                replies.push(self.apply(&job.op)?);
            }
            self.conn.prepare_cached("COMMIT")?.execute([])?;
            Ok(replies)
        })();
        match applied {
            Ok(replies) => {
                // Nothing may fail after the COMMIT: a failure here would retry the batch's
                // requests one by one, and apply them twice.
                self.data_version = Some(version);
                if self.heads.len() > 100_000 {
                    self.heads.clear();
                }
                Ok(replies)
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                self.heads.clear();
                self.data_version = None;
                Err(e)
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Result<Result<Reply, LedgerError>, rusqlite::Error> {
        Ok(match op {
            Op::Reserve {
                command,
                key,
                audit,
                identity,
                state,
                confined,
            } => {
                if *confined && let Some(refused) = self.foreign(command)? {
                    Err(refused)
                } else {
                    self.reserve(command, key, audit, identity, state)?
                        .map(Reply::Reserved)
                }
            }
            Op::Transition {
                transition,
                key,
                state,
                audit,
            } => self
                .transition(transition, key, state, audit.as_ref())?
                .map(Reply::Cas),
            Op::Claim {
                tool,
                business_key,
                run_id,
                command_key,
                at,
            } => self
                .claim(tool, business_key, run_id, command_key, *at)?
                .map(Reply::Claim),
            Op::Append(record) => {
                let link = self.append(record)?;
                Ok(Reply::Entry(record.entry(&link)))
            }
            Op::Close(record) => {
                let link = self.append(record)?;
                let head = self.head(record.run_id(), record.at())?;
                head.closed = true;
                let run_seq = head.run_seq;
                self.conn
                    .prepare_cached(
                        "UPDATE runs SET closed_at = ?2 WHERE run_seq = ?1 AND closed_at IS NULL",
                    )?
                    .execute(params![run_seq, record.at().as_millis()])?;
                Ok(Reply::Entry(record.entry(&link)))
            }
            Op::Purge {
                older_than,
                max_runs,
                actor,
                now,
            } => self
                .purge(*older_than, *max_runs, actor, *now)?
                .map(Reply::Purged),
        })
    }

    fn load_row(&self, run_id: &str, command_key: &str) -> Result<Option<RawRow>, rusqlite::Error> {
        self.conn
            .prepare_cached(&format!(
                "SELECT identity, state FROM commands WHERE run_seq = {RUN_SEQ} AND command_key = ?2"
            ))?
            .query_row(params![run_id, command_key], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
    }

    /// The run's cached or stored head; `None` for a run the ledger has never seen.
    fn stored_head(&mut self, run_id: &RunId) -> Result<Option<&mut RunHead>, rusqlite::Error> {
        if !self.heads.contains_key(run_id) {
            let run: Option<(i64, Option<i64>)> = self
                .conn
                .prepare_cached("SELECT run_seq, closed_at FROM runs WHERE run_id = ?1")?
                .query_row([run_id.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            let Some((run_seq, closed_at)) = run else {
                return Ok(None);
            };
            let last: Option<(i64, String)> = self
                .conn
                .prepare_cached(
                    "SELECT seq, hash FROM audit WHERE run_seq = ?1 ORDER BY seq DESC LIMIT 1",
                )?
                .query_row([run_seq], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            let chain = match last {
                Some((seq, hash)) => ChainHead {
                    next_seq: seq as u64 + 1,
                    hash,
                },
                None => self.checkpoint_head(run_id)?,
            };
            self.heads.insert(
                run_id.clone(),
                RunHead {
                    run_seq,
                    chain,
                    closed: closed_at.is_some(),
                },
            );
        }
        Ok(self.heads.get_mut(run_id))
    }

    /// Where a run's chain starts: after its checkpoint if it was purged before, else genesis.
    fn checkpoint_head(&self, run_id: &RunId) -> Result<ChainHead, rusqlite::Error> {
        Ok(self
            .conn
            .prepare_cached("SELECT last_hash, count FROM checkpoints WHERE run_id = ?1")?
            .query_row([run_id.as_str()], |row| {
                Ok(ChainHead {
                    hash: row.get(0)?,
                    next_seq: row.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?
            .unwrap_or_else(ChainHead::genesis))
    }

    /// The run's head, creating the run (continuing after a checkpoint) if it is new.
    fn head(&mut self, run_id: &RunId, now: Timestamp) -> Result<&mut RunHead, rusqlite::Error> {
        if self.stored_head(run_id)?.is_none() {
            let chain = self.checkpoint_head(run_id)?;
            self.conn
                .prepare_cached("INSERT INTO runs (run_id, created_at) VALUES (?1, ?2)")?
                .execute(params![run_id.as_str(), now.as_millis()])?;
            let run_seq = self.conn.last_insert_rowid();
            self.heads.insert(
                run_id.clone(),
                RunHead {
                    run_seq,
                    chain,
                    closed: false,
                },
            );
        }
        Ok(self
            .heads
            .get_mut(run_id)
            .expect("stored_head or the insert above put it there"))
    }

    /// Appends to the run's chain, moving its open-command count by `open_delta`.
    fn append(&mut self, record: &PreparedRecord) -> Result<SealedLink, rusqlite::Error> {
        let at = record.at();
        let head = self.head(record.run_id(), at)?;
        let link = record.seal_link(&mut head.chain);
        let run_seq = head.run_seq;
        self.conn
            .prepare_cached(
                "INSERT INTO audit (run_seq, seq, at, record, prev_hash, hash) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                run_seq,
                link.seq as i64,
                at.as_millis(),
                link.canonical,
                link.prev_hash,
                link.hash,
            ])?;
        Ok(link)
    }

    fn reserve(
        &mut self,
        command: &Command,
        key: &str,
        audit: &PreparedRecord,
        identity: &str,
        state: &str,
    ) -> WriteResult<ReserveReply> {
        if command.business_key.is_none() {
            // Insert first: the unique key says whether the command existed, which saves a
            // lookup for every new command.
            return match self.insert_command(command, key, identity, state)? {
                Inserted::Yes => {
                    self.append(audit)?;
                    Ok(Ok(ReserveReply::Created))
                }
                Inserted::Exists => self.existing(command, key),
                Inserted::RunClosed => self.closed(command, key),
            };
        }
        // With a business key the claim decides first, so look before inserting. The claim,
        // its takeover of an orphan (a holder that was never recorded) and the insert below run
        // in this one transaction on the one writer thread, and another process on the file
        // waits for its write lock: no holder can reserve between another's look at the claim
        // and its insert, so the CQL ledger's stalled-holder hole (a takeover while the holder
        // is between its claim and its insert, which there needs a fence) cannot open here.
        if let Some(head) = self.stored_head(&command.run_id)? {
            if head.closed {
                return self.closed(command, key);
            }
            if self.load_row(command.run_id.as_str(), key)?.is_some() {
                return self.existing(command, key);
            }
        }
        if let Some(business_key) = &command.business_key {
            match self.claim(
                &command.tool,
                business_key,
                &command.run_id,
                &command.command_key,
                command.created_at,
            )? {
                Ok(Claim::Claimed) => {}
                Ok(Claim::HeldBy {
                    run_id,
                    command_key,
                }) => {
                    // claim() frees orphaned claims, so the holder exists.
                    let key = command_key.to_string();
                    return Ok(self
                        .load_row(run_id.as_str(), &key)?
                        .map(|row| ReserveReply::Held(run_id.to_string(), key, row))
                        .ok_or_else(|| LedgerError::Decode {
                            what: "business key holder",
                            run_id: run_id.to_string(),
                            why: "vanished inside the transaction".into(),
                        }));
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        match self.insert_command(command, key, identity, state)? {
            Inserted::Yes => {}
            Inserted::Exists => return self.existing(command, key),
            Inserted::RunClosed => return self.closed(command, key),
        }
        self.append(audit)?;
        Ok(Ok(ReserveReply::Created))
    }

    /// The refusal of `command` if its run holds a command someone other than its submitter
    /// submitted. A run the ledger has never seen costs no query.
    fn foreign(&mut self, command: &Command) -> Result<Option<LedgerError>, rusqlite::Error> {
        let Some(run_seq) = self.stored_head(&command.run_id)?.map(|head| head.run_seq) else {
            return Ok(None);
        };
        let submitter = command.submitted_by.as_deref();
        let other: Option<Option<String>> = self
            .conn
            .prepare_cached(
                "SELECT json_extract(identity, '$.submitted_by') FROM commands \
                 WHERE run_seq = ?1 AND json_extract(identity, '$.submitted_by') IS NOT ?2 \
                 LIMIT 1",
            )?
            .query_row(params![run_seq, submitter], |row| row.get(0))
            .optional()?;
        Ok(other.map(|other| LedgerError::foreign_run(command, other.as_deref())))
    }

    /// A reservation in a closed run: what is there still replays; nothing new goes in.
    fn closed(&mut self, command: &Command, key: &str) -> WriteResult<ReserveReply> {
        if self.load_row(command.run_id.as_str(), key)?.is_some() {
            return self.existing(command, key);
        }
        Ok(Err(LedgerError::RunClosed {
            run_id: command.run_id.to_string(),
            command_key: key.to_owned(),
        }))
    }

    /// Inserts the command unless its key exists or its run is closed.
    fn insert_command(
        &mut self,
        command: &Command,
        key: &str,
        identity: &str,
        state: &str,
    ) -> Result<Inserted, rusqlite::Error> {
        let head = self.head(&command.run_id, command.state.updated_at)?;
        if head.closed {
            return Ok(Inserted::RunClosed);
        }
        let run_seq = head.run_seq;
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO commands (run_seq, run_id, command_key, decision, call_idx, status, \
                 lease_epoch, due_at, args_hash, identity, state) \
                 VALUES (?11, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT (run_seq, command_key) DO NOTHING",
            )?
            .execute(params![
                command.run_id.as_str(),
                key,
                command.command_key.decision(),
                command.command_key.call_idx(),
                command.state.status.as_str(),
                command.state.lease.epoch.get() as i64,
                command.state.due_at.map(Timestamp::as_millis),
                command.args_hash.as_str(),
                identity,
                state,
                run_seq,
            ])?;
        Ok(if inserted == 1 {
            Inserted::Yes
        } else {
            Inserted::Exists
        })
    }

    /// The stored command under `key`: the same arguments replay it, others are drift.
    fn existing(&mut self, command: &Command, key: &str) -> WriteResult<ReserveReply> {
        let run_seq = self.stored_head(&command.run_id)?.map(|head| head.run_seq);
        let stored: Option<(String, String, String)> = match run_seq {
            None => None,
            Some(run_seq) => self
                .conn
                .prepare_cached(
                    "SELECT args_hash, identity, state FROM commands \
                     WHERE run_seq = ?1 AND command_key = ?2",
                )?
                .query_row(params![run_seq, key], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
                .optional()?,
        };
        let Some((stored_hash, identity, state)) = stored else {
            return Ok(Err(LedgerError::Decode {
                what: "command",
                run_id: command.run_id.to_string(),
                why: format!("{key} conflicted on insert but cannot be read"),
            }));
        };
        Ok(if stored_hash == command.args_hash.as_str() {
            Ok(ReserveReply::Existing((identity, state)))
        } else {
            Err(LedgerError::ArgumentDrift {
                run_id: command.run_id.to_string(),
                command_key: key.to_owned(),
                stored: stored_hash,
                presented: command.args_hash.to_string(),
            })
        })
    }

    fn transition(
        &mut self,
        transition: &Transition,
        key: &str,
        state: &str,
        audit: Option<&PreparedRecord>,
    ) -> WriteResult<CasReply> {
        let run = transition.run_id.as_str();
        let next = &transition.next;
        let Some(run_seq) = self
            .stored_head(&transition.run_id)?
            .map(|head| head.run_seq)
        else {
            return Ok(Ok(CasReply::Conflict(None)));
        };
        // Read, compare, then write by rowid: the writer holds the write lock for the whole
        // batch, so nothing can change the row in between, and this is cheaper than an
        // `UPDATE … RETURNING`, which SQLite runs through a temporary table.
        let current: Option<(i64, bool, String)> = self
            .conn
            .prepare_cached(
                "SELECT rowid, status = ?3 AND lease_epoch = ?4, identity FROM commands \
                 WHERE run_seq = ?1 AND command_key = ?2",
            )?
            .query_row(
                params![
                    run_seq,
                    key,
                    transition.guard.status.as_str(),
                    transition.guard.epoch.get() as i64,
                ],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()?;
        let Some((rowid, true, identity)) = current else {
            return Ok(Ok(CasReply::Conflict(self.load_row(run, key)?)));
        };
        self.conn
            .prepare_cached(
                "UPDATE commands SET status = ?1, lease_epoch = ?2, due_at = ?3, state = ?4 \
                 WHERE rowid = ?5",
            )?
            .execute(params![
                next.status.as_str(),
                next.lease.epoch.get() as i64,
                next.due_at.map(Timestamp::as_millis),
                state,
                rowid,
            ])?;
        if let Some(audit) = audit {
            self.append(audit)?;
        }
        Ok(Ok(CasReply::Applied { identity }))
    }

    fn claim(
        &mut self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
        at: Timestamp,
    ) -> WriteResult<Claim> {
        let tool_name = tool.to_string();
        let key = command_key.to_string();
        let holder: Option<(String, String)> = self
            .conn
            .prepare_cached(
                "SELECT run_id, command_key FROM business_keys WHERE tool = ?1 AND business_key = ?2",
            )?
            .query_row(params![tool_name, business_key.as_str()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()?;
        if let Some((held_run, held_key)) = holder {
            if held_run == run_id.as_str() && held_key == key {
                return Ok(Ok(Claim::Claimed));
            }
            let alive: Option<i64> = self
                .conn
                .prepare_cached(&format!(
                    "SELECT 1 FROM commands WHERE run_seq = {RUN_SEQ} AND command_key = ?2"
                ))?
                .query_row(params![held_run, held_key], |row| row.get(0))
                .optional()?;
            if alive.is_some() {
                let parsed = RunId::parse(&held_run)
                    .and_then(|run| CommandKey::parse(&held_key).map(|key| (run, key)));
                return Ok(match parsed {
                    Ok((run_id, command_key)) => Ok(Claim::HeldBy {
                        run_id,
                        command_key,
                    }),
                    Err(e) => Err(LedgerError::Decode {
                        what: "business key holder",
                        run_id: held_run,
                        why: e.to_string(),
                    }),
                });
            }
            // The holder was never recorded (a claim whose reservation did not follow):
            // the claim is free.
        }
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO business_keys (tool, business_key, run_id, command_key, claimed_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                tool_name,
                business_key.as_str(),
                run_id.as_str(),
                key,
                at.as_millis()
            ])?;
        Ok(Ok(Claim::Claimed))
    }

    fn purge(
        &mut self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
    ) -> WriteResult<PurgeReport> {
        let runs: Vec<String> = self
            .conn
            .prepare_cached(&format!(
                "SELECT r.run_id FROM runs r \
                 WHERE r.created_at < ?1 AND r.run_id <> ?2 \
                 AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.run_seq = r.run_seq \
                                 AND c.status NOT IN {terminal}) \
                 AND COALESCE({last_at}, 0) < ?1 \
                 ORDER BY r.run_seq LIMIT ?3",
                terminal = &*TERMINAL_STATUSES,
                last_at = LAST_AUDIT_AT,
            ))?
            .query_map(
                params![
                    older_than.as_millis(),
                    SYSTEM_RUN,
                    i64::try_from(max_runs).unwrap_or(i64::MAX)
                ],
                |row| row.get(0),
            )?
            .collect::<Result<_, _>>()?;
        let mut report = PurgeReport::default();
        for run in runs {
            let run_id = match RunId::parse(&run) {
                Ok(run_id) => run_id,
                Err(e) => {
                    return Ok(Err(LedgerError::Decode {
                        what: "run id",
                        run_id: run,
                        why: e.to_string(),
                    }));
                }
            };
            let head = self.head(&run_id, now)?.clone();
            let chain = head.chain;
            self.heads.remove(&run_id);
            report.commands += self
                .conn
                .prepare_cached("DELETE FROM commands WHERE run_seq = ?1")?
                .execute([head.run_seq])? as u64;
            report.business_keys += self
                .conn
                .prepare_cached("DELETE FROM business_keys WHERE run_id = ?1")?
                .execute([&run])? as u64;
            report.audit_records += self
                .conn
                .prepare_cached("DELETE FROM audit WHERE run_seq = ?1")?
                .execute([head.run_seq])? as u64;
            self.conn
                .prepare_cached("DELETE FROM runs WHERE run_seq = ?1")?
                .execute([head.run_seq])?;
            let checkpoint = Checkpoint {
                run_id,
                last_hash: chain.hash,
                count: chain.next_seq,
                purged_at: now,
            };
            self.conn
                .prepare_cached(
                    "INSERT OR REPLACE INTO checkpoints (run_id, last_hash, count, purged_at) \
                     VALUES (?1, ?2, ?3, ?4)",
                )?
                .execute(params![
                    run,
                    checkpoint.last_hash,
                    checkpoint.count as i64,
                    now.as_millis()
                ])?;
            report.runs += 1;
            report.checkpoints.push(checkpoint);
        }
        if report.runs > 0 {
            let system = RunId::parse(SYSTEM_RUN).expect("SYSTEM_RUN is a valid run id");
            let draft = AuditDraft {
                command_key: None,
                from: None,
                to: None,
                actor: actor.to_owned(),
                reason: format!("purged finished runs older than {older_than}"),
                evidence: serde_json::json!({
                    "older_than": older_than,
                    "runs": report.runs,
                    "commands": report.commands,
                    "audit_records": report.audit_records,
                    "business_keys": report.business_keys,
                    "checkpoints": report.checkpoints,
                }),
            };
            self.append(&PreparedRecord::new(&system, draft, now))?;
        }
        Ok(Ok(report))
    }
}

/// `LedgerError` holds boxed sources and is not `Clone`; a batch-wide failure is reported to
/// each caller with the same meaning.
fn clone_error(error: &LedgerError) -> LedgerError {
    match error {
        LedgerError::Full { path } => LedgerError::Full { path: path.clone() },
        LedgerError::Locked { path, timeout_ms } => LedgerError::Locked {
            path: path.clone(),
            timeout_ms: *timeout_ms,
        },
        LedgerError::Corrupt { path, why } => LedgerError::Corrupt {
            path: path.clone(),
            why: why.clone(),
        },
        other => LedgerError::Storage {
            op: "write",
            source: other.to_string().into(),
        },
    }
}

#[async_trait]
impl Ledger for SqliteLedger {
    async fn reserve(&self, command: Command, audit: AuditDraft) -> Result<Reserved, LedgerError> {
        self.reserve_as(command, audit, false).await
    }

    async fn reserve_own(
        &self,
        command: Command,
        audit: AuditDraft,
    ) -> Result<Reserved, LedgerError> {
        self.reserve_as(command, audit, true).await
    }

    async fn transition(&self, mut transition: Transition) -> Result<Cas, LedgerError> {
        transition.validate()?;
        transition.next.result = cap_result(transition.next.result.take());
        let state = encode(&transition.next);
        let audit = transition.audit.take().map(|draft| {
            PreparedRecord::new(&transition.run_id, draft, transition.next.updated_at)
        });
        // The command leaves the waiting cache with this write (or is noted again below); its
        // kept identity saves decoding the stored one.
        let known = self
            .inner
            .waiting
            .lock()
            .ok()
            .and_then(|mut waiting| waiting.take(&transition.run_id, &transition.command_key));
        let op = Op::Transition {
            key: transition.command_key.to_string(),
            transition: Box::new(transition),
            state,
            audit,
        };
        sluice_faults::point!("ledger.transition.pre");
        let answer = self.submit(op).await?;
        sluice_faults::point!("ledger.transition.post");
        let Answer {
            op: Op::Transition { transition, .. },
            result,
        } = answer
        else {
            // The writer hands back the request it was given.
            return Err(LedgerError::Closed);
        };
        let run = transition.run_id.as_str();
        let cas = match result? {
            Reply::Cas(CasReply::Applied { identity }) => match known {
                Some((mut command, hash)) if self.identity_hash(&identity) == Some(hash) => {
                    command.state = transition.next;
                    Cas::Applied(command)
                }
                _ => {
                    let identity: Identity = serde_json::from_str(&identity).map_err(|e| {
                        self.inner.quarantine.note(LedgerError::UndecodableCommand {
                            run_id: run.to_owned(),
                            command_key: transition.command_key.to_string(),
                            what: "command",
                            why: e.to_string(),
                        })
                    })?;
                    Cas::Applied(identity.with_state(transition.next))
                }
            },
            Reply::Cas(CasReply::Conflict(row)) => {
                let key = transition.command_key.to_string();
                Cas::Conflict(
                    row.map(|(identity, state)| row_command(run, &key, &identity, &state))
                        .transpose()
                        .map_err(|e| self.inner.quarantine.note(e))?,
                )
            }
            _ => return Err(LedgerError::Closed),
        };
        match &cas {
            Cas::Applied(command) | Cas::Conflict(Some(command)) => self.note(command),
            Cas::Conflict(None) => {}
        }
        Ok(cas)
    }

    fn quarantined(&self) -> u64 {
        self.inner.quarantine.count()
    }

    fn cached(&self, run_id: &RunId, command_key: &CommandKey) -> Option<Command> {
        let waiting = self.inner.waiting.lock().ok()?;
        waiting.get(run_id, command_key).cloned()
    }

    async fn get(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Option<Command>, LedgerError> {
        let (run, key) = (run_id.to_string(), command_key.to_string());
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        self.read("get", move |conn| {
            let row: Option<(String, String)> = conn
                .prepare_cached(
                    "SELECT identity, state FROM commands \
                     WHERE run_seq = (SELECT run_seq FROM runs WHERE run_id = ?1) AND command_key = ?2",
                )
                .and_then(|mut stmt| {
                    stmt.query_row(params![run, key], |row| Ok((row.get(0)?, row.get(1)?)))
                        .optional()
                })
                .map_err(|e| map_err(e, "get", &path, &config))?;
            row.map(|(identity, state)| row_command(&run, &key, &identity, &state))
                .transpose()
        })
        .await
        .map_err(|e| self.inner.quarantine.note(e))
    }

    async fn list_run(
        &self,
        run_id: &RunId,
        status: Option<CommandStatus>,
    ) -> Result<Vec<Command>, LedgerError> {
        let run = run_id.to_string();
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        self.read("list_run", move |conn| {
            type Row = (i64, i64, String, String, String);
            let mut rows: Vec<Row> = conn
                .prepare_cached(
                    "SELECT decision, call_idx, command_key, identity, state FROM commands \
                     WHERE run_seq = (SELECT run_seq FROM runs WHERE run_id = ?1) \
                     AND (?2 IS NULL OR status = ?2)",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![run, status.map(CommandStatus::as_str)], |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                        ))
                    })?
                    .collect()
                })
                .map_err(|e| map_err(e, "list_run", &path, &config))?;
            // Journal order: decision, then call index, then the key for a stable tie-break.
            rows.sort_unstable_by(|a, b| (a.0, a.1, &a.2).cmp(&(b.0, b.1, &b.2)));
            rows.iter()
                .map(|(_, _, key, identity, state)| row_command(&run, key, identity, state))
                .collect()
        })
        .await
        .map_err(|e| self.inner.quarantine.note(e))
    }

    async fn list_runs(
        &self,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<RunSummary>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        self.read("list_runs", move |conn| {
            let rows: Vec<(String, i64, i64, i64)> = conn
                .prepare_cached(&format!(
                    "SELECT r.run_id, r.created_at, COALESCE({last_at}, r.created_at), \
                         (SELECT count(*) FROM commands c WHERE c.run_seq = r.run_seq \
                          AND c.status NOT IN {terminal}) \
                         FROM runs r WHERE r.created_at >= ?1 AND r.run_id <> ?2 \
                         ORDER BY r.created_at DESC LIMIT ?3",
                    terminal = &*TERMINAL_STATUSES,
                    last_at = LAST_AUDIT_AT,
                ))
                .and_then(|mut stmt| {
                    stmt.query_map(
                        params![
                            since.as_millis(),
                            SYSTEM_RUN,
                            i64::try_from(limit).unwrap_or(i64::MAX)
                        ],
                        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                    )?
                    .collect()
                })
                .map_err(|e| map_err(e, "list_runs", &path, &config))?;
            rows.into_iter()
                .map(|(run, created, updated, open)| {
                    Ok(RunSummary {
                        run_id: RunId::parse(&run).map_err(|e| LedgerError::Decode {
                            what: "run id",
                            run_id: run.clone(),
                            why: e.to_string(),
                        })?,
                        created_at: Timestamp::from_millis(created),
                        updated_at: Timestamp::from_millis(updated),
                        open_commands: open.max(0) as u64,
                    })
                })
                .collect()
        })
        .await
    }

    async fn claim_business_key(
        &self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Claim, LedgerError> {
        let op = Op::Claim {
            tool: tool.clone(),
            business_key: business_key.clone(),
            run_id: run_id.clone(),
            command_key: command_key.clone(),
            at: self.inner.clock.now(),
        };
        sluice_faults::point!("ledger.claim_key.pre");
        let answer = self.submit(op).await?;
        sluice_faults::point!("ledger.claim_key.post");
        match answer.result? {
            Reply::Claim(claim) => Ok(claim),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<DueItem>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let quarantine = Arc::clone(&self.inner.quarantine);
        self.read("due", move |conn| {
            // Quarantined commands are skipped below; read past them so they never take the
            // place of commands that can be swept.
            let wanted = limit.saturating_add(quarantine.len());
            let rows: Vec<(String, String, String, i64)> = conn
                .prepare_cached(
                    "SELECT run_id, command_key, status, due_at FROM commands \
                     WHERE due_at IS NOT NULL AND due_at <= ?1 ORDER BY due_at LIMIT ?2",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(
                        params![now.as_millis(), i64::try_from(wanted).unwrap_or(i64::MAX)],
                        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                    )?
                    .collect()
                })
                .map_err(|e| map_err(e, "due", &path, &config))?;
            let mut items = Vec::with_capacity(rows.len().min(limit));
            for (run, key, status, due_at) in rows {
                if items.len() == limit {
                    break;
                }
                if quarantine.holds(&run, &key) {
                    continue;
                }
                let parsed = RunId::parse(&run)
                    .map_err(|e| e.to_string())
                    .and_then(|run_id| {
                        CommandKey::parse(&key)
                            .map(|key| (run_id, key))
                            .map_err(|e| e.to_string())
                    })
                    .and_then(|(run_id, key)| {
                        status
                            .parse()
                            .map(|status| (run_id, key, status))
                            .map_err(|e: sluice_core::command::UnknownStatus| e.to_string())
                    });
                match parsed {
                    Ok((run_id, command_key, status)) => items.push(DueItem {
                        run_id,
                        command_key,
                        status,
                        due_at: Timestamp::from_millis(due_at),
                    }),
                    Err(why) => quarantine.set_aside(&run, &key, &why),
                }
            }
            Ok(items)
        })
        .await
    }

    async fn audit_append(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        let record = PreparedRecord::new(run_id, draft, at);
        sluice_faults::point!("ledger.audit_append.pre");
        let entry = self.entry(Op::Append(record)).await;
        sluice_faults::point!("ledger.audit_append.post");
        entry
    }

    async fn close_run(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        let record = PreparedRecord::new(run_id, draft, at);
        sluice_faults::point!("ledger.close_run.pre");
        let entry = self.entry(Op::Close(record)).await;
        sluice_faults::point!("ledger.close_run.post");
        entry
    }

    async fn audit_read(&self, run_id: &RunId) -> Result<AuditTrail, LedgerError> {
        let run = run_id.to_string();
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        self.read("audit_read", move |conn| {
            let fail = |e| map_err(e, "audit_read", &path, &config);
            let checkpoint = conn
                .prepare_cached(
                    "SELECT last_hash, count, purged_at FROM checkpoints WHERE run_id = ?1",
                )
                .and_then(|mut stmt| {
                    stmt.query_row([&run], |row| {
                        Ok((
                            row.get::<_, String>(0)?,
                            row.get::<_, i64>(1)?,
                            row.get::<_, i64>(2)?,
                        ))
                    })
                    .optional()
                })
                .map_err(fail)?;
            let rows: Vec<(String, String, String)> = conn
                .prepare_cached(
                    "SELECT record, prev_hash, hash FROM audit \
                     WHERE run_seq = (SELECT run_seq FROM runs WHERE run_id = ?1) ORDER BY seq",
                )
                .and_then(|mut stmt| {
                    stmt.query_map([&run], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))?
                        .collect()
                })
                .map_err(fail)?;
            let run_id = RunId::parse(&run).map_err(|e| LedgerError::Decode {
                what: "run id",
                run_id: run.clone(),
                why: e.to_string(),
            })?;
            let entries = rows
                .into_iter()
                .map(|(record, prev_hash, hash)| {
                    Ok(AuditEntry {
                        record: decode::<AuditRecord>("audit record", &run, &record)?,
                        prev_hash,
                        hash,
                    })
                })
                .collect::<Result<_, LedgerError>>()?;
            Ok(AuditTrail {
                checkpoint: checkpoint.map(|(last_hash, count, purged_at)| Checkpoint {
                    run_id,
                    last_hash,
                    count: count.max(0) as u64,
                    purged_at: Timestamp::from_millis(purged_at),
                }),
                entries,
            })
        })
        .await
    }

    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
    ) -> Result<PurgeReport, LedgerError> {
        let op = Op::Purge {
            older_than,
            max_runs,
            actor: actor.to_owned(),
            now,
        };
        sluice_faults::point!("ledger.purge.pre");
        let answer = self.submit(op).await?;
        sluice_faults::point!("ledger.purge.post");
        match answer.result? {
            Reply::Purged(report) => Ok(report),
            _ => Err(LedgerError::Closed),
        }
    }
}

impl SqliteLedger {
    /// The clock this ledger was opened with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.inner.clock
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Identity, SqliteConfig, SqliteLedger, Waiting, encode};
    use crate::contract::{command, fresh_run};
    use crate::{Cas, Guard, Ledger, Transition};
    use sluice_core::audit::AuditDraft;
    use sluice_core::command::CommandStatus;

    #[test]
    fn the_waiting_cache_answers_for_the_exact_command_only() {
        let run = fresh_run("waiting");
        let first = command(&run, 0, "email/send", 0, json!({}));
        let second = command(&run, 0, "email/send", 1, json!({}));
        let elsewhere = command(&fresh_run("waiting"), 0, "email/send", 0, json!({}));
        let mut waiting = Waiting::default();
        waiting.insert(first.clone(), None);
        let cached = waiting.get(&first.run_id, &first.command_key);
        assert_eq!(cached.map(|c| &c.command_key), Some(&first.command_key));
        assert!(waiting.get(&second.run_id, &second.command_key).is_none());
        assert!(
            waiting
                .get(&elsewhere.run_id, &elsewhere.command_key)
                .is_none()
        );

        waiting.remove(&second.run_id, &second.command_key);
        assert!(waiting.get(&first.run_id, &first.command_key).is_some());
        waiting.remove(&first.run_id, &first.command_key);
        assert!(waiting.get(&first.run_id, &first.command_key).is_none());

        waiting.insert(first.clone(), None);
        assert!(
            waiting.take(&first.run_id, &first.command_key).is_none(),
            "a command kept without its identity text is not taken"
        );
        waiting.insert(first.clone(), Some("stored text"));
        assert!(waiting.take(&second.run_id, &second.command_key).is_none());
        let (taken, hash) = waiting
            .take(&first.run_id, &first.command_key)
            .expect("kept with its identity");
        assert_eq!(taken.command_key, first.command_key);
        assert_eq!(hash, waiting.identity_hash("stored text"));
        assert!(waiting.get(&first.run_id, &first.command_key).is_none());
    }

    #[tokio::test]
    async fn a_transition_reuses_a_kept_identity_only_if_the_stored_one_is_the_same() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
        let run = fresh_run("identity");
        let cancel = |c: &sluice_core::command::Command| {
            let mut next = c.state.clone();
            next.status = CommandStatus::Cancelled;
            Transition {
                run_id: c.run_id.clone(),
                command_key: c.command_key.clone(),
                guard: Guard::of(c),
                audit: Some(AuditDraft::transition(
                    &c.command_key,
                    Some(c.status()),
                    next.status,
                    "test",
                    "cancelled",
                )),
                next,
            }
        };

        // Kept by the reservation with its identity: the answer is the stored command.
        let kept = command(&run, 0, "email/send", 0, json!({"to": "a@example.com"}));
        let audit = kept.reservation_audit("test");
        ledger.reserve(kept.clone(), audit).await.expect("reserve");
        let Cas::Applied(applied) = ledger.transition(cancel(&kept)).await.expect("cancel") else {
            panic!("the guard holds");
        };
        let stored = ledger
            .get(&run, &kept.command_key)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(applied, stored);

        // A kept look-alike whose identity is not the stored one (as if another process had
        // rewritten the row): the answer decodes the stored identity instead.
        let real = command(&run, 0, "email/send", 1, json!({"to": "b@example.com"}));
        let audit = real.reservation_audit("test");
        ledger.reserve(real.clone(), audit).await.expect("reserve");
        let mut fake = real.clone();
        fake.args = std::sync::Arc::new(json!({"to": "mallory@example.com"}));
        let fake_text = encode(&Identity::of(&fake));
        ledger
            .inner
            .waiting
            .lock()
            .expect("lock")
            .insert(fake, Some(&fake_text));
        let Cas::Applied(applied) = ledger.transition(cancel(&real)).await.expect("cancel") else {
            panic!("the guard holds");
        };
        assert_eq!(applied.args, real.args);
        assert_eq!(applied.status(), CommandStatus::Cancelled);
    }
}
