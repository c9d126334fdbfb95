//! W3C trace context on every API request: a `traceparent` (and its `tracestate`) is read
//! from each request, a server span is opened for the request as its child, and a command
//! submitted in the request is stored with the context of that span ([`for_command`]), so the
//! effect's later steps in every service join the agent's trace. An invalid `traceparent` is
//! ignored with its `tracestate`, as the W3C recommendation says; the request is served the
//! same either way.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::Response;
use sluice_core::trace::TraceContext;
use tracing::Instrument;

tokio::task_local! {
    /// The context the current request came with, for [`for_command`] when spans are not
    /// exported (no span context to read then).
    static INCOMING: Option<TraceContext>;
}

/// The trace context of a request's headers: one valid `traceparent`, with its `tracestate`
/// headers joined as the recommendation says (several are one list).
pub fn incoming(headers: &HeaderMap) -> Option<TraceContext> {
    let mut traceparents = headers.get_all(sluice_trace::TRACEPARENT).iter();
    let traceparent = traceparents.next()?.to_str().ok()?;
    if traceparents.next().is_some() {
        return None;
    }
    let states: Vec<&str> = headers
        .get_all(sluice_trace::TRACESTATE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    let tracestate = (!states.is_empty()).then(|| states.join(","));
    TraceContext::parse(traceparent, tracestate.as_deref())
}

/// The middleware: every request in a server span (`<METHOD> <route>`), the child of the
/// caller's `traceparent` when it sent a valid one.
pub async fn request(request: Request, next: Next) -> Response {
    let incoming = incoming(request.headers());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", MatchedPath::as_str);
    // The name is formatted only if the span is enabled (traces exported): `format_args!` is
    // evaluated when recorded, and a disabled span records nothing.
    let span = tracing::debug_span!(
        "http.request",
        otel.name = %format_args!("{} {route}", request.method()),
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = route,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(parent) = &incoming {
        sluice_trace::set_parent(&span, parent);
    }
    let response = INCOMING
        .scope(incoming, next.run(request))
        .instrument(span.clone())
        .await;
    // As an integer attribute: `tracing-opentelemetry` exports unsigned fields as strings.
    span.record(
        "http.response.status_code",
        i64::from(response.status().as_u16()),
    );
    response
}

/// The trace context a command submitted now is stored with: the current span's (the
/// request's, or a span inside it) when spans are exported, else the caller's as it came.
pub fn for_command() -> Option<TraceContext> {
    sluice_trace::current().or_else(|| INCOMING.try_with(Clone::clone).ok().flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_read_with_every_tracestate_header() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static(VALID));
        headers.append("tracestate", HeaderValue::from_static("a=1"));
        headers.append("tracestate", HeaderValue::from_static("b=2"));
        let trace = incoming(&headers).expect("valid");
        assert_eq!(trace.traceparent, VALID);
        assert_eq!(trace.tracestate.as_deref(), Some("a=1,b=2"));
    }

    #[test]
    fn an_invalid_or_repeated_traceparent_is_ignored() {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_static("00-zz-yy-01"));
        headers.insert("tracestate", HeaderValue::from_static("a=1"));
        assert_eq!(incoming(&headers), None);
        let mut twice = HeaderMap::new();
        twice.append("traceparent", HeaderValue::from_static(VALID));
        twice.append("traceparent", HeaderValue::from_static(VALID));
        assert_eq!(incoming(&twice), None);
        assert_eq!(incoming(&HeaderMap::new()), None);
    }
}
