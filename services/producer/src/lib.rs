//! The producer: Sluice's HTTP front door. It validates a submission against the tool catalog,
//! derives the command's keys from its journal position, records the command in the ledger
//! *before* anything runs, and then asks for dispatch.
//!
//! Answers: 201 a new command; 200 the same key with the same arguments (or the same business
//! key) — the stored command, nothing new; 409 the same key with other arguments; 404 an
//! unknown tool; 422 invalid arguments or ids (naming the JSON pointer); 413 over the size
//! limit; 400 malformed JSON.
//!
//! Nothing accepted is lost: a command is answered 201 only once it is durable in the ledger.
//! If publishing the dispatch request fails afterwards, the command still is PENDING with a due
//! time, and the reconciler's sweep republishes it.
//!
//! Every request first passes [`guard`]: a request for a name that is not this server's, or a
//! browser's request from another origin or site, is refused (`sluice_core::browser`), a body
//! must be JSON, and the answer's time is observed. Every route under `/v1` checks its
//! caller's bearer token and role ([`auth`]); operator
//! actions (approve, reject, cancel, replay, resolve, rollback, purge) and the audit routes live
//! in [`operator`]. The OpenAPI document `schemas/openapi.yaml` describes every route.
//!
//! Submissions and their `Prefer` answers are in [`submit`]; `GET …/effects/{key}?wait=30s`
//! and `Prefer: wait=` hold the answer until the command settles ([`wait`]); the plumbing every
//! route shares is in [`http`]; every request's W3C trace context is read in [`trace`]. With
//! `[producer.tls]` the API is served over HTTPS, its certificate reloaded when the files
//! change ([`tls`]).

mod admission;
pub mod audit;
pub mod auth;
pub mod budgets;
pub mod callbacks;
mod edit;
pub mod events;
pub mod evidence;
pub mod flow;
mod guard;
pub mod http;
pub mod links;
pub mod listing;
pub mod operator;
pub mod overview;
mod quota;
pub mod submit;
pub mod tls;
pub mod tools;
pub mod trace;
pub mod ui;
pub mod wait;

pub use http::ApiError;
pub(crate) use http::{Q, RawBody, parse_body, parse_run};
pub use submit::{BatchResult, EXISTING_HEADER, EffectRequest, Existing};
pub use wait::parse_wait;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::BoxFuture;

use auth::{Authenticator, Caller, Need, Principal};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{RunId, ToolName};
use sluice_core::time::Timestamp;
use sluice_runtime::Config;
use sluice_runtime::config::ProducerConfig;
use sluice_runtime::{Context, Shutdown};
use tracing::Instrument;

/// The actor named in the audit chain for reservations.
pub const ACTOR: &str = "producer";

/// Shared state of the HTTP handlers. Cloned for every request (axum's `State`, the guard),
/// so every field is an `Arc` or a handle of a few: a configuration cloned field by field
/// (origins, TLS paths, every token's principal) cost ~7k instructions per request.
#[derive(Debug, Clone)]
pub struct Api {
    ctx: Context,
    config: Arc<ProducerConfig>,
    auth: Arc<Authenticator>,
    /// The names the API answers to and the origins whose pages may call it, besides its own.
    browser: Arc<sluice_core::browser::Allowed>,
    /// The commands long polls and `Prefer: wait` submissions wait for.
    waiters: Arc<wait::Waiters>,
    /// Runs an agent was found to own here, so its next submissions skip the ownership check.
    owned: Arc<Mutex<HashSet<(RunId, String)>>>,
    /// Turns per run (by the run id's stripe) for what reads a run and then writes on what it
    /// read: a replay (the run's replay budget). The next one reads after the previous one
    /// wrote.
    run_turns: Arc<[tokio::sync::Mutex<()>]>,
    /// The dispatchers' queue as last read from the bus, for admission.
    dispatch_queue: Arc<admission::DispatchQueue>,
    /// Each tenant's turn at the bus's admission (fair between tenants).
    tenant_turns: Arc<admission::TenantTurns>,
    /// The last hour of this process's counters, minute by minute (`GET /v1/overview`).
    pulse: Arc<overview::Pulse>,
    /// Tenants' quotas of effects in flight, and the admissions under way (`[tenants]`).
    quotas: Arc<quota::Quotas>,
    /// Approval links' key and address; `None` without `[approval_links] secret`.
    links: Option<Arc<links::Links>>,
    /// The key that verifies asynchronous tools' callback tokens; `None` without
    /// `[callbacks] secret`.
    callback_key: Option<Arc<sluice_core::Secret>>,
}

/// Stripes of [`Api::run_turns`]: runs sharing one wait for each other's turns, briefly.
const RUN_STRIPES: usize = 4_096;

/// At most this many (run, agent) pairs are remembered; past it the set starts afresh.
const MAX_OWNED: usize = 65_536;

impl Api {
    /// The API of `config` (its `[producer]` and `[auth]` sections) over `ctx`; refused when
    /// an entry of `producer.allowed_hosts` or `allowed_origins` is not valid (naming it).
    pub fn new(ctx: Context, config: &Config) -> Result<Self, sluice_core::browser::EntryError> {
        let pulse = overview::Pulse::starting(ctx.clock.now(), overview::totals(&ctx.metrics));
        Ok(Self {
            browser: Arc::new(config.producer.browser_rules()?),
            pulse: Arc::new(pulse),
            ctx,
            config: Arc::new(config.producer.clone()),
            auth: Arc::new(Authenticator::from_config(&config.auth)),
            waiters: Arc::default(),
            owned: Arc::default(),
            dispatch_queue: Arc::default(),
            tenant_turns: Arc::default(),
            quotas: Arc::new(quota::Quotas::new(config.tenants.clone())),
            links: links::Links::from_config(&config.approval_links),
            callback_key: callbacks::key_of(config),
            run_turns: (0..RUN_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        })
    }

    /// Waits for `run_id`'s turn (see [`Api::run_turns`]).
    pub(crate) async fn run_turn(&self, run_id: &RunId) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        let hash = BuildHasherDefault::<DefaultHasher>::default().hash_one(run_id.as_str());
        let stripe = usize::try_from(hash % RUN_STRIPES as u64).unwrap_or(0);
        self.run_turns[stripe].lock().await
    }

    /// Whether `principal` must be confined to its own runs for this reservation: an
    /// authenticated agent, in a run it was not yet found to own here. The ledger then checks
    /// ownership inside the reservation's own write ([`CommandStore::reserve_own`]): a new run costs
    /// no read, and two agents opening one run at once cannot both get in, whichever
    /// producers they reach.
    fn must_confine(&self, principal: &Principal, run_id: &RunId) -> bool {
        let Some(name) = principal.submitter() else {
            return false;
        };
        if principal.role != sluice_runtime::config::Role::Agent {
            return false;
        }
        !self
            .owned
            .lock()
            .is_ok_and(|owned| owned.contains(&(run_id.clone(), name.to_owned())))
    }

    /// Remembers that `principal` owns `run_id`: runs do not change hands, so its later
    /// submissions (a batch of hundreds into one run) are not checked again.
    fn remember_owned(&self, principal: &Principal, run_id: &RunId) {
        let Some(name) = principal.submitter() else {
            return;
        };
        if let Ok(mut owned) = self.owned.lock() {
            if owned.len() >= MAX_OWNED {
                owned.clear();
            }
            owned.insert((run_id.clone(), name.to_owned()));
        }
    }

    /// A run's commands in journal order; a ledger failure is a 503.
    pub(crate) async fn commands_of(&self, run_id: &RunId) -> Result<Vec<Command>, ApiError> {
        self.ctx
            .ledger
            .list_run(run_id, None)
            .await
            .map_err(|e| ApiError::unavailable(&e))
    }

    /// Reads a run's commands, checking that `principal` may see them; `None` filters nothing.
    pub(crate) async fn run_for(
        &self,
        principal: &Principal,
        run_id: &RunId,
    ) -> Result<Vec<Command>, ApiError> {
        let commands = self.commands_of(run_id).await?;
        principal.require_owner(run_id, &commands)?;
        Ok(commands)
    }
}

/// The routes of the producer. Command keys hold `/`, so a key is the rest of the path and an
/// action on a command is a custom method after a colon (`…/effects/{key}:approve`).
pub fn router(api: Api) -> Router {
    let limit = api.config.max_body_bytes;
    Router::new()
        .route("/v1/whoami", get(whoami))
        .route(
            "/v1/effects",
            post(submit::submit_one).get(listing::list_all_effects),
        )
        .route("/v1/effects/batch", post(submit::submit_batch))
        .route("/v1/tools", get(tools::list))
        .route("/v1/tools/{*name}", get(tools::one))
        .route("/v1/runs", get(listing::list_runs))
        .route("/v1/runs/{run_id}/effects", get(list_effects))
        .route("/v1/runs/{run_id}/scheduled", get(list_scheduled))
        .route(
            "/v1/runs/{run_id}/effects/{*command_key}",
            get(wait::get_effect)
                .post(operator::command_action)
                .delete(operator::remove_effect),
        )
        .route(
            "/v1/runs/{run_id}/rollback",
            post(rollback).get(operator::rollback_status),
        )
        .route("/v1/runs/{run_id}/audit", get(audit::audit_read))
        .route("/v1/runs/{run_id}/audit/verify", get(audit::audit_verify))
        .route("/v1/audit/purge", post(audit::purge))
        .route("/v1/events/stream", get(events::stream))
        .route("/v1/overview", get(overview::overview))
        .route("/v1/flow", get(flow::list))
        .route("/v1/budgets", get(budgets::list))
        .route("/v1/evidence", get(evidence::list))
        .route("/v1/evidence/{source}", post(evidence::receive))
        .route("/v1/callbacks/{token}", post(callbacks::receive))
        .route("/v1/flow/{*action}", post(flow::act))
        .merge(ui::routes(api.config.console_enabled(false)))
        .route("/approve/{token}", get(links::page).post(links::decide))
        .route("/approve/assets/{name}", get(links::asset))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .fallback(http::no_route)
        .method_not_allowed_fallback(http::no_method)
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            guard::guard,
        ))
        .layer(axum::middleware::from_fn(trace::request))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(api)
}

/// The longest `delay_ms` (and how far ahead `not_before` may be): one year.
pub const MAX_DELAY_MS: u64 = 365 * 24 * 60 * 60 * 1_000;

/// Who the caller is, as the server sees it.
async fn whoami(Caller(principal): Caller) -> Response {
    Json(json!({
        "name": principal.name,
        "role": principal.role,
        "authenticated": principal.authenticated,
        "tenants": principal.tenants,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    status: Option<String>,
    tool: Option<String>,
}

/// A `?tool=` filter: a qualified `namespace/name`, or a bare name in the default namespace.
pub(crate) fn parse_tool_filter(
    api: &Api,
    raw: Option<&str>,
) -> Result<Option<ToolName>, ApiError> {
    raw.map(|raw| {
        ToolName::resolve(raw, api.ctx.catalog.default_namespace())
            .map_err(|e| ApiError::invalid(format!("tool {raw:?}: {e}")))
    })
    .transpose()
}

pub(crate) fn parse_status_filter(raw: Option<&str>) -> Result<Option<CommandStatus>, ApiError> {
    raw.map(str::parse::<CommandStatus>)
        .transpose()
        .map_err(|e| ApiError::invalid(e.to_string()))
}

async fn list_effects(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(run_id): Path<String>,
    Q(query): Q<ListQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let run_id = parse_run(&run_id)?;
    let status = parse_status_filter(query.status.as_deref())?;
    let tool = parse_tool_filter(&api, query.tool.as_deref())?;
    let effects = filtered(
        api.run_for(&principal, &run_id).await?,
        status,
        tool.as_ref(),
    );
    Ok(Json(json!({ "run_id": run_id, "effects": effects })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScheduledQuery {
    tool: Option<String>,
}

/// The run's SCHEDULED effects (arguments as stored), earliest first; `?tool=` narrows them to
/// one tool.
async fn list_scheduled(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(run_id): Path<String>,
    Q(query): Q<ScheduledQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let run_id = parse_run(&run_id)?;
    let tool = parse_tool_filter(&api, query.tool.as_deref())?;
    // The listing `?status=SCHEDULED` gives, earliest first.
    let mut effects = filtered(
        api.run_for(&principal, &run_id).await?,
        Some(CommandStatus::Scheduled),
        tool.as_ref(),
    );
    effects.sort_by_key(|c| c.state.due_at);
    Ok(Json(json!({ "run_id": run_id, "effects": effects })).into_response())
}

/// A run's commands as a listing's filters (`?status=`, `?tool=`) narrow them.
fn filtered(
    commands: Vec<Command>,
    status: Option<CommandStatus>,
    tool: Option<&ToolName>,
) -> Vec<Command> {
    commands
        .into_iter()
        .filter(|c| status.is_none_or(|s| c.status() == s))
        .filter(|c| tool.is_none_or(|t| &c.tool == t))
        .collect()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RollbackRequest {
    reason: String,
    #[serde(default)]
    actor: Option<String>,
}

/// Asks the compensator to roll the run back; answers 202 with the run's commands as they are.
async fn rollback(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(run_id): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    principal.require(Need::Rollback)?;
    let run_id = parse_run(&run_id)?;
    let request: RollbackRequest = parse_body(&body, "{\"reason\": \"...\"}")?;
    let reason = operator::check_reason(&request.reason)?;
    // The actor is the token's name; only an open (tokenless) API takes it from the body.
    let actor = match (principal.authenticated, request.actor) {
        // Acting under another name is not the caller's to do (403, not a malformed body).
        (true, Some(_)) => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "actor is taken from the bearer token; leave it out",
            ));
        }
        (true, None) => principal.name.clone(),
        (false, actor) => {
            let actor = actor.unwrap_or_else(|| "api".into());
            operator::check_text("actor", &actor, 64)?;
            actor
        }
    };
    let known = api.commands_of(&run_id).await?;
    // An agent undoes only its own runs (a run failed, its side effects go); an admin any.
    principal.require_no_foreign(&run_id, &known)?;
    if known.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_run",
            format!("run {run_id} has no commands"),
        ));
    }
    // Durable before the answer: every command to undo is COMPENSATING in the ledger (the
    // sweep finishes the work if the compensator never gets the job below).
    sluice_faults::point!("producer.rollback.pre");
    // The operator action's span; each command's write in it joins that command's trace.
    let span = tracing::debug_span!(
        "operator",
        otel.name = "operator.rollback",
        run_id = %run_id,
        actor = actor.as_str(),
        outcome = tracing::field::Empty,
    );
    let begun = api
        .ctx
        .begin_rollback(&run_id, &actor, reason)
        .instrument(span.clone())
        .await
        .map_err(ApiError::unavailable)?;
    let Some(job) = begun.job.clone() else {
        // Rolled back before, and nothing left to take: nothing was written, nothing is sent.
        span.record("outcome", "already");
        return already_rolled_back(&api, &run_id, begun).await;
    };
    span.record("outcome", "begun");
    sluice_faults::point!("producer.rollback.post");
    if let Err(e) = api.ctx.carry_out_run(&run_id, &job).instrument(span).await {
        // Begun all the same: the sweep compensates each COMPENSATING command when due.
        tracing::warn!(run_id = %run_id, error = %e, "rollback job not published; the sweep will finish it");
    }
    let effects = api.commands_of(&run_id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "run_id": run_id,
            "already_rolled_back": begun.already,
            "rollback": begun,
            "progress": operator::rollback_progress(&effects),
            "effects": effects,
        })),
    )
        .into_response())
}

/// The answer to a rollback of a run rolled back before (200, not 202: nothing was begun):
/// the first rollback's record (when, who, why) and where the run stands.
async fn already_rolled_back(
    api: &Api,
    run_id: &RunId,
    begun: sluice_runtime::pipeline::RollbackBegun,
) -> Result<Response, ApiError> {
    let trail = api
        .ctx
        .ledger
        .audit_read(run_id)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let first = trail.entries.iter().find_map(|entry| {
        let record = &entry.record;
        let reason = record
            .reason
            .strip_prefix(sluice_runtime::pipeline::ROLLBACK_RECORD)?;
        record
            .command_key
            .is_none()
            .then(|| json!({"at": record.at, "actor": record.actor, "reason": reason}))
    });
    let message = match &first {
        Some(first) => format!(
            "run {run_id} is already rolled back (at {}, by {}: {}); nothing was written",
            first["at"].as_str().unwrap_or_default(),
            first["actor"].as_str().unwrap_or_default(),
            first["reason"].as_str().unwrap_or_default()
        ),
        None => format!("run {run_id} is already rolled back; nothing was written"),
    };
    let effects = api.commands_of(run_id).await?;
    Ok(Json(json!({
        "run_id": run_id,
        "already_rolled_back": true,
        "message": message,
        "rolled_back": first,
        "rollback": begun,
        "progress": operator::rollback_progress(&effects),
        "effects": effects,
    }))
    .into_response())
}

async fn ready(State(api): State<Api>) -> Response {
    match api
        .ctx
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

async fn metrics(State(api): State<Api>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        api.ctx.metrics.render(),
    )
        .into_response()
}

/// Serves the API on `listener` until `shutdown`.
pub fn serve(
    ctx: Context,
    config: &Config,
    listener: tokio::net::TcpListener,
    shutdown: Shutdown,
) -> BoxFuture<'_, std::io::Result<()>> {
    Box::pin(serve_body(ctx, config, listener, shutdown))
}

async fn serve_body(
    ctx: Context,
    config: &Config,
    listener: tokio::net::TcpListener,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    // No tokens and no explicit `producer.open`: refused, never served open by omission (and
    // the services beside it in one process stop too).
    if let Err(refused) = config.producer.check_serving(&config.auth) {
        shutdown.cancel();
        return Err(std::io::Error::other(refused));
    }
    let api = match Api::new(ctx, config) {
        Ok(api) => api,
        Err(e) => {
            shutdown.cancel();
            return Err(std::io::Error::other(format!("configuration key {e}")));
        }
    };
    if let Err(refused) = callbacks::check_reachable(&api, config) {
        shutdown.cancel();
        return Err(std::io::Error::other(refused));
    }
    // The commands this process's own pipeline settles come to the waiters whole (in one
    // process with the dispatcher: no ledger read to answer a wait).
    let waiters = Arc::clone(&api.waiters);
    api.ctx
        .local_events
        .deliver_to(Arc::new(move |command| waiters.settled(command)));
    if api.auth.is_open() {
        tracing::warn!(
            "producer.open: the API has no tokens and is open to anyone who can reach this \
             loopback address"
        );
    }
    let tls = match &config.producer.tls {
        Some(tls) => match tls::TlsListener::start(listener, tls, shutdown.clone()) {
            Ok(tls) => Either::Tls(tls),
            Err(e) => {
                shutdown.cancel();
                return Err(std::io::Error::other(format!(
                    "producer.tls: the certificate cannot be used: {e}"
                )));
            }
        },
        None => Either::Plain(listener),
    };
    let watcher = tokio::spawn(wait::watch_events(api.clone(), shutdown.clone()));
    let queue_reader = tokio::spawn(admission::watch_dispatch_queue(
        api.clone(),
        shutdown.clone(),
    ));
    let sampler = tokio::spawn(overview::sample_every_minute(api.clone(), shutdown.clone()));
    let stop = shutdown.clone();
    let graceful = async move { stop.cancelled().await };
    let served = match tls {
        Either::Plain(listener) => {
            axum::serve(listener, router(api))
                .with_graceful_shutdown(graceful)
                .await
        }
        Either::Tls(listener) => {
            axum::serve(listener, router(api))
                .with_graceful_shutdown(graceful)
                .await
        }
    };
    shutdown.cancel();
    let _ = watcher.await;
    let _ = queue_reader.await;
    let _ = sampler.await;
    served
}

/// The listener the API is served on.
enum Either {
    Plain(tokio::net::TcpListener),
    Tls(tls::TlsListener),
}

/// Binds `config.producer.listen` and serves until `shutdown`.
pub fn run(
    ctx: Context,
    config: &Config,
    shutdown: Shutdown,
) -> BoxFuture<'_, std::io::Result<()>> {
    Box::pin(run_body(ctx, config, shutdown))
}

async fn run_body(ctx: Context, config: &Config, shutdown: Shutdown) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.producer.listen).await?;
    let scheme = if config.producer.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(listen = %local(&listener), scheme, "producer listening");
    serve(ctx, config, listener, shutdown).await
}

fn local(listener: &tokio::net::TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".into(), |a: SocketAddr| a.to_string())
}
