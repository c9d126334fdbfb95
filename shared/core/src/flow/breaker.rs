//! The circuit breaker's decisions: which answers count against an upstream, when it opens,
//! who probes it and when it closes.
//!
//! Failures are counted by each dispatcher over its own calls (consecutive failures, reset by
//! any answer that shows the upstream up); the state they lead to is written to the ledger
//! with a compare-and-set, so every replica holds its calls once one replica opens it, and
//! exactly one replica wins each probe.

use super::{Breaker, FlowControl};
use crate::machine::DispatchOutcome;
use crate::time::Timestamp;

/// `[upstream.<name>.breaker]`, with defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSpec {
    /// Failures in a row (5xx, timeouts, refused connections) that open it.
    pub failures: u32,
    /// How long it stays open before the first probe.
    pub open_ms: u64,
    /// The longest it stays open after probes that failed (each doubles the time).
    pub max_open_ms: u64,
    /// How long a probe's holder has to report before another may probe.
    pub probe_ms: u64,
}

/// What one answer says about the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It answered: a commit or a definitive refusal.
    Up,
    /// 5xx, a timeout, a reset, a refused connection.
    Failing,
    /// Says nothing about its health (an answer asking for a later call).
    Neither,
}

pub fn verdict(outcome: &DispatchOutcome) -> Verdict {
    match outcome {
        DispatchOutcome::Committed { .. }
        | DispatchOutcome::Refused { .. }
        | DispatchOutcome::Accepted { .. } => Verdict::Up,
        DispatchOutcome::Ambiguous { .. } | DispatchOutcome::NotSent { .. } => Verdict::Failing,
        DispatchOutcome::RateLimited { .. } => Verdict::Neither,
    }
}

/// The breaker state to write after a call whose answer was `verdict`, this dispatcher having
/// seen `failures_in_a_row` failing answers (this one included); `probe`: the call was this
/// dispatcher's probe. `None`: nothing changes.
pub fn after_call(
    spec: &BreakerSpec,
    control: &FlowControl,
    failures_in_a_row: u32,
    verdict: Verdict,
    probe: bool,
    last_error: &str,
    now: Timestamp,
) -> Option<Breaker> {
    let opened = match &control.breaker {
        Breaker::Closed => 0,
        Breaker::Open { opened, .. } | Breaker::HalfOpen { opened, .. } => *opened,
    };
    match (&control.breaker, verdict) {
        (Breaker::Closed, Verdict::Failing) if failures_in_a_row >= spec.failures.max(1) => {
            Some(open(spec, 1, failures_in_a_row, last_error, now))
        }
        (Breaker::HalfOpen { .. } | Breaker::Open { .. }, Verdict::Up) if probe => {
            Some(Breaker::Closed)
        }
        (Breaker::HalfOpen { .. }, Verdict::Failing) if probe => Some(open(
            spec,
            opened.saturating_add(1),
            failures_in_a_row,
            last_error,
            now,
        )),
        _ => None,
    }
}

fn open(
    spec: &BreakerSpec,
    opened: u32,
    failures: u32,
    last_error: &str,
    now: Timestamp,
) -> Breaker {
    let factor = 1_u64 << opened.saturating_sub(1).min(20);
    let open_ms = spec
        .open_ms
        .saturating_mul(factor)
        .min(spec.max_open_ms.max(spec.open_ms));
    let mut error: String = last_error.chars().take(200).collect();
    if error.is_empty() {
        error = "no answer".into();
    }
    Breaker::Open {
        since: now,
        probe_at: now.plus_millis(i64::try_from(open_ms).unwrap_or(i64::MAX)),
        opened,
        reason: if opened > 1 {
            format!("its probe failed ({error}); open {open_ms} ms, time {opened} in a row")
        } else {
            format!("{failures} failures in a row, the last: {error}")
        },
    }
}

/// The half-open state `owner` writes to take the probe, when the breaker waits for one.
pub fn claim_probe(
    spec: &BreakerSpec,
    control: &FlowControl,
    owner: &str,
    now: Timestamp,
) -> Option<Breaker> {
    let opened = match &control.breaker {
        Breaker::Open {
            probe_at, opened, ..
        } if *probe_at <= now => *opened,
        Breaker::HalfOpen { until, opened, .. } if *until <= now => *opened,
        _ => return None,
    };
    Some(Breaker::HalfOpen {
        since: now,
        probe_by: owner.to_owned(),
        until: now.plus_millis(i64::try_from(spec.probe_ms).unwrap_or(i64::MAX)),
        opened,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    const SPEC: BreakerSpec = BreakerSpec {
        failures: 3,
        open_ms: 1_000,
        max_open_ms: 5_000,
        probe_ms: 2_000,
    };

    fn with(breaker: Breaker) -> FlowControl {
        FlowControl {
            breaker,
            ..FlowControl::new("bank")
        }
    }

    #[test]
    fn answers_are_judged_by_what_they_say_of_the_upstream() {
        let ambiguous = DispatchOutcome::Ambiguous {
            reason: "503".into(),
        };
        assert_eq!(verdict(&ambiguous), Verdict::Failing);
        assert_eq!(
            verdict(&DispatchOutcome::NotSent {
                reason: "refused".into()
            }),
            Verdict::Failing
        );
        assert_eq!(
            verdict(&DispatchOutcome::Refused {
                reason: "422".into()
            }),
            Verdict::Up
        );
        assert_eq!(
            verdict(&DispatchOutcome::RateLimited {
                reason: "429".into(),
                retry_after_ms: 1_000,
                refusal: false
            }),
            Verdict::Neither
        );
    }

    #[test]
    fn it_opens_at_the_declared_failures_in_a_row_and_not_before() {
        let closed = with(Breaker::Closed);
        assert_eq!(
            after_call(&SPEC, &closed, 2, Verdict::Failing, false, "503", at(0)),
            None
        );
        let Some(Breaker::Open {
            probe_at,
            opened,
            reason,
            ..
        }) = after_call(
            &SPEC,
            &closed,
            3,
            Verdict::Failing,
            false,
            "503 Service Unavailable",
            at(0),
        )
        else {
            panic!("not opened");
        };
        assert_eq!((probe_at, opened), (at(1_000), 1));
        assert!(
            reason.contains("3 failures") && reason.contains("503"),
            "{reason}"
        );
        assert_eq!(
            after_call(&SPEC, &closed, 9, Verdict::Up, false, "", at(0)),
            None
        );
    }

    #[test]
    fn one_probe_is_claimed_when_due_and_its_answer_closes_or_reopens_for_longer() {
        let open = with(Breaker::Open {
            since: at(0),
            probe_at: at(1_000),
            opened: 1,
            reason: "x".into(),
        });
        assert_eq!(claim_probe(&SPEC, &open, "d-1", at(999)), None);
        let half = claim_probe(&SPEC, &open, "d-1", at(1_000)).expect("probe");
        assert!(
            matches!(&half, Breaker::HalfOpen { probe_by, until, .. } if probe_by == "d-1" && *until == at(3_000))
        );
        let half = with(half);
        assert_eq!(claim_probe(&SPEC, &half, "d-2", at(2_000)), None);
        assert_eq!(
            after_call(&SPEC, &half, 0, Verdict::Up, true, "", at(1_100)),
            Some(Breaker::Closed)
        );
        // Not this dispatcher's probe: its answer changes nothing.
        assert_eq!(
            after_call(&SPEC, &half, 5, Verdict::Failing, false, "503", at(1_100)),
            None
        );
        let Some(Breaker::Open {
            probe_at, opened, ..
        }) = after_call(&SPEC, &half, 1, Verdict::Failing, true, "503", at(1_100))
        else {
            panic!("not reopened");
        };
        assert_eq!((probe_at, opened), (at(3_100), 2));
        // Doubling stops at the longest declared.
        let many = with(Breaker::HalfOpen {
            since: at(0),
            probe_by: "d".into(),
            until: at(1),
            opened: 9,
        });
        let Some(Breaker::Open { probe_at, .. }) =
            after_call(&SPEC, &many, 1, Verdict::Failing, true, "", at(0))
        else {
            panic!()
        };
        assert_eq!(probe_at, at(5_000));
    }
}
