//! The writer thread: takes the waiting requests as one batch, applies them in one transaction
//! and commits once (group commit), then answers each caller; and the checkpointer beside it.
//! A caller hears "applied" only once its batch committed; a batch that fails to write is rolled
//! back and its requests retried one by one, so none is half-applied.

mod budgets;
mod evidence;
mod flow;
mod ops;
mod shards;
mod webhooks;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, DEFAULT_NAME, ErrorCode};
use tokio::sync::{mpsc, oneshot};

use sluice_core::audit::{AuditEntry, ChainHead, PreparedRecord};
use sluice_core::command::Command;
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::time::Timestamp;

use super::schema::{map_err, open_connection};
use super::{BUSY_WITHIN, Durability, GATHER_BELOW, SqliteConfig};
use crate::{Claim, LedgerError, PurgeReport, Transition};

/// The writer's page cache, in KiB (2,048 pages of 4 KiB).
///
/// Big enough to hold every page a group commit dirties (a few hundred) until the commit, so
/// nothing spills to the WAL mid-transaction; the writer's reads are of pages written moments
/// ago. Not bigger: when a B-tree page splits, SQLite renumbers pages through a key far past
/// the end of the file, and the commit then walks the whole cache to drop that key. With
/// 64 MiB that walk showed as 2.3% of the CPU in `perf`, and 8 MiB ran 40k-effect batch
/// passes 7% faster than 64 MiB (eight alternating runs, all won; 2026-11-24).
const WRITER_CACHE_KIB: i64 = 8 * 1024;

/// The checkpointer thread copies the WAL into the database each time the log grows by this
/// many frames (pages) past the first step; fewer, larger checkpoints copy a page that changes
/// often fewer times.
const CHECKPOINT_STEP: i32 = 2_048;
/// WAL frames after which the writer finishes the checkpoint itself, so that the log restarts.
const RESTART_FRAMES: i32 = 8_192;

/// A stored row as text; decoded by the caller, off the writer thread.
type RawRow = (String, String);

/// A write request. Everything the writer needs as text (the command key, the JSON columns, the
/// audit record's canonical form) is computed by the caller, so the single writer thread
/// spends its time on SQL only; and the request goes back to the caller with the answer, so
/// the caller, not the writer, frees it.
pub(super) enum Op {
    Reserve {
        command: Box<Command>,
        key: String,
        audit: PreparedRecord,
        identity: String,
        state: String,
        /// Refuse if the run holds another submitter's command (`CommandStore::reserve_own`).
        confined: bool,
        /// Budget holds taken in the same transaction first (`BudgetStore::reserve_held`).
        budget: Option<Box<BudgetHoldOp>>,
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
        dry_run: bool,
    },
    /// A sweep-shard lease written if the stored epoch is `guard`.
    ShardLease {
        group: String,
        guard: Option<u64>,
        next: crate::ShardLease,
    },
    /// A sweep member's announcement.
    Announce {
        group: String,
        member: crate::Member,
    },
    /// A flow control written if its stored version is `guard`.
    FlowControl {
        guard: u64,
        next: sluice_core::flow::FlowControl,
    },
    /// An approval link's use recorded unless it was (`LinkStore::link_consume`).
    LinkConsume {
        link_id: String,
        run_id: String,
        command_key: String,
        at: i64,
    },
    /// A webhook delivery stored unless one with its key is (`WebhookStore::webhook_enqueue`).
    WebhookEnqueue(Box<sluice_core::webhook::Delivery>),
    /// A webhook delivery's compare-and-set on its version.
    WebhookUpdate {
        next: Box<sluice_core::webhook::Delivery>,
        expected: u64,
    },
    /// An evidence record stored unless one with its key is (`EvidenceStore::evidence_put`).
    EvidencePut(Box<sluice_core::evidence::EvidenceRecord>),
    /// An evidence record rewritten (`EvidenceStore::evidence_settle`).
    EvidenceSettle(Box<sluice_core::evidence::EvidenceRecord>),
    /// A reference indexed to its command unless it is (`EvidenceStore::reference_put`).
    ReferencePut(ReferenceEntry),
    /// A command's budget holds (`BudgetStore::budget_hold`).
    BudgetHold {
        run_id: String,
        command_key: String,
        tag: String,
        lines: Vec<sluice_core::budget::BudgetLine>,
        mode: crate::HoldMode,
        /// An edit's hold (`BudgetStore::budget_rehold`): the command's other counted holds on
        /// a counter are left out of whether a line fits.
        net: bool,
    },
    /// A command's holds but `keep`'s marked moved (`BudgetStore::budget_supersede`).
    BudgetSupersede {
        run_id: String,
        command_key: String,
        keep: String,
    },
    /// A command's budget holds removed (`BudgetStore::budget_unhold`).
    BudgetUnhold {
        run_id: String,
        command_key: String,
        tag: String,
    },
}

/// An entry of the reference index: a tool's reference and the command it names.
pub(super) struct ReferenceEntry {
    pub(super) tool: String,
    pub(super) reference: String,
    pub(super) run_id: String,
    pub(super) command_key: String,
}

/// The holds a reservation takes with it.
pub(super) struct BudgetHoldOp {
    pub(super) tag: String,
    pub(super) lines: Vec<sluice_core::budget::BudgetLine>,
    pub(super) mode: crate::HoldMode,
}

pub(super) enum ReserveReply {
    Created,
    Existing(RawRow),
    /// The holder of the business key: its run, its key and its row.
    Held(String, String, RawRow),
}

pub(super) enum CasReply {
    Applied { identity: String },
    Conflict(Option<RawRow>),
}

pub(super) enum Reply {
    Reserved(ReserveReply),
    Cas(CasReply),
    Claim(Claim),
    Entry(AuditEntry),
    /// A close of a run that was closed already: nothing written.
    AlreadyClosed,
    Purged(PurgeReport),
    Shard(crate::ShardCas),
    Announced,
    Flow(crate::FlowCas),
    /// Whether a webhook write applied.
    Webhook(bool),
    /// The evidence record stored before, as JSON (`None`: stored now, or a rewrite).
    Evidence(Option<String>),
    /// The command a reference is indexed to now: its run id and command key.
    Reference(String, String),
    /// What a budget hold did (`None`: an unhold).
    Budget(Option<crate::Held>),
}

pub(super) struct Job {
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Answer>,
}

/// The writer's answer, with the request handed back.
pub(super) struct Answer {
    pub(super) op: Op,
    pub(super) result: Result<Reply, LedgerError>,
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
pub(super) struct Checkpointer {
    /// Frames in the WAL after the writer's last commit, as its WAL hook reported.
    wal_frames: Arc<AtomicI32>,
    /// Wakes the checkpointer thread; a full channel means a wake-up is already pending.
    wake: std::sync::mpsc::SyncSender<()>,
    /// `wal_frames / CHECKPOINT_STEP` when the checkpointer was last woken.
    woken_step: i32,
}

impl Checkpointer {
    pub(super) fn start(path: &Path, config: &SqliteConfig) -> Result<Self, LedgerError> {
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

pub(super) struct Writer {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    pub(super) config: SqliteConfig,
    /// Audit head per run, valid while `data_version` is unchanged.
    /// Keyed by agent-chosen run ids: foldhash's quality variant, randomly seeded per process.
    pub(super) heads: HashMap<RunId, RunHead, foldhash::quality::RandomState>,
    pub(super) data_version: Option<i64>,
    pub(super) checkpointer: Checkpointer,
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
pub(super) struct RunHead {
    run_seq: i64,
    chain: ChainHead,
    /// Closed by a rollback: no new commands.
    closed: bool,
}

impl Writer {
    pub(super) fn run(mut self, mut rx: mpsc::Receiver<Job>) {
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
        let mut last_len = 0;
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            self.take_waiting(&mut rx, &mut batch);
            let since_commit = last_commit.map(|at| at.elapsed());
            if should_gather(since_commit, last_len, batch.len(), gather) {
                std::thread::sleep(gather);
                self.take_waiting(&mut rx, &mut batch);
            }
            last_len = batch.len();
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

/// Whether the writer, holding `batch_len` requests, waits `gather` for more before it commits:
/// only while it is busy with *concurrent* writers — its last commit was less than
/// [`BUSY_WITHIN`] ago (`since_commit`) and held more than one request (`last_len`). Writes that
/// come one at a time (an agent's effect: its reservation, then its outcome, each alone) are
/// committed at once, since nobody else is coming: with one agent, `sluice bench --mode agents`
/// found each effect waiting twice, once per commit.
pub(super) fn should_gather(
    since_commit: Option<Duration>,
    last_len: usize,
    batch_len: usize,
    gather: Duration,
) -> bool {
    let busy = since_commit.is_some_and(|since| since < BUSY_WITHIN);
    busy && last_len > 1 && !gather.is_zero() && batch_len < GATHER_BELOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_gathers_only_while_concurrent_writers_keep_it_busy() {
        let gather = Duration::from_micros(400);
        let just = Some(Duration::from_micros(300));
        // A trickle after a large commit: wait for company.
        assert!(should_gather(just, 40, 2, gather));
        // One writer at a time: commit at once.
        assert!(!should_gather(just, 1, 1, gather));
        // Idle, or the first batch: at once.
        assert!(!should_gather(Some(BUSY_WITHIN * 2), 40, 1, gather));
        assert!(!should_gather(None, 0, 1, gather));
        // Enough already, or gathering turned off.
        assert!(!should_gather(just, 40, GATHER_BELOW, gather));
        assert!(!should_gather(just, 40, 2, Duration::ZERO));
    }
}
