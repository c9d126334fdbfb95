//! The dispatcher binary: configuration and telemetry, then `sluice_dispatcher::run`.

use clap::Parser;
use sluice_assemble::{assemble_service, load_catalog};
use sluice_runtime::cli::{ServiceArgs, require_shared_bus};

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "sluice-dispatcher",
    version = sluice_runtime::build_info::LONG_VERSION,
    about = "The Sluice dispatcher service"
)]
struct Args {
    #[command(flatten)]
    service: ServiceArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_faults::setup()?;
    let args = Args::parse();
    let config = args.service.load()?;
    sluice_runtime::telemetry::init(&config.telemetry);
    require_shared_bus(&config, "dispatcher")?;
    let ctx = assemble_service(&config, load_catalog(&config.catalog)?, "dispatcher").await?;
    let shutdown = sluice_runtime::shutdown_on_signals();
    sluice_runtime::ops::spawn(&ctx, config.telemetry.listen, &shutdown);
    let ran = sluice_dispatcher::run(ctx, config.dispatcher.clone(), shutdown).await;
    // Spans still batched are exported before the process ends.
    sluice_runtime::telemetry::shutdown();
    ran?;
    Ok(())
}
