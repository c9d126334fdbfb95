//! The HTTP face of the upstream: routes, the Sluice call headers, and acting out faults.
//!
//! Every handler makes its decision (fault draw, commit) under one short lock of [`Shared`]
//! and only then awaits, so a held or dropped response never blocks another request.

use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;
use tracing::{Span, info, instrument};

use crate::faults::{
    AfterCommit, Commits, Family, FaultCounts, FaultKind, Faults, FaultsError, Plan,
};
use crate::world::{
    CallMeta, EmailDraft, KeyLookup, ReverseRefusal, Stats, TicketDraft, WireOrder, World,
};

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const RUN_ID: HeaderName = HeaderName::from_static("x-sluice-run-id");
const COMMAND_KEY: HeaderName = HeaderName::from_static("x-sluice-command-key");
const BUSINESS_KEY: HeaderName = HeaderName::from_static("x-sluice-business-key");

/// Search hits when the request names no limit, and the most it may ask for.
const DEFAULT_SEARCH_LIMIT: usize = 3;
const MAX_SEARCH_LIMIT: usize = 50;

/// The state every handler shares: the world, the fault rates, the seeded dice and the fault
/// counters, behind one lock so that a stats snapshot is consistent.
#[derive(Debug)]
pub(crate) struct Shared {
    state: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    world: World,
    faults: Faults,
    /// One draw per faultable request, in arrival order: requests sent one at a time against
    /// the same seed meet the same faults.
    dice: StdRng,
    injected: FaultCounts,
}

impl Shared {
    pub(crate) fn new(faults: Faults, seed: u64) -> Self {
        Shared {
            state: Mutex::new(Inner {
                world: World::default(),
                faults,
                dice: StdRng::seed_from_u64(seed),
                injected: FaultCounts::default(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Poisoning needs a panic under the lock; nothing under it panics (each critical
        // section is a lookup, a push or a counter bump), so this cannot fail.
        self.state.lock().expect("upstream state lock poisoned")
    }

    pub(crate) fn stats(&self) -> Stats {
        let state = self.lock();
        state.world.stats(state.injected)
    }

    pub(crate) fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    pub(crate) fn set_faults(&self, faults: Faults) -> Result<(), FaultsError> {
        faults.validate()?;
        info!(?faults, "fault rates changed");
        self.lock().faults = faults;
        Ok(())
    }

    /// Draws the fault for one request to `family` and returns what to do.
    fn plan(&self, family: Family) -> Plan {
        let mut state = self.lock();
        let draw: f64 = state.dice.random();
        let fault = state.faults.rates(family).pick(draw);
        if let Some(kind) = fault {
            state.injected.record(kind);
            info!(fault = %kind, %family, "injecting fault");
        }
        let latency = state.faults.latency_ms;
        match Plan::for_fault(fault, state.faults.timeout_sleep()) {
            Plan::Commit {
                times,
                then: AfterCommit::Answer,
            } if latency > 0 => Plan::Commit {
                times,
                then: AfterCommit::AnswerLate(std::time::Duration::from_millis(latency)),
            },
            plan => plan,
        }
    }

    /// Draws the fault of one status check (`StatusInconclusive`, `StatusRateLimited` or
    /// none); such a check is counted here.
    fn status_fault(&self) -> Option<FaultKind> {
        let mut state = self.lock();
        let draw: f64 = state.dice.random();
        let inconclusive = state.faults.status_inconclusive;
        let fault = if draw < inconclusive {
            FaultKind::StatusInconclusive
        } else if draw < inconclusive + state.faults.status_rate_limited {
            FaultKind::StatusRateLimited
        } else {
            return None;
        };
        state.injected.record(fault);
        state.world.record_inconclusive_check();
        info!(%fault, "injecting fault");
        Some(fault)
    }

    /// The `Retry-After` of a rate-limited answer, in seconds.
    fn retry_after_secs(&self) -> u64 {
        self.lock().faults.retry_after_secs
    }

    fn world<R>(&self, change: impl FnOnce(&mut World) -> R) -> R {
        change(&mut self.lock().world)
    }
}

/// Lets a handler close its own connection without answering: the connection task (see
/// `server.rs`) drops the socket when asked, and the handler never completes.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionAbort(Arc<Notify>);

impl ConnectionAbort {
    /// Resolves once a handler on this connection asked for it to be dropped.
    pub(crate) async fn requested(&self) {
        self.0.notified().await;
    }

    async fn drop_without_response(&self) -> Response {
        // `notify_one` keeps a permit if the connection task is not waiting yet, so the request
        // cannot be lost; this future is then dropped with the connection.
        self.0.notify_one();
        std::future::pending().await
    }
}

/// The routes, over `shared`.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/bank/wires", post(book_wire))
        .route("/bank/wires/by-key/{business_key}", get(wire_by_key))
        .route("/bank/wires/{id}", get(wire_by_id))
        .route("/bank/wires/{id}/reverse", post(reverse_wire))
        .route("/email/messages", post(send_email))
        .route("/tickets", post(open_ticket))
        .route("/tickets/{id}/close", post(close_ticket))
        .route("/search", post(search))
        .route("/_stats", get(stats))
        .route("/_faults", get(faults).post(set_faults))
        .with_state(shared)
}

/// The wire contract's headers of one call (docs/architecture.md, "Wire contract").
#[derive(Debug)]
struct CallHeaders {
    meta: CallMeta,
    business_key: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for CallHeaders {
    type Rejection = BadHeader;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let header = |name: HeaderName| -> Result<Option<String>, BadHeader> {
            parts
                .headers
                .get(&name)
                .map(|value| value.to_str().map(str::to_owned))
                .transpose()
                .map_err(|_| BadHeader(name))
        };
        Ok(CallHeaders {
            meta: CallMeta {
                idempotency_key: header(IDEMPOTENCY_KEY)?,
                run_id: header(RUN_ID)?,
                command_key: header(COMMAND_KEY)?,
            },
            business_key: header(BUSINESS_KEY)?,
        })
    }
}

/// A Sluice header whose value is not visible ASCII.
#[derive(Debug)]
struct BadHeader(HeaderName);

impl IntoResponse for BadHeader {
    fn into_response(self) -> Response {
        error(
            StatusCode::BAD_REQUEST,
            format!("header {} is not visible ASCII", self.0),
        )
    }
}

#[instrument(skip_all, fields(
    run_id = call.meta.run_id.as_deref(),
    command_key = call.meta.command_key.as_deref(),
    business_key,
))]
async fn book_wire(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<ConnectionAbort>,
    call: CallHeaders,
    body: Result<Json<WireOrder>, JsonRejection>,
) -> Response {
    let order = match body {
        Ok(Json(order)) => order,
        Err(rejection) => return rejected(rejection),
    };
    if let Some(reason) = order.refusal() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, reason);
    }
    let business_key = call.business_key.unwrap_or_else(|| order.business_key());
    Span::current().record("business_key", business_key.as_str());
    let (times, then) = match shared.plan(Family::Bank) {
        Plan::Refuse => return refused(),
        Plan::RateLimit => return rate_limited(shared.retry_after_secs()),
        Plan::Commit { times, then } => (times, then),
    };
    let wire = shared.world(|world| {
        let wire = world.book_wire(&order, &business_key, &call.meta);
        match times {
            Commits::Once => {}
            Commits::Twice => {
                world.book_wire(&order, &business_key, &call.meta);
            }
        }
        wire
    });
    info!(wire = %wire.id, ?times, "wire booked");
    deliver(then, &connection, (StatusCode::CREATED, Json(wire))).await
}

async fn wire_by_key(
    State(shared): State<Arc<Shared>>,
    Path(business_key): Path<String>,
) -> Response {
    match shared.status_fault() {
        Some(FaultKind::StatusRateLimited) => return rate_limited(shared.retry_after_secs()),
        Some(_) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "wire lookup temporarily unavailable",
            );
        }
        None => {}
    }
    match shared.world(|world| world.lookup_by_key(&business_key)) {
        KeyLookup::Absent => error(
            StatusCode::NOT_FOUND,
            format!("no standing wire has business key {business_key}"),
        ),
        KeyLookup::Present(wire) => (StatusCode::OK, Json(wire)).into_response(),
        KeyLookup::Duplicate(refs) => (
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("{} standing wires have business key {business_key}", refs.len()),
                "id": refs[0],
                "refs": refs,
            })),
        )
            .into_response(),
    }
}

async fn wire_by_id(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match shared.world(|world| world.wire(&id).cloned()) {
        Some(wire) => (StatusCode::OK, Json(wire)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no wire {id}")),
    }
}

/// Compensation is not faulted: an injected failure here would turn every rollback into an
/// escalation (a retried reversal meets 409) and test nothing about dispatch.
#[instrument(skip_all, fields(
    run_id = call.meta.run_id.as_deref(),
    command_key = call.meta.command_key.as_deref(),
    wire = %id,
))]
async fn reverse_wire(
    State(shared): State<Arc<Shared>>,
    call: CallHeaders,
    Path(id): Path<String>,
) -> Response {
    match shared.world(|world| world.reverse_wire(&id)) {
        Ok(reversal) => {
            info!(%reversal, "wire reversed");
            (
                StatusCode::OK,
                Json(json!({"id": reversal, "wire": id, "status": "reversed"})),
            )
                .into_response()
        }
        Err(ReverseRefusal::UnknownWire) => error(StatusCode::NOT_FOUND, format!("no wire {id}")),
        Err(ReverseRefusal::AlreadyReversed { reversal }) => (
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("wire {id} is already reversed by {reversal}"),
                "reversal": reversal,
            })),
        )
            .into_response(),
    }
}

#[instrument(skip_all, fields(
    run_id = call.meta.run_id.as_deref(),
    command_key = call.meta.command_key.as_deref(),
))]
async fn send_email(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<ConnectionAbort>,
    call: CallHeaders,
    body: Result<Json<EmailDraft>, JsonRejection>,
) -> Response {
    let draft = match body {
        Ok(Json(draft)) => draft,
        Err(rejection) => return rejected(rejection),
    };
    if !draft.to.contains('@') || draft.subject.is_empty() {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "to must be an email address and subject must not be empty",
        );
    }
    // `commit_twice` is refused outside the bank, and a second send under the same key would
    // find the first anyway, so a mail commit happens once.
    let then = match shared.plan(Family::Email) {
        Plan::Refuse => return refused(),
        Plan::RateLimit => return rate_limited(shared.retry_after_secs()),
        Plan::Commit { then, .. } => then,
    };
    let sent = shared.world(|world| world.send_email(&draft, &call.meta));
    info!(email = %sent.value.id, created = sent.created, "email sent");
    deliver(
        then,
        &connection,
        (created_or_ok(sent.created), Json(sent.value)),
    )
    .await
}

#[instrument(skip_all, fields(
    run_id = call.meta.run_id.as_deref(),
    command_key = call.meta.command_key.as_deref(),
))]
async fn open_ticket(
    State(shared): State<Arc<Shared>>,
    Extension(connection): Extension<ConnectionAbort>,
    call: CallHeaders,
    body: Result<Json<TicketDraft>, JsonRejection>,
) -> Response {
    let draft = match body {
        Ok(Json(draft)) => draft,
        Err(rejection) => return rejected(rejection),
    };
    if let Some(reason) = draft.refusal() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, reason);
    }
    // As for mail: deduplicated by key, so a ticket commit happens once.
    let then = match shared.plan(Family::Tickets) {
        Plan::Refuse => return refused(),
        Plan::RateLimit => return rate_limited(shared.retry_after_secs()),
        Plan::Commit { then, .. } => then,
    };
    let opened = shared.world(|world| world.open_ticket(&draft, &call.meta));
    info!(ticket = %opened.value.id, created = opened.created, "ticket opened");
    deliver(
        then,
        &connection,
        (created_or_ok(opened.created), Json(opened.value)),
    )
    .await
}

/// Not faulted, for the reason given at `reverse_wire`; closing a closed ticket answers 200.
async fn close_ticket(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Response {
    match shared.world(|world| world.close_ticket(&id)) {
        Some(ticket) => (StatusCode::OK, Json(ticket)).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("no ticket {id}")),
    }
}

/// The body of `POST /search`.
#[derive(Debug, Deserialize)]
struct SearchQuery {
    query: String,
    #[serde(default)]
    limit: Option<usize>,
}

async fn search(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<SearchQuery>, JsonRejection>,
) -> Response {
    let request = match body {
        Ok(Json(request)) => request,
        Err(rejection) => return rejected(rejection),
    };
    let limit = request.limit.unwrap_or(DEFAULT_SEARCH_LIMIT);
    if request.query.is_empty() || !(1..=MAX_SEARCH_LIMIT).contains(&limit) {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("query must not be empty and limit must be between 1 and {MAX_SEARCH_LIMIT}"),
        );
    }
    let results = shared.world(|world| world.search(&request.query, limit));
    (StatusCode::OK, Json(json!({"results": results}))).into_response()
}

async fn stats(State(shared): State<Arc<Shared>>) -> Json<Stats> {
    Json(shared.stats())
}

async fn faults(State(shared): State<Arc<Shared>>) -> Json<Faults> {
    Json(shared.faults())
}

async fn set_faults(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<Faults>, JsonRejection>,
) -> Response {
    let faults = match body {
        Ok(Json(faults)) => faults,
        Err(rejection) => return rejected(rejection),
    };
    match shared.set_faults(faults.clone()) {
        Ok(()) => (StatusCode::OK, Json(faults)).into_response(),
        Err(invalid) => error(StatusCode::UNPROCESSABLE_ENTITY, invalid.to_string()),
    }
}

/// Answers a committed request as `then` says.
async fn deliver(
    then: AfterCommit,
    connection: &ConnectionAbort,
    answer: impl IntoResponse,
) -> Response {
    match then {
        AfterCommit::Answer => answer.into_response(),
        AfterCommit::AnswerLate(hold) => {
            // If the client gave up meanwhile, the connection closes and this future is
            // dropped with it.
            tokio::time::sleep(hold).await;
            answer.into_response()
        }
        AfterCommit::Fail => error(StatusCode::INTERNAL_SERVER_ERROR, "internal server error"),
        AfterCommit::DropConnection => connection.drop_without_response().await,
    }
}

fn created_or_ok(created: bool) -> StatusCode {
    if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

/// The answer to an injected `error_5xx`: nothing was done.
fn refused() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "service temporarily unavailable, nothing was done; retry later",
    )
}

/// The answer to an injected `rate_limited`: 429 with `Retry-After`, nothing was done.
fn rate_limited(retry_after_secs: u64) -> Response {
    let mut response = error(
        StatusCode::TOO_MANY_REQUESTS,
        format!("rate limited, nothing was done; retry after {retry_after_secs} s"),
    );
    response.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(retry_after_secs),
    );
    response
}

fn rejected(rejection: JsonRejection) -> Response {
    error(rejection.status(), rejection.body_text())
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}
