//! A declared rate (`"50/s"`) and the scheduling of calls under it: a generic cell rate
//! algorithm (GCRA) that books slots instead of only saying yes or no.
//!
//! Why booking: a call that must wait for its turn is not kept waiting in a dispatcher (that
//! would hold its bus partition and every run behind it), it is put back in the ledger until
//! its slot (`machine::Event::Hold`). The slot it was given is taken from the bucket there and
//! then, so commands held together come back one interval apart instead of all at once, and
//! one coming back at its slot goes without taking another (`CommandState::flow_slot`).
//! Rate-limiting crates answer "now, or not before T" without booking T, so each of a backlog's
//! commands would be told the same T and come back together: a thundering herd every interval.

use std::fmt;
use std::str::FromStr;

use crate::time::Timestamp;

/// Calls per period: `"50/s"`, `"3000/min"`, `"10/h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub calls: u32,
    pub per_ms: u64,
}

impl Rate {
    /// Milliseconds between two calls at this rate, given `share` of it (0 < share ≤ 1).
    pub fn interval_ms(&self, share: f64) -> f64 {
        let share = if share.is_finite() && share > 0.0 {
            share.min(1.0)
        } else {
            1.0
        };
        self.per_ms as f64 / (f64::from(self.calls.max(1)) * share)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.per_ms {
            1_000 => "s",
            60_000 => "min",
            3_600_000 => "h",
            _ => return write!(f, "{}/{}ms", self.calls, self.per_ms),
        };
        write!(f, "{}/{unit}", self.calls)
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let shape = || {
            format!(
                "rate {text:?} is not calls per period: write \"50/s\", \"3000/min\" or \"10/h\""
            )
        };
        let (calls, unit) = text.trim().split_once('/').ok_or_else(shape)?;
        let calls: u32 = calls.trim().parse().map_err(|_| shape())?;
        if calls == 0 {
            return Err(format!(
                "rate {text:?} allows no call at all; pause the upstream instead"
            ));
        }
        if calls > 1_000_000 {
            return Err(format!("rate {text:?} is over a million calls per period"));
        }
        let per_ms = match unit.trim() {
            "s" | "sec" | "second" => 1_000,
            "m" | "min" | "minute" => 60_000,
            "h" | "hour" => 3_600_000,
            _ => return Err(shape()),
        };
        Ok(Self { calls, per_ms })
    }
}

/// One process's bucket for one upstream: the theoretical arrival time of the next call, in
/// fractional milliseconds. Starts empty (a full burst is available).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bucket {
    tat_ms: Option<f64>,
}

impl Bucket {
    /// Books the next slot at `rate` × `share` with `burst` calls allowed at once: the time the
    /// call may go (`now` when it may go at once). The booking is kept whatever the caller
    /// does with it, so a slot handed out is never handed out again.
    pub fn book(&mut self, rate: Rate, share: f64, burst: u32, now: Timestamp) -> Timestamp {
        let interval = rate.interval_ms(share);
        let now_ms = now.as_millis() as f64;
        let tolerance = interval * f64::from(burst.max(1) - 1);
        let tat = self.tat_ms.unwrap_or(now_ms).max(now_ms);
        let slot = (tat - tolerance).max(now_ms);
        self.tat_ms = Some(tat + interval);
        Timestamp::from_millis(slot.ceil() as i64)
    }

    /// Gives back the last booking (a call that was booked and then not made): only when it is
    /// the latest, so no other booking moves.
    pub fn give_back(&mut self, rate: Rate, share: f64, now: Timestamp) {
        if let Some(tat) = self.tat_ms {
            let interval = rate.interval_ms(share);
            self.tat_ms = Some((tat - interval).max(now.as_millis() as f64));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn rates_read_as_calls_per_period_and_refuse_what_is_not_one() {
        assert_eq!(
            "50/s".parse::<Rate>(),
            Ok(Rate {
                calls: 50,
                per_ms: 1_000
            })
        );
        assert_eq!("3000/min".parse::<Rate>().map(|r| r.per_ms), Ok(60_000));
        assert_eq!(
            "10/h".parse::<Rate>().map(|r| r.to_string()),
            Ok("10/h".into())
        );
        for bad in ["50", "/s", "0/s", "x/s", "5/fortnight", "-1/s", ""] {
            let error = bad.parse::<Rate>().expect_err(bad);
            assert!(error.contains(&format!("{bad:?}")), "{error}");
        }
    }

    #[test]
    fn a_backlog_is_booked_one_interval_apart_after_its_burst() {
        let rate: Rate = "50/s".parse().expect("a rate");
        let mut bucket = Bucket::default();
        let slots: Vec<i64> = (0..8)
            .map(|_| bucket.book(rate, 1.0, 3, at(1_000)).as_millis())
            .collect();
        assert_eq!(
            slots,
            vec![1_000, 1_000, 1_000, 1_020, 1_040, 1_060, 1_080, 1_100]
        );
        // Later, the bucket has drained: a burst is available again.
        assert_eq!(bucket.book(rate, 1.0, 3, at(5_000)).as_millis(), 5_000);
    }

    #[test]
    fn over_any_window_the_booked_slots_keep_to_the_rate_and_its_burst() {
        let rate: Rate = "50/s".parse().expect("a rate");
        let mut bucket = Bucket::default();
        let mut slots = Vec::new();
        for i in 0..2_000 {
            // Arrivals far faster than the rate, in bursts.
            slots.push(bucket.book(rate, 1.0, 10, at(i / 100 * 50)).as_millis());
        }
        for window_start in (0..40_000).step_by(250) {
            let in_window = slots
                .iter()
                .filter(|&&s| s >= window_start && s < window_start + 1_000)
                .count();
            assert!(
                in_window <= 50 + 10,
                "{in_window} calls in the second from {window_start}"
            );
        }
        assert!(
            *slots.last().expect("slots") >= 39_000,
            "{:?}",
            slots.last()
        );
    }

    #[test]
    fn a_share_of_the_rate_spaces_the_slots_wider() {
        let rate: Rate = "50/s".parse().expect("a rate");
        let mut bucket = Bucket::default();
        bucket.book(rate, 0.5, 1, at(0));
        assert_eq!(bucket.book(rate, 0.5, 1, at(0)).as_millis(), 40);
        bucket.give_back(rate, 0.5, at(0));
        assert_eq!(bucket.book(rate, 0.5, 1, at(0)).as_millis(), 40);
    }
}
