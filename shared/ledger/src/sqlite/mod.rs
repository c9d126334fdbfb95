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

mod budgets;
mod evidence;
mod flow;
mod schema;
mod sweep;
mod waiting;
mod webhooks;
mod writer;

use crate::{AuditStore, CommandStore};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, mpsc, oneshot};

use sluice_core::audit::{AuditDraft, AuditEntry, AuditRecord, Checkpoint, PreparedRecord};
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::time::{Clock, SystemClock, Timestamp};

use crate::identity::Identity;
use crate::quarantine::Quarantine;
use crate::{
    AuditTrail, Cas, Claim, Closing, Ledger, LedgerError, PurgeReport, Reserved, RunCursor,
    RunSummary, SYSTEM_RUN, Transition, cap_result,
};

use self::schema::{
    LAST_AUDIT_AT, TERMINAL_STATUSES, decode, encode, map_err, open_connection, prepare_schema,
    row_command,
};
use self::waiting::Waiting;
use self::writer::{Answer, CasReply, Checkpointer, Job, Op, Reply, ReserveReply, Writer};

/// The directory the embedded ledger lives in unless configured otherwise.
pub const DEFAULT_DATA_DIR: &str = ".sluice";
/// The ledger's file name inside the data directory.
pub const LEDGER_FILE: &str = "ledger.db";
/// Shards of the embedded ledger's due index (a filter on its due query, not a layout): what
/// reconcilers sharing one file split between them.
pub const DUE_SHARDS: u32 = 16;

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
    /// Commands this process left waiting for dispatch: see [`CommandStore::cached`].
    waiting: Mutex<Waiting>,
    clock: Arc<dyn Clock>,
    /// Commands found undecodable: `due` skips them.
    quarantine: Arc<Quarantine>,
    /// How long writes take now, from submission to answer.
    write_latency: crate::latency::WriteLatency,
}

/// Read connections kept open, and reads run at once.
const MAX_READERS: usize = 8;

/// A batch of fewer requests than this, found by a writer that committed within
/// [`BUSY_WITHIN`] a batch of more than one request, waits `commit_gather_us` for more before
/// it commits.
///
/// Under load the writer's answers wake their callers a few at a time, and their next writes
/// trickle in: without the wait, a commit of one to four requests (four pages or more, and an
/// fsync) followed most large ones. With `sluice bench --mode batch --no-paced --effects 40000`,
/// 830 of 2,054 commits held at most four requests, writing 4 WAL pages per request against 0.7 in
/// batches of 65 or more; waiting 400 µs roughly halved the commits. A writer that was idle, or
/// whose last commit held one request (writes coming one at a time, as one agent's do), commits
/// at once, so the wait costs latency only when concurrent writers keep the ledger busy.
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
                write_latency: Default::default(),
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

    /// Sends a run-level record (`Op::Append`) to the writer; its chain entry.
    async fn entry(&self, op: Op) -> Result<AuditEntry, LedgerError> {
        match self.submit(op).await?.result? {
            Reply::Entry(entry) => Ok(entry),
            _ => Err(LedgerError::Closed),
        }
    }

    /// Sends `op` to the writer; the answer comes once its transaction committed.
    async fn submit(&self, op: Op) -> Result<Answer, LedgerError> {
        let started = std::time::Instant::now();
        let (reply, answer) = oneshot::channel();
        self.inner
            .writer
            .send(Job { op, reply })
            .await
            .map_err(|_| LedgerError::Closed)?;
        let answer = answer.await.map_err(|_| LedgerError::Closed);
        self.inner.write_latency.observe(started.elapsed());
        answer
    }

    /// Reserves `command`; `confined` refuses a run holding another submitter's command.
    async fn reserve_as(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
    ) -> Result<Reserved, LedgerError> {
        match self.reserve_with(command, audit, confined, None).await? {
            Ok(reserved) => Ok(reserved),
            Err(_) => Err(LedgerError::Closed),
        }
    }

    /// Reserves `command`, taking `budget`'s holds in the same write transaction first:
    /// `Err(held)` when a line would pass its limit (nothing written).
    async fn reserve_with(
        &self,
        mut command: Command,
        audit: AuditDraft,
        confined: bool,
        budget: Option<Box<writer::BudgetHoldOp>>,
    ) -> Result<Result<Reserved, crate::Held>, LedgerError> {
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
            budget,
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
                Ok(Ok(Reserved::Created(*command)))
            }
            Reply::Reserved(ReserveReply::Existing((identity, state))) => {
                let key = command.command_key.as_str();
                row_command(run, key, &identity, &state)
                    .map(|command| Ok(Reserved::Existing(command)))
                    .map_err(|e| self.inner.quarantine.note(e))
            }
            Reply::Reserved(ReserveReply::Held(run, key, (identity, state))) => {
                row_command(&run, &key, &identity, &state)
                    .map(|command| Ok(Reserved::BusinessKeyHeld(command)))
                    .map_err(|e| self.inner.quarantine.note(e))
            }
            Reply::Budget(Some(held)) => Ok(Err(held)),
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

#[async_trait]
impl CommandStore for SqliteLedger {
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
        before: Option<&RunCursor>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        // No cursor: past every run there is.
        let (before_at, before_run) = before.map_or((i64::MAX, String::new()), |c| {
            (c.created_at.as_millis(), c.run_id.as_str().to_owned())
        });
        self.read("list_runs", move |conn| {
            let rows: Vec<(String, i64, i64, i64, Option<i64>)> = conn
                .prepare_cached(&format!(
                    "SELECT r.run_id, r.created_at, COALESCE({last_at}, r.created_at), \
                         (SELECT count(*) FROM commands c WHERE c.run_seq = r.run_seq \
                          AND c.status NOT IN {terminal}), r.closed_at \
                         FROM runs r WHERE r.created_at >= ?1 AND r.run_id <> ?2 \
                         AND (r.created_at < ?4 OR (r.created_at = ?4 AND r.run_id < ?5)) \
                         ORDER BY r.created_at DESC, r.run_id DESC LIMIT ?3",
                    terminal = &*TERMINAL_STATUSES,
                    last_at = LAST_AUDIT_AT,
                ))
                .and_then(|mut stmt| {
                    stmt.query_map(
                        params![
                            since.as_millis(),
                            SYSTEM_RUN,
                            i64::try_from(limit).unwrap_or(i64::MAX),
                            before_at,
                            before_run,
                        ],
                        |row| {
                            Ok((
                                row.get(0)?,
                                row.get(1)?,
                                row.get(2)?,
                                row.get(3)?,
                                row.get(4)?,
                            ))
                        },
                    )?
                    .collect()
                })
                .map_err(|e| map_err(e, "list_runs", &path, &config))?;
            rows.into_iter()
                .map(|(run, created, updated, open, closed)| {
                    Ok(RunSummary {
                        run_id: RunId::parse(&run).map_err(|e| LedgerError::Decode {
                            what: "run id",
                            run_id: run.clone(),
                            why: e.to_string(),
                        })?,
                        created_at: Timestamp::from_millis(created),
                        updated_at: Timestamp::from_millis(updated),
                        open_commands: open.max(0) as u64,
                        rolled_back_at: closed.map(Timestamp::from_millis),
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

    async fn close_run(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<Closing, LedgerError> {
        let record = PreparedRecord::new(run_id, draft, at);
        sluice_faults::point!("ledger.close_run.pre");
        let answer = self.submit(Op::Close(record)).await;
        sluice_faults::point!("ledger.close_run.post");
        match answer?.result? {
            Reply::Entry(entry) => Ok(Closing::Closed(Box::new(entry))),
            Reply::AlreadyClosed => Ok(Closing::AlreadyClosed),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<PurgeReport, LedgerError> {
        let op = Op::Purge {
            older_than,
            max_runs,
            actor: actor.to_owned(),
            now,
            dry_run,
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

#[async_trait]
impl AuditStore for SqliteLedger {
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
}

impl Ledger for SqliteLedger {
    fn quarantined(&self) -> u64 {
        self.inner.quarantine.count()
    }

    fn left_for_newer(&self) -> u64 {
        self.inner.quarantine.newer_count()
    }

    fn write_latency_ms(&self) -> i64 {
        self.inner.write_latency.millis()
    }

    /// SQLite's name for the file's own schema.
    fn db_identity(&self) -> crate::DbIdentity<'_> {
        crate::DbIdentity {
            system: "sqlite",
            namespace: "main",
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

    use super::{Identity, SqliteConfig, SqliteLedger, encode};
    use crate::contract::{command, fresh_run};
    use crate::{Cas, CommandStore, Guard, Transition};
    use sluice_core::audit::AuditDraft;
    use sluice_core::command::CommandStatus;

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
