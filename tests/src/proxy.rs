//! A fault-injecting HTTP/1.1 reverse proxy for the tests: it stands on a free loopback port in
//! front of one upstream (an emulator such as localstripe or Mailpit) and, when a test arms a
//! fault, loses a request before it reaches the upstream or loses the upstream's answer after
//! it committed. Those are the ambiguous outcomes Sluice has to reconcile. It records every
//! request it saw, so a test can check what reached the upstream.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use axum::http::Method;
//! use sluice_tests::proxy::{Fault, Proxy};
//!
//! let proxy = Proxy::start("http://127.0.0.1:8420").await?;
//! proxy.arm(Method::POST, "/v1/charges", Fault::DropBeforeArrival);
//! // ... point the catalog at `proxy.base_url()` and run the command ...
//! let seen = proxy.seen();
//! assert!(!seen[0].forwarded, "the first charge never reached the upstream");
//! # Ok(()) }
//! ```
//!
//! Forwarding keeps the method, path and query, headers and body byte for byte. Two kinds of
//! header are handled differently. The hop-by-hop headers (RFC 9110 §7.6.1) belong to each
//! connection and are not passed on, in either direction. `Host` is set to the upstream's
//! address, unless [`Proxy::keep_host`] says to pass the client's on (a request signed with AWS
//! Signature V4 signs `Host`, and moto checks it when its signature checks are on). Nothing is
//! redacted, because these are tests only. Each forwarded request gets a
//! new upstream connection, so a pooled connection the upstream has closed can never cause a
//! failure the test did not ask for. The upstream call runs as a task of its own: a client that
//! gives up mid-call does not cancel it, just as a real network would not.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header::{self, HeaderMap, HeaderName};
use axum::http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

/// How long the proxy waits for the upstream's answer before it answers 502 itself.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// What happens to the next request that matches an armed rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request is read in full, then the client's connection is closed without an answer.
    /// Nothing is forwarded: the client sent its request and never learns what became of it.
    DropBeforeArrival,
    /// The request is forwarded and the upstream's answer is discarded. The client gets `503`
    /// with a short text body.
    CommitThen503,
    /// The request is forwarded, the upstream's answer is read and discarded, and then the
    /// client's connection is closed without an answer.
    CommitThenDrop,
    /// Waits this long, then forwards the request as usual.
    Delay(Duration),
}

/// One request the proxy received, in the order received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    /// The path and query as the client sent them (e.g. `/v1/charges?limit=3`).
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The armed fault this request used up, if any.
    pub fault: Option<Fault>,
    /// Whether the request was sent to the upstream. It is set when the request goes out, so a
    /// delayed request shows `false` until its delay is over.
    pub forwarded: bool,
    /// The upstream's status code, once its answer has been read. This is what the upstream
    /// said, not what the client was told.
    pub upstream_status: Option<StatusCode>,
    /// Why the upstream call failed, when it did. The client then gets `502`.
    pub upstream_error: Option<String>,
}

/// A one-shot rule: `fault` applies to the next request with this method whose path starts
/// with `path_prefix`. The query is not part of the match.
#[derive(Debug, Clone)]
struct Rule {
    method: Method,
    path_prefix: String,
    fault: Fault,
}

#[derive(Debug)]
struct Shared {
    /// The upstream's base URL without a trailing `/`; the request's path and query follow it.
    upstream: String,
    client: reqwest::Client,
    keep_host: AtomicBool,
    rules: Mutex<VecDeque<Rule>>,
    seen: Mutex<Vec<Seen>>,
}

/// Locks `mutex` even if a task panicked while holding it. The rules and the log stay
/// consistent after such a panic, because every change to them is a single push, pop or field
/// write.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// Removes and returns the first armed rule matching `method` and `path`.
    fn take_rule(&self, method: &Method, path: &str) -> Option<Fault> {
        let mut rules = lock(&self.rules);
        let at = rules
            .iter()
            .position(|r| r.method == *method && path.starts_with(&r.path_prefix))?;
        rules.remove(at).map(|r| r.fault)
    }

    fn record(&self, seen: Seen) -> usize {
        let mut log = lock(&self.seen);
        log.push(seen);
        log.len() - 1
    }

    fn update(&self, index: usize, change: impl FnOnce(&mut Seen)) {
        if let Some(seen) = lock(&self.seen).get_mut(index) {
            change(seen);
        }
    }
}

/// The proxy. It stops when dropped, or when [`Proxy::shutdown`] is called.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `upstream` (e.g.
    /// `http://127.0.0.1:8420`; a base path such as `http://host:port/api` is kept in front of
    /// every request's path).
    pub async fn start(upstream: &str) -> std::io::Result<Self> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), upstream).await
    }

    /// As [`Proxy::start`], on `listen`.
    pub async fn start_on(listen: SocketAddr, upstream: &str) -> std::io::Result<Self> {
        let client = reqwest::Client::builder()
            // Without this, reqwest would add `Accept: */*` to requests that have no `Accept`.
            .default_headers(HeaderMap::new())
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .http1_only()
            .pool_max_idle_per_host(0)
            .timeout(UPSTREAM_TIMEOUT)
            .build()
            .map_err(std::io::Error::other)?;
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client,
            keep_host: AtomicBool::new(false),
            rules: Mutex::default(),
            seen: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(accept(listener, Arc::clone(&shared), shutdown.clone()));
        Ok(Self {
            addr,
            shared,
            shutdown,
            task: Some(task),
        })
    }

    /// The proxy's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`: the base URL to give the client in place of the upstream's.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Arms `fault` for the next request with `method` whose path starts with `path_prefix`.
    /// Rules are kept in the order armed. Each request uses up at most one rule: the first one
    /// that matches it.
    pub fn arm(&self, method: Method, path_prefix: &str, fault: Fault) {
        lock(&self.shared.rules).push_back(Rule {
            method,
            path_prefix: path_prefix.to_owned(),
            fault,
        });
    }

    /// Whether requests go upstream with the client's own `Host` header (`true`) or with the
    /// upstream's address (`false`, the default).
    pub fn keep_host(&self, keep: bool) {
        self.shared.keep_host.store(keep, Ordering::SeqCst);
    }

    /// How many armed rules no request has used yet.
    pub fn armed(&self) -> usize {
        lock(&self.shared.rules).len()
    }

    /// Removes every armed rule that no request has used yet.
    pub fn disarm(&self) {
        lock(&self.shared.rules).clear();
    }

    /// Every request received so far, oldest first.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.shared.seen).clone()
    }

    /// How many requests with `method` and a path starting with `path_prefix` reached the
    /// upstream.
    pub fn forwarded(&self, method: &Method, path_prefix: &str) -> usize {
        lock(&self.shared.seen)
            .iter()
            .filter(|s| s.forwarded && s.method == *method && s.path.starts_with(path_prefix))
            .count()
    }

    /// Stops accepting connections, closes the open ones, and waits for the accept loop to
    /// end.
    pub async fn shutdown(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, Arc::clone(&shared), shutdown.clone()));
                }
                // Out of descriptors or something similar: pause instead of spinning.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
    connections.abort_all();
}

/// Serves one client connection until it ends, the proxy stops, or a fault hangs it up.
async fn serve(stream: TcpStream, shared: Arc<Shared>, shutdown: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let hang_up = Arc::new(Notify::new());
    let service = {
        let hang_up = Arc::clone(&hang_up);
        service_fn(move |request| handle(Arc::clone(&shared), Arc::clone(&hang_up), request))
    };
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        _ = connection => {}
        // Dropping the connection closes the socket without writing an answer.
        () = hang_up.notified() => {}
        () = shutdown.cancelled() => {}
    }
}

async fn handle(
    shared: Arc<Shared>,
    hang_up: Arc<Notify>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(Body::new(body), usize::MAX).await else {
        // The client went away before its request was complete: nothing to record.
        return hang_up_now(&hang_up).await;
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let fault = shared.take_rule(&parts.method, parts.uri.path());
    let index = shared.record(Seen {
        method: parts.method.clone(),
        path: path.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
        fault,
        forwarded: false,
        upstream_status: None,
        upstream_error: None,
    });
    let exchange = tokio::spawn(exchange(
        shared,
        index,
        parts.method,
        path,
        parts.headers,
        body,
        fault,
    ));
    match exchange.await {
        Ok(Some(response)) => Ok(response),
        // A hang-up the fault asked for, or an exchange task that panicked.
        Ok(None) | Err(_) => hang_up_now(&hang_up).await,
    }
}

/// Has the connection closed without an answer. The returned future never completes, because
/// the connection (and this handler with it) is dropped first.
async fn hang_up_now(hang_up: &Notify) -> Result<Response<Body>, Infallible> {
    // `notify_one` stores a permit if `serve` is not waiting yet.
    hang_up.notify_one();
    std::future::pending().await
}

/// Acts out the fault around one request. Returns the client's answer, or `None` when the
/// connection should close without one.
async fn exchange(
    shared: Arc<Shared>,
    index: usize,
    method: Method,
    path: String,
    mut headers: HeaderMap,
    body: Bytes,
    fault: Option<Fault>,
) -> Option<Response<Body>> {
    match fault {
        Some(Fault::DropBeforeArrival) => return None,
        Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
        _ => {}
    }
    strip_hop_by_hop(&mut headers);
    if !shared.keep_host.load(Ordering::SeqCst) {
        // reqwest sets `Host` from the URL.
        headers.remove(header::HOST);
    }
    let request = shared
        .client
        .request(method, format!("{}{path}", shared.upstream));
    shared.update(index, |s| s.forwarded = true);
    let (status, headers, body) = match call(request.headers(headers).body(body)).await {
        Ok(answer) => answer,
        Err(e) => {
            shared.update(index, |s| s.upstream_error = Some(e.to_string()));
            let text = format!("sluice test proxy: the upstream call failed: {e}\n");
            return Some(text_answer(StatusCode::BAD_GATEWAY, text));
        }
    };
    shared.update(index, |s| s.upstream_status = Some(status));
    match fault {
        Some(Fault::CommitThenDrop) => None,
        Some(Fault::CommitThen503) => Some(text_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            "sluice test proxy: injected 503 after the upstream answered\n".to_owned(),
        )),
        _ => {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            *response.headers_mut() = headers;
            Some(response)
        }
    }
}

/// Sends `request` and reads the whole answer: status, headers (less the hop-by-hop ones), body.
async fn call(request: reqwest::RequestBuilder) -> reqwest::Result<(StatusCode, HeaderMap, Bytes)> {
    let response = request.send().await?;
    let status = response.status();
    let mut headers = response.headers().clone();
    strip_hop_by_hop(&mut headers);
    Ok((status, headers, response.bytes().await?))
}

/// Removes the headers that describe one connection rather than the message (RFC 9110
/// §7.6.1), including any that `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ] {
        headers.remove(name);
    }
}

fn text_answer(status: StatusCode, text: String) -> Response<Body> {
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests;
