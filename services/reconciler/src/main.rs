//! The reconciler binary: the services' shared `main` (`sluice_assemble::service`) running
//! `sluice_reconciler::run`.

use sluice_assemble::service::Service;

#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const SERVICE: Service = Service {
    name: "reconciler",
    binary: "sluice-reconciler",
    about: "The Sluice reconciler service",
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    sluice_assemble::service::main(SERVICE, |ctx, config, shutdown| async move {
        sluice_runtime::ops::spawn(&ctx, config.telemetry.listen, &shutdown);
        // The webhook deliverer runs in every reconciler (docs/decisions.md, "Webhooks").
        let webhooks = tokio::spawn(sluice_reconciler::webhooks::run(
            ctx.clone(),
            config.webhooks.clone(),
            shutdown.clone(),
        ));
        let ran = sluice_reconciler::run(ctx, config.reconciler, shutdown.clone()).await;
        shutdown.cancel();
        let delivered = webhooks.await;
        ran?;
        delivered??;
        Ok(())
    })
    .await
}
