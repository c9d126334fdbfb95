//! `POST /v1/callbacks/{token}`: an asynchronous tool's upstream reports the outcome of the job
//! it accepted to the URL its dispatch request gave it (`sluice_core::callback`;
//! docs/catalog.md, "Asynchronous tools").
//!
//! No bearer token: the URL's token is the credential, signed under `[callbacks] secret` for
//! one dispatch attempt — its run, command key and lease epoch — and expiring a day after the
//! tool's deadline. A token that does not verify is a 401 and an expired one a 410; neither
//! leaves anything behind but a count in `sluice_evidence_received_total{source="callback"}`,
//! and no answer quotes the token or the key.
//!
//! A verified callback is read with the tool's callback reading (`[tool.async]`'s pointers,
//! else its `[tool.evidence]`'s). A body whose outcome value the tool does not list (a
//! progress report, `"processing"`) is answered 200 `ignored` and not recorded, so the URL
//! stays usable for the final word. Otherwise it is recorded as evidence under the source
//! `callback:<tool>` with the event id `cb_<digest of the token>`, once, *before* it is
//! applied — by the same code as a webhook's event (`crate::evidence::record_once`) — and
//! applied to the command as a status check's answer would be, the body and the token's epoch
//! as its evidence. The token used again is answered 200 `replay` and changes nothing.
//!
//! A callback that comes while the attempt's own answer is still being recorded (the upstream
//! called back before the dispatcher wrote its 202) waits for that, up to
//! [`ANSWER_WAIT_MS`]; one that finds its command not waiting (PENDING, LEASED again, settled)
//! is kept `recorded` and applied by the command's next look, as a webhook's is.
//!
//! Answers: 200 `applied` | `recorded` | `replay` | `ignored`; 401 a token Sluice did not
//! sign (or signed with a key since rotated); 404 `unmatched`, a command the ledger no longer
//! holds (recorded); 410 an expired token; 413 a body over `MAX_EVIDENCE_BYTES`; 415 a body
//! not declared JSON; 422 a body that is not JSON, or a tool no longer asynchronous; 503 no
//! `[callbacks] secret` here, the ledger unavailable, or another copy being carried out.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use sluice_core::Secret;
use sluice_core::callback::{self, TokenError};
use sluice_core::catalog::{Catalog, Tool};
use sluice_core::evidence::{self, Disposition, EvidenceRecord, MAX_EVIDENCE_BYTES};
use sluice_core::ids::{CommandKey, IdempotencyKey, RunId};

use crate::evidence::{Carried, answered, record_once};
use crate::{Api, ApiError};

/// The `source` label of the callbacks refused before their tool is known (a bad or expired
/// token): one value, so the label stays bounded.
const REFUSED_SOURCE: &str = "callback";

/// How long a callback waits for the answer of the attempt it is for to be recorded, when it
/// finds that attempt's lease still held.
pub const ANSWER_WAIT_MS: u64 = 3_000;

/// The key that verifies callback tokens, from `[callbacks] secret`.
pub(crate) fn key_of(config: &sluice_runtime::Config) -> Option<Arc<Secret>> {
    config.callbacks.secret.clone().map(Arc::new)
}

/// Refuses a `callbacks.public_url` whose host this producer would refuse (421
/// `host_not_allowed`): every callback sent there would be.
pub(crate) fn check_reachable(api: &Api, config: &sluice_runtime::Config) -> Result<(), String> {
    match (&api.callback_key, config.callbacks.base()) {
        (Some(_), Some(base)) => reachable(&api.browser, base),
        _ => Ok(()),
    }
}

/// Whether a request to `base` would pass the producer's host check (`browser`).
fn reachable(browser: &sluice_core::browser::Allowed, base: &str) -> Result<(), String> {
    let authority = base
        .split_once("://")
        .map_or(base, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    if browser.host_allowed(authority) {
        return Ok(());
    }
    Err(format!(
        "configuration key callbacks.public_url: its host {authority:?} is not a name this producer answers to, so every callback sent there would be refused (421): add it to producer.allowed_hosts"
    ))
}

/// The asynchronous tool whose callbacks are recorded under `source` (`callback:<tool>`).
pub(crate) fn tool_of_source<'a>(catalog: &'a Catalog, source: &str) -> Option<&'a Tool> {
    let name = source.strip_prefix("callback:")?;
    catalog
        .tools()
        .iter()
        .find(|tool| tool.asynchronous().is_some() && tool.name().to_string() == name)
}

/// `POST /v1/callbacks/{token}`.
pub(crate) async fn receive(
    State(api): State<Api>,
    Path(token): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let counted = |source: &str, result: &str| {
        api.ctx
            .metrics
            .evidence_received
            .with_label_values(&[source, result])
            .inc();
    };
    let Some(key) = api.callback_key.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "callbacks_off",
            "callbacks are not configured here: set [callbacks] secret (the same on every producer and dispatcher)",
        ));
    };
    if body.len() > MAX_EVIDENCE_BYTES {
        counted(REFUSED_SOURCE, "bad_body");
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "a callback's body holds at most {MAX_EVIDENCE_BYTES} bytes, this one {}",
                body.len()
            ),
        ));
    }
    let now = api.ctx.clock.now();
    let claims = match callback::verify(key.expose().as_bytes(), &token, now) {
        Ok(claims) => claims,
        Err(TokenError::Expired(at)) => {
            counted(REFUSED_SOURCE, "expired");
            return Err(ApiError::new(
                StatusCode::GONE,
                "callback_expired",
                format!(
                    "this callback URL expired at {at}: nothing was changed; the command was looked up or escalated at its deadline"
                ),
            ));
        }
        Err(why) => {
            counted(REFUSED_SOURCE, "bad_signature");
            tracing::warn!(why = %why, "callback refused: bad token");
            return Err(bad_token());
        }
    };
    // Signed by Sluice, so these parse; a token that does not is refused as any bad one.
    let (Ok(run_id), Ok(command_key)) = (RunId::parse(&claims.r), CommandKey::parse(&claims.k))
    else {
        counted(REFUSED_SOURCE, "bad_signature");
        return Err(bad_token());
    };
    let catalog = Arc::clone(&api.ctx.catalog);
    let tool_name = command_key.tool().clone();
    let source = callback::source_of(&tool_name.to_string());
    let count = |result: &str| counted(&source, result);
    let Some(tool) = catalog
        .get(&tool_name)
        .filter(|tool| tool.asynchronous().is_some())
    else {
        count("bad_body");
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "not_async",
            format!(
                "tool {tool_name} declares no [tool.async] in the catalog now: it takes no callbacks"
            ),
        ));
    };
    let event: Value = serde_json::from_slice(&body).map_err(|e| {
        count("bad_body");
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "bad_event",
            format!("the callback's body is not JSON: {e}"),
        )
    })?;
    let key = IdempotencyKey::new(run_id, command_key);
    let Some(reading) = callback::read(tool, key.to_string(), &event) else {
        count("bad_body");
        return Err(ApiError::invalid(format!(
            "tool {tool_name} is not asynchronous"
        )));
    };
    let event_id = callback::token_id(&token);
    if reading.outcome.is_none() {
        count("ignored");
        return Ok(Json(json!({
            "result": "ignored",
            "source": source,
            "event_id": event_id,
            "idempotency_key": key.to_string(),
            "note": format!(
                "outcome value {:?} is none the tool lists as present, absent or failed: not recorded; the URL stays usable",
                reading.outcome_value
            ),
        }))
        .into_response());
    }
    wait_for_the_answer(&api, &key, claims.e).await?;

    let record = EvidenceRecord {
        source: source.clone(),
        event_id,
        received_at: now,
        disposition: Disposition::Received,
        idempotency_key: Some(key.to_string()),
        outcome: None,
        note: "received".into(),
        // The attempt the URL was given to, with what the upstream said of it.
        event: json!({ "epoch": claims.e, "body": evidence::kept(&event, &body) }),
    };
    let (result, record) =
        record_once(&api, record, Carried::Callback { key, reading }, &count).await?;
    if result == Disposition::Unmatched.as_str() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unmatched",
            format!("recorded, not applied: {}", record.note),
        )
        .with_details(json!({
            "source": record.source,
            "event_id": record.event_id,
            "idempotency_key": record.idempotency_key,
        })));
    }
    Ok(answered(result, &record))
}

fn bad_token() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "bad_token",
        "the callback URL's token is not one Sluice signed (or it was signed with a key since rotated): nothing was changed",
    )
}

/// Waits, up to [`ANSWER_WAIT_MS`], while the command's lease is still the attempt's the URL
/// was given to (`epoch`): its answer (the 202) is being recorded, and the callback applies
/// once it is.
async fn wait_for_the_answer(api: &Api, key: &IdempotencyKey, epoch: u64) -> Result<(), ApiError> {
    let started = tokio::time::Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let command = api
            .ctx
            .ledger
            .get(key.run_id(), key.command_key())
            .await
            .map_err(ApiError::unavailable)?;
        let in_flight = command
            .is_some_and(|command| sluice_core::machine::attempt_in_flight(&command.state, epoch));
        if !in_flight || started.elapsed() >= Duration::from_millis(ANSWER_WAIT_MS) {
            return Ok(());
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_public_url_the_producer_would_refuse_is_named_at_start() {
        let hosts = vec!["sluice.example.com".to_owned()];
        let browser = sluice_core::browser::Allowed::new(&hosts, &[]).expect("valid");
        for fine in [
            "https://sluice.example.com",
            "https://sluice.example.com/api",
            "http://127.0.0.1:8700",
            "http://localhost:8700",
        ] {
            assert!(reachable(&browser, fine).is_ok(), "{fine}");
        }
        let refused = reachable(&browser, "https://callbacks.example.org/x").expect_err("refused");
        assert!(
            refused.contains("callbacks.public_url")
                && refused.contains("callbacks.example.org")
                && refused.contains("producer.allowed_hosts"),
            "{refused}"
        );
    }
}
