//! The upstream's HTTP face: an axum router served connection by connection with hyper, so a
//! handler can close its own connection without answering, and the fault acted out around
//! each call to the [`World`].
//!
//! Routes, per endpoint `<e>` (the catalog's tools point here):
//!
//! | route | what |
//! |---|---|
//! | `POST /e/<e>` | dispatch: commit (or read), answer `{"id"}` |
//! | `GET /e/<e>/by-key/<business key>` | status check: 200 `{"id"}`, 404, 409 `{"refs"}`; slow for some keys |
//! | `GET /e/<e>/by-idem/<idempotency key>` | the same, by idempotency key |
//! | `POST /e/<e>/<id>/reverse` | compensate: 200 `{"id"}` of the reversal, 404, 409 |
//!
//! A late commit is spawned as a task of its own: when the client times out and closes the
//! connection, hyper drops the handler's future, and the commit must happen anyway — as it does
//! at a real server that does not cancel work when its client goes away.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::faults::{DispatchFault, FaultRates, FaultTimes, Phase, ReverseFault};
use super::record::{CallMeta, EndpointSpec, KeyHandling, Lookup, LookupBy, ReverseOutcome, World};
use crate::chaos::dice;

/// The state every handler shares.
#[derive(Debug)]
pub struct Shared {
    pub seed: u64,
    pub endpoints: HashMap<String, EndpointSpec>,
    pub rates: Mutex<FaultRates>,
    pub times: FaultTimes,
    pub world: Mutex<World>,
    /// The phase the runner has set (rate limited, an outage), over the dice.
    pub phase: Mutex<Phase>,
}

impl Shared {
    /// The world, even if a handler panicked while holding it (the record is append-only, so
    /// what is there is still true).
    pub fn world(&self) -> MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn phase(&self) -> Phase {
        self.phase
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn rates(&self) -> FaultRates {
        self.rates
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How long a held answer waits: past the client's timeout.
    fn hold(&self, timeout_ms: u64) -> Duration {
        Duration::from_millis(timeout_ms + self.times.hold_past_timeout_ms)
    }
}

/// Lets a handler drop its own connection: the connection task closes the socket when asked.
#[derive(Debug, Clone, Default)]
struct Abort(Arc<Notify>);

impl Abort {
    async fn drop_connection(&self) -> Response {
        // `notify_one` keeps a permit if the connection task is not waiting yet.
        self.0.notify_one();
        std::future::pending().await
    }
}

/// Marks a dispatch request finished when dropped: when its handler returns, when the client's
/// disconnect drops the handler, or when its spawned late commit is done.
struct Finish {
    shared: Arc<Shared>,
    seq: u64,
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.shared.world().finish(self.seq);
    }
}

pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/e/{endpoint}", post(dispatch))
        .route("/e/{endpoint}/by-key/{key}", get(by_business_key))
        .route("/e/{endpoint}/by-idem/{key}", get(by_idempotency_key))
        .route("/e/{endpoint}/{id}/reverse", post(reverse))
        .with_state(shared)
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn meta(headers: &HeaderMap) -> CallMeta {
    CallMeta {
        idempotency_key: header(headers, "idempotency-key"),
        business_key: header(headers, "x-sluice-business-key"),
        run_id: header(headers, "x-sluice-run-id"),
        command_key: header(headers, "x-sluice-command-key"),
        dispatch_key: header(headers, "x-sluice-dispatch-idempotency-key"),
        effect_ref: None,
    }
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn unavailable() -> Response {
    answer(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"error": "temporarily unavailable"}),
    )
}

async fn dispatch(
    State(shared): State<Arc<Shared>>,
    Extension(abort): Extension<Abort>,
    Path(endpoint): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(spec) = shared.endpoints.get(&endpoint).cloned() else {
        return answer(StatusCode::NOT_FOUND, json!({"error": "no such endpoint"}));
    };
    let mut meta = meta(&headers);
    meta.effect_ref = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|args| args["ref"].as_str().map(str::to_owned));
    let key = meta.idempotency_key.clone().unwrap_or_default();
    let dedupes = spec.keys == KeyHandling::Deduplicate;
    let (seq, fault, in_progress) = {
        let rates = shared.rates();
        let mut world = shared.world();
        let ordinal = world.ordinal(&endpoint, "dispatch", &key);
        let doubles = spec.double_commits && spec.keys != KeyHandling::Deduplicate;
        let fault = shared
            .phase()
            .dispatch_fault(shared.seed, &endpoint, &key, ordinal)
            .unwrap_or_else(|| {
                rates.dispatch_fault(shared.seed, &endpoint, &key, ordinal, doubles)
            });
        let seq = world.arrive(&endpoint, &meta, fault);
        let in_progress = dedupes && world.commit_scheduled(&endpoint, &key);
        if in_progress {
            world.mark_in_progress(seq);
        }
        (seq, fault, in_progress)
    };
    let finish = Finish {
        shared: Arc::clone(&shared),
        seq,
    };
    if spec.read_only {
        return read(&shared, &spec, fault, &abort, finish).await;
    }
    if in_progress {
        // An honest deduplicating upstream (Stripe-like): the key's first request is still
        // being processed, so this one is neither done nor refused.
        return answer(
            StatusCode::CONFLICT,
            json!({"error": "a request with this idempotency key is in progress"}),
        );
    }
    let commit_now = |n: u32| commit(&shared, &spec, &key, seq, fault, n);
    let hold = shared.hold(spec.timeout_ms);
    match fault {
        DispatchFault::None => {
            let (id, created) = commit_now(0);
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            answer(status, json!({"id": id}))
        }
        DispatchFault::Refuse5xx => unavailable(),
        DispatchFault::RateLimited => rate_limited(&shared),
        DispatchFault::CommitThenTimeout => {
            let (id, _) = commit_now(0);
            tokio::time::sleep(hold).await;
            answer(StatusCode::CREATED, json!({"id": id}))
        }
        DispatchFault::TimeoutNoCommit => {
            tokio::time::sleep(hold).await;
            unavailable()
        }
        DispatchFault::LateCommit => {
            let (low, high) = shared.times.late_commit_ms;
            let late = dice::between(shared.seed, &["late", &key, &seq.to_string()], low, high);
            let delay = Duration::from_millis(spec.timeout_ms + late);
            shared.world().schedule(&endpoint, &key);
            let task = {
                let (shared, spec, key) = (Arc::clone(&shared), spec.clone(), key.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    shared.world().unschedule(&spec.name, &key);
                    let (id, _) = commit(&shared, &spec, &key, seq, fault, 0);
                    // The request's work ends with its commit.
                    drop(finish);
                    id
                })
            };
            match task.await {
                Ok(id) => answer(StatusCode::CREATED, json!({"id": id})),
                Err(_) => unavailable(),
            }
        }
        DispatchFault::CommitThen5xx => {
            commit_now(0);
            answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal error"}),
            )
        }
        DispatchFault::CommitThenDrop => {
            commit_now(0);
            abort.drop_connection().await
        }
        DispatchFault::DoubleCommit => {
            let (first, _) = commit_now(0);
            let (second, _) = commit_now(1);
            // Either commit may be the one the answer names.
            let named = if dice::unit(shared.seed, &["double", &key, &seq.to_string()]) < 0.5 {
                first
            } else {
                second
            };
            answer(StatusCode::CREATED, json!({"id": named}))
        }
    }
}

/// Commits for request `seq` (the `n`-th commit it makes); a deduplicating endpoint answers
/// the key's existing commit instead. Returns the id and whether it is new.
fn commit(
    shared: &Shared,
    spec: &EndpointSpec,
    key: &str,
    seq: u64,
    fault: DispatchFault,
    n: u32,
) -> (String, bool) {
    let rates = shared.rates();
    let mut world = shared.world();
    if spec.keys == KeyHandling::Deduplicate
        && !key.is_empty()
        && let Some(id) = world.deduplicated(&spec.name, key)
    {
        return (id, false);
    }
    let identity = format!("{}/{key}/{seq}/{n}", spec.name);
    let lag = if rates.lagged(shared.seed, &identity) {
        let (low, high) = shared.times.lag_ms;
        dice::between(shared.seed, &["lag-ms", &identity], low, high)
    } else {
        0
    };
    (world.commit(&spec.name, seq, fault, lag), true)
}

/// A read endpoint: faults delay, fail or drop the answer; nothing is committed.
async fn read(
    shared: &Shared,
    spec: &EndpointSpec,
    fault: DispatchFault,
    abort: &Abort,
    finish: Finish,
) -> Response {
    let faulted = fault != DispatchFault::None && fault != DispatchFault::DoubleCommit;
    shared.world().count_read(faulted);
    let _finish = finish;
    match fault {
        DispatchFault::None | DispatchFault::DoubleCommit => {
            answer(StatusCode::OK, json!({"id": "read", "results": []}))
        }
        DispatchFault::CommitThenTimeout
        | DispatchFault::TimeoutNoCommit
        | DispatchFault::LateCommit => {
            tokio::time::sleep(shared.hold(spec.timeout_ms)).await;
            answer(StatusCode::OK, json!({"id": "read", "results": []}))
        }
        DispatchFault::CommitThen5xx | DispatchFault::Refuse5xx => unavailable(),
        DispatchFault::RateLimited => rate_limited(shared),
        DispatchFault::CommitThenDrop => abort.drop_connection().await,
    }
}

/// 429 with the phase's `Retry-After`, nothing done.
fn rate_limited(shared: &Shared) -> Response {
    let after = match shared.phase() {
        Phase::RateLimited { retry_after_s, .. } => retry_after_s,
        Phase::Normal | Phase::Outage { .. } => 1,
    };
    let mut response = answer(
        StatusCode::TOO_MANY_REQUESTS,
        json!({"error": "rate limited; nothing was done"}),
    );
    if let Ok(value) = axum::http::HeaderValue::from_str(&after.to_string()) {
        response.headers_mut().insert("retry-after", value);
    }
    response
}

async fn by_business_key(
    State(shared): State<Arc<Shared>>,
    Path((endpoint, key)): Path<(String, String)>,
) -> Response {
    lookup(&shared, &endpoint, LookupBy::BusinessKey, &key).await
}

async fn by_idempotency_key(
    State(shared): State<Arc<Shared>>,
    Path((endpoint, key)): Path<(String, String)>,
) -> Response {
    lookup(&shared, &endpoint, LookupBy::IdempotencyKey, &key).await
}

async fn lookup(shared: &Shared, endpoint: &str, by: LookupBy, key: &str) -> Response {
    let Some(spec) = shared.endpoints.get(endpoint) else {
        return answer(StatusCode::NOT_FOUND, json!({"error": "no such endpoint"}));
    };
    let rates = shared.rates();
    if rates.slow_lookup(shared.seed, endpoint, key) {
        // A key this endpoint is slow to find: the answer comes after the client's check
        // timeout and the sweep's item budget. The client has hung up by then, which drops
        // this handler at the sleep, as a real server's work for a closed connection is lost.
        shared.world().slow_lookup(endpoint, key);
        tokio::time::sleep(Duration::from_millis(spec.slow_lookup_ms)).await;
        return read_lookup(&mut shared.world(), endpoint, by, key);
    }
    let mut world = shared.world();
    let ordinal = world.ordinal(endpoint, "check", key);
    if shared.phase().check_down(endpoint)
        || rates.check_inconclusive(shared.seed, endpoint, key, ordinal)
    {
        world.count_inconclusive();
        return unavailable();
    }
    read_lookup(&mut world, endpoint, by, key)
}

/// The answer of a status check from the record as it is now.
fn read_lookup(world: &mut World, endpoint: &str, by: LookupBy, key: &str) -> Response {
    match world.lookup(endpoint, by, key) {
        Lookup::Absent => answer(StatusCode::NOT_FOUND, json!({"error": "no such commit"})),
        Lookup::Present(id) => answer(StatusCode::OK, json!({"id": id})),
        // Oldest first; no `id`, so the connector takes the first listed as the command's own.
        Lookup::Duplicate(refs) => answer(StatusCode::CONFLICT, json!({"refs": refs})),
    }
}

async fn reverse(
    State(shared): State<Arc<Shared>>,
    Extension(abort): Extension<Abort>,
    Path((endpoint, target)): Path<(String, String)>,
    headers: HeaderMap,
    _body: Bytes,
) -> Response {
    let Some(spec) = shared.endpoints.get(&endpoint).cloned() else {
        return answer(StatusCode::NOT_FOUND, json!({"error": "no such endpoint"}));
    };
    let meta = meta(&headers);
    let key = meta.idempotency_key.clone().unwrap_or_default();
    let (outcome, fault, reference) = {
        let rates = shared.rates();
        let mut world = shared.world();
        let ordinal = world.ordinal(&endpoint, "reverse", &key);
        let fault = rates.reverse_fault(shared.seed, &endpoint, &key, ordinal);
        let (outcome, reference) = world.reverse(&endpoint, &target, &meta, fault);
        (outcome, fault, reference)
    };
    match outcome {
        ReverseOutcome::NotDone => {
            tokio::time::sleep(shared.hold(spec.reverse_timeout_ms)).await;
            unavailable()
        }
        ReverseOutcome::UnknownCommit => {
            answer(StatusCode::NOT_FOUND, json!({"error": "no such commit"}))
        }
        ReverseOutcome::AlreadyReversed => answer(
            StatusCode::CONFLICT,
            json!({"error": "already reversed by another request"}),
        ),
        ReverseOutcome::Reversed | ReverseOutcome::Replayed => match fault {
            ReverseFault::None | ReverseFault::TimeoutNoReverse => {
                answer(StatusCode::OK, json!({"id": reference}))
            }
            ReverseFault::ReverseThen5xx => answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"error": "internal error"}),
            ),
            ReverseFault::ReverseThenDrop => abort.drop_connection().await,
        },
    }
}

/// Accepts connections until `shutdown`, serving each on its own task.
pub async fn accept_loop(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve(stream, router.clone(), shutdown.clone()));
                }
                // Out of descriptors or the like: pause rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
        }
    }
    connections.abort_all();
}

async fn serve(stream: TcpStream, router: Router, shutdown: CancellationToken) {
    let _ = stream.set_nodelay(true);
    let abort = Abort::default();
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
    tokio::select! {
        _ = connection => {}
        // Dropping the connection closes the socket with no answer written.
        () = abort.0.notified() => {}
        () = shutdown.cancelled() => {}
    }
}

/// Binds a free loopback port.
pub async fn bind() -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
    let addr = listener.local_addr()?;
    Ok((listener, addr))
}
