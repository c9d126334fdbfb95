//! The producer binary: configuration and telemetry, then `sluice_producer::run`.

use clap::Parser;
use sluice_assemble::{assemble_service, load_catalog};
use sluice_runtime::cli::{ServiceArgs, require_shared_bus};

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "sluice-producer",
    version = sluice_runtime::build_info::LONG_VERSION,
    about = "The Sluice producer (HTTP API)"
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
    require_shared_bus(&config, "producer")?;
    let ctx = assemble_service(&config, load_catalog(&config.catalog)?, "producer").await?;
    let ran = sluice_producer::run(ctx, &config, sluice_runtime::shutdown_on_signals()).await;
    // Spans still batched are exported before the process ends.
    sluice_runtime::telemetry::shutdown();
    ran?;
    Ok(())
}
