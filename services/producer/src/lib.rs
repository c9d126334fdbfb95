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
//! Every route under `/v1` checks its caller's bearer token and role ([`auth`]); operator
//! actions (approve, reject, cancel, replay, resolve, rollback, purge) and the audit routes live
//! in [`operator`]. The OpenAPI document `schemas/openapi.yaml` describes every route.
//!
//! `GET …/effects/{key}?wait=30s` long-polls until the command settles (terminal, STUCK or
//! BLOCKED). Waiters are woken by the lifecycle events this producer reads from the bus as a
//! group of its own, with a periodic ledger re-read as the fallback.

pub mod auth;
pub mod operator;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use auth::{Authenticator, Caller, Need, Principal};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sluice_bus::{Admission, Topic};
use sluice_core::catalog::CatalogError;
use sluice_core::command::{Command, CommandStatus, Intent};
use sluice_core::ids::{CommandKey, RunId, ToolName};
use sluice_core::policy;
use sluice_core::time::Timestamp;
use sluice_ledger::{LedgerError, Reserved};
use sluice_runtime::Config;
use sluice_runtime::config::ProducerConfig;
use sluice_runtime::messages::{
    Cause, CompensateJob, CompensateRequest, DispatchRequest, encode, header,
};
use sluice_runtime::{Context, Shutdown};
use tokio::sync::broadcast;

/// The actor named in the audit chain for reservations.
pub const ACTOR: &str = "producer";

/// Shared state of the HTTP handlers.
#[derive(Debug, Clone)]
pub struct Api {
    ctx: Context,
    config: ProducerConfig,
    auth: Authenticator,
    /// `<run_id>/<command_key>` of every lifecycle event seen.
    settled: broadcast::Sender<String>,
    /// Runs an agent was found to own here, so its next submissions skip the ownership check.
    owned: Arc<Mutex<HashSet<(RunId, String)>>>,
    /// Turns per run (by the run id's stripe) for what reads a run and then writes on what it
    /// read: a replay (the run's replay budget). The next one reads after the previous one
    /// wrote.
    run_turns: Arc<[tokio::sync::Mutex<()>]>,
}

/// Stripes of [`Api::run_turns`]: runs sharing one wait for each other's turns, briefly.
const RUN_STRIPES: usize = 4_096;

/// At most this many (run, agent) pairs are remembered; past it the set starts afresh.
const MAX_OWNED: usize = 65_536;

/// One effect as an agent submits it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectRequest {
    pub run_id: String,
    pub decision: u32,
    pub tool: String,
    pub call_idx: u32,
    pub args: Value,
    #[serde(default)]
    pub delay_ms: Option<u64>,
    #[serde(default)]
    pub not_before: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    effects: Vec<Value>,
}

/// An error answer: `{"error": {"code", "message", "details"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Value,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Value::Null,
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// 422 `invalid_request`.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    pub(crate) fn body(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if !self.details.is_null() {
            error["details"] = self.details.clone();
        }
        json!({ "error": error })
    }

    /// 503: the ledger (or the bus behind a pipeline step) did not answer.
    pub(crate) fn unavailable(e: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            e.to_string(),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let unauthenticated = self.status == StatusCode::UNAUTHORIZED;
        let mut response = (self.status, Json(self.body())).into_response();
        if unauthenticated {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

/// The answer to one submission: the status code and the command.
struct Submitted {
    status: StatusCode,
    command: Command,
}

impl Api {
    /// The API of `config` (its `[producer]` and `[auth]` sections) over `ctx`.
    pub fn new(ctx: Context, config: &Config) -> Self {
        let (settled, _) = broadcast::channel(4_096);
        Self {
            ctx,
            config: config.producer.clone(),
            auth: Authenticator::from_config(&config.auth),
            settled,
            owned: Arc::default(),
            run_turns: (0..RUN_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        }
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
    /// ownership inside the reservation's own write ([`Ledger::reserve_own`]): a new run costs
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

    /// Waits for room for one more dispatch request (see [`sluice_bus::Bus::admit`]), at most
    /// `admission_wait_ms`.
    async fn admit(&self) -> Result<Admission, ApiError> {
        let wait = Duration::from_millis(self.config.admission_wait_ms);
        match tokio::time::timeout(wait, self.ctx.bus.admit(Topic::Requested)).await {
            Ok(Ok(admission)) => Ok(admission),
            Ok(Err(e)) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "bus_unavailable",
                e.to_string(),
            )),
            Err(_) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "dispatch_backlog_full",
                format!(
                    "the dispatcher has not taken on new work for {} ms (bus.admission \
                     requests wait for it); nothing was recorded, submit again later",
                    wait.as_millis()
                ),
            )),
        }
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

    /// Validates, reserves and requests dispatch of one effect.
    async fn submit(&self, principal: &Principal, raw: Value) -> Result<Submitted, ApiError> {
        sluice_faults::point!("producer.submit.pre");
        let request: EffectRequest = serde_json::from_value(raw).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!("invalid effect: {e}"),
            )
        })?;
        let invalid = |field: &str, message: String| {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
                .with_details(json!({ "pointer": format!("/{field}") }))
        };
        let run_id = RunId::parse(&request.run_id).map_err(|e| invalid("run_id", e.to_string()))?;
        if run_id.as_str() == sluice_ledger::SYSTEM_RUN {
            return Err(invalid(
                "run_id",
                format!("run id {run_id} is reserved for the ledger's own records"),
            ));
        }
        let catalog = &self.ctx.catalog;
        let tool = catalog.resolve(&request.tool).map_err(|e| match e {
            CatalogError::UnknownTool { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "unknown_tool", e.to_string())
            }
            other => invalid("tool", other.to_string()),
        })?;
        tool.validate_args(&request.args).map_err(|e| {
            let violations: Vec<Value> = e
                .violations()
                .iter()
                .map(|v| json!({"pointer": format!("/args{}", v.pointer), "message": v.message}))
                .collect();
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_arguments",
                format!("arguments of {} do not match its schema: {e}", tool.name()),
            )
            .with_details(json!({ "violations": violations }))
        })?;
        let business_key = tool
            .business_key(&request.args)
            .map_err(|e| invalid("args", e.to_string()))?;
        let now = self.ctx.clock.now();
        let not_before = match (request.delay_ms, request.not_before.as_deref()) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "not_before",
                    "give delay_ms or not_before, not both".into(),
                ));
            }
            (Some(delay), None) if delay > MAX_DELAY_MS => {
                return Err(invalid(
                    "delay_ms",
                    format!("delay_ms may be at most {MAX_DELAY_MS} (one year)"),
                ));
            }
            (Some(delay), None) => Some(
                now.plus_millis(
                    i64::try_from(delay)
                        .map_err(|_| invalid("delay_ms", "delay_ms is too large".into()))?,
                ),
            ),
            (None, Some(at)) => {
                let at = Timestamp::parse_rfc3339(at)
                    .map_err(|e| invalid("not_before", e.to_string()))?;
                if at.millis_since(now) > MAX_DELAY_MS as i64 {
                    return Err(invalid(
                        "not_before",
                        "not_before may be at most one year ahead".into(),
                    ));
                }
                Some(at)
            }
            (None, None) => None,
        };
        let rules = tool.rules();
        let command = Command::from_intent(
            Intent {
                run_id,
                command_key: CommandKey::new(
                    request.decision,
                    tool.name().clone(),
                    request.call_idx,
                ),
                semantics: tool.semantics(),
                args: request.args,
                business_key,
                policy_version: catalog.policy_version().to_owned(),
                max_attempts: rules.max_attempts,
                not_before,
            },
            now,
            rules.pending_stale_ms,
        );
        // A tool that may be called twice with one key is leased in its reservation's own
        // write: its dispatch then costs no lease write (machine::lease_at_reservation).
        let policy = policy::evaluate(tool, &command.args, None, catalog.policy_version());
        let command = command.leased_at_reservation(&rules, &policy, now);
        let command = match principal.submitter() {
            Some(name) => command.submitted_by(name),
            None => command,
        };
        let tool_label = tool.name().to_string();
        let audit = command.reservation_audit(ACTOR);
        // Room in the dispatch backlog, taken before the reservation: a burst waits here
        // instead of piling up behind the dispatcher (`bus.admission`).
        let admission = if matches!(
            command.status(),
            CommandStatus::Pending | CommandStatus::Leased
        ) {
            Some(self.admit().await?)
        } else {
            None
        };
        // An agent adds to its own runs only.
        let confined = self.must_confine(principal, &command.run_id);
        let run_id = command.run_id.clone();
        sluice_faults::point!("producer.reserve.pre");
        let reserved = if confined {
            self.ctx.ledger.reserve_own(command, audit).await
        } else {
            self.ctx.ledger.reserve(command, audit).await
        };
        sluice_faults::point!("producer.reserve.post");
        let reserved = match reserved {
            Ok(reserved) => {
                // The run now holds this agent's command, and only its own. A business key held
                // elsewhere wrote nothing here, so that run is not known to be the agent's.
                if confined && !matches!(reserved, Reserved::BusinessKeyHeld(_)) {
                    self.remember_owned(principal, &run_id);
                }
                reserved
            }
            Err(e @ LedgerError::ForeignRun { .. }) => {
                self.count(&tool_label, "forbidden");
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!(
                        "{e} (you are {} with role {})",
                        principal.name, principal.role
                    ),
                ));
            }
            Err(e @ LedgerError::ArgumentDrift { .. }) => {
                self.count(&tool_label, "drift");
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "argument_drift",
                    e.to_string(),
                ));
            }
            Err(e @ LedgerError::RunClosed { .. }) => {
                self.count(&tool_label, "run_closed");
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "run_rolled_back",
                    e.to_string(),
                ));
            }
            Err(e) => return Err(ApiError::unavailable(&e)),
        };
        match reserved {
            Reserved::Created(command) => {
                self.count(&tool_label, "created");
                if matches!(
                    command.status(),
                    CommandStatus::Pending | CommandStatus::Leased
                ) {
                    let request = DispatchRequest {
                        run_id: command.run_id.clone(),
                        command_key: command.command_key.clone(),
                        cause: Cause::Reserved,
                    };
                    sluice_faults::point!("producer.publish.pre");
                    if let Err(e) = self
                        .ctx
                        .bus
                        .publish_admitted(
                            admission.unwrap_or_else(Admission::unbounded),
                            Topic::Requested,
                            command.run_id.as_str(),
                            encode(&request),
                            vec![],
                        )
                        .await
                    {
                        // Recorded all the same: the stale-PENDING sweep republishes it, or
                        // the lease-expiry sweep reconciles one leased at reservation.
                        tracing::warn!(
                            run_id = %command.run_id,
                            command_key = %command.command_key,
                            error = %e,
                            "dispatch request not published; the sweep will"
                        );
                    }
                    sluice_faults::point!("producer.publish.post");
                }
                sluice_faults::point!("producer.submit.post");
                Ok(Submitted {
                    status: StatusCode::CREATED,
                    command,
                })
            }
            Reserved::Existing(command) | Reserved::BusinessKeyHeld(command) => {
                if principal.role == sluice_runtime::config::Role::Agent
                    && principal.authenticated
                    && command.submitted_by.as_deref() != Some(principal.name.as_str())
                {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "business_key_held",
                        format!(
                            "the business key of this effect is held by command {}/{} of another agent",
                            command.run_id, command.command_key
                        ),
                    ));
                }
                self.count(&tool_label, "replayed");
                Ok(Submitted {
                    status: StatusCode::OK,
                    command,
                })
            }
        }
    }

    fn count(&self, tool: &str, outcome: &str) {
        self.ctx
            .metrics
            .submissions
            .with_label_values(&[tool, outcome])
            .inc();
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
            post(submit_one).get(operator::list_all_effects),
        )
        .route("/v1/effects/batch", post(submit_batch))
        .route("/v1/runs", get(operator::list_runs))
        .route("/v1/runs/{run_id}/effects", get(list_effects))
        .route("/v1/runs/{run_id}/scheduled", get(list_scheduled))
        .route(
            "/v1/runs/{run_id}/effects/{*command_key}",
            get(get_effect)
                .post(operator::command_action)
                .delete(operator::remove_effect),
        )
        .route(
            "/v1/runs/{run_id}/rollback",
            post(rollback).get(operator::rollback_status),
        )
        .route("/v1/runs/{run_id}/audit", get(operator::audit_read))
        .route(
            "/v1/runs/{run_id}/audit/verify",
            get(operator::audit_verify),
        )
        .route("/v1/audit/purge", post(operator::purge))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(api)
}

pub(crate) fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("request body is not valid JSON: {e}"),
        )
    })
}

/// Parses a request body into `T`, naming the expected shape when it does not match.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    shape: &str,
) -> Result<T, ApiError> {
    serde_json::from_value(parse_json(body)?)
        .map_err(|e| ApiError::invalid(format!("expected {shape}: {e}")))
}

pub(crate) fn parse_run(raw: &str) -> Result<RunId, ApiError> {
    RunId::parse(raw).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A query string parsed into `T`, refused as a 422 JSON error (axum's own rejection is plain
/// text) naming what was wrong.
#[derive(Debug)]
pub(crate) struct Q<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Q<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| Q(value))
            .map_err(|e| ApiError::invalid(format!("invalid query string: {}", e.body_text())))
    }
}

/// A request body as bytes; over the size limit it is a 413 JSON error (axum's own rejection
/// is plain text).
#[derive(Debug)]
pub(crate) struct RawBody(pub Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Bytes::from_request(request, state)
            .await
            .map(RawBody)
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body_too_large",
                        "the request body is over the size limit (producer.max_body_bytes)",
                    )
                } else {
                    ApiError::new(e.status(), "unreadable_body", e.body_text())
                }
            })
    }
}

/// Answers a route that does not exist, or a method a route does not have, as JSON.
async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!(
            "no route {method} {}; the API is described in schemas/openapi.yaml",
            uri.path().chars().take(200).collect::<String>()
        ),
    )
}

async fn no_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}; the API is described in schemas/openapi.yaml",
            uri.path().chars().take(200).collect::<String>()
        ),
    )
}

/// The longest `delay_ms` (and how far ahead `not_before` may be): one year.
pub const MAX_DELAY_MS: u64 = 365 * 24 * 60 * 60 * 1_000;

/// Who the caller is, as the server sees it.
async fn whoami(Caller(principal): Caller) -> Response {
    Json(json!({
        "name": principal.name,
        "role": principal.role,
        "authenticated": principal.authenticated,
    }))
    .into_response()
}

/// Whether the client asked for `Prefer: return=minimal` (RFC 7240): then a submission is
/// answered with the command's keys and status instead of the whole command. Preferences this
/// service does not know are ignored, as the RFC asks.
fn wants_minimal(headers: &HeaderMap) -> bool {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|preference| {
            let preference = preference.split(';').next()?.trim();
            let (name, value) = preference.split_once('=')?;
            Some((name.trim(), value.trim().trim_matches('"')))
        })
        .any(|(name, value)| {
            name.eq_ignore_ascii_case("return") && value.eq_ignore_ascii_case("minimal")
        })
}

const PREFER: &str = "prefer";
const PREFERENCE_APPLIED: &str = "preference-applied";

/// A submitted command as `Prefer: return=minimal` answers it.
#[derive(Serialize)]
struct MinimalCommand<'a> {
    run_id: &'a RunId,
    command_key: &'a CommandKey,
    command_status: CommandStatus,
}

impl<'a> MinimalCommand<'a> {
    fn of(command: &'a Command) -> Self {
        Self {
            run_id: &command.run_id,
            command_key: &command.command_key,
            command_status: command.status(),
        }
    }
}

/// Marks an answer shaped by `Prefer: return=minimal`.
fn applied_minimal(mut response: Response) -> Response {
    response.headers_mut().insert(
        PREFERENCE_APPLIED,
        axum::http::HeaderValue::from_static("return=minimal"),
    );
    response
}

async fn submit_one(
    State(api): State<Api>,
    Caller(principal): Caller,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    let answer = match principal
        .require(Need::Submit)
        .and_then(|()| parse_json(&body))
    {
        Ok(raw) => match api.submit(&principal, raw).await {
            Ok(submitted) if wants_minimal(&headers) => applied_minimal(
                (
                    submitted.status,
                    Json(MinimalCommand::of(&submitted.command)),
                )
                    .into_response(),
            ),
            Ok(submitted) => (submitted.status, Json(&submitted.command)).into_response(),
            Err(e) => e.into_response(),
        },
        Err(e) => e.into_response(),
    };
    api.ctx
        .metrics
        .http_requests
        .with_label_values(&["submit", answer.status().as_str()])
        .inc();
    answer
}

async fn submit_batch(
    State(api): State<Api>,
    Caller(principal): Caller,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    principal.require(Need::Submit)?;
    let minimal = wants_minimal(&headers);
    let batch: BatchRequest = serde_json::from_value(parse_json(&body)?).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
            format!("a batch is {{\"effects\": [...]}}: {e}"),
        )
    })?;
    if batch.effects.len() > api.config.max_batch {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "batch_too_large",
            format!(
                "{} effects in one batch; the limit is {}",
                batch.effects.len(),
                api.config.max_batch
            ),
        ));
    }
    // Runs are submitted concurrently, so the ledger commits them in a few groups; one run's
    // effects go one after another, in batch order. Its effects all write the run's audit
    // head, so concurrent writes would only contend for it (on the CQL ledger each lost race
    // is another LWT, and a large batch of one run could exhaust the retries), and the run's
    // dispatch requests are published in the order the agent gave.
    let mut runs: Vec<Vec<(usize, Value)>> = Vec::new();
    let mut run_of: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (index, raw) in batch.effects.into_iter().enumerate() {
        match raw.get("run_id").and_then(Value::as_str) {
            Some(run) => {
                let group = *run_of.entry(run.to_owned()).or_insert_with(|| {
                    runs.push(Vec::new());
                    runs.len() - 1
                });
                runs[group].push((index, raw));
            }
            // Malformed: answered on its own with the reason.
            None => runs.push(vec![(index, raw)]),
        }
    }
    let total = runs.iter().map(Vec::len).sum();
    let answered = futures::future::join_all(runs.into_iter().map(|effects| {
        let api = api.clone();
        let principal = principal.clone();
        async move {
            let mut answers = Vec::with_capacity(effects.len());
            for (index, raw) in effects {
                // Each answer is encoded as soon as it is known: a batch's answers wait for its
                // slowest run, and an encoded command is a third of the memory of a `Value`
                // tree of it, made without building that tree first.
                let answer = match api.submit(&principal, raw).await {
                    Ok(submitted) if minimal => encode_answer(&MinimalAnswer {
                        status: submitted.status.as_u16(),
                        command: MinimalCommand::of(&submitted.command),
                    }),
                    Ok(submitted) => encode_answer(&BatchAnswer {
                        status: submitted.status.as_u16(),
                        command: &submitted.command,
                    }),
                    Err(e) => {
                        let mut body = e.body();
                        body["status"] = json!(e.status.as_u16());
                        encode_answer(&body)
                    }
                };
                answers.push((index, answer));
            }
            answers
        }
    }))
    .await;
    let mut results: Vec<Option<Box<RawValue>>> = vec![None; total];
    for (index, answer) in answered.into_iter().flatten() {
        results[index] = Some(answer);
    }
    api.ctx
        .metrics
        .http_requests
        .with_label_values(&["submit_batch", "200"])
        .inc();
    // Serialized as it is: through `json!` the encoded answers would be parsed back into trees.
    let response = Json(BatchResults { results }).into_response();
    Ok(if minimal {
        applied_minimal(response)
    } else {
        response
    })
}

/// The answer to a batch: one entry per effect, in the order submitted.
#[derive(Serialize)]
struct BatchResults {
    results: Vec<Option<Box<RawValue>>>,
}

/// One effect's answer in a batch: its status code and the command.
#[derive(Serialize)]
struct BatchAnswer<'a> {
    status: u16,
    command: &'a Command,
}

/// One effect's answer in a batch under `Prefer: return=minimal`.
#[derive(Serialize)]
struct MinimalAnswer<'a> {
    status: u16,
    command: MinimalCommand<'a>,
}

/// `answer` as JSON text.
fn encode_answer(answer: &impl Serialize) -> Box<RawValue> {
    // A command and an error body serialize to JSON objects with string keys; that cannot fail.
    serde_json::value::to_raw_value(answer).expect("an answer serializes to JSON")
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
    let effects: Vec<Command> = api
        .run_for(&principal, &run_id)
        .await?
        .into_iter()
        .filter(|c| status.is_none_or(|s| c.status() == s))
        .filter(|c| tool.as_ref().is_none_or(|t| &c.tool == t))
        .collect();
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
    let mut effects: Vec<Command> = api
        .run_for(&principal, &run_id)
        .await?
        .into_iter()
        .filter(|c| c.status() == CommandStatus::Scheduled)
        .filter(|c| tool.as_ref().is_none_or(|t| &c.tool == t))
        .collect();
    effects.sort_by_key(|c| c.state.due_at);
    Ok(Json(json!({ "run_id": run_id, "effects": effects })).into_response())
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
    principal.require(Need::Admin)?;
    let run_id = parse_run(&run_id)?;
    let request: RollbackRequest = parse_body(&body, "{\"reason\": \"...\"}")?;
    let reason = operator::check_reason(&request.reason)?;
    // The actor is the token's name; only an open (tokenless) API takes it from the body.
    let actor = match (principal.authenticated, request.actor) {
        (true, Some(_)) => {
            return Err(ApiError::invalid(
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
    let begun = api
        .ctx
        .begin_rollback(&run_id, &actor, reason)
        .await
        .map_err(ApiError::unavailable)?;
    sluice_faults::point!("producer.rollback.post");
    let job = CompensateRequest {
        run_id: run_id.clone(),
        job: CompensateJob::Rollback {
            actor,
            reason: reason.to_owned(),
        },
    };
    if let Err(e) = api
        .ctx
        .bus
        .publish(Topic::Compensate, run_id.as_str(), encode(&job), vec![])
        .await
    {
        // Begun all the same: the sweep compensates each COMPENSATING command when due.
        tracing::warn!(run_id = %run_id, error = %e, "rollback job not published; the sweep will finish it");
    }
    let effects = api.commands_of(&run_id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "run_id": run_id,
            "rollback": begun,
            "progress": operator::rollback_progress(&effects),
            "effects": effects,
        })),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GetQuery {
    wait: Option<String>,
}

/// Parses `30s`, `500ms`, `2m` or a plain number of milliseconds.
pub fn parse_wait(raw: &str) -> Option<Duration> {
    let raw = raw.trim();
    let (number, unit) = match raw.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => raw.split_at(at),
        None => (raw, "ms"),
    };
    let value: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(value)),
        "s" => Some(Duration::from_secs(value)),
        "m" => Some(Duration::from_secs(value.checked_mul(60)?)),
        _ => None,
    }
}

async fn get_effect(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path((run_id, command_key)): Path<(String, String)>,
    Q(query): Q<GetQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let bad = |e: String| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", e);
    let run_id = RunId::parse(&run_id).map_err(|e| bad(e.to_string()))?;
    let command_key = CommandKey::parse(&command_key).map_err(|e| bad(e.to_string()))?;
    let wait = match query.wait.as_deref() {
        None => Duration::ZERO,
        Some(raw) => parse_wait(raw)
            .ok_or_else(|| {
                bad(format!(
                    "wait {raw:?} is not a duration such as 30s or 500ms"
                ))
            })?
            .min(Duration::from_millis(api.config.max_wait_ms)),
    };
    let subject = format!("{run_id}/{command_key}");
    let mut woken = api.settled.subscribe();
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let command = api
            .ctx
            .ledger
            .get(&run_id, &command_key)
            .await
            .map_err(|e| ApiError::unavailable(&e))?
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_command",
                    format!("no command {subject}"),
                )
            })?;
        principal.require_owner(&run_id, std::slice::from_ref(&command))?;
        if command.status().is_settled() || tokio::time::Instant::now() >= deadline {
            return Ok(Json(command).into_response());
        }
        // Woken by this command's lifecycle event, or re-read every second regardless.
        let _ = tokio::time::timeout_at(
            deadline.min(tokio::time::Instant::now() + Duration::from_secs(1)),
            async {
                loop {
                    match woken.recv().await {
                        Ok(seen) if seen == subject => return,
                        Ok(_) => {}
                        Err(broadcast::error::RecvError::Lagged(_)) => return,
                        Err(broadcast::error::RecvError::Closed) => {
                            std::future::pending::<()>().await;
                        }
                    }
                }
            },
        )
        .await;
    }
}

async fn ready(State(api): State<Api>) -> Response {
    match api
        .ctx
        .ledger
        .list_runs(Timestamp::from_millis(i64::MAX), 1)
        .await
    {
        Ok(_) => (StatusCode::OK, "ready").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

async fn metrics(State(api): State<Api>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        api.ctx.metrics.render(),
    )
        .into_response()
}

/// Reads the lifecycle events as a group of this producer's own, waking long-poll waiters.
async fn watch_events(api: Api, shutdown: Shutdown) {
    let group = format!("sluice-producer-{}", uuid::Uuid::new_v4().simple());
    let mut subscription = match api.ctx.bus.subscribe(Topic::Events, &group, &group).await {
        Ok(subscription) => subscription,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch lifecycle events; long polls re-read the ledger");
            return;
        }
    };
    loop {
        let delivery = tokio::select! {
            () = shutdown.cancelled() => return,
            delivery = subscription.next() => match delivery {
                Some(delivery) => delivery,
                None => return,
            },
        };
        // Only long polls listen; with none waiting there is nothing to wake.
        if api.settled.receiver_count() > 0
            && let Some(subject) = header(&delivery.message.headers, "ce_subject")
        {
            let _ = api.settled.send(subject.to_owned());
        }
        let _ = delivery.ack().await;
    }
}

/// Serves the API on `listener` until `shutdown`.
pub async fn serve(
    ctx: Context,
    config: &Config,
    listener: tokio::net::TcpListener,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let api = Api::new(ctx, config);
    if api.auth.is_open() {
        tracing::warn!(
            "no [auth] tokens configured: the API is open to anyone who can reach this loopback address"
        );
    }
    let watcher = tokio::spawn(watch_events(api.clone(), shutdown.clone()));
    let stop = shutdown.clone();
    let served = axum::serve(listener, router(api))
        .with_graceful_shutdown(async move { stop.cancelled().await })
        .await;
    shutdown.cancel();
    let _ = watcher.await;
    served
}

/// Binds `config.producer.listen` and serves until `shutdown`.
pub async fn run(ctx: Context, config: &Config, shutdown: Shutdown) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.producer.listen).await?;
    tracing::info!(listen = %local(&listener), "producer listening");
    serve(ctx, config, listener, shutdown).await
}

fn local(listener: &tokio::net::TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "?".into(), |a: SocketAddr| a.to_string())
}

/// The JSON shape of an answer, for clients.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchResult {
    pub status: u16,
    #[serde(default)]
    pub command: Option<Command>,
    #[serde(default)]
    pub error: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_in_common_units() {
        assert_eq!(parse_wait("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_wait("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_wait("250"), Some(Duration::from_millis(250)));
        assert_eq!(parse_wait("soon"), None);
        assert_eq!(parse_wait("5h"), None);
    }
}
