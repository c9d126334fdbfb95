//! The producer binary: the services' shared `main` (`sluice_assemble::service`) running
//! `sluice_producer::run`.

use sluice_assemble::service::Service;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const SERVICE: Service = Service {
    name: "producer",
    binary: "sluice-producer",
    about: "The Sluice producer (HTTP API)",
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_assemble::service::main(SERVICE, |ctx, config, shutdown| async move {
        Ok(sluice_producer::run(ctx, &config, shutdown).await?)
    })
    .await
}
