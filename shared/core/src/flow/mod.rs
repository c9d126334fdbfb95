//! Flow control: what may be sent to an upstream now. A tool belongs to an upstream (its own,
//! or a named one several tools share, `[upstream.<name>]` in the catalog) that can declare a
//! rate, a cap on calls in flight and a circuit breaker; an operator can pause a tool or an
//! upstream. Everything here is a decision on values; the dispatcher carries it out
//! (`services/dispatcher`, with `sluice_runtime::flow` keeping the per-process counts) and the
//! ledger stores the controls every replica shares ([`FlowControl`]).
//!
//! A command that may not go now is never refused and never spends an attempt: it is put back
//! in the ledger until its time (`machine::Event::Hold`), and the sweep brings it back. Why
//! this and not waiting in the dispatcher: docs/decisions.md, "Flow control".

mod breaker;
mod rate;
mod slot;

pub use breaker::{BreakerSpec, Verdict, after_call, claim_probe, verdict};
pub use rate::{Bucket, Rate};
pub use slot::{SlotWait, booked_slot_come, wait_for_slot};

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// How often a paused tool's commands look again whether the pause is over: a resume is seen
/// within this (plus a sweep interval), and a paused command costs one ledger write per
/// period.
pub const PAUSE_RECHECK_MS: i64 = 10_000;

/// How long a call waiting for a slot or a free place in flight may wait inside the
/// dispatcher, holding its bus partition, before it is put back in the ledger instead.
pub const WAIT_IN_PROCESS_MS: i64 = 250;

/// How long a call kept back by the cap on calls in flight is put back for.
pub const IN_FLIGHT_RECHECK_MS: i64 = 1_000;

/// When a call kept back at `now` by the cap on calls in flight is looked at again.
pub fn in_flight_recheck(now: Timestamp) -> Timestamp {
    now.plus_millis(IN_FLIGHT_RECHECK_MS)
}

/// An upstream's declared limits (`[upstream.<name>]` in the catalog), with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    pub name: String,
    /// Calls per period over every dispatcher replica together; `None`: no limit.
    pub rate: Option<Rate>,
    /// Calls that may go at once after a quiet spell (at least 1).
    pub burst: u32,
    /// Calls in flight at once over every replica; `None`: no cap.
    pub max_in_flight: Option<u32>,
    pub breaker: Option<BreakerSpec>,
}

impl UpstreamSpec {
    /// The spec of a tool that names no upstream: its own, with no limit.
    pub fn unlimited(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            rate: None,
            burst: 1,
            max_in_flight: None,
            breaker: None,
        }
    }

    /// This replica's part of the cap on calls in flight when it owns `share` of the work:
    /// rounded up, so every replica can send at least one.
    pub fn in_flight_share(&self, share: f64) -> Option<u32> {
        let cap = self.max_in_flight?;
        let share = if share.is_finite() && share > 0.0 {
            share.min(1.0)
        } else {
            1.0
        };
        Some(((f64::from(cap) * share).ceil() as u32).clamp(1, cap))
    }
}

/// An operator's pause of a tool or an upstream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    pub actor: String,
    pub reason: String,
    pub at: Timestamp,
}

/// A circuit breaker's state, shared by every replica through the ledger.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Breaker {
    /// Calls go.
    #[default]
    Closed,
    /// Calls wait until `probe_at`, then one probe goes. `opened`: how many times in a row it
    /// opened (a failed probe opens it again for longer).
    Open {
        since: Timestamp,
        probe_at: Timestamp,
        opened: u32,
        reason: String,
    },
    /// One call (`probe_by`'s) tests the upstream until `until`; every other waits.
    HalfOpen {
        since: Timestamp,
        probe_by: String,
        until: Timestamp,
        opened: u32,
    },
}

impl Breaker {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open { .. } => "open",
            Self::HalfOpen { .. } => "half_open",
        }
    }
}

/// What is stored for one tool or upstream name: an operator's pause and its breaker.
/// `version` guards its writes (compare-and-set); 0 is "never written".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowControl {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
    #[serde(default)]
    pub breaker: Breaker,
    #[serde(default)]
    pub version: u64,
}

impl FlowControl {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }
}

/// Why a call was kept back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldCause {
    Paused,
    BreakerOpen,
    Rate,
    InFlight,
}

impl HoldCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Paused => "paused",
            Self::BreakerOpen => "breaker_open",
            Self::Rate => "rate",
            Self::InFlight => "in_flight",
        }
    }
}

/// What the controls say about a call to an upstream now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// It may go (subject to the rate and the cap, counted by the caller).
    Go,
    /// The breaker waits for a probe: this call may be it, if its dispatcher wins the probe's
    /// claim ([`claim_probe`]); otherwise it is held until the probe's end.
    Probe,
    /// Not now.
    Hold(Held),
}

/// A call kept back: put back in the ledger until `until` (`machine::Event::Hold`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub until: Timestamp,
    pub cause: HoldCause,
    pub reason: String,
}

/// The gate for a call of `tool` on `upstream` given the stored controls of each (either may
/// be absent): a pause of either holds it, then the upstream's breaker decides.
pub fn gate(tool: Option<&FlowControl>, upstream: Option<&FlowControl>, now: Timestamp) -> Gate {
    for control in [tool, upstream].into_iter().flatten() {
        if let Some(pause) = &control.paused {
            return Gate::Hold(Held {
                until: now.plus_millis(PAUSE_RECHECK_MS),
                cause: HoldCause::Paused,
                reason: format!(
                    "{} paused by {} at {}: {}",
                    control.name, pause.actor, pause.at, pause.reason
                ),
            });
        }
    }
    let Some(upstream) = upstream else {
        return Gate::Go;
    };
    match &upstream.breaker {
        Breaker::Closed => Gate::Go,
        Breaker::Open {
            probe_at, reason, ..
        } if *probe_at > now => Gate::Hold(Held {
            until: *probe_at,
            cause: HoldCause::BreakerOpen,
            reason: format!(
                "upstream {}'s circuit breaker is open ({reason}); a probe tests it at {probe_at}",
                upstream.name
            ),
        }),
        Breaker::HalfOpen {
            until, probe_by, ..
        } if *until > now => Gate::Hold(Held {
            until: *until,
            cause: HoldCause::BreakerOpen,
            reason: format!(
                "upstream {}'s circuit breaker is half open: {probe_by}'s probe tests it until {until}",
                upstream.name
            ),
        }),
        // The probe is due, or the last probe's holder went quiet past its time.
        Breaker::Open { .. } | Breaker::HalfOpen { .. } => Gate::Probe,
    }
}

/// A command's own spread around a hold's end, so a backlog held until one time does not come
/// back in one burst: up to a fifth of the hold, at most 2 s, from a hash of its key.
pub fn jitter_ms(key: &str, hold_ms: i64) -> i64 {
    let spread = (hold_ms / 5).clamp(0, 2_000);
    if spread == 0 {
        return 0;
    }
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    i64::try_from(hash % u64::try_from(spread).unwrap_or(1)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn paused(name: &str) -> FlowControl {
        FlowControl {
            paused: Some(Pause {
                actor: "ops".into(),
                reason: "bank maintenance".into(),
                at: at(0),
            }),
            ..FlowControl::new(name)
        }
    }

    #[test]
    fn a_pause_of_the_tool_or_its_upstream_holds_the_call_and_says_who_and_why() {
        for (tool, upstream) in [
            (Some(paused("bank.wire")), None),
            (None, Some(paused("bank"))),
        ] {
            let Gate::Hold(Held {
                until,
                cause,
                reason,
            }) = gate(tool.as_ref(), upstream.as_ref(), at(1_000))
            else {
                panic!("not held");
            };
            assert_eq!(cause, HoldCause::Paused);
            assert_eq!(until, at(1_000 + PAUSE_RECHECK_MS));
            assert!(
                reason.contains("ops") && reason.contains("bank maintenance"),
                "{reason}"
            );
        }
        assert_eq!(gate(None, Some(&FlowControl::new("bank")), at(0)), Gate::Go);
        assert_eq!(gate(None, None, at(0)), Gate::Go);
    }

    #[test]
    fn an_open_breaker_holds_until_its_probe_then_offers_the_probe() {
        let open = FlowControl {
            breaker: Breaker::Open {
                since: at(0),
                probe_at: at(5_000),
                opened: 1,
                reason: "5 failures in a row".into(),
            },
            ..FlowControl::new("bank")
        };
        assert!(matches!(
            gate(None, Some(&open), at(4_999)),
            Gate::Hold(Held { until, cause: HoldCause::BreakerOpen, .. }) if until == at(5_000)
        ));
        assert_eq!(gate(None, Some(&open), at(5_000)), Gate::Probe);
        let half = FlowControl {
            breaker: Breaker::HalfOpen {
                since: at(5_000),
                probe_by: "d-1".into(),
                until: at(8_000),
                opened: 1,
            },
            ..FlowControl::new("bank")
        };
        assert!(
            matches!(gate(None, Some(&half), at(6_000)), Gate::Hold(Held { until, .. }) if until == at(8_000))
        );
        // The probe's holder went quiet: another may probe.
        assert_eq!(gate(None, Some(&half), at(8_000)), Gate::Probe);
    }

    #[test]
    fn the_cap_in_flight_is_shared_by_ownership_and_never_below_one() {
        let spec = UpstreamSpec {
            max_in_flight: Some(5),
            ..UpstreamSpec::unlimited("bank")
        };
        assert_eq!(spec.in_flight_share(1.0), Some(5));
        assert_eq!(spec.in_flight_share(0.5), Some(3));
        assert_eq!(spec.in_flight_share(0.01), Some(1));
        assert_eq!(UpstreamSpec::unlimited("x").in_flight_share(0.5), None);
    }

    #[test]
    fn jitter_stays_within_a_fifth_of_the_hold_and_two_seconds() {
        for key in ["a", "b", "d-1/ns/x/0", "d-2/ns/x/9"] {
            assert!((0..200).contains(&jitter_ms(key, 1_000)));
            assert!((0..2_000).contains(&jitter_ms(key, 60_000)));
        }
        assert_eq!(jitter_ms("a", 0), 0);
    }
}
