//! Logging setup: `tracing` to stderr, as text or JSON, filtered by the configured level.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetryConfig};

/// Installs the global subscriber once; later calls (tests, a second service in the same
/// process) keep the first.
pub fn init(config: &TelemetryConfig) {
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let _ = match config.log_format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
