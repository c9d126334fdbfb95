//! What the four services share at run time: the bus messages, the pipeline loop (read →
//! state machine → guarded write → actions), metrics, telemetry and shutdown. It names no
//! concrete ledger or bus: `sluice-assemble` builds a [`Context`] from the configuration
//! (`sluice-config`, re-exported here as [`config`]).

/// The build's version and revision (`--version`, `sluice_build_info`).
pub use sluice_build_info as build_info;
mod budget_views;
pub mod cli;
pub use sluice_config as config;
pub mod consumer;
pub mod copies;
pub mod flow;
pub mod gauges;
pub mod job;
pub mod lag;
pub mod lanes;
pub mod local_events;
pub mod messages;
pub mod metrics;
pub mod ops;
pub mod pipeline;
mod references;
pub mod spans;
pub mod telemetry;

pub use config::Config;
pub use job::{Actor, Ran, Sites};
pub use metrics::Metrics;
pub use pipeline::{Context, Current, PipelineError};

/// The root cancellation token: cancelled by SIGTERM or Ctrl-C, watched by every loop.
pub use tokio_util::sync::CancellationToken as Shutdown;

/// A token cancelled when the process receives SIGTERM or Ctrl-C.
pub fn shutdown_on_signals() -> Shutdown {
    let token = Shutdown::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(term) => term,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot watch SIGTERM; Ctrl-C only");
                        let _ = ctrl_c.await;
                        trigger.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = ctrl_c.await;
        }
        tracing::info!("shutting down");
        trigger.cancel();
    });
    token
}
