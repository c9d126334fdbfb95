//! The spans of the bus, after OpenTelemetry's messaging conventions: a consume loop's
//! `process <topic>` span around each delivery ([`delivery`]) and the `send <topic>` span of a
//! publish ([`send`], [`sent`]). The topic is its full name, prefix included; the
//! partition is `messaging.destination.partition.id`; the run id, the message's key, is
//! `messaging.kafka.message.key`. Debug level: disabled, and nearly free, unless traces are
//! exported.

use std::sync::Arc;

use sluice_bus::{Bus, Delivery, Published, Topic};

use crate::consumer::ConsumerSpec;

/// What a consume loop's spans say of where its deliveries come from, made once per loop.
#[derive(Debug)]
pub(crate) struct Destination {
    pub(crate) topic: Topic,
    /// The bus's `messaging.system`.
    system: &'static str,
    /// The topic's full name, prefix included.
    name: String,
    group: String,
}

impl Destination {
    pub(crate) fn of(bus: &dyn Bus, spec: &ConsumerSpec) -> Arc<Self> {
        Arc::new(Self {
            topic: spec.topic,
            system: bus.messaging_system(),
            name: bus.topic_name(spec.topic),
            group: spec.group.clone(),
        })
    }
}

/// The span of handling one delivery: a consumer span after OpenTelemetry's messaging
/// conventions, `process <topic>` (the full topic name), with `messaging.system`,
/// `messaging.operation.type` = `process`, `messaging.destination.name`,
/// `messaging.destination.partition.id`, `messaging.kafka.offset`,
/// `messaging.kafka.message.key` (the run id) and `messaging.consumer.group.name`; and
/// Sluice's `sluice.work` (`dispatch`, `reconcile`, `compensate`). It is the child of the span
/// that published the message (its `traceparent` header), so the effect's trace crosses the
/// bus. The handler records the command key, tool and outcome on it as it writes
/// (`Context::drive`). Debug level: disabled, and nearly free, unless traces are exported.
pub(crate) fn delivery(destination: &Destination, delivery: &Delivery) -> tracing::Span {
    let work = match destination.topic {
        Topic::Requested => "dispatch",
        Topic::Unknown => "reconcile",
        Topic::Compensate => "compensate",
        Topic::Events => "event",
        Topic::Dlq => "dead_letter",
    };
    let span = tracing::debug_span!(
        "consume",
        otel.name = %format_args!("process {}", destination.name),
        otel.kind = "consumer",
        messaging.system = destination.system,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = destination.name.as_str(),
        messaging.destination.partition.id = %delivery.partition,
        messaging.kafka.offset = i64::try_from(delivery.offset).unwrap_or(i64::MAX),
        messaging.kafka.message.key = delivery.key(),
        messaging.consumer.group.name = destination.group.as_str(),
        sluice.work = work,
        run_id = delivery.key(),
        command_key = tracing::field::Empty,
        tool = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    if !span.is_disabled()
        && let Some(parent) = crate::messages::trace_of(&delivery.message.headers)
    {
        sluice_trace::set_parent(&span, &parent);
    }
    span
}

/// The span of publishing one message to `topic` under `key`: a producer span, `send <topic>`,
/// with `messaging.system`, `messaging.operation.type` = `send`, `messaging.destination.name`
/// and `messaging.kafka.message.key`; [`sent`] records the partition and offset. The message's
/// `traceparent` is the span it was built in (the work's), so a consumer's span is that
/// span's child and this one its sibling.
pub fn send(bus: &dyn Bus, topic: Topic, key: &str) -> tracing::Span {
    let span = tracing::debug_span!(
        "publish",
        otel.name = tracing::field::Empty,
        otel.kind = "producer",
        messaging.system = bus.messaging_system(),
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = tracing::field::Empty,
        messaging.destination.partition.id = tracing::field::Empty,
        messaging.kafka.offset = tracing::field::Empty,
        messaging.kafka.message.key = key,
    );
    if !span.is_disabled() {
        let name = bus.topic_name(topic);
        span.record("otel.name", format!("send {name}"));
        span.record("messaging.destination.name", name);
    }
    span
}

/// Records where the bus put the message [`send`] is the span of.
pub fn sent(span: &tracing::Span, published: &Published) {
    if !span.is_disabled() {
        span.record(
            "messaging.destination.partition.id",
            tracing::field::display(published.partition),
        );
        span.record(
            "messaging.kafka.offset",
            i64::try_from(published.offset).unwrap_or(i64::MAX),
        );
    }
}
