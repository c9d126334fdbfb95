//! The server: binds, accepts connections and serves each with hyper, so that a handler can
//! have its connection closed without a response (`drop_response`).
//!
//! `axum::serve` owns its connections and offers no way to drop one from a handler, hence this
//! accept loop: each connection task selects on the hyper connection, the handler's
//! [`ConnectionAbort`] and shutdown. Dropping the connection future closes the socket before
//! any byte of a response was written, which the client sees as a connection closed mid-request.
//! Shutdown stops accepting, lets connections finish within [`SHUTDOWN_GRACE`] and then drops
//! the rest (a held `commit_then_timeout` response would otherwise delay it by seconds).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use tracing::{debug, info, warn};

use crate::faults::{Faults, FaultsError};
use crate::http::{ConnectionAbort, Shared, router};
use crate::world::Stats;

/// How long shutdown waits for open connections before dropping them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// A running demo upstream. Dropping it stops the server in the background; [`shutdown`]
/// stops it and waits.
///
/// [`shutdown`]: Upstream::shutdown
#[derive(Debug)]
pub struct Upstream {
    handle: UpstreamHandle,
    shutdown: CancellationToken,
    server: Option<JoinHandle<()>>,
}

/// A cheap, clonable handle on a running upstream's state, for tasks that do not own the
/// [`Upstream`] itself.
#[derive(Debug, Clone)]
pub struct UpstreamHandle {
    local_addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Upstream {
    /// Binds `listen` (port 0 picks a free port) and starts serving with `faults`, drawing
    /// faults from a generator seeded with `seed`.
    ///
    /// Fails with `InvalidInput` when `faults` does not validate.
    pub fn start(
        listen: SocketAddr,
        faults: Faults,
        seed: u64,
    ) -> BoxFuture<'static, io::Result<Upstream>> {
        Box::pin(Self::start_body(listen, faults, seed))
    }

    async fn start_body(listen: SocketAddr, faults: Faults, seed: u64) -> io::Result<Upstream> {
        faults
            .validate()
            .map_err(|invalid| io::Error::new(io::ErrorKind::InvalidInput, invalid))?;
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(faults, seed));
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(accept_loop(
            listener,
            router(Arc::clone(&shared)),
            shutdown.clone(),
        ));
        info!(%local_addr, seed, "demo upstream listening");
        Ok(Upstream {
            handle: UpstreamHandle { local_addr, shared },
            shutdown,
            server: Some(server),
        })
    }

    /// The address the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// `http://<local_addr>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        self.handle.base_url()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.handle.stats()
    }

    /// The fault rates in force.
    pub fn faults(&self) -> Faults {
        self.handle.faults()
    }

    /// Replaces the fault rates from the next request on.
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        self.handle.set_faults(faults)
    }

    /// A clonable handle on this upstream's state.
    pub fn handle(&self) -> UpstreamHandle {
        self.handle.clone()
    }

    /// Stops accepting, gives open connections [`SHUTDOWN_GRACE`] to finish, drops the rest and
    /// returns when the server task has ended.
    pub fn shutdown(self) -> BoxFuture<'static, ()> {
        Box::pin(self.shutdown_body())
    }

    async fn shutdown_body(mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            if let Err(failed) = server.await {
                warn!(error = %failed, "demo upstream server task failed");
            }
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        // The server task ends by itself once cancelled; nothing to wait for here.
        self.shutdown.cancel();
    }
}

impl UpstreamHandle {
    /// The address the server is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://<local_addr>`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// The fault rates in force.
    pub fn faults(&self) -> Faults {
        self.shared.faults()
    }

    /// Replaces the fault rates from the next request on.
    pub fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        self.shared.set_faults(faults)
    }
}

async fn accept_loop(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    // A JoinSet so that connection tasks are aborted if this task is, and reaped as they end.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    debug!(%peer, "connection accepted");
                    connections.spawn(serve_connection(stream, router.clone(), shutdown.clone()));
                }
                Err(failed) => {
                    warn!(error = %failed, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    info!("demo upstream stopped");
}

async fn serve_connection(stream: TcpStream, router: Router, shutdown: CancellationToken) {
    if let Err(failed) = stream.set_nodelay(true) {
        debug!(error = %failed, "could not set TCP_NODELAY");
    }
    let abort = ConnectionAbort::default();
    let service = {
        let abort = abort.clone();
        service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(abort.clone());
            router.clone().oneshot(request)
        })
    };
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        served = connection.as_mut() => {
            if let Err(failed) = served {
                debug!(error = %failed, "connection ended with an error");
            }
        }
        () = abort.requested() => {
            // Returning drops `connection` and with it the socket: the client sees the
            // connection close with no response.
            debug!("dropping connection without a response");
        }
        () = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = &mut connection => {}
                () = abort.requested() => {}
                () = tokio::time::sleep(SHUTDOWN_GRACE) => {
                    debug!("connection still busy at shutdown; dropping it");
                }
            }
        }
    }
}
