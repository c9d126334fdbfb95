//! A tool's rules as the state machine reads them ([`Rules`]: semantics, timeouts, horizons,
//! attempts), and how a command whose outcome is open is to be looked at ([`look_for`]).

use super::*;

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
    /// Look a refused dispatch up once more (after `verify_after_ms`): for an upstream that
    /// can answer a 4xx after it booked the effect. Needs a status check.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub verify_after_refusal: bool,
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
    /// What the ledger's writes take now, measured (`load::write_slack_ms`): added to the room
    /// a call needs, so the outcome's write fits in the lease, and twice to every lease, so
    /// the lease's own write does not eat that room. 0 in the
    /// catalog's rules; set by the services ([`Rules::with_write_slack`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub write_slack_ms: i64,
    /// How long the upstream remembers an idempotency key; `None`: for good. Past it, a resend
    /// of an IDEMPOTENT command whose earlier attempt may have committed is not safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key_ttl_ms: Option<i64>,
    /// The most a command waits in all, per cycle, on answers that ask for a later call
    /// (`Retry-After`) without spending an attempt or a check; past it such answers count as
    /// they would without the header. 0: never waited on.
    #[serde(default = "default_max_rate_limited_ms")]
    pub max_rate_limited_ms: i64,
    /// The tool declares that an answer asking for a later call proves nothing committed: the
    /// command is sent again after the wait, even a NON_IDEMPOTENT one, without a look first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rate_limited_commits_nothing: bool,
    /// `[tool.async]`: an accepted dispatch (`DispatchOutcome::Accepted`) waits this long for
    /// its callback or webhook before the command is looked up or escalated. `None`: the tool
    /// is not asynchronous, and an `Accepted` answer is read as `Ambiguous`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub async_deadline_ms: Option<i64>,
    /// `[tool.async] then = "escalate"`: at the deadline a person decides (STUCK), even where
    /// the tool has a status check; otherwise (`"look"`) the status check is asked.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub async_escalate: bool,
}

/// The default of `policy.max_rate_limited_ms`: five minutes of waiting on `Retry-After` per
/// cycle, enough for the minute GitHub's secondary limit asks for, several times over.
pub const DEFAULT_MAX_RATE_LIMITED_MS: i64 = 300_000;

fn default_max_rate_limited_ms() -> i64 {
    DEFAULT_MAX_RATE_LIMITED_MS
}

fn is_zero(ms: &i64) -> bool {
    *ms == 0
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
            verify_after_refusal: false,
            late_commit_ms: default_late_commit_ms(),
            verify_after_ms: default_verify_after_ms(),
            clock_skew_ms: default_clock_skew_ms(),
            approval_timeout_ms: default_approval_timeout_ms(),
            write_slack_ms: 0,
            idempotency_key_ttl_ms: None,
            max_rate_limited_ms: DEFAULT_MAX_RATE_LIMITED_MS,
            rate_limited_commits_nothing: false,
            async_deadline_ms: None,
            async_escalate: false,
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
        self.dispatch_timeout_ms
            .saturating_add(self.clock_skew_ms)
            .saturating_add(self.write_slack_ms)
    }

    /// These rules with calls needing `slack_ms` more of a lease (its outcome's write) and
    /// leases twice that longer: a lease covers its own write as well as the call and the
    /// outcome's, however slow the ledger is now (the slack is bounded by whoever measured it,
    /// `load::write_slack_ms`). A lease lengthened by the slack alone would leave a call no
    /// more room than the catalog's margin once its write is done: on a ledger slower than
    /// that margin every lease would be given back unused, over and over.
    pub fn with_write_slack(mut self, slack_ms: i64) -> Self {
        let slack_ms = slack_ms.max(0);
        self.lease_ttl_ms = self.lease_ttl_ms.saturating_add(slack_ms.saturating_mul(2));
        self.write_slack_ms = slack_ms;
        self
    }

    /// Whether a resend of the command's key at `at` could reach an upstream that has
    /// forgotten it: the tool declares a key window, the key went out before, and `at` is
    /// within the clock-skew bound of the window's end or past it. Only IDEMPOTENT tools
    /// resend a key on purpose; the others never rely on it.
    pub fn key_forgotten_by(&self, state: &CommandState, at: Timestamp) -> bool {
        match (
            self.semantics,
            self.idempotency_key_ttl_ms,
            state.key_sent_at,
        ) {
            (EffectSemantics::Idempotent, Some(ttl), Some(sent)) => {
                at >= sent.plus_millis(ttl.saturating_sub(self.clock_skew_ms))
            }
            _ => false,
        }
    }

    /// Why a resend was refused, for the record a person reads.
    pub fn key_forgotten_reason(&self, state: &CommandState) -> String {
        format!(
            "the upstream forgets idempotency keys after {} ms and this key first went out at {}: a resend could commit the effect again, so it is not resent without a look",
            self.idempotency_key_ttl_ms.unwrap_or_default(),
            state
                .key_sent_at
                .map_or_else(|| "an unknown time".to_owned(), |at| at.to_string())
        )
    }

    /// How long a compensation job holds its claim on a command: every one of its `calls` (the
    /// extra commits owed and the command's own commit), each tried up to `tries` times with
    /// the backoff between, each try within one call's timeout (half of
    /// `compensation_timeout_ms`), and one more call's time for writing the result. A claim
    /// held for one call only would lapse mid-job, and whoever found the command next (a
    /// sweep, another compensator after a rebalance) would repeat the calls already made.
    pub fn compensation_hold_ms(&self, calls: usize, tries: u32) -> i64 {
        let call = (self.compensation_timeout_ms / 2).max(1);
        let tries = tries.max(1);
        let backoffs: i64 = (0..tries - 1).map(|n| self.backoff_ms(n)).sum();
        let per_call = call
            .saturating_mul(i64::from(tries))
            .saturating_add(backoffs);
        i64::try_from(calls.max(1))
            .unwrap_or(i64::MAX)
            .saturating_mul(per_call)
            .saturating_add(call)
            .max(self.compensation_timeout_ms)
    }

    /// Delay before the `n`-th retry or check (n from 0): base·2ⁿ, capped.
    pub fn backoff_ms(&self, n: u32) -> i64 {
        let factor = 1_i64.checked_shl(n.min(30)).unwrap_or(i64::MAX);
        self.backoff_base_ms
            .saturating_mul(factor)
            .min(self.backoff_max_ms)
    }
}

/// How long a look holds its claim on a command: two of the status check's timeouts, so a
/// sweep does not start the same slow check again while the first still runs; at least a
/// second. Without a check (a resend with the same key, or giving the command to a person) the
/// look is short, and five seconds cover it.
pub fn look_hold_ms(check_timeout_ms: Option<u64>) -> i64 {
    check_timeout_ms
        .map_or(5_000, |timeout| {
            i64::try_from(timeout.saturating_mul(2)).unwrap_or(i64::MAX)
        })
        .max(1_000)
}

/// Whether `state` waits for a look at the world ([`Action::Reconcile`]): an UNKNOWN outcome,
/// or a settled command owing its last look once the extra commits it owes are undone.
pub fn awaits_look(state: &CommandState) -> bool {
    awaited(state) == Some(Action::Reconcile)
}

/// The work a command waits for, by its status: what a sweep republishes when the command
/// stalls, as the action a step would have returned. `None`: it waits for nothing the
/// pipeline does (scheduled, blocked, leased, settled and owing nothing).
pub fn awaited(state: &CommandState) -> Option<Action> {
    use CommandStatus as S;
    match state.status {
        S::Pending | S::Approved => Some(Action::Dispatch),
        S::Unknown => Some(Action::Reconcile),
        S::Compensating => Some(Action::Compensate),
        S::Confirmed if !state.owed_duplicates.is_empty() => Some(Action::CompensateDuplicate),
        S::Confirmed | S::Failed | S::Cancelled | S::Compensated if state.verify_pending => {
            Some(Action::Reconcile)
        }
        S::Scheduled
        | S::Blocked
        | S::Leased
        | S::Confirmed
        | S::Failed
        | S::Stuck
        | S::Cancelled
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => None,
    }
}

/// What a sweep does with a command it finds due: decided from the command's state alone, so
/// the reconciler's sweep only carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepWork {
    /// A time the command waited for has come (its scheduled time, its lease's expiry, its
    /// approval's deadline): this event moves it on.
    Fire(Event),
    /// It waits for a look at the world: the sweep looks itself.
    Look,
    /// It waits for other work of the pipeline: the request for it is sent again
    /// ([`Event::Republish`]).
    Republish,
    /// It waits for nothing the pipeline does (a person, or nothing at all).
    Leave,
}

/// The sweep's work on a due command in `state`.
pub fn sweep_work(state: &CommandState) -> SweepWork {
    use CommandStatus as S;
    match state.status {
        S::Scheduled => SweepWork::Fire(Event::Due),
        S::Leased => SweepWork::Fire(Event::LeaseExpired),
        S::Blocked => SweepWork::Fire(Event::ApprovalExpired),
        _ => match awaited(state) {
            Some(Action::Reconcile) => SweepWork::Look,
            Some(_) => SweepWork::Republish,
            None => SweepWork::Leave,
        },
    }
}

/// Whether a compensation job holds `state` now (`CommandState::claimed_until`): another job
/// must not start its calls, or it repeats the undo calls the first is making.
pub fn job_claimed(state: &CommandState, now: Timestamp) -> bool {
    state.claimed_until.is_some_and(|until| until > now)
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
pub fn look_for(state: &CommandState, rules: &Rules, tool_present: bool, now: Timestamp) -> Look {
    if !tool_present {
        return Look::GiveUp(
            "the tool is no longer in the catalog; a person must find out whether the effect happened"
                .into(),
        );
    }
    if let Some(deadline) = state.awaiting_callback
        && rules.async_escalate
        && state.status == CommandStatus::Unknown
    {
        return Look::GiveUp(format!(
            "the upstream accepted the call but neither its callback nor its webhook came by the deadline ({deadline}); the tool declares that a person decides then"
        ));
    }
    if rules.has_status_check {
        return Look::StatusCheck;
    }
    match (state.status, rules.semantics) {
        (CommandStatus::Unknown, EffectSemantics::Idempotent)
            if rules.key_forgotten_by(state, now) =>
        {
            Look::GiveUp(format!(
                "{}; the tool declares no status check, so a person must find out whether the effect happened",
                rules.key_forgotten_reason(state)
            ))
        }
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
