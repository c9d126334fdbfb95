//! `sluice-upstream`: runs the demo upstream until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use sluice_upstream::{FaultKind, Faults, Upstream};
use tracing_subscriber::EnvFilter;

/// The Sluice demo upstream: an in-memory bank, mail, ticket and search service that injects
/// faults. Rate flags set that fault for every endpoint family it applies to, over the preset.
#[derive(Debug, Parser)]
#[command(version = sluice_build_info::LONG_VERSION)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// Fault preset the rate flags start from.
    #[arg(long, value_enum, default_value_t = Preset::None)]
    faults: Preset,
    /// Seed of the fault draws; the same seed and the same requests in the same order give the
    /// same faults. Without it a seed is chosen and logged.
    #[arg(long)]
    seed: Option<u64>,
    /// Rate (0.0–1.0) of commit-then-hold-past-the-client's-timeout.
    #[arg(long, value_name = "RATE")]
    commit_then_timeout: Option<f64>,
    /// Rate of commit-then-close-the-connection-without-a-response.
    #[arg(long, value_name = "RATE")]
    drop_response: Option<f64>,
    /// Rate of 503 without committing.
    #[arg(long = "error-5xx", value_name = "RATE")]
    error_5xx: Option<f64>,
    /// Rate of commit-then-500.
    #[arg(long = "commit-then-5xx", value_name = "RATE")]
    commit_then_5xx: Option<f64>,
    /// Rate of booking a wire twice (bank only).
    #[arg(long, value_name = "RATE")]
    commit_twice: Option<f64>,
    /// Rate of 503 from the by-key status check.
    #[arg(long, value_name = "RATE")]
    status_inconclusive: Option<f64>,
    /// Rate of 429 with Retry-After, without committing (a rate limit).
    #[arg(long, value_name = "RATE")]
    rate_limited: Option<f64>,
    /// Rate of 429 with Retry-After from the by-key status check.
    #[arg(long, value_name = "RATE")]
    status_rate_limited: Option<f64>,
    /// The Retry-After of a rate-limited answer, in seconds (1).
    #[arg(long, value_name = "SECS")]
    retry_after_secs: Option<u64>,
    /// How long commit-then-timeout holds its response, in milliseconds.
    #[arg(long, value_name = "MS")]
    timeout_sleep_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Preset {
    /// No faults.
    None,
    /// Every fault at 5 %.
    Demo,
}

impl Args {
    fn faults(&self) -> Faults {
        let mut faults = match self.faults {
            Preset::None => Faults::none(),
            Preset::Demo => Faults::demo(),
        };
        let rates = [
            (FaultKind::CommitThenTimeout, self.commit_then_timeout),
            (FaultKind::DropResponse, self.drop_response),
            (FaultKind::Error5xx, self.error_5xx),
            (FaultKind::CommitThen5xx, self.commit_then_5xx),
            (FaultKind::CommitTwice, self.commit_twice),
            (FaultKind::StatusInconclusive, self.status_inconclusive),
            (FaultKind::RateLimited, self.rate_limited),
            (FaultKind::StatusRateLimited, self.status_rate_limited),
        ];
        for (kind, rate) in rates {
            if let Some(rate) = rate {
                faults.set_everywhere(kind, rate);
            }
        }
        if let Some(secs) = self.retry_after_secs {
            faults.retry_after_secs = secs;
        }
        match self.timeout_sleep_ms {
            Some(ms) => faults.with_timeout_sleep(Duration::from_millis(ms)),
            None => faults,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        // Only needs to differ between runs; the chosen seed is logged for replay.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64)
    });
    let upstream = match Upstream::start(args.listen, args.faults(), seed).await {
        Ok(upstream) => upstream,
        Err(failed) => {
            eprintln!("sluice-upstream: cannot start on {}: {failed}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    shutdown_signal().await;
    upstream.shutdown().await;
    ExitCode::SUCCESS
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
                return;
            }
            Err(failed) => tracing::warn!(error = %failed, "cannot listen for SIGTERM"),
        }
    }
    if let Err(failed) = tokio::signal::ctrl_c().await {
        tracing::warn!(error = %failed, "cannot listen for Ctrl-C; stopping");
    }
}
