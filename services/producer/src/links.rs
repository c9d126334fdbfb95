//! Approval links (issue 42, part 4; `sluice_core::approval_link`): a person with a link and no
//! console login approves or rejects one BLOCKED command.
//!
//! - `POST /v1/runs/{run}/effects/{key}:approval-link` (admin, as `:approve`) issues one: a
//!   URL with a signed, expiring token bound to the command's run, key, arguments' hash and
//!   the catalog's policy version, recorded in the run's audit chain by its id (never its
//!   token) with whom it is for.
//! - `GET /approve/{token}` is the page: a static shell under the console's Content-Security-
//!   Policy whose script (`/approve/assets/approve.js`) reads the command as JSON from the same
//!   address (`Accept: application/json`) and shows it read-only, with approve / reject and a
//!   reason. A used, expired, forged, edited or re-policied link answers 410 with a page that
//!   says which, and changes nothing.
//! - `POST /approve/{token}` (`{"decision": "approve" | "reject", "reason": "…"}`) decides: the
//!   link's id is consumed in the ledger (`LinkStore::link_consume`, an insert-if-absent in
//!   SQLite's write transaction, an LWT `IF NOT EXISTS` on CQL), then the same core event as
//!   the API's `:approve` / `:reject` is applied, the actor `link:<id> (for …, issued by …)`.
//!
//! The token is the credential: the decision is not cookie-authenticated, so a cross-site page
//! cannot borrow a signed-in person's authority; the guard refuses browser requests from other
//! origins (`sluice_core::browser`) like every other route. Nothing here logs a token.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sluice_core::approval_link::{
    Claims, DEFAULT_EXPIRES_S, Gone, LinkKey, MAX_EXPIRES_S, MIN_EXPIRES_S, link_binding,
};
use sluice_core::audit::AuditDraft;
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{Event, Operator};
use sluice_core::time::Timestamp;

use crate::auth::Principal;
use crate::operator::{check_reason, check_text, is_blank, operate};
use crate::{Api, ApiError, RawBody, parse_body};

/// Longest `for` accepted, in characters.
pub const MAX_FOR_CHARS: usize = 200;

/// The signing key and the address links start with.
#[derive(Debug)]
pub struct Links {
    key: LinkKey,
    base: Option<String>,
}

impl Links {
    /// The links of `config`; `None` without a secret (no links are issued or accepted).
    pub fn from_config(config: &sluice_runtime::config::ApprovalLinksConfig) -> Option<Arc<Self>> {
        let secret = config.secret.as_ref()?;
        let key = LinkKey::new(secret.expose().as_bytes()).ok()?;
        Some(Arc::new(Self {
            key,
            base: config.base().map(str::to_owned),
        }))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    /// JSON's `3600.0` is the whole number it says (the document's `integer`), as elsewhere.
    #[serde(default, deserialize_with = "crate::http::optional_whole_number")]
    expires_in_s: Option<u64>,
    #[serde(default, rename = "for")]
    recipient: Option<String>,
}

fn off() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "approval_links_off",
        "approval links are not configured here: set [approval_links] secret (the same on every producer)",
    )
}

/// Where a link starts: the configured base, or the address this request came to.
fn base_of(links: &Links, headers: &HeaderMap, tls: bool) -> Result<String, ApiError> {
    if let Some(base) = &links.base {
        return Ok(base.clone());
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            ApiError::invalid(
                "no Host header to build the link from; set [approval_links] base_url",
            )
        })?;
    Ok(format!("{}://{host}", if tls { "https" } else { "http" }))
}

/// `POST …/effects/{key}:approval-link`: a link for a BLOCKED command.
pub(crate) async fn create(
    api: &Api,
    principal: &Principal,
    run_id: &RunId,
    key: &CommandKey,
    body: &Bytes,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let body: CreateBody = if body.iter().all(u8::is_ascii_whitespace) {
        CreateBody::default()
    } else {
        parse_body(body, "{\"expires_in_s\": 60..604800, \"for\": \"...\"}")?
    };
    let expires_in_s = body.expires_in_s.unwrap_or(DEFAULT_EXPIRES_S);
    if !(MIN_EXPIRES_S..=MAX_EXPIRES_S).contains(&expires_in_s) {
        return Err(ApiError::invalid(format!(
            "expires_in_s must be between {MIN_EXPIRES_S} and {MAX_EXPIRES_S} seconds (7 days)"
        ))
        .with_details(json!({"pointer": "/expires_in_s"})));
    }
    let recipient = match body.recipient {
        Some(r) if is_blank(&r) => {
            return Err(ApiError::invalid(
                "for is blank; leave it out or name whom the link is for",
            )
            .with_details(json!({"pointer": "/for"})));
        }
        Some(r) => {
            check_text("for", &r, MAX_FOR_CHARS)?;
            Some(r.trim().to_owned())
        }
        None => None,
    };
    let links = api.links.as_ref().ok_or_else(off)?;
    let base = base_of(links, headers, api.config.tls.is_some())?;
    let command = read(api, run_id, key).await?;
    if !sluice_core::machine::awaits_approval(&command.state) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_blocked",
            format!(
                "only a BLOCKED command gets an approval link; this one is {}",
                command.status()
            ),
        )
        .with_details(json!({"status": command.status()})));
    }
    let now = api.ctx.clock.now();
    let claims = Claims::new(
        uuid::Uuid::new_v4().simple().to_string(),
        link_binding(&command, api.ctx.catalog.policy_version()),
        now,
        expires_in_s,
        principal.name.clone(),
        recipient,
    );
    let token = links.key.sign(&claims);
    let expires_at = Timestamp::from_millis(claims.expires_at);
    // The audit chain records that a link exists and for whom: its id, never the token.
    let draft = AuditDraft {
        command_key: Some(key.clone()),
        from: None,
        to: None,
        actor: principal.name.clone(),
        reason: match &claims.recipient {
            Some(r) => format!("approval link {} issued for {r}", claims.id),
            None => format!("approval link {} issued", claims.id),
        },
        evidence: json!({
            "link_id": claims.id,
            "for": claims.recipient,
            "expires_at": expires_at,
            "args_hash": claims.args_hash,
            "policy_version": claims.policy_version,
        }),
    };
    api.ctx
        .ledger
        .audit_append(run_id, draft, now)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    tracing::info!(run_id = %run_id, command_key = %key, link_id = %claims.id, "approval link issued");
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "url": format!("{base}/approve/{token}"),
            "link_id": claims.id,
            "expires_at": expires_at,
            "for": claims.recipient,
        })),
    )
        .into_response())
}

async fn read(api: &Api, run_id: &RunId, key: &CommandKey) -> Result<Command, ApiError> {
    api.ctx
        .ledger
        .get(run_id, key)
        .await
        .map_err(|e| ApiError::unavailable(&e))?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "unknown_command",
                format!("no command {run_id}/{key}"),
            )
        })
}

/// Why a verified link may no longer decide `command`, if it may not: the binding, then
/// whether this link decided it already (its actor in the command's audit records), then
/// whether it still waits for a person.
async fn still_good(
    api: &Api,
    claims: &Claims,
    command: &Command,
) -> Result<Option<String>, Failure> {
    claims
        .check(&link_binding(command, api.ctx.catalog.policy_version()))
        .map_err(Failure::Gone)?;
    let trail = api
        .ctx
        .ledger
        .audit_read(&command.run_id)
        .await
        .map_err(|e| Failure::Api(ApiError::unavailable(&e)))?;
    let mine = format!("link:{} ", claims.id);
    let of_command = || {
        trail
            .entries
            .iter()
            .filter(|e| e.record.command_key.as_ref() == Some(&command.command_key))
    };
    if of_command().any(|e| e.record.actor.starts_with(&mine) && e.record.to.is_some()) {
        return Err(Failure::Gone(Gone::Used));
    }
    if !sluice_core::machine::awaits_approval(&command.state) {
        return Err(Failure::Gone(Gone::Decided));
    }
    Ok(sluice_core::machine::blocked_reason(
        trail.entries.iter().map(|e| &e.record),
        &command.command_key,
    )
    .map(str::to_owned))
}

#[derive(Debug)]
enum Failure {
    Gone(Gone),
    Api(ApiError),
}

impl Failure {
    fn json(self) -> Response {
        match self {
            Self::Gone(gone) => gone_error(gone).into_response(),
            Self::Api(e) => e.into_response(),
        }
    }
}

fn gone_error(gone: Gone) -> ApiError {
    ApiError::new(StatusCode::GONE, gone.code(), gone.to_string())
}

/// Opens `token` and reads its command.
async fn open(api: &Api, token: &str) -> Result<(Claims, Command), Failure> {
    let links = api.links.as_ref().ok_or(Failure::Gone(Gone::Forged))?;
    let claims = links
        .key
        .open(token, api.ctx.clock.now())
        .map_err(Failure::Gone)?;
    let (Ok(run_id), Ok(key)) = (
        RunId::parse(&claims.run_id),
        CommandKey::parse(&claims.command_key),
    ) else {
        return Err(Failure::Gone(Gone::Forged));
    };
    let command = match read(api, &run_id, &key).await {
        Ok(command) => command,
        Err(e) if e.status() == StatusCode::NOT_FOUND => return Err(Failure::Gone(Gone::Decided)),
        Err(e) => return Err(Failure::Api(e)),
    };
    Ok((claims, command))
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.contains("application/json"))
}

/// `GET /approve/{token}`: the page (or, asked for JSON by its script, the command).
pub(crate) async fn page(
    State(api): State<Api>,
    Path(token): Path<String>,
    headers: HeaderMap,
) -> Response {
    let json = wants_json(&headers);
    let opened = match open(&api, &token).await {
        Ok((claims, command)) => still_good(&api, &claims, &command)
            .await
            .map(|why| (claims, command, why)),
        Err(failure) => Err(failure),
    };
    let response = match (opened, json) {
        (Ok((claims, command, why)), true) => Json(json!({
            "run_id": command.run_id,
            "command_key": command.command_key,
            "tool": command.tool,
            "args": command.args,
            "status": command.status(),
            "submitted_by": command.submitted_by,
            "tenant": command.tenant(),
            "created_at": command.created_at,
            "blocked_because": why,
            "link": {
                "id": claims.id,
                "for": claims.recipient,
                "issued_by": claims.issuer,
                "expires_at": Timestamp::from_millis(claims.expires_at),
            },
        }))
        .into_response(),
        (Ok(_), false) => html(StatusCode::OK, PAGE),
        (Err(failure), true) => failure.json(),
        (Err(Failure::Gone(gone)), false) => html(StatusCode::GONE, &gone_page(gone)),
        (Err(Failure::Api(e)), false) => {
            let status = e.status();
            html(
                status,
                &gone_page_text(
                    "Sluice cannot answer right now",
                    "The ledger did not answer; try the link again in a moment.",
                ),
            )
        }
    };
    crate::ui::secured(response)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Decision {
    Approve,
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DecideBody {
    decision: Decision,
    reason: String,
}

/// `POST /approve/{token}`: the decision.
pub(crate) async fn decide(
    State(api): State<Api>,
    Path(token): Path<String>,
    RawBody(body): RawBody,
) -> Response {
    let answer = match decide_inner(&api, &token, &body).await {
        Ok(response) => response,
        Err(failure) => failure.json(),
    };
    api.ctx
        .metrics
        .http_requests
        .with_label_values(&["approval_link_decide", answer.status().as_str()])
        .inc();
    crate::ui::secured(answer)
}

async fn decide_inner(api: &Api, token: &str, body: &Bytes) -> Result<Response, Failure> {
    let body: DecideBody = parse_body(
        body,
        "{\"decision\": \"approve\" | \"reject\", \"reason\": \"...\"}",
    )
    .map_err(Failure::Api)?;
    let reason = check_reason(&body.reason).map_err(Failure::Api)?.to_owned();
    let (claims, command) = open(api, token).await?;
    still_good(api, &claims, &command).await?;
    let (run_id, key) = (command.run_id.clone(), command.command_key.clone());
    // Single use: the first decision consumes the id; a second one, on any producer, is told
    // the link was used and changes nothing.
    let fresh = api
        .ctx
        .ledger
        .link_consume(&claims.id, &run_id, &key, api.ctx.clock.now())
        .await
        .map_err(|e| Failure::Api(ApiError::unavailable(&e)))?;
    if !fresh {
        return Err(Failure::Gone(Gone::Used));
    }
    let actor = claims.actor();
    let operator = Operator {
        actor: actor.clone(),
        reason,
    };
    let (event, action) = match body.decision {
        Decision::Approve => (
            Event::Approve {
                operator,
                policy_version: claims.policy_version.clone(),
                revision: None,
            },
            "approve",
        ),
        Decision::Reject => (Event::Reject { operator }, "reject"),
    };
    // The binding is checked again on the command the write is decided on: an edit or a new
    // policy that lands between the read above and this write leaves the command as it is.
    let policy = api.ctx.catalog.policy_version().to_owned();
    let bound = claims.clone();
    let (stored, step) = operate(api, &run_id, &key, &actor, event, move |now| {
        bound.check(&link_binding(now, &policy)).is_ok()
    })
    .await
    .map_err(|e| {
        if e.status() == StatusCode::CONFLICT {
            Failure::Gone(Gone::Decided)
        } else {
            Failure::Api(e)
        }
    })?;
    tracing::info!(run_id = %run_id, command_key = %key, link_id = %claims.id, action, "approval link used");
    Ok(Json(json!({
        "action": action,
        "from": step.from,
        "to": step.to(),
        "status": stored.status(),
    }))
    .into_response())
}

fn html(status: StatusCode, body: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body.to_owned(),
    )
        .into_response()
}

/// The page's shell: everything it shows is put in by its script with `textContent`.
const PAGE: &str = include_str!("../ui/approve/approve.html");

/// The 410 page: one of [`Gone`]'s fixed messages, no data from the link or the command.
fn gone_page(gone: Gone) -> String {
    let title = match gone {
        Gone::Used => "This link was already used",
        Gone::Expired => "This link has expired",
        Gone::Forged => "This link is not valid",
        Gone::Edited => "The command changed",
        Gone::Repolicied => "The approval policy changed",
        Gone::Decided => "Nothing left to decide",
    };
    gone_page_text(title, &gone.to_string())
}

fn gone_page_text(title: &str, message: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\">\n<head>\n  <meta charset=\"utf-8\">\n  \
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n  \
         <meta name=\"referrer\" content=\"no-referrer\">\n  <title>{title} — Sluice</title>\n  \
         <link rel=\"stylesheet\" href=\"/approve/assets/style.css\">\n</head>\n<body>\n\
         <main class=\"narrow\">\n  <div class=\"card\" role=\"alert\">\n    <h1>{title}</h1>\n    \
         <p id=\"gone\">{message}</p>\n    <p class=\"muted\">Nothing was changed.</p>\n  </div>\n\
         </main>\n</body>\n</html>\n"
    )
}

/// The page's script and styles (`/approve/assets/…`), served whether or not the console is.
pub(crate) async fn asset(Path(name): Path<String>) -> Response {
    let (content_type, body) = match name.as_str() {
        "approve.js" => (
            "text/javascript; charset=utf-8",
            include_str!("../ui/approve/approve.js"),
        ),
        "style.css" => ("text/css; charset=utf-8", include_str!("../ui/style.css")),
        _ => {
            return crate::ui::secured((StatusCode::NOT_FOUND, "no such file").into_response());
        }
    };
    crate::ui::secured(
        (
            [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            body,
        )
            .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gone_page_names_its_reason_and_holds_no_script() {
        for gone in [
            Gone::Used,
            Gone::Expired,
            Gone::Forged,
            Gone::Edited,
            Gone::Repolicied,
            Gone::Decided,
        ] {
            let page = gone_page(gone);
            assert!(page.contains(&gone.to_string()), "{page}");
            assert!(!page.contains("<script"), "{page}");
        }
        assert!(PAGE.contains("src=\"/approve/assets/approve.js\""));
        assert!(!PAGE.contains(" onclick="));
    }
}
