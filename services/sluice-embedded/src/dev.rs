//! The single-process pipeline: all four services on one ledger and one embedded bus.
//!
//! This is what `sluice dev`, `sluice demo`, `sluice bench` and the end-to-end tests start.
//! Asynchronous tools' callback URLs point at it without configuration ([`with_callbacks`]).
//! Stopping it cancels the shared shutdown token: the producer stops accepting, every consume
//! loop stops taking messages and waits for the handlers in flight; anything left unfinished is
//! in the ledger with a due time, and the next start's sweeps pick it up.
//!
//! In a fault run (built with the `failpoints` feature) `SLUICE_FAULT_CLOCK_SKEW_MS` gives each
//! service a context of its own that differs only in its clock, moved by the service's offset;
//! the ledger handle they share keeps the unskewed clock for what it stamps itself (run records,
//! CQL claim ages and due buckets).

use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use sluice_assemble::{AssembleError, assemble};
use sluice_core::catalog::Catalog;
use sluice_runtime::{Config, Context, Shutdown};
use tokio::task::JoinHandle;

/// A running pipeline.
#[derive(Debug)]
pub struct Pipeline {
    /// Where the producer listens.
    pub addr: SocketAddr,
    pub ctx: Context,
    shutdown: Shutdown,
    tasks: Vec<(&'static str, JoinHandle<Result<(), String>>)>,
}

/// Starts the four services with `config` and `catalog`.
pub fn start(
    config: &Config,
    catalog: Catalog,
    shutdown: Shutdown,
) -> BoxFuture<'_, Result<Pipeline, StartError>> {
    Box::pin(start_body(config, catalog, shutdown))
}

async fn start_body(
    config: &Config,
    catalog: Catalog,
    shutdown: Shutdown,
) -> Result<Pipeline, StartError> {
    let skew = sluice_faults::clock_skew()?;
    // Bound first: the callback URLs' address is the one listened on.
    let listener = tokio::net::TcpListener::bind(config.producer.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: config.producer.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen {
        addr: config.producer.listen,
        source,
    })?;
    let config = &with_callbacks(config, addr);
    let ctx = assemble(config, catalog).await?;
    // Each service's own view of the shared context: only the clock differs.
    let ctx_of = |service: &str| Context {
        clock: skew.clock_of(service, Arc::clone(&ctx.clock)),
        ..ctx.clone()
    };
    // In the events topic's groups before anything publishes: the embedded bus drops an
    // event once every group then subscribed has taken it.
    let deliverer =
        sluice_reconciler::webhooks::Deliverer::start(ctx_of("reconciler"), &config.webhooks)
            .await
            .map_err(StartError::Webhooks)?;
    let mut tasks = Vec::new();
    {
        let (ctx, config, shutdown) = (ctx_of("producer"), config.clone(), shutdown.clone());
        tasks.push((
            "producer",
            tokio::spawn(async move {
                sluice_producer::serve(ctx, &config, listener, shutdown)
                    .await
                    .map_err(|e| e.to_string())
            }),
        ));
    }
    {
        let (ctx, dispatcher, shutdown) = (
            ctx_of("dispatcher"),
            config.dispatcher.clone(),
            shutdown.clone(),
        );
        tasks.push((
            "dispatcher",
            tokio::spawn(async move {
                sluice_dispatcher::run(ctx, dispatcher, shutdown)
                    .await
                    .map_err(|e| e.to_string())
            }),
        ));
    }
    {
        let (ctx, reconciler, shutdown) = (
            ctx_of("reconciler"),
            config.reconciler.clone(),
            shutdown.clone(),
        );
        tasks.push((
            "reconciler",
            tokio::spawn(async move {
                sluice_reconciler::run(ctx, reconciler, shutdown)
                    .await
                    .map_err(|e| e.to_string())
            }),
        ));
    }
    {
        // The webhook deliverer beside the reconciler: its intake consumes `events`, its
        // sender pushes what the ledger holds (`sluice_reconciler::webhooks`).
        let shutdown = shutdown.clone();
        tasks.push((
            "webhooks",
            tokio::spawn(async move { deliverer.run(shutdown).await.map_err(|e| e.to_string()) }),
        ));
    }
    {
        let (ctx, compensator, shutdown) = (
            ctx_of("compensator"),
            config.compensator.clone(),
            shutdown.clone(),
        );
        tasks.push((
            "compensator",
            tokio::spawn(async move {
                sluice_compensator::run(ctx, compensator, shutdown)
                    .await
                    .map_err(|e| e.to_string())
            }),
        ));
    }
    Ok(Pipeline {
        addr,
        ctx,
        shutdown,
        tasks,
    })
}

/// A fresh signing key: two v4 UUIDs, 244 bits from the operating system's random source, as
/// the admin token.
pub fn random_key() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// `config` with `[callbacks]` filled where it is not configured, as a single process can:
/// the key, a fresh one (`sluice dev` keeps one in its data directory and sets it before); the
/// public URL, the address the producer listens on (loopback for an unspecified address),
/// over HTTPS with `[producer.tls]`. A configured value is kept; only both together are used.
pub fn with_callbacks(config: &Config, addr: SocketAddr) -> Config {
    let mut config = config.clone();
    let callbacks = &mut config.callbacks;
    if callbacks.secret.is_none() {
        callbacks.secret = Some(random_key().into());
    }
    if callbacks.public_url.is_none() {
        let scheme = if config.producer.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut reached = addr;
        if reached.ip().is_unspecified() {
            reached.set_ip(match reached {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        callbacks.public_url = Some(format!("{scheme}://{reached}"));
    }
    config
}

impl Pipeline {
    /// The producer's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until a service stops or `shutdown` is cancelled; a service that stops on its
    /// own stops the others.
    pub fn wait(self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(self.wait_body())
    }

    async fn wait_body(self) -> Result<(), String> {
        let shutdown = self.shutdown.clone();
        shutdown.cancelled().await;
        self.stop().await
    }

    /// Stops every service and waits for them; returns the first failure.
    pub fn stop(self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(self.stop_body())
    }

    async fn stop_body(self) -> Result<(), String> {
        self.shutdown.cancel();
        let mut first = Ok(());
        for (name, task) in self.tasks {
            let result = match task.await {
                Ok(result) => result,
                Err(join) => Err(join.to_string()),
            };
            if let Err(e) = result {
                tracing::error!(service = name, error = %e, "service failed");
                if first.is_ok() {
                    first = Err(format!("{name}: {e}"));
                }
            }
        }
        first
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Assemble(#[from] AssembleError),
    #[error(transparent)]
    Faults(#[from] sluice_faults::FaultsError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the webhook deliverer cannot join the events topic")]
    Webhooks(#[source] sluice_bus::BusError),
}
