//! Logging and tracing setup: `tracing` to stderr, as text or JSON, filtered by the configured
//! level; and, when an OTLP endpoint is configured (`telemetry.otlp_endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`), Sluice's spans exported over OTLP (`sluice_trace::export`).
//! [`shutdown`] flushes the exporter; every binary calls it on its way out.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::config::{LogFormat, TelemetryConfig};

/// Installs the global subscriber once; later calls (tests, a second service in the same
/// process) keep the first. The exporter's service name is `telemetry.service_name`, else the
/// binary's file name.
pub fn init(config: &TelemetryConfig) {
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let logs = match config.log_format {
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
        LogFormat::Text => logs.with_filter(filter).boxed(),
    };
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
