//! `POST /v1/effects/batch`: many effects in one request, each answered as a single submission
//! would be, in the order given; a malformed item refuses the batch whole, with nothing recorded.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use sluice_core::command::Command;
use sluice_core::ids::RunId;
use tokio::time::Instant;

use super::prefer::*;
use super::{Answered, BatchRequest, WellFormed};
use crate::Api;
use crate::auth::{Caller, Need};
use crate::http::{ApiError, RawBody, parse_json};

pub(crate) async fn submit_batch(
    State(api): State<Api>,
    Caller(principal): Caller,
    headers: HeaderMap,
    RawBody(body): RawBody,
) -> Result<Response, ApiError> {
    principal.require(Need::Submit)?;
    let preferences = Preferences::of(&headers, Duration::from_millis(api.config.max_wait_ms))?;
    let minimal = preferences.minimal;
    let deadline = preferences.wait.map(|wait| Instant::now() + wait);
    // One place for the whole batch (one request held), taken before anything is recorded.
    let _slot = deadline.map(|_| api.wait_slot(&principal)).transpose()?;
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
    // Every item is checked to be well formed before any is recorded: a malformed item is the
    // client's bug, and refusing the batch whole leaves no half of it behind (422 naming the
    // item). What depends on the catalog or the ledger is answered per item below.
    let mut items = Vec::with_capacity(batch.effects.len());
    for (index, raw) in batch.effects.into_iter().enumerate() {
        match api.well_formed(raw) {
            Ok(item) => items.push(item),
            Err(e) => {
                let inner = e.pointer().unwrap_or_default();
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    format!(
                        "effects[{index}]: {}; nothing in the batch was recorded",
                        e.message()
                    ),
                )
                .with_details(json!({ "pointer": format!("/effects/{index}{inner}") })));
            }
        }
    }
    let mut runs: Vec<Vec<(usize, WellFormed)>> = Vec::new();
    let mut run_of: std::collections::HashMap<RunId, usize> = std::collections::HashMap::new();
    for (index, item) in items.into_iter().enumerate() {
        let group = *run_of.entry(item.run_id.clone()).or_insert_with(|| {
            runs.push(Vec::new());
            runs.len() - 1
        });
        runs[group].push((index, item));
    }
    let total = runs.iter().map(Vec::len).sum();
    let answered = futures::future::join_all(runs.into_iter().map(|effects| {
        let api = api.clone();
        let principal = principal.clone();
        async move {
            // Every effect of the run is submitted before any is waited for: a run's effects
            // are dispatched one after another, so waiting for them in order costs nothing.
            let mut submitted = Vec::with_capacity(effects.len());
            for (index, item) in effects {
                let registered = deadline.map(|_| api.waiters.watch(item.subject()));
                sluice_faults::point!("producer.submit.pre");
                let result = api.submit_well_formed(&principal, item).await;
                submitted.push((index, registered, result));
            }
            let mut answers = Vec::with_capacity(submitted.len());
            for (index, registered, result) in submitted {
                let result = match result {
                    Ok(done) => api.settle(&principal, done, registered, deadline).await,
                    Err(e) => Err(e),
                };
                // Each answer is encoded as soon as it is known: a batch's answers wait for its
                // slowest run, and an encoded command is a third of the memory of a `Value`
                // tree of it, made without building that tree first.
                let answer = match result {
                    Ok(submitted) if minimal => encode_answer(&MinimalAnswer {
                        status: submitted.status.as_u16(),
                        command: MinimalCommand::of(&submitted),
                    }),
                    Ok(submitted) => encode_answer(&BatchAnswer {
                        status: submitted.status.as_u16(),
                        command: Answered::of(&submitted),
                    }),
                    Err(e) => {
                        let mut body = e.body();
                        body["status"] = json!(e.status().as_u16());
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
    Ok(preferences.mark(Json(BatchResults { results }).into_response()))
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
    command: Answered<'a>,
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

/// The JSON shape of an answer, for clients.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchResult {
    pub status: u16,
    #[serde(default)]
    pub command: Option<Command>,
    #[serde(default)]
    pub error: Option<Value>,
}
