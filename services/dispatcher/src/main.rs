//! The dispatcher binary: the services' shared `main` (`sluice_assemble::service`) running
//! `sluice_dispatcher::run`.

use sluice_assemble::service::Service;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const SERVICE: Service = Service {
    name: "dispatcher",
    binary: "sluice-dispatcher",
    about: "The Sluice dispatcher service",
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_assemble::service::main(SERVICE, |ctx, config, shutdown| async move {
        sluice_runtime::ops::spawn(&ctx, config.telemetry.listen, &shutdown);
        Ok(sluice_dispatcher::run(ctx, config.dispatcher, shutdown).await?)
    })
    .await
}
