//! The command state machine (docs/architecture.md, "State machine"): one pure, total function.
//!
//! [`apply`] takes a command's state, the rules of its tool, an [`Event`] and the current time,
//! and returns either a [`Step`] (the next state, the [`Action`]s a service must carry out, and
//! what to write in the audit chain) or a typed [`Refusal`]. It does no IO: the services carry
//! out the actions and store the next state with a guarded ledger write, so a refusal here and
//! a failed compare-and-set in the ledger are the only two ways a transition does not happen.
//!
//! Every match is exhaustive over states and events, without wildcard arms, so adding a state
//! or an event fails to compile until each pair is decided.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit::AuditDraft;
use crate::command::{Approval, CommandState, CommandStatus, CompensationInfo, EffectSemantics};
use crate::command::{Lease, Observation};
use crate::ids::{CommandKey, LeaseEpoch};
use crate::policy::PolicyDecision;
use crate::time::Timestamp;

/// What to do when a status check finds a NON_IDEMPOTENT effect absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnAbsent {
    /// Redispatch once the absence is seen twice, `settle` apart.
    #[default]
    Redispatch,
    /// Fail the command, so a person decides whether to replay it.
    Fail,
}

/// The per-tool rules the machine needs, taken from the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    pub semantics: EffectSemantics,
    /// Dispatch attempts per cycle (a replay starts a new cycle).
    pub max_attempts: u32,
    /// Status checks per UNKNOWN episode before the command is STUCK.
    pub max_checks: u32,
    /// Operator replays per command.
    pub max_replays: u32,
    pub has_status_check: bool,
    pub has_compensate: bool,
    pub on_absent: OnAbsent,
    /// How long an `absent` must hold before a NON_IDEMPOTENT effect is redispatched.
    pub settle_ms: i64,
    pub lease_ttl_ms: i64,
    /// How long one dispatch call may take (the connector's timeout).
    #[serde(default = "default_dispatch_timeout_ms")]
    pub dispatch_timeout_ms: i64,
    /// A PENDING command not leased within this long is republished by the sweep.
    pub pending_stale_ms: i64,
    /// First delay between status checks or retries; doubles each time up to `backoff_max_ms`.
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    /// How long a compensation may run before the sweep retries it.
    pub compensation_timeout_ms: i64,
    /// Look a 2xx commit up once more (after `verify_after_ms`) to catch a double commit the
    /// upstream did not report; needs a status check.
    #[serde(default)]
    pub verify_after_commit: bool,
    /// How long after the client gave up (the call's timeout) an attempt may still commit
    /// upstream: servers keep working after the client disconnects. An `absent` observation
    /// counts only once this horizon has passed.
    #[serde(default = "default_late_commit_ms")]
    pub late_commit_ms: i64,
    /// How long after a NON_IDEMPOTENT command settled through UNKNOWN (or a redispatch) it is
    /// looked up once more, for a commit that landed late or a lookup that lagged.
    #[serde(default = "default_verify_after_ms")]
    pub verify_after_ms: i64,
    /// The bound on clock skew between the components (the catalog's `max_clock_skew_ms`):
    /// every horizon and lease margin is widened by it.
    #[serde(default = "default_clock_skew_ms")]
    pub clock_skew_ms: i64,
    /// How long a BLOCKED command waits for a person before it is cancelled (escalated).
    #[serde(default = "default_approval_timeout_ms")]
    pub approval_timeout_ms: i64,
}

fn default_dispatch_timeout_ms() -> i64 {
    10_000
}

fn default_late_commit_ms() -> i64 {
    10_000
}

fn default_verify_after_ms() -> i64 {
    30_000
}

fn default_clock_skew_ms() -> i64 {
    500
}

fn default_approval_timeout_ms() -> i64 {
    86_400_000
}

impl Rules {
    /// Conservative defaults for a tool of the given semantics.
    pub fn defaults(semantics: EffectSemantics) -> Self {
        Self {
            semantics,
            max_attempts: 3,
            max_checks: 5,
            max_replays: 3,
            has_status_check: false,
            has_compensate: false,
            on_absent: OnAbsent::Redispatch,
            settle_ms: 2_000,
            lease_ttl_ms: 30_000,
            dispatch_timeout_ms: default_dispatch_timeout_ms(),
            pending_stale_ms: 10_000,
            backoff_base_ms: 500,
            backoff_max_ms: 60_000,
            compensation_timeout_ms: 30_000,
            verify_after_commit: false,
            late_commit_ms: default_late_commit_ms(),
            verify_after_ms: default_verify_after_ms(),
            clock_skew_ms: default_clock_skew_ms(),
            approval_timeout_ms: default_approval_timeout_ms(),
        }
    }

    /// The rules a command is decided by: its tool's rules as the catalog declares them now,
    /// with the semantics the command was accepted under kept wherever they are the stricter
    /// (NON_IDEMPOTENT over IDEMPOTENT over OBSERVE_ONLY), and its own attempt budget. A tool
    /// that turned NON_IDEMPOTENT is never retried blindly for commands accepted before; one
    /// that turned IDEMPOTENT keeps the settle rule for commands accepted as NON_IDEMPOTENT.
    #[must_use]
    pub fn for_command(mut self, stored: EffectSemantics, max_attempts: u32) -> Self {
        let strictness = |semantics: EffectSemantics| match semantics {
            EffectSemantics::ObserveOnly => 0,
            EffectSemantics::Idempotent => 1,
            EffectSemantics::NonIdempotent => 2,
        };
        if strictness(stored) > strictness(self.semantics) {
            self.semantics = stored;
        }
        self.max_attempts = max_attempts;
        self
    }

    /// The lease time a call needs: the whole call's timeout plus the skew bound, so the
    /// sweep cannot take the lease for expired while the call may still be in flight.
    pub fn call_margin_ms(&self) -> i64 {
        self.dispatch_timeout_ms.saturating_add(self.clock_skew_ms)
    }

    /// Delay before the `n`-th retry or check (n from 0): base·2ⁿ, capped.
    pub fn backoff_ms(&self, n: u32) -> i64 {
        let factor = 1_i64.checked_shl(n.min(30)).unwrap_or(i64::MAX);
        self.backoff_base_ms
            .saturating_mul(factor)
            .min(self.backoff_max_ms)
    }
}

/// How an UNKNOWN command (or a CONFIRMED, FAILED or CANCELLED one owing a verification) is
/// looked at: decided here, from the command's rules, so no service decides it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Ask the tool's status check.
    StatusCheck,
    /// Call again with the same idempotency key (IDEMPOTENT, OBSERVE_ONLY without a check).
    RetrySameKey,
    /// Nothing can resolve it: a person must ([`Event::GiveUp`] with this reason).
    GiveUp(String),
}

/// What to do with a command that waits for a look at the world. `tool_present`: the tool is
/// still in the catalog.
pub fn look_for(state: &CommandState, rules: &Rules, tool_present: bool) -> Look {
    if !tool_present {
        return Look::GiveUp(
            "the tool is no longer in the catalog; a person must find out whether the effect happened"
                .into(),
        );
    }
    if rules.has_status_check {
        return Look::StatusCheck;
    }
    match (state.status, rules.semantics) {
        (CommandStatus::Unknown, EffectSemantics::Idempotent | EffectSemantics::ObserveOnly) => {
            Look::RetrySameKey
        }
        (CommandStatus::Unknown, EffectSemantics::NonIdempotent) => Look::GiveUp(
            "the tool declares no status check; a person must find out whether the effect happened"
                .into(),
        ),
        _ => Look::GiveUp("the tool no longer declares a status check to verify with".into()),
    }
}

/// Whether the holder of a command's lease may call the upstream now: the lease is held and
/// more than the whole call's time (timeout plus skew bound) of it remains, so the outcome is
/// written before anyone may take the lease for expired. Checked right before the call, after
/// the lease write and its retries.
pub fn lease_usable(state: &CommandState, rules: &Rules, now: Timestamp) -> bool {
    state.status == CommandStatus::Leased
        && state
            .lease
            .expires_at
            .is_some_and(|expires_at| expires_at.millis_since(now) > rules.call_margin_ms())
}

/// What a run's rollback does to one of its commands as it is now (decided afresh on every
/// read, so a command that moved while the rollback ran is still taken): cancel what has not
/// started, undo what committed, mark what is in flight; `None` for what needs nothing (a
/// read, a command already settled without a commit, or already undone or marked).
pub fn rollback_event(
    state: &CommandState,
    semantics: EffectSemantics,
    operator: &Operator,
) -> Option<Event> {
    use CommandStatus as S;
    let operator = operator.clone();
    let undoable = semantics != EffectSemantics::ObserveOnly;
    match state.status {
        S::Pending | S::Approved if state.outcome_unknown => (undoable
            && state.rollback_pending.is_none())
        .then_some(Event::MarkRollback { operator }),
        S::Scheduled | S::Pending | S::Blocked | S::Approved => Some(Event::Cancel { operator }),
        S::Leased | S::Unknown | S::Stuck => (undoable && state.rollback_pending.is_none())
            .then_some(Event::MarkRollback { operator }),
        S::Confirmed => undoable.then_some(Event::Rollback { operator }),
        S::Failed | S::Cancelled => (undoable && state.rollback_pending.is_none())
            .then_some(Event::MarkRollback { operator }),
        S::Compensating | S::Compensated | S::CompensationFailed | S::NoCompensation => None,
    }
}

/// Of a run's commands in journal order, the one whose compensation may run now: the last one
/// still to be undone. Compensation is last-in-first-out: nothing earlier in the journal is
/// undone while a later command is COMPENSATING or still in flight under a rollback (its
/// outcome decides whether it is undone first). `None`: nothing can be compensated now.
pub fn next_to_compensate<T>(run: &[T], state_of: impl Fn(&T) -> &CommandState) -> Option<usize> {
    for (index, item) in run.iter().enumerate().rev() {
        let state = state_of(item);
        if state.status == CommandStatus::Compensating {
            return Some(index);
        }
        // Still moving under the rollback: its outcome decides whether it is undone first. A
        // STUCK one waits for a person, perhaps for days, and does not hold the others up; if
        // it is resolved CONFIRMED it is undone then, out of order, and the audit says so.
        if state.rollback_pending.is_some() && !state.status.is_settled() {
            return None;
        }
    }
    None
}

/// The lease owner of a command that was leased by its own reservation
/// ([`lease_at_reservation`]): whichever dispatcher receives its dispatch request calls under it.
pub const RESERVATION_OWNER: &str = "reservation";

/// The state a reservation stores for a command whose tool may be called again with the same
/// idempotency key (IDEMPOTENT, OBSERVE_ONLY): leased already, so dispatching it costs no lease
/// write of its own — two ledger writes per effect (reserve, outcome) instead of three.
///
/// The lease's compare-and-set is what keeps a NON_IDEMPOTENT effect to one caller. For these
/// tools a second caller is harmless by their contract (it carries the same key), and the
/// outcome's write is still fenced by the epoch, so exactly one outcome is stored. What the
/// early lease keeps is the rest of the lease's meaning: from its reservation on, the command
/// reads LEASED — handed to the dispatchers, possibly in flight — so a cancel or a rollback
/// never takes it for not started, and a lost dispatch request ends in the lease-expiry sweep,
/// which reconciles it like any other lease that lapsed.
///
/// `None` (the command is stored as it is) unless the command is PENDING, its tool is of that
/// kind and `policy` allows it outright: a command that needs approval is blocked by the
/// dispatcher as before, and a SCHEDULED one is leased when it falls due.
pub fn lease_at_reservation(
    state: &CommandState,
    rules: &Rules,
    policy: &PolicyDecision,
    now: Timestamp,
) -> Option<CommandState> {
    let repeatable = match rules.semantics {
        EffectSemantics::Idempotent | EffectSemantics::ObserveOnly => true,
        EffectSemantics::NonIdempotent => false,
    };
    let allowed = match policy {
        PolicyDecision::Allow => true,
        PolicyDecision::RequireApproval { .. } | PolicyDecision::Deny { .. } => false,
    };
    if !repeatable || !allowed || state.status != CommandStatus::Pending {
        return None;
    }
    let lease = Event::Lease {
        owner: std::sync::Arc::from(RESERVATION_OWNER),
    };
    let mut next = apply(state, rules, &lease, now).ok()?.state;
    // A dispatcher takes the lease up within `pending_stale_ms` (the wait a PENDING command is
    // given before the sweep republishes it) and calls for at most the call's timeout, so the
    // lease lapses no later than that: a dispatch request lost with an embedded bus's process
    // is then reconciled as soon as a stale PENDING one would be republished, not a whole
    // `lease_ttl_ms` later.
    let expires_at = now.plus_millis(
        rules
            .pending_stale_ms
            .saturating_add(rules.dispatch_timeout_ms)
            .min(rules.lease_ttl_ms),
    );
    next.lease.expires_at = Some(expires_at);
    next.due_at = Some(expires_at);
    Some(next)
}

/// Whether a dispatcher may call under a lease its command got at reservation: the lease is
/// still the reservation's, and it has more than the call's timeout left, so the outcome is
/// written before the sweep may take the lease for expired. A lease with less left is left to
/// that sweep, which reconciles it and retries under a lease of its own.
pub fn reservation_lease_usable(state: &CommandState, rules: &Rules, now: Timestamp) -> bool {
    state.lease.owner.as_deref() == Some(RESERVATION_OWNER) && lease_usable(state, rules, now)
}

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
}

/// What a compensate call did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum CompensationOutcome {
    /// 2xx: undone.
    Done { reference: Option<String> },
    /// 4xx: the upstream says it cannot be undone; a person must act.
    Impossible { reason: String },
    /// Anything else: try again later.
    Retry { reason: String },
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
    /// The lease holder extends its lease.
    ExtendLease {
        epoch: LeaseEpoch,
    },
    /// The lease holder gives its lease back before sending anything (too little of it was
    /// left for the whole call): the attempt does not count.
    Release {
        epoch: LeaseEpoch,
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
    },
    /// The sweep found the lease expired with no outcome written.
    LeaseExpired,
    /// A status check answered (for an UNKNOWN command, or to verify a CONFIRMED one).
    Observed {
        observation: Observation,
        external_ref: Option<String>,
        evidence: Value,
        /// For `duplicate`: the commits other than the command's own.
        #[serde(default)]
        extra_refs: Vec<String>,
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
    DuplicateSettled {
        epoch: LeaseEpoch,
        outcome: CompensationOutcome,
    },
    Resolve {
        operator: Operator,
        resolution: Resolution,
        evidence: Value,
    },
    Replay {
        operator: Operator,
        evidence: Option<Value>,
    },
}

/// The variant of an [`Event`], without its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Due,
    Lease,
    ExtendLease,
    Release,
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
}

impl Event {
    pub fn kind(&self) -> EventKind {
        match self {
            Self::Due => EventKind::Due,
            Self::Lease { .. } => EventKind::Lease,
            Self::ExtendLease { .. } => EventKind::ExtendLease,
            Self::Release { .. } => EventKind::Release,
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
            | Self::Release { .. }
            | Self::Block { .. }
            | Self::Deny { .. }
            | Self::Dispatched { .. }
            | Self::LeaseExpired
            | Self::Observed { .. }
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
}

impl Step {
    pub fn to(&self) -> CommandStatus {
        self.state.status
    }

    /// The audit record of this step, written by `actor`.
    pub fn audit(&self, command_key: &CommandKey, actor: &str) -> AuditDraft {
        AuditDraft::transition(
            command_key,
            Some(self.from),
            self.state.status,
            actor,
            self.reason.clone(),
        )
        .with_evidence(self.evidence.clone())
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
}

/// Computes the transition of `state` under `event` at `now`. Pure and total.
pub fn apply(
    state: &CommandState,
    rules: &Rules,
    event: &Event,
    now: Timestamp,
) -> Result<Step, Refusal> {
    use CommandStatus as S;

    if let Some(operator) = event.operator()
        && operator.reason.trim().is_empty()
    {
        return Err(Refusal::ReasonRequired);
    }
    let from = state.status;
    let refuse = || Refusal::NotAllowed {
        status: from,
        event: event.kind(),
    };
    let mut next = state.clone();
    next.updated_at = now;
    let step = |next: CommandState, actions: Vec<Action>, reason: String, evidence: Value| Step {
        from,
        state: next,
        actions,
        reason,
        evidence,
    };

    match event {
        Event::Due => match from {
            S::Scheduled => {
                if let Some(due_at) = state.due_at.filter(|at| *at > now) {
                    return Err(Refusal::NotYetDue { due_at });
                }
                next.status = S::Pending;
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    "due".into(),
                    Value::Null,
                ))
            }
            S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Lease { owner } => match from {
            S::Pending | S::Approved => {
                if state.attempts >= rules.max_attempts {
                    return Err(Refusal::AttemptsExhausted {
                        max_attempts: rules.max_attempts,
                    });
                }
                let expires_at = now.plus_millis(rules.lease_ttl_ms);
                next.status = S::Leased;
                next.lease = Lease {
                    epoch: state.lease.epoch.next(),
                    owner: Some(owner.clone()),
                    expires_at: Some(expires_at),
                };
                next.attempts = state.attempts + 1;
                next.due_at = Some(expires_at);
                let reason = format!(
                    "leased by {owner}, attempt {} of {}",
                    next.attempts, rules.max_attempts
                );
                Ok(step(next, vec![Action::CallUpstream], reason, Value::Null))
            }
            S::Scheduled
            | S::Blocked
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::ExtendLease { epoch } => match from {
            S::Leased => {
                check_epoch(state, *epoch)?;
                let expires_at = now.plus_millis(rules.lease_ttl_ms);
                next.lease.expires_at = Some(expires_at);
                next.due_at = Some(expires_at);
                Ok(step(next, vec![], "lease extended".into(), Value::Null))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Release { epoch, reason } => match from {
            S::Leased => {
                check_holder(state, *epoch)?;
                next.lease = released(&state.lease);
                // Nothing was sent under this lease: the attempt does not count.
                next.attempts = state.attempts.saturating_sub(1);
                if state.rollback_pending.is_some() && !state.outcome_unknown {
                    // The mark stays: the run was rolled back, so the command is never replayed.
                    return Ok(cancelled_unsent(
                        next,
                        from,
                        rules,
                        format!("run rolled back; the lease was given back unused ({reason})"),
                        now,
                    ));
                }
                next.status = S::Pending;
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    format!("lease given back before the call: {reason}"),
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Block { reason, epoch } | Event::Deny { reason, epoch } => {
            let deny = matches!(event, Event::Deny { .. });
            match from {
                S::Pending | S::Approved | S::Leased => {
                    if from == S::Leased {
                        check_epoch(state, epoch.unwrap_or(LeaseEpoch::ZERO))?;
                        // Nothing was sent under this lease: the attempt does not count.
                        next.attempts = state.attempts.saturating_sub(1);
                        next.lease = released(&state.lease);
                    }
                    if state.outcome_unknown {
                        // Policy now refuses a same-key retry, but the earlier attempt may
                        // have committed: neither FAILED nor BLOCKED says what happened.
                        let label = if deny { "denied" } else { "blocked" };
                        return Ok(stuck(
                            next,
                            from,
                            format!(
                                "{label} by policy ({reason}) while an earlier attempt's outcome is unknown"
                            ),
                        ));
                    }
                    next.due_at = None;
                    let (status, label) = if deny {
                        next.last_error = Some(format!("denied by policy: {reason}"));
                        (S::Failed, "denied by policy")
                    } else {
                        // A gate waits for a person only so long (Tape's gates time out).
                        next.due_at = Some(now.plus_millis(rules.approval_timeout_ms));
                        (S::Blocked, "blocked by policy")
                    };
                    next.status = status;
                    Ok(step(
                        next,
                        vec![Action::Publish { status }],
                        format!("{label}: {reason}"),
                        Value::Null,
                    ))
                }
                S::Scheduled
                | S::Blocked
                | S::Confirmed
                | S::Failed
                | S::Unknown
                | S::Stuck
                | S::Cancelled
                | S::Compensating
                | S::Compensated
                | S::CompensationFailed
                | S::NoCompensation => Err(refuse()),
            }
        }

        Event::Dispatched { epoch, outcome } => match from {
            S::Leased => {
                check_holder(state, *epoch)?;
                next.lease = released(&state.lease);
                Ok(dispatched(next, state, rules, outcome, now, from))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::LeaseExpired => match from {
            S::Leased => {
                if let Some(expires_at) = state.lease.expires_at.filter(|at| *at > now) {
                    return Err(Refusal::LeaseStillValid { expires_at });
                }
                next.lease = released(&state.lease);
                // The holder checked that the whole call fit in the lease before it sent, so
                // the call ended by the expiry; it may still land until the horizon after it.
                let ended_by = state.lease.expires_at.map_or(now, |at| at.max(now));
                enter_unknown(&mut next, rules, ended_by, now);
                Ok(step(
                    next,
                    vec![Action::Reconcile],
                    "lease expired without an outcome".into(),
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Observed {
            observation,
            external_ref,
            evidence,
            extra_refs,
        } => match from {
            S::Unknown => Ok(observed(
                next,
                state,
                rules,
                *observation,
                external_ref,
                evidence,
                extra_refs,
                now,
            )),
            S::Confirmed | S::Failed | S::Cancelled | S::Compensated if state.verify_pending => {
                Ok(verified(
                    next,
                    state,
                    rules,
                    *observation,
                    external_ref,
                    evidence,
                    extra_refs,
                    now,
                ))
            }
            S::Confirmed | S::Failed | S::Cancelled | S::Compensated => Err(refuse()),
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Stuck
            | S::Compensating
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::RetrySameKey => match from {
            S::Unknown => match rules.semantics {
                EffectSemantics::NonIdempotent => Err(Refusal::BlindRetry),
                EffectSemantics::Idempotent | EffectSemantics::ObserveOnly => {
                    if state.attempts < rules.max_attempts {
                        next.status = S::Pending;
                        next.outcome_unknown = true;
                        next.due_at = Some(now.plus_millis(rules.backoff_ms(state.attempts)));
                        Ok(step(
                            next,
                            vec![],
                            "retry with the same idempotency key".into(),
                            Value::Null,
                        ))
                    } else if rules.semantics == EffectSemantics::ObserveOnly {
                        // A read that never answered changed nothing: it simply failed.
                        next.status = S::Failed;
                        next.due_at = None;
                        Ok(step(
                            next,
                            vec![Action::Publish { status: S::Failed }],
                            format!("no answer after {} attempts", rules.max_attempts),
                            Value::Null,
                        ))
                    } else {
                        Ok(stuck(
                            next,
                            from,
                            format!(
                                "outcome unknown after {} attempts with the same key",
                                rules.max_attempts
                            ),
                        ))
                    }
                }
            },
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::GiveUp { reason } => match from {
            S::Unknown => Ok(stuck(next, from, reason.clone())),
            // A last look nobody can take any more (the tool lost its status check or left
            // the catalog): a person, not a loop.
            S::Confirmed | S::Failed | S::Cancelled | S::Compensated if state.verify_pending => {
                next.verify_pending = false;
                next.due_at = None;
                next.escalated = true;
                let why = format!("the last look cannot be taken: {reason}");
                Ok(step(
                    next,
                    vec![Action::Escalate {
                        reason: why.clone(),
                    }],
                    why,
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Approve {
            operator,
            policy_version,
        } => match from {
            S::Blocked => {
                next.status = S::Approved;
                next.approval = Some(Box::new(Approval {
                    approver: operator.actor.clone(),
                    reason: operator.reason.clone(),
                    at: now,
                    policy_version: policy_version.clone(),
                }));
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    operator.reason.clone(),
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Reject { operator } => match from {
            S::Blocked => Ok(cancelled(next, from, rules, operator, now)),
            S::Scheduled
            | S::Pending
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::ApprovalExpired => match from {
            S::Blocked => {
                if let Some(due_at) = state.due_at.filter(|at| *at > now) {
                    return Err(Refusal::NotYetDue { due_at });
                }
                next.status = S::Cancelled;
                next.due_at = None;
                next.escalated = true;
                let reason = format!(
                    "no approval within {} ms; cancelled",
                    rules.approval_timeout_ms
                );
                Ok(step(
                    next,
                    vec![
                        Action::Escalate {
                            reason: reason.clone(),
                        },
                        Action::Publish {
                            status: S::Cancelled,
                        },
                    ],
                    reason,
                    Value::Null,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::MarkRollback { operator } => {
            // FAILED and CANCELLED are marked too: nothing of them stands, but the mark keeps
            // a person from replaying them into a run that was rolled back.
            let in_flight = match from {
                S::Leased | S::Unknown | S::Stuck | S::Failed | S::Cancelled => true,
                S::Pending | S::Approved => state.outcome_unknown,
                S::Scheduled
                | S::Blocked
                | S::Confirmed
                | S::Compensating
                | S::Compensated
                | S::CompensationFailed
                | S::NoCompensation => false,
            };
            if !in_flight || state.rollback_pending.is_some() {
                return Err(refuse());
            }
            if rules.semantics == EffectSemantics::ObserveOnly {
                return Err(Refusal::NotCompensable);
            }
            next.rollback_pending = Some(state.lease.epoch);
            // A new epoch makes every write begun from a copy read before the mark lose its
            // compare-and-set and be decided again under it (a lease taken from a stale
            // PENDING copy would otherwise overwrite the mark: found by the fault runner); the
            // lease holder of the epoch the mark records may still write its outcome
            // (`check_holder`).
            next.lease.epoch = state.lease.epoch.next();
            Ok(step(
                next,
                vec![],
                format!(
                    "{} (in flight: undone once its outcome is known)",
                    operator.reason
                ),
                Value::Null,
            ))
        }

        Event::Cancel { operator } => match from {
            S::Pending | S::Approved if state.outcome_unknown => Err(Refusal::OutcomeUnknown),
            S::Scheduled | S::Pending | S::Blocked | S::Approved => {
                Ok(cancelled(next, from, rules, operator, now))
            }
            S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Rollback { operator } => match from {
            S::Confirmed => match rules.semantics {
                EffectSemantics::ObserveOnly => Err(Refusal::NotCompensable),
                EffectSemantics::Idempotent | EffectSemantics::NonIdempotent => {
                    // Owed duplicate clean-ups travel with the compensation. A last look still
                    // owed is kept for after it: a second commit it would have found (behind
                    // one 2xx, or an earlier attempt landing late) must not outlive the undo.
                    next.verify_pending = state.verify_pending
                        || (rules.semantics == EffectSemantics::NonIdempotent
                            && state.ambiguous_before
                            && rules.has_status_check);
                    if rules.has_compensate {
                        next.status = S::Compensating;
                        next.compensation = Some(Box::new(CompensationInfo {
                            started_at: now,
                            ended_at: None,
                            reference: None,
                            detail: None,
                            attempts: 0,
                        }));
                        next.due_at = Some(now.plus_millis(rules.compensation_timeout_ms));
                        Ok(step(
                            next,
                            vec![Action::Compensate],
                            operator.reason.clone(),
                            Value::Null,
                        ))
                    } else {
                        next.status = S::NoCompensation;
                        next.escalated = true;
                        next.verify_pending = false;
                        next.due_at = None;
                        Ok(step(
                            next,
                            vec![
                                Action::Escalate {
                                    reason: "rolled back but the tool declares no compensate"
                                        .into(),
                                },
                                Action::Publish {
                                    status: S::NoCompensation,
                                },
                            ],
                            format!("{} (no compensate declared)", operator.reason),
                            Value::Null,
                        ))
                    }
                }
            },
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Compensated { epoch, outcome } => match from {
            S::Compensating => {
                check_epoch(state, *epoch)?;
                Ok(compensated(next, state, rules, outcome, now, from))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::DuplicateSettled { epoch, outcome } => match from {
            S::Confirmed if !state.owed_duplicates.is_empty() => {
                check_epoch(state, *epoch)?;
                next.owed_duplicates.clear();
                // A verification still owed falls due after the clean-up.
                next.due_at = state.verify_pending.then(|| {
                    settle::last_landing(state.lands_by, now).plus_millis(rules.verify_after_ms)
                });
                let (actions, reason) = match outcome {
                    CompensationOutcome::Done { reference } => (
                        vec![],
                        format!(
                            "extra commit compensated{}",
                            reference
                                .as_deref()
                                .map(|r| format!(" ({r})"))
                                .unwrap_or_default()
                        ),
                    ),
                    CompensationOutcome::Impossible { reason }
                    | CompensationOutcome::Retry { reason } => {
                        next.escalated = true;
                        let why = format!("extra commit could not be compensated: {reason}");
                        (
                            vec![Action::Escalate {
                                reason: why.clone(),
                            }],
                            why,
                        )
                    }
                };
                Ok(step(
                    next,
                    actions,
                    reason,
                    serde_json::to_value(outcome).unwrap_or(Value::Null),
                ))
            }
            S::Confirmed => Err(refuse()),
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Failed
            | S::Unknown
            | S::Stuck
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Resolve {
            operator,
            resolution,
            evidence,
        } => match from {
            S::Stuck => {
                if is_empty_evidence(evidence) {
                    return Err(Refusal::EvidenceRequired);
                }
                let status = match resolution {
                    Resolution::Confirmed { external_ref } => {
                        if external_ref.trim().is_empty() {
                            return Err(Refusal::EvidenceRequired);
                        }
                        next.external_ref = Some(external_ref.clone());
                        S::Confirmed
                    }
                    Resolution::Failed => S::Failed,
                };
                next.escalated = false;
                next.due_at = None;
                next.outcome_unknown = false;
                if status == S::Confirmed && state.rollback_pending.is_some() {
                    let mut step = undo_commit(
                        next,
                        from,
                        rules,
                        &[],
                        format!("{} (run rolled back: undone)", operator.reason),
                        now,
                    );
                    step.evidence = evidence.clone();
                    return Ok(step);
                }
                next.status = status;
                // The mark stays: the run was rolled back, so the command is never replayed.
                Ok(step(
                    next,
                    vec![Action::Publish { status }],
                    operator.reason.clone(),
                    evidence.clone(),
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Failed
            | S::Unknown
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },

        Event::Replay { operator, evidence } => match from {
            S::Stuck | S::Failed => {
                if state.rollback_pending.is_some() {
                    return Err(Refusal::RunRolledBack);
                }
                if state.replays >= rules.max_replays {
                    return Err(Refusal::ReplayLimit {
                        replays: state.replays,
                        max_replays: rules.max_replays,
                    });
                }
                let outcome_unknown = from == S::Stuck;
                let evidence = evidence.clone().unwrap_or(Value::Null);
                if outcome_unknown
                    && rules.semantics == EffectSemantics::NonIdempotent
                    && is_empty_evidence(&evidence)
                {
                    return Err(Refusal::ReplayNeedsEvidence);
                }
                next.status = S::Pending;
                next.attempts = 0;
                next.checks = 0;
                next.replays = state.replays + 1;
                next.first_absent_at = None;
                next.lands_by = None;
                next.outcome_unknown = false;
                // A last look still owed is not lost: `ambiguous_before` stays, so the replay's
                // commit is looked up once more and a late earlier commit found then.
                next.verify_pending = false;
                next.escalated = false;
                next.due_at = Some(now.plus_millis(rules.pending_stale_ms));
                Ok(step(
                    next,
                    vec![Action::Dispatch],
                    operator.reason.clone(),
                    evidence,
                ))
            }
            S::Scheduled
            | S::Pending
            | S::Blocked
            | S::Approved
            | S::Leased
            | S::Confirmed
            | S::Unknown
            | S::Cancelled
            | S::Compensating
            | S::Compensated
            | S::CompensationFailed
            | S::NoCompensation => Err(refuse()),
        },
    }
}

mod settle;
mod verify;
use settle::{
    cancelled, cancelled_unsent, check_epoch, check_holder, compensated, dispatched, enter_unknown,
    is_empty_evidence, observed, released, stuck, undo_commit,
};
use verify::verified;

#[cfg(test)]
mod fault_paths;
#[cfg(test)]
mod tests;
