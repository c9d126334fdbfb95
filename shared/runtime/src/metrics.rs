//! Every metric of the services, named in one place: `sluice_<thing>_<unit>`, labels bounded
//! (tool, status, outcome, topic, route — never a run id).
//!
//! Figures owned by something else (the ledger's round trips, the state gauges) are read by a
//! [`Collector`] at each scrape into metrics built for that scrape alone, so two scrapes at
//! once cannot race on a shared counter.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};
use sluice_ledger::Ledger;

use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::machine::Rules;
use sluice_core::time::Clock;

use crate::gauges::CommandGauges;

/// Buckets of `sluice_http_request_duration_seconds`: a submission answers in milliseconds, a
/// long poll in up to `producer.max_wait_ms` (60 s by default).
const HTTP_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0,
];

/// Retention's scheduled purges, carried out by the reconciler: `sluice_purged_runs_total`
/// (finished runs removed), `sluice_purge_kept_runs` (runs past the retention the last
/// purge kept because a command still owes work) and `sluice_purge_duration_seconds` (one scheduled
/// purge, all its calls, by `outcome`: `done`, `cut_off` at its lease's end, `failed`).
#[derive(Debug, Clone)]
pub struct PurgeMetrics {
    pub runs: IntCounter,
    pub kept: IntGauge,
    pub seconds: HistogramVec,
}

impl PurgeMetrics {
    fn register(registry: &Registry) -> Self {
        let single = |name: &str, help: &str| {
            let counter =
                IntCounter::new(name, help).expect("metric definitions are static and valid");
            registry
                .register(Box::new(counter.clone()))
                .expect("each metric is registered once");
            counter
        };
        let seconds = HistogramVec::new(
            HistogramOpts::new(
                "purge_duration_seconds",
                "Time one scheduled purge took, all its calls, by outcome",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
            ]),
            &["outcome"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(seconds.clone()))
            .expect("each metric is registered once");
        Self {
            runs: single(
                "purged_runs_total",
                "Finished runs removed by the scheduled purge",
            ),
            kept: {
                let gauge = IntGauge::new(
                    "purge_kept_runs",
                    "Runs past the retention the last scheduled purge kept: a command owes work",
                )
                .expect("metric definitions are static and valid");
                registry
                    .register(Box::new(gauge.clone()))
                    .expect("each metric is registered once");
                gauge
            },
            seconds,
        }
    }
}

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
    /// Flow control's holds, breakers and pauses (`crate::flow`).
    pub flow: crate::flow::FlowMetrics,
    /// Retention's scheduled purges ([`PurgeMetrics`]).
    pub purge: PurgeMetrics,
    /// `sluice_dispatch_duration_seconds{tool, outcome}`: upstream calls.
    pub dispatch_seconds: HistogramVec,
    /// `sluice_handle_duration_seconds{topic}`: how long each consumed message held its
    /// partition, from hand-out to acknowledgement (retries and dead-lettering included).
    /// A partition takes its next message only then, so this bounds a partition's rate.
    pub handle_seconds: HistogramVec,
    /// `sluice_dead_letters_total{topic}`: messages that could not be used.
    pub dead_letters: IntCounterVec,
    /// `sluice_handler_errors_total{topic}`: handler attempts that failed (each retry counts).
    pub handler_errors: IntCounterVec,
    /// `sluice_handler_panics_total{topic}`: handler attempts that panicked (each retry
    /// counts; also counted in `sluice_handler_errors_total`). A panic is a bug: any is worth
    /// a look.
    pub handler_panics: IntCounterVec,
    /// `sluice_quarantined_messages_total{topic}`: messages about a command the ledger cannot
    /// decode, dead-lettered at once and escalated.
    pub quarantined_messages: IntCounterVec,
    /// `sluice_messages_skipped_total{topic, reason}`: messages of a newer build acknowledged
    /// without being handled or dead-lettered (`crate::consumer`, "Messages of a newer build"):
    /// `newer_format`, `unknown_kind`, `newer_command`. Expected during a rolling upgrade;
    /// outside one, a newer build is writing to this install's topics.
    pub messages_skipped: IntCounterVec,
    /// `sluice_dead_letters_unpublished_total{topic}`: messages acknowledged without a dead
    /// letter because the dead-letter topic kept refusing them (their payload is logged).
    pub dead_letters_unpublished: IntCounterVec,
    /// `sluice_sweep_items_total{status}`: due items the sweeps acted on.
    pub sweep_items: IntCounterVec,
    /// `sluice_http_requests_total{route, status}`
    pub http_requests: IntCounterVec,
    /// `sluice_effects_submitted_total{tool, outcome}`: created, replayed, drift, invalid.
    pub submissions: IntCounterVec,
    /// `sluice_http_request_duration_seconds{method, route, status}`: the producer's answers,
    /// by route template (never a concrete path, which would name runs).
    pub http_seconds: HistogramVec,
    /// `sluice_http_waiting_requests`: requests holding their answer now (long polls and
    /// `Prefer: wait`), bounded by `producer.max_waits`.
    pub waiting_requests: IntGauge,
    /// `sluice_tenant_submissions_refused_total{tenant}`: submissions refused because their
    /// tenant held its whole quota in flight (429, nothing recorded).
    pub tenant_refused: IntCounterVec,
    /// `sluice_budget_admissions_total{budget, outcome}`: admissions a spend budget decided —
    /// `held` (the amount reserved), `denied` (over it, refused) and `deferred` (over it, sent
    /// for approval). Labelled by budget name only: the catalog's, never a run or tenant.
    pub budget_admissions: IntCounterVec,
    /// `sluice_budget_held_minor{budget, currency}`: minor units held in the current window,
    /// summed over the budget's scopes, as last read by `GET /v1/budgets` or an admission.
    pub budget_held: prometheus::IntGaugeVec,
    /// `sluice_dispatch_copies_total{outcome}`: dispatch requests by what became of their signed
    /// copy of the command (`used`; else read: `absent`, `stale`, `unknown_key`,
    /// `bad_signature`, `malformed`, `mismatch`). Counted only where copy keys are configured.
    pub dispatch_copies: IntCounterVec,
    /// `sluice_dispatch_queued{tenant}`: dispatch requests read off the bus and waiting in the
    /// dispatcher's lane of their tenant for a worker (fair dispatch).
    pub dispatch_queued: IntGaugeVec,
    /// The figures of `sluice_commands{status, tool}` and
    /// `sluice_oldest_command_age_seconds{status, tool}`, exported by
    /// [`Metrics::observe_commands`].
    pub commands: CommandGauges,
    /// `sluice_webhook_deliveries_total{webhook, outcome}`: deliveries enqueued, and attempts
    /// that delivered, will be retried, or gave up (`enqueued`, `delivered`, `retry`, `failed`).
    pub webhook_deliveries: IntCounterVec,
    /// `sluice_evidence_received_total{source, result}`: requests to `POST /v1/evidence/…` by
    /// what became of them (`applied`, `recorded`, `unmatched`, `replay`, `in_progress`,
    /// `bad_signature`, `bad_body`) — a forged request leaves nothing else behind; and to
    /// `POST /v1/callbacks/…` under `callback:<tool>` (with `ignored`: a progress report, not
    /// recorded), or `callback` for a refused token (`bad_signature`, `expired`).
    pub evidence_received: IntCounterVec,
    /// `sluice_webhook_pending{webhook}`: deliveries not yet answered 2xx nor given up, as the
    /// deliverer last read them (at most 1000).
    pub webhook_pending: IntGaugeVec,
    /// `sluice_webhook_oldest_pending_seconds{webhook}`: the age of the oldest of those.
    pub webhook_oldest_pending: GaugeVec,
    /// `sluice_consumer_lag{group, topic, partition}`: messages of the topic's partition the
    /// group has not committed yet, as this process last read them from the bus
    /// (`crate::lag`).
    pub consumer_lag: IntGaugeVec,
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
        let handler_panics = counter(
            "handler_panics_total",
            "Handler attempts that panicked, by the topic of the message",
            &["topic"],
        );
        let quarantined_messages = counter(
            "quarantined_messages_total",
            "Messages about a command the ledger cannot decode, dead-lettered at once",
            &["topic"],
        );
        let messages_skipped = counter(
            "messages_skipped_total",
            "Messages of a newer build skipped, neither handled nor dead-lettered (the ledger's sweep covers their commands), by topic and reason",
            &["topic", "reason"],
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
        // Labelled by tenant: principals and the tenants they may name, all in the
        // configuration, so the series are as few as its tokens and tenants.
        let budget_admissions = counter(
            "budget_admissions_total",
            "Admissions a spend budget decided, by budget and outcome (held, denied, deferred)",
            &["budget", "outcome"],
        );
        let budget_held = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "budget_held_minor",
                "Minor units held by a spend budget in its current window, over all its scopes",
            ),
            &["budget", "currency"],
        )
        .expect("a valid metric");
        registry
            .register(Box::new(budget_held.clone()))
            .expect("registered once");
        let tenant_refused = counter(
            "tenant_submissions_refused_total",
            "Submissions refused because their tenant held its whole quota of effects in flight",
            &["tenant"],
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
        let flow = crate::flow::FlowMetrics::register(&registry);
        let purge = PurgeMetrics::register(&registry);
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
        let handle_seconds = HistogramVec::new(
            HistogramOpts::new(
                "handle_duration_seconds",
                "Time a consumed message holds its partition, from hand-out to acknowledgement",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
            ]),
            &["topic"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(handle_seconds.clone()))
            .expect("each metric is registered once");
        let http_seconds = HistogramVec::new(
            HistogramOpts::new(
                "http_request_duration_seconds",
                "Time to answer an HTTP request of the producer, by route template and status",
            )
            .buckets(HTTP_BUCKETS.to_vec()),
            &["method", "route", "status"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(http_seconds.clone()))
            .expect("each metric is registered once");
        let waiting_requests = IntGauge::new(
            "http_waiting_requests",
            "Requests holding their answer now (GET ?wait=, Prefer: wait)",
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(waiting_requests.clone()))
            .expect("each metric is registered once");
        let webhook_deliveries = counter(
            "webhook_deliveries_total",
            "Webhook deliveries enqueued, and attempts by outcome (delivered, retry, failed)",
            &["webhook", "outcome"],
        );
        let evidence_received = counter(
            "evidence_received_total",
            "Evidence and callback requests by source and result (applied, recorded, unmatched, replay, ignored, in_progress, bad_signature, expired, bad_body)",
            &["source", "result"],
        );
        let webhook_pending = IntGaugeVec::new(
            Opts::new(
                "webhook_pending",
                "Webhook deliveries waiting to be delivered (at most 1000 counted)",
            ),
            &["webhook"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(webhook_pending.clone()))
            .expect("each metric is registered once");
        let dispatch_copies = counter(
            "dispatch_copies_total",
            "Dispatch requests by what became of the command's signed copy (used, or read instead and why)",
            &["outcome"],
        );
        let dispatch_queued = IntGaugeVec::new(
            Opts::new(
                "dispatch_queued",
                "Dispatch requests waiting in the dispatcher's lane of their tenant for a worker",
            ),
            &["tenant"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(dispatch_queued.clone()))
            .expect("each metric is registered once");
        let webhook_oldest_pending = GaugeVec::new(
            Opts::new(
                "webhook_oldest_pending_seconds",
                "Age of the oldest webhook delivery still waiting",
            ),
            &["webhook"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(webhook_oldest_pending.clone()))
            .expect("each metric is registered once");
        let consumer_lag = IntGaugeVec::new(
            Opts::new(
                "consumer_lag",
                "Messages of a topic's partition a consumer group has not committed yet, as last read from the bus",
            ),
            &["group", "topic", "partition"],
        )
        .expect("metric definitions are static and valid");
        registry
            .register(Box::new(consumer_lag.clone()))
            .expect("each metric is registered once");
        let build_info = IntGaugeVec::new(
            Opts::new(
                "build_info",
                "The running build: always 1, its facts in labels",
            ),
            &["version", "revision"],
        )
        .expect("metric definitions are static and valid");
        build_info
            .with_label_values(&[sluice_build_info::VERSION, sluice_build_info::REVISION])
            .set(1);
        registry
            .register(Box::new(build_info))
            .expect("each metric is registered once");
        // The process's CPU, memory, file descriptors and start time, as `process_*` (not
        // prefixed: dashboards and alerts everywhere know these names). Linux only.
        #[cfg(target_os = "linux")]
        if let Err(error) = prometheus::default_registry().register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        )) {
            // Registered once per process, however many registries it makes (tests make many).
            tracing::trace!(%error, "the process collector is already registered");
        }
        Self {
            registry,
            transitions,
            cas_conflicts,
            escalations,
            flow,
            purge,
            dispatch_seconds,
            handle_seconds,
            dead_letters,
            handler_errors,
            handler_panics,
            quarantined_messages,
            messages_skipped,
            dead_letters_unpublished,
            sweep_items,
            http_requests,
            submissions,
            http_seconds,
            waiting_requests,
            tenant_refused,
            budget_admissions,
            budget_held,
            dispatch_copies,
            dispatch_queued,
            commands: CommandGauges::default(),
            webhook_deliveries,
            evidence_received,
            webhook_pending,
            webhook_oldest_pending,
            consumer_lag,
        }
    }

    /// Counts a dispatch request's copy by `outcome` (`sluice_dispatch_copies_total`).
    pub fn copy_outcome(&self, outcome: &str) {
        self.dispatch_copies.with_label_values(&[outcome]).inc();
    }

    /// Exports `sluice_tenant_effects_in_flight{tenant}` from [`Metrics::commands`], read at
    /// every scrape: each tenant's effects not yet in a final status, as the producer counts
    /// them for its quotas (docs/decisions.md, "Tenants"). Call once per registry.
    pub fn observe_tenants(&self) {
        let collector = TenantGauges::new(self.commands.clone());
        if let Err(error) = self.registry.register(Box::new(collector)) {
            tracing::warn!(%error, "the tenant gauges are already exported");
        }
    }

    /// Exports `sluice_commands{status, tool}`, `sluice_oldest_command_age_seconds{status, tool}`
    /// and `sluice_command_gauges_seeded` from [`Metrics::commands`], read at every scrape
    /// (ages against `clock`). Call once per registry, in the process that reports them.
    pub fn observe_commands(&self, clock: Arc<dyn Clock>) {
        let collector = StateGauges::new(self.commands.clone(), clock);
        if let Err(error) = self.registry.register(Box::new(collector)) {
            tracing::warn!(%error, "the command gauges are already exported");
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
        if let Err(error) = self
            .registry
            .register(Box::new(LedgerRoundTrips::new(ledger)))
        {
            tracing::warn!(%error, "ledger round trips are already exported");
        }
    }

    /// Exports `sluice_tool_unknown_horizon_seconds{tool}`: how long a command of each tool
    /// of `catalog` may stay UNKNOWN while the reconciler works on it as the catalog
    /// declares (see [`unknown_horizon_ms`]); the alert on UNKNOWN commands compares
    /// `sluice_oldest_command_age_seconds` with it.
    pub fn observe_catalog(&self, catalog: &Catalog) {
        let horizon = GaugeVec::new(
            Opts::new(
                "tool_unknown_horizon_seconds",
                "How long a command of the tool may be UNKNOWN while it is reconciled as declared",
            ),
            &["tool"],
        )
        .expect("metric definitions are static and valid");
        for tool in catalog.tools() {
            let ms = unknown_horizon_ms(&tool.rules());
            horizon
                .with_label_values(&[tool.name().to_string().as_str()])
                .set(ms as f64 / 1_000.0);
        }
        if let Err(error) = self.registry.register(Box::new(horizon)) {
            tracing::warn!(%error, "the tools' horizons are already exported");
        }
    }

    /// The registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own registry into a Vec cannot fail.
        let mut families = self.registry.gather();
        #[cfg(target_os = "linux")]
        families.extend(
            prometheus::default_registry()
                .gather()
                .into_iter()
                .filter(|family| family.name().starts_with("process_")),
        );
        let _ = TextEncoder::new().encode(&families, &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// How long a command may stay UNKNOWN when the reconciler works as the tool's rules say: the
/// landing horizon of its last attempt (call timeout, `late_commit_ms`, the skew bound), then
/// every status check with its backoff, its own timeout and the settle interval. Past it the
/// command should have left UNKNOWN (for CONFIRMED, a retry, FAILED or STUCK): one still
/// there means the reconciler is not getting to it.
pub fn unknown_horizon_ms(rules: &Rules) -> i64 {
    let checks = (0..rules.max_checks).fold(0_i64, |sum, n| {
        sum.saturating_add(rules.backoff_ms(n))
            .saturating_add(rules.dispatch_timeout_ms)
    });
    rules
        .dispatch_timeout_ms
        .saturating_add(rules.late_commit_ms)
        .saturating_add(rules.clock_skew_ms)
        .saturating_add(rules.settle_ms)
        .saturating_add(checks)
}

/// Reads a ledger's round-trip and quarantine counts when scraped, into counters made for that
/// scrape: the ledger's own atomics are the counters, so nothing here is shared between
/// scrapes (copying them into long-lived counters by `inc_by(count - get())` raced when two
/// scrapes overlapped, and could count a stretch twice).
#[derive(Debug)]
struct LedgerRoundTrips {
    ledger: Arc<dyn Ledger>,
    descs: Vec<Desc>,
}

impl LedgerRoundTrips {
    fn counters() -> (IntCounterVec, CounterVec, IntCounter, IntCounter) {
        let counter = IntCounterVec::new(
            Opts::new(
                "ledger_round_trips_total",
                "Round trips to the ledger's store by operation and kind (lwt, serial, plain)",
            ),
            &["op", "kind"],
        )
        .expect("metric definitions are static and valid");
        let waited = CounterVec::new(
            Opts::new(
                "ledger_round_trip_seconds_total",
                "Time spent waiting for the ledger's store to answer, by operation and kind; \
                 divided by sluice_ledger_round_trips_total, the mean latency",
            ),
            &["op", "kind"],
        )
        .expect("metric definitions are static and valid");
        let quarantined = IntCounter::with_opts(Opts::new(
            "ledger_quarantined_commands_total",
            "Commands the ledger found it cannot decode and set aside (sweeps skip them)",
        ))
        .expect("metric definitions are static and valid");
        let newer = IntCounter::with_opts(Opts::new(
            "ledger_newer_commands_total",
            "Commands of a status only a newer build knows, left to it (sweeps pass over them, not quarantined)",
        ))
        .expect("metric definitions are static and valid");
        (counter, waited, quarantined, newer)
    }

    fn new(ledger: Arc<dyn Ledger>) -> Self {
        let (counter, waited, quarantined, newer) = Self::counters();
        let mut descs: Vec<Desc> = counter.desc().into_iter().cloned().collect();
        descs.extend(waited.desc().into_iter().cloned());
        descs.extend(quarantined.desc().into_iter().cloned());
        descs.extend(newer.desc().into_iter().cloned());
        Self { ledger, descs }
    }
}

impl Collector for LedgerRoundTrips {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (counter, waited, quarantined, newer) = Self::counters();
        for trips in self.ledger.round_trips() {
            let labels = [trips.op, trips.kind];
            counter.with_label_values(&labels).inc_by(trips.count);
            waited
                .with_label_values(&labels)
                .inc_by(trips.waited_us as f64 / 1e6);
        }
        quarantined.inc_by(self.ledger.quarantined());
        newer.inc_by(self.ledger.left_for_newer());
        let mut families = counter.collect();
        families.extend(waited.collect());
        families.extend(quarantined.collect());
        families.extend(newer.collect());
        families
    }
}

/// The state gauges, built at each scrape from [`CommandGauges`].
#[derive(Debug)]
struct StateGauges {
    gauges: CommandGauges,
    clock: Arc<dyn Clock>,
    descs: Vec<Desc>,
}

impl StateGauges {
    fn metrics() -> (IntGaugeVec, GaugeVec, IntGauge) {
        let counts = IntGaugeVec::new(
            Opts::new(
                "commands",
                "Unresolved commands now, by status and tool (maintained at each ledger write, \
                 seeded from the ledger)",
            ),
            &["status", "tool"],
        )
        .expect("metric definitions are static and valid");
        let oldest = GaugeVec::new(
            Opts::new(
                "oldest_command_age_seconds",
                "How long the oldest command of a tool in an unresolved status has been in it \
                 (0: none)",
            ),
            &["status", "tool"],
        )
        .expect("metric definitions are static and valid");
        let seeded = IntGauge::with_opts(Opts::new(
            "command_gauges_seeded",
            "1 once the command gauges were read from the ledger, 0 before",
        ))
        .expect("metric definitions are static and valid");
        (counts, oldest, seeded)
    }

    fn new(gauges: CommandGauges, clock: Arc<dyn Clock>) -> Self {
        let (counts, oldest, seeded) = Self::metrics();
        let mut descs: Vec<Desc> = counts.desc().into_iter().cloned().collect();
        descs.extend(oldest.desc().into_iter().cloned());
        descs.extend(seeded.desc().into_iter().cloned());
        Self {
            gauges,
            clock,
            descs,
        }
    }
}

impl Collector for StateGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let (counts, oldest, seeded) = Self::metrics();
        for figure in self.gauges.figures(self.clock.now()) {
            let labels = [figure.status.as_str(), &figure.tool];
            counts
                .with_label_values(&labels)
                .set(i64::try_from(figure.count).unwrap_or(i64::MAX));
            oldest
                .with_label_values(&labels)
                .set(figure.oldest.as_secs_f64());
        }
        seeded.set(i64::from(self.gauges.is_seeded()));
        let mut families = counts.collect();
        families.extend(oldest.collect());
        families.extend(seeded.collect());
        families
    }
}

/// `sluice_tenant_effects_in_flight{tenant}`, built at each scrape from [`CommandGauges`].
#[derive(Debug)]
struct TenantGauges {
    gauges: CommandGauges,
    descs: Vec<Desc>,
}

impl TenantGauges {
    fn metric() -> IntGaugeVec {
        IntGaugeVec::new(
            Opts::new(
                "tenant_effects_in_flight",
                "Effects of a tenant recorded and not yet in a final status, as the producer \
                 counts them against its quota",
            ),
            &["tenant"],
        )
        .expect("metric definitions are static and valid")
    }

    fn new(gauges: CommandGauges) -> Self {
        let descs = Self::metric().desc().into_iter().cloned().collect();
        Self { gauges, descs }
    }
}

impl Collector for TenantGauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let in_flight = Self::metric();
        for (tenant, count) in self.gauges.tenant_figures() {
            in_flight
                .with_label_values(&[&*tenant])
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        in_flight.collect()
    }
}
