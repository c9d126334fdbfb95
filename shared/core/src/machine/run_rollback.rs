//! A run's rollback beyond each command's own step (`rollback_event`): which commands count as
//! in flight when it begins, and the one job it asks of the compensator.

use serde::{Deserialize, Serialize};

use crate::command::{CommandState, CommandStatus};

/// Whether a command counts as in flight when its run is rolled back: leased, UNKNOWN, STUCK,
/// or retrying after an ambiguous attempt. The rollback records them (its audit record's
/// evidence and its answer) and marks them, so that a commit they turn out to have made is
/// compensated.
pub fn in_flight_at_rollback(state: &CommandState) -> bool {
    use CommandStatus as S;
    match state.status {
        S::Leased | S::Unknown | S::Stuck => true,
        S::Scheduled
        | S::Pending
        | S::Blocked
        | S::Approved
        | S::Confirmed
        | S::Failed
        | S::Cancelled
        | S::Compensating
        | S::Compensated
        | S::CompensationFailed
        | S::NoCompensation => state.outcome_unknown,
    }
}

/// A request about a whole run, as a run's plan names it; the runtime's table
/// (`sluice_runtime::pipeline::run_request_for`) turns it into its topic and message, as
/// `request_for` does a command's [`super::Action`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunAction {
    /// Compensate the run's COMPENSATING commands, last in the journal first, in one job;
    /// `reason` is the operator's, as they gave it.
    Rollback { actor: String, reason: String },
}

/// The job a run's rollback asks for once its commands are moved: `None` when the run was
/// rolled back before (`already`) and this call moved nothing (nothing was written, so nothing
/// is sent); otherwise the rollback job, which also finishes what an earlier rollback cut
/// short left.
pub fn plan_rollback_job(
    already: bool,
    moved_any: bool,
    actor: &str,
    reason: &str,
) -> Option<RunAction> {
    (!already || moved_any).then(|| RunAction::Rollback {
        actor: actor.to_owned(),
        reason: reason.to_owned(),
    })
}

/// Whether a command is part of its run's rollback, as the rollback's progress lists it: being
/// compensated, compensated, failed to be, or with nothing to undo it; or carrying a
/// compensation's record.
pub fn in_rollback(state: &CommandState) -> bool {
    use CommandStatus as S;
    match state.status {
        S::Compensating | S::Compensated | S::CompensationFailed | S::NoCompensation => true,
        S::Scheduled
        | S::Pending
        | S::Blocked
        | S::Approved
        | S::Leased
        | S::Confirmed
        | S::Failed
        | S::Unknown
        | S::Stuck
        | S::Cancelled => state.compensation.is_some(),
    }
}

/// Whether a run's rollback is done: none of its commands (`states`) is still being
/// compensated.
pub fn rollback_done<'a>(mut states: impl Iterator<Item = &'a CommandState>) -> bool {
    !states.any(|state| state.status == CommandStatus::Compensating)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    #[test]
    fn in_flight_are_the_leased_unknown_stuck_and_those_retrying_an_ambiguous_attempt() {
        for status in CommandStatus::ALL {
            let mut state = CommandState::reserved(Timestamp::from_millis(0), None, 1_000);
            state.status = status;
            let expected = matches!(
                status,
                CommandStatus::Leased | CommandStatus::Unknown | CommandStatus::Stuck
            );
            assert_eq!(in_flight_at_rollback(&state), expected, "{status}");
            state.outcome_unknown = true;
            assert!(
                in_flight_at_rollback(&state),
                "{status} with an ambiguous attempt"
            );
        }
    }

    #[test]
    fn the_rollback_job_is_sent_unless_a_repeated_rollback_moved_nothing() {
        let job = Some(RunAction::Rollback {
            actor: "ops".into(),
            reason: "bad run".into(),
        });
        assert_eq!(plan_rollback_job(false, false, "ops", "bad run"), job);
        assert_eq!(plan_rollback_job(false, true, "ops", "bad run"), job);
        assert_eq!(
            plan_rollback_job(true, true, "ops", "bad run"),
            job,
            "what a rollback cut short left is finished"
        );
        assert_eq!(plan_rollback_job(true, false, "ops", "bad run"), None);
    }

    #[test]
    fn a_rollback_is_done_once_nothing_is_compensating() {
        let state = |status| {
            let mut state = CommandState::reserved(Timestamp::from_millis(0), None, 1_000);
            state.status = status;
            state
        };
        let run = [
            state(CommandStatus::Compensated),
            state(CommandStatus::Cancelled),
        ];
        assert!(rollback_done(run.iter()));
        assert!(rollback_done([].iter()));
        let going = [
            state(CommandStatus::Compensated),
            state(CommandStatus::Compensating),
        ];
        assert!(!rollback_done(going.iter()));
        for status in CommandStatus::ALL {
            let involved = matches!(
                status,
                CommandStatus::Compensating
                    | CommandStatus::Compensated
                    | CommandStatus::CompensationFailed
                    | CommandStatus::NoCompensation
            );
            assert_eq!(in_rollback(&state(status)), involved, "{status}");
        }
        let mut undone_before = state(CommandStatus::Failed);
        undone_before.compensation = Some(Box::new(crate::command::CompensationInfo::started(
            Timestamp::from_millis(0),
        )));
        assert!(in_rollback(&undone_before), "a compensation's record");
    }
}
