//! The operations endpoint of a service without an API of its own (dispatcher, reconciler,
//! compensator): `/metrics` in the Prometheus text format, `/healthz` (the process answers)
//! and `/readyz` (its ledger answers), on `telemetry.listen`.

use std::net::SocketAddr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sluice_core::time::Timestamp;

use crate::{Context, Shutdown};

/// The routes, for a caller that serves them itself.
pub fn router(ctx: Context) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(ctx)
}

/// Serves [`router`] on `addr` until `shutdown`.
pub async fn serve(ctx: Context, addr: SocketAddr, shutdown: Shutdown) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz and /readyz");
    axum::serve(listener, router(ctx))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

/// Starts [`serve`] in the background when `telemetry.listen` is set; a port that cannot be
/// bound is logged, not fatal: the service's work does not depend on being scraped.
pub fn spawn(ctx: &Context, listen: Option<SocketAddr>, shutdown: &Shutdown) {
    if let Some(addr) = listen {
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(error) = serve(ctx, addr, shutdown).await {
                tracing::error!(%addr, %error, "cannot serve the operations endpoint");
            }
        });
    }
}

async fn metrics(State(ctx): State<Context>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        ctx.metrics.render(),
    )
        .into_response()
}

async fn ready(State(ctx): State<Context>) -> Response {
    // The cheapest read every ledger answers through an index.
    match ctx
        .ledger
        .list_runs(Timestamp::from_millis(i64::MAX), None, 1)
        .await
    {
        Ok(_) => (StatusCode::OK, "ready").into_response(),
        // The cause goes to the log, not to whoever asks: it may name hosts and keyspaces.
        Err(e) => {
            tracing::warn!(error = %e, "not ready: the ledger does not answer");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the ledger does not answer",
            )
                .into_response()
        }
    }
}
