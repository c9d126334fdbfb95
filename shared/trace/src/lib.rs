//! Trace glue between `tracing` spans and W3C trace contexts, and the OTLP exporter.
//!
//! Sluice's spans are ordinary `tracing` spans; when an OTLP endpoint is configured
//! ([`export::install`]) a `tracing-opentelemetry` layer turns them into OpenTelemetry spans
//! and exports them. Everything here works without that layer too: a context is then carried
//! as it came (the agent's `traceparent`), and each upstream call still gets a fresh span id
//! of its own ([`for_call`]), so an upstream sees one trace per effect either way.
//!
//! The rule that makes one effect one trace across processes: a span is the child of the span
//! the work came from (a bus message's `traceparent`, the caller's span), unless that span is
//! in another trace or there is none (a sweep, an operator's request), in which case it is
//! parented on the context stored with the command ([`adopt`]), and linked to the other one.

use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub mod export;

pub use sluice_core::trace::TraceContext;

/// The W3C header (and Kafka header) names.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The OpenTelemetry span context of a stored or received trace context (remote).
fn span_context(trace: &TraceContext) -> SpanContext {
    let state = trace
        .tracestate
        .as_deref()
        .and_then(|state| state.parse::<TraceState>().ok())
        .unwrap_or_default();
    SpanContext::new(
        TraceId::from_bytes(trace.trace_id_bytes()),
        SpanId::from_bytes(trace.parent_id_bytes()),
        TraceFlags::new(trace.flags()),
        true,
        state,
    )
}

/// The trace context of an OpenTelemetry span context, if it is valid.
fn from_span_context(context: &SpanContext) -> Option<TraceContext> {
    if !context.is_valid() {
        return None;
    }
    let state = context.trace_state().header();
    TraceContext::from_parts(
        context.trace_id().to_bytes(),
        context.span_id().to_bytes(),
        context.trace_flags().to_u8(),
        (!state.is_empty()).then_some(state),
    )
}

/// The context of `span` as an OpenTelemetry span; `None` without the exporter's layer (or
/// for a disabled span).
pub fn context_of(span: &Span) -> Option<TraceContext> {
    if span.is_disabled() {
        return None;
    }
    from_span_context(span.context().span().span_context())
}

/// The context of the current span (see [`context_of`]).
pub fn current() -> Option<TraceContext> {
    context_of(&Span::current())
}

/// Makes `span` (not yet entered) the child of `parent`, a context from outside the process.
pub fn set_parent(span: &Span, parent: &TraceContext) {
    let cx = Context::new().with_remote_span_context(span_context(parent));
    // Fails only without the layer (nothing to parent) or for a span already entered, which
    // callers do not pass.
    let _ = span.set_parent(cx);
}

/// Puts `span` (not yet entered) in the trace of `stored`, the command's: it stays the child
/// of the current span when that span is in the same trace; otherwise it is parented on
/// `stored` and linked to the current span, which is then another trace's (an operator's
/// request, a sweep's pass). Without a stored context the span keeps its place.
pub fn adopt(span: &Span, stored: Option<&TraceContext>) {
    let Some(stored) = stored else {
        return;
    };
    match current() {
        Some(here) if here.trace_id() == stored.trace_id() => {}
        Some(here) => {
            set_parent(span, stored);
            span.add_link(span_context(&here));
        }
        None => set_parent(span, stored),
    }
}

/// What to pass on for a command whose stored context is `stored` (a bus message's headers):
/// the current span's context if it is in that trace (or the command has none), else the
/// stored one.
pub fn outgoing(stored: Option<&TraceContext>) -> Option<TraceContext> {
    match (current(), stored) {
        (Some(here), Some(stored)) if here.trace_id() != stored.trace_id() => Some(stored.clone()),
        (Some(here), _) => Some(here),
        (None, stored) => stored.cloned(),
    }
}

/// The `traceparent` of an upstream request for a command whose stored context is `stored`,
/// sent from the current span (the call's own): that span's context, or, without the
/// exporter's layer, the stored trace under a fresh span id, so each call is a span of its
/// own to the upstream.
pub fn for_call(stored: Option<&TraceContext>) -> Option<TraceContext> {
    match current() {
        Some(here) if stored.is_none_or(|stored| stored.trace_id() == here.trace_id()) => {
            Some(here)
        }
        _ => stored.map(|stored| stored.with_parent(fresh_span_id())),
    }
}

/// A random, non-zero span id.
pub fn fresh_span_id() -> [u8; 8] {
    loop {
        let bytes = uuid::Uuid::new_v4().into_bytes();
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[..8]);
        if id != [0; 8] {
            return id;
        }
    }
}

/// The trace context a set of headers carries (`traceparent`, `tracestate`), if valid.
pub fn from_headers<'a>(mut header: impl FnMut(&str) -> Option<&'a [u8]>) -> Option<TraceContext> {
    let traceparent = std::str::from_utf8(header(TRACEPARENT)?).ok()?;
    let tracestate = header(TRACESTATE).and_then(|value| std::str::from_utf8(value).ok());
    TraceContext::parse(traceparent, tracestate)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn without_the_layer_the_stored_context_is_passed_on_and_each_call_gets_its_own_span_id() {
        let stored = TraceContext::parse(STORED, Some("vendor=x")).expect("valid");
        assert_eq!(current(), None);
        assert_eq!(outgoing(Some(&stored)), Some(stored.clone()));
        assert_eq!(outgoing(None), None);
        let first = for_call(Some(&stored)).expect("a call context");
        let second = for_call(Some(&stored)).expect("a call context");
        assert_eq!(first.trace_id(), stored.trace_id());
        assert_ne!(first.parent_id(), stored.parent_id());
        assert_ne!(first.parent_id(), second.parent_id());
        assert_eq!(first.tracestate.as_deref(), Some("vendor=x"));
        assert_eq!(for_call(None), None);
    }

    #[test]
    fn headers_are_read_by_their_w3c_names() {
        let headers: Vec<(&str, &[u8])> =
            vec![("traceparent", STORED.as_bytes()), ("tracestate", b"a=b")];
        let find = |name: &str| {
            headers
                .iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| *value)
        };
        let trace = from_headers(find).expect("valid");
        assert_eq!(trace.traceparent, STORED);
        assert_eq!(trace.tracestate.as_deref(), Some("a=b"));
        assert_eq!(from_headers(|_| Some(b"garbage".as_slice())), None);
    }

    #[test]
    fn span_contexts_round_trip() {
        let stored = TraceContext::parse(STORED, Some("a=b,c=d")).expect("valid");
        let back = from_span_context(&span_context(&stored)).expect("valid");
        assert_eq!(back, stored);
    }
}
