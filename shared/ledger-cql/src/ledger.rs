//! [`CqlLedger`]: the [`Ledger`] port on ScyllaDB / Cassandra.
//!
//! Every write that the contract makes atomic is one lightweight transaction (LWT) on one run's
//! partition of `commands`: the command row, the run's audit head in static columns, and the
//! new audit record as a row of the same partition (a conditional batch; schema 007). The write
//! protocol of an audited write is:
//!
//! 1. read the row and the head (plain, QUORUM), unless this process knows them (below);
//! 2. before the LWT, write what must exist if it applies, as one UNLOGGED BATCH: the due entry
//!    for a new due time, the run's `runs` entry for a new run, and a record a build before
//!    schema 007 left pending in the head (`audit_pending`), unless this process already knows
//!    it is in `audit`;
//! 3. the LWT, guarded by status and epoch (the contract's guard), the row's `write_id` and
//!    the head (`audit_seq`, `audit_head`): it stores the state, moves the head and writes the
//!    new record's row (`a-<seq>`), all or nothing;
//! 4. the delete of the due entry the write moved the command off, if any (best effort).
//!
//! **What a process knows.** The head and row this process last read or wrote (`Known`) stand
//! in for step 1 when they match the guard. The LWT's condition holds all that the write took
//! from them, so a stale entry only makes the LWT not apply; the run is then read before every
//! write, as without the cache (at most one LWT lost per run and process, see `Known`).
//!
//! **Runs written before schema 007.** Their records are in `audit`, the last one possibly only
//! in `audit_pending` (its writer died before inserting it): a reader (`audit_read`) and the
//! next writer insert it when `audit` lacks it; the insert is idempotent. The next LWT clears
//! `audit_pending`.
//!
//! **Unknown outcomes.** An LWT that times out (or loses its connection) may or may not have
//! applied. It is settled by a SERIAL read: an audited LWT's `write_id` is on its record's row,
//! which nothing else writes, and a write that is not audited leaves its `write_id` on the
//! command's row. Only then is it reported as applied or retried; never "not applied" on a
//! guess.
//!
//! `trips` makes and counts the round trips, `rows` reads heads and rows, `known` is the cache
//! of them, `reserve` and `write` are the two kinds of guarded write, `links` the audit records'
//! own rows, `sweep` the due index walk, `runs` the runs index and the purge, `claims` the
//! business keys and their fenced takeovers, `shards` the sweep-shard leases.

mod budgets;
mod claims;
mod evidence;
mod flow;
mod known;
mod links;
#[cfg(test)]
mod pause;
mod reserve;
mod rows;
mod runs;
mod shards;
mod sweep;
#[cfg(test)]
mod tests;
mod trips;
mod webhooks;
mod write;

use sluice_ledger::{AuditStore, CommandStore, ShardStore};
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
    AuditTrail, Cas, Claim, Closing, DueItem, Guard, Ledger, LedgerError, Member, PurgeReport,
    Reserved, RunCursor, RunSummary, SYSTEM_RUN, ShardCas, ShardLease, SweepView, Transition,
    cap_result,
};

use crate::CqlError;
use crate::codec::{
    Fields, Identity, bad, day_of, decode, encode, link_key, link_seq, minute_of, rows_of, shard_of,
};
use crate::config::CqlConfig;
use crate::schema::{migrate_with, read_meta};
use crate::statements::Statements;
use crate::stats::{CqlStats, Kind, Op, StatsSnapshot};
use claims::Claimed;
use known::{Known, KnownRow, Stale};
use rows::{Basis, Head, StoredRow};
use trips::{Lwt, back_off};
use write::classify;

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

#[derive(scylla::SerializeRow)]
struct AppendValues<'a> {
    next_seq: i64,
    head: &'a str,
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
        } else {
            crate::schema::check(&session, &config.keyspace).await?;
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
}

#[async_trait]
impl CommandStore for CqlLedger {
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
        // A budget hold that starts counting moves before the write, one that stops after it:
        // a crash in between leaves more counted, never less (`budgets`).
        let change =
            sluice_core::budget::hold_change(transition.guard.status, transition.next.status);
        let (run, key) = (transition.run_id.clone(), transition.command_key.clone());
        let counts_more = matches!(
            change,
            sluice_core::budget::HoldChange::Activate | sluice_core::budget::HoldChange::Reclaim
        );
        if counts_more {
            self.follow_budget(run.as_str(), key.as_str(), change)
                .await?;
        }
        let cas = self.write(op, transition).await;
        sluice_faults::point!("ledger.transition.post");
        if !counts_more
            && matches!(&cas, Ok(cas) if cas.is_applied())
            && let Err(e) = self.follow_budget(run.as_str(), key.as_str(), change).await
        {
            // The hold stays counted: more than was spent, never less, until the command's
            // next release finds it.
            tracing::warn!(run_id = %run, command_key = %key, error = %e, "budget hold not released");
        }
        cas
    }

    fn basis(&self, run_id: &RunId, command_key: &CommandKey) -> Option<String> {
        self.basis_of(run_id.as_str(), command_key.as_str())
    }

    fn adopt(&self, copy: &Command, basis: &str) -> bool {
        self.adopt_basis(copy, basis)
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
            .paged(
                op,
                "list run",
                &self.inner.st.read_commands,
                (run,),
                Kind::Plain,
            )
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

    async fn close_run(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<Closing, LedgerError> {
        sluice_faults::point!("ledger.close_run.pre");
        let closing = self.append_run_record(run_id, draft, at, true).await;
        sluice_faults::point!("ledger.close_run.post");
        Ok(match closing? {
            Some(entry) => Closing::Closed(Box::new(entry)),
            None => Closing::AlreadyClosed,
        })
    }

    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<PurgeReport, LedgerError> {
        sluice_faults::point!("ledger.purge.pre");
        let report = self
            .purge_runs(older_than, max_runs, actor, now, dry_run)
            .await;
        sluice_faults::point!("ledger.purge.post");
        report
    }
}

#[async_trait]
impl AuditStore for CqlLedger {
    async fn audit_append(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        sluice_faults::point!("ledger.audit_append.pre");
        let entry = self.append_run_record(run_id, draft, at, false).await;
        sluice_faults::point!("ledger.audit_append.post");
        entry?.ok_or_else(|| self.too_contended(Op::AuditAppend, run_id.as_str()))
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
        // Records of builds before schema 007 are in `audit`; later ones in the partition.
        let (legacy, own) = futures::try_join!(
            self.paged(
                op,
                "read audit",
                &self.inner.st.read_audit,
                (run, floor),
                Kind::Plain,
            ),
            self.read_links(op, run, floor),
        )?;
        let mut links: Vec<Link> = legacy
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
            .chain(own)
            // A consistent snapshot: the chain as of the head read, nothing appended after.
            .filter(|link| link.seq < next_seq)
            .collect();
        links.sort_by_key(|link| link.seq);
        links.dedup_by_key(|link| link.seq);
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
}

#[async_trait]
impl ShardStore for CqlLedger {
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
}

#[async_trait]
impl sluice_ledger::FlowStore for CqlLedger {
    async fn flow_controls(&self) -> Result<Vec<sluice_core::flow::FlowControl>, LedgerError> {
        self.read_flow_controls().await
    }

    async fn write_flow_control(
        &self,
        guard: u64,
        next: sluice_core::flow::FlowControl,
    ) -> Result<sluice_ledger::FlowCas, LedgerError> {
        self.put_flow_control(guard, next).await
    }
}

#[async_trait]
impl sluice_ledger::WebhookStore for CqlLedger {
    async fn webhook_enqueue(
        &self,
        delivery: &sluice_core::webhook::Delivery,
    ) -> Result<bool, LedgerError> {
        self.put_webhook(delivery).await
    }

    async fn webhook_due(
        &self,
        webhook: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<sluice_core::webhook::Delivery>, LedgerError> {
        self.read_webhook_due(webhook, now, limit).await
    }

    async fn webhook_update(
        &self,
        next: &sluice_core::webhook::Delivery,
        expected: u64,
    ) -> Result<bool, LedgerError> {
        self.cas_webhook(next, expected).await
    }

    async fn webhook_list(
        &self,
        webhook: &str,
        limit: usize,
    ) -> Result<Vec<sluice_core::webhook::Delivery>, LedgerError> {
        self.read_webhook_list(webhook, limit).await
    }
}

impl CqlLedger {
    /// Appends a run-level record; with `close`, the same LWT closes the run, and a run found
    /// closed already is `None`, with nothing written.
    async fn append_run_record(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
        close: bool,
    ) -> Result<Option<AuditEntry>, LedgerError> {
        let op = Op::AuditAppend;
        self.inner.stats.call(op);
        let record = PreparedRecord::new(run_id, draft, at);
        let run = run_id.as_str();
        for attempt in 0..self.inner.config.max_attempts {
            let head = self.read_head(op, run, false).await?;
            // Closed once: the append below is conditioned on the head read here, so of closes
            // racing on an open run one applies and the others, retrying, find it closed.
            if close && head.closed {
                return Ok(None);
            }
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
                updated_at: at.as_millis(),
                new_run_created_at: created_at,
                closed_at: MaybeUnset::from_option(close.then(|| at.as_millis())),
                run_id: run,
                seq: head.stored_seq,
                run_created_at: head.run_created_at,
            };
            let link = Link::sealed(&sealed, write_id);
            let statement = &self.inner.st.append;
            let applied = match self
                .lwt_linked(op, "audit append", statement, values, run, &link)
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
                let mut after = head.after(chain, Some(created_at), at.as_millis());
                after.closed |= close;
                self.remember_head(run, &after);
                return Ok(Some(record.entry(&sealed)));
            }
        }
        Err(self.too_contended(op, run))
    }
}
