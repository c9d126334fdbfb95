//! The command record: one intended side effect, its identity and its mutable state.
//!
//! A command's identity (run, key, tool, arguments and their hash) is fixed at reservation and
//! never changes; everything that moves lives in [`CommandState`], which only the state machine
//! (`crate::machine`) computes and only a guarded ledger write stores.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{ArgsHash, BusinessKey, CommandKey, IdempotencyKey, LeaseEpoch, RunId, ToolName};
use crate::time::Timestamp;

/// What re-calling a tool does to the world, declared per tool in the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EffectSemantics {
    /// Re-calling with the same idempotency key is safe: on UNKNOWN, retry with the same key.
    Idempotent,
    /// Re-calling may commit twice: on UNKNOWN, reconcile from evidence, never retry blindly.
    NonIdempotent,
    /// A pure read: retry freely, never compensated.
    ObserveOnly,
}

impl EffectSemantics {
    pub const ALL: [Self; 3] = [Self::Idempotent, Self::NonIdempotent, Self::ObserveOnly];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idempotent => "IDEMPOTENT",
            Self::NonIdempotent => "NON_IDEMPOTENT",
            Self::ObserveOnly => "OBSERVE_ONLY",
        }
    }
}

impl fmt::Display for EffectSemantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every state of the state machine (docs/architecture.md, "State machine").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CommandStatus {
    Scheduled,
    Pending,
    Blocked,
    Approved,
    Leased,
    Confirmed,
    Failed,
    Unknown,
    Stuck,
    Cancelled,
    Compensating,
    Compensated,
    CompensationFailed,
    NoCompensation,
}

impl CommandStatus {
    pub const ALL: [Self; 14] = [
        Self::Scheduled,
        Self::Pending,
        Self::Blocked,
        Self::Approved,
        Self::Leased,
        Self::Confirmed,
        Self::Failed,
        Self::Unknown,
        Self::Stuck,
        Self::Cancelled,
        Self::Compensating,
        Self::Compensated,
        Self::CompensationFailed,
        Self::NoCompensation,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Scheduled => "SCHEDULED",
            Self::Pending => "PENDING",
            Self::Blocked => "BLOCKED",
            Self::Approved => "APPROVED",
            Self::Leased => "LEASED",
            Self::Confirmed => "CONFIRMED",
            Self::Failed => "FAILED",
            Self::Unknown => "UNKNOWN",
            Self::Stuck => "STUCK",
            Self::Cancelled => "CANCELLED",
            Self::Compensating => "COMPENSATING",
            Self::Compensated => "COMPENSATED",
            Self::CompensationFailed => "COMPENSATION_FAILED",
            Self::NoCompensation => "NO_COMPENSATION",
        }
    }

    /// Terminal: no automatic transition leaves it; only a recorded operator action may. (A
    /// CONFIRMED command may still owe a verification or a duplicate clean-up; those leave it
    /// CONFIRMED. A FAILED or CANCELLED one decided on `absent` evidence may still owe a
    /// verification: a commit found then is compensated or escalated, so it leaves.)
    pub fn is_terminal(self) -> bool {
        match self {
            Self::Confirmed
            | Self::Failed
            | Self::Cancelled
            | Self::Compensated
            | Self::CompensationFailed
            | Self::NoCompensation => true,
            Self::Scheduled
            | Self::Pending
            | Self::Blocked
            | Self::Approved
            | Self::Leased
            | Self::Unknown
            | Self::Stuck
            | Self::Compensating => false,
        }
    }

    /// Settled from the pipeline's point of view: terminal, or parked for a person (STUCK,
    /// BLOCKED). A run whose commands are all settled has nothing in flight.
    pub fn is_settled(self) -> bool {
        self.is_terminal() || matches!(self, Self::Stuck | Self::Blocked)
    }
}

impl fmt::Display for CommandStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CommandStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownStatus(s.chars().take(64).collect()))
    }
}

/// A status name that is not one of [`CommandStatus::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown command status {0:?}; expected one of SCHEDULED, PENDING, BLOCKED, APPROVED, LEASED, CONFIRMED, FAILED, UNKNOWN, STUCK, CANCELLED, COMPENSATING, COMPENSATED, COMPENSATION_FAILED, NO_COMPENSATION"
)]
pub struct UnknownStatus(pub String);

/// What a status check found upstream for an effect whose outcome was ambiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observation {
    /// The effect committed once.
    Present,
    /// The effect did not commit.
    Absent,
    /// The effect committed more than once.
    Duplicate,
    /// The upstream could not say.
    Inconclusive,
}

impl Observation {
    pub const ALL: [Self; 4] = [
        Self::Present,
        Self::Absent,
        Self::Duplicate,
        Self::Inconclusive,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Present => "present",
            Self::Absent => "absent",
            Self::Duplicate => "duplicate",
            Self::Inconclusive => "inconclusive",
        }
    }
}

impl fmt::Display for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who holds the command's lease, and until when. The epoch survives release: it only grows.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Lease {
    pub epoch: LeaseEpoch,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Arc<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

/// A person's decision on a BLOCKED command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    pub approver: String,
    pub reason: String,
    pub at: Timestamp,
    /// The policy version the approval was given under; a newer policy may block again.
    pub policy_version: String,
}

/// A person's refusal of a BLOCKED command: what the agent is told when its effect ends
/// CANCELLED this way (the `Prefer: wait` answer, the SDKs' exceptions, the MCP result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    /// Who rejected it (their token's name).
    pub by: String,
    /// Why, as they wrote it.
    pub reason: String,
    pub at: Timestamp,
}

/// Progress of a compensation (run rollback or clean-up of a duplicate commit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompensationInfo {
    pub started_at: Timestamp,
    /// Taken after the compensate handler returned, never before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default)]
    pub attempts: u32,
}

impl CompensationInfo {
    /// A compensation that starts `at`: no attempt made yet.
    pub fn started(at: Timestamp) -> Self {
        Self {
            started_at: at,
            ended_at: None,
            reference: None,
            detail: None,
            attempts: 0,
        }
    }
}

/// Everything about a command that changes over its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandState {
    pub status: CommandStatus,
    #[serde(default)]
    pub lease: Lease,
    /// Dispatch attempts in the current cycle (a replay starts a new cycle).
    #[serde(default)]
    pub attempts: u32,
    /// Status checks made while UNKNOWN in the current cycle.
    #[serde(default)]
    pub checks: u32,
    /// Operator replays so far.
    #[serde(default)]
    pub replays: u32,
    /// When the command next needs attention from a sweep (scheduled time, lease expiry,
    /// next status check, stale PENDING); `None` when nothing is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// First `absent` observation of the current UNKNOWN episode (NON_IDEMPOTENT settle rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_absent_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_ref: Option<String>,
    /// The tool's output, size-capped by the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Arc<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Needs a person: STUCK, NO_COMPENSATION, a failed compensation, an uncompensated duplicate.
    #[serde(default)]
    pub escalated: bool,
    // Boxed, as both are rare: a command is moved and copied at every hop, and inline they
    // made up a third of its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Box<Approval>>,
    /// Set when a person rejected the command (it is then CANCELLED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Box<Rejection>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Box<CompensationInfo>>,
    /// The approvers' edits of the arguments, oldest first (`crate::revision`): the command
    /// is dispatched with the last one's. Empty for a command never edited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<crate::revision::Revision>,
    /// Extra commits of this command that a status check found and that are still to be
    /// compensated. Kept in the ledger (with a due time) so the clean-up survives a crash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owed_duplicates: Vec<String>,
    /// The command is to be looked up once more when it falls due: a CONFIRMED one for a
    /// duplicate (`verify_after_commit`, or a NON_IDEMPOTENT command that went through UNKNOWN
    /// or was redispatched), a FAILED or CANCELLED one decided on `absent` evidence for a
    /// commit that landed after all (see `crate::machine`, "late commits").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_pending: bool,
    /// While UNKNOWN: the latest time the last attempt could still commit upstream (the call's
    /// end, plus the tool's `late_commit_ms`, plus the clock-skew bound). An `absent` seen
    /// before it proves nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lands_by: Option<Timestamp>,
    /// PENDING again after an ambiguous attempt of a tool retried with the same key: the
    /// earlier attempt may have committed, so the command is not "not started" (a cancel is
    /// refused, a rollback waits for the outcome).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outcome_unknown: bool,
    /// The run was rolled back while this command was in flight: the epoch of the lease (or
    /// look) the rollback found. Its holder may still write the outcome; a commit is then
    /// compensated instead of confirmed, and nothing is dispatched afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_pending: Option<LeaseEpoch>,
    /// An attempt of this command once had an unknown outcome (it went through UNKNOWN): a
    /// NON_IDEMPOTENT commit of it is looked up once more, for an earlier attempt that lands
    /// late. Never cleared, a replay included.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ambiguous_before: bool,
    /// When the command's idempotency key first went out (an attempt that was sent, whatever
    /// its answer): an upstream that forgets keys (`idempotency_key_ttl_ms`) may commit a
    /// resend of it past that window as a new effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sent_at: Option<Timestamp>,
    /// A compensation job (the undo, or an extra commit's clean-up) holds the command until
    /// then: no other job starts its calls meanwhile (`machine::job_claimed`). Set with the
    /// job's claim, cleared when its result is written; a job that died lets it lapse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_until: Option<Timestamp>,
    /// UNKNOWN because an asynchronous tool accepted the call (`DispatchOutcome::Accepted`):
    /// its callback or webhook is awaited until this deadline, when it is looked up or
    /// escalated as the tool declares (`machine::look_for`). Cleared when it leaves UNKNOWN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting_callback: Option<Timestamp>,
    /// How long the command has waited in this cycle on answers that asked for a later call
    /// (`Retry-After` on a 429 or 503, or a 403): the tool's `max_rate_limited_ms` bounds it,
    /// across attempts and looks, and past it such answers count as they did without the
    /// header (`machine::rate_limit`). A replay starts it again.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rate_limited_ms: i64,
    /// PENDING after such an answer: not dispatched before this time (the upstream's
    /// `Retry-After`, capped by what is left of the ceiling), whoever asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limited_until: Option<Timestamp>,
    /// Held for a slot of its upstream's rate (`Event::Hold`, `crate::flow`): the slot was
    /// booked then, so at or after it the command goes without booking another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_slot: Option<Timestamp>,
    /// How many clean-ups of the extra commits owed (`owed_duplicates`) failed transiently so
    /// far: the next is tried at the due time the last failure set, and past the tool's
    /// `max_attempts` the clean-up goes to a person. Zero once it ended.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub duplicate_attempts: u32,
    pub updated_at: Timestamp,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

fn is_zero(ms: &i64) -> bool {
    *ms == 0
}

impl CommandState {
    /// Settled (terminal, STUCK or BLOCKED) and owed nothing more by the pipeline: no look,
    /// clean-up or compensation is still to come. (A BLOCKED command's due time is its
    /// approval timeout: it waits for a person, not for the pipeline.)
    pub fn at_rest(&self) -> bool {
        self.status.is_settled() && (self.due_at.is_none() || self.status == CommandStatus::Blocked)
    }

    /// The state of a freshly reserved command.
    pub fn reserved(now: Timestamp, not_before: Option<Timestamp>, stale_after_ms: i64) -> Self {
        let (status, due_at) = match not_before {
            Some(at) if at > now => (CommandStatus::Scheduled, at),
            Some(_) | None => (CommandStatus::Pending, now.plus_millis(stale_after_ms)),
        };
        Self {
            status,
            lease: Lease::default(),
            attempts: 0,
            checks: 0,
            replays: 0,
            due_at: Some(due_at),
            first_absent_at: None,
            external_ref: None,
            result: None,
            last_error: None,
            escalated: false,
            approval: None,
            rejection: None,
            compensation: None,
            revisions: Vec::new(),
            owed_duplicates: Vec::new(),
            verify_pending: false,
            lands_by: None,
            outcome_unknown: false,
            rollback_pending: None,
            ambiguous_before: false,
            key_sent_at: None,
            claimed_until: None,
            awaiting_callback: None,
            rate_limited_ms: 0,
            rate_limited_until: None,
            flow_slot: None,
            duplicate_attempts: 0,
            updated_at: now,
        }
    }
}

/// A durable record of one intended side effect.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub run_id: RunId,
    pub command_key: CommandKey,
    pub idempotency_key: IdempotencyKey,
    pub tool: ToolName,
    pub semantics: EffectSemantics,
    /// The arguments as submitted: part of the identity, never changed. Shared, not copied,
    /// by the command's clones (a command is cloned at every hop of the pipeline). An
    /// approver's edit is a revision in the state: read [`Command::current_args`] for what is
    /// dispatched.
    pub args: Arc<Value>,
    /// The submitted arguments' canonical hash (the identity a re-submission is matched on).
    pub args_hash: ArgsHash,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub business_key: Option<BusinessKey>,
    /// The catalog's policy version when the command was reserved.
    pub policy_version: Arc<str>,
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
    pub created_at: Timestamp,
    /// The principal (token name) that submitted the command; an agent may read only the runs
    /// it submitted. `None` for commands recorded without authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<Arc<str>>,
    /// The tenant whose effects this one counts against (`crate::tenant`): the submitter, or a
    /// tenant it was allowed to name. Part of the identity; read [`Command::tenant`], which
    /// answers for commands recorded before tenants existed too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Arc<str>>,
    /// The W3C trace context of the submission (the producer's span of it), stored with the
    /// identity so every later step of the effect joins the same trace. Not part of the
    /// command's JSON (the API's answers and lifecycle payloads): the ledgers store it in the
    /// identity, and bus messages carry it in headers.
    #[serde(skip)]
    pub trace: Option<crate::trace::TraceContext>,
    #[serde(flatten)]
    pub state: CommandState,
}

/// What an agent asked for, before it becomes a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub run_id: RunId,
    pub command_key: CommandKey,
    pub semantics: EffectSemantics,
    pub args: Value,
    pub business_key: Option<BusinessKey>,
    pub policy_version: String,
    pub max_attempts: u32,
    pub not_before: Option<Timestamp>,
}

impl Command {
    /// The command recorded for `intent` at `now`: keys derived from the journal position,
    /// the arguments' canonical hash beside them, SCHEDULED or PENDING by `not_before`.
    pub fn from_intent(intent: Intent, now: Timestamp, pending_stale_ms: i64) -> Self {
        let idempotency_key =
            IdempotencyKey::new(intent.run_id.clone(), intent.command_key.clone());
        Self {
            tool: intent.command_key.tool().clone(),
            args_hash: crate::canonical::args_hash(&intent.args),
            state: CommandState::reserved(now, intent.not_before, pending_stale_ms),
            run_id: intent.run_id,
            command_key: intent.command_key,
            idempotency_key,
            semantics: intent.semantics,
            args: Arc::new(intent.args),
            business_key: intent.business_key,
            policy_version: Arc::from(intent.policy_version),
            max_attempts: intent.max_attempts,
            not_before: intent.not_before,
            created_at: now,
            submitted_by: None,
            tenant: Some(Arc::from(crate::tenant::ANONYMOUS)),
            trace: None,
        }
    }

    /// The same command, recorded as submitted by `principal`, and as its tenant unless
    /// another tenant was named ([`Command::for_tenant`]).
    #[must_use]
    pub fn submitted_by(mut self, principal: impl Into<Arc<str>>) -> Self {
        let principal = principal.into();
        if self
            .tenant
            .as_deref()
            .is_none_or(|tenant| tenant == crate::tenant::ANONYMOUS)
        {
            self.tenant = Some(Arc::clone(&principal));
        }
        self.submitted_by = Some(principal);
        self
    }

    /// The same command, recorded for `tenant` (see [`Command::tenant`]).
    #[must_use]
    pub fn for_tenant(mut self, tenant: impl Into<Arc<str>>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The tenant the command counts against: the one stored with it, else (a command recorded
    /// before tenants existed, read from JSON that has none) its submitter, else
    /// [`crate::tenant::ANONYMOUS`] (recorded without authentication). Every command made by
    /// [`Command::from_intent`] or read from a ledger has one stored.
    pub fn tenant(&self) -> &str {
        self.tenant
            .as_deref()
            .or(self.submitted_by.as_deref())
            .unwrap_or(crate::tenant::ANONYMOUS)
    }

    /// The same command, carrying `trace` (see [`Command::trace`]).
    #[must_use]
    pub fn traced(mut self, trace: Option<crate::trace::TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    /// The first audit record of the command: its reservation (and the lease it took with it,
    /// see [`crate::machine::lease_at_reservation`]).
    pub fn reservation_audit(&self, actor: &str) -> crate::audit::AuditDraft {
        let reason = match self.state.status {
            CommandStatus::Leased => format!(
                "reserved and leased for dispatch, attempt {} of {}",
                self.state.attempts, self.max_attempts
            ),
            _ => "reserved".to_owned(),
        };
        crate::audit::AuditDraft::transition(
            &self.command_key,
            None,
            self.state.status,
            actor,
            reason,
        )
        .with_evidence(serde_json::json!({ "args_hash": self.args_hash }))
    }

    /// The same command, leased by its reservation where [`crate::machine::lease_at_reservation`]
    /// allows it; unchanged otherwise.
    #[must_use]
    pub fn leased_at_reservation(
        mut self,
        rules: &crate::machine::Rules,
        policy: &crate::policy::PolicyDecision,
        now: Timestamp,
    ) -> Self {
        if let Some(state) = crate::machine::lease_at_reservation(&self.state, rules, policy, now) {
            self.state = state;
        }
        self
    }

    pub fn status(&self) -> CommandStatus {
        self.state.status
    }

    /// The arguments the command is dispatched with: the latest revision's, or the submitted
    /// ones (`crate::revision`).
    pub fn current_args(&self) -> &Arc<Value> {
        self.state
            .revisions
            .last()
            .map_or(&self.args, |revision| &revision.args)
    }

    /// The hash of [`Command::current_args`]: what an approval link is bound to, and what an
    /// edit replaces.
    pub fn current_args_hash(&self) -> &ArgsHash {
        self.state
            .revisions
            .last()
            .map_or(&self.args_hash, |revision| &revision.args_hash)
    }

    /// Whether a submission with arguments hashing to `hash` is this command's: the submitted
    /// arguments, or those of any of its revisions (an agent re-driving after an edit gets the
    /// edited command's answer, not a conflict).
    pub fn answers_to(&self, hash: &str) -> bool {
        self.args_hash.as_str() == hash
            || self
                .state
                .revisions
                .iter()
                .any(|revision| revision.args_hash.as_str() == hash)
    }

    /// Waiting for a dispatcher: PENDING, APPROVED, or leased by its reservation and not yet
    /// settled (see [`crate::machine::lease_at_reservation`]).
    pub fn awaits_dispatch(&self) -> bool {
        match self.state.status {
            CommandStatus::Pending | CommandStatus::Approved => true,
            CommandStatus::Leased => {
                self.state.lease.owner.as_deref() == Some(crate::machine::RESERVATION_OWNER)
            }
            CommandStatus::Scheduled
            | CommandStatus::Blocked
            | CommandStatus::Confirmed
            | CommandStatus::Failed
            | CommandStatus::Unknown
            | CommandStatus::Stuck
            | CommandStatus::Cancelled
            | CommandStatus::Compensating
            | CommandStatus::Compensated
            | CommandStatus::CompensationFailed
            | CommandStatus::NoCompensation => false,
        }
    }

    pub fn epoch(&self) -> LeaseEpoch {
        self.state.lease.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_through_their_names() {
        for status in CommandStatus::ALL {
            assert_eq!(status.as_str().parse::<CommandStatus>(), Ok(status));
            let json = serde_json::to_string(&status).expect("serializes");
            assert_eq!(json, format!("\"{}\"", status.as_str()));
        }
        assert!("DONE".parse::<CommandStatus>().is_err());
    }

    #[test]
    fn a_future_not_before_schedules_the_command() {
        let now = Timestamp::from_millis(10_000);
        let later = Timestamp::from_millis(20_000);
        let scheduled = CommandState::reserved(now, Some(later), 5_000);
        assert_eq!(scheduled.status, CommandStatus::Scheduled);
        assert_eq!(scheduled.due_at, Some(later));
        let pending = CommandState::reserved(now, Some(now), 5_000);
        assert_eq!(pending.status, CommandStatus::Pending);
        assert_eq!(pending.due_at, Some(Timestamp::from_millis(15_000)));
    }
}
