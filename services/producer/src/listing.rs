//! Listings across runs: `GET /v1/runs` and `GET /v1/effects`, paged with a cursor.
//!
//! Both list runs newest first (runs of one millisecond by descending id) and stop after a
//! bounded number of runs, so one request reads a bounded part of the ledger. When a listing
//! stopped before the end it answers `next`, the cursor of the last run it covered: asked again
//! with `before=<next>`, it goes on from there and misses none. A listing of effects reads each
//! run's commands, so its page may hold fewer effects than `limit` and still have a `next`
//! (also when its reads took `producer.list_page_budget_ms`: on a slow ledger a page answers in
//! time, with what it read);
//! a client that wants every BLOCKED effect (the approval queue) follows `next` until it is
//! absent. A run's effects never straddle two pages.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use sluice_core::command::Command;
use sluice_core::ids::RunId;
use sluice_core::time::Timestamp;
use sluice_ledger::RunCursor;

use crate::auth::{Caller, Need};
use crate::{Api, ApiError, Q, parse_status_filter, parse_tool_filter};

/// Most runs a listing or a purge call covers.
pub const MAX_LIST_LIMIT: usize = 1_000;

/// Most runs one page of `GET /v1/effects` reads the commands of.
const RUNS_PER_EFFECTS_PAGE: usize = MAX_LIST_LIMIT;

/// Runs of a listing of effects read at once.
const RUN_READS_AT_ONCE: usize = 16;

/// Most digits of a cursor's millisecond: every such number fits an `i64`.
const CURSOR_MILLIS_DIGITS: usize = 18;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunsQuery {
    since: Option<String>,
    before: Option<String>,
    limit: Option<usize>,
    status: Option<String>,
    tool: Option<String>,
    tenant: Option<String>,
}

fn parse_since(raw: Option<&str>) -> Result<Timestamp, ApiError> {
    raw.map_or(Ok(Timestamp::from_millis(0)), |raw| {
        Timestamp::parse_rfc3339(raw).map_err(|e| {
            ApiError::invalid(format!("since: {e}")).with_details(json!({"pointer": "/since"}))
        })
    })
}

pub(crate) fn parse_limit(raw: Option<usize>) -> Result<usize, ApiError> {
    match raw {
        None => Ok(100),
        Some(0) => Err(ApiError::invalid("limit must be at least 1")),
        Some(n) if n > MAX_LIST_LIMIT => Err(ApiError::invalid(format!(
            "limit may be at most {MAX_LIST_LIMIT}"
        ))),
        Some(n) => Ok(n),
    }
}

/// A cursor as a listing answers it in `next`: `<created_at ms>.<run id>`.
fn cursor_token(cursor: &RunCursor) -> String {
    format!("{}.{}", cursor.created_at.as_millis(), cursor.run_id)
}

fn parse_before(raw: Option<&str>) -> Result<Option<RunCursor>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    let refuse = |why: &str| {
        ApiError::invalid(format!(
            "before: {why}; pass the `next` of the previous page unchanged"
        ))
        .with_details(json!({"pointer": "/before"}))
    };
    let (millis, run) = raw
        .split_once('.')
        .ok_or_else(|| refuse("expected <milliseconds>.<run id>"))?;
    let canonical = !millis.is_empty()
        && millis.len() <= CURSOR_MILLIS_DIGITS
        && millis.bytes().all(|b| b.is_ascii_digit())
        && (millis == "0" || !millis.starts_with('0'));
    if !canonical {
        return Err(refuse(
            "the milliseconds are not a number of at most 18 digits",
        ));
    }
    let millis: i64 = millis
        .parse()
        .map_err(|_| refuse("the milliseconds are out of range"))?;
    let run_id = RunId::parse(run).map_err(|e| refuse(&e.to_string()))?;
    Ok(Some(RunCursor {
        created_at: Timestamp::from_millis(millis),
        run_id,
    }))
}

/// A listing's answer: `key` holds `items`, and `next` is there when the listing stopped early.
fn page<T: serde::Serialize>(key: &str, items: Vec<T>, next: Option<RunCursor>) -> Response {
    let mut answer = Map::new();
    answer.insert(key.to_owned(), json!(items));
    if let Some(next) = next {
        answer.insert("next".to_owned(), Value::String(cursor_token(&next)));
    }
    Json(Value::Object(answer)).into_response()
}

/// `GET /v1/runs`: runs created since `since`, newest first, with their open commands.
pub(crate) async fn list_runs(
    State(api): State<Api>,
    Caller(principal): Caller,
    Q(query): Q<RunsQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadAll)?;
    if query.status.is_some() || query.tool.is_some() || query.tenant.is_some() {
        return Err(ApiError::invalid(
            "runs are filtered by since and limit; filter effects by status, tool and tenant at /v1/effects",
        ));
    }
    let since = parse_since(query.since.as_deref())?;
    let before = parse_before(query.before.as_deref())?;
    let limit = parse_limit(query.limit)?;
    // One more than asked for tells whether there is a next page.
    let mut runs = api
        .ctx
        .ledger
        .list_runs(since, before.as_ref(), limit + 1)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let more = runs.len() > limit;
    runs.truncate(limit);
    let next = more.then(|| runs.last().map(|r| r.cursor())).flatten();
    Ok(page("runs", runs, next))
}

/// `GET /v1/effects`: effects across the runs created since `since` (newest runs first), by
/// status, tool and tenant, at most `limit` (more only when one run alone has more), reading at most
/// [`RUNS_PER_EFFECTS_PAGE`] runs. An agent gets only the effects it submitted (its own runs:
/// a run holds one submitter's commands), so it can list its runs without knowing their ids.
pub(crate) async fn list_all_effects(
    State(api): State<Api>,
    Caller(principal): Caller,
    Q(query): Q<RunsQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let only = (!principal.may(Need::ReadAll)).then(|| principal.name.clone());
    let since = parse_since(query.since.as_deref())?;
    let before = parse_before(query.before.as_deref())?;
    let limit = parse_limit(query.limit)?;
    let status = parse_status_filter(query.status.as_deref())?;
    let tool = parse_tool_filter(&api, query.tool.as_deref())?;
    let tenant = query
        .tenant
        .as_deref()
        .map(sluice_core::tenant::parse)
        .transpose()
        .map_err(|e| {
            ApiError::invalid(e.to_string()).with_details(json!({"pointer": "/tenant"}))
        })?;
    // A page answers once its reads pass the budget, with a `next`: on a slow ledger a client
    // that asked again after a timeout would ask for the same page for ever.
    let began = std::time::Instant::now();
    let budget = std::time::Duration::from_millis(api.config.list_page_budget_ms);
    let mut runs = api
        .ctx
        .ledger
        .list_runs(since, before.as_ref(), RUNS_PER_EFFECTS_PAGE + 1)
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    let more = runs.len() > RUNS_PER_EFFECTS_PAGE;
    runs.truncate(RUNS_PER_EFFECTS_PAGE);
    let mut effects: Vec<Command> = Vec::new();
    // The last run this page covered whole.
    let mut covered: Option<RunCursor> = None;
    // Each run is one read; a few at once, taken in order (on CQL a page of 1,000 runs read one
    // by one outlasted a client's patience on a loaded cluster). Reads not yet taken when the
    // page fills are dropped unread.
    // Owned (a run id and the ledger's handle) so the reads' futures borrow nothing.
    let run_ids: Vec<RunId> = runs.iter().map(|run| run.run_id.clone()).collect();
    let mut reads = futures::stream::iter(run_ids)
        .map(|run_id| {
            let ledger = std::sync::Arc::clone(&api.ctx.ledger);
            async move { ledger.list_run(&run_id, status).await }
        })
        .buffered(RUN_READS_AT_ONCE)
        .enumerate();
    while let Some((i, read)) = reads.next().await {
        let run = &runs[i];
        let matching: Vec<Command> = read
            .map_err(|e| ApiError::unavailable(&e))?
            .into_iter()
            .filter(|c| tool.as_ref().is_none_or(|t| &c.tool == t))
            .filter(|c| tenant.as_deref().is_none_or(|t| c.tenant() == t))
            .filter(|c| only.is_none() || c.submitted_by.as_deref() == only.as_deref())
            .collect();
        if !effects.is_empty() && effects.len() + matching.len() > limit {
            return Ok(page("effects", effects, covered));
        }
        effects.extend(matching);
        covered = Some(run.cursor());
        let full = effects.len() >= limit || began.elapsed() >= budget;
        if full && (more || i + 1 < runs.len()) {
            return Ok(page("effects", effects, covered));
        }
    }
    Ok(page("effects", effects, covered.filter(|_| more)))
}
