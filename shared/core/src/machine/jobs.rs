//! One job shape (docs/architecture.md, "One job shape"): what each service job does with a
//! command it read, decided here so that a service only reads, asks, makes its one call to the
//! outside world (a tool, a status check, a compensate endpoint) and hands the plan's event to
//! the runtime's one entry (`Context::run_job`), which writes it and carries out the step.
//!
//! Every plan is a pure function of the command as read (and of what the service read beside
//! it: flow control's answer, a tool's presence), so the runtime can ask it again on the
//! command as it is after a lost compare-and-set. The producer's jobs (an operator's action, an
//! evidence source's event) write the event a person or a source gave, through the same entry.
//! [`cause_of`] names why a request a step leads to is published; [`Job`] names the job for it
//! and for the table test of every job against every status.

use super::*;
use crate::command::Command;
use crate::flow::Held;

/// Why a dispatch was requested (for logs and metrics; handlers do not depend on it). Decided
/// by [`cause_of`] for the steps of the services' jobs; the producer names its own only for the
/// steps a submission or a run's rollback stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    Reserved,
    Due,
    Stale,
    Redispatch,
    Retry,
    Approved,
    Replayed,
    /// A cause a newer build added: the request is handled like any other (the dispatcher
    /// re-reads the command and acts on what the ledger holds), the cause only logged as this.
    #[serde(other)]
    Other,
}

/// The jobs of the dispatcher, the reconciler, the compensator and the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Job {
    /// Lease (or hold, block, deny) and call a command waiting for dispatch ([`plan_dispatch`],
    /// [`plan_call`], [`extend_before_finalize`]).
    Dispatch,
    /// Look at the world for a command waiting for a look ([`plan_look`], [`plan_look_step`]).
    Look,
    /// What a due index item needs ([`plan_sweep`]).
    Sweep,
    /// Undo a COMPENSATING command's commits ([`plan_compensate`]).
    Compensate,
    /// Undo a CONFIRMED command's extra commits ([`plan_settle_duplicate`]).
    SettleDuplicate,
    /// An operator's action on one command: approve (with an edit or by a link), reject,
    /// cancel (or remove), replay, resolve. The plan is the operator's event.
    Operate,
    /// A signed event of an evidence source, applied as a status check's answer
    /// (`Event::Evidence`).
    Evidence,
}

impl Job {
    /// Every job, for tables that must name each.
    pub const ALL: [Job; 7] = [
        Job::Dispatch,
        Job::Look,
        Job::Sweep,
        Job::Compensate,
        Job::SettleDuplicate,
        Job::Operate,
        Job::Evidence,
    ];
}

/// Why the requests of a step that `job` stored by writing `event` are published; `stored`:
/// the state the write left.
pub fn cause_of(job: Job, event: &Event, stored: &CommandState) -> Cause {
    match job {
        // A lease given back, or a call's outcome that asks for another: a retry. Anything
        // else the dispatcher writes (a hold, a block, a denial) hands the command on as it
        // was reserved.
        Job::Dispatch => {
            if matches!(event, Event::Release { .. } | Event::Dispatched { .. }) {
                Cause::Retry
            } else {
                Cause::Reserved
            }
        }
        Job::Look => Cause::Redispatch,
        // A command still waiting for its first dispatch is stale; a lease that expired, or
        // anything else republished, waits for another try of work asked before.
        Job::Sweep => {
            if matches!(event, Event::Due | Event::ApprovalExpired) {
                Cause::Due
            } else if matches!(event, Event::Republish { .. })
                && matches!(
                    stored.status,
                    CommandStatus::Pending | CommandStatus::Approved
                )
            {
                Cause::Stale
            } else {
                Cause::Retry
            }
        }
        Job::Compensate | Job::SettleDuplicate => Cause::Reserved,
        // An approval, or a replay, sends the command to be dispatched for that reason; any
        // other operator action (a rejection, a cancel, a resolution) hands on what the
        // command was reserved for.
        Job::Operate => {
            if matches!(event, Event::Approve { .. }) {
                Cause::Approved
            } else if matches!(event, Event::Replay { .. }) {
                Cause::Replayed
            } else {
                Cause::Reserved
            }
        }
        // Evidence that the effect did not commit sends it again, as a look's answer does.
        Job::Evidence => Cause::Redispatch,
    }
}

// --- Dispatch ---------------------------------------------------------------------------

/// Whether a dispatcher asks flow control about a call of `command` now: only for a command
/// it could call now (waiting for dispatch, not held back by an upstream's `Retry-After`).
pub fn asks_flow_control(command: &Command, rules: &Rules, now: Timestamp) -> bool {
    command.awaits_dispatch() && !rate_limit_holds(&command.state, rules, now)
}

/// What a dispatcher does once it holds what its lease write left ([`plan_call`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallPlan {
    /// Call the tool now, under the lease held.
    Call,
    /// Give the lease back unused first (`Event::Release`): too little of it is left for the
    /// whole call, so the sweep could take it for expired while the call is in flight.
    Release(Event),
    /// Not leased: the write held, blocked or denied it; nothing to call.
    Leave,
}

/// Decides [`CallPlan`] for a command a dispatcher's lease write (or its reservation) left in
/// `state`, at `now` (right before the call: the lease write and its retries took time).
pub fn plan_call(state: &CommandState, rules: &Rules, now: Timestamp) -> CallPlan {
    if state.status != CommandStatus::Leased {
        return CallPlan::Leave;
    }
    if lease_usable(state, rules, now) {
        CallPlan::Call
    } else {
        CallPlan::Release(Event::Release {
            epoch: state.lease.epoch,
            reason: "too little of the lease left for the whole call".into(),
        })
    }
}

/// The extension of the lease `epoch` to write before a call's outcome, when that write at
/// the ledger's pace now (`write_ms`) could outlive it (`load::extend_before_write`): a lease
/// that lapsed under its holder's write is taken for expired by the sweep and reconciled,
/// which costs several more writes for an outcome that was known. `None`: no need.
pub fn extend_before_finalize(
    state: &CommandState,
    rules: &Rules,
    epoch: LeaseEpoch,
    write_ms: i64,
    now: Timestamp,
) -> Option<Event> {
    crate::load::extend_before_write(state, rules, now, write_ms)
        .map(|to| Event::ExtendLease { epoch, to })
}

// --- Look -------------------------------------------------------------------------------

/// What a look job reads beside the command.
#[derive(Debug, Clone, Copy)]
pub struct LookRead<'a> {
    /// The tool is still in the catalog.
    pub tool_present: bool,
    /// The tool's status check's timeout, when it declares one.
    pub check_timeout_ms: Option<u64>,
    /// Flow control keeps calls of the tool's upstream back now (paused, breaker open).
    pub gate: Option<&'a Held>,
}

/// What a look job does with a command before it looks ([`plan_look`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookPlan {
    /// Not waiting for a look, or not due yet (backing off, waiting out the settle interval,
    /// or another look holds it): the sweep brings it back when due.
    Leave,
    /// Put the look back until flow control lets it go (`Event::Hold`): no check is spent on
    /// an upstream that is paused or whose breaker is open.
    Hold(Event),
    /// Take the look (`Event::Claim`), then look ([`plan_look_step`]).
    Claim(Event),
}

/// Whether a look at a command standing as `state` first reads the evidence held for it (a
/// signed webhook or callback that came while it was in flight): only an UNKNOWN outcome is
/// settled from it; a settled command owing its last look asks the upstream itself.
pub fn takes_held_evidence(state: &CommandState) -> bool {
    state.status == CommandStatus::Unknown
}

/// Decides [`LookPlan`] for `command` at `now`.
pub fn plan_look(command: &Command, rules: &Rules, read: LookRead<'_>, now: Timestamp) -> LookPlan {
    let state = &command.state;
    if !awaits_look(state) || state.due_at.is_some_and(|at| at > now) {
        return LookPlan::Leave;
    }
    if let Some(held) = read.gate
        && read.tool_present
        && state.status == CommandStatus::Unknown
        && look_for(state, rules, true, now) == Look::StatusCheck
    {
        // Spread per command, so the looks a pause held do not all go at its end.
        let jitter =
            crate::flow::jitter_ms(command.command_key.as_str(), held.until.millis_since(now));
        return LookPlan::Hold(Event::Hold {
            epoch: None,
            until: held.until.plus_millis(jitter),
            cause: held.cause,
            reason: held.reason.clone(),
        });
    }
    LookPlan::Claim(Event::Claim {
        job: ClaimJob::Look,
        hold_ms: look_hold_ms(read.check_timeout_ms),
    })
}

/// Which look a claimed command gets ([`plan_look_step`]). `T`: the caller's handle on the
/// tool, handed back for the check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookStep<T> {
    /// Ask the tool's status check; its answer is the event to write.
    StatusCheck(T),
    /// Write this event without asking anyone (a same-key retry, or giving up to a person).
    Write(Event),
}

/// Decides [`LookStep`] for a claimed command (evidence held for it answers before this, see
/// the reconciler). `tool`: the tool, if it is still in the catalog.
pub fn plan_look_step<T>(
    state: &CommandState,
    rules: &Rules,
    tool: Option<T>,
    now: Timestamp,
) -> LookStep<T> {
    match (look_for(state, rules, tool.is_some(), now), tool) {
        (Look::StatusCheck, Some(tool)) => LookStep::StatusCheck(tool),
        (Look::RetrySameKey, _) => LookStep::Write(Event::RetrySameKey),
        (Look::GiveUp(reason), _) => LookStep::Write(Event::GiveUp { reason }),
        // `look_for` gives up on a tool gone from the catalog before it asks for a check.
        (Look::StatusCheck, None) => LookStep::Write(Event::GiveUp {
            reason: "the tool is no longer in the catalog".into(),
        }),
    }
}

/// The look's result `event` to write on the command as it is now, fenced by the epoch of the
/// claim it was made under: `None` when the command no longer waits for a look or another
/// claim (another look, a rollback's mark) moved the epoch on.
pub fn look_result(state: &CommandState, claimed: LeaseEpoch, event: &Event) -> Option<Event> {
    (awaits_look(state) && state.lease.epoch == claimed).then(|| event.clone())
}

// --- Sweep ------------------------------------------------------------------------------

/// How long a republished request gets to be handled before the next sweep repeats it: five
/// sweep intervals, at least five seconds.
pub fn republish_grace_ms(sweep_interval_ms: u64) -> i64 {
    i64::try_from(sweep_interval_ms.saturating_mul(5))
        .unwrap_or(i64::MAX)
        .max(5_000)
}

/// What a sweep does with an item of the due index ([`plan_sweep`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepPlan {
    /// A time the command waited for has come: write this event (`Event::Due`,
    /// `Event::LeaseExpired`, `Event::ApprovalExpired`).
    Fire(Event),
    /// It waits for a look: the sweep looks itself ([`plan_look`]).
    Look,
    /// It waits for other work of the pipeline: write this `Event::Republish`, whose step
    /// names the request to send again.
    Republish(Event),
    /// Not due, or waiting for nothing the pipeline does.
    Leave,
}

/// Decides [`SweepPlan`] for a command in `state` found in the due index at `now`; `grace_ms`:
/// [`republish_grace_ms`].
pub fn plan_sweep(state: &CommandState, grace_ms: i64, now: Timestamp) -> SweepPlan {
    if state.due_at.is_none_or(|at| at > now) {
        return SweepPlan::Leave;
    }
    match sweep_work(state) {
        SweepWork::Fire(event) => SweepPlan::Fire(event),
        SweepWork::Look => SweepPlan::Look,
        SweepWork::Republish => SweepPlan::Republish(Event::Republish { grace_ms }),
        SweepWork::Leave => SweepPlan::Leave,
    }
}

// --- Compensation -----------------------------------------------------------------------

/// Whether a command waits for its compensate calls (COMPENSATING).
pub fn awaits_compensation(state: &CommandState) -> bool {
    awaited(state) == Some(Action::Compensate)
}

/// The claim a compensation job takes on a COMPENSATING command before its calls: for the
/// whole job (every owed extra commit and the command's own), so one job at a time makes the
/// calls. `None`: it does not wait for compensation. (Whose turn it is in its run is
/// [`next_to_compensate`].)
pub fn plan_compensate(state: &CommandState, rules: &Rules) -> Option<Event> {
    awaits_compensation(state).then(|| Event::Claim {
        job: ClaimJob::Compensate,
        hold_ms: rules.compensation_hold_ms(state.owed_duplicates.len() + 1, 1),
    })
}

/// One compensate call of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UndoTarget {
    /// An extra commit a status check found (its external reference).
    ExtraCommit(String),
    /// The command's own commit.
    OwnCommit,
}

/// The calls a claimed COMPENSATING command's job makes, in order: the extra commits not yet
/// undone first (undoing the effect means undoing every commit of it), then its own. `Err`:
/// the outcome to write without a call (its tool left the catalog). `T`: the caller's handle
/// on the tool, handed back.
pub fn compensation_calls<T>(
    command: &Command,
    tool: Option<T>,
) -> Result<(T, Vec<UndoTarget>), CompensationOutcome> {
    let Some(tool) = tool else {
        return Err(tool_gone(command));
    };
    let mut targets: Vec<UndoTarget> = command
        .state
        .owed_duplicates
        .iter()
        .cloned()
        .map(UndoTarget::ExtraCommit)
        .collect();
    targets.push(UndoTarget::OwnCommit);
    Ok((tool, targets))
}

/// Folds the answers of a compensation job's calls into the one outcome it writes: the own
/// commit's, unless an extra commit was not undone (the last such answer, named).
pub fn fold_compensation(answers: Vec<(UndoTarget, CompensationOutcome)>) -> CompensationOutcome {
    let mut failed_extra = None;
    let mut own = None;
    for (target, outcome) in answers {
        match (target, outcome) {
            (UndoTarget::ExtraCommit(_), CompensationOutcome::Done { .. }) => {}
            (UndoTarget::ExtraCommit(extra), other) => failed_extra = Some((extra, other)),
            (UndoTarget::OwnCommit, outcome) => own = Some(outcome),
        }
    }
    let own = own.unwrap_or_else(|| CompensationOutcome::Retry {
        reason: "the command's own commit was not called".into(),
        retry_after_ms: None,
    });
    match failed_extra {
        None | Some((_, CompensationOutcome::Done { .. })) => own,
        Some((
            extra,
            CompensationOutcome::Retry {
                reason,
                retry_after_ms,
            },
        )) => CompensationOutcome::Retry {
            reason: format!("extra commit {extra}: {reason}"),
            retry_after_ms,
        },
        Some((extra, CompensationOutcome::Impossible { reason })) => {
            CompensationOutcome::Impossible {
                reason: format!("extra commit {extra}: {reason}"),
            }
        }
    }
}

/// The compensation job's result to write on the command as it is now, under the epoch of the
/// claim it was made under (the core refuses it if that epoch is gone); `None` when the
/// command no longer waits for compensation.
pub fn compensated_event(
    state: &CommandState,
    claimed: LeaseEpoch,
    outcome: &CompensationOutcome,
) -> Option<Event> {
    awaits_compensation(state).then(|| Event::Compensated {
        epoch: claimed,
        outcome: outcome.clone(),
    })
}

/// The claim a clean-up of a CONFIRMED command's extra commits takes before its calls: one
/// call per extra commit owed (a transient failure is not retried in the job: it is written,
/// with the attempt and a due time, and the sweep brings the clean-up back). `None`: no
/// clean-up is owed.
pub fn plan_settle_duplicate(state: &CommandState, rules: &Rules) -> Option<Event> {
    (awaited(state) == Some(Action::CompensateDuplicate)).then(|| Event::Claim {
        job: ClaimJob::UndoDuplicates,
        hold_ms: rules.compensation_hold_ms(state.owed_duplicates.len(), 1),
    })
}

/// The extra commits a claimed clean-up undoes, from the ledger's list (a request may be
/// older than a look retried since). `Err`: the outcome to write without a call.
pub fn duplicate_calls<T>(
    command: &Command,
    tool: Option<T>,
) -> Result<(T, Vec<String>), CompensationOutcome> {
    let Some(tool) = tool else {
        return Err(tool_gone(command));
    };
    if command.state.owed_duplicates.is_empty() {
        return Err(CompensationOutcome::Impossible {
            reason: "the status check named no extra commit to undo".into(),
        });
    }
    Ok((tool, command.state.owed_duplicates.clone()))
}

/// Folds the answers of a clean-up's calls into its `Event::DuplicateSettled`, under the epoch
/// of the claim it was made under: done when every extra commit was undone, else the last
/// failure (named); the extra commits undone are listed, so a retry does not undo them again.
pub fn duplicates_settled(
    claimed: LeaseEpoch,
    answers: Vec<(String, CompensationOutcome)>,
) -> Event {
    let mut undone = Vec::new();
    let mut references = Vec::new();
    let mut failure = None;
    for (extra, outcome) in answers {
        match outcome {
            CompensationOutcome::Done { reference } => {
                references.push(format!("{extra} -> {}", reference.unwrap_or_default()));
                undone.push(extra);
            }
            other => failure = Some((extra, other)),
        }
    }
    let outcome = match failure {
        None | Some((_, CompensationOutcome::Done { .. })) => CompensationOutcome::Done {
            reference: Some(references.join(", ")),
        },
        Some((extra, CompensationOutcome::Impossible { reason })) => {
            CompensationOutcome::Impossible {
                reason: format!("{extra}: {reason}"),
            }
        }
        Some((
            extra,
            CompensationOutcome::Retry {
                reason,
                retry_after_ms,
            },
        )) => CompensationOutcome::Retry {
            reason: format!("{extra}: {reason}"),
            retry_after_ms,
        },
    };
    Event::DuplicateSettled {
        epoch: claimed,
        outcome,
        undone,
    }
}

fn tool_gone(command: &Command) -> CompensationOutcome {
    CompensationOutcome::Impossible {
        reason: format!("tool {} is no longer in the catalog", command.tool),
    }
}
