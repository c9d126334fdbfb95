//! `GET /v1/overview`: how the pipeline has been doing over the last hour, minute by minute,
//! from this process's own counters — no external service, nothing read from the ledger.
//!
//! Once a minute the server takes a sample into a ring of the last [`MINUTES`]: how many
//! effects reached each final status in that minute (from `sluice_transitions_total`, the
//! difference since the previous sample) and how many commands were UNKNOWN, STUCK and
//! BLOCKED at its end (from the state gauges, `sluice_commands`). The answer adds the minute
//! under way, read at the request, so the newest point is never a minute old.
//!
//! What a process counts is what it did and saw: `sluice dev` and an embedded deployment see
//! the whole pipeline; in a distributed one the transitions are counted by the processes that
//! make them (dispatchers, reconcilers), and the state counts by the one with
//! `metrics.command_gauges` on. The answer says whether this process keeps the gauges.
//! The ring lives in memory and starts empty at every start.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use prometheus::core::Collector;
use serde::Serialize;
use serde_json::json;
use sluice_core::command::CommandStatus;
use sluice_core::time::Timestamp;
use sluice_runtime::Shutdown;
use sluice_runtime::metrics::Metrics;

use crate::auth::{Caller, Need};
use crate::{Api, ApiError};

/// Minutes the ring holds: one hour.
pub const MINUTES: usize = 60;

/// How often a sample is taken.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);

/// Transitions counted so far into each final status (`CONFIRMED`, `FAILED`, …), since start.
pub type Totals = BTreeMap<String, u64>;

/// Commands held in the statuses a person watches, at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Levels {
    pub unknown: u64,
    pub stuck: u64,
    pub blocked: u64,
}

/// One minute of the ring.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// When the minute began (the previous sample) and ended (this one).
    pub from: Timestamp,
    pub to: Timestamp,
    /// Effects that reached each final status in the minute; statuses with none are left out.
    pub settled: BTreeMap<String, u64>,
    /// The held counts at the minute's end.
    #[serde(flatten)]
    pub levels: Levels,
    /// The minute under way, read at the request.
    pub partial: bool,
}

#[derive(Debug)]
struct Ring {
    minutes: VecDeque<Minute>,
    /// The totals and time of the last sample (the baseline at start).
    last: Totals,
    last_at: Timestamp,
}

/// The ring of per-minute samples; one per API, shared by its clones.
#[derive(Debug)]
pub struct Pulse {
    ring: Mutex<Ring>,
}

/// `now - before`, by status; a counter that went back (it cannot, short of a restart) counts
/// from zero.
fn delta(now: &Totals, before: &Totals) -> BTreeMap<String, u64> {
    now.iter()
        .filter_map(|(status, &count)| {
            let previous = before.get(status).copied().unwrap_or(0);
            let moved = if count >= previous {
                count - previous
            } else {
                count
            };
            (moved > 0).then(|| (status.clone(), moved))
        })
        .collect()
}

impl Pulse {
    /// An empty ring whose first minute begins at `at`, from `totals`.
    pub fn starting(at: Timestamp, totals: Totals) -> Self {
        Self {
            ring: Mutex::new(Ring {
                minutes: VecDeque::with_capacity(MINUTES),
                last: totals,
                last_at: at,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ring> {
        // Plain figures: a ring poisoned by a panic elsewhere is still good to read.
        self.ring.lock().unwrap_or_else(|poisoned| {
            self.ring.clear_poison();
            poisoned.into_inner()
        })
    }

    /// Closes the minute ending `at` with the counters as they are then; the oldest minute
    /// leaves the ring once it holds [`MINUTES`].
    pub fn sample(&self, at: Timestamp, totals: Totals, levels: Levels) {
        let mut ring = self.lock();
        let minute = Minute {
            from: ring.last_at,
            to: at,
            settled: delta(&totals, &ring.last),
            levels,
            partial: false,
        };
        if ring.minutes.len() == MINUTES {
            ring.minutes.pop_front();
        }
        ring.minutes.push_back(minute);
        ring.last = totals;
        ring.last_at = at;
    }

    /// The minutes of the ring, oldest first, and the one under way at `now`.
    pub fn minutes(&self, now: Timestamp, totals: &Totals, levels: Levels) -> Vec<Minute> {
        let ring = self.lock();
        let mut minutes: Vec<Minute> = ring.minutes.iter().cloned().collect();
        minutes.push(Minute {
            from: ring.last_at,
            to: now,
            settled: delta(totals, &ring.last),
            levels,
            partial: true,
        });
        minutes
    }
}

/// The transitions counted into each final status so far, over every tool (from another
/// status: each is an effect settling).
pub fn totals(metrics: &Metrics) -> Totals {
    let mut totals = Totals::new();
    for family in metrics.transitions.collect() {
        for metric in family.get_metric() {
            let label = |name: &str| {
                metric
                    .get_label()
                    .iter()
                    .find(|label| label.name() == name)
                    .map(|label| label.value())
            };
            let Some(Ok(status)) = label("to").map(str::parse::<CommandStatus>) else {
                continue;
            };
            // A write that leaves a settled effect where it was (a later look confirming a
            // CONFIRMED wire) settles nothing new.
            if status.is_terminal() && label("from") != label("to") {
                // A counter's value is a whole number kept as a float.
                let count = metric.get_counter().get_value().max(0.0) as u64;
                *totals.entry(status.as_str().to_owned()).or_default() += count;
            }
        }
    }
    totals
}

/// The held counts now, and whether this process keeps them (its gauges are seeded).
pub fn levels(metrics: &Metrics, now: Timestamp) -> (Levels, bool) {
    let figures = metrics.commands.figures(now);
    // The gauges' figures shown for three statuses: a projection, like a `?status=` filter.
    let held = |shown: CommandStatus| -> u64 {
        figures
            .iter()
            .filter(|figure| figure.status == shown)
            .map(|figure| figure.count)
            .sum()
    };
    let levels = Levels {
        unknown: held(CommandStatus::Unknown),
        stuck: held(CommandStatus::Stuck),
        blocked: held(CommandStatus::Blocked),
    };
    (levels, metrics.commands.is_seeded())
}

/// Takes a sample every [`SAMPLE_EVERY`] until `shutdown`.
pub(crate) async fn sample_every_minute(api: Api, shutdown: Shutdown) {
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await; // the first tick is at once: the baseline is already taken
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = ticks.tick() => {
                let metrics = &api.ctx.metrics;
                let now = api.ctx.clock.now();
                api.pulse.sample(now, totals(metrics), levels(metrics, now).0);
            }
        }
    }
}

/// `GET /v1/overview`: the last hour, minute by minute (an operator or an admin: the figures
/// cover every run).
pub async fn overview(
    State(api): State<Api>,
    Caller(principal): Caller,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadAll)?;
    let metrics = &api.ctx.metrics;
    let now = api.ctx.clock.now();
    let (held, gauges) = levels(metrics, now);
    let minutes = api.pulse.minutes(now, &totals(metrics), held);
    Ok(Json(json!({
        "at": now,
        "sample_ms": SAMPLE_EVERY.as_millis() as u64,
        "gauges": gauges,
        "minutes": minutes,
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals_of(pairs: &[(&str, u64)]) -> Totals {
        pairs.iter().map(|(s, n)| ((*s).to_owned(), *n)).collect()
    }

    fn at(minute: i64) -> Timestamp {
        Timestamp::from_millis(1_800_000_000_000 + minute * 60_000)
    }

    #[test]
    fn each_minute_counts_what_settled_in_it_and_the_levels_at_its_end() {
        let pulse = Pulse::starting(at(0), totals_of(&[("CONFIRMED", 5)]));
        let held = Levels {
            unknown: 1,
            stuck: 2,
            blocked: 3,
        };
        pulse.sample(at(1), totals_of(&[("CONFIRMED", 9), ("FAILED", 1)]), held);
        pulse.sample(
            at(2),
            totals_of(&[("CONFIRMED", 9), ("FAILED", 1)]),
            Levels::default(),
        );
        let now = at(2).plus_millis(20_000);
        let minutes = pulse.minutes(now, &totals_of(&[("CONFIRMED", 12), ("FAILED", 1)]), held);
        assert_eq!(minutes.len(), 3);
        assert_eq!(
            minutes[0].settled,
            totals_of(&[("CONFIRMED", 4), ("FAILED", 1)])
        );
        assert_eq!((minutes[0].from, minutes[0].to), (at(0), at(1)));
        assert_eq!(minutes[0].levels, held);
        assert!(
            minutes[1].settled.is_empty(),
            "a quiet minute settles nothing"
        );
        assert_eq!(minutes[2].settled, totals_of(&[("CONFIRMED", 3)]));
        assert!(minutes[2].partial && !minutes[1].partial);
        assert_eq!((minutes[2].from, minutes[2].to), (at(2), now));
        let shown = serde_json::to_value(&minutes[0]).expect("serializes");
        assert_eq!(shown["stuck"], 2, "{shown}");
        assert_eq!(shown["settled"]["CONFIRMED"], 4, "{shown}");
    }

    #[test]
    fn the_ring_keeps_the_last_hour() {
        let pulse = Pulse::starting(at(0), Totals::new());
        for minute in 1..=(MINUTES as i64 + 15) {
            let confirmed = u64::try_from(minute).expect("positive");
            pulse.sample(
                at(minute),
                totals_of(&[("CONFIRMED", confirmed)]),
                Levels::default(),
            );
        }
        let minutes = pulse.minutes(at(76), &totals_of(&[("CONFIRMED", 75)]), Levels::default());
        assert_eq!(
            minutes.len(),
            MINUTES + 1,
            "an hour and the minute under way"
        );
        assert_eq!(minutes[0].from, at(15), "the oldest minutes left the ring");
        assert!(
            minutes[..MINUTES]
                .iter()
                .all(|m| m.settled["CONFIRMED"] == 1)
        );
    }

    #[test]
    fn the_totals_are_the_final_transitions_of_the_counters() {
        let metrics = Metrics::new();
        let bump = |from: &str, to: &str, n: u64| {
            metrics
                .transitions
                .with_label_values(&["payments/wire", from, to])
                .inc_by(n);
        };
        bump("LEASED", "CONFIRMED", 3);
        bump("UNKNOWN", "CONFIRMED", 2);
        bump("LEASED", "UNKNOWN", 7);
        bump("COMPENSATING", "COMPENSATED", 1);
        bump("CONFIRMED", "CONFIRMED", 4);
        assert_eq!(
            totals(&metrics),
            totals_of(&[("COMPENSATED", 1), ("CONFIRMED", 5)]),
            "final statuses only, entered from another, summed over where they came from"
        );
    }
}
