//! A call's slot of its upstream's rate: whether the slot it booked when it was held has come,
//! and, for a slot booked now, whether it waits for it in the dispatcher or is put back in the
//! ledger until then.

use super::WAIT_IN_PROCESS_MS;
use crate::time::Timestamp;

/// Whether a call whose command holds `flow_slot` (booked when it was held for the rate) goes
/// now without booking another: its slot has come, give or take `skew_ms` between the clocks
/// of the replica that booked it and this one.
pub fn booked_slot_come(flow_slot: Option<Timestamp>, now: Timestamp, skew_ms: i64) -> bool {
    flow_slot.is_some_and(|slot| slot <= now.plus_millis(skew_ms))
}

/// What a slot booked now means for the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotWait {
    /// The call goes after waiting `wait_ms` in the dispatcher (0: at once), at most
    /// [`WAIT_IN_PROCESS_MS`].
    Go { wait_ms: u64 },
    /// Too far off to wait for holding the bus partition: the call is put back in the ledger
    /// until the slot (`machine::Event::Hold`).
    Hold,
}

/// Whether a call whose slot was booked at `slot` waits for it in process or is held.
pub fn wait_for_slot(slot: Timestamp, now: Timestamp) -> SlotWait {
    let wait = slot.millis_since(now);
    if wait <= WAIT_IN_PROCESS_MS {
        SlotWait::Go {
            wait_ms: u64::try_from(wait).unwrap_or(0),
        }
    } else {
        SlotWait::Hold
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_booked_slot_has_come_once_now_reaches_it_give_or_take_the_skew() {
        assert!(!booked_slot_come(None, at(1_000), 100), "no slot booked");
        assert!(booked_slot_come(Some(at(1_000)), at(1_000), 0));
        assert!(booked_slot_come(Some(at(1_100)), at(1_000), 100));
        assert!(!booked_slot_come(Some(at(1_101)), at(1_000), 100));
        assert!(
            booked_slot_come(Some(at(500)), at(1_000), 0),
            "a slot long past"
        );
    }

    #[test]
    fn a_slot_within_the_in_process_wait_is_waited_for_and_a_later_one_held() {
        let now = at(10_000);
        assert_eq!(wait_for_slot(at(9_000), now), SlotWait::Go { wait_ms: 0 });
        assert_eq!(wait_for_slot(now, now), SlotWait::Go { wait_ms: 0 });
        assert_eq!(
            wait_for_slot(now.plus_millis(WAIT_IN_PROCESS_MS), now),
            SlotWait::Go {
                wait_ms: WAIT_IN_PROCESS_MS as u64
            }
        );
        assert_eq!(
            wait_for_slot(now.plus_millis(WAIT_IN_PROCESS_MS + 1), now),
            SlotWait::Hold
        );
    }
}
