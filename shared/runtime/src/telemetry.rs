//! Logging and tracing setup: `tracing` to stderr, as text or JSON, filtered by the configured
//! level; and, when an OTLP endpoint is configured (`telemetry.otlp_endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), Sluice's spans exported over OTLP (`sluice_trace::export`).
//! [`shutdown`] flushes the exporter; every binary calls it on its way out.
//!
//! # Trace ids in the logs
//!
//! While spans are exported, a log line written inside one of Sluice's spans carries the
//! `trace_id` and `span_id` of that span (the nearest enclosing span the exporter knows), the
//! ids the collector shows it under: a JSON line has them as its first two fields, a text line
//! ends with `trace_id=… span_id=…` (not on a terminal, whose colours the formatter keeps).
//! Without the exporter there are no OpenTelemetry spans and the lines are as before.
//!
//! The ids are read from the span's `tracing_opentelemetry::OtelData` (two 16- and 8-byte
//! copies), looked up in the registry directly: the log layer's own filter (the log level)
//! hides Sluice's debug-level spans from its context, and those are the spans being exported.
//! The line is formatted by `tracing-subscriber`'s own JSON or text formatter into a buffer
//! kept per thread, and the ids are put in front (JSON) or at the end (text): no allocation per
//! line once the buffer has grown, and nothing at all is looked up without the exporter.

use std::cell::RefCell;
use std::fmt;

use opentelemetry::{SpanId, TraceId};
use tracing::{Event, Subscriber};
use tracing_opentelemetry::OtelData;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::{LookupSpan, Registry};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, TelemetryConfig};

/// Installs the global subscriber once; later calls (tests, a second service in the same
/// process) keep the first. The exporter's service name is `telemetry.service_name`, else the
/// binary's file name.
pub fn init(config: &TelemetryConfig) {
    init_writing_to(config, std::io::stderr);
}

/// [`init`], the log lines written to `writer` instead of stderr (a test that reads them).
pub fn init_writing_to<W>(config: &TelemetryConfig, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let traces =
        sluice_trace::export::endpoint(config.otlp_endpoint.as_deref()).and_then(|endpoint| {
            match sluice_trace::export::layer(&endpoint, &service_name(config)) {
                Ok(layer) => Some((layer, endpoint)),
                Err(e) => {
                    // Logged once the subscriber is in place, below.
                    eprintln!("traces are not exported: {e}");
                    None
                }
            }
        });
    let exporting = traces.as_ref().map(|(_, endpoint)| endpoint.clone());
    let correlate = exporting.is_some();
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi);
    let logs = match config.log_format {
        LogFormat::Json => logs
            .json()
            .map_event_format(|format| TraceIds::new(format, Layout::Json, correlate))
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => logs
            .map_event_format(|format| TraceIds::new(format, Layout::Text, correlate))
            .with_filter(filter)
            .boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(traces.map(|(layer, _)| layer))
        .with(logs)
        .try_init()
        .is_ok();
    if installed && let Some(endpoint) = exporting {
        tracing::info!(endpoint = ?endpoint, "exporting traces over OTLP");
    }
}

/// Exports the spans still batched and stops the exporter (a no-op without one).
pub fn shutdown() {
    sluice_trace::export::shutdown();
}

fn service_name(config: &TelemetryConfig) -> String {
    config.service_name.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "sluice".to_owned())
    })
}

/// Where the ids go in a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `{"trace_id":"…","span_id":"…",` then the formatter's own fields.
    Json,
    /// The formatter's line, then ` trace_id=… span_id=…`.
    Text,
}

/// An event formatter that adds the OpenTelemetry ids of the event's span to the line `inner`
/// writes (module documentation).
#[derive(Debug)]
struct TraceIds<F> {
    inner: F,
    layout: Layout,
    /// Whether spans are exported at all: without the exporter nothing is looked up.
    enabled: bool,
}

impl<F> TraceIds<F> {
    fn new(inner: F, layout: Layout, enabled: bool) -> Self {
        Self {
            inner,
            layout,
            enabled,
        }
    }
}

thread_local! {
    /// The line being formatted, reused from one line to the next on this thread.
    static LINE: RefCell<String> = const { RefCell::new(String::new()) };
}

impl<S, N, F> FormatEvent<S, N> for TraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        // A text line on a terminal keeps its colours: formatted in place, without ids.
        let ids = if self.enabled && !(self.layout == Layout::Text && writer.has_ansi_escapes()) {
            event
                .parent()
                .cloned()
                .or_else(|| {
                    event
                        .is_contextual()
                        .then(|| ctx.current_span().id().cloned())?
                })
                .and_then(|span| ids_of(&span))
        } else {
            None
        };
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };
        LINE.with(|line| {
            // A line formatted while this one is (a `Debug` impl that logs) gets a buffer of
            // its own.
            let mut fresh = String::new();
            let mut borrowed = line.try_borrow_mut();
            let line = match borrowed.as_deref_mut() {
                Ok(line) => line,
                Err(_) => &mut fresh,
            };
            line.clear();
            self.inner.format_event(ctx, Writer::new(line), event)?;
            match self.layout {
                Layout::Json => match line.strip_prefix('{') {
                    Some(rest) => write!(
                        writer,
                        "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}"
                    ),
                    None => writer.write_str(line),
                },
                Layout::Text => {
                    let body = line.strip_suffix('\n').unwrap_or(line);
                    writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}")
                }
            }
        })
    }
}

/// The ids of the nearest span from `id` up that the exporter's layer made an OpenTelemetry
/// span of, if its context is valid. Read from the registry itself, unfiltered (module
/// documentation); `None` without a global subscriber built on a [`Registry`].
fn ids_of(id: &tracing::span::Id) -> Option<(TraceId, SpanId)> {
    tracing::dispatcher::get_default(|dispatch| {
        let registry = dispatch.downcast_ref::<Registry>()?;
        let mut span = registry.span(id)?;
        loop {
            if let Some(data) = span.extensions().get::<OtelData>()
                && let (Some(trace_id), Some(span_id)) = (data.trace_id(), data.span_id())
                && trace_id != TraceId::INVALID
                && span_id != SpanId::INVALID
            {
                return Some((trace_id, span_id));
            }
            span = span.parent()?;
        }
    })
}
