//! Every metric of the services, named in one place: `sluice_<thing>_<unit>`, labels bounded
//! (tool, status, outcome, topic, route — never a run id).

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};
use sluice_ledger::Ledger;

use sluice_core::command::{Command, CommandStatus};

/// The services' metrics, registered in their own registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// `sluice_transitions_total{tool, from, to}`
    pub transitions: IntCounterVec,
    /// `sluice_cas_conflicts_total`: guarded writes that found the command changed.
    pub cas_conflicts: IntCounter,
    /// `sluice_escalations_total`: commands handed to a person.
    pub escalations: IntCounter,
    /// `sluice_dispatch_duration_seconds{tool, outcome}`: upstream calls.
    pub dispatch_seconds: HistogramVec,
    /// `sluice_dead_letters_total{topic}`: messages that could not be used.
    pub dead_letters: IntCounterVec,
    /// `sluice_handler_errors_total{topic}`: handler attempts that failed (each retry counts).
    pub handler_errors: IntCounterVec,
    /// `sluice_quarantined_messages_total{topic}`: messages about a command the ledger cannot
    /// decode, dead-lettered at once and escalated.
    pub quarantined_messages: IntCounterVec,
    /// `sluice_dead_letters_unpublished_total{topic}`: messages acknowledged without a dead
    /// letter because the dead-letter topic kept refusing them (their payload is logged).
    pub dead_letters_unpublished: IntCounterVec,
    /// `sluice_sweep_items_total{status}`: due items the sweeps acted on.
    pub sweep_items: IntCounterVec,
    /// `sluice_http_requests_total{route, status}`
    pub http_requests: IntCounterVec,
    /// `sluice_effects_submitted_total{tool, outcome}`: created, replayed, drift, invalid.
    pub submissions: IntCounterVec,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new_custom(Some("sluice".into()), None)
            .expect("a static prefix is a valid metric prefix");
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let vec = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("metric definitions are static and valid");
            registry
                .register(Box::new(vec.clone()))
                .expect("each metric is registered once");
            vec
        };
        let transitions = counter(
            "transitions_total",
            "Command state transitions stored",
            &["tool", "from", "to"],
        );
        let dead_letters = counter(
            "dead_letters_total",
            "Bus messages sent to the dead-letter topic",
            &["topic"],
        );
        let handler_errors = counter(
            "handler_errors_total",
            "Failed handler attempts, by the topic of the message",
            &["topic"],
        );
        let quarantined_messages = counter(
            "quarantined_messages_total",
            "Messages about a command the ledger cannot decode, dead-lettered at once",
            &["topic"],
        );
        let dead_letters_unpublished = counter(
            "dead_letters_unpublished_total",
            "Messages acknowledged without a dead letter: the dead-letter topic kept refusing them",
            &["topic"],
        );
        let sweep_items = counter(
            "sweep_items_total",
            "Due commands the sweeps acted on",
            &["status"],
        );
        let http_requests = counter(
            "http_requests_total",
            "HTTP requests answered by the producer",
            &["route", "status"],
        );
        let submissions = counter(
            "effects_submitted_total",
            "Effect submissions by outcome",
            &["tool", "outcome"],
        );
        let single = |name: &str, help: &str| {
            let counter =
                IntCounter::new(name, help).expect("metric definitions are static and valid");
            registry
                .register(Box::new(counter.clone()))
                .expect("each metric is registered once");
            counter
        };
        let cas_conflicts = single(
            "cas_conflicts_total",
            "Guarded ledger writes that found the command changed",
        );
        let escalations = single("escalations_total", "Commands escalated to a person");
        let dispatch_seconds = HistogramVec::new(
            HistogramOpts::new("dispatch_duration_seconds", "Upstream dispatch calls").buckets(
                vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
                ],
            ),
            &["tool", "outcome"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(dispatch_seconds.clone()))
            .expect("each metric is registered once");
        Self {
            registry,
            transitions,
            cas_conflicts,
            escalations,
            dispatch_seconds,
            dead_letters,
            handler_errors,
            quarantined_messages,
            dead_letters_unpublished,
            sweep_items,
            http_requests,
            submissions,
        }
    }

    /// Counts a stored transition.
    pub fn transition(&self, command: &Command, from: CommandStatus) {
        self.transitions
            .with_label_values(&[
                &command.tool.to_string(),
                from.as_str(),
                command.status().as_str(),
            ])
            .inc();
    }

    /// Exports `sluice_ledger_round_trips_total{op, kind}` and
    /// `sluice_ledger_quarantined_commands_total` from `ledger`'s own counters, read at every
    /// scrape. Call once per registry.
    pub fn observe_ledger(&self, ledger: Arc<dyn Ledger>) {
        let counter = IntCounterVec::new(
            Opts::new(
                "ledger_round_trips_total",
                "Round trips to the ledger's store by operation and kind (lwt, serial, plain)",
            ),
            &["op", "kind"],
        )
        .expect("metric definitions are static and valid");
        let quarantined = IntCounter::new(
            "ledger_quarantined_commands_total",
            "Commands the ledger found it cannot decode and set aside (sweeps skip them)",
        )
        .expect("metric definitions are static and valid");
        if let Err(error) = self.registry.register(Box::new(LedgerRoundTrips {
            ledger,
            counter,
            quarantined,
        })) {
            tracing::warn!(%error, "ledger round trips are already exported");
        }
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Copies a ledger's round-trip and quarantine counts into counters when scraped.
#[derive(Debug)]
struct LedgerRoundTrips {
    ledger: Arc<dyn Ledger>,
    counter: IntCounterVec,
    quarantined: IntCounter,
}

impl Collector for LedgerRoundTrips {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.counter.desc();
        descs.extend(self.quarantined.desc());
        descs
    }

    fn collect(&self) -> Vec<MetricFamily> {
        // Only this collector moves the counters, so each holds the count of the last scrape.
        for trips in self.ledger.round_trips() {
            let counter = self.counter.with_label_values(&[trips.op, trips.kind]);
            counter.inc_by(trips.count.saturating_sub(counter.get()));
        }
        let quarantined = self.ledger.quarantined();
        self.quarantined
            .inc_by(quarantined.saturating_sub(self.quarantined.get()));
        let mut families = self.counter.collect();
        families.extend(self.quarantined.collect());
        families
    }
}
