//! The flow routes (docs/operations.md, "Flow control"): every upstream and tool with its
//! declared limits and breaker and its state now (`GET /v1/flow`, operators and admins), and an
//! admin's pause and resume of a tool or an upstream with a reason
//! (`POST /v1/flow/{name}:pause`, `:resume`). A pause is stored in the ledger, so every
//! dispatcher replica holds the calls within a second; it is audited in the ledger's own chain
//! and published as an event (`sluice_runtime::flow`). Pausing what is paused, or resuming what
//! is not, writes nothing and says so.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use sluice_core::flow::{FlowControl, Pause, UpstreamSpec};

use crate::auth::{Caller, Need};
use crate::operator::check_reason;
use crate::{Api, ApiError, RawBody, parse_body};

/// A tool or upstream as listed.
fn describe(
    spec: &UpstreamSpec,
    kind: &str,
    tools: Vec<String>,
    control: Option<&FlowControl>,
) -> Value {
    json!({
        "name": spec.name,
        "kind": kind,
        "tools": tools,
        "rate": spec.rate.map(|rate| rate.to_string()),
        "burst": spec.burst,
        "max_in_flight": spec.max_in_flight,
        "breaker": spec.breaker.map(|b| json!({
            "failures": b.failures,
            "open_ms": b.open_ms,
            "max_open_ms": b.max_open_ms,
            "probe_ms": b.probe_ms,
        })),
        "paused": control.and_then(|c| c.paused.as_ref()),
        "breaker_state": control.map_or(json!({"state": "closed"}), |c| json!(c.breaker)),
    })
}

/// `GET /v1/flow`: every declared upstream, then every tool, with its limits and its state as
/// stored now.
pub(crate) async fn list(
    State(api): State<Api>,
    Caller(principal): Caller,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadAll)?;
    let controls = api
        .ctx
        .ledger
        .flow_controls()
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let control = |name: &str| controls.iter().find(|c| c.name == name);
    let catalog = &api.ctx.catalog;
    let mut entries = Vec::new();
    // Declared upstreams, then those of hosts tools reach without naming one (the default
    // breaker, `by_default`).
    let upstreams = catalog
        .upstreams()
        .map(|spec| (spec, false))
        .chain(catalog.default_upstreams().map(|spec| (spec, true)));
    for (spec, by_default) in upstreams {
        let tools = catalog
            .tools()
            .iter()
            .filter(|tool| tool.upstream() == spec.name)
            .map(|tool| tool.name().to_string())
            .collect();
        let mut entry = describe(spec, "upstream", tools, control(&spec.name));
        entry["by_default"] = json!(by_default);
        entries.push(entry);
    }
    for tool in catalog.tools() {
        let name = tool.name().to_string();
        let own = UpstreamSpec::unlimited(&name);
        let mut entry = describe(&own, "tool", vec![name.clone()], control(&name));
        entry["upstream"] = json!(tool.upstream());
        entries.push(entry);
    }
    Ok(Json(json!({ "flow": entries, "share": api.ctx.flow.share() })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActionBody {
    reason: String,
}

/// `POST /v1/flow/{name}:pause` and `:resume` (an admin's, with a reason).
pub(crate) async fn act(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(rest): Path<String>,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    principal.require(Need::Admin)?;
    let Some((name, action)) = rest.rsplit_once(':') else {
        return Err(ApiError::method_not_allowed(
            "POST",
            "POST a flow action: /v1/flow/{name}:pause or :resume",
        ));
    };
    let pause = match action {
        "pause" => true,
        "resume" => false,
        other => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_action",
                format!("unknown flow action {other:?}: pause or resume"),
            ));
        }
    };
    let catalog = &api.ctx.catalog;
    let known = catalog
        .upstreams()
        .chain(catalog.default_upstreams())
        .any(|spec| spec.name == name)
        || catalog
            .tools()
            .iter()
            .any(|tool| tool.name().to_string() == name);
    if !known {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_flow",
            format!("{name} is neither a tool of the catalog nor one of its upstreams"),
        ));
    }
    let body: ActionBody = parse_body(&body, "{\"reason\": \"...\"}")?;
    let reason = check_reason(&body.reason)?.to_owned();
    let actor = principal.name.clone();
    let written = api
        .ctx
        .flow
        .write(&api.ctx, name, &actor, |current, now| {
            match (pause, &current.paused) {
                (true, None) => Some(FlowControl {
                    paused: Some(Pause {
                        actor: actor.clone(),
                        reason: reason.clone(),
                        at: now,
                    }),
                    ..current.clone()
                }),
                (false, Some(_)) => Some(FlowControl {
                    paused: None,
                    ..current.clone()
                }),
                // Paused already, or not paused: nothing to write.
                _ => None,
            }
        })
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let stored = api
        .ctx
        .flow
        .controls()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| FlowControl::new(name));
    let outcome = match (pause, written.is_some()) {
        (true, true) => "paused",
        (true, false) => "already_paused",
        (false, true) => "resumed",
        (false, false) => "not_paused",
    };
    tracing::info!(%name, outcome, actor = %principal.name, "flow action");
    Ok(Json(json!({
        "name": name,
        "outcome": outcome,
        "paused": stored.paused,
        "breaker_state": stored.breaker,
    }))
    .into_response())
}
