//! What the state machine is told ([`Event`], with the outcomes a service reports), what it
//! answers ([`Step`] and the [`Action`]s a service must carry out) and why it refuses
//! ([`Refusal`]).

use super::*;

/// A person's action: who did it and why. The reason is mandatory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operator {
    pub actor: String,
    pub reason: String,
}

/// What the upstream did with a dispatch, as the connector classified it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum DispatchOutcome {
    /// 2xx: the effect committed.
    Committed {
        external_ref: Option<String>,
        result: Option<std::sync::Arc<Value>>,
    },
    /// A definitive refusal (4xx other than 408/425/429): the effect did not happen.
    Refused { reason: String },
    /// Timeout, reset after send, 408/425/429, 5xx: the effect may or may not have happened.
    Ambiguous { reason: String },
    /// Failed before anything left the process (connection refused, DNS): it did not happen.
    NotSent { reason: String },
    /// An asynchronous tool's "accepted, the outcome comes later" (a status its
    /// `[tool.async] accepted_status` lists, such as 202): the command waits in UNKNOWN for
    /// its callback or webhook until the tool's deadline, then is looked up or escalated.
    /// Only a tool that declares `[tool.async]` is ever answered so; for any other tool the
    /// machine reads it as `Ambiguous`. `external_ref`: the upstream's reference of the
    /// accepted work (the job id), read from the answer as a commit's is, kept in the
    /// command's state so its webhook can name it by that reference (absent from events
    /// stored before it existed).
    Accepted {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        external_ref: Option<String>,
    },
    /// The upstream asked to be called again later: a 429 or 503 with `Retry-After`, or a 403
    /// with it (GitHub's secondary rate limit). `retry_after_ms` is the header's delay, never
    /// negative (a header that is not one is no header: the answer is `Ambiguous` or
    /// `Refused`). The machine waits it out without spending an attempt, up to the tool's
    /// `max_rate_limited_ms`; past that the answer counts as it would without the header:
    /// `Refused` when `refusal` (the 403), else `Ambiguous`.
    RateLimited {
        reason: String,
        retry_after_ms: i64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        refusal: bool,
    },
}

impl DispatchOutcome {
    /// Its name, for metrics' labels and spans: `committed`, `refused`, `ambiguous`,
    /// `not_sent`, `rate_limited` or `accepted`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Committed { .. } => "committed",
            Self::Refused { .. } => "refused",
            Self::Ambiguous { .. } => "ambiguous",
            Self::NotSent { .. } => "not_sent",
            Self::RateLimited { .. } => "rate_limited",
            Self::Accepted { .. } => "accepted",
        }
    }

    /// The outcome a `RateLimited` answer counts as once the ceiling is spent (or where it is
    /// not waited on); any other outcome as it is.
    pub fn without_retry_after(&self) -> DispatchOutcome {
        match self {
            Self::RateLimited {
                reason,
                refusal: true,
                ..
            } => Self::Refused {
                reason: reason.clone(),
            },
            Self::RateLimited {
                reason,
                refusal: false,
                ..
            } => Self::Ambiguous {
                reason: reason.clone(),
            },
            Self::Committed { .. }
            | Self::Refused { .. }
            | Self::Ambiguous { .. }
            | Self::NotSent { .. }
            | Self::Accepted { .. } => self.clone(),
        }
    }
}

/// What a compensate call did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CompensationOutcome {
    /// 2xx: undone.
    Done { reference: Option<String> },
    /// 4xx: the upstream says it cannot be undone; a person must act.
    Impossible { reason: String },
    /// Anything else: try again later. `retry_after_ms`: the upstream asked to be called again
    /// only then (a 429 or 503, or a 403, with `Retry-After`): waited out without spending an
    /// attempt, up to the tool's `max_rate_limited_ms`, as a dispatch's is.
    Retry {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<i64>,
    },
}

/// How a person settles a STUCK command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    Confirmed { external_ref: String },
    Failed,
}

/// Everything that can happen to a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A scheduled command's time has come.
    Due,
    /// A dispatcher takes the lease.
    Lease {
        owner: std::sync::Arc<str>,
    },
    /// The lease holder moves its lease's end to `to` (later than it is now), so a write that
    /// may outlast the lease cannot let it lapse under it. Quiet: no audit record.
    ExtendLease {
        epoch: LeaseEpoch,
        to: Timestamp,
    },
    /// A service takes exclusive charge of a command for `job`, work it does outside any
    /// transition (a look at the world, a compensation's calls): the epoch moves on, so
    /// whoever else read the command as it was loses its later write, and the command is held
    /// `hold_ms` (its due time; a compensation's claim also in `claimed_until`), so the sweep
    /// leaves it alone while the job runs and takes it up again if the claimer dies. Quiet: no
    /// audit record.
    Claim {
        job: ClaimJob,
        hold_ms: i64,
    },
    /// The sweep found a command due that waits for work of the pipeline: the request for that
    /// work is sent again (the step's action), and the command is left alone for `grace_ms`
    /// (a PENDING or APPROVED one at least its `pending_stale_ms`) while it is handled. Quiet:
    /// no audit record.
    Republish {
        grace_ms: i64,
    },
    /// The lease holder gives its lease back before sending anything (too little of it was
    /// left for the whole call): the attempt does not count.
    Release {
        epoch: LeaseEpoch,
        reason: String,
    },
    /// Flow control keeps the call back (an operator's pause, an open circuit breaker, the
    /// upstream's rate or its cap in flight: `crate::flow`): the command waits, PENDING (or
    /// APPROVED), until `until`, without spending an attempt; a reservation's unused lease
    /// (`epoch`) is given back. An UNKNOWN command's look waits the same way, spending no
    /// check. The sweep brings it back then.
    Hold {
        epoch: Option<LeaseEpoch>,
        until: Timestamp,
        cause: crate::flow::HoldCause,
        reason: String,
    },
    /// Policy needs a person's approval first.
    Block {
        reason: String,
        epoch: Option<LeaseEpoch>,
    },
    /// Policy forbids the effect outright.
    Deny {
        reason: String,
        epoch: Option<LeaseEpoch>,
    },
    /// The lease holder reports what the upstream did.
    Dispatched {
        epoch: LeaseEpoch,
        outcome: DispatchOutcome,
        /// When the attempt was sent, by the holder's clock: an ambiguous one may be worked on
        /// until its timeout after this.
        sent_at: Timestamp,
    },
    /// The sweep found a LEASED command due: its lease expired with no outcome written, or,
    /// while the lease still holds, the command was due earlier than its end (a dispatcher's
    /// lease keeps an earlier due time) and is now due at the end instead: then quiet, no
    /// audit record.
    LeaseExpired,
    /// A status check answered (for an UNKNOWN command, or to verify a CONFIRMED one).
    Observed {
        observation: Observation,
        external_ref: Option<String>,
        evidence: Value,
        /// For `duplicate`: the commits other than the command's own.
        #[serde(default)]
        extra_refs: Vec<String>,
        /// An `inconclusive` answer that asked to be asked again later (a 429 or 503 with
        /// `Retry-After`): the delay, never negative. The next look waits for it and the look
        /// is not counted, up to the tool's `max_rate_limited_ms`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<i64>,
        /// For `present` (and `duplicate`): the record the lookup found for the command's own
        /// commit, kept as its result when the dispatch's answer was lost, so an agent reads a
        /// result whether or not Sluice had to look.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        record: Option<Value>,
    },
    /// An IDEMPOTENT or OBSERVE_ONLY tool without a status check is retried with the same key.
    RetrySameKey,
    /// The outcome cannot be resolved from evidence at all (the tool declares no status check
    /// and may not be retried blindly): a person must decide.
    GiveUp {
        reason: String,
    },
    Approve {
        operator: Operator,
        policy_version: String,
        /// The approver's edit of the arguments (`crate::revision`), recorded as the command's
        /// next revision with the approval; `None` approves the arguments as they are.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<Box<crate::revision::Revision>>,
    },
    Reject {
        operator: Operator,
    },
    /// A BLOCKED command waited the tool's whole approval timeout for a person.
    ApprovalExpired,
    Cancel {
        operator: Operator,
    },
    /// The run is rolled back: compensate this command.
    Rollback {
        operator: Operator,
    },
    /// The run is rolled back while this command is in flight (LEASED, UNKNOWN, PENDING after
    /// an ambiguous attempt, STUCK): its outcome, once known, is undone instead of confirmed.
    MarkRollback {
        operator: Operator,
    },
    /// A compensate handler returned (the time passed to [`apply`] is taken after it
    /// returned), reported by the holder of the claim `epoch`.
    Compensated {
        epoch: LeaseEpoch,
        outcome: CompensationOutcome,
    },
    /// Clean-up of an extra commit found by a `duplicate` observation finished, reported by
    /// the holder of the claim `epoch`.
    /// `undone`: the extra commits this job undid, whatever its outcome (a retry owes only
    /// the rest).
    DuplicateSettled {
        epoch: LeaseEpoch,
        outcome: CompensationOutcome,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        undone: Vec<String>,
    },
    Resolve {
        operator: Operator,
        resolution: Resolution,
        evidence: Value,
    },
    /// A signed event from an evidence source (`crate::evidence`) said what became of the
    /// effect: read as a status check's answer (`machine::evidence`).
    Evidence {
        source: String,
        event_id: String,
        outcome: crate::evidence::EvidenceOutcome,
        /// The upstream's reference of the commit, when the event names it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        external_ref: Option<String>,
        /// The event as kept (`crate::evidence::kept`).
        evidence: Value,
    },
    Replay {
        operator: Operator,
        evidence: Option<Value>,
    },
}

/// The job a [`Event::Claim`] is taken for: each is the work of one
/// [`awaited`](super::awaited) action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClaimJob {
    /// A look at the world (`Action::Reconcile`): an UNKNOWN outcome, or a last look owed.
    Look,
    /// A COMPENSATING command's compensate calls (`Action::Compensate`).
    Compensate,
    /// The clean-up of a CONFIRMED command's extra commits (`Action::CompensateDuplicate`).
    UndoDuplicates,
}

impl ClaimJob {
    /// The awaited action this job does.
    pub fn action(self) -> Action {
        match self {
            Self::Look => Action::Reconcile,
            Self::Compensate => Action::Compensate,
            Self::UndoDuplicates => Action::CompensateDuplicate,
        }
    }
}

/// The variant of an [`Event`], without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Due,
    Lease,
    ExtendLease,
    Claim,
    Republish,
    Release,
    Hold,
    Block,
    Deny,
    Dispatched,
    LeaseExpired,
    Observed,
    RetrySameKey,
    GiveUp,
    Approve,
    Reject,
    ApprovalExpired,
    Cancel,
    Rollback,
    MarkRollback,
    Compensated,
    DuplicateSettled,
    Resolve,
    Replay,
    Evidence,
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Self::Due => EventKind::Due,
            Self::Lease { .. } => EventKind::Lease,
            Self::ExtendLease { .. } => EventKind::ExtendLease,
            Self::Claim { .. } => EventKind::Claim,
            Self::Republish { .. } => EventKind::Republish,
            Self::Release { .. } => EventKind::Release,
            Self::Hold { .. } => EventKind::Hold,
            Self::Block { .. } => EventKind::Block,
            Self::Deny { .. } => EventKind::Deny,
            Self::Dispatched { .. } => EventKind::Dispatched,
            Self::LeaseExpired => EventKind::LeaseExpired,
            Self::Observed { .. } => EventKind::Observed,
            Self::RetrySameKey => EventKind::RetrySameKey,
            Self::GiveUp { .. } => EventKind::GiveUp,
            Self::Approve { .. } => EventKind::Approve,
            Self::Reject { .. } => EventKind::Reject,
            Self::ApprovalExpired => EventKind::ApprovalExpired,
            Self::Cancel { .. } => EventKind::Cancel,
            Self::Rollback { .. } => EventKind::Rollback,
            Self::MarkRollback { .. } => EventKind::MarkRollback,
            Self::Compensated { .. } => EventKind::Compensated,
            Self::DuplicateSettled { .. } => EventKind::DuplicateSettled,
            Self::Resolve { .. } => EventKind::Resolve,
            Self::Replay { .. } => EventKind::Replay,
            Self::Evidence { .. } => EventKind::Evidence,
        }
    }

    /// The person behind the event, for operator actions.
    pub fn operator(&self) -> Option<&Operator> {
        match self {
            Self::Approve { operator, .. }
            | Self::Reject { operator }
            | Self::Cancel { operator }
            | Self::Rollback { operator }
            | Self::MarkRollback { operator }
            | Self::Resolve { operator, .. }
            | Self::Replay { operator, .. } => Some(operator),
            Self::Due
            | Self::Lease { .. }
            | Self::ExtendLease { .. }
            | Self::Claim { .. }
            | Self::Republish { .. }
            | Self::Release { .. }
            | Self::Hold { .. }
            | Self::Block { .. }
            | Self::Deny { .. }
            | Self::Dispatched { .. }
            | Self::LeaseExpired
            | Self::Observed { .. }
            | Self::Evidence { .. }
            | Self::RetrySameKey
            | Self::GiveUp { .. }
            | Self::ApprovalExpired
            | Self::Compensated { .. }
            | Self::DuplicateSettled { .. } => None,
        }
    }
}

/// Work a service must carry out after storing a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Publish a dispatch request for the command.
    Dispatch,
    /// The lease is held: call the upstream with the idempotency key.
    CallUpstream,
    /// Resolve the UNKNOWN outcome from evidence.
    Reconcile,
    /// Call the tool's compensate for the command (run rollback).
    Compensate,
    /// Call the tool's compensate for the extra commit found by a `duplicate` observation.
    CompensateDuplicate,
    /// Publish a lifecycle event for outside consumers.
    Publish { status: CommandStatus },
    /// A person must look at the command.
    Escalate { reason: String },
}

/// One transition: the next state, the work it implies, and what the audit chain records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub from: CommandStatus,
    pub state: CommandState,
    pub actions: Vec<Action>,
    pub reason: String,
    pub evidence: Value,
    /// A quiet step (a claim, a lease extension, a republish) keeps the status and writes no
    /// audit record: it is bookkeeping of who works on the command and when it is next due,
    /// not something that happened to the effect. Still a guarded write: the fences hold.
    pub quiet: bool,
}

impl Step {
    pub fn to(&self) -> CommandStatus {
        self.state.status
    }

    /// The audit record of this step, written by `actor`; `None` for a quiet step.
    pub fn audit(&self, command_key: &CommandKey, actor: &str) -> Option<AuditDraft> {
        if self.quiet {
            return None;
        }
        let draft = AuditDraft::transition(
            command_key,
            Some(self.from),
            self.state.status,
            actor,
            self.reason.clone(),
        )
        .with_evidence(self.evidence.clone());
        Some(draft)
    }
}

/// Why an event does not apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "refusal", rename_all = "snake_case")]
pub enum Refusal {
    #[error("{event:?} does not apply to a {status} command")]
    NotAllowed {
        status: CommandStatus,
        event: EventKind,
    },
    #[error("stale lease epoch {presented}: the current epoch is {current}")]
    StaleEpoch {
        current: LeaseEpoch,
        presented: LeaseEpoch,
    },
    #[error("the command is not due until {due_at}")]
    NotYetDue { due_at: Timestamp },
    #[error("the lease is still valid until {expires_at}")]
    LeaseStillValid { expires_at: Timestamp },
    #[error("all {max_attempts} dispatch attempts are used")]
    AttemptsExhausted { max_attempts: u32 },
    #[error("a NON_IDEMPOTENT command is never retried blindly: it needs a status check")]
    BlindRetry,
    #[error("an OBSERVE_ONLY command has nothing to compensate")]
    NotCompensable,
    #[error("a reason is required")]
    ReasonRequired,
    #[error("evidence (an upstream reference or record) is required")]
    EvidenceRequired,
    #[error(
        "replaying a NON_IDEMPOTENT command whose outcome is unknown needs evidence that it did not commit"
    )]
    ReplayNeedsEvidence,
    #[error("the command was replayed {replays} times already (limit {max_replays})")]
    ReplayLimit { replays: u32, max_replays: u32 },
    #[error(
        "an earlier attempt's outcome is unknown (it may have committed): the command is in flight, not waiting to start"
    )]
    OutcomeUnknown,
    #[error("the command's run was rolled back: it is not dispatched again")]
    RunRolledBack,
    #[error("the command waits for no such work of the pipeline")]
    NotAwaited,
    #[error("another job holds the command until {until}")]
    JobClaimed { until: Timestamp },
    #[error("the lease already runs until {expires_at}")]
    LeaseNotExtended { expires_at: Timestamp },
    #[error(
        "the edit was made as revision {given}, but the command is at revision {current}: another edit came first"
    )]
    StaleRevision { current: u32, given: u32 },
}
