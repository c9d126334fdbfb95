//! The audit routes (docs/architecture.md, "Audit chain"): read a run's chain, verify it
//! (naming the first broken link), and purge finished runs, leaving a checkpoint per run and
//! recording the purge in the ledger's own chain. Reads check that the caller may see the run;
//! a purge is an admin's.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sluice_core::audit::{AuditDraft, verify};
use sluice_core::ids::RunId;
use sluice_core::time::Timestamp;
use tracing::Instrument;

use crate::auth::{Caller, Need, Principal};
use crate::listing::{MAX_LIST_LIMIT, parse_limit};
use crate::operator::check_reason;
use crate::{Api, ApiError, RawBody, parse_body, parse_run};

/// Reads a run's chain after checking the caller may see the run.
async fn trail_for(
    api: &Api,
    principal: &Principal,
    run_id: &RunId,
) -> Result<sluice_ledger::AuditTrail, ApiError> {
    // Agents see the chains of their own runs; the ledger's own chain is for operators.
    if run_id.as_str() == sluice_ledger::SYSTEM_RUN {
        principal.require(Need::ReadAll)?;
    } else {
        api.run_for(principal, run_id).await?;
    }
    let trail = api
        .ctx
        .ledger
        .audit_read(run_id)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    if trail.entries.is_empty() && trail.checkpoint.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_run",
            format!("run {run_id} has no audit records"),
        ));
    }
    Ok(trail)
}

/// `GET /v1/runs/{run}/audit`: the run's chain (checkpoint, then records in order).
pub(crate) async fn audit_read(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let run_id = parse_run(&run_id)?;
    let trail = trail_for(&api, &principal, &run_id).await?;
    Ok(Json(json!({
        "run_id": run_id,
        "checkpoint": trail.checkpoint,
        "entries": trail.entries,
    }))
    .into_response())
}

/// `GET /v1/runs/{run}/audit/verify`: recomputes the chain; names the first broken link.
pub(crate) async fn audit_verify(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(run_id): Path<String>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let run_id = parse_run(&run_id)?;
    let trail = trail_for(&api, &principal, &run_id).await?;
    let answer = match verify(&run_id, trail.checkpoint.as_ref(), &trail.entries) {
        Ok(verified) => json!({
            "run_id": run_id,
            "valid": true,
            "records": verified.records,
            "head": verified.head,
            "checkpoint": verified.checkpoint,
        }),
        Err(broken) => {
            tracing::warn!(run_id = %run_id, seq = broken.seq, kind = ?broken.kind, "audit chain broken");
            json!({
                "run_id": run_id,
                "valid": false,
                "message": broken.to_string(),
                "broken": broken,
                "checkpoint": trail.checkpoint,
            })
        }
    };
    Ok(Json(answer).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    older_than: String,
    reason: String,
    #[serde(default, deserialize_with = "crate::http::optional_whole_number")]
    max_runs: Option<usize>,
    /// Report what would be removed and kept, removing and recording nothing.
    #[serde(default)]
    dry_run: bool,
}

/// `POST /v1/audit/purge`: removes finished runs untouched since `older_than`, with their
/// idempotency and business keys, leaving a checkpoint per run; the request and what it removed
/// are recorded in the ledger's own chain.
pub(crate) async fn purge(
    State(api): State<Api>,
    Caller(principal): Caller,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    principal.require(Need::Admin)?;
    let body: PurgeBody = parse_body(
        &body,
        "{\"older_than\": \"<RFC 3339>\", \"reason\": \"...\", \"max_runs\": n, \"dry_run\": false}",
    )?;
    let reason = check_reason(&body.reason)?;
    let older_than = Timestamp::parse_rfc3339(&body.older_than).map_err(|e| {
        ApiError::invalid(format!("older_than: {e}"))
            .with_details(json!({"pointer": "/older_than"}))
    })?;
    let now = api.ctx.clock.now();
    sluice_core::retention::check_cutoff(older_than, now)
        .map_err(|why| ApiError::invalid(why).with_details(json!({"pointer": "/older_than"})))?;
    let max_runs = parse_limit(body.max_runs.or(Some(MAX_LIST_LIMIT)))?;
    let system = RunId::parse(sluice_ledger::SYSTEM_RUN)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    // A dry run writes nothing, not even the request: it changes nothing to account for.
    if !body.dry_run {
        api.ctx
            .ledger
            .audit_append(
                &system,
                AuditDraft {
                    command_key: None,
                    from: None,
                    to: None,
                    actor: principal.name.clone(),
                    reason: format!("purge requested: {reason}"),
                    evidence: json!({ "older_than": older_than, "max_runs": max_runs }),
                },
                now,
            )
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
    }
    let span = tracing::debug_span!(
        "operator",
        otel.name = "operator.purge",
        actor = principal.name.as_str(),
        outcome = tracing::field::Empty,
    );
    let report = api
        .ctx
        .ledger
        .purge(older_than, max_runs, &principal.name, now, body.dry_run)
        .instrument(span.clone())
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    span.record("outcome", report.runs);
    if body.dry_run {
        tracing::info!(actor = %principal.name, runs = report.runs, "purge dry run");
    } else {
        tracing::info!(actor = %principal.name, runs = report.runs, "purged finished runs");
    }
    Ok(Json(json!({
        "older_than": older_than,
        "actor": principal.name,
        "report": report,
    }))
    .into_response())
}
