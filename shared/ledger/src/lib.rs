//! The command ledger: the source of truth for every command, its lease and its audit chain.
//!
//! * [`Ledger`] — the port: compare-and-set operations that every service uses.
//! * [`sqlite`] — the embedded implementation (WAL, one writer thread, group commit).
//! * `contract` — the one contract suite every implementation must pass, races included;
//!   compiled for tests only (the `contract` feature, which the implementations' and the
//!   workspace's tests turn on as a dev-dependency).
//! * [`quarantine`] — commands that cannot be decoded, set aside so they stop nobody else.
//! * [`stored`] — how a stored command is read back: what a newer build added is tolerated, a
//!   status only a newer build knows is left to it.
//! * [`shards`] — the sweep-shard leases by which reconcilers split the due index.
//! * [`budget`] — spend budgets' holds, checked and written atomically, released with the
//!   command's status.
//! * [`WebhookStore`] — webhook deliveries waiting for, or answered by, their receivers.
//! * [`EvidenceStore`] — evidence received by webhook, once per source and event id.
//!
//! # The contract
//!
//! Every write is a compare-and-set on one run's partition: a reservation is "insert if absent",
//! a transition applies only if the stored status and lease epoch are still the ones the caller
//! read (its [`Guard`]). Nothing in the contract needs a transaction across runs, so a ScyllaDB
//! implementation can map each operation onto lightweight transactions on one partition.
//!
//! The state a transition writes is computed by the pure state machine in `sluice_core`; the
//! ledger stores it and appends the audit record in the same atomic step, so the chain holds
//! one record for every transition that applied and none for one that did not.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use sluice_core::audit::{AuditDraft, AuditEntry, Checkpoint};
use sluice_core::command::{Command, CommandState, CommandStatus};
use sluice_core::ids::{BusinessKey, CommandKey, LeaseEpoch, RunId, ToolName};
use sluice_core::machine::Step;
use sluice_core::retention::Owed;
use sluice_core::time::Timestamp;
use sluice_core::webhook::Delivery;

pub mod budget;
#[cfg(any(test, feature = "contract"))]
pub mod contract;
mod error;
pub mod evidence;
pub mod flow;
pub mod identity;
pub mod latency;
pub mod quarantine;
pub mod shards;
pub mod sqlite;
pub mod stored;

pub use budget::{BudgetStore, Budgeted, Held, HoldMode, submission_tag};
pub use error::LedgerError;
pub use evidence::{EVIDENCE_RETENTION_MS, EvidenceStore};
pub use flow::{FlowCas, FlowStore};
pub use shards::{Member, ShardCas, ShardLease, SweepView};

/// Largest stored tool result, in bytes of JSON; larger results are replaced by a marker that
/// keeps a prefix, so an agent can still see what came back.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// The run id under which the ledger records its own actions, such as purges.
pub const SYSTEM_RUN: &str = "sluice.system";

/// What the caller last read of a command: a transition applies only if both still hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    pub status: CommandStatus,
    pub epoch: LeaseEpoch,
}

impl Guard {
    pub fn of(command: &Command) -> Self {
        Self {
            status: command.state.status,
            epoch: command.state.lease.epoch,
        }
    }
}

/// The outcome of a compare-and-set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cas {
    /// The write applied; this is the command as stored now.
    Applied(Command),
    /// The guard no longer held; this is the command as stored now (`None` if there is none).
    Conflict(Option<Command>),
}

impl Cas {
    pub fn applied(&self) -> Option<&Command> {
        match self {
            Self::Applied(command) => Some(command),
            Self::Conflict(_) => None,
        }
    }

    pub fn is_applied(&self) -> bool {
        matches!(self, Self::Applied(_))
    }

    /// The command as stored now, whichever way the write went.
    pub fn current(&self) -> Option<&Command> {
        match self {
            Self::Applied(command) => Some(command),
            Self::Conflict(current) => current.as_ref(),
        }
    }
}

/// A guarded write of a command's next state.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub run_id: RunId,
    pub command_key: CommandKey,
    pub guard: Guard,
    pub next: CommandState,
    /// The audit record; `None` only for writes that are not transitions (a lease extension,
    /// a sweep moving a stale command's due time).
    pub audit: Option<AuditDraft>,
}

impl Transition {
    /// The write that stores a state machine step, audited as `actor` (a quiet step, such as a
    /// claim or a lease extension, writes no audit record).
    pub fn from_step(command: &Command, step: &Step, actor: &str) -> Self {
        Self {
            run_id: command.run_id.clone(),
            command_key: command.command_key.clone(),
            guard: Guard::of(command),
            next: step.state.clone(),
            audit: step.audit(&command.command_key, actor),
        }
    }

    /// Checks the shape of the request; implementations call this before writing.
    pub fn validate(&self) -> Result<(), LedgerError> {
        let invalid = |why: &str| {
            Err(LedgerError::InvalidRequest {
                run_id: self.run_id.to_string(),
                command_key: self.command_key.to_string(),
                why: why.to_owned(),
            })
        };
        if self.next.lease.epoch < self.guard.epoch {
            return invalid("the lease epoch may not go back");
        }
        if self.audit.is_none() && self.next.status != self.guard.status {
            return invalid("a change of status must be audited");
        }
        if let Some(audit) = &self.audit
            && audit.to.is_some_and(|to| to != self.next.status)
        {
            return invalid("the audit record names another status than the one written");
        }
        Ok(())
    }
}

/// The answer to a reservation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reserved {
    /// A new command was recorded.
    Created(Command),
    /// The same key was reserved before with the same arguments: this is that command.
    Existing(Command),
    /// Another command already holds the tool's business key: this is that command, and no
    /// second intent was recorded.
    BusinessKeyHeld(Command),
}

impl Reserved {
    pub fn command(&self) -> &Command {
        match self {
            Self::Created(command) | Self::Existing(command) | Self::BusinessKeyHeld(command) => {
                command
            }
        }
    }

    pub fn into_command(self) -> Command {
        match self {
            Self::Created(command) | Self::Existing(command) | Self::BusinessKeyHeld(command) => {
                command
            }
        }
    }

    pub fn is_created(&self) -> bool {
        matches!(self, Self::Created(_))
    }
}

/// The answer to a business key claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is held by the claimant now (newly, or it already was).
    Claimed,
    /// Another command holds it.
    HeldBy {
        run_id: RunId,
        command_key: CommandKey,
    },
}

/// A command that needs a sweep's attention at or before `due_at`. Items may be stale by the
/// time they are read: the sweeper re-reads the command and acts through a guarded write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DueItem {
    pub run_id: RunId,
    pub command_key: CommandKey,
    pub status: CommandStatus,
    pub due_at: Timestamp,
}

/// A run's audit chain as stored: the checkpoint left by a purge, then the records after it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AuditTrail {
    pub checkpoint: Option<Checkpoint>,
    pub entries: Vec<AuditEntry>,
}

/// What [`CommandStore::close_run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closing {
    /// The run was open: its record was appended and the run closed, in one write.
    Closed(Box<AuditEntry>),
    /// The run was closed before (by an earlier close, or one racing this one): nothing was
    /// written.
    AlreadyClosed,
}

/// What a purge removed (or, for a dry run, would remove), and the runs it kept although they
/// looked finished.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PurgeReport {
    /// A dry run: the counts and checkpoints are what a purge would remove and leave now;
    /// nothing was removed or recorded.
    #[serde(default)]
    pub dry_run: bool,
    pub runs: u64,
    pub commands: u64,
    pub audit_records: u64,
    pub business_keys: u64,
    /// Spend budgets' holds of the purged commands removed from counters whose window has
    /// ended (`sluice_core::budget::ended_windows_start_by`); those of `total` budgets stay.
    #[serde(default)]
    pub budget_holds: u64,
    pub checkpoints: Vec<Checkpoint>,
    /// Runs whose commands are all terminal and unchanged since the cutoff, kept because one
    /// of them still owes work (`sluice_core::retention`): every such run the purge looked at.
    #[serde(default)]
    pub kept_runs: u64,
    /// The first [`KEPT_LISTED`] of those runs, each with a command that owes work and what.
    #[serde(default)]
    pub kept: Vec<KeptRun>,
}

/// How many kept runs a [`PurgeReport`] names; the rest are only counted.
pub const KEPT_LISTED: usize = 100;

/// A run a purge kept: one of its commands and the work it still owes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptRun {
    pub run_id: RunId,
    pub command_key: CommandKey,
    pub owed: Owed,
}

impl PurgeReport {
    /// Counts a run kept for `owed`, and names it while the list has room.
    pub fn keep(&mut self, run_id: RunId, command_key: CommandKey, owed: Owed) {
        self.kept_runs += 1;
        if self.kept.len() < KEPT_LISTED {
            self.kept.push(KeptRun {
                run_id,
                command_key,
                owed,
            });
        }
    }

    /// The evidence of the purge's record in the [`SYSTEM_RUN`] chain: what was removed, and
    /// how many runs were kept for owed work.
    pub fn evidence(&self, older_than: Timestamp) -> Value {
        serde_json::json!({
            "older_than": older_than,
            "runs": self.runs,
            "commands": self.commands,
            "audit_records": self.audit_records,
            "business_keys": self.business_keys,
            "checkpoints": self.checkpoints,
            "kept_runs": self.kept_runs,
        })
    }
}

/// Where a listing of runs stopped: the last run it gave. Runs are listed newest first, and
/// runs created in the same millisecond by descending id, so the pair orders every run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RunCursor {
    pub created_at: Timestamp,
    pub run_id: RunId,
}

impl RunCursor {
    /// Whether a run created at `created_at` lies past the cursor, on a page after its own.
    pub fn lies_past(&self, created_at: Timestamp, run_id: &RunId) -> bool {
        (created_at, run_id.as_str()) < (self.created_at, self.run_id.as_str())
    }
}

/// A run and where it stands, for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    pub run_id: RunId,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    /// Commands not yet in a terminal state.
    pub open_commands: u64,
    /// When a rollback closed the run ([`CommandStore::close_run`]); absent while it is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_at: Option<Timestamp>,
}

impl RunSummary {
    /// The cursor of a listing that stopped at this run.
    pub fn cursor(&self) -> RunCursor {
        RunCursor {
            created_at: self.created_at,
            run_id: self.run_id.clone(),
        }
    }
}

/// Commands and their runs: reservations, the guarded writes of the state machine, reads by
/// key and by run, business keys, closing and purging runs.
///
/// All writes are compare-and-set on one run; all reads are by key or through an index.
#[async_trait]
pub trait CommandStore: Send + Sync + std::fmt::Debug + 'static {
    /// Records a new command, atomically with its first audit record and, when it has one, the
    /// claim of its tool's business key. Insert-if-absent: a second reservation of the same key
    /// with the same argument hash returns the stored command; with a different hash it fails
    /// with [`LedgerError::ArgumentDrift`] and changes nothing.
    async fn reserve(&self, command: Command, audit: AuditDraft) -> Result<Reserved, LedgerError>;

    /// [`CommandStore::reserve`] for an agent that adds effects to its own runs only: when the run
    /// holds any command not submitted by `command.submitted_by` (a command submitted by no
    /// one counts as someone else's), nothing is written, not even a replay of the same key,
    /// and the answer is [`LedgerError::ForeignRun`]. The check and the write are one
    /// compare-and-set on the run, so two agents opening the same run at once, in one process
    /// or in two, cannot both get in. A new run costs no read for it.
    async fn reserve_own(
        &self,
        command: Command,
        audit: AuditDraft,
    ) -> Result<Reserved, LedgerError>;

    /// The generic guarded write: stores `next` and appends the audit record if the stored
    /// status and epoch equal the guard.
    async fn transition(&self, transition: Transition) -> Result<Cas, LedgerError>;

    /// Takes the lease: a transition from PENDING or APPROVED to LEASED (or from LEASED, taking
    /// over a reservation's lease that ran short, `sluice_core::machine::reservation_lease_lapsing`)
    /// whose epoch is exactly one more than the guard's. Of any number of racing callers with
    /// the same guard, exactly one is applied.
    async fn acquire_lease(&self, transition: Transition) -> Result<Cas, LedgerError> {
        let ok = matches!(
            transition.guard.status,
            CommandStatus::Pending | CommandStatus::Approved | CommandStatus::Leased
        ) && transition.next.status == CommandStatus::Leased
            && transition.next.lease.epoch == transition.guard.epoch.next()
            && transition.next.lease.expires_at.is_some();
        if !ok {
            return Err(misuse(
                &transition,
                "a lease goes from PENDING, APPROVED or LEASED to LEASED with the next epoch and an \
                 expiry",
            ));
        }
        // Around the guarded write, which passes `ledger.transition.*` inside.
        sluice_faults::point!("ledger.lease.pre");
        let cas = self.transition(transition).await;
        sluice_faults::point!("ledger.lease.post");
        cas
    }

    /// Writes the outcome of a dispatch, fenced by the lease epoch: applies only while the
    /// caller's epoch is still the current one.
    async fn finalize(&self, transition: Transition) -> Result<Cas, LedgerError> {
        let ok = transition.guard.status == CommandStatus::Leased
            && transition.next.lease.epoch == transition.guard.epoch
            && transition.next.status != CommandStatus::Leased
            && transition.audit.is_some();
        if !ok {
            return Err(misuse(
                &transition,
                "a finalize leaves LEASED under the same epoch, with an audit record",
            ));
        }
        // Around the guarded write, which passes `ledger.transition.*` inside.
        sluice_faults::point!("ledger.finalize.pre");
        let cas = self.transition(transition).await;
        sluice_faults::point!("ledger.finalize.post");
        cas
    }

    /// Reads one command.
    async fn get(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Option<Command>, LedgerError>;

    /// A run's commands in journal order (decision, then call index, then tool), optionally
    /// only those in `status`.
    async fn list_run(
        &self,
        run_id: &RunId,
        status: Option<CommandStatus>,
    ) -> Result<Vec<Command>, LedgerError>;

    /// Runs created at or after `since`, newest first (runs created in the same millisecond by
    /// descending id), at most `limit`; with `before`, only the runs after that one in this
    /// order, so that a listing can go on where its last page stopped and miss none. (Ordered by
    /// creation: an index on a time that changes with every write would cost every write.)
    async fn list_runs(
        &self,
        since: Timestamp,
        before: Option<&RunCursor>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, LedgerError>;

    /// Claims a tool's business key for a command; idempotent for the holder.
    async fn claim_business_key(
        &self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Claim, LedgerError>;

    /// Appends a run-level record (a rollback request) and, in the same write, closes the run:
    /// from then on [`CommandStore::reserve`] refuses new commands in it with
    /// [`LedgerError::RunClosed`]; a command already there still replays (or drifts) as before.
    /// A run is closed once: closing a closed run writes nothing and answers
    /// [`Closing::AlreadyClosed`], and of any number of closes racing on an open run exactly one
    /// appends its record (the check and the write are one compare-and-set on the run).
    async fn close_run(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<Closing, LedgerError>;

    /// Removes whole runs whose commands are all terminal and owe nothing more
    /// (`sluice_core::retention::purge_verdict`) and that have not changed since `older_than`,
    /// with their audit records and business keys, leaving a checkpoint per run and recording
    /// the purge in the [`SYSTEM_RUN`] chain. At most `max_runs` per call. A run whose commands
    /// are all terminal but one still owes work (a last look, a duplicate's clean-up) is left
    /// whole and reported in [`PurgeReport::kept`]. With `dry_run`, the same choice is made and
    /// reported (with the checkpoints a purge would leave) but nothing is written at all.
    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<PurgeReport, LedgerError>;

    /// A copy of a command waiting for dispatch ([`Command::awaits_dispatch`]: PENDING,
    /// APPROVED, or leased by its reservation) as this process last wrote it, if the ledger
    /// keeps one: a hint that saves the read before a lease or a call. It may be stale (another
    /// process may have moved the command since), so it is only fit to start a compare-and-set
    /// from, or to call an IDEMPOTENT tool under the reservation's lease (a stale copy costs a
    /// repeated call with the same key and an outcome write that does not apply); a decision
    /// *not* to write must be taken on [`CommandStore::get`].
    fn cached(&self, _run_id: &RunId, _command_key: &CommandKey) -> Option<Command> {
        None
    }

    /// What this ledger wrote a command from, as this process last wrote it, for another
    /// process of the same ledger to [`CommandStore::adopt`] with a copy of the command: an
    /// opaque text (the CQL ledger: the row's version and the run's head, which its next
    /// compare-and-set is conditioned on). `None` when it keeps no such thing.
    fn basis(&self, _run_id: &RunId, _command_key: &CommandKey) -> Option<String> {
        None
    }

    /// Takes `copy`, a command another process wrote with `basis` ([`CommandStore::basis`]),
    /// as though this process had written it: afterwards it is a [`CommandStore::cached`] hint
    /// here, with the same caveats (only fit to start a compare-and-set from; a stale one costs
    /// a compare-and-set that does not apply, then a read). Whether it was taken. The caller
    /// must have authenticated the copy: the ledger takes it as it is.
    fn adopt(&self, _copy: &Command, _basis: &str) -> bool {
        false
    }
}

/// The audit chains: records that are not a command's transition, and a run's chain read back.
/// (A transition's record is written by [`CommandStore::transition`], in the same write.)
#[async_trait]
pub trait AuditStore: Send + Sync + std::fmt::Debug + 'static {
    /// Appends a record that is not a command transition (a run rollback request, a
    /// compensation of an extra commit, an operator note).
    async fn audit_append(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError>;

    /// A run's chain: its checkpoint, if purged before, and the records after it in order.
    async fn audit_read(&self, run_id: &RunId) -> Result<AuditTrail, LedgerError>;
}

/// The due index and the reconcilers' shard leases: what is due when, and who sweeps which
/// shard of it.
#[async_trait]
pub trait ShardStore: Send + Sync + std::fmt::Debug + 'static {
    /// Commands due at or before `now`, earliest first, read through the due index (never a
    /// scan of all commands). A command that cannot be decoded is skipped (and quarantined,
    /// [`quarantine`]), never an error of the whole call: one damaged row must not stop the
    /// sweep of every other.
    ///
    /// An index may read each shard only past where this process's last call left off, and
    /// whole every so often: then a command whose index entry landed well after its due time
    /// (a writer that stalled, a clock behind) is returned by a later call, within a bound the
    /// implementation documents (the CQL ledger: 30 s). A command returned and still due at the
    /// same time is returned again by every call.
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<DueItem>, LedgerError> {
        let all: Vec<u32> = (0..self.due_shards()).collect();
        self.due_in(now, limit, &all).await
    }

    /// How many shards the due index has: a run's commands are filed under
    /// `sluice_core::sweep::shard_of(run_id, due_shards)`. Fixed for a ledger's life.
    fn due_shards(&self) -> u32;

    /// [`ShardStore::due`] over the listed shards only: what a reconciler holding their leases
    /// sweeps. Shards past [`ShardStore::due_shards`] hold nothing.
    async fn due_in(
        &self,
        now: Timestamp,
        limit: usize,
        shards: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError>;

    /// The shard leases of `group` for shards `0..shards`, and its announced members.
    async fn sweep_view(&self, group: &str, shards: u32) -> Result<SweepView, LedgerError>;

    /// Writes a shard lease if the stored epoch is `guard` (`None`: only if the shard was
    /// never leased). Of any number of racing writers with the same guard, exactly one is
    /// applied; the others get the lease as stored.
    async fn write_shard_lease(
        &self,
        group: &str,
        guard: Option<u64>,
        next: ShardLease,
    ) -> Result<ShardCas, LedgerError>;

    /// Announces (or, with an expiry in the past, withdraws) a member of `group`: a plain
    /// upsert, a hint to the split that holds no lease by itself.
    async fn announce(&self, group: &str, member: Member) -> Result<(), LedgerError>;
}

/// Webhook deliveries (`sluice_core::webhook`): one row per (webhook, event id), written before
/// the event's bus message is acknowledged and kept until its receiver answered or the
/// attempts ran out, then for [`WEBHOOK_RETENTION_MS`]. Every write but the first is a
/// compare-and-set on the version the writer read.
#[async_trait]
pub trait WebhookStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `delivery` unless one with its webhook and event id is stored already; whether
    /// it was stored. An event read twice off the bus is delivered once.
    async fn webhook_enqueue(&self, delivery: &Delivery) -> Result<bool, LedgerError>;

    /// Up to `limit` of `webhook`'s PENDING deliveries due at or before `now`, earliest first.
    async fn webhook_due(
        &self,
        webhook: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Delivery>, LedgerError>;

    /// Stores `next` if the stored delivery still has version `expected`; whether it did.
    async fn webhook_update(&self, next: &Delivery, expected: u64) -> Result<bool, LedgerError>;

    /// `webhook`'s deliveries still kept, newest first, at most `limit`.
    async fn webhook_list(&self, webhook: &str, limit: usize)
    -> Result<Vec<Delivery>, LedgerError>;
}

/// Approval links' uses (`sluice_core::approval_link`): one row per link id, written by the
/// link's first decision. The token itself is never stored: only its id, the command it was
/// for and when it was used.
#[async_trait]
pub trait LinkStore: Send + Sync + std::fmt::Debug + 'static {
    /// Records the use of link `link_id` on `run_id`/`command_key` at `at` unless it was used
    /// before; whether this call recorded it. Atomic across every producer sharing the ledger:
    /// of two uses racing, exactly one gets `true`.
    async fn link_consume(
        &self,
        link_id: &str,
        run_id: &RunId,
        command_key: &CommandKey,
        at: Timestamp,
    ) -> Result<bool, LedgerError>;
}

/// How long a delivered or failed delivery is kept, for `sluice webhooks list` and for an event
/// read again off the bus to be recognised: 7 days. A PENDING one is kept as long as it waits.
pub const WEBHOOK_RETENTION_MS: i64 = 7 * 24 * 3_600_000;

/// The command ledger port: the five stores of one ledger, and what it measures of itself.
///
/// A service holds an `Arc<dyn Ledger>`; code that needs only one store takes it by its trait
/// (`&dyn AuditStore`, …), so what each part of the pipeline may touch is in its signature.
pub trait Ledger:
    CommandStore
    + AuditStore
    + ShardStore
    + FlowStore
    + WebhookStore
    + BudgetStore
    + EvidenceStore
    + LinkStore
{
    /// Round trips to the store so far, by operation and kind, for the
    /// `sluice_ledger_round_trips_total` metric. Empty for a ledger that does not count them
    /// (the embedded ledger has no network round trips to count).
    fn round_trips(&self) -> Vec<RoundTrips> {
        Vec::new()
    }

    /// What a write takes now, in milliseconds, as this handle measured its own writes
    /// ([`latency::WriteLatency`]): leases are sized from it and producers refuse new work
    /// past a limit of it (`sluice_core::load`). 0 for a ledger that does not measure.
    fn write_latency_ms(&self) -> i64 {
        0
    }

    /// Commands this handle found it cannot decode and set aside since it opened, each counted
    /// once ([`quarantine`]), for the `sluice_ledger_quarantined_commands_total` metric.
    fn quarantined(&self) -> u64 {
        0
    }

    /// Commands of a status only a newer build knows that this handle met and left to it since
    /// it opened, each counted once ([`stored`]), for the `sluice_ledger_newer_commands_total`
    /// metric.
    fn left_for_newer(&self) -> u64 {
        0
    }

    /// The store as trace spans name it: OpenTelemetry's `db.system.name` (`sqlite`,
    /// `cassandra`) and `db.namespace` (the SQLite schema, the CQL keyspace), set on the spans
    /// of the pipeline's ledger writes.
    fn db_identity(&self) -> DbIdentity<'_> {
        DbIdentity {
            system: "other_sql",
            namespace: "",
        }
    }
}

/// What [`Ledger::db_identity`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbIdentity<'a> {
    pub system: &'static str,
    pub namespace: &'a str,
}

/// The table a command's writes go to, in both ledgers: the spans' `db.collection.name`.
pub const COMMANDS_TABLE: &str = "commands";

/// How many round trips of one kind one ledger operation has made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundTrips {
    /// The operation: `reserve`, `lease`, `finalize`, `transition`, `get`, …
    pub op: &'static str,
    /// `lwt` (a lightweight transaction, a Paxos round), `serial` (a SERIAL read settling an
    /// unknown outcome) or `plain`.
    pub kind: &'static str,
    pub count: u64,
    /// Microseconds spent waiting for those round trips' answers, in all.
    pub waited_us: u64,
}

fn misuse(transition: &Transition, why: &str) -> LedgerError {
    LedgerError::InvalidRequest {
        run_id: transition.run_id.to_string(),
        command_key: transition.command_key.to_string(),
        why: why.to_owned(),
    }
}

/// Caps a tool result at [`MAX_RESULT_BYTES`] of JSON, keeping a prefix of its text.
pub fn cap_result(result: Option<Arc<Value>>) -> Option<Arc<Value>> {
    let value = result?;
    // Measured without building the text: most results are far under the cap.
    let mut size = JsonSize(0);
    if serde_json::to_writer(&mut size, &*value).is_ok() && size.0 <= MAX_RESULT_BYTES {
        return Some(value);
    }
    let text = value.to_string();
    let mut end = MAX_RESULT_BYTES / 2;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(Arc::new(serde_json::json!({
        "truncated": true,
        "bytes": text.len(),
        "prefix": &text[..end],
    })))
}

/// Counts the bytes written to it.
struct JsonSize(usize);

impl std::io::Write for JsonSize {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0 += bytes.len();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
