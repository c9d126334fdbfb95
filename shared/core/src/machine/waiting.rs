//! What the API's waits and gates ask of a command: whether a waiter answers now, whether a
//! callback's attempt is still being recorded, whether a person may approve it. Each is a
//! rule about the command's status or its times, so it lives here rather than in the API.

use crate::audit::AuditRecord;
use crate::command::{CommandState, CommandStatus};
use crate::ids::CommandKey;
use crate::time::Timestamp;

/// Whether a waiter holding an answer (`Prefer: wait`, `?wait=`) answers now with the command
/// as `state`, `left_ms` before its wait ends (`now` the ledger's clock): once the command has
/// settled, or when it is SCHEDULED and not due before the wait ends (nothing will happen
/// meanwhile).
pub fn wait_ends(state: &CommandState, now: Timestamp, left_ms: i64) -> bool {
    use CommandStatus as S;
    if state.status.is_settled() {
        return true;
    }
    match state.status {
        S::Scheduled => state
            .due_at
            .is_some_and(|due| due.millis_since(now) > left_ms),
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
        | S::NoCompensation => false,
    }
}

/// Whether the attempt that holds lease `epoch` is still in flight (LEASED under that epoch):
/// a callback URL given to it waits while its answer is recorded.
pub fn attempt_in_flight(state: &CommandState, epoch: u64) -> bool {
    use CommandStatus as S;
    match state.status {
        S::Leased => state.lease.epoch.get() == epoch,
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
        | S::NoCompensation => false,
    }
}

/// Whether the command waits for a person's approval (BLOCKED): only then are its arguments
/// edited, or an approval link given for it or used.
pub fn awaits_approval(state: &CommandState) -> bool {
    approval_awaited_in(state.status)
}

/// Whether a command in `status` waits for a person's approval.
fn approval_awaited_in(status: CommandStatus) -> bool {
    use CommandStatus as S;
    match status {
        S::Blocked => true,
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
        | S::NoCompensation => false,
    }
}

/// Whether news of a command written at `updated_at` (a copy this process stored, a lifecycle
/// event) is as new as the command a waiter holds (`held`) or newer: older news is not acted on.
pub fn news_is_current(updated_at: Timestamp, held: &CommandState) -> bool {
    updated_at >= held.updated_at
}

/// Whether news of a command written at `updated_at` is of the command held (`held`) or older:
/// the held command says as much, and is kept.
pub fn news_adds_nothing(updated_at: Timestamp, held: &CommandState) -> bool {
    updated_at <= held.updated_at
}

/// Whether a command about to be recorded as `state` may be recorded BLOCKED for a person past
/// a budget (`on_exceed = "require_approval"`): only a PENDING one; one scheduled for later
/// cannot wait for a person now, and is refused instead.
pub fn may_block_past_budget(state: &CommandState) -> bool {
    use CommandStatus as S;
    match state.status {
        S::Pending => true,
        S::Scheduled
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
        | S::NoCompensation => false,
    }
}

/// Why the command `command_key` waits for a person: the reason of the last record in its
/// run's audit trail (`records`, in the chain's order) that moved it to BLOCKED.
pub fn blocked_reason<'a>(
    records: impl DoubleEndedIterator<Item = &'a AuditRecord>,
    command_key: &CommandKey,
) -> Option<&'a str> {
    records
        .rev()
        .find(|record| {
            record.command_key.as_ref() == Some(command_key)
                && record.to.is_some_and(approval_awaited_in)
        })
        .map(|record| record.reason.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::LeaseEpoch;

    fn state(status: CommandStatus) -> CommandState {
        let mut state = CommandState::reserved(Timestamp::from_millis(0), None, 1_000);
        state.status = status;
        state
    }

    #[test]
    fn a_wait_ends_on_a_settled_command_or_a_scheduled_one_not_due_before_it_ends() {
        let now = Timestamp::from_millis(10_000);
        for status in CommandStatus::ALL {
            let mut s = state(status);
            s.due_at = Some(now.plus_millis(5_000));
            let expected = status.is_settled() || status == CommandStatus::Scheduled;
            assert_eq!(
                wait_ends(&s, now, 4_999),
                expected,
                "{status}, due after the wait"
            );
            assert_eq!(
                wait_ends(&s, now, 5_000),
                status.is_settled(),
                "{status}, due as the wait ends"
            );
        }
        let mut unscheduled = state(CommandStatus::Scheduled);
        unscheduled.due_at = None;
        assert!(!wait_ends(&unscheduled, now, 0));
    }

    #[test]
    fn an_attempt_is_in_flight_while_its_lease_holds() {
        for status in CommandStatus::ALL {
            let mut s = state(status);
            s.lease.epoch = LeaseEpoch::new(3);
            let leased = status == CommandStatus::Leased;
            assert_eq!(attempt_in_flight(&s, 3), leased, "{status}");
            assert!(
                !attempt_in_flight(&s, 2),
                "{status}: another attempt's epoch"
            );
        }
    }

    #[test]
    fn only_a_blocked_command_awaits_approval() {
        for status in CommandStatus::ALL {
            assert_eq!(
                awaits_approval(&state(status)),
                status == CommandStatus::Blocked,
                "{status}"
            );
        }
    }

    #[test]
    fn news_is_current_unless_it_is_older_than_the_command_held() {
        let held = state(CommandStatus::Leased);
        let at = held.updated_at;
        assert!(news_is_current(at, &held), "the same write");
        assert!(news_is_current(at.plus_millis(1), &held));
        assert!(!news_is_current(at.plus_millis(-1), &held));
        assert!(news_adds_nothing(at, &held), "the same write");
        assert!(news_adds_nothing(at.plus_millis(-1), &held));
        assert!(!news_adds_nothing(at.plus_millis(1), &held));
    }

    #[test]
    fn only_a_pending_command_is_blocked_past_a_budget() {
        for status in CommandStatus::ALL {
            assert_eq!(
                may_block_past_budget(&state(status)),
                status == CommandStatus::Pending,
                "{status}"
            );
        }
    }

    #[test]
    fn the_blocked_reason_is_the_last_block_of_that_command() {
        let key = CommandKey::parse("d-1/payments/wire/0").expect("key");
        let other = CommandKey::parse("d-2/payments/wire/0").expect("key");
        let record = |seq, key: &CommandKey, to, reason: &str| AuditRecord {
            run_id: crate::ids::RunId::parse("r-1").expect("run"),
            seq,
            at: Timestamp::from_millis(seq as i64),
            command_key: Some(key.clone()),
            from: None,
            to: Some(to),
            actor: "dispatcher".into(),
            reason: reason.into(),
            evidence: serde_json::Value::Null,
        };
        let trail = [
            record(1, &key, CommandStatus::Blocked, "over 1000"),
            record(2, &key, CommandStatus::Approved, "fine"),
            record(3, &key, CommandStatus::Blocked, "over 1000 again"),
            record(4, &other, CommandStatus::Blocked, "another command"),
            record(5, &key, CommandStatus::Pending, "replayed"),
        ];
        assert_eq!(blocked_reason(trail.iter(), &key), Some("over 1000 again"));
        assert_eq!(blocked_reason(trail[..1].iter(), &other), None);
    }
}
