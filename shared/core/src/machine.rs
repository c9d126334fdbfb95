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

mod event;
mod jobs;
mod lease;
mod reservation;
mod rules;
mod run_rollback;
mod waiting;

pub use event::*;
pub use jobs::*;
pub use lease::*;
pub use rate_limit::{rate_limit_holds, rate_limited_wait_ms};
pub use reservation::*;
pub use rules::*;
pub use run_rollback::*;
pub use waiting::*;

/// Computes the transition of `state` under `event` at `now`. Pure and total.
///
/// A dispatcher into one function per event, grouped by family: `lifecycle` (scheduling,
/// leases, claims and due-time moves), `outcomes` (what the upstream did, or what a look found), `people` (an operator's
/// approvals, cancels, resolutions and replays) and `undoing` (rollbacks and compensations).
/// Each of them still matches every status.
pub fn apply(
    state: &CommandState,
    rules: &Rules,
    event: &Event,
    now: Timestamp,
) -> Result<Step, Refusal> {
    if let Some(operator) = event.operator()
        && operator.reason.trim().is_empty()
    {
        return Err(Refusal::ReasonRequired);
    }
    let a = Apply {
        state,
        rules,
        event,
        now,
    };
    let mut step = match event {
        Event::Due => lifecycle::due(&a),
        Event::Lease { owner } => lifecycle::lease(&a, owner),
        Event::ExtendLease { epoch, to } => lifecycle::extend_lease(&a, epoch, *to),
        Event::Claim { job, hold_ms } => lifecycle::claim(&a, *job, *hold_ms),
        Event::Republish { grace_ms } => lifecycle::republish(&a, *grace_ms),
        Event::Release { epoch, reason } => lifecycle::release(&a, epoch, reason),
        Event::Hold {
            epoch,
            until,
            cause,
            reason,
        } => lifecycle::hold(&a, epoch.as_ref(), *until, *cause, reason),
        Event::Block { reason, epoch } | Event::Deny { reason, epoch } => {
            lifecycle::block_or_deny(&a, reason, epoch)
        }
        Event::Dispatched {
            epoch,
            outcome,
            sent_at,
        } => outcomes::on_dispatched(&a, epoch, outcome, sent_at),
        Event::LeaseExpired => lifecycle::lease_expired(&a),
        Event::Observed {
            observation,
            external_ref,
            evidence,
            extra_refs,
            retry_after_ms,
            record,
        } => match rate_limit::look_later(&a, *observation, *retry_after_ms, evidence) {
            Some(step) => Ok(step),
            None => outcomes::on_observed(
                &a,
                observation,
                external_ref,
                evidence,
                extra_refs,
                record.as_ref(),
            ),
        },
        Event::Evidence {
            source,
            event_id,
            outcome,
            external_ref,
            evidence: kept,
        } => evidence::on_evidence(&a, source, event_id, *outcome, external_ref, kept),
        Event::RetrySameKey => outcomes::retry_same_key(&a),
        Event::GiveUp { reason } => outcomes::give_up(&a, reason),
        Event::Approve {
            operator,
            policy_version,
            revision,
        } => people::approve(&a, operator, policy_version, revision.as_deref()),
        Event::Reject { operator } => people::reject(&a, operator),
        Event::ApprovalExpired => people::approval_expired(&a),
        Event::MarkRollback { operator } => undoing::mark_rollback(&a, operator),
        Event::Cancel { operator } => people::cancel(&a, operator),
        Event::Rollback { operator } => undoing::rollback(&a, operator),
        Event::Compensated { epoch, outcome } => undoing::on_compensated(&a, epoch, outcome),
        Event::DuplicateSettled {
            epoch,
            outcome,
            undone,
        } => undoing::duplicate_settled(&a, epoch, outcome, undone),
        Event::Resolve {
            operator,
            resolution,
            evidence,
        } => people::resolve(&a, operator, resolution, evidence),
        Event::Replay { operator, evidence } => people::replay(&a, operator, evidence),
    }?;
    // An accepted call's wait ends with the UNKNOWN it waited in.
    if step.state.status != CommandStatus::Unknown {
        step.state.awaiting_callback = None;
    }
    Ok(step)
}

/// What every event's function reads: the command's state, its tool's rules, the event and
/// the time.
#[derive(Clone, Copy)]
struct Apply<'a> {
    state: &'a CommandState,
    rules: &'a Rules,
    event: &'a Event,
    now: Timestamp,
}

impl Apply<'_> {
    /// The state to edit into the next one, stamped with the time.
    fn next(&self) -> CommandState {
        let mut next = self.state.clone();
        next.updated_at = self.now;
        next
    }

    fn step(
        &self,
        next: CommandState,
        actions: Vec<Action>,
        reason: String,
        evidence: Value,
    ) -> Step {
        Step {
            from: self.state.status,
            state: next,
            actions,
            reason,
            evidence,
            quiet: false,
        }
    }

    /// A quiet step: the status kept, no audit record (`Step::quiet`).
    fn quiet_step(&self, next: CommandState, actions: Vec<Action>, reason: String) -> Step {
        Step {
            quiet: true,
            ..self.step(next, actions, reason, Value::Null)
        }
    }

    /// The event is not one the command's status takes.
    fn refuse(&self) -> Refusal {
        Refusal::NotAllowed {
            status: self.state.status,
            event: self.event.kind(),
        }
    }
}

mod accepted;
mod evidence;
mod lifecycle;
mod outcomes;
mod people;
mod rate_limit;
mod settle;
mod undo;
mod undoing;
mod verify;
use settle::{
    cancelled, cancelled_unsent, check_epoch, check_holder, dispatched, enter_unknown,
    is_empty_evidence, observed, released, stuck,
};
use undo::{compensated, undo_commit};
use verify::verified;

#[cfg(test)]
mod async_paths;
#[cfg(test)]
mod fault_paths;
#[cfg(test)]
mod job_table;
#[cfg(test)]
mod key_window;
#[cfg(test)]
mod retry_after;
#[cfg(test)]
mod tests;
