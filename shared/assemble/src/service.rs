//! The `main` of the four service binaries (`sluice-producer`, `sluice-dispatcher`,
//! `sluice-reconciler`, `sluice-compensator`), written once: failpoints, flags, configuration,
//! telemetry, the shared-bus check, the service's [`Context`] and the signals; then the
//! service's own loop, and the batched spans exported on the way out whatever it returned.

use std::future::Future;

use clap::{CommandFactory, FromArgMatches, Parser};
use sluice_runtime::cli::{ServiceArgs, require_shared_bus};
use sluice_runtime::config::Config;
use sluice_runtime::{Context, Shutdown};

use crate::{assemble_service, load_catalog};

/// A service binary: the service's name, as the configuration and the fault clock name it
/// (`dispatcher`), the binary's (`sluice-dispatcher`) and the line `--help` shows for it.
#[derive(Debug, Clone, Copy)]
pub struct Service {
    pub name: &'static str,
    pub binary: &'static str,
    pub about: &'static str,
}

// The flags every service binary takes; its name and `--help` line are the `Service`'s (a
// plain comment: clap would make a doc comment the `--help` text).
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

/// Runs `service`: builds its context from the flags and configuration, then hands `run` the
/// context, the configuration and the root shutdown token (cancelled by SIGTERM or Ctrl-C).
/// `run` is the service's loop, with whatever it starts beside it (the ops endpoint, the
/// webhook deliverer).
pub async fn main<F, Fut>(service: Service, run: F) -> anyhow::Result<()>
where
    F: FnOnce(Context, Config, Shutdown) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    sluice_faults::setup()?;
    let matches = Args::command()
        .name(service.binary)
        .version(sluice_runtime::build_info::LONG_VERSION)
        .about(service.about)
        .get_matches();
    // As `Parser::parse` does: a usage error is printed and ends the process.
    let args = Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let config = args.service.load()?;
    sluice_runtime::telemetry::init(&config.telemetry);
    require_shared_bus(&config, service.name)?;
    let ctx = assemble_service(&config, load_catalog(&config.catalog)?, service.name).await?;
    let shutdown = sluice_runtime::shutdown_on_signals();
    let ran = run(ctx, config, shutdown).await;
    // Spans still batched are exported before the process ends.
    sluice_runtime::telemetry::shutdown();
    ran
}
