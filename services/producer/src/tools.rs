//! Tool discovery (`GET /v1/tools`, `GET /v1/tools/{namespace}/{name}`): what an agent may ask
//! for and how it will be handled — name, description, semantics, the arguments' JSON Schema,
//! whether a person must approve it, and the business key template. SDKs check their
//! declarations against it at decoration time, and `sluice mcp` lists it to the model.
//!
//! Connector URLs and their headers are left out: where a tool is sent, and with which
//! credentials, is the operator's business, not the agent's.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice_core::catalog::{CatalogError, Tool};

use crate::auth::{Caller, Need};
use crate::{Api, ApiError};

/// One tool as the API describes it.
pub fn describe(tool: &Tool) -> Value {
    let policy = tool.policy();
    json!({
        "name": tool.name().to_string(),
        "description": tool.description(),
        "semantics": tool.semantics(),
        "semantics_source": tool.semantics_source().as_str(),
        "mcp_server": tool.mcp().map(|binding| binding.server.as_str()),
        "args_schema": tool.schema(),
        "requires_approval": policy.requires_approval,
        "approve_above": policy.approve_above.as_ref().map(|t| json!({
            "field": t.field,
            "value": t.value,
        })),
        "business_key": tool.business_key_template().map(|t| t.as_str()),
        "status_check": tool.status_check().is_some(),
        "compensable": tool.compensate().is_some(),
        "max_attempts": policy.max_attempts,
        "timeout_ms": policy.timeout_ms,
        "money": tool.money(),
    })
}

/// `GET /v1/tools`: every tool of the catalog, in declaration order.
pub async fn list(State(api): State<Api>, Caller(principal): Caller) -> Result<Response, ApiError> {
    principal.require(Need::Discover)?;
    let catalog = &api.ctx.catalog;
    let tools: Vec<Value> = catalog.tools().iter().map(describe).collect();
    Ok(Json(json!({
        "policy_version": catalog.policy_version(),
        "default_namespace": catalog.default_namespace(),
        "tools": tools,
    }))
    .into_response())
}

/// `GET /v1/tools/{name}`: one tool, by `namespace/name` (or a bare name in the default
/// namespace); 404 `unknown_tool` when the catalog has no such tool.
pub async fn one(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    principal.require(Need::Discover)?;
    let tool = api.ctx.catalog.resolve(&name).map_err(|e| match e {
        CatalogError::UnknownTool { .. } => {
            ApiError::new(StatusCode::NOT_FOUND, "unknown_tool", e.to_string())
        }
        other => ApiError::invalid(format!("tool {name:?}: {other}")),
    })?;
    Ok(Json(describe(tool)).into_response())
}
