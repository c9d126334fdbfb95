//! Evidence by webhook (`sluice_core::evidence`, docs/catalog.md):
//! `POST /v1/evidence/{source}` and `GET /v1/evidence?source=…`; an asynchronous tool's
//! callbacks (`crate::callbacks`) are recorded and carried out by the same [`record_once`].
//!
//! A request is authenticated by its signature alone (an upstream holds no Sluice token): one
//! not signed by the source's secret is a 401 that leaves nothing behind but a count in
//! `sluice_evidence_received_total{result="bad_signature"}`. A signed one is recorded once per
//! (source, event id) in the ledger *before* it is carried to its command, so the same event
//! sent again is answered 200 `replay` and never applied twice; then it is matched to its
//! command ([`find_command`]: by the idempotency key the event echoes, else by the upstream's
//! reference of the effect through the ledger's reference index), and applied through the state
//! machine (`Event::Evidence`) exactly as a status check's answer would be, the event
//! (size-capped) as the evidence of the audit record. An event that names no command Sluice
//! knows, or an outcome its tool does not list, is recorded `unmatched` with what was tried;
//! one whose command is not waiting for it (PENDING, LEASED, settled already) is recorded
//! `recorded`, unapplied.
//!
//! Answers: 200 with `result` = `applied` | `recorded` | `unmatched` | `replay`; 401 bad
//! signature; 404 unknown source; 413 body over `MAX_EVIDENCE_BYTES`; 422 a body that is not a
//! JSON event with an id; 503 the ledger or the source's secret unavailable, or another copy
//! of the event being carried out (the sender retries).

use std::collections::BTreeMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use sluice_core::catalog::SecretRef;
use sluice_core::evidence::{
    self, Disposition, EvidenceRecord, EvidenceSource, MAX_EVIDENCE_BYTES, MAX_REFERENCE_BYTES,
    Reading, Signed,
};
use sluice_core::ids::IdempotencyKey;
use sluice_core::machine::{Event, Job};
use sluice_runtime::{Actor, Ran, Sites};

use crate::auth::{Caller, Need};
use crate::{Api, ApiError, Q};

/// The most records `GET /v1/evidence` lists.
const MAX_LISTED: usize = 500;

/// The source's secret as text, read on every request (a rotated file is picked up without a
/// restart). The error names the reference, never a value.
fn read_secret(source: &EvidenceSource) -> Result<String, ApiError> {
    let text = match &source.secret {
        SecretRef::Env(name) => std::env::var(name).ok(),
        SecretRef::File(path) => std::fs::read_to_string(path).ok(),
    }
    .map(|text| text.trim().to_owned())
    .filter(|text| !text.is_empty());
    text.ok_or_else(|| {
        tracing::error!(source = %source.name, secret = %source.secret, "evidence source's secret cannot be read");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "secret_unavailable",
            format!(
                "evidence source {}: its secret ({}) is not set or cannot be read",
                source.name, source.secret
            ),
        )
    })
}

fn lower_headers(headers: &HeaderMap) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            Some((
                name.as_str().to_ascii_lowercase(),
                value.to_str().ok()?.to_owned(),
            ))
        })
        .collect()
}

pub(crate) fn answered(result: &str, record: &EvidenceRecord) -> Response {
    Json(json!({
        "result": result,
        "source": record.source,
        "event_id": record.event_id,
        "disposition": record.disposition,
        "idempotency_key": record.idempotency_key,
        "outcome": record.outcome,
        "note": record.note,
    }))
    .into_response()
}

/// `POST /v1/evidence/{source}`.
pub(crate) async fn receive(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let count = |result: &str| {
        api.ctx
            .metrics
            .evidence_received
            .with_label_values(&[name.as_str(), result])
            .inc();
    };
    let catalog = api.ctx.catalog.clone();
    let Some(source) = catalog.evidence_source(&name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_source",
            format!("no evidence source {name:?} is declared ([evidence_sources.<name>])"),
        ));
    };
    if body.len() > MAX_EVIDENCE_BYTES {
        count("bad_body");
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "an evidence body holds at most {MAX_EVIDENCE_BYTES} bytes, this one {}",
                body.len()
            ),
        ));
    }
    let secret = read_secret(source)?;
    let lowered = lower_headers(&headers);
    let now = api.ctx.clock.now();
    let signed = Signed {
        headers: &lowered,
        body: &body,
    };
    let header_id = match evidence::verify(source, &secret, &signed, now) {
        Ok(id) => id,
        Err(why) => {
            count("bad_signature");
            tracing::warn!(source = %name, why = %why, "evidence refused: bad signature");
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "bad_signature",
                format!("evidence source {name}: {why}"),
            ));
        }
    };
    let bad_body = |message: String| {
        count("bad_body");
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "bad_event", message)
    };
    let event: Value = serde_json::from_slice(&body)
        .map_err(|e| bad_body(format!("the event is not JSON: {e}")))?;
    let event_id = evidence::event_id(source, header_id, &event, &body)
        .filter(|id| !id.is_empty() && id.len() <= 256)
        .ok_or_else(|| bad_body("the event has no id where the source's scheme says".into()))?;

    let record = EvidenceRecord {
        source: name.clone(),
        event_id,
        received_at: now,
        disposition: Disposition::Received,
        idempotency_key: None,
        outcome: None,
        note: "received".into(),
        event: evidence::kept(&event, &body),
    };
    let (result, record) = record_once(&api, record, Carried::Webhook(&event), &count).await?;
    Ok(answered(result, &record))
}

/// How a recorded event finds its command.
pub(crate) enum Carried<'a> {
    /// A webhook's event: matched by the declarations of the tools taking its source.
    Webhook(&'a Value),
    /// A callback (`crate::callbacks`): its command named by the token, its body read.
    Callback {
        key: IdempotencyKey,
        reading: Reading,
    },
}

/// Records `record` once per (source, event id) *before* anything is applied — so a repeat
/// finds it and is a replay, never applied twice — then carries it to its command and settles
/// the record with what became of it; counts each result with `count`. Answers the result
/// (`applied`, `recorded`, `unmatched` or `replay`) and the record as stored.
pub(crate) async fn record_once(
    api: &Api,
    mut record: EvidenceRecord,
    carried: Carried<'_>,
    count: &(dyn Fn(&str) + Sync),
) -> Result<(&'static str, EvidenceRecord), ApiError> {
    if let Some(stored) = api
        .ctx
        .ledger
        .evidence_put(&record)
        .await
        .map_err(ApiError::unavailable)?
    {
        if stored.disposition != Disposition::Received {
            count("replay");
            return Ok(("replay", stored));
        }
        if sluice_core::evidence::still_in_progress(stored.received_at, record.received_at) {
            // Another copy is being carried out (or its carrier failed moments ago): not a
            // 200, so the sender keeps the event and sends it again.
            count("in_progress");
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "in_progress",
                format!(
                    "event {} of {} is being carried out; send it again later",
                    record.event_id, record.source
                ),
            ));
        }
        // Left `received` by a carrier that stopped: carried out now.
        record.received_at = stored.received_at;
    }

    match carried {
        Carried::Webhook(event) => carry(api, &mut record, event).await?,
        Carried::Callback { key, reading } => apply(api, &mut record, key, reading).await?,
    }
    api.ctx
        .ledger
        .evidence_settle(&record)
        .await
        .map_err(ApiError::unavailable)?;
    let result = record.disposition.as_str();
    count(result);
    Ok((result, record))
}

/// How an event was matched to its command.
enum Found {
    /// The command it names, and what it says.
    Command(IdempotencyKey, Reading),
    /// None: what was tried, in words.
    Nothing(String),
}

/// A value from an event as a note quotes it: at most 128 characters.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(128) {
        Some((end, _)) => format!("{:?}…", &text[..end]),
        None => format!("{text:?}"),
    }
}

/// Finds the command an event names, tool by tool of those taking evidence from `source`, in
/// catalog order: by the idempotency key when the event carries one where the tool looks
/// (`key_pointer`); else by the upstream's reference (`reference_pointer`) through the ledger's
/// reference index, taken only if the command it points to is of that tool and stores that
/// very reference (an entry is a hint: a stale one, or one a command of the same tool took
/// first for a reused id, must not settle another effect).
async fn find_command(api: &Api, source: &str, event: &Value) -> Result<Found, ApiError> {
    let catalog = api.ctx.catalog.clone();
    let ledger = &api.ctx.ledger;
    let mut tried = Vec::new();
    for tool in catalog.tools_with_evidence_from(source) {
        let Some(declared) = tool.evidence() else {
            continue;
        };
        let Some(reading) = declared.read(event) else {
            continue;
        };
        let name = tool.name();
        if let Some(text) = &reading.key {
            let Ok(key) = IdempotencyKey::parse(text) else {
                tried.push(format!(
                    "key {} of {name}: not an idempotency key",
                    quoted(text)
                ));
                continue;
            };
            let command = ledger
                .get(key.run_id(), key.command_key())
                .await
                .map_err(ApiError::unavailable)?;
            if command.is_some_and(|c| &c.tool == name) {
                return Ok(Found::Command(key, reading));
            }
            tried.push(format!(
                "key {key} of {name}: no command of the tool has it"
            ));
            continue;
        }
        let Some(reference) = reading.external_ref.clone() else {
            continue;
        };
        if reference.len() > MAX_REFERENCE_BYTES {
            tried.push(format!(
                "reference of {name}: longer than {MAX_REFERENCE_BYTES} bytes, never indexed"
            ));
            continue;
        }
        let Some(key) = ledger
            .reference_get(name, &reference)
            .await
            .map_err(ApiError::unavailable)?
        else {
            tried.push(format!(
                "reference {} of {name}: no command stored it",
                quoted(&reference)
            ));
            continue;
        };
        let command = ledger
            .get(key.run_id(), key.command_key())
            .await
            .map_err(ApiError::unavailable)?;
        match command {
            Some(c) if &c.tool == name && c.state.external_ref.as_deref() == Some(&reference) => {
                return Ok(Found::Command(key, reading));
            }
            Some(c) => tried.push(format!(
                "reference {} of {name}: indexed to {key}, whose state disagrees (tool {}, reference {}), so it is not applied",
                quoted(&reference),
                c.tool,
                c.state
                    .external_ref
                    .as_deref()
                    .map_or_else(|| "none".to_owned(), quoted)
            )),
            None => tried.push(format!(
                "reference {} of {name}: indexed to {key}, which is gone",
                quoted(&reference)
            )),
        }
    }
    Ok(Found::Nothing(if tried.is_empty() {
        "names no command of a tool taking evidence from this source: no key or reference where such a tool looks".into()
    } else {
        format!(
            "names no command of a tool taking evidence from this source: {}",
            tried.join("; ")
        )
    }))
}

/// Matches the event to its command and applies it; fills in the record's disposition.
async fn carry(api: &Api, record: &mut EvidenceRecord, event: &Value) -> Result<(), ApiError> {
    let (key, reading) = match find_command(api, &record.source, event).await? {
        Found::Command(key, reading) => (key, reading),
        Found::Nothing(note) => {
            record.disposition = Disposition::Unmatched;
            record.note = note;
            return Ok(());
        }
    };
    apply(api, record, key, reading).await
}

/// Applies what `reading` says to the command `key` names, as a status check's answer would
/// be; fills in the record's disposition.
async fn apply(
    api: &Api,
    record: &mut EvidenceRecord,
    key: IdempotencyKey,
    reading: Reading,
) -> Result<(), ApiError> {
    record.idempotency_key = Some(key.to_string());
    let Some(outcome) = reading.outcome else {
        record.disposition = Disposition::Unmatched;
        record.note = format!(
            "outcome value {:?} is none the tool lists as present, absent or failed",
            reading.outcome_value
        );
        return Ok(());
    };
    record.outcome = Some(outcome);
    let applied = Event::Evidence {
        source: record.source.clone(),
        event_id: record.event_id.clone(),
        outcome,
        external_ref: reading.external_ref,
        evidence: json!({
            "source": record.source,
            "event_id": record.event_id,
            "event": record.event,
        }),
    };
    let actor = format!("evidence:{}", record.source);
    let current = api
        .ctx
        .current(key.run_id(), key.command_key())
        .await
        .map_err(ApiError::unavailable)?;
    // A follow-up that could not be published is logged by `run_job`, and the evidence is
    // applied all the same: the sweeps pick up what was not published.
    let ran = api
        .ctx
        .run_job(
            Job::Evidence,
            Actor::on_behalf_of(crate::ACTOR, &actor),
            current,
            Sites::NONE,
            |_| Some(applied.clone()),
        )
        .await
        .map_err(ApiError::unavailable)?;
    match ran {
        Ran::Applied(_, step) => {
            record.disposition = Disposition::Applied;
            record.note = format!("{} -> {}: {}", step.from, step.to(), step.reason);
        }
        Ran::Refused(command, _) | Ran::Left(command) => {
            record.disposition = Disposition::Recorded;
            record.note = format!("the command is {}: kept, not applied", command.status());
        }
        Ran::Missing => {
            record.disposition = Disposition::Unmatched;
            record.note = "the command it names is gone".into();
        }
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    source: String,
    limit: Option<usize>,
}

/// `GET /v1/evidence?source=…[&limit=…]`: the source's records, newest first (admins).
pub(crate) async fn list(
    State(api): State<Api>,
    Caller(principal): Caller,
    Q(query): Q<ListQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::Admin)?;
    if api.ctx.catalog.evidence_source(&query.source).is_none()
        && crate::callbacks::tool_of_source(&api.ctx.catalog, &query.source).is_none()
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_source",
            format!(
                "no evidence source {:?} is declared ([evidence_sources.<name>], or callback:<tool> of a [tool.async] tool)",
                query.source
            ),
        ));
    }
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_LISTED);
    let records = api
        .ctx
        .ledger
        .evidence_list(&query.source, limit)
        .await
        .map_err(ApiError::unavailable)?;
    Ok(Json(json!({ "source": query.source, "evidence": records })).into_response())
}
