//! The operator surface (docs/architecture.md, "HTTP API"): approve, reject, cancel, replay (dry run),
//! resolve and remove commands; list across runs; rollback progress. The audit routes are in
//! `audit.rs`.
//!
//! Every change is an event of the pure state machine, applied through the services' one job
//! entry (`Context::run_job`, `Job::Operate`), so an operator action either is a recorded
//! transition — with the caller's token name as the actor and the mandatory reason in the audit
//! chain — or is refused with the state machine's reason and changes nothing. Bad input is
//! refused before anything is read.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, Event, EventKind, Job, Operator, Refusal, Resolution, Step};
use sluice_core::replay::{self, ReplayNext, ReplayPolicy, ReplayProblem, RunReplays};
use sluice_runtime::{Actor, Ran, Sites};

use crate::auth::{Caller, Need};
use crate::http::ACTIONS;
use crate::{ACTOR, Api, ApiError, Q, RawBody, parse_body, parse_run};

/// Longest reason accepted, in characters.
pub const MAX_REASON_CHARS: usize = 1_000;
/// Largest evidence accepted, in bytes of JSON.
pub const MAX_EVIDENCE_BYTES: usize = 16 * 1024;
/// Longest evidence given as text, in characters.
pub const MAX_EVIDENCE_TEXT_CHARS: usize = 4 * 1024;

/// A reason: non-blank, at most [`MAX_REASON_CHARS`], no control characters but newlines.
pub fn check_reason(reason: &str) -> Result<&str, ApiError> {
    if is_blank(reason) {
        return Err(
            ApiError::invalid("a reason is required").with_details(json!({"pointer": "/reason"}))
        );
    }
    check_text("reason", reason, MAX_REASON_CHARS)?;
    Ok(reason.trim())
}

/// Blank as the document's patterns read it: only white space, U+FEFF counted (ECMAScript's
/// `\s` does).
pub fn is_blank(text: &str) -> bool {
    text.chars().all(|c| c.is_whitespace() || c == '\u{feff}')
}

/// Short free text: bounded and without control characters (they would corrupt a console).
pub fn check_text(field: &str, text: &str, max_chars: usize) -> Result<(), ApiError> {
    if text.chars().count() > max_chars {
        return Err(
            ApiError::invalid(format!("{field} is longer than {max_chars} characters"))
                .with_details(json!({ "pointer": format!("/{field}") })),
        );
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err(
            ApiError::invalid(format!("{field} contains control characters"))
                .with_details(json!({ "pointer": format!("/{field}") })),
        );
    }
    Ok(())
}

fn check_evidence(evidence: &Value) -> Result<(), ApiError> {
    let bytes = evidence.to_string().len();
    if bytes > MAX_EVIDENCE_BYTES {
        return Err(ApiError::invalid(format!(
            "evidence is {bytes} bytes of JSON; the limit is {MAX_EVIDENCE_BYTES}"
        ))
        .with_details(json!({"pointer": "/evidence"})));
    }
    if let Value::String(text) = evidence {
        check_text("evidence", text, MAX_EVIDENCE_TEXT_CHARS)?;
    }
    Ok(())
}

fn parse_key(raw: &str) -> Result<CommandKey, ApiError> {
    CommandKey::parse(raw).map_err(|e| ApiError::invalid(e.to_string()))
}

pub(crate) fn not_found(run_id: &RunId, key: &CommandKey) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_command",
        format!("no command {run_id}/{key}"),
    )
}

/// Why an operator event does not apply, in words an operator can act on.
fn explain(refusal: &Refusal, status: CommandStatus) -> String {
    match refusal {
        Refusal::NotAllowed { event, .. } => match (event, status) {
            (EventKind::Cancel, CommandStatus::Leased) => "the command is LEASED: a dispatcher holds its lease and may already have called the upstream, so it can no longer be cancelled; wait for its outcome, then roll the run back if it must be undone".into(),
            (EventKind::Cancel, CommandStatus::Unknown) => "the command's outcome is UNKNOWN: it may have committed upstream, so it cannot be cancelled; the reconciler is resolving it".into(),
            (EventKind::Cancel, CommandStatus::Stuck) => "the command is STUCK: it may have committed upstream, so it cannot be cancelled; resolve it with evidence instead".into(),
            (EventKind::Cancel, s) if s.is_terminal() => format!("the command is already {s}: there is nothing left to cancel"),
            (EventKind::Approve | EventKind::Reject, s) => format!("only a BLOCKED command is approved or rejected; this one is {s}"),
            (EventKind::Replay, s) => format!("only a FAILED or STUCK command is replayed; this one is {s}"),
            (EventKind::Resolve, s) => format!("only a STUCK command is resolved by hand; this one is {s}"),
            (event, s) => format!("{event:?} does not apply to a {s} command"),
        },
        other => other.to_string(),
    }
}

pub(crate) fn refused(command: &Command, refusal: &Refusal) -> ApiError {
    let code = match refusal {
        Refusal::NotAllowed { .. } => "not_allowed",
        Refusal::ReplayLimit { .. } => "replay_limit",
        Refusal::ReplayNeedsEvidence => "evidence_required",
        Refusal::EvidenceRequired => "evidence_required",
        Refusal::ReasonRequired => "reason_required",
        Refusal::OutcomeUnknown => "outcome_unknown",
        Refusal::RunRolledBack => "run_rolled_back",
        Refusal::StaleRevision { .. } => "stale_revision",
        Refusal::StaleEpoch { .. }
        | Refusal::NotYetDue { .. }
        | Refusal::LeaseStillValid { .. }
        | Refusal::AttemptsExhausted { .. }
        | Refusal::BlindRetry
        | Refusal::NotCompensable
        | Refusal::NotAwaited
        | Refusal::JobClaimed { .. }
        | Refusal::LeaseNotExtended { .. } => "not_allowed",
    };
    ApiError::new(
        StatusCode::CONFLICT,
        code,
        explain(refusal, command.status()),
    )
    .with_details(json!({
        "status": command.status(),
        "refusal": refusal,
    }))
}

/// The span name of an operator action.
fn action_span_name(event: &Event) -> &'static str {
    use sluice_core::machine::EventKind;
    match event.kind() {
        EventKind::Approve => "operator.approve",
        EventKind::Reject => "operator.reject",
        EventKind::Cancel => "operator.cancel",
        EventKind::Replay => "operator.replay",
        EventKind::Resolve => "operator.resolve",
        _ => "operator.action",
    }
}

/// Applies an operator event to a command and carries out what the step implies, through the
/// services' one job entry (`Job::Operate`: the cause of the requests it leads to is the
/// core's). `still`: whether the operator's event is still meant for the command as it is now
/// (asked again after a lost compare-and-set); a command it is not is answered 409. Its span
/// (`operator.<action>`, in the operator's request trace) gets the command's key, tool and
/// the status it was left in; the write itself is a span in the command's own trace, linked
/// to this one (`sluice_trace::adopt`).
#[tracing::instrument(
    name = "operator",
    skip(api, event, still),
    fields(
        otel.name = action_span_name(&event),
        run_id = %run_id,
        command_key = %key,
        event = ?event.kind(),
        tool = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
)]
pub(crate) async fn operate(
    api: &Api,
    run_id: &RunId,
    key: &CommandKey,
    actor: &str,
    event: Event,
    still: impl Fn(&Command) -> bool + Send + Sync,
) -> Result<(Command, Step), ApiError> {
    let current = api
        .ctx
        .current(run_id, key)
        .await
        .map_err(ApiError::unavailable)?;
    // A follow-up that could not be published is logged by `run_job` and the action still
    // answers what it stored: the sweep republishes the stored step.
    let ran = api
        .ctx
        .run_job(
            Job::Operate,
            Actor::on_behalf_of(ACTOR, actor),
            current,
            Sites::NONE,
            |now| still(now).then(|| event.clone()),
        )
        .await
        .map_err(ApiError::unavailable)?;
    match ran {
        Ran::Applied(command, step) => {
            tracing::info!(
                run_id = %run_id,
                command_key = %key,
                actor,
                from = %step.from,
                to = %step.to(),
                "operator action applied"
            );
            Ok((command, step))
        }
        Ran::Refused(command, refusal) => Err(refused(&command, &refusal)),
        Ran::Left(command) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_allowed",
            format!("command {run_id}/{key} is {}", command.status()),
        )),
        Ran::Missing => Err(not_found(run_id, key)),
    }
}

fn applied(action: &str, command: &Command, step: &Step) -> Response {
    Json(json!({
        "action": action,
        "from": step.from,
        "to": step.to(),
        "command": command,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    reason: String,
}

/// `:approve`'s body: the reason, and for an edit the command's new arguments, whole.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    reason: String,
    #[serde(default)]
    args: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    reason: String,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    evidence: Option<Value>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum ResolveOutcome {
    Confirmed,
    Failed,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    outcome: ResolveOutcome,
    reason: String,
    evidence: Value,
    #[serde(default)]
    external_ref: Option<String>,
}

/// `POST /v1/runs/{run}/effects/{key}:{action}`: approve, reject, cancel, replay, resolve;
/// counted in `sluice_http_requests_total{route="command_<action>"}`.
pub(crate) async fn command_action(
    State(api): State<Api>,
    caller: Caller,
    Path((run_id, rest)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    RawBody(body): RawBody,
) -> Response {
    let action = rest
        .rsplit_once(':')
        .map(|(_, action)| action)
        .and_then(|action| ACTIONS.iter().find(|known| **known == action))
        .map_or("command_other", |action| match *action {
            "approve" => "command_approve",
            "reject" => "command_reject",
            "cancel" => "command_cancel",
            "replay" => "command_replay",
            "approval-link" => "command_approval_link",
            _ => "command_resolve",
        });
    let answer = match act(&api, caller, run_id, rest, body, &headers).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    };
    api.ctx
        .metrics
        .http_requests
        .with_label_values(&[action, answer.status().as_str()])
        .inc();
    answer
}

async fn act(
    api: &Api,
    Caller(principal): Caller,
    run_id: String,
    rest: String,
    body: Bytes,
    headers: &axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    let api = api.clone();
    let Some((raw_key, action)) = rest.rsplit_once(':') else {
        return Err(ApiError::method_not_allowed(
            "GET, HEAD, DELETE",
            "POST a command action: …/effects/{command_key}:approve, :reject, :cancel, :replay, :resolve or :approval-link",
        ));
    };
    principal.require(Need::Admin)?;
    let run_id = parse_run(&run_id)?;
    let key = parse_key(raw_key)?;
    let actor = principal.name.clone();
    match action {
        "approval-link" => {
            crate::links::create(&api, &principal, &run_id, &key, &body, headers).await
        }
        "approve" => {
            let body: ApproveBody = parse_body(
                &body,
                "{\"reason\": \"...\", \"args\": {...} (optional: the edited arguments, whole)}",
            )?;
            let reason = check_reason(&body.reason)?;
            if let Some(args) = body.args {
                let (command, step) =
                    crate::edit::approve_edited(&api, &run_id, &key, &actor, reason, args).await?;
                return Ok(applied("approve", &command, &step));
            }
            let event = Event::Approve {
                operator: Operator {
                    actor: actor.clone(),
                    reason: reason.to_owned(),
                },
                policy_version: api.ctx.catalog.policy_version().to_owned(),
                revision: None,
            };
            let (command, step) = operate(&api, &run_id, &key, &actor, event, |_| true).await?;
            Ok(applied("approve", &command, &step))
        }
        "reject" => {
            let body: ReasonBody = parse_body(&body, "{\"reason\": \"...\"}")?;
            let reason = check_reason(&body.reason)?;
            // The reason as written: the machine keeps it for the agent (`Rejection`) and
            // records "rejected: …" in the audit chain.
            let event = Event::Reject {
                operator: Operator {
                    actor: actor.clone(),
                    reason: reason.to_owned(),
                },
            };
            let (command, step) = operate(&api, &run_id, &key, &actor, event, |_| true).await?;
            Ok(applied("reject", &command, &step))
        }
        "cancel" => {
            let body: ReasonBody = parse_body(&body, "{\"reason\": \"...\"}")?;
            let reason = check_reason(&body.reason)?;
            let (command, step) = cancel(&api, &run_id, &key, &actor, reason).await?;
            Ok(applied("cancel", &command, &step))
        }
        "replay" => {
            let body: ReplayBody = parse_body(
                &body,
                "{\"reason\": \"...\", \"dry_run\": bool, \"evidence\": ...}",
            )?;
            let reason = check_reason(&body.reason)?.to_owned();
            if let Some(evidence) = &body.evidence {
                check_evidence(evidence)?;
            }
            replay(
                &api,
                &run_id,
                &key,
                &actor,
                reason,
                body.dry_run,
                body.evidence,
            )
            .await
        }
        "resolve" => {
            let body: ResolveBody = parse_body(
                &body,
                "{\"outcome\": \"CONFIRMED\" | \"FAILED\", \"evidence\": ..., \"external_ref\": \"...\", \"reason\": \"...\"}",
            )?;
            let reason = check_reason(&body.reason)?;
            check_evidence(&body.evidence)?;
            let resolution = match body.outcome {
                ResolveOutcome::Confirmed => {
                    let external_ref = body
                        .external_ref
                        .clone()
                        .or_else(|| body.evidence.as_str().map(str::to_owned))
                        .filter(|r| !is_blank(r))
                        .ok_or_else(|| {
                            ApiError::invalid(
                                "resolving as CONFIRMED needs the upstream reference: external_ref",
                            )
                            .with_details(json!({"pointer": "/external_ref"}))
                        })?;
                    check_text("external_ref", &external_ref, 256)?;
                    Resolution::Confirmed { external_ref }
                }
                ResolveOutcome::Failed => {
                    if body.external_ref.is_some() {
                        return Err(ApiError::invalid(
                            "external_ref names a commit: give it only with outcome CONFIRMED",
                        ));
                    }
                    Resolution::Failed
                }
            };
            let event = Event::Resolve {
                operator: Operator {
                    actor: actor.clone(),
                    reason: format!("resolved by hand: {reason}"),
                },
                resolution,
                evidence: body.evidence,
            };
            let (command, step) = operate(&api, &run_id, &key, &actor, event, |_| true).await?;
            Ok(applied("resolve", &command, &step))
        }
        other => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_action",
            format!(
                "no command action {:?}: use approve, reject, cancel, replay, resolve or approval-link",
                other.chars().take(32).collect::<String>()
            ),
        )),
    }
}

async fn cancel(
    api: &Api,
    run_id: &RunId,
    key: &CommandKey,
    actor: &str,
    reason: &str,
) -> Result<(Command, Step), ApiError> {
    let event = Event::Cancel {
        operator: Operator {
            actor: actor.to_owned(),
            reason: format!("cancelled: {reason}"),
        },
    };
    operate(api, run_id, key, actor, event, |_| true).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RemoveQuery {
    reason: Option<String>,
}

/// `DELETE /v1/runs/{run}/effects/{key}`: removes an effect that has not started (the
/// `removeScheduledEffect` of the scheduled-effects model). Answers whether it was removed.
pub(crate) async fn remove_effect(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path((run_id, raw_key)): Path<(String, String)>,
    Q(query): Q<RemoveQuery>,
) -> Result<Response, ApiError> {
    crate::http::not_on_action(&raw_key)?;
    principal.require(Need::RemoveScheduled)?;
    let run_id = parse_run(&run_id)?;
    let key = parse_key(&raw_key)?;
    let reason = match &query.reason {
        Some(reason) => check_reason(reason)?.to_owned(),
        None => format!("removed by {}", principal.name),
    };
    let command = api
        .ctx
        .ledger
        .get(&run_id, &key)
        .await
        .map_err(|e| ApiError::unavailable(&e))?
        .ok_or_else(|| not_found(&run_id, &key))?;
    principal.require_owner(&run_id, std::slice::from_ref(&command))?;
    match cancel(&api, &run_id, &key, &principal.name, &reason).await {
        Ok((command, _)) => Ok(Json(json!({"removed": true, "command": command})).into_response()),
        Err(e) if e.status() == StatusCode::CONFLICT => {
            let current = api
                .ctx
                .ledger
                .get(&run_id, &key)
                .await
                .map_err(|e| ApiError::unavailable(&e))?;
            let mut body = e.body();
            body["removed"] = json!(false);
            body["command"] = json!(current);
            Ok((StatusCode::CONFLICT, Json(body)).into_response())
        }
        Err(e) => Err(e),
    }
}

/// Replays (or, with `dry_run`, reports what a replay would do): re-checks the tool, the stored
/// arguments against the current schema, the current policy, and the replay bounds per command
/// and per run, then asks the state machine.
async fn replay(
    api: &Api,
    run_id: &RunId,
    key: &CommandKey,
    actor: &str,
    reason: String,
    dry_run: bool,
    evidence: Option<Value>,
) -> Result<Response, ApiError> {
    // The run's budget is checked on a read of the run; the replay that read it must have
    // written before another replay of the run reads.
    let _turn = api.run_turn(run_id).await;
    let run = api.commands_of(run_id).await?;
    let command = run
        .iter()
        .find(|c| &c.command_key == key)
        .cloned()
        .ok_or_else(|| not_found(run_id, key))?;
    let catalog = &api.ctx.catalog;
    let rules = api.ctx.rules_of(&command);
    let run_replays: u32 = run.iter().map(|c| c.state.replays).sum();
    let run_limit = catalog.max_replays_per_run();
    let event = Event::Replay {
        operator: Operator {
            actor: actor.to_owned(),
            reason: format!("replayed: {reason}"),
        },
        evidence: evidence.clone(),
    };
    let tool = catalog.get(&command.tool);
    let standing = match tool {
        Some(tool) => api
            .ctx
            .budget_views(tool, &command)
            .await
            .map_err(|e| ApiError::unavailable(&e))?,
        None => Vec::new(),
    };
    let check = replay::check(
        &command,
        tool,
        &rules,
        RunReplays {
            replays: run_replays,
            limit: run_limit,
        },
        ReplayPolicy {
            version: catalog.policy_version(),
            budgets: &standing,
        },
        &event,
        api.ctx.clock.now(),
    );
    let problems: Vec<Value> = check
        .problems
        .iter()
        .map(|problem| match problem {
            ReplayProblem::Refused(refusal) => {
                let mut shown = refused(&command, refusal).body()["error"].clone();
                shown["refusal"] = json!(refusal);
                shown
            }
            other => json!({
                "code": other.code(),
                "message": other.message(run_id.as_str()),
            }),
        })
        .collect();
    let arguments = match (tool, &check.problems) {
        (None, _) => json!({"valid": false, "violations": []}),
        (Some(_), problems) => {
            let violations: Vec<Value> = problems
                .iter()
                .filter_map(|problem| {
                    if let ReplayProblem::InvalidArguments { error, .. } = problem {
                        Some(error)
                    } else {
                        None
                    }
                })
                .flat_map(|error| error.violations())
                .map(|v| json!({"pointer": format!("/args{}", v.pointer), "message": v.message}))
                .collect();
            json!({"valid": violations.is_empty(), "violations": violations})
        }
    };
    let policy_decision = check
        .decision
        .as_ref()
        .map_or(Value::Null, |decision| json!(decision));
    // What the replay does is the machine's step as the check took it: shown here, and the
    // same step is carried out below.
    let next = match check.next() {
        ReplayNext::Refused => "nothing: the replay is refused".to_owned(),
        ReplayNext::BlockedForApproval { to } => format!(
            "the command goes {to}, and the dispatcher blocks it for approval under policy version {}",
            catalog.policy_version()
        ),
        ReplayNext::Dispatched {
            to,
            attempt,
            max_attempts,
            evidence_recorded,
        } => format!(
            "the command goes {to} and is dispatched again with idempotency key {} (attempt {attempt} of {max_attempts}){}",
            command.idempotency_key,
            if evidence_recorded {
                "; the earlier outcome was unknown, and the evidence given is recorded as why a second commit is not feared"
            } else {
                ""
            }
        ),
        ReplayNext::Moves { to } => format!("the command goes {to}"),
    };
    let report = json!({
        "dry_run": dry_run,
        "allowed": problems.is_empty(),
        "run_id": run_id,
        "command_key": key,
        "from": command.status(),
        "to": check.to(),
        "semantics": command.semantics,
        "outcome_unknown": check.outcome_unknown,
        "arguments": arguments,
        "policy": policy_decision,
        "policy_version": catalog.policy_version(),
        "replays": {
            "command": command.state.replays,
            "command_limit": rules.max_replays,
            "run": run_replays,
            "run_limit": run_limit,
        },
        "problems": problems,
        "next": next,
    });
    if dry_run {
        return Ok(Json(report).into_response());
    }
    if !problems.is_empty() {
        let first = &report["problems"][0];
        let code = match check.problems.first() {
            Some(ReplayProblem::RunLimit { .. }) => "replay_limit",
            Some(ReplayProblem::InvalidArguments { .. }) => "invalid_arguments",
            Some(ReplayProblem::PolicyDenied { .. }) => "policy_denied",
            Some(ReplayProblem::ToolRemoved { .. }) => "tool_removed",
            Some(ReplayProblem::Refused(refusal)) => refused(&command, refusal).code(),
            None => "not_allowed",
        };
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            code,
            first["message"]
                .as_str()
                .unwrap_or("the replay is refused")
                .to_owned(),
        )
        .with_details(report));
    }
    let (command, step) = operate(api, run_id, key, actor, event, |_| true).await?;
    Ok(applied("replay", &command, &step))
}

/// Where a rollback stands, per command: what is being compensated, what was, what could not be.
pub fn rollback_progress(effects: &[Command]) -> Value {
    let mut counts = serde_json::Map::new();
    let mut commands = Vec::new();
    for command in effects.iter().rev() {
        let status = command.status();
        if !machine::in_rollback(&command.state) {
            continue;
        }
        let entry = counts.entry(status.as_str().to_owned()).or_insert(json!(0));
        *entry = json!(entry.as_u64().unwrap_or(0) + 1);
        commands.push(json!({
            "command_key": command.command_key,
            "tool": command.tool,
            "status": status,
            "escalated": command.state.escalated,
            "compensation": command.state.compensation,
        }));
    }
    let done = machine::rollback_done(effects.iter().map(|c| &c.state));
    json!({ "done": done, "counts": counts, "commands": commands })
}

/// `GET /v1/runs/{run}/rollback`: the rollback's progress per command, in compensation order.
pub(crate) async fn rollback_status(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let run_id = parse_run(&run_id)?;
    let effects = api.run_for(&principal, &run_id).await?;
    if effects.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_run",
            format!("run {run_id} has no commands"),
        ));
    }
    Ok(Json(json!({"run_id": run_id, "progress": rollback_progress(&effects)})).into_response())
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sluice_core::command::{CommandStatus, CompensationInfo, EffectSemantics, Intent};
    use sluice_core::ids::{CommandKey, RunId};
    use sluice_core::machine::{EventKind, Refusal};
    use sluice_core::time::Timestamp;

    use super::*;

    fn command(key: &str, status: CommandStatus) -> Command {
        let mut command = Command::from_intent(
            Intent {
                run_id: RunId::parse("r-1").expect("valid"),
                command_key: CommandKey::parse(key).expect("valid"),
                semantics: EffectSemantics::Idempotent,
                args: json!({}),
                business_key: None,
                policy_version: "1".into(),
                max_attempts: 3,
                not_before: None,
            },
            Timestamp::from_millis(0),
            1_000,
        );
        command.state.status = status;
        command
    }

    #[test]
    fn reasons_are_required_bounded_and_printable() {
        assert_eq!(check_reason("  ok  ").expect("fine"), "ok");
        for bad in [
            "",
            "   ",
            "\u{feff} ",
            "a\u{7}b",
            "a\u{85}b",
            &"x".repeat(MAX_REASON_CHARS + 1),
        ] {
            let err = check_reason(bad).expect_err("refused");
            assert_eq!(err.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad:?}");
        }
        assert!(check_reason("line one\nline two").is_ok());
        assert!(check_evidence(&json!({"ref": "w-1"})).is_ok());
        let big = json!("x".repeat(MAX_EVIDENCE_TEXT_CHARS + 1));
        assert!(check_evidence(&big).is_err());
        let large = json!({"record": "x".repeat(MAX_EVIDENCE_BYTES)});
        assert!(check_evidence(&large).is_err());
    }

    #[test]
    fn a_refused_cancel_says_why_in_an_operators_words() {
        let leased = command("d-1/email/send/0", CommandStatus::Leased);
        let refusal = Refusal::NotAllowed {
            status: CommandStatus::Leased,
            event: EventKind::Cancel,
        };
        let err = refused(&leased, &refusal);
        assert_eq!(err.status(), StatusCode::CONFLICT);
        assert_eq!(err.code(), "not_allowed");
        assert!(
            err.message()
                .contains("may already have called the upstream")
        );
        let done = command("d-1/email/send/0", CommandStatus::Confirmed);
        let err = refused(
            &done,
            &Refusal::NotAllowed {
                status: CommandStatus::Confirmed,
                event: EventKind::Cancel,
            },
        );
        assert!(
            err.message().contains("already CONFIRMED"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn rollback_progress_lists_compensations_last_first_and_knows_when_done() {
        let mut first = command("d-1/payments/wire/0", CommandStatus::Compensated);
        first.state.compensation = Some(Box::new(CompensationInfo {
            started_at: Timestamp::from_millis(1),
            ended_at: Some(Timestamp::from_millis(2)),
            reference: Some("rev-1".into()),
            detail: None,
            attempts: 1,
        }));
        let second = command("d-2/tickets/create/0", CommandStatus::Compensating);
        let untouched = command("d-3/search/lookup/0", CommandStatus::Confirmed);
        let progress = rollback_progress(&[first.clone(), second, untouched]);
        assert_eq!(progress["done"], json!(false));
        let keys: Vec<&str> = progress["commands"]
            .as_array()
            .expect("commands")
            .iter()
            .filter_map(|c| c["command_key"].as_str())
            .collect();
        assert_eq!(keys, ["d-2/tickets/create/0", "d-1/payments/wire/0"]);
        assert_eq!(progress["counts"]["COMPENSATING"], json!(1));
        let finished = rollback_progress(&[first]);
        assert_eq!(finished["done"], json!(true));
    }
}
