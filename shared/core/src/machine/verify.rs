//! The last look at a settled command: a CONFIRMED one for a duplicate, a FAILED or CANCELLED
//! one (decided on absence) for a commit that landed after all, a COMPENSATED one for a
//! commit that still stands (see `settle` for when a last look is owed).

use serde_json::Value;

use super::settle::{others_than_own, stuck};
use super::undo::{owe_duplicates, undo_commit};
use super::{Action, Rules, Step};
use crate::command::{CommandState, CommandStatus, Observation};
use crate::time::Timestamp;

/// The last look at a settled command answered: a CONFIRMED one for a duplicate, a FAILED or
/// CANCELLED one (decided on absence, or refused) for a commit that landed after all, a
/// COMPENSATED one for a commit that still stands ([`verified_undone`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn verified(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    observation: Observation,
    external_ref: &Option<String>,
    evidence: &Value,
    extra_refs: &[String],
    now: Timestamp,
) -> Step {
    let from = state.status;
    next.checks = state.checks + 1;
    let step = |next: CommandState, actions: Vec<Action>, reason: &str| Step {
        from,
        state: next,
        actions,
        reason: reason.to_owned(),
        evidence: evidence.clone(),
        quiet: false,
    };
    if from == CommandStatus::Compensated {
        return verified_undone(
            next,
            state,
            rules,
            observation,
            external_ref,
            evidence,
            extra_refs,
            now,
        );
    }
    let settled_unsent = from != CommandStatus::Confirmed;
    match observation {
        Observation::Absent if settled_unsent => {
            end_look(&mut next);
            step(next, vec![], "verified: nothing committed")
        }
        Observation::Present | Observation::Duplicate if settled_unsent => {
            // Decided on absence, yet it committed (a late attempt, a lagging lookup).
            let (own, others) = match others_than_own(state, external_ref, extra_refs) {
                Ok(split) => split,
                Err(why) => {
                    next.verify_pending = false;
                    let mut step = stuck(next, from, why);
                    step.evidence = evidence.clone();
                    return step;
                }
            };
            next.external_ref = own.or(next.external_ref);
            let mut undone = undo_commit(
                next,
                from,
                rules,
                &others,
                format!("verification found a commit of a {from} command: undo it"),
                now,
            );
            undone.evidence = evidence.clone();
            undone
        }
        Observation::Present | Observation::Duplicate => {
            end_look(&mut next);
            match others_than_own(state, external_ref, extra_refs) {
                Ok((_, others)) if others.is_empty() && observation == Observation::Present => {
                    step(next, vec![], "verified: the commit is there once")
                }
                Ok((_, others)) => {
                    let verified = step(next, vec![], "verified: duplicate commit");
                    owe_duplicates(verified, rules, &others, now)
                }
                Err(why) => {
                    next.escalated = true;
                    step(
                        next,
                        vec![Action::Escalate {
                            reason: why.clone(),
                        }],
                        &why,
                    )
                }
            }
        }
        Observation::Absent | Observation::Inconclusive if next.checks >= rules.max_checks => {
            end_look(&mut next);
            next.escalated = true;
            let reason = format!(
                "the {from} command could not be verified after {} looks ({observation})",
                rules.max_checks
            );
            step(
                next,
                vec![Action::Escalate {
                    reason: reason.clone(),
                }],
                &reason,
            )
        }
        Observation::Absent | Observation::Inconclusive => {
            look_again(&mut next, state, rules, now);
            step(next, vec![], "verification: look again later")
        }
    }
}

/// Ends the last look, whatever it found. An extra commit's clean-up still owed keeps its due
/// time: the look is done, the clean-up is not.
pub(super) fn end_look(next: &mut CommandState) {
    next.verify_pending = false;
    if next.owed_duplicates.is_empty() {
        next.due_at = None;
    }
}

/// Puts the next look off by the check backoff (at least the settle window), never putting
/// off a clean-up still owed.
fn look_again(next: &mut CommandState, state: &CommandState, rules: &Rules, now: Timestamp) {
    let later = now.plus_millis(rules.backoff_ms(state.checks).max(rules.settle_ms));
    next.due_at = Some(match state.due_at {
        Some(owed) if !state.owed_duplicates.is_empty() => owed.min(later),
        _ => later,
    });
}

/// The last look at a COMPENSATED command: its own commit is undone, so any commit the check
/// still shows (a second one behind one 2xx, an earlier attempt that landed late) stands
/// against a run that was rolled back — a person must see it.
#[allow(clippy::too_many_arguments)]
fn verified_undone(
    mut next: CommandState,
    state: &CommandState,
    rules: &Rules,
    observation: Observation,
    external_ref: &Option<String>,
    evidence: &Value,
    extra_refs: &[String],
    now: Timestamp,
) -> Step {
    let from = state.status;
    let step = |next: CommandState, actions: Vec<Action>, reason: String| Step {
        from,
        state: next,
        actions,
        reason,
        evidence: evidence.clone(),
        quiet: false,
    };
    match observation {
        Observation::Absent => {
            end_look(&mut next);
            step(next, vec![], "verified: nothing of it stands".into())
        }
        Observation::Present | Observation::Duplicate => {
            end_look(&mut next);
            next.escalated = true;
            let seen: Vec<&String> = external_ref.iter().chain(extra_refs).collect();
            let why = format!("compensated, yet commits still stand upstream: {seen:?}");
            step(
                next,
                vec![Action::Escalate {
                    reason: why.clone(),
                }],
                why,
            )
        }
        Observation::Inconclusive if next.checks >= rules.max_checks => {
            end_look(&mut next);
            next.escalated = true;
            let why = format!(
                "the undone command could not be verified after {} looks",
                rules.max_checks
            );
            step(
                next,
                vec![Action::Escalate {
                    reason: why.clone(),
                }],
                why,
            )
        }
        Observation::Inconclusive => {
            look_again(&mut next, state, rules, now);
            step(next, vec![], "verification: look again later".into())
        }
    }
}
