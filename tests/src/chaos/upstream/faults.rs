//! What the ground-truth upstream does wrong, how often, and which request it befalls.
//!
//! Every fault is drawn from the run's seed and the request's identity (see `chaos::dice`), so
//! a seed replays the same faults. The rates are per request of each kind: a dispatch draws one
//! [`DispatchFault`], a status check whether it answers inconclusive, a reversal one
//! [`ReverseFault`], and each commit whether lookups see it only after a lag. A share of the
//! lookup keys are slow for good: every status check for such a key answers only after every
//! timeout a client of it has (see [`FaultRates::slow_lookup`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::chaos::dice;

/// What happens to one dispatch request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DispatchFault {
    /// Commit and answer 2xx.
    None,
    /// Commit, then hold the answer past the client's timeout.
    CommitThenTimeout,
    /// Hold past the client's timeout without committing.
    TimeoutNoCommit,
    /// Commit only after the client's timeout, while the request is still being processed
    /// (the client has gone; the work runs on).
    LateCommit,
    /// Commit, then answer 500.
    CommitThen5xx,
    /// Commit, then close the connection without an answer.
    CommitThenDrop,
    /// Commit twice and answer one 2xx (only where the endpoint does not deduplicate).
    DoubleCommit,
    /// Answer 503 without doing anything.
    Refuse5xx,
    /// Answer 429 with `Retry-After` without doing anything (a [`Phase::RateLimited`]).
    RateLimited,
}

/// A stretch of time the upstream behaves one way whatever the dice say: the fault runner's
/// rate-limiting and outage phases (issue 30), set and cleared by the runner.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Phase {
    #[default]
    Normal,
    /// This share of dispatches is answered 429 with `Retry-After: retry_after_s`, nothing done.
    RateLimited { share: f64, retry_after_s: u64 },
    /// Every dispatch and status check of these endpoints is answered 503, nothing done.
    Outage { endpoints: Vec<String> },
}

impl Phase {
    /// The fault this phase imposes on the `ordinal`-th dispatch of `key` at `endpoint`, if
    /// any.
    pub fn dispatch_fault(
        &self,
        seed: u64,
        endpoint: &str,
        key: &str,
        ordinal: u64,
    ) -> Option<DispatchFault> {
        match self {
            Self::Normal => None,
            Self::RateLimited { share, .. } => {
                (dice::unit(seed, &["429", endpoint, key, &ordinal.to_string()]) < *share)
                    .then_some(DispatchFault::RateLimited)
            }
            Self::Outage { endpoints } => endpoints
                .iter()
                .any(|e| e == endpoint)
                .then_some(DispatchFault::Refuse5xx),
        }
    }

    /// Whether a status check at `endpoint` is answered 503 now.
    pub fn check_down(&self, endpoint: &str) -> bool {
        matches!(self, Self::Outage { endpoints } if endpoints.iter().any(|e| e == endpoint))
    }
}

impl DispatchFault {
    pub const ALL: [Self; 9] = [
        Self::None,
        Self::CommitThenTimeout,
        Self::TimeoutNoCommit,
        Self::LateCommit,
        Self::CommitThen5xx,
        Self::CommitThenDrop,
        Self::DoubleCommit,
        Self::Refuse5xx,
        Self::RateLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::CommitThenTimeout => "commit_then_timeout",
            Self::TimeoutNoCommit => "timeout_no_commit",
            Self::LateCommit => "late_commit",
            Self::CommitThen5xx => "commit_then_5xx",
            Self::CommitThenDrop => "commit_then_drop",
            Self::DoubleCommit => "double_commit",
            Self::Refuse5xx => "refuse_5xx",
            Self::RateLimited => "rate_limited",
        }
    }

    /// Whether the client is left without a definitive answer (the call is ambiguous to it).
    pub fn ambiguous(self) -> bool {
        match self {
            Self::None | Self::DoubleCommit => false,
            Self::CommitThenTimeout
            | Self::TimeoutNoCommit
            | Self::LateCommit
            | Self::CommitThen5xx
            | Self::CommitThenDrop
            | Self::Refuse5xx
            | Self::RateLimited => true,
        }
    }
}

impl fmt::Display for DispatchFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens to one reversal (compensate) request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReverseFault {
    None,
    /// Reverse, then answer 500.
    ReverseThen5xx,
    /// Reverse, then close the connection.
    ReverseThenDrop,
    /// Hold past the client's timeout without reversing.
    TimeoutNoReverse,
}

impl ReverseFault {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::ReverseThen5xx => "reverse_then_5xx",
            Self::ReverseThenDrop => "reverse_then_drop",
            Self::TimeoutNoReverse => "timeout_no_reverse",
        }
    }
}

/// The rates of every fault, each a probability in [0, 1].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FaultRates {
    /// Per dispatch request; what is left of 1 is [`DispatchFault::None`].
    pub dispatch: BTreeMap<DispatchFault, f64>,
    /// Per status check: answer 503.
    pub inconclusive_check: f64,
    /// Per commit: lookups see it only `lag_ms` later.
    pub lagging_lookup: f64,
    /// Per lookup key (a business key or an idempotency key at one endpoint): every status
    /// check for it answers only after the endpoint's `slow_lookup_ms`, longer than the tool's
    /// check timeout and the reconciler's sweep item budget. Not a passing fault but the
    /// endpoint's nature for that key: it outlives [`ChaosUpstream::calm`], so the commands
    /// behind it can end only by counting their cut-short checks (STUCK, or escalated after a
    /// last look), never by waiting for the faults to stop.
    ///
    /// [`ChaosUpstream::calm`]: super::ChaosUpstream::calm
    pub slow_lookup: f64,
    /// Per reversal request; what is left of 1 is [`ReverseFault::None`].
    pub reverse: BTreeMap<ReverseFault, f64>,
}

impl FaultRates {
    /// No faults at all.
    pub fn calm() -> Self {
        Self {
            dispatch: BTreeMap::new(),
            inconclusive_check: 0.0,
            lagging_lookup: 0.0,
            slow_lookup: 0.0,
            reverse: BTreeMap::new(),
        }
    }

    /// These rates with every passing fault stopped: only the slow lookup keys stay slow.
    #[must_use]
    pub fn calmed(&self) -> Self {
        Self {
            slow_lookup: self.slow_lookup,
            ..Self::calm()
        }
    }

    /// The runner's defaults: about 27% of dispatch calls left ambiguous to the client.
    pub fn standard() -> Self {
        use DispatchFault as D;
        Self {
            dispatch: BTreeMap::from([
                (D::CommitThenTimeout, 0.05),
                (D::TimeoutNoCommit, 0.04),
                (D::LateCommit, 0.07),
                (D::CommitThen5xx, 0.04),
                (D::CommitThenDrop, 0.04),
                (D::DoubleCommit, 0.03),
                (D::Refuse5xx, 0.03),
            ]),
            inconclusive_check: 0.08,
            lagging_lookup: 0.15,
            slow_lookup: 0.04,
            reverse: BTreeMap::from([
                (ReverseFault::ReverseThen5xx, 0.05),
                (ReverseFault::ReverseThenDrop, 0.04),
                (ReverseFault::TimeoutNoReverse, 0.04),
            ]),
        }
    }

    /// Every rate multiplied by `factor` (clamped so each table still sums to at most 1).
    #[must_use]
    pub fn scaled(&self, factor: f64) -> Self {
        Self {
            dispatch: scale(&self.dispatch, factor),
            inconclusive_check: (self.inconclusive_check * factor).clamp(0.0, 1.0),
            lagging_lookup: (self.lagging_lookup * factor).clamp(0.0, 1.0),
            slow_lookup: (self.slow_lookup * factor).clamp(0.0, 1.0),
            reverse: scale(&self.reverse, factor),
        }
    }

    /// The fault of the `ordinal`-th dispatch request for `key` at `endpoint`. A double commit
    /// happens only where `doubles` allows it (otherwise the request is served faultlessly).
    pub fn dispatch_fault(
        &self,
        seed: u64,
        endpoint: &str,
        key: &str,
        ordinal: u64,
        doubles: bool,
    ) -> DispatchFault {
        let draw = dice::unit(seed, &["dispatch", endpoint, key, &ordinal.to_string()]);
        let fault = pick(&self.dispatch, draw).unwrap_or(DispatchFault::None);
        if !doubles && fault == DispatchFault::DoubleCommit {
            DispatchFault::None
        } else {
            fault
        }
    }

    /// Whether the `ordinal`-th status check for `key` at `endpoint` answers inconclusive.
    pub fn check_inconclusive(&self, seed: u64, endpoint: &str, key: &str, ordinal: u64) -> bool {
        dice::unit(seed, &["check", endpoint, key, &ordinal.to_string()]) < self.inconclusive_check
    }

    /// Whether every status check for `key` at `endpoint` is slow (see
    /// [`Self::slow_lookup`]). Drawn per key, not per request: a slow key stays slow.
    pub fn slow_lookup(&self, seed: u64, endpoint: &str, key: &str) -> bool {
        dice::unit(seed, &["slow-lookup", endpoint, key]) < self.slow_lookup
    }

    /// The fault of the `ordinal`-th reversal request with compensation key `key`.
    pub fn reverse_fault(
        &self,
        seed: u64,
        endpoint: &str,
        key: &str,
        ordinal: u64,
    ) -> ReverseFault {
        let draw = dice::unit(seed, &["reverse", endpoint, key, &ordinal.to_string()]);
        pick(&self.reverse, draw).unwrap_or(ReverseFault::None)
    }

    /// Whether commit `id` is seen by lookups only after a lag.
    pub fn lagged(&self, seed: u64, id: &str) -> bool {
        dice::unit(seed, &["lag", id]) < self.lagging_lookup
    }
}

/// `table` with every rate multiplied by `factor`, shrunk to sum to at most 1.
fn scale<K: Copy + Ord>(table: &BTreeMap<K, f64>, factor: f64) -> BTreeMap<K, f64> {
    let total: f64 = table.values().sum::<f64>() * factor;
    let shrink = if total > 1.0 { 1.0 / total } else { 1.0 };
    table
        .iter()
        .map(|(k, v)| (*k, (v * factor * shrink).clamp(0.0, 1.0)))
        .collect()
}

/// The key whose cumulative rate first exceeds `draw`, if any.
fn pick<K: Copy>(table: &BTreeMap<K, f64>, draw: f64) -> Option<K> {
    let mut cumulative = 0.0;
    for (kind, rate) in table {
        cumulative += rate;
        if draw < cumulative {
            return Some(*kind);
        }
    }
    None
}

/// How long faults hold and lag, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultTimes {
    /// A held answer is sent this long after the client's timeout (the client is gone by then).
    pub hold_past_timeout_ms: u64,
    /// A late commit lands this long after the client's timeout: uniformly in this range. Its
    /// upper end is the late-commit horizon: no attempt lands later than its arrival plus the
    /// call's timeout plus this.
    pub late_commit_ms: (u64, u64),
    /// A lagged commit becomes visible to lookups this long after it committed.
    pub lag_ms: (u64, u64),
}

impl FaultTimes {
    /// The latest a late commit lands after the client's timeout.
    pub fn late_commit_horizon_ms(&self) -> u64 {
        self.late_commit_ms.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_pick_every_fault_about_as_often_as_declared() {
        let rates = FaultRates::standard();
        let n = 40_000u64;
        let mut counts: BTreeMap<DispatchFault, u64> = BTreeMap::new();
        for i in 0..n {
            let fault = rates.dispatch_fault(3, "wires", &format!("k{i}"), 0, true);
            *counts.entry(fault).or_default() += 1;
        }
        for (fault, rate) in &rates.dispatch {
            let seen = counts.get(fault).copied().unwrap_or(0) as f64 / n as f64;
            assert!((seen - rate).abs() < 0.01, "{fault}: {seen} vs {rate}");
        }
        let ambiguous: f64 = rates
            .dispatch
            .iter()
            .filter(|(fault, _)| fault.ambiguous())
            .map(|(_, rate)| rate)
            .sum();
        assert!(ambiguous >= 0.2, "{ambiguous}");
    }

    #[test]
    fn double_commits_only_where_allowed_and_calm_means_none() {
        let rates = FaultRates {
            dispatch: BTreeMap::from([(DispatchFault::DoubleCommit, 1.0)]),
            ..FaultRates::calm()
        };
        assert_eq!(
            rates.dispatch_fault(1, "e", "k", 0, false),
            DispatchFault::None
        );
        assert_eq!(
            rates.dispatch_fault(1, "e", "k", 0, true),
            DispatchFault::DoubleCommit
        );
        let calm = FaultRates::calm();
        assert_eq!(
            calm.dispatch_fault(1, "e", "k", 0, false),
            DispatchFault::None
        );
        assert!(!calm.check_inconclusive(1, "e", "k", 0));
        assert!(!calm.lagged(1, "c-1"));
        assert!(!calm.slow_lookup(1, "e", "k"));
    }

    #[test]
    fn a_slow_lookup_key_stays_slow_when_the_faults_stop() {
        let rates = FaultRates {
            slow_lookup: 0.5,
            ..FaultRates::standard()
        };
        let slow: Vec<String> = (0..200)
            .map(|i| format!("k{i}"))
            .filter(|k| rates.slow_lookup(5, "wires", k))
            .collect();
        assert!((60..140).contains(&slow.len()), "{}", slow.len());
        let calmed = rates.calmed();
        assert!(calmed.dispatch.is_empty() && calmed.inconclusive_check == 0.0);
        assert!(slow.iter().all(|k| calmed.slow_lookup(5, "wires", k)));
    }

    #[test]
    fn scaling_keeps_each_table_a_distribution() {
        let loud = FaultRates::standard().scaled(10.0);
        let total: f64 = loud.dispatch.values().sum();
        assert!((total - 1.0).abs() < 1e-9, "{total}");
        let quiet = FaultRates::standard().scaled(0.0);
        assert!(quiet.dispatch.values().all(|r| *r == 0.0));
    }
}
