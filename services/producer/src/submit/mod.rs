//! Submissions: `POST /v1/effects` and `POST /v1/effects/batch`, and the preferences a client
//! may state for their answers (RFC 7240 `Prefer`):
//!
//! - `return=minimal`: the command's keys and status instead of the whole command;
//! - `wait=<seconds>`: the answer is held until the command is terminal (201 or 200, as without
//!   the wait) or the wait passes (202 with the command as it is and a `Location` to poll).
//!   BLOCKED and STUCK answer at once, since they wait for a person, and so does a SCHEDULED
//!   command not due before the wait ends. The wait is capped at `producer.max_wait_ms`.
//!
//! Preferences this service does not know are ignored, as the RFC asks; a `wait` that is not
//! a number of seconds is refused (422), since ignoring it would silently answer at once.
//!
//! An answer with a command that was recorded before says how it was found ([`Existing`]):
//! `existing` in the body and `Sluice-Existing` on a single submission's answer. A business key
//! is found across runs, so the command may be another run's; without the field an agent that
//! asked for a wire in its run would be told of another run's wire as if it were its own.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sluice_bus::Admission;
use sluice_core::catalog::CatalogError;
use sluice_core::command::{Command, Intent};
use sluice_core::ids::{CommandKey, RunId, ToolName};
use sluice_core::machine::{self, Schedule};
use sluice_core::policy;
use sluice_core::time::Timestamp;
use sluice_ledger::{LedgerError, Reserved};
use sluice_runtime::messages::Cause;
use tokio::time::Instant;
use tracing::Instrument;

use crate::auth::{Caller, Need, Principal};
use crate::http::{ApiError, RawBody, parse_json};
use crate::wait::{Watch, subject, until_settled};
use crate::{ACTOR, Api, MAX_DELAY_MS};

mod batch;
mod prefer;

pub use batch::BatchResult;
pub(crate) use batch::submit_batch;
pub(crate) use prefer::Preferences;
use prefer::*;

/// One effect as an agent submits it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectRequest {
    pub run_id: String,
    #[serde(deserialize_with = "crate::http::whole_number")]
    pub decision: u32,
    pub tool: String,
    #[serde(deserialize_with = "crate::http::whole_number")]
    pub call_idx: u32,
    pub args: Value,
    #[serde(default, deserialize_with = "crate::http::optional_whole_number")]
    pub delay_ms: Option<u64>,
    #[serde(default)]
    pub not_before: Option<String>,
    /// The tenant to record the effect under: the caller itself unless given, and only a
    /// tenant its token may name (`auth.tokens[].tenants`).
    #[serde(default)]
    pub tenant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchRequest {
    effects: Vec<Value>,
}

/// A submission that is well formed (`Api::well_formed`), not yet checked against the catalog.
#[derive(Debug)]
struct WellFormed {
    run_id: RunId,
    tool: ToolName,
    decision: u32,
    call_idx: u32,
    args: Value,
    not_before: Option<Schedule>,
    /// The tenant named, its syntax checked; whether the caller may name it is checked with
    /// the caller.
    tenant: Option<String>,
}

impl WellFormed {
    /// The waiters' name of the command this submission is for.
    fn subject(&self) -> String {
        let key = CommandKey::new(self.decision, self.tool.clone(), self.call_idx);
        subject(&self.run_id, &key)
    }
}

/// 422 `invalid_request` naming the field (a JSON pointer into the submission).
fn invalid(field: &str, message: String) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
        .with_details(json!({ "pointer": format!("/{field}") }))
}

/// How a submission that recorded nothing found the command it is answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Existing {
    /// The same journal position (run and command key), with the same arguments.
    CommandKey,
    /// Another command, of this run or another, holds the tool's business key.
    BusinessKey,
}

impl Existing {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CommandKey => "command_key",
            Self::BusinessKey => "business_key",
        }
    }
}

/// The header that says, on a single submission's answer, how an existing command was found.
pub const EXISTING_HEADER: &str = "sluice-existing";

/// The answer to one submission: the status code, the command, and how it was found when it
/// was recorded before (`None`: recorded by this submission).
struct Submitted {
    status: StatusCode,
    command: Command,
    existing: Option<Existing>,
}

/// A command as a submission answers it: the command, and `existing` when it was not recorded
/// by this submission.
#[derive(Serialize)]
struct Answered<'a> {
    #[serde(flatten)]
    command: &'a Command,
    #[serde(skip_serializing_if = "Option::is_none")]
    existing: Option<Existing>,
}

impl<'a> Answered<'a> {
    fn of(submitted: &'a Submitted) -> Self {
        Self {
            command: &submitted.command,
            existing: submitted.existing,
        }
    }
}

impl Api {
    /// Checks that one submission is well formed as `schemas/openapi.yaml`'s `EffectRequest`
    /// describes it (shape, ids, tool name syntax, scheduling fields); nothing is read.
    fn well_formed(&self, raw: Value) -> Result<WellFormed, ApiError> {
        let request: EffectRequest = serde_json::from_value(raw).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!("invalid effect: {e}"),
            )
        })?;
        let run_id = RunId::parse(&request.run_id).map_err(|e| invalid("run_id", e.to_string()))?;
        if !request.args.is_object() {
            return Err(invalid("args", "args must be a JSON object".into()));
        }
        if run_id.as_str() == sluice_ledger::SYSTEM_RUN {
            return Err(invalid(
                "run_id",
                format!("run id {run_id} is reserved for the ledger's own records"),
            ));
        }
        let tool = ToolName::resolve(&request.tool, self.ctx.catalog.default_namespace())
            .map_err(|e| invalid("tool", e.to_string()))?;
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
            (Some(delay), None) => Some(Schedule::After(delay)),
            (None, Some(at)) => Some(Schedule::At(
                Timestamp::parse_rfc3339(at).map_err(|e| invalid("not_before", e.to_string()))?,
            )),
            (None, None) => None,
        };
        if let Some(tenant) = request.tenant.as_deref() {
            sluice_core::tenant::parse(tenant).map_err(|e| invalid("tenant", e.to_string()))?;
        }
        Ok(WellFormed {
            run_id,
            tool,
            decision: request.decision,
            call_idx: request.call_idx,
            args: request.args,
            not_before,
            tenant: request.tenant,
        })
    }

    /// Checks a well-formed submission against the catalog, reserves it and requests its
    /// dispatch.
    async fn submit_well_formed(
        &self,
        principal: &Principal,
        request: WellFormed,
    ) -> Result<Submitted, ApiError> {
        let tenant = principal.tenant(request.tenant.as_deref())?;
        let catalog = &self.ctx.catalog;
        let tool = catalog.get(&request.tool).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_tool",
                CatalogError::UnknownTool {
                    tool: request.tool.clone(),
                }
                .to_string(),
            )
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
        let not_before = machine::not_before(request.not_before, now, MAX_DELAY_MS)
            .map_err(|refused| invalid(refused.field, refused.message.into()))?;
        let run_id = request.run_id;
        let rules = self.ctx.with_write_slack(tool.rules());
        // One binding, changed in place as the command is built: each shadowing `let` would
        // keep its own ~700 bytes in this function's state machine across every await below
        // (a moved-from local keeps its storage to the end of its scope), in the box the
        // submission is copied into once per effect.
        let mut command = Command::from_intent(
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
        if let Some(name) = principal.submitter() {
            command = command.submitted_by(name);
        }
        command = command.for_tenant(tenant);
        let tool_label = tool.name().to_string();
        // Room in the tenant's quota, before anything is recorded: over it, 429 and nothing
        // written. Held until the reservation is counted.
        let quota = self.take_quota(&command).await.inspect_err(|e| {
            if e.status() == StatusCode::TOO_MANY_REQUESTS {
                self.count(&tool_label, "over_quota");
            }
        })?;
        // The spend budgets covering it, held with its reservation below (`crate::budgets`).
        let budgets = self.budgets_of(&command, now)?;
        // A tool that may be called twice with one key is leased in its reservation's own
        // write: its dispatch then costs no lease write (machine::lease_at_reservation).
        // What the tool's rules read of the budgets covering it, if they read any.
        let standing = self
            .ctx
            .budget_views(tool, &command)
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
        let policy = policy::evaluate(
            tool,
            &policy::RuleInput::of(&command, now).with_budgets(&standing),
            None,
            catalog.policy_version(),
        );
        command = command.leased_at_reservation(&rules, &policy, now);
        // The submission's span: the child of the request's, holding the reservation; the
        // command is stored with its context, the parent of every later step of the effect.
        let span = tracing::debug_span!(
            "reserve",
            run_id = %command.run_id,
            command_key = %command.command_key,
            tool = %command.tool,
            outcome = tracing::field::Empty,
        );
        command = command.traced(span.in_scope(crate::trace::for_command));
        let audit = command.reservation_audit(ACTOR);
        // Room in the dispatch backlog, taken before the reservation: a burst waits here
        // instead of piling up behind the dispatcher (`bus.admission`).
        let admission = if machine::reservation_requests_dispatch(&command.state) {
            Some(self.admit(command.tenant()).await?)
        } else {
            None
        };
        // An agent adds to its own runs only.
        let confined = self.must_confine(principal, &command.run_id);
        let run_id = command.run_id.clone();
        sluice_faults::point!("producer.reserve.pre");
        let (command_key, args_hash) = (command.command_key.clone(), command.args_hash.clone());
        let submitted = self
            .reserve_submission(command, audit, confined, &budgets, &rules, now)
            .instrument(span.clone())
            .await;
        // Arguments an approver edited the command to are its own (`crate::edit`): a
        // re-submission of them is answered with the command, not refused as drift or as over
        // a budget its own hold already counts.
        let (reserved, blocked_by_budget) = match submitted {
            Err(e) if e.code() == "budget_exceeded" => {
                match self.edited(&run_id, &command_key, &args_hash).await? {
                    Some(command) => (Ok(Reserved::Existing(command)), None),
                    None => {
                        self.count(&tool_label, "over_budget");
                        return Err(e);
                    }
                }
            }
            Err(e) => return Err(e),
            Ok((Err(LedgerError::ArgumentDrift { .. }), _))
                if let Some(command) = self.edited(&run_id, &command_key, &args_hash).await? =>
            {
                (Ok(Reserved::Existing(command)), None)
            }
            Ok(answer) => answer,
        };
        sluice_faults::point!("producer.reserve.post");
        drop(quota);
        span.record(
            "outcome",
            match &reserved {
                Ok(Reserved::Created(command)) => command.status().as_str(),
                Ok(Reserved::Existing(_)) => "existing",
                Ok(Reserved::BusinessKeyHeld(_)) => "business_key_held",
                Err(_) => "refused",
            },
        );
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
                // Recorded BLOCKED past a budget: approvers hear of it as of any other block.
                if let Some(block) = &blocked_by_budget {
                    self.announce_blocked(&command, block).await;
                }
                // What the command asks for as stored (a budget may have recorded it BLOCKED):
                // its dispatch request, carried out in the reservation's span, so the
                // dispatcher's span is its child.
                let step = machine::plan_reservation(&command.state);
                if !step.actions.is_empty() {
                    // The ticket counts this request in the dispatchers' queue until it is
                    // published (admission's estimate): dropped after the publish below.
                    let (room, _ticket) = match admission {
                        Some(admitted) => (admitted.room, admitted.ticket),
                        None => (Admission::unbounded(), None),
                    };
                    sluice_faults::point!("producer.publish.pre");
                    let published = self
                        .ctx
                        .carry_out_admitted(ACTOR, &command, &step, Cause::Reserved, Some(room))
                        .instrument(span.clone())
                        .await;
                    if let Err(e) = published {
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
                    existing: None,
                })
            }
            Reserved::Existing(_) | Reserved::BusinessKeyHeld(_) => {
                let existing = match &reserved {
                    Reserved::BusinessKeyHeld(_) => Existing::BusinessKey,
                    _ => Existing::CommandKey,
                };
                let command = reserved.into_command();
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
                    existing: Some(existing),
                })
            }
        }
    }

    /// The command `run_id`/`command_key` if an approver edited it to arguments hashing to
    /// `args_hash` (one of its revisions').
    async fn edited(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        args_hash: &sluice_core::ids::ArgsHash,
    ) -> Result<Option<Command>, ApiError> {
        let command = self
            .ctx
            .ledger
            .get(run_id, command_key)
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
        Ok(command.filter(|command| {
            command.args_hash != *args_hash && command.answers_to(args_hash.as_str())
        }))
    }

    fn count(&self, tool: &str, outcome: &str) {
        self.ctx
            .metrics
            .submissions
            .with_label_values(&[tool, outcome])
            .inc();
    }
}

impl Api {
    /// Holds `submitted` until its command is terminal or `deadline` (no deadline: as it is).
    /// A command still moving is answered 202.
    async fn settle(
        &self,
        principal: &Principal,
        submitted: Submitted,
        registered: Option<Watch>,
        deadline: Option<Instant>,
    ) -> Result<Submitted, ApiError> {
        let Some(deadline) = deadline else {
            return Ok(submitted);
        };
        let existing = submitted.existing;
        let command = submitted.command;
        let (run_id, command_key) = (command.run_id.clone(), command.command_key.clone());
        // A business key held elsewhere answers with the holder, another command than the one
        // the watch was taken for: that one is watched afresh.
        let registered = registered.filter(|w| w.subject() == subject(&run_id, &command_key));
        let command = until_settled(
            self,
            principal,
            &run_id,
            &command_key,
            Some(command),
            registered,
            deadline,
        )
        .await?;
        let status = if command.status().is_terminal() {
            submitted.status
        } else {
            StatusCode::ACCEPTED
        };
        Ok(Submitted {
            status,
            command,
            existing,
        })
    }
}

/// Where a command is polled: `GET /v1/runs/{run_id}/effects/{command_key}`, the key as one
/// percent-encoded segment (as the document asks clients to send it).
fn location(command: &Command) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!(
        "/v1/runs/{}/effects/{}",
        command.run_id,
        command.command_key.as_str().replace('/', "%2F")
    ))
    .ok()
}

pub(crate) async fn submit_one(
    State(api): State<Api>,
    Caller(principal): Caller,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    let max_wait = Duration::from_millis(api.config.max_wait_ms);
    let answer = match principal
        .require(Need::Submit)
        .and_then(|()| Preferences::of(&headers, max_wait))
        .and_then(|preferences| Ok((preferences, parse_json(&body)?)))
    {
        Ok((preferences, raw)) => {
            let deadline = preferences.wait.map(|wait| Instant::now() + wait);
            // Taken before anything is recorded: past the bound, 503 and nothing written.
            let slot = match deadline.map(|_| api.wait_slot(&principal)).transpose() {
                Ok(slot) => slot,
                Err(e) => return count(&api, "submit", e.into_response()),
            };
            let submitted = match api.well_formed(raw) {
                Ok(request) => {
                    // A waiting submission registers before it reserves: the events of its
                    // command cannot then come before the waiter, and the command the
                    // reservation returns needs no second read.
                    let registered = deadline.map(|_| api.waiters.watch(request.subject()));
                    sluice_faults::point!("producer.submit.pre");
                    // Boxed: the submission's and the settle's state machines are kilobytes,
                    // and the handler's future is moved into a box by each layer of the
                    // router. One box for both: one allocation, and the settle's few hundred
                    // bytes are not copied on their own.
                    Box::pin(async {
                        let submitted = api.submit_well_formed(&principal, request).await?;
                        api.settle(&principal, submitted, registered, deadline)
                            .await
                    })
                    .await
                }
                Err(e) => Err(e),
            };
            let answer = match submitted {
                Ok(submitted) => {
                    let mut response = if preferences.minimal {
                        (submitted.status, Json(MinimalCommand::of(&submitted))).into_response()
                    } else {
                        (submitted.status, Json(Answered::of(&submitted))).into_response()
                    };
                    if let Some(existing) = submitted.existing {
                        response
                            .headers_mut()
                            .insert(EXISTING_HEADER, HeaderValue::from_static(existing.as_str()));
                    }
                    if submitted.status == StatusCode::ACCEPTED
                        && let Some(location) = location(&submitted.command)
                    {
                        response
                            .headers_mut()
                            .insert(axum::http::header::LOCATION, location);
                    }
                    preferences.mark(response)
                }
                Err(e) => e.into_response(),
            };
            drop(slot);
            answer
        }
        Err(e) => e.into_response(),
    };
    count(&api, "submit", answer)
}

/// Counts an answer in `sluice_http_requests_total{route}`.
fn count(api: &Api, route: &str, answer: Response) -> Response {
    api.ctx
        .metrics
        .http_requests
        .with_label_values(&[route, answer.status().as_str()])
        .inc();
    answer
}
