//! The compensator binary: the services' shared `main` (`sluice_assemble::service`) running
//! `sluice_compensator::run`.

use sluice_assemble::service::Service;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const SERVICE: Service = Service {
    name: "compensator",
    binary: "sluice-compensator",
    about: "The Sluice compensator service",
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_assemble::service::main(SERVICE, |ctx, config, shutdown| async move {
        sluice_runtime::ops::spawn(&ctx, config.telemetry.listen, &shutdown);
        Ok(sluice_compensator::run(ctx, config.compensator, shutdown).await?)
    })
    .await
}
