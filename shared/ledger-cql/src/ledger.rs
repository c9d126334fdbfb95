//! [`CqlLedger`]: the [`Ledger`] port on ScyllaDB / Cassandra.
//!
//! Every write that the contract makes atomic is one lightweight transaction (LWT) on one run's
//! partition of `commands`: the command row and, in static columns, the run's audit head. The
//! audit record itself is then a plain insert whose seq and hash the LWT fixed. The write
//! protocol of an audited write is:
//!
//! 1. read the row and the head (plain, QUORUM), unless this process knows them (below);
//! 2. before the LWT, write what must exist if it applies, as one UNLOGGED BATCH: the due entry
//!    for a new due time, the run's `runs` entry for a new run, and the record the head still
//!    holds in `audit_pending` unless this process already knows it is in `audit` (the repair
//!    rule, below);
//! 3. the LWT, guarded by status and epoch (the contract's guard), the row's `write_id` and
//!    the head (`audit_seq`, `audit_head`): it stores the state, moves the head and keeps the
//!    new record whole in `audit_pending`;
//! 4. the plain insert of the new record into `audit`.
//!
//! **What a process knows.** The head and row this process last read or wrote (`Known`) stand
//! in for step 1 when they match the guard. The LWT's condition holds all that the write took
//! from them, so a stale entry only makes the LWT not apply; the run is then read before every
//! write, as without the cache (at most one LWT lost per run and process, see `Known`).
//!
//! **Repair rule.** The record at `audit_seq - 1` may be missing from `audit` (its writer died
//! between 3 and 4); every other record is there, because the writer of a record made sure of
//! the one before it (step 2) before moving the head past it. So a reader (`audit_read`) and the
//! next writer insert `audit_pending` when `audit` lacks it; the insert is idempotent.
//!
//! **Unknown outcomes.** An LWT that times out (or loses its connection) may or may not have
//! applied. It is settled by a SERIAL read of the partition: the record at the seq it wrote
//! carries the LWT's `write_id` (in `audit_write_id`, or in `audit` once the head moved on), and
//! a write that is not audited leaves its `write_id` on the row. Only then is it reported as
//! applied or retried; never "not applied" on a guess.
//!
//! `sweep` holds the due index walk, `runs` the runs index and the purge, `claims` the business
//! keys and their fenced takeovers.

mod claims;
mod links;
#[cfg(test)]
mod pause;
mod runs;
mod shards;
mod sweep;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError};
use scylla::response::{PagingState, PagingStateResponse};
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::value::MaybeUnset;
use uuid::Uuid;

use sluice_core::audit::{
    AuditDraft, AuditEntry, AuditRecord, ChainHead, Checkpoint, GENESIS_HASH, PreparedRecord,
    SealedLink,
};
use sluice_core::command::{Command, CommandState, CommandStatus};
use sluice_core::ids::{BusinessKey, CommandKey, LeaseEpoch, RunId, ToolName};
use sluice_core::time::{Clock, SystemClock, Timestamp};
use sluice_ledger::quarantine::Quarantine;
use sluice_ledger::{
    AuditTrail, Cas, Claim, DueItem, Guard, Ledger, LedgerError, Member, PurgeReport, Reserved,
    RunCursor, RunSummary, SYSTEM_RUN, ShardCas, ShardLease, SweepView, Transition, cap_result,
};

use crate::CqlError;
use crate::codec::{Fields, Identity, bad, day_of, decode, encode, minute_of, rows_of, shard_of};
use crate::config::CqlConfig;
use crate::schema::{migrate_with, read_meta};
use crate::statements::Statements;
use crate::stats::{CqlStats, Kind, Op, StatsSnapshot};
use claims::Claimed;

/// Reads issued at once by one operation (due-entry checks, run summaries).
const FAN_OUT: usize = 32;
/// A `runs` entry whose run never got registered is dropped after this long: the LWT that
/// registers the run follows the entry within a request timeout.
const STALE_RUN_ENTRY_MS: i64 = 10 * 60_000;
/// Runs whose audit records this process tracks as flushed; the map is cleared past this.
const FLUSHED_CAPACITY: usize = 100_000;
/// The largest audit record (text and hashes, bytes) sent inside a batch of writes. Cassandra
/// warns about batches over 5 KiB (`batch_size_warn_threshold`) and refuses them over 50 KiB;
/// a larger record is inserted on its own, in parallel with the batch.
const BATCH_RECORD_BYTES: usize = 4 * 1024;

/// The ledger on a CQL cluster. Cheap to clone; clones share the session and the counters.
#[derive(Debug, Clone)]
pub struct CqlLedger {
    inner: Arc<Inner>,
}

struct Inner {
    session: Session,
    config: CqlConfig,
    st: Statements,
    stats: CqlStats,
    clock: Arc<dyn Clock>,
    /// Per run, the highest seq this process knows is in `audit` (every record before it is
    /// too, by the repair rule); lets a writer skip re-inserting `audit_pending`.
    flushed: Mutex<HashMap<String, i64>>,
    /// Heads and rows as this process last saw them: lets a write skip its read.
    known: Mutex<Known>,
    /// The first minute of the due index (written by `migrate`).
    due_origin: i64,
    /// How long this handle's LWTs take now.
    write_latency: sluice_ledger::latency::WriteLatency,
    /// Commands found undecodable: `due` skips them.
    quarantine: Quarantine,
    /// Where this process's sweeps of each due shard left off.
    floors: sweep::Floors,
    /// Where tests hold a task of this ledger (`pause`).
    #[cfg(test)]
    pauses: pause::Pauses,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CqlLedger")
            .field("nodes", &self.config.nodes)
            .field("keyspace", &self.config.keyspace)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// A record of a run's chain as the LWT fixed it: everything `audit` stores.
#[derive(Debug, Clone)]
struct Link {
    seq: i64,
    record: String,
    prev_hash: String,
    hash: String,
    write_id: Option<Uuid>,
}

impl Link {
    /// The record an applied LWT with `write_id` fixed.
    fn sealed(sealed: &SealedLink, write_id: Uuid) -> Self {
        Self {
            seq: seq_i64(sealed.seq),
            record: sealed.canonical.clone(),
            prev_hash: sealed.prev_hash.clone(),
            hash: sealed.hash.clone(),
            write_id: Some(write_id),
        }
    }
}

/// A run's partition-level state, from its static columns.
#[derive(Debug, Clone)]
struct Head {
    /// `audit_seq` as stored (`None`: the run was never written).
    stored_seq: Option<i64>,
    /// `audit_head` as stored: the value an LWT's condition compares.
    stored_hash: Option<String>,
    chain: ChainHead,
    /// The record at `audit_seq - 1`, kept whole until the head moves on.
    pending: Option<Link>,
    run_created_at: Option<i64>,
    updated_at: Option<i64>,
    checkpoint: Option<(i64, String, i64)>,
    /// Closed by a rollback: no new commands.
    closed: bool,
}

impl Head {
    fn empty() -> Self {
        Self {
            stored_seq: None,
            stored_hash: None,
            chain: ChainHead::genesis(),
            pending: None,
            run_created_at: None,
            updated_at: None,
            checkpoint: None,
            closed: false,
        }
    }

    fn of(fields: &Fields) -> Self {
        let stored_seq = fields.bigint("audit_seq");
        let hash = fields.text("audit_head").unwrap_or(GENESIS_HASH).to_owned();
        let chain = match stored_seq {
            Some(seq) => ChainHead {
                next_seq: u64::try_from(seq).unwrap_or(0),
                hash: hash.clone(),
            },
            None => ChainHead::genesis(),
        };
        let pending = match (stored_seq, fields.text("audit_pending")) {
            (Some(seq), Some(record)) if seq > 0 => Some(Link {
                seq: seq - 1,
                record: record.to_owned(),
                prev_hash: fields
                    .text("audit_pending_prev")
                    .unwrap_or_default()
                    .to_owned(),
                hash,
                write_id: fields.uuid("audit_write_id"),
            }),
            _ => None,
        };
        let checkpoint = match (fields.bigint("ckpt_count"), fields.text("ckpt_hash")) {
            (Some(count), Some(hash)) => Some((
                count,
                hash.to_owned(),
                fields.bigint("ckpt_at").unwrap_or_default(),
            )),
            _ => None,
        };
        Self {
            stored_seq,
            stored_hash: fields.text("audit_head").map(str::to_owned),
            chain,
            pending,
            run_created_at: fields.bigint("run_created_at"),
            updated_at: fields.bigint("updated_at"),
            checkpoint,
            closed: fields.bigint("run_closed_at").is_some(),
        }
    }

    /// Records below this seq were purged.
    fn floor(&self) -> i64 {
        self.checkpoint.as_ref().map_or(0, |c| c.0)
    }

    /// The head as an applied LWT left it: `chain` advanced past `sealed`, which is now the
    /// pending record. `run_created_at` is what the LWT stored (or kept).
    fn after(
        &self,
        chain: ChainHead,
        sealed: &SealedLink,
        write_id: Uuid,
        run_created_at: Option<i64>,
        updated_at: i64,
    ) -> Self {
        Self {
            stored_seq: Some(seq_i64(chain.next_seq)),
            stored_hash: Some(chain.hash.clone()),
            chain,
            pending: Some(Link::sealed(sealed, write_id)),
            run_created_at,
            updated_at: Some(updated_at),
            checkpoint: self.checkpoint.clone(),
            closed: self.closed,
        }
    }
}

/// What this process last read or wrote of a command row: enough to write its next transition
/// without reading it first. The LWT that relies on it is guarded by `write_id` (the row is
/// exactly this version: same identity, state and due time) besides status and epoch.
#[derive(Debug, Clone)]
struct KnownRow {
    identity: Arc<Identity>,
    status: CommandStatus,
    epoch: LeaseEpoch,
    due_at: Option<i64>,
    write_id: Uuid,
}

/// The per-process cache of runs' heads and commands' rows, as this process last read or
/// wrote them (see `write` and `reserve_row`). It is only ever a guess: every LWT built on it
/// names in its condition all it relied on (`audit_seq`, `audit_head`, `run_created_at`, the
/// row's `write_id`), so a stale entry costs one LWT that does not apply, after which the
/// entry is dropped and the operation reads, as without a cache.
///
/// A run written by other processes too (an API reserving while a dispatcher leases) would
/// make that cost recur; so a run whose cached state once proved stale goes in `shared`, and
/// its writes read first from then on, as without a cache: at most one LWT lost per run and
/// process (per task, when several tasks of the process write the run from the same stale
/// entry at once). Bounded: past the capacity an arbitrary entry makes room.
#[derive(Debug, Default)]
struct Known {
    heads: HashMap<String, Head>,
    rows: HashMap<(String, String), KnownRow>,
    shared: HashMap<String, ()>,
}

/// What an LWT that did not apply was built on, for [`CqlLedger::forget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stale {
    /// A read made for it: ordinary contention.
    Read,
    /// The cache.
    Cached,
}

/// Entries of each map of [`Known`].
const KNOWN_CAPACITY: usize = 10_000;

fn make_room<K: Clone + Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>, key: &K) {
    if map.len() >= KNOWN_CAPACITY
        && !map.contains_key(key)
        && let Some(victim) = map.keys().next().cloned()
    {
        map.remove(&victim);
    }
}

/// A command row as read, with the run's head.
#[derive(Debug, Clone)]
struct StoredRow {
    identity: Arc<Identity>,
    state: CommandState,
    due_at: Option<i64>,
    args_hash: String,
    write_id: Option<Uuid>,
    head: Head,
}

impl StoredRow {
    fn known(&self) -> Option<KnownRow> {
        Some(KnownRow {
            identity: Arc::clone(&self.identity),
            status: self.state.status,
            epoch: self.state.lease.epoch,
            due_at: self.due_at,
            write_id: self.write_id?,
        })
    }

    fn basis(&self) -> Basis {
        Basis {
            identity: Arc::clone(&self.identity),
            due_at: self.due_at,
            write_id: self.write_id,
            head: self.head.clone(),
        }
    }

    fn command(&self) -> Command {
        Identity::clone(&self.identity).with_state(self.state.clone())
    }
}

/// What a transition is computed from and pinned to: the row (its version is `write_id`) and
/// the run's head, as read just now or as this process last knew them.
#[derive(Debug, Clone)]
struct Basis {
    identity: Arc<Identity>,
    due_at: Option<i64>,
    write_id: Option<Uuid>,
    head: Head,
}

/// How a lightweight transaction went.
enum Lwt {
    Applied,
    /// Not applied; the row holds the current values of the columns in the condition.
    NotApplied(Fields),
    /// It timed out or lost its connection: it may have applied.
    Unknown,
}

/// How the row write of a reservation went. Moved once, as `Reserved` itself is.
#[allow(clippy::large_enum_variant)]
enum RowReserved {
    Done(Reserved),
    /// The business-key claim it was made under is fenced here (taken over, or being taken
    /// over): nothing was written; claim again.
    Fenced,
}

#[derive(scylla::SerializeRow)]
struct ReserveValues<'a> {
    status: &'a str,
    lease_epoch: i64,
    due_at: Option<i64>,
    args_hash: &'a str,
    identity: &'a str,
    state: &'a str,
    write_id: Uuid,
    next_seq: i64,
    head: &'a str,
    pending: &'a str,
    pending_prev: &'a str,
    audit_write_id: Uuid,
    updated_at: i64,
    new_run_created_at: i64,
    run_id: &'a str,
    command_key: &'a str,
    seq: Option<i64>,
    seq_head: Option<&'a str>,
    run_created_at: Option<i64>,
}

/// A reservation under a business-key claim: the same, and the claim's id.
#[derive(scylla::SerializeRow)]
struct ClaimedReserveValues<'a> {
    #[scylla(flatten)]
    reserve: ReserveValues<'a>,
    claim_id: Uuid,
}

#[derive(scylla::SerializeRow)]
struct TransitionValues<'a> {
    status: &'a str,
    lease_epoch: i64,
    due_at: Option<i64>,
    state: &'a str,
    write_id: Uuid,
    next_seq: i64,
    head: &'a str,
    pending: &'a str,
    pending_prev: &'a str,
    audit_write_id: Uuid,
    updated_at: i64,
    run_id: &'a str,
    command_key: &'a str,
    guard_status: &'a str,
    guard_epoch: i64,
    row_write_id: Option<Uuid>,
    seq: i64,
    seq_head: Option<&'a str>,
}

#[derive(scylla::SerializeRow)]
struct AppendValues<'a> {
    next_seq: i64,
    head: &'a str,
    pending: &'a str,
    pending_prev: &'a str,
    audit_write_id: Uuid,
    updated_at: i64,
    new_run_created_at: i64,
    /// When the record closes the run (a rollback); unset leaves the column as it is.
    closed_at: MaybeUnset<i64>,
    run_id: &'a str,
    seq: Option<i64>,
    run_created_at: Option<i64>,
}

fn epoch_i64(epoch: LeaseEpoch) -> i64 {
    i64::try_from(epoch.get()).unwrap_or(i64::MAX)
}

fn seq_i64(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

fn storage(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> LedgerError {
    LedgerError::Storage {
        op,
        source: Box::new(e),
    }
}

fn storage_msg(op: &'static str, why: impl Into<String>) -> LedgerError {
    LedgerError::Storage {
        op,
        source: why.into().into(),
    }
}

/// Whether a failed LWT may still have applied. Only errors that prove the request was never
/// acted on (refused before the Paxos round, or never sent) are "not applied"; anything else,
/// including errors this build does not know, is treated as unknown and settled by a read.
fn outcome_unknown(error: &ExecutionError) -> bool {
    match error {
        ExecutionError::BadQuery(_)
        | ExecutionError::EmptyPlan
        | ExecutionError::PrepareError(_)
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::UseKeyspaceError(_) => false,
        ExecutionError::LastAttemptError(attempt) => match attempt {
            RequestAttemptError::SerializationError(_)
            | RequestAttemptError::CqlRequestSerialization(_)
            | RequestAttemptError::UnableToAllocStreamId => false,
            RequestAttemptError::DbError(db, _) => !matches!(
                db,
                DbError::SyntaxError
                    | DbError::Invalid
                    | DbError::AlreadyExists { .. }
                    | DbError::FunctionFailure { .. }
                    | DbError::AuthenticationError
                    | DbError::Unauthorized
                    | DbError::ConfigError
                    | DbError::Unavailable { .. }
                    | DbError::Overloaded
                    | DbError::IsBootstrapping
                    | DbError::TruncateError
                    | DbError::Unprepared { .. }
                    | DbError::RateLimitReached { .. }
                    | DbError::ProtocolError
            ),
            _ => true,
        },
        _ => true,
    }
}

/// Which operation a transition is, for the counters.
fn classify(transition: &Transition) -> Op {
    let (guard, next) = (&transition.guard, &transition.next);
    if transition.audit.is_none() {
        Op::QuietWrite
    } else if matches!(
        guard.status,
        CommandStatus::Pending | CommandStatus::Approved
    ) && next.status == CommandStatus::Leased
        && next.lease.epoch == guard.epoch.next()
    {
        Op::Lease
    } else if guard.status == CommandStatus::Leased
        && next.status != CommandStatus::Leased
        && next.lease.epoch == guard.epoch
    {
        Op::Finalize
    } else {
        Op::Transition
    }
}

/// A short random pause before trying again under contention (grows with the attempt).
async fn back_off(attempt: u32) {
    let ceiling = 2u128 << attempt.min(6);
    let jitter = Uuid::new_v4().as_u128() % ceiling;
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(jitter).unwrap_or(1) + 1,
    ))
    .await;
}

/// A driver session to the configured cluster, with its consistency, timeouts and credentials
/// (for [`CqlLedger::connect`] and tooling).
pub async fn connect_session(config: &CqlConfig) -> Result<Session, CqlError> {
    config.validate()?;
    let profile = ExecutionProfile::builder()
        .consistency(config.consistency.driver())
        .serial_consistency(Some(config.serial_consistency.driver()))
        .request_timeout(Some(Duration::from_millis(config.request_timeout_ms)))
        .build();
    let mut builder = SessionBuilder::new()
        .known_nodes(&config.nodes)
        .connection_timeout(Duration::from_millis(config.connect_timeout_ms))
        .default_execution_profile_handle(profile.into_handle());
    if let Some(username) = &config.username {
        let password = config.password.as_ref().map_or("", |p| p.expose());
        builder = builder.user(username, password);
    }
    if let Some(tls) = config.tls.client_config()? {
        builder = builder.tls_context(Some(tls));
    }
    builder.build().await.map_err(|source| CqlError::Connect {
        nodes: config.nodes.join(","),
        source: Box::new(source),
    })
}

impl CqlLedger {
    /// Connects to the cluster, applies the schema (creating the keyspace if needed; see
    /// `migrate_on_start`) and prepares every statement.
    pub async fn connect(config: CqlConfig) -> Result<Self, CqlError> {
        Self::connect_with_clock(config, Arc::new(SystemClock)).await
    }

    /// [`CqlLedger::connect`] with a clock of the caller's (due buckets, claim ages, purges).
    pub async fn connect_with_clock(
        config: CqlConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CqlError> {
        let session = connect_session(&config).await?;
        Self::open(session, config, clock).await
    }

    /// Uses a session the caller built: applies the schema (unless `migrate_on_start` is off)
    /// and prepares every statement.
    pub async fn open(
        session: Session,
        config: CqlConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, CqlError> {
        config.validate()?;
        if config.migrate_on_start {
            migrate_with(
                &session,
                &config.keyspace,
                &config.replication,
                config.tablets,
            )
            .await?;
        }
        let due_origin = read_meta(&session, &config.keyspace, "due_origin")
            .await
            .map_err(|e| CqlError::Schema {
                keyspace: config.keyspace.clone(),
                why: format!("cannot be read ({e}); run `sluice migrate` first"),
            })?
            .ok_or_else(|| CqlError::Schema {
                keyspace: config.keyspace.clone(),
                why: "has no Sluice ledger schema; run `sluice migrate` first".into(),
            })?;
        let st = Statements::prepare(&session, &config).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                session,
                config,
                st,
                stats: CqlStats::default(),
                clock,
                flushed: Mutex::new(HashMap::new()),
                known: Mutex::new(Known::default()),
                due_origin,
                write_latency: Default::default(),
                quarantine: Quarantine::default(),
                floors: sweep::Floors::default(),
                #[cfg(test)]
                pauses: pause::Pauses::default(),
            }),
        })
    }

    /// Round trips so far, by operation.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// The driver session (for `sluice migrate`, health checks).
    pub fn session(&self) -> &Session {
        &self.inner.session
    }

    pub fn config(&self) -> &CqlConfig {
        &self.inner.config
    }

    fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// A point where a test may hold this task (see `pause`); nothing outside tests.
    #[cfg(test)]
    async fn pause(&self, point: &'static str, run: &str) {
        self.inner.pauses.at(point, run).await;
    }

    #[cfg(not(test))]
    #[inline(always)]
    async fn pause(&self, _point: &'static str, _run: &str) {}

    // ---- round trips -------------------------------------------------------------------

    async fn plain(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Vec<Fields>, LedgerError> {
        let trip = self.inner.stats.round_trip(op, Kind::Plain);
        let result = self
            .inner
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| storage(what, e))?;
        drop(trip);
        rows_of(result).map_err(|why| storage_msg(what, why))
    }

    /// A read that may span pages; one round trip per page.
    async fn paged(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        kind: Kind,
    ) -> Result<Vec<Fields>, LedgerError> {
        let mut rows = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let trip = self.inner.stats.round_trip(op, kind);
            let (result, next) = self
                .inner
                .session
                .execute_single_page(statement, &values, paging)
                .await
                .map_err(|e| storage(what, e))?;
            drop(trip);
            rows.extend(rows_of(result).map_err(|why| storage_msg(what, why))?);
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(rows),
            }
        }
    }

    async fn lwt(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Lwt, LedgerError> {
        let trip = self.inner.stats.round_trip(op, Kind::Lwt);
        let started = std::time::Instant::now();
        let answer = self.inner.session.execute_unpaged(statement, values).await;
        self.inner.write_latency.observe(started.elapsed());
        drop(trip);
        match answer {
            Ok(result) => {
                let row = rows_of(result)
                    .map_err(|why| storage_msg(what, why))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| {
                        storage_msg(what, "the LWT answered without an [applied] row")
                    })?;
                Ok(if row.boolean("[applied]") == Some(true) {
                    Lwt::Applied
                } else {
                    Lwt::NotApplied(row)
                })
            }
            Err(e) if outcome_unknown(&e) => {
                self.inner.stats.unknown(op);
                tracing::warn!(op = what, error = %e, "LWT outcome unknown; settling it with a SERIAL read");
                // The request may still start its round at the coordinator: wait until it can
                // no longer apply before the read that decides.
                tokio::time::sleep(Duration::from_millis(
                    self.inner.config.unknown_settle_delay_ms,
                ))
                .await;
                Ok(Lwt::Unknown)
            }
            Err(e) => Err(storage(what, e)),
        }
    }

    // ---- reads -------------------------------------------------------------------------

    async fn read_head(&self, op: Op, run: &str, serial: bool) -> Result<Head, LedgerError> {
        let (statement, kind) = if serial {
            (&self.inner.st.read_head_serial, Kind::Serial)
        } else {
            (&self.inner.st.read_head, Kind::Plain)
        };
        let rows = self.paged(op, "read head", statement, (run,), kind).await?;
        let head = rows.first().map_or_else(Head::empty, Head::of);
        self.remember_head(run, &head);
        Ok(head)
    }

    /// The command in `fields`, if it holds one. One that does not decode is
    /// [`LedgerError::UndecodableCommand`] and is quarantined.
    fn stored_row(&self, run: &str, fields: &Fields) -> Result<Option<StoredRow>, LedgerError> {
        let (Some(identity), Some(state)) = (fields.text("identity"), fields.text("state")) else {
            // The partition's static row (the run exists, this command does not), or a row
            // that holds only claim fences.
            return Ok(None);
        };
        let undecodable = |what: &'static str, e: serde_json::Error| {
            self.inner.quarantine.note(LedgerError::UndecodableCommand {
                run_id: run.to_owned(),
                command_key: fields.text("command_key").unwrap_or_default().to_owned(),
                what,
                why: e.to_string(),
            })
        };
        Ok(Some(StoredRow {
            identity: Arc::new(
                serde_json::from_str(identity).map_err(|e| undecodable("command", e))?,
            ),
            state: serde_json::from_str(state).map_err(|e| undecodable("command state", e))?,
            due_at: fields.bigint("due_at"),
            args_hash: fields.text("args_hash").unwrap_or_default().to_owned(),
            write_id: fields.uuid("write_id"),
            head: Head::of(fields),
        }))
    }

    async fn read_row(
        &self,
        op: Op,
        run: &str,
        key: &str,
        serial: bool,
    ) -> Result<Option<StoredRow>, LedgerError> {
        let rows = if serial {
            self.paged(
                op,
                "read command",
                &self.inner.st.read_command_serial,
                (run, key),
                Kind::Serial,
            )
            .await?
        } else {
            self.plain(op, "read command", &self.inner.st.read_command, (run, key))
                .await?
        };
        let Some(fields) = rows.first() else {
            return Ok(None);
        };
        let row = self.stored_row(run, fields)?;
        match &row {
            Some(row) => {
                self.remember_head(run, &row.head);
                self.remember_row(run, key, row.known());
            }
            None => self.remember_head(run, &Head::of(fields)),
        }
        Ok(row)
    }

    // ---- what this process knows ------------------------------------------------------

    /// The head to write from without a read, unless the run is written by others too.
    fn known_head(&self, run: &str) -> Option<Head> {
        let known = self.inner.known.lock().ok()?;
        if known.shared.contains_key(run) {
            return None;
        }
        known.heads.get(run).cloned()
    }

    /// Keeps `head` unless a later one (higher `audit_seq`) is known already: reads and writes
    /// of one run by concurrent tasks of this process complete in any order.
    fn remember_head(&self, run: &str, head: &Head) {
        if let Ok(mut known) = self.inner.known.lock() {
            let key = run.to_owned();
            if known
                .heads
                .get(&key)
                .is_some_and(|known| known.stored_seq > head.stored_seq)
            {
                return;
            }
            make_room(&mut known.heads, &key);
            known.heads.insert(key, head.clone());
        }
    }

    /// A row is only worth keeping while it has transitions ahead; a terminal one (or one
    /// without a `write_id`, which an LWT could not pin) is dropped.
    fn remember_row(&self, run: &str, key: &str, row: Option<KnownRow>) {
        if let Ok(mut known) = self.inner.known.lock() {
            let id = (run.to_owned(), key.to_owned());
            match row.filter(|row| !row.status.is_terminal()) {
                Some(row) => {
                    make_room(&mut known.rows, &id);
                    known.rows.insert(id, row);
                }
                None => {
                    known.rows.remove(&id);
                }
            }
        }
    }

    /// Drops what this process knows of a run's head and, with `key`, of that command: after
    /// an LWT that did not apply (or may not have), the next round reads. `Stale::Cached`: the
    /// LWT was built on the cache, so the run is written by others too (see [`Known`]).
    fn forget(&self, run: &str, key: Option<&str>, stale: Stale) {
        if let Ok(mut known) = self.inner.known.lock() {
            known.heads.remove(run);
            if let Some(key) = key {
                known.rows.remove(&(run.to_owned(), key.to_owned()));
            }
            if stale == Stale::Cached {
                let run = run.to_owned();
                make_room(&mut known.shared, &run);
                known.shared.insert(run, ());
            }
        }
    }

    /// Drops everything known of a run (it was purged).
    fn forget_run(&self, run: &str) {
        if let Ok(mut known) = self.inner.known.lock() {
            known.heads.remove(run);
            known.rows.retain(|(known_run, _), _| known_run != run);
        }
    }

    /// The row and head a transition under `guard` can be written from without a read: both
    /// known, and the row at the guard's status and epoch.
    fn known_basis(&self, run: &str, key: &str, guard: Guard) -> Option<Basis> {
        let known = self.inner.known.lock().ok()?;
        if known.shared.contains_key(run) {
            return None;
        }
        let row = known
            .rows
            .get(&(run.to_owned(), key.to_owned()))
            .filter(|row| row.status == guard.status && row.epoch == guard.epoch)?;
        let head = known.heads.get(run)?;
        Some(Basis {
            identity: Arc::clone(&row.identity),
            due_at: row.due_at,
            write_id: Some(row.write_id),
            head: head.clone(),
        })
    }

    // ---- the audit chain ---------------------------------------------------------------

    fn known_flushed(&self, run: &str, seq: i64) -> bool {
        self.inner
            .flushed
            .lock()
            .map(|map| map.get(run).is_some_and(|&done| done >= seq))
            .unwrap_or(false)
    }

    fn mark_flushed(&self, run: &str, seq: i64) {
        if let Ok(mut map) = self.inner.flushed.lock() {
            if map.len() >= FLUSHED_CAPACITY {
                map.clear();
            }
            let done = map.entry(run.to_owned()).or_insert(seq);
            *done = (*done).max(seq);
        }
    }

    // ---- indexes -----------------------------------------------------------------------

    /// The values of `insert_due`. An entry already due goes in the writer's current minute,
    /// never in a bucket a sweep may have passed (see `due`).
    fn due_values<'v>(
        &self,
        run: &'v str,
        key: &'v str,
        due_at: Timestamp,
        status: CommandStatus,
    ) -> (i64, i32, i64, &'v str, &'v str, &'static str) {
        let minute = minute_of(due_at).max(minute_of(self.now()));
        let shard = shard_of(run, self.inner.config.due_shards);
        (minute, shard, due_at.as_millis(), run, key, status.as_str())
    }

    /// Files a due entry on its own (the sweep carrying an entry forward).
    async fn write_due(
        &self,
        op: Op,
        run: &str,
        key: &str,
        due_at: Timestamp,
        status: &str,
    ) -> Result<(), LedgerError> {
        let minute = minute_of(due_at).max(minute_of(self.now()));
        let shard = shard_of(run, self.inner.config.due_shards);
        let values = (minute, shard, due_at.as_millis(), run, key, status);
        self.plain(op, "write due entry", &self.inner.st.insert_due, values)
            .await
            .map(drop)
    }

    /// Everything that must exist before an LWT that may apply: the record the head still holds
    /// (repair rule), the due entry for a new due time and the `runs` entry of a new run. They go
    /// to different partitions and need no atomicity among themselves (each is idempotent, and
    /// one that lands without its LWT is harmless: the record is the head's own, the due entry
    /// is checked against the command, the runs entry against `run_created_at`), so they are
    /// one UNLOGGED BATCH: one round trip, not one each. A record too large for a quiet batch
    /// goes beside it, in parallel.
    async fn before_lwt(
        &self,
        op: Op,
        run: &str,
        head: Option<&Head>,
        due: Option<(&str, Timestamp, CommandStatus)>,
        register: Option<i64>,
    ) -> Result<(), LedgerError> {
        type Values<'v> = Box<dyn SerializeRow + Send + Sync + 'v>;
        let st = &self.inner.st;
        let mut writes: Vec<(&PreparedStatement, Values<'_>)> = Vec::with_capacity(3);
        let pending = head.and_then(|head| match &head.pending {
            Some(link) if link.seq >= head.floor() && !self.known_flushed(run, link.seq) => {
                Some(link)
            }
            Some(_) | None => None,
        });
        let mut alone = None;
        if let Some(link) = pending {
            if link.record.len() + link.prev_hash.len() + link.hash.len() <= BATCH_RECORD_BYTES {
                writes.push((&st.insert_audit, Box::new(Self::link_values(run, link))));
            } else {
                alone = Some(link);
            }
        }
        if let Some((key, at, status)) = due {
            writes.push((
                &st.insert_due,
                Box::new(self.due_values(run, key, at, status)),
            ));
        }
        if let Some(created_at) = register {
            writes.push((
                &st.insert_run,
                Box::new((day_of(created_at), created_at, run)),
            ));
        }
        let together = async {
            match writes.len() {
                0 => Ok(()),
                1 => {
                    let (statement, values) = writes.pop().expect("one write, checked above");
                    self.plain(op, "write before LWT", statement, values)
                        .await
                        .map(drop)
                }
                _ => {
                    let (statements, values): (Vec<_>, Vec<_>) = writes.into_iter().unzip();
                    let mut batch = Batch::new(BatchType::Unlogged);
                    for statement in statements {
                        batch.append_statement(statement.clone());
                    }
                    // Every statement in it is a plain idempotent write.
                    batch.set_is_idempotent(true);
                    let _trip = self.inner.stats.round_trip(op, Kind::Plain);
                    self.inner
                        .session
                        .batch(&batch, values)
                        .await
                        .map(drop)
                        .map_err(|e| storage("write before LWT", e))
                }
            }
        };
        let alone = async {
            match alone {
                Some(link) => self.insert_link(op, run, link).await,
                None => Ok(()),
            }
        };
        futures::try_join!(together, alone)?;
        if let Some(link) = pending {
            self.mark_flushed(run, link.seq);
        }
        Ok(())
    }

    /// The refusal of `command` if its run holds a command someone other than its submitter
    /// submitted.
    async fn foreign(&self, command: &Command) -> Result<Option<LedgerError>, LedgerError> {
        let submitter = command.submitted_by.as_deref();
        let commands = self.list_run(&command.run_id, None).await?;
        Ok(commands
            .iter()
            .find(|c| c.submitted_by.as_deref() != submitter)
            .map(|other| LedgerError::foreign_run(command, other.submitted_by.as_deref())))
    }

    fn too_contended(&self, op: Op, run: &str) -> LedgerError {
        storage_msg(
            op.as_str(),
            format!(
                "run {run}: the audit head kept moving under {} attempts; nothing was written, try again",
                self.inner.config.max_attempts
            ),
        )
    }

    // ---- reserve and claims ------------------------------------------------------------

    /// Reserves `command`; `confined` refuses a run holding another submitter's command.
    async fn reserve_as(
        &self,
        mut command: Command,
        audit: AuditDraft,
        confined: bool,
    ) -> Result<Reserved, LedgerError> {
        let op = Op::Reserve;
        self.inner.stats.call(op);
        command.state.result = cap_result(command.state.result.take());
        let record = PreparedRecord::new(&command.run_id, audit, command.state.updated_at);
        let mut fresh_claim = false;
        // A claim id this reservation found fenced: the next claim takes it over or gives way.
        let mut dead = None;
        for _ in 0..self.inner.config.max_attempts {
            let claim = match &command.business_key {
                None => None,
                Some(business_key) => {
                    sluice_faults::point!("ledger.claim_key.pre");
                    let claimed = self
                        .claim(
                            op,
                            &command.tool,
                            business_key,
                            &command.run_id,
                            &command.command_key,
                            dead,
                        )
                        .await?;
                    sluice_faults::point!("ledger.claim_key.post");
                    match claimed {
                        Claimed::Mine { id, fresh } => {
                            fresh_claim |= fresh;
                            Some(id)
                        }
                        Claimed::HeldBy(run, key) => {
                            let holder = self
                                .read_row(op, run.as_str(), &key.to_string(), false)
                                .await?
                                .ok_or_else(|| {
                                    bad(
                                        "business key holder",
                                        run.as_str(),
                                        format!("{key} vanished"),
                                    )
                                })?;
                            return Ok(Reserved::BusinessKeyHeld(holder.command()));
                        }
                    }
                }
            };
            self.pause("reserve.claimed", command.run_id.as_str()).await;
            sluice_faults::point!("ledger.reserve.pre");
            let row = self.reserve_row(&command, &record, confined, claim).await;
            sluice_faults::point!("ledger.reserve.post");
            let reserved = match row {
                Ok(RowReserved::Done(reserved)) => Ok(reserved),
                Ok(RowReserved::Fenced) => {
                    dead = claim;
                    continue;
                }
                Err(e) => Err(e),
            };
            if fresh_claim
                && matches!(
                    reserved,
                    Err(LedgerError::ArgumentDrift { .. }
                        | LedgerError::RunClosed { .. }
                        | LedgerError::ForeignRun { .. })
                )
            {
                self.release_claim(op, &command).await;
            }
            return reserved;
        }
        Err(self.too_contended(op, command.run_id.as_str()))
    }

    /// Writes the command's row, under business-key claim `claim` if it has one.
    async fn reserve_row(
        &self,
        command: &Command,
        record: &PreparedRecord,
        confined: bool,
        claim: Option<Uuid>,
    ) -> Result<RowReserved, LedgerError> {
        let op = Op::Reserve;
        let run = command.run_id.as_str();
        let key = command.command_key.to_string();
        let identity = Arc::new(Identity::of(command));
        let encoded_identity = encode(&*identity);
        let state = encode(&command.state);
        for attempt in 0..self.inner.config.max_attempts {
            // The head as this process last read or wrote it, if it did: the LWT's condition
            // holds all of it that the write relies on, so a stale one only fails the LWT.
            let (head, source) = match self.known_head(run) {
                Some(head) => (head, Stale::Cached),
                None => (self.read_head(op, run, false).await?, Stale::Read),
            };
            if head.closed {
                // A closed run: what is there still replays; nothing new goes in. (A cached head
                // that missed the closing fails its LWT below and is read afresh.)
                if let Some(stored) = self.read_row(op, run, &key, false).await? {
                    return self
                        .existing(command, &key, Some(stored))
                        .await
                        .map(RowReserved::Done);
                }
                return Err(LedgerError::RunClosed {
                    run_id: run.to_owned(),
                    command_key: key,
                });
            }
            // A run never written has no commands; one that was is read whole. The LWT below
            // is conditioned on the head this check saw, so a command added since fails it.
            if confined
                && head.stored_seq.is_some()
                && let Some(refused) = self.foreign(command).await?
            {
                return Err(refused);
            }
            let created_at = head
                .run_created_at
                .unwrap_or_else(|| command.created_at.as_millis());
            let register =
                (head.run_created_at.is_none() && run != SYSTEM_RUN).then_some(created_at);
            let due = command
                .state
                .due_at
                .map(|at| (key.as_str(), at, command.state.status));
            self.before_lwt(op, run, Some(&head), due, register).await?;
            let mut chain = head.chain.clone();
            let sealed = record.seal_link(&mut chain);
            let write_id = Uuid::new_v4();
            let values = ReserveValues {
                status: command.state.status.as_str(),
                lease_epoch: epoch_i64(command.state.lease.epoch),
                due_at: command.state.due_at.map(Timestamp::as_millis),
                args_hash: command.args_hash.as_str(),
                identity: &encoded_identity,
                state: &state,
                write_id,
                next_seq: seq_i64(chain.next_seq),
                head: &sealed.hash,
                pending: &sealed.canonical,
                pending_prev: &sealed.prev_hash,
                audit_write_id: write_id,
                updated_at: command.state.updated_at.as_millis(),
                new_run_created_at: created_at,
                run_id: run,
                command_key: &key,
                seq: head.stored_seq,
                seq_head: head.stored_hash.as_deref(),
                run_created_at: head.run_created_at,
            };
            let outcome = match claim {
                None => {
                    self.lwt(op, "reserve", &self.inner.st.reserve, values)
                        .await?
                }
                Some(claim_id) => {
                    let values = ClaimedReserveValues {
                        reserve: values,
                        claim_id,
                    };
                    self.lwt(op, "reserve", &self.inner.st.reserve_claimed, values)
                        .await?
                }
            };
            let applied = match outcome {
                Lwt::Applied => true,
                Lwt::NotApplied(row) if row.text("status").is_some() => {
                    return self
                        .existing(command, &key, None)
                        .await
                        .map(RowReserved::Done);
                }
                Lwt::NotApplied(row)
                    if claim.is_some_and(|id| row.map_has_uuid("claim_fences", id)) =>
                {
                    return Ok(RowReserved::Fenced);
                }
                Lwt::NotApplied(_) => {
                    // The head moved, or the run was purged or registered: read it afresh.
                    self.forget(run, None, source);
                    self.inner.stats.retry(op);
                    back_off(attempt).await;
                    continue;
                }
                Lwt::Unknown => {
                    // Not a sign of a stale cache; the SERIAL read refreshes it.
                    self.forget(run, None, Stale::Read);
                    self.settle_audited(op, run, write_id, seq_i64(sealed.seq))
                        .await?
                }
            };
            if applied {
                let after = head.after(
                    chain,
                    &sealed,
                    write_id,
                    Some(created_at),
                    command.state.updated_at.as_millis(),
                );
                self.remember_head(run, &after);
                self.remember_row(
                    run,
                    &key,
                    Some(KnownRow {
                        identity: Arc::clone(&identity),
                        status: command.state.status,
                        epoch: command.state.lease.epoch,
                        due_at: command.state.due_at.map(Timestamp::as_millis),
                        write_id,
                    }),
                );
                self.insert_own(op, run, &sealed, write_id).await;
                return Ok(RowReserved::Done(Reserved::Created(command.clone())));
            }
            if let Some(stored) = self.read_row(op, run, &key, false).await? {
                return self
                    .existing(command, &key, Some(stored))
                    .await
                    .map(RowReserved::Done);
            }
        }
        Err(self.too_contended(op, run))
    }

    /// The stored command under the key (read unless the caller just did): the same arguments
    /// replay it, others are drift.
    async fn existing(
        &self,
        command: &Command,
        key: &str,
        stored: Option<StoredRow>,
    ) -> Result<Reserved, LedgerError> {
        let run = command.run_id.as_str();
        let stored = match stored {
            Some(stored) => stored,
            None => self
                .read_row(Op::Reserve, run, key, false)
                .await?
                .ok_or_else(|| bad("command", run, format!("{key} exists but cannot be read")))?,
        };
        if stored.args_hash == command.args_hash.as_str() {
            Ok(Reserved::Existing(stored.command()))
        } else {
            Err(LedgerError::ArgumentDrift {
                run_id: run.to_owned(),
                command_key: key.to_owned(),
                stored: stored.args_hash,
                presented: command.args_hash.to_string(),
            })
        }
    }

    // ---- transitions -------------------------------------------------------------------

    async fn write(&self, op: Op, mut transition: Transition) -> Result<Cas, LedgerError> {
        transition.next.result = cap_result(transition.next.result.take());
        let state = encode(&transition.next);
        let next = &transition.next;
        let record = transition
            .audit
            .take()
            .map(|draft| PreparedRecord::new(&transition.run_id, draft, next.updated_at));
        let run = transition.run_id.as_str();
        let key = transition.command_key.to_string();
        let guard = transition.guard;
        let applied =
            |basis: &Basis| Cas::Applied(Identity::clone(&basis.identity).with_state(next.clone()));
        for attempt in 0..self.inner.config.max_attempts {
            // An audited transition of a row this process last wrote or read at the guard's
            // status and epoch goes straight to its LWT, pinned to that row version and head.
            let known = record
                .as_ref()
                .and_then(|_| self.known_basis(run, &key, guard));
            let stale = if known.is_some() {
                Stale::Cached
            } else {
                Stale::Read
            };
            let basis = match known {
                Some(basis) => basis,
                None => {
                    let Some(row) = self.read_row(op, run, &key, false).await? else {
                        return Ok(Cas::Conflict(None));
                    };
                    if row.state.status != guard.status || row.state.lease.epoch != guard.epoch {
                        return Ok(Cas::Conflict(Some(row.command())));
                    }
                    row.basis()
                }
            };
            let new_due = next
                .due_at
                .filter(|at| Some(at.as_millis()) != basis.due_at)
                .map(|at| (key.as_str(), at, next.status));
            let write_id = Uuid::new_v4();
            let known_row = || KnownRow {
                identity: Arc::clone(&basis.identity),
                status: next.status,
                epoch: next.lease.epoch,
                due_at: next.due_at.map(Timestamp::as_millis),
                write_id,
            };
            match &record {
                None => {
                    self.before_lwt(op, run, None, new_due, None).await?;
                    let values = (
                        next.status.as_str(),
                        epoch_i64(next.lease.epoch),
                        next.due_at.map(Timestamp::as_millis),
                        state.as_str(),
                        write_id,
                        run,
                        key.as_str(),
                        guard.status.as_str(),
                        epoch_i64(guard.epoch),
                    );
                    let done = match self.lwt(op, "write", &self.inner.st.quiet, values).await? {
                        Lwt::Applied => true,
                        Lwt::NotApplied(_) => false,
                        Lwt::Unknown => {
                            let now = self.read_row(op, run, &key, true).await?;
                            now.as_ref().and_then(|r| r.write_id) == Some(write_id)
                        }
                    };
                    if done {
                        self.remember_row(run, &key, Some(known_row()));
                        return Ok(applied(&basis));
                    }
                }
                Some(record) => {
                    self.before_lwt(op, run, Some(&basis.head), new_due, None)
                        .await?;
                    let mut chain = basis.head.chain.clone();
                    let sealed = record.seal_link(&mut chain);
                    let values = TransitionValues {
                        status: next.status.as_str(),
                        lease_epoch: epoch_i64(next.lease.epoch),
                        due_at: next.due_at.map(Timestamp::as_millis),
                        state: &state,
                        write_id,
                        next_seq: seq_i64(chain.next_seq),
                        head: &sealed.hash,
                        pending: &sealed.canonical,
                        pending_prev: &sealed.prev_hash,
                        audit_write_id: write_id,
                        updated_at: next.updated_at.as_millis(),
                        run_id: run,
                        command_key: &key,
                        guard_status: guard.status.as_str(),
                        guard_epoch: epoch_i64(guard.epoch),
                        row_write_id: basis.write_id,
                        seq: seq_i64(sealed.seq),
                        seq_head: basis.head.stored_hash.as_deref(),
                    };
                    let done = match self
                        .lwt(op, "transition", &self.inner.st.transition, values)
                        .await?
                    {
                        Lwt::Applied => true,
                        Lwt::NotApplied(now) => {
                            self.forget(run, Some(&key), stale);
                            let guard_holds = now.text("status") == Some(guard.status.as_str())
                                && now.bigint("lease_epoch") == Some(epoch_i64(guard.epoch));
                            if guard_holds {
                                // Only the head or the row's version moved (another command of
                                // the run, a lease extension, a sweep): read and try again.
                                self.inner.stats.retry(op);
                                back_off(attempt).await;
                            }
                            false
                        }
                        Lwt::Unknown => {
                            self.forget(run, Some(&key), Stale::Read);
                            self.settle_audited(op, run, write_id, seq_i64(sealed.seq))
                                .await?
                        }
                    };
                    if done {
                        let after = basis.head.after(
                            chain,
                            &sealed,
                            write_id,
                            basis.head.run_created_at,
                            next.updated_at.as_millis(),
                        );
                        self.remember_head(run, &after);
                        self.remember_row(run, &key, Some(known_row()));
                        let stale_due = basis
                            .due_at
                            .filter(|&old| Some(old) != next.due_at.map(Timestamp::as_millis));
                        self.after_transition(
                            op,
                            run,
                            &sealed,
                            write_id,
                            stale_due.map(|at| (key.as_str(), at)),
                        )
                        .await;
                        return Ok(applied(&basis));
                    }
                }
            }
            // Not applied: the next round reads and either conflicts or tries again.
        }
        Err(self.too_contended(op, run))
    }
}

#[async_trait]
impl Ledger for CqlLedger {
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

    async fn transition(&self, transition: Transition) -> Result<Cas, LedgerError> {
        transition.validate()?;
        let op = classify(&transition);
        self.inner.stats.call(op);
        sluice_faults::point!("ledger.transition.pre");
        let cas = self.write(op, transition).await;
        sluice_faults::point!("ledger.transition.post");
        cas
    }

    async fn get(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Option<Command>, LedgerError> {
        self.inner.stats.call(Op::Get);
        Ok(self
            .read_row(Op::Get, run_id.as_str(), &command_key.to_string(), false)
            .await?
            .map(|row| row.command()))
    }

    async fn list_run(
        &self,
        run_id: &RunId,
        status: Option<CommandStatus>,
    ) -> Result<Vec<Command>, LedgerError> {
        let op = Op::ListRun;
        self.inner.stats.call(op);
        let run = run_id.as_str();
        let rows = self
            .paged(op, "list run", &self.inner.st.read_run, (run,), Kind::Plain)
            .await?;
        let mut commands = Vec::with_capacity(rows.len());
        for fields in &rows {
            if let Some(row) = self.stored_row(run, fields)?
                && status.is_none_or(|s| s == row.state.status)
            {
                commands.push(row.command());
            }
        }
        // Journal order: decision, then call index, then the key for a stable tie-break.
        commands.sort_by(|a, b| {
            let key = |c: &Command| {
                (
                    c.command_key.decision(),
                    c.command_key.call_idx(),
                    c.command_key.to_string(),
                )
            };
            key(a).cmp(&key(b))
        });
        Ok(commands)
    }

    async fn list_runs(
        &self,
        since: Timestamp,
        before: Option<&RunCursor>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, LedgerError> {
        self.list_runs_by_day(since, before, limit).await
    }

    async fn claim_business_key(
        &self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Claim, LedgerError> {
        let op = Op::ClaimBusinessKey;
        self.inner.stats.call(op);
        sluice_faults::point!("ledger.claim_key.pre");
        let claimed = self
            .claim(op, tool, business_key, run_id, command_key, None)
            .await?;
        sluice_faults::point!("ledger.claim_key.post");
        Ok(match claimed {
            Claimed::Mine { .. } => Claim::Claimed,
            Claimed::HeldBy(run_id, command_key) => Claim::HeldBy {
                run_id,
                command_key,
            },
        })
    }

    /// Walks the due buckets from the oldest unswept minute (per shard, `sweep_cursor`) to
    /// `now`. Entries are checked against their command; stale ones are deleted. Live entries
    /// in a bucket older than the sweep lag are carried forward into the current minute, so a
    /// cursor never waits behind a command that stays due, and can move past the bucket.
    async fn due_in(
        &self,
        now: Timestamp,
        limit: usize,
        shards: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError> {
        self.sweep_due(now, limit, shards).await
    }

    fn due_shards(&self) -> u32 {
        self.inner.config.due_shards
    }

    fn write_latency_ms(&self) -> i64 {
        self.inner.write_latency.millis()
    }

    async fn sweep_view(&self, group: &str, shards: u32) -> Result<SweepView, LedgerError> {
        self.read_sweep_view(group, shards).await
    }

    async fn write_shard_lease(
        &self,
        group: &str,
        guard: Option<u64>,
        next: ShardLease,
    ) -> Result<ShardCas, LedgerError> {
        self.put_shard_lease(group, guard, next).await
    }

    async fn announce(&self, group: &str, member: Member) -> Result<(), LedgerError> {
        self.put_member(group, member).await
    }

    async fn audit_append(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        sluice_faults::point!("ledger.audit_append.pre");
        let entry = self.append_run_record(run_id, draft, at, false).await;
        sluice_faults::point!("ledger.audit_append.post");
        entry
    }

    async fn close_run(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        sluice_faults::point!("ledger.close_run.pre");
        let entry = self.append_run_record(run_id, draft, at, true).await;
        sluice_faults::point!("ledger.close_run.post");
        entry
    }

    async fn audit_read(&self, run_id: &RunId) -> Result<AuditTrail, LedgerError> {
        let op = Op::AuditRead;
        self.inner.stats.call(op);
        let run = run_id.as_str();
        let head = self.read_head(op, run, false).await?;
        let Some(next_seq) = head.stored_seq else {
            return Ok(AuditTrail::default());
        };
        let floor = head.floor();
        let rows = self
            .paged(
                op,
                "read audit",
                &self.inner.st.read_audit,
                (run, floor),
                Kind::Plain,
            )
            .await?;
        let mut links: Vec<Link> = rows
            .iter()
            .filter_map(|row| {
                Some(Link {
                    seq: row.bigint("seq")?,
                    record: row.text("record")?.to_owned(),
                    prev_hash: row.text("prev_hash")?.to_owned(),
                    hash: row.text("hash")?.to_owned(),
                    write_id: row.uuid("write_id"),
                })
            })
            // A consistent snapshot: the chain as of the head read, nothing appended after.
            .filter(|link| link.seq < next_seq)
            .collect();
        if let Some(pending) = &head.pending
            && pending.seq >= floor
            && !links.iter().any(|link| link.seq == pending.seq)
        {
            // The repair rule, reader side: its writer died before inserting it.
            self.insert_link(op, run, pending).await?;
            links.push(pending.clone());
        }
        links.sort_by_key(|link| link.seq);
        let entries = links
            .into_iter()
            .map(|link| {
                Ok(AuditEntry {
                    record: decode::<AuditRecord>("audit record", run, &link.record)?,
                    prev_hash: link.prev_hash,
                    hash: link.hash,
                })
            })
            .collect::<Result<Vec<_>, LedgerError>>()?;
        Ok(AuditTrail {
            checkpoint: head.checkpoint.map(|(count, last_hash, at)| Checkpoint {
                run_id: run_id.clone(),
                last_hash,
                count: u64::try_from(count).unwrap_or(0),
                purged_at: Timestamp::from_millis(at),
            }),
            entries,
        })
    }

    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
    ) -> Result<PurgeReport, LedgerError> {
        sluice_faults::point!("ledger.purge.pre");
        let report = self.purge_runs(older_than, max_runs, actor, now).await;
        sluice_faults::point!("ledger.purge.post");
        report
    }

    fn quarantined(&self) -> u64 {
        self.inner.quarantine.count()
    }

    fn round_trips(&self) -> Vec<sluice_ledger::RoundTrips> {
        self.stats()
            .ops
            .into_iter()
            .flat_map(|(op, counts)| {
                [
                    ("lwt", counts.lwt, counts.lwt_us),
                    ("serial", counts.serial, counts.serial_us),
                    ("plain", counts.plain, counts.plain_us),
                ]
                .map(|(kind, count, waited_us)| sluice_ledger::RoundTrips {
                    op,
                    kind,
                    count,
                    waited_us,
                })
            })
            .collect()
    }
}

impl CqlLedger {
    /// Appends a run-level record; with `close`, the same LWT closes the run.
    async fn append_run_record(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
        close: bool,
    ) -> Result<AuditEntry, LedgerError> {
        let op = Op::AuditAppend;
        self.inner.stats.call(op);
        let record = PreparedRecord::new(run_id, draft, at);
        let run = run_id.as_str();
        for attempt in 0..self.inner.config.max_attempts {
            let head = self.read_head(op, run, false).await?;
            let created_at = head.run_created_at.unwrap_or_else(|| at.as_millis());
            let register =
                (head.run_created_at.is_none() && run != SYSTEM_RUN).then_some(created_at);
            self.before_lwt(op, run, Some(&head), None, register)
                .await?;
            let mut chain = head.chain.clone();
            let sealed = record.seal_link(&mut chain);
            let write_id = Uuid::new_v4();
            let values = AppendValues {
                next_seq: seq_i64(chain.next_seq),
                head: &sealed.hash,
                pending: &sealed.canonical,
                pending_prev: &sealed.prev_hash,
                audit_write_id: write_id,
                updated_at: at.as_millis(),
                new_run_created_at: created_at,
                closed_at: MaybeUnset::from_option(close.then(|| at.as_millis())),
                run_id: run,
                seq: head.stored_seq,
                run_created_at: head.run_created_at,
            };
            let applied = match self
                .lwt(op, "audit append", &self.inner.st.append, values)
                .await?
            {
                Lwt::Applied => true,
                Lwt::NotApplied(_) => {
                    self.inner.stats.retry(op);
                    back_off(attempt).await;
                    false
                }
                Lwt::Unknown => {
                    self.settle_audited(op, run, write_id, seq_i64(sealed.seq))
                        .await?
                }
            };
            if applied {
                let mut after =
                    head.after(chain, &sealed, write_id, Some(created_at), at.as_millis());
                after.closed |= close;
                self.remember_head(run, &after);
                self.insert_own(op, run, &sealed, write_id).await;
                return Ok(record.entry(&sealed));
            }
        }
        Err(self.too_contended(op, run))
    }
}
