//! Fault injection: which failure, if any, the upstream acts out for one request.
//!
//! The faults of one request exclude each other, so a family's rates are the probabilities of
//! disjoint outcomes and must add up to at most 1. Every faultable request draws exactly one
//! uniform number and [`FaultRates::pick`] walks the cumulative rates in a fixed order; with a
//! seeded generator and requests sent one at a time the sequence of faults is reproducible.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Added to a family's rate sum before it is compared with 1, so that rates such as five times
/// 0.2 are not refused for a rounding error.
const RATE_SUM_TOLERANCE: f64 = 1e-9;

/// One way the upstream misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Commit the effect, then hold the response longer than the client waits: from the
    /// client's side an ambiguous timeout.
    CommitThenTimeout,
    /// Commit the effect, then close the connection without writing any response.
    DropResponse,
    /// Answer 503 without committing anything: a plain, unambiguous failure.
    Error5xx,
    /// Commit the effect, then answer 500: a failure status for something that happened.
    CommitThen5xx,
    /// Book the wire twice under the same business key and answer with the first id. Bank only.
    CommitTwice,
    /// The status check (`GET /bank/wires/by-key/…`) answers 503.
    StatusInconclusive,
    /// Answer 429 with `Retry-After` (`Faults::retry_after_secs`) without committing anything:
    /// a rate limit. Opt-in: not among the rates of [`FaultRates::each`] or the demo preset.
    RateLimited,
    /// The status check answers 429 with `Retry-After`.
    StatusRateLimited,
}

impl FaultKind {
    /// Every kind, in the order [`FaultRates::pick`] and the counters list them.
    pub const ALL: [FaultKind; 8] = [
        FaultKind::CommitThenTimeout,
        FaultKind::DropResponse,
        FaultKind::Error5xx,
        FaultKind::CommitThen5xx,
        FaultKind::CommitTwice,
        FaultKind::StatusInconclusive,
        FaultKind::RateLimited,
        FaultKind::StatusRateLimited,
    ];

    /// The snake_case name used in JSON and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::CommitThenTimeout => "commit_then_timeout",
            FaultKind::DropResponse => "drop_response",
            FaultKind::Error5xx => "error_5xx",
            FaultKind::CommitThen5xx => "commit_then_5xx",
            FaultKind::CommitTwice => "commit_twice",
            FaultKind::StatusInconclusive => "status_inconclusive",
            FaultKind::RateLimited => "rate_limited",
            FaultKind::StatusRateLimited => "status_rate_limited",
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A group of mutating endpoints that share one set of fault rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `POST /bank/wires`.
    Bank,
    /// `POST /email/messages`.
    Email,
    /// `POST /tickets`.
    Tickets,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 3] = [Family::Bank, Family::Email, Family::Tickets];

    /// The name used as the JSON key in [`Faults`].
    pub fn as_str(self) -> &'static str {
        match self {
            Family::Bank => "bank",
            Family::Email => "email",
            Family::Tickets => "tickets",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The fault rates of one family of mutating endpoints, each between 0.0 and 1.0.
///
/// Missing JSON fields are 0, unknown ones are refused so that a misspelt rate is not silently
/// ignored.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultRates {
    /// See [`FaultKind::CommitThenTimeout`].
    pub commit_then_timeout: f64,
    /// See [`FaultKind::DropResponse`].
    pub drop_response: f64,
    /// See [`FaultKind::Error5xx`].
    pub error_5xx: f64,
    /// See [`FaultKind::CommitThen5xx`].
    pub commit_then_5xx: f64,
    /// See [`FaultKind::CommitTwice`]; only the bank may set it.
    pub commit_twice: f64,
    /// See [`FaultKind::RateLimited`].
    pub rate_limited: f64,
}

impl FaultRates {
    /// No faults.
    pub const fn none() -> Self {
        FaultRates {
            commit_then_timeout: 0.0,
            drop_response: 0.0,
            error_5xx: 0.0,
            commit_then_5xx: 0.0,
            commit_twice: 0.0,
            rate_limited: 0.0,
        }
    }

    /// Every fault of a mutating endpoint at `rate`, `commit_twice` included and
    /// `rate_limited` (opt-in, set it alone) left out.
    pub const fn each(rate: f64) -> Self {
        FaultRates {
            commit_then_timeout: rate,
            drop_response: rate,
            error_5xx: rate,
            commit_then_5xx: rate,
            commit_twice: rate,
            rate_limited: 0.0,
        }
    }

    /// Only `kind` at `rate`; `StatusInconclusive` is not a rate of a mutating endpoint and
    /// gives no faults.
    pub fn only(kind: FaultKind, rate: f64) -> Self {
        let mut rates = FaultRates::none();
        rates.set(kind, rate);
        rates
    }

    /// The rate of `kind`; 0 for `StatusInconclusive`, which lives in [`Faults`].
    pub fn rate(&self, kind: FaultKind) -> f64 {
        match kind {
            FaultKind::CommitThenTimeout => self.commit_then_timeout,
            FaultKind::DropResponse => self.drop_response,
            FaultKind::Error5xx => self.error_5xx,
            FaultKind::CommitThen5xx => self.commit_then_5xx,
            FaultKind::CommitTwice => self.commit_twice,
            FaultKind::RateLimited => self.rate_limited,
            FaultKind::StatusInconclusive | FaultKind::StatusRateLimited => 0.0,
        }
    }

    /// Sets the rate of `kind`; a no-op for `StatusInconclusive`.
    pub fn set(&mut self, kind: FaultKind, rate: f64) {
        match kind {
            FaultKind::CommitThenTimeout => self.commit_then_timeout = rate,
            FaultKind::DropResponse => self.drop_response = rate,
            FaultKind::Error5xx => self.error_5xx = rate,
            FaultKind::CommitThen5xx => self.commit_then_5xx = rate,
            FaultKind::CommitTwice => self.commit_twice = rate,
            FaultKind::RateLimited => self.rate_limited = rate,
            FaultKind::StatusInconclusive | FaultKind::StatusRateLimited => {}
        }
    }

    /// The fault for a request whose uniform draw in `[0, 1)` is `draw`, or `None` to behave.
    ///
    /// Walks the cumulative rates in [`FaultKind::ALL`] order, so a rate of 1.0 always fires
    /// and a rate of 0.0 never does.
    pub fn pick(&self, draw: f64) -> Option<FaultKind> {
        let mut edge = 0.0;
        for kind in FaultKind::ALL {
            edge += self.rate(kind);
            if draw < edge {
                return Some(kind);
            }
        }
        None
    }

    fn sum(&self) -> f64 {
        FaultKind::ALL.iter().map(|kind| self.rate(*kind)).sum()
    }
}

/// What the upstream injects: rates per family of mutating endpoints, the rate of inconclusive
/// status checks, and how long `commit_then_timeout` holds its response.
///
/// Deserialises from the `POST /_faults` JSON, e.g.
/// `{"bank": {"commit_twice": 0.5}, "status_inconclusive": 0.1, "timeout_sleep_ms": 2000}`;
/// omitted fields take the values of [`Faults::none`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Rates for `POST /bank/wires`.
    pub bank: FaultRates,
    /// Rates for `POST /email/messages`; `commit_twice` must be 0.
    pub email: FaultRates,
    /// Rates for `POST /tickets`; `commit_twice` must be 0.
    pub tickets: FaultRates,
    /// Rate at which `GET /bank/wires/by-key/…` answers 503.
    pub status_inconclusive: f64,
    /// Rate at which `GET /bank/wires/by-key/…` answers 429 with `Retry-After`; with
    /// `status_inconclusive` at most 1 (one draw decides both).
    pub status_rate_limited: f64,
    /// The `Retry-After` of a `rate_limited` or `status_rate_limited` answer, in seconds.
    pub retry_after_secs: u64,
    /// How long `commit_then_timeout` holds the response, in milliseconds. Choose it longer than
    /// the client's timeout (the demo catalog's longest is 10 s).
    pub timeout_sleep_ms: u64,
    /// How long every committed call to a mutating endpoint holds its answer, in milliseconds:
    /// a real API's latency, for benchmarks that need the calls, not the pipeline, to take
    /// the time. 0 answers at once.
    pub latency_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults::none()
    }
}

impl Faults {
    /// The default hold of `commit_then_timeout`: longer than any timeout in the demo catalog.
    pub const DEFAULT_TIMEOUT_SLEEP: Duration = Duration::from_secs(15);

    /// No faults: a well-behaved upstream.
    pub fn none() -> Self {
        Faults {
            bank: FaultRates::none(),
            email: FaultRates::none(),
            tickets: FaultRates::none(),
            status_inconclusive: 0.0,
            status_rate_limited: 0.0,
            retry_after_secs: 1,
            timeout_sleep_ms: duration_ms(Self::DEFAULT_TIMEOUT_SLEEP),
            latency_ms: 0,
        }
    }

    /// The `sluice demo` preset: every fault that applies to an endpoint at 5 %.
    pub fn demo() -> Self {
        Faults::uniform(FaultRates::each(0.05)).with_status_inconclusive(0.05)
    }

    /// The same rates for every family, except that `commit_twice` applies to the bank only
    /// (the mail and ticket services deduplicate by Idempotency-Key).
    pub fn uniform(rates: FaultRates) -> Self {
        let without_twice = FaultRates {
            commit_twice: 0.0,
            ..rates
        };
        Faults {
            bank: rates,
            email: without_twice,
            tickets: without_twice,
            ..Faults::none()
        }
    }

    /// Sets `kind` to `rate` everywhere it applies: every family, the bank alone for
    /// `CommitTwice`, the status check for `StatusInconclusive`.
    pub fn set_everywhere(&mut self, kind: FaultKind, rate: f64) {
        match kind {
            FaultKind::StatusInconclusive => self.status_inconclusive = rate,
            FaultKind::StatusRateLimited => self.status_rate_limited = rate,
            FaultKind::CommitTwice => self.bank.commit_twice = rate,
            FaultKind::CommitThenTimeout
            | FaultKind::DropResponse
            | FaultKind::Error5xx
            | FaultKind::CommitThen5xx
            | FaultKind::RateLimited => {
                for family in Family::ALL {
                    self.rates_mut(family).set(kind, rate);
                }
            }
        }
    }

    /// Returns these faults with the given status-check rate.
    pub fn with_status_inconclusive(mut self, rate: f64) -> Self {
        self.status_inconclusive = rate;
        self
    }

    /// Returns these faults with `commit_then_timeout` holding its response for `sleep`.
    pub fn with_timeout_sleep(mut self, sleep: Duration) -> Self {
        self.timeout_sleep_ms = duration_ms(sleep);
        self
    }

    /// Returns these faults with `family`'s rates replaced.
    pub fn with_rates(mut self, family: Family, rates: FaultRates) -> Self {
        *self.rates_mut(family) = rates;
        self
    }

    /// The rates of `family`.
    pub fn rates(&self, family: Family) -> &FaultRates {
        match family {
            Family::Bank => &self.bank,
            Family::Email => &self.email,
            Family::Tickets => &self.tickets,
        }
    }

    fn rates_mut(&mut self, family: Family) -> &mut FaultRates {
        match family {
            Family::Bank => &mut self.bank,
            Family::Email => &mut self.email,
            Family::Tickets => &mut self.tickets,
        }
    }

    /// How long `commit_then_timeout` holds its response.
    pub fn timeout_sleep(&self) -> Duration {
        Duration::from_millis(self.timeout_sleep_ms)
    }

    /// Checks every rate is in `[0, 1]`, each family's rates add up to at most 1, and only the
    /// bank commits twice.
    pub fn validate(&self) -> Result<(), FaultsError> {
        check_rate("status_inconclusive".to_owned(), self.status_inconclusive)?;
        check_rate("status_rate_limited".to_owned(), self.status_rate_limited)?;
        let status_sum = self.status_inconclusive + self.status_rate_limited;
        if status_sum > 1.0 + RATE_SUM_TOLERANCE {
            return Err(FaultsError::StatusRatesExceedOne { sum: status_sum });
        }
        for family in Family::ALL {
            let rates = self.rates(family);
            for kind in FaultKind::ALL {
                if !matches!(
                    kind,
                    FaultKind::StatusInconclusive | FaultKind::StatusRateLimited
                ) {
                    check_rate(format!("{family}.{kind}"), rates.rate(kind))?;
                }
            }
            if family != Family::Bank && rates.commit_twice != 0.0 {
                return Err(FaultsError::CommitTwiceOutsideBank {
                    family,
                    rate: rates.commit_twice,
                });
            }
            let sum = rates.sum();
            if sum > 1.0 + RATE_SUM_TOLERANCE {
                return Err(FaultsError::RatesExceedOne { family, sum });
            }
        }
        Ok(())
    }
}

fn check_rate(key: String, rate: f64) -> Result<(), FaultsError> {
    // Written so that NaN fails too.
    if (0.0..=1.0).contains(&rate) {
        Ok(())
    } else {
        Err(FaultsError::RateOutOfRange { key, rate })
    }
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Why a [`Faults`] value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultsError {
    /// A rate outside `[0, 1]`.
    #[error("fault rate `{key}` is {rate}; a rate must be between 0.0 and 1.0")]
    RateOutOfRange {
        /// The rate's key, e.g. `bank.drop_response`.
        key: String,
        /// The refused value.
        rate: f64,
    },
    /// A family whose disjoint fault rates add up to more than 1.
    #[error(
        "fault rates of `{family}` add up to {sum}; one request suffers at most one fault, so \
         they must add up to at most 1.0"
    )]
    RatesExceedOne {
        /// The family.
        family: Family,
        /// The sum of its rates.
        sum: f64,
    },
    /// The status check's rates add up to more than 1.
    #[error(
        "status_inconclusive and status_rate_limited add up to {sum}; one status check \
         suffers at most one fault, so they must add up to at most 1.0"
    )]
    StatusRatesExceedOne {
        /// Their sum.
        sum: f64,
    },
    /// `commit_twice` set for a family that deduplicates by Idempotency-Key.
    #[error(
        "`{family}.commit_twice` is {rate}; only the bank commits twice (the other services \
         deduplicate by Idempotency-Key), so set it to 0"
    )]
    CommitTwiceOutsideBank {
        /// The family.
        family: Family,
        /// The refused value.
        rate: f64,
    },
}

/// How many faults of each kind the upstream injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultCounts {
    /// See [`FaultKind::CommitThenTimeout`].
    pub commit_then_timeout: u64,
    /// See [`FaultKind::DropResponse`].
    pub drop_response: u64,
    /// See [`FaultKind::Error5xx`].
    pub error_5xx: u64,
    /// See [`FaultKind::CommitThen5xx`].
    pub commit_then_5xx: u64,
    /// See [`FaultKind::CommitTwice`].
    pub commit_twice: u64,
    /// See [`FaultKind::StatusInconclusive`].
    pub status_inconclusive: u64,
    /// See [`FaultKind::RateLimited`].
    #[serde(default)]
    pub rate_limited: u64,
    /// See [`FaultKind::StatusRateLimited`].
    #[serde(default)]
    pub status_rate_limited: u64,
}

impl FaultCounts {
    /// How many faults of `kind` were injected.
    pub fn get(&self, kind: FaultKind) -> u64 {
        match kind {
            FaultKind::CommitThenTimeout => self.commit_then_timeout,
            FaultKind::DropResponse => self.drop_response,
            FaultKind::Error5xx => self.error_5xx,
            FaultKind::CommitThen5xx => self.commit_then_5xx,
            FaultKind::CommitTwice => self.commit_twice,
            FaultKind::StatusInconclusive => self.status_inconclusive,
            FaultKind::RateLimited => self.rate_limited,
            FaultKind::StatusRateLimited => self.status_rate_limited,
        }
    }

    /// All faults injected.
    pub fn total(&self) -> u64 {
        FaultKind::ALL.iter().map(|kind| self.get(*kind)).sum()
    }

    pub(crate) fn record(&mut self, kind: FaultKind) {
        let counter = match kind {
            FaultKind::CommitThenTimeout => &mut self.commit_then_timeout,
            FaultKind::DropResponse => &mut self.drop_response,
            FaultKind::Error5xx => &mut self.error_5xx,
            FaultKind::CommitThen5xx => &mut self.commit_then_5xx,
            FaultKind::CommitTwice => &mut self.commit_twice,
            FaultKind::StatusInconclusive => &mut self.status_inconclusive,
            FaultKind::RateLimited => &mut self.rate_limited,
            FaultKind::StatusRateLimited => &mut self.status_rate_limited,
        };
        *counter += 1;
    }
}

/// What a mutating endpoint does for one request, derived from the fault it drew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Answer 503 and change nothing.
    Refuse,
    /// Answer 429 with `Retry-After` and change nothing.
    RateLimit,
    /// Commit the effect `times` times, then answer as `then` says.
    Commit {
        /// How many times the effect is committed.
        times: Commits,
        /// What the client sees afterwards.
        then: AfterCommit,
    },
}

/// How many times an effect is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commits {
    Once,
    Twice,
}

/// What the client sees after a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterCommit {
    /// The normal success response.
    Answer,
    /// The normal success response, after holding it this long.
    AnswerLate(Duration),
    /// 500, although the effect happened.
    Fail,
    /// No response at all: the connection is closed.
    DropConnection,
}

impl Plan {
    /// The plan for a mutating request that drew `fault`.
    pub(crate) fn for_fault(fault: Option<FaultKind>, timeout_sleep: Duration) -> Plan {
        let commit = |times, then| Plan::Commit { times, then };
        match fault {
            None => commit(Commits::Once, AfterCommit::Answer),
            Some(FaultKind::CommitThenTimeout) => {
                commit(Commits::Once, AfterCommit::AnswerLate(timeout_sleep))
            }
            Some(FaultKind::DropResponse) => commit(Commits::Once, AfterCommit::DropConnection),
            Some(FaultKind::Error5xx) => Plan::Refuse,
            Some(FaultKind::CommitThen5xx) => commit(Commits::Once, AfterCommit::Fail),
            Some(FaultKind::CommitTwice) => commit(Commits::Twice, AfterCommit::Answer),
            // Never drawn for a mutating endpoint (its rate there is 0); a refusal is the
            // closest meaning should it ever be.
            Some(FaultKind::RateLimited) => Plan::RateLimit,
            Some(FaultKind::StatusInconclusive | FaultKind::StatusRateLimited) => Plan::Refuse,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_walks_cumulative_rates_in_order() {
        // Binary fractions, so that the edges below are exact.
        let rates = FaultRates {
            commit_then_timeout: 0.125,
            drop_response: 0.25,
            error_5xx: 0.0,
            commit_then_5xx: 0.25,
            commit_twice: 0.125,
            rate_limited: 0.125,
        };
        let cases = [
            (0.0, Some(FaultKind::CommitThenTimeout)),
            (0.124, Some(FaultKind::CommitThenTimeout)),
            (0.125, Some(FaultKind::DropResponse)),
            (0.374, Some(FaultKind::DropResponse)),
            (0.375, Some(FaultKind::CommitThen5xx)),
            (0.624, Some(FaultKind::CommitThen5xx)),
            (0.625, Some(FaultKind::CommitTwice)),
            (0.75, Some(FaultKind::RateLimited)),
            (0.874, Some(FaultKind::RateLimited)),
            (0.875, None),
            (0.999_999, None),
        ];
        for (draw, expected) in cases {
            assert_eq!(rates.pick(draw), expected, "draw {draw}");
        }
    }

    #[test]
    fn rate_one_always_fires_and_none_never_does() {
        for draw in [0.0, 0.5, 0.999_999_999] {
            assert_eq!(
                FaultRates::only(FaultKind::Error5xx, 1.0).pick(draw),
                Some(FaultKind::Error5xx)
            );
            assert_eq!(FaultRates::none().pick(draw), None);
        }
    }

    #[test]
    fn plans_commit_exactly_when_the_fault_is_ambiguous() {
        let sleep = Duration::from_millis(7);
        let cases = [
            (
                None,
                Plan::Commit {
                    times: Commits::Once,
                    then: AfterCommit::Answer,
                },
            ),
            (
                Some(FaultKind::CommitThenTimeout),
                Plan::Commit {
                    times: Commits::Once,
                    then: AfterCommit::AnswerLate(sleep),
                },
            ),
            (
                Some(FaultKind::DropResponse),
                Plan::Commit {
                    times: Commits::Once,
                    then: AfterCommit::DropConnection,
                },
            ),
            (Some(FaultKind::Error5xx), Plan::Refuse),
            (Some(FaultKind::RateLimited), Plan::RateLimit),
            (
                Some(FaultKind::CommitThen5xx),
                Plan::Commit {
                    times: Commits::Once,
                    then: AfterCommit::Fail,
                },
            ),
            (
                Some(FaultKind::CommitTwice),
                Plan::Commit {
                    times: Commits::Twice,
                    then: AfterCommit::Answer,
                },
            ),
        ];
        for (fault, plan) in cases {
            assert_eq!(Plan::for_fault(fault, sleep), plan, "{fault:?}");
        }
    }

    #[test]
    fn presets_are_valid_and_demo_injects_every_kind_but_the_rate_limits() {
        assert_eq!(Faults::none().validate(), Ok(()));
        let demo = Faults::demo();
        assert_eq!(demo.validate(), Ok(()));
        for kind in FaultKind::ALL {
            let injected = match kind {
                // Opt-in: a rate limit is a scenario of its own, not noise in the demo.
                FaultKind::RateLimited | FaultKind::StatusRateLimited => {
                    assert_eq!(demo.bank.rate(kind) + demo.status_rate_limited, 0.0);
                    continue;
                }
                FaultKind::StatusInconclusive => demo.status_inconclusive,
                FaultKind::CommitThenTimeout
                | FaultKind::DropResponse
                | FaultKind::Error5xx
                | FaultKind::CommitThen5xx
                | FaultKind::CommitTwice => demo.bank.rate(kind),
            };
            assert!(injected > 0.0, "demo preset leaves out {kind}");
        }
        assert_eq!(demo.email.commit_twice, 0.0);
        assert_eq!(demo.tickets.commit_twice, 0.0);
    }

    #[test]
    fn validation_names_the_bad_key() {
        let out_of_range = Faults::none().with_rates(
            Family::Email,
            FaultRates::only(FaultKind::DropResponse, 1.5),
        );
        assert_eq!(
            out_of_range.validate(),
            Err(FaultsError::RateOutOfRange {
                key: "email.drop_response".to_owned(),
                rate: 1.5
            })
        );
        let nan = Faults::none().with_status_inconclusive(f64::NAN);
        assert!(matches!(
            nan.validate(),
            Err(FaultsError::RateOutOfRange { key, .. }) if key == "status_inconclusive"
        ));
        let status_over_one = Faults {
            status_rate_limited: 0.6,
            ..Faults::none()
        }
        .with_status_inconclusive(0.6);
        assert!(matches!(
            status_over_one.validate(),
            Err(FaultsError::StatusRatesExceedOne { .. })
        ));
        let over_one = Faults::uniform(FaultRates::each(0.3));
        assert!(matches!(
            over_one.validate(),
            Err(FaultsError::RatesExceedOne {
                family: Family::Bank,
                ..
            })
        ));
        let twice = Faults::none().with_rates(
            Family::Tickets,
            FaultRates::only(FaultKind::CommitTwice, 0.1),
        );
        assert!(matches!(
            twice.validate(),
            Err(FaultsError::CommitTwiceOutsideBank {
                family: Family::Tickets,
                ..
            })
        ));
        // Five rates of 0.2 add up to 1 up to rounding and are accepted.
        assert_eq!(Faults::uniform(FaultRates::each(0.2)).validate(), Ok(()));
    }

    #[test]
    fn set_everywhere_respects_where_a_fault_applies() {
        let mut faults = Faults::none();
        faults.set_everywhere(FaultKind::DropResponse, 0.25);
        faults.set_everywhere(FaultKind::CommitTwice, 0.5);
        faults.set_everywhere(FaultKind::StatusInconclusive, 0.75);
        for family in Family::ALL {
            assert_eq!(faults.rates(family).drop_response, 0.25, "{family}");
        }
        assert_eq!(faults.bank.commit_twice, 0.5);
        assert_eq!(faults.email.commit_twice, 0.0);
        assert_eq!(faults.tickets.commit_twice, 0.0);
        assert_eq!(faults.status_inconclusive, 0.75);
        assert_eq!(faults.validate(), Ok(()));
    }

    #[test]
    fn json_defaults_missing_fields_and_refuses_unknown_ones() {
        let faults: Faults =
            serde_json::from_str(r#"{"bank": {"commit_twice": 0.5}, "timeout_sleep_ms": 20}"#)
                .expect("valid faults JSON");
        assert_eq!(faults.bank, FaultRates::only(FaultKind::CommitTwice, 0.5));
        assert_eq!(faults.email, FaultRates::none());
        assert_eq!(faults.timeout_sleep(), Duration::from_millis(20));
        let empty: Faults = serde_json::from_str("{}").expect("empty faults JSON");
        assert_eq!(empty, Faults::none());
        assert!(serde_json::from_str::<Faults>(r#"{"bank": {"drop_respons": 1.0}}"#).is_err());
    }
}
