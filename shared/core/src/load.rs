//! Load: how the pipeline keeps its own work per effect bounded when the ledger or the bus
//! falls behind. Pure decisions on measured figures the services hand in: how much to add to
//! a lease for the writes it must cover, whether a write under a lease must extend it first,
//! how long to wait before retrying a failed write and whether the retry budget allows it,
//! and whether a producer takes on new work at all (docs/architecture.md, "Under a slow
//! ledger"; docs/decisions.md, "No work amplification under a slow ledger").

use serde::{Deserialize, Serialize};

use crate::command::{CommandState, CommandStatus};
use crate::machine::Rules;
use crate::time::Timestamp;

/// What a lease must cover beyond the call: its outcome's write, sized from the ledger's
/// observed write latency (twice it, for a write slower than the average), and never more than
/// `cap_ms`, so a ledger that stalls cannot make leases unbounded.
pub fn write_slack_ms(observed_write_ms: i64, cap_ms: i64) -> i64 {
    observed_write_ms.saturating_mul(2).clamp(0, cap_ms.max(0))
}

/// The expiry to extend a lease to before a write expected to take `write_ms`, if the lease
/// could lapse while the write is in flight (less than twice the write, plus the skew bound,
/// is left); `None` when the lease covers it, or the command is not LEASED. The extension is
/// itself a write, so it asks for room for itself and the write after it.
pub fn extend_before_write(
    state: &CommandState,
    rules: &Rules,
    now: Timestamp,
    write_ms: i64,
) -> Option<Timestamp> {
    if state.status != CommandStatus::Leased {
        return None;
    }
    let expires_at = state.lease.expires_at?;
    let write_ms = write_ms.max(0);
    let needed = write_ms
        .saturating_mul(2)
        .saturating_add(rules.clock_skew_ms);
    if expires_at.millis_since(now) > needed {
        return None;
    }
    let room = write_ms
        .saturating_mul(4)
        .saturating_add(rules.clock_skew_ms.saturating_mul(2))
        .max(1_000);
    Some(now.plus_millis(room).max(expires_at.plus_millis(1)))
}

/// Limits past which a producer refuses new work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadLimits {
    /// The ledger's observed write latency past which new work is refused, in milliseconds.
    pub max_write_ms: i64,
    /// Messages waiting in the bus client past which new work is refused.
    pub max_backlog: u64,
}

/// Whether a producer takes on a new effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    Admit,
    /// Refused before anything is recorded: 503 with `Retry-After: retry_after_s`.
    Refuse {
        code: &'static str,
        why: String,
        retry_after_s: u64,
    },
}

/// Admits a new effect unless the ledger's writes or the bus's backlog are past their limits:
/// work accepted then could not start before its leases and due times lapse, and every lapse
/// costs the ledger more writes. The client is asked to come back after about as long as the
/// backlog takes to drain (1 to 30 s).
pub fn admit(observed_write_ms: i64, backlog: u64, limits: &LoadLimits) -> Admission {
    if limits.max_write_ms > 0 && observed_write_ms > limits.max_write_ms {
        let retry_after_s = u64::try_from(observed_write_ms.saturating_mul(2) / 1_000)
            .unwrap_or(0)
            .clamp(1, 30);
        return Admission::Refuse {
            code: "ledger_behind",
            why: format!(
                "ledger writes take {observed_write_ms} ms (limit {} ms); nothing was recorded, \
                 submit again later",
                limits.max_write_ms
            ),
            retry_after_s,
        };
    }
    if limits.max_backlog > 0 && backlog > limits.max_backlog {
        return Admission::Refuse {
            code: "bus_behind",
            why: format!(
                "{backlog} messages wait to be sent to the bus (limit {}); nothing was \
                 recorded, submit again later",
                limits.max_backlog
            ),
            retry_after_s: (backlog / limits.max_backlog.max(1)).clamp(1, 30),
        };
    }
    Admission::Admit
}

/// Messages a consumer group's queue may hold before new work is refused, whatever its rate:
/// after an idle spell the rate reads 0, and a pipeline that refused everything then would
/// never show a rate again.
pub const QUEUE_FLOOR: u64 = 500;

/// How fast a consumer group takes on messages, from successive readings of how many it has
/// committed in all: an average that gives each new second about a third of the weight, so a
/// dispatcher that slows down is seen within a few seconds and one reading does not swing it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DrainRate {
    last: Option<(Timestamp, u64)>,
    per_s: f64,
}

impl DrainRate {
    /// Takes a reading: `taken` messages committed in all at `now`. A reading that goes back
    /// (a group reset, offsets deleted) starts the count afresh.
    pub fn observe(&mut self, now: Timestamp, taken: u64) {
        if let Some((at, before)) = self.last {
            let elapsed_ms = now.millis_since(at);
            if elapsed_ms <= 0 {
                return;
            }
            if taken >= before {
                let rate = (taken - before) as f64 * 1_000.0 / elapsed_ms as f64;
                let weight = (elapsed_ms as f64 / 3_000.0).min(1.0);
                self.per_s += (rate - self.per_s) * weight;
            }
        }
        self.last = Some((now, taken));
    }

    /// Messages per second, as last averaged.
    pub fn per_s(&self) -> f64 {
        self.per_s
    }
}

/// Admits a new effect unless the dispatchers' queue already holds more than they take on in
/// `max_queue_ms` at their measured rate (and more than [`QUEUE_FLOOR`]): a request that waits
/// longer than that reaches its dispatcher after its reservation lease ran short, and each such
/// request costs the ledger a take-over or a sweep. 0 turns the limit off.
pub fn admit_queue(waiting: u64, rate: &DrainRate, max_queue_ms: i64) -> Admission {
    if max_queue_ms <= 0 {
        return Admission::Admit;
    }
    let per_s = rate.per_s().max(0.0);
    let limit = ((per_s * max_queue_ms as f64 / 1_000.0) as u64).max(QUEUE_FLOOR);
    if waiting <= limit {
        return Admission::Admit;
    }
    // Come back when the queue is down to its limit: what is over it, at the measured rate,
    // and at least at the floor's pace (the floor in `max_queue_ms`): with no drain measured
    // yet (a pipeline just started, whose dispatchers have not committed), a rate near 0 would
    // send every client away for the longest wait.
    let floor_per_s = QUEUE_FLOOR as f64 * 1_000.0 / max_queue_ms as f64;
    let over_s = (waiting - limit) as f64 / per_s.max(floor_per_s).max(1.0);
    Admission::Refuse {
        code: "dispatch_behind",
        why: format!(
            "{waiting} dispatch requests wait for the dispatchers, who take on {per_s:.0} a \
             second (limit: {max_queue_ms} ms of their work, at least {QUEUE_FLOOR}); nothing \
             was recorded, submit again later"
        ),
        retry_after_s: (over_s.ceil() as u64).clamp(1, 30),
    }
}

/// A tenant's part of what is in flight, for [`admit_queue_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantShare {
    /// The submitting tenant's effects in flight.
    pub in_flight: u64,
    /// Tenants with effects in flight, the submitting one included.
    pub tenants: u64,
}

/// [`admit_queue`], fair between tenants: over the bound, a tenant is still admitted while its
/// effects in flight are under an even share of the bound (the bound over the tenants with
/// work in flight). The tenant that filled the queue is refused; one that arrives behind it
/// with a few effects is not, and the dispatchers' lanes serve it in turn
/// (docs/decisions.md, "Tenants"). The queue then holds at most about twice the bound: the
/// bound, and the small tenants' shares of it. A tenant alone is held to the bound itself (its
/// even share is all of it, and the queue's figure counts its admissions sooner than its
/// in-flight figure can). `share` is asked only when the queue is over its bound; its
/// `in_flight` must count the tenant's admissions not yet recorded, or a burst of concurrent
/// submissions passes on one figure.
pub fn admit_queue_for(
    waiting: u64,
    rate: &DrainRate,
    max_queue_ms: i64,
    share: impl FnOnce() -> TenantShare,
) -> Admission {
    let verdict = admit_queue(waiting, rate, max_queue_ms);
    if verdict == Admission::Admit {
        return verdict;
    }
    let share = share();
    if share.tenants <= 1 {
        return verdict;
    }
    let per_s = rate.per_s().max(0.0);
    let limit = ((per_s * max_queue_ms as f64 / 1_000.0) as u64).max(QUEUE_FLOOR);
    if share.in_flight < limit / share.tenants.max(1) {
        Admission::Admit
    } else {
        verdict
    }
}

/// The wait before retry `attempt` (1 for the first) of a failed write: exponential from
/// `base_ms`, at most `cap_ms`, and "equal jitter" by `jitter` in `[0, 1)` — between half
/// and all of it — so writers that failed together do not retry together.
pub fn backoff_ms(attempt: u32, base_ms: i64, cap_ms: i64, jitter: f64) -> i64 {
    let exp = base_ms
        .max(1)
        .saturating_mul(1_i64 << attempt.saturating_sub(1).min(30))
        .min(cap_ms.max(1));
    let jitter = jitter.clamp(0.0, 1.0);
    let half = exp / 2;
    half + (((exp - half) as f64) * jitter) as i64
}

/// A budget of retries: each success earns `per_success` thousandths of a retry, up to `max`
/// retries saved, and a retry spends one. Under a ledger that fails most writes, retries stay a
/// fixed share of the work that succeeds instead of multiplying it; a retry the budget refuses
/// is left to the command's due time (the sweep brings it back). Counted in thousandths, so
/// ten successes at 100 earn exactly one retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryBudget {
    milli: u64,
    max_milli: u64,
    per_success: u64,
}

impl RetryBudget {
    /// A budget that starts full (`max` retries) and earns `per_success` thousandths per success.
    pub fn new(max: u32, per_success: u32) -> Self {
        Self {
            milli: u64::from(max) * 1_000,
            max_milli: u64::from(max) * 1_000,
            per_success: u64::from(per_success),
        }
    }

    pub fn succeeded(&mut self) {
        self.milli = (self.milli + self.per_success).min(self.max_milli);
    }

    /// Spends a retry if one is left.
    pub fn try_retry(&mut self) -> bool {
        if self.milli >= 1_000 {
            self.milli -= 1_000;
            true
        } else {
            false
        }
    }

    /// Retries left, in thousandths.
    pub fn left_milli(&self) -> u64 {
        self.milli
    }
}

#[cfg(test)]
mod tests;
