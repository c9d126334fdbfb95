//! A new command's reservation, as the producer carries it out: when a scheduled submission
//! runs, and what the stored command asks for (a dispatch request, or nothing yet). Decided
//! here, so the producer neither matches on the status it recorded nor does time arithmetic.

use super::{Action, Step};
use crate::command::{CommandState, CommandStatus};
use crate::time::Timestamp;
use serde_json::Value;

/// When a submission asks to run: after a delay (milliseconds), or at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    After(u64),
    At(Timestamp),
}

/// Why a submission's schedule is refused: the field that asks for it and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleRefusal {
    /// `delay_ms` or `not_before`.
    pub field: &'static str,
    pub message: &'static str,
}

/// The command's `not_before`, for a submission at `now` with `schedule`: at most `max_ms`
/// ahead (a delay is checked against it when the submission is read; a time, here).
pub fn not_before(
    schedule: Option<Schedule>,
    now: Timestamp,
    max_ms: u64,
) -> Result<Option<Timestamp>, ScheduleRefusal> {
    match schedule {
        None => Ok(None),
        Some(Schedule::After(delay)) => {
            let delay = i64::try_from(delay).map_err(|_| ScheduleRefusal {
                field: "delay_ms",
                message: "delay_ms is too large",
            })?;
            Ok(Some(now.plus_millis(delay)))
        }
        Some(Schedule::At(at)) => {
            if at.millis_since(now) > i64::try_from(max_ms).unwrap_or(i64::MAX) {
                return Err(ScheduleRefusal {
                    field: "not_before",
                    message: "not_before may be at most one year ahead",
                });
            }
            Ok(Some(at))
        }
    }
}

/// Whether a command recorded as `state` asks for a dispatch request at once: PENDING, or
/// LEASED by its own reservation. A submission takes room in the dispatchers' queue for that
/// request before it reserves (asked of the command as it is to be recorded), and publishes it
/// once it is stored ([`plan_reservation`], asked of the command as stored: a budget may have
/// recorded it BLOCKED instead).
pub fn reservation_requests_dispatch(state: &CommandState) -> bool {
    use CommandStatus as S;
    match state.status {
        S::Pending | S::Leased => true,
        // Waits for its time (the sweep makes it due), for a person, or was ended by its
        // policy: nothing to request now.
        S::Scheduled
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
        | S::NoCompensation => false,
    }
}

/// The reservation of a command stored as `state`, as a step the runtime carries out
/// (`Context::carry_out`): the command stays as recorded, the step is quiet (the reservation
/// wrote its own audit record), and its actions are the requests it asks for.
pub fn plan_reservation(state: &CommandState) -> Step {
    let actions = if reservation_requests_dispatch(state) {
        vec![Action::Dispatch]
    } else {
        Vec::new()
    };
    Step {
        from: state.status,
        state: state.clone(),
        actions,
        reason: "reserved".to_owned(),
        evidence: Value::Null,
        quiet: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_reservation_requests_a_dispatch_only_for_a_command_that_waits_for_one_now() {
        for status in CommandStatus::ALL {
            let mut state = CommandState::reserved(at(0), None, 1_000);
            state.status = status;
            let step = plan_reservation(&state);
            let expected = match status {
                CommandStatus::Pending | CommandStatus::Leased => vec![Action::Dispatch],
                _ => vec![],
            };
            assert_eq!(step.actions, expected, "{status}");
            assert_eq!(reservation_requests_dispatch(&state), !expected.is_empty());
            assert!(
                step.quiet,
                "a reservation's step writes no second audit record"
            );
            assert_eq!((step.from, step.to()), (status, status), "the status stays");
        }
    }

    #[test]
    fn a_delay_runs_after_now_and_a_time_at_most_the_bound_ahead() {
        let now = at(1_000);
        assert_eq!(not_before(None, now, 10), Ok(None));
        assert_eq!(
            not_before(Some(Schedule::After(500)), now, 10),
            Ok(Some(at(1_500))),
            "a delay is bounded when the submission is read, not here"
        );
        assert_eq!(
            not_before(Some(Schedule::At(at(1_010))), now, 10),
            Ok(Some(at(1_010)))
        );
        assert_eq!(
            not_before(Some(Schedule::At(at(500))), now, 10),
            Ok(Some(at(500))),
            "a time in the past is due at once"
        );
        let refused = not_before(Some(Schedule::At(at(1_011))), now, 10).expect_err("too far");
        assert_eq!(refused.field, "not_before");
        let refused =
            not_before(Some(Schedule::After(u64::MAX)), now, 10).expect_err("no such delay");
        assert_eq!(refused.field, "delay_ms");
    }
}
