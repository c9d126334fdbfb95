//! What `sluice mcp` does for one tool call once it has its position ([`super::position`]): it
//! submits it to the producer's API as an effect with `Prefer: wait`, follows it to a settled
//! state, and says what happened in terms a model can act on.
//!
//! Nothing here decides anything about the effect: the producer records it before it runs and
//! the pipeline carries it out. The bridge maps each answer to a tool result, and says the truth
//! when Sluice could not answer: a submission or a follow-up that got a 5xx or no answer is
//! looked up, and the model is told whether the call was recorded (and is running), was not
//! recorded when asked, or cannot be known — never "refused" for a call that runs. Such an
//! outcome leaves its position open ([`Outcome::retry_same`]), so the same call again asks
//! after the same command.
//!
//! The bridge has no token of its own: each request carries the one its caller is entitled to
//! (`sluice mcp` decides whose, [`super::credential`]).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_core::trace::TraceContext;
use sluice_core::{CommandKey, RunId, ToolName};

use sluice_core::catalog::path_segment as segment;

/// The longest a submission is held by the server per request (`Prefer: wait`).
const WAIT_PER_REQUEST_S: u64 = 25;
/// How often a 503 (ledger or backlog) is retried before the call gives up. A retry re-submits
/// the same key and arguments, so it cannot make a second effect.
const UNAVAILABLE_RETRIES: u32 = 5;
/// The first wait before a 503 is retried; doubled each time.
const UNAVAILABLE_BACKOFF: Duration = Duration::from_millis(400);

/// A tool of the catalog as MCP shows it.
#[derive(Debug, Clone)]
pub struct ListedTool {
    /// The MCP name: `namespace__name` (MCP and most model APIs allow no `/` in a tool name).
    pub mcp_name: String,
    pub tool: ToolName,
    pub description: String,
    pub schema: Value,
    pub semantics: String,
    pub needs_approval: bool,
    pub compensable: bool,
}

/// The MCP name of a catalog tool.
pub fn mcp_name(tool: &ToolName) -> String {
    format!("{}__{}", tool.namespace(), tool.name())
}

/// What became of one call, as the model is told it.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Whether the model should treat the call as failed.
    pub is_error: bool,
    /// One line for the model: what happened and what it (or a person) can do.
    pub message: String,
    /// The facts: status, run, command key, result, external reference.
    pub details: Value,
    /// Sluice could not say what became of the call (unavailable or unreachable): its
    /// position stays open, and the same call again takes it and asks after the same command.
    pub retry_same: bool,
}

/// Why Sluice could not say what became of a call.
#[derive(Debug, Clone, PartialEq)]
enum Unanswered {
    /// It answered with a 5xx.
    Status { status: u16, code: String },
    /// It could not be reached, or its answer was lost.
    Unreachable(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status { status, code } => write!(f, "Sluice answered {status} {code}"),
            Self::Unreachable(reason) => write!(f, "Sluice could not be reached: {reason}"),
        }
    }
}

impl Unanswered {
    fn of(status: StatusCode, body: &Value) -> Self {
        Self::Status {
            status: status.as_u16(),
            code: body["error"]["code"].as_str().unwrap_or("error").to_owned(),
        }
    }
}

/// The bridge's failures that are not a tool's outcome (listing the tools).
#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("cannot reach Sluice at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("Sluice answered {status} to {what}: {body}")]
    Refused {
        status: u16,
        what: String,
        body: String,
    },
}

/// How one call is submitted, besides its keys and arguments.
#[derive(Debug, Clone)]
pub struct Calling<'a> {
    /// The caller's trace: sent as the W3C `traceparent` and `tracestate` headers, which the
    /// command keeps (its events and upstream calls carry it).
    pub trace: Option<&'a TraceContext>,
    /// The longest the call waits for its effect to settle.
    pub wait: Duration,
    /// When it runs: `delay_ms` or `not_before`, as the client named them (the API checks
    /// them); empty for now.
    pub when: serde_json::Map<String, Value>,
}

/// The producer's API, as `sluice mcp` uses it.
#[derive(Debug)]
pub struct Bridge {
    http: reqwest::Client,
    base: String,
    /// How long one call waits for its effect to settle before answering "still running".
    max_wait: Duration,
    /// The first wait before a 503 is retried.
    backoff: Duration,
}

impl Bridge {
    pub fn new(base: &str, max_wait: Duration) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_owned(),
            max_wait,
            backoff: UNAVAILABLE_BACKOFF,
        }
    }

    /// The catalog's tools, from `GET /v1/tools`, with `token`.
    pub async fn tools(&self, token: Option<&str>) -> Result<Vec<ListedTool>, BridgeError> {
        let (status, body) = self
            .call(Method::GET, "/v1/tools", None, token, None, None)
            .await?;
        if status != StatusCode::OK {
            return Err(refused(status, "GET /v1/tools", &body));
        }
        let tools = body["tools"].as_array().cloned().unwrap_or_default();
        Ok(tools
            .iter()
            .filter_map(|t| {
                let tool = ToolName::parse(t["name"].as_str()?).ok()?;
                let semantics = t["semantics"].as_str().unwrap_or("IDEMPOTENT").to_owned();
                let needs_approval =
                    t["requires_approval"] == json!(true) || !t["approve_above"].is_null();
                let mut description = t["description"].as_str().unwrap_or_default().to_owned();
                description.push_str(&format!(
                    " [Sluice: {semantics}; recorded before it runs{}]",
                    if needs_approval {
                        "; may wait for a person's approval"
                    } else {
                        ""
                    }
                ));
                Some(ListedTool {
                    mcp_name: mcp_name(&tool),
                    tool,
                    description,
                    schema: t["args_schema"].clone(),
                    semantics,
                    needs_approval,
                    compensable: t["compensable"] == json!(true),
                })
            })
            .collect())
    }

    /// Checks that Sluice knows `token` (`GET /v1/whoami`): what `initialize` asks before a
    /// client is told it is connected.
    pub async fn check_token(&self, token: Option<&str>) -> Result<(), BridgeError> {
        let (status, body) = self
            .call(Method::GET, "/v1/whoami", None, token, None, None)
            .await?;
        if status == StatusCode::OK {
            return Ok(());
        }
        Err(refused(status, "GET /v1/whoami", &body))
    }

    /// Where the producer's API is.
    pub fn url(&self) -> &str {
        &self.base
    }

    /// The longest one call waits for its effect to settle (`--max-wait-s`).
    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    /// Submits the call as an effect ([`Calling`] says how) and follows it until it settles or
    /// the call's wait passes.
    pub async fn run_call(
        &self,
        run: &RunId,
        key: &CommandKey,
        args: Value,
        token: Option<&str>,
        calling: &Calling<'_>,
    ) -> Outcome {
        let mut submission = json!({
            "run_id": run,
            "decision": key.decision(),
            "tool": key.tool().to_string(),
            "call_idx": key.call_idx(),
            "args": args,
        });
        if let Value::Object(fields) = &mut submission {
            fields.extend(calling.when.clone());
        }
        let trace = calling.trace;
        let max_wait = calling.wait;
        let wait = WAIT_PER_REQUEST_S.min(max_wait.as_secs().max(1));
        let prefer = format!("wait={wait}");
        let mut backoff = self.backoff;
        let mut tries = 0;
        let submitted = loop {
            let answer = self
                .call(
                    Method::POST,
                    "/v1/effects",
                    Some(&submission),
                    token,
                    Some(&prefer),
                    trace,
                )
                .await;
            if matches!(&answer, Ok((StatusCode::SERVICE_UNAVAILABLE, _)))
                && tries < UNAVAILABLE_RETRIES
            {
                tries += 1;
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                continue;
            }
            break answer;
        };
        match submitted {
            Ok((status, body)) if matches!(status.as_u16(), 200..=202) => {
                // A business key held by another command answers with that command, possibly
                // of another run: it is the effect, so it is followed and named by its own keys.
                let held = held_by_business_key(&body);
                let (run, key) = held.as_ref().map_or((run, key), |(run, key)| (run, key));
                let outcome = if status == StatusCode::ACCEPTED {
                    self.follow(run, key, &body, token, max_wait).await
                } else {
                    settled(run, key, &body)
                };
                match &held {
                    Some((run, key)) => found_by_business_key(outcome, run, key),
                    None => outcome,
                }
            }
            Ok((status, body)) => match status.as_u16() {
                500..=599 => {
                    self.look_up(run, key, token, Unanswered::of(status, &body))
                        .await
                }
                _ => refusal(run, key, status, &body),
            },
            Err(e) => {
                self.look_up(run, key, token, Unanswered::Unreachable(e.to_string()))
                    .await
            }
        }
    }

    /// Long-polls a command that was still running when the submission's wait passed
    /// (`known`, as the submission answered it).
    async fn follow(
        &self,
        run: &RunId,
        key: &CommandKey,
        known: &Value,
        token: Option<&str>,
        max_wait: Duration,
    ) -> Outcome {
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut known = known.clone();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = left.as_secs().clamp(1, WAIT_PER_REQUEST_S);
            let (status, body) = match self.command(run, key, token, Some(wait)).await {
                Ok(answer) => answer,
                Err(e) => {
                    return unfollowed(run, key, &known, &Unanswered::Unreachable(e.to_string()));
                }
            };
            if status != StatusCode::OK {
                // Recorded (the submission said so): whatever the follow-up got, it runs.
                return unfollowed(run, key, &known, &Unanswered::of(status, &body));
            }
            let outcome = settled(run, key, &body);
            if !is_running(&body) || tokio::time::Instant::now() >= deadline {
                return outcome;
            }
            known = body;
        }
    }

    /// Asks whether a call Sluice did not answer was recorded, and tells the model what is known.
    async fn look_up(
        &self,
        run: &RunId,
        key: &CommandKey,
        token: Option<&str>,
        why: Unanswered,
    ) -> Outcome {
        match self.command(run, key, token, None).await {
            Ok((StatusCode::OK, command)) => unfollowed(run, key, &command, &why),
            Ok((StatusCode::NOT_FOUND, _)) => unrecorded(run, key, &why),
            Ok(_) | Err(_) => unknown(run, key, &why),
        }
    }

    /// `GET` one command, holding the answer up to `wait` seconds for it to settle.
    pub async fn command(
        &self,
        run: &RunId,
        key: &CommandKey,
        token: Option<&str>,
        wait: Option<u64>,
    ) -> Result<(StatusCode, Value), BridgeError> {
        let mut path = format!("/v1/runs/{run}/effects/{}", segment(key.as_str()));
        if let Some(wait) = wait {
            path.push_str(&format!("?wait={wait}s"));
        }
        self.call(Method::GET, &path, None, token, None, None).await
    }

    /// Cancels one command (`POST …:cancel`, the API's cancel, which says whether it may), for
    /// `reason`.
    pub async fn cancel(
        &self,
        run: &RunId,
        key: &CommandKey,
        token: Option<&str>,
        reason: &str,
    ) -> Result<(StatusCode, Value), BridgeError> {
        let path = format!(
            "/v1/runs/{}/effects/{}:cancel",
            segment(run.as_str()),
            segment(key.as_str())
        );
        let body = json!({ "reason": reason });
        self.call(Method::POST, &path, Some(&body), token, None, None)
            .await
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        token: Option<&str>,
        prefer: Option<&str>,
        trace: Option<&TraceContext>,
    ) -> Result<(StatusCode, Value), BridgeError> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(trace) = trace {
            request = request.header("traceparent", &trace.traceparent);
            if let Some(tracestate) = &trace.tracestate {
                request = request.header("tracestate", tracestate);
            }
        }
        if let Some(prefer) = prefer {
            request = request.header("prefer", prefer);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let unreachable = |e: reqwest::Error| BridgeError::Unreachable {
            url: self.base.clone(),
            reason: e.to_string(),
        };
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let text = response.text().await.map_err(unreachable)?;
        Ok((
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        ))
    }
}

fn refused(status: StatusCode, what: &str, body: &Value) -> BridgeError {
    BridgeError::Refused {
        status: status.as_u16(),
        what: what.to_owned(),
        body: body.to_string(),
    }
}

fn is_running(command: &Value) -> bool {
    matches!(
        command["status"].as_str(),
        Some("SCHEDULED" | "PENDING" | "APPROVED" | "LEASED" | "UNKNOWN" | "COMPENSATING")
    )
}

/// The keys of the command a submission was answered with when another command held the
/// tool's business key (`existing: "business_key"`).
fn held_by_business_key(answer: &Value) -> Option<(RunId, CommandKey)> {
    if answer["existing"] != json!("business_key") {
        return None;
    }
    let run = RunId::parse(answer["run_id"].as_str()?).ok()?;
    let key = CommandKey::parse(answer["command_key"].as_str()?).ok()?;
    Some((run, key))
}

/// `outcome` of the command `run`/`key` found by its business key, told as that: the call made
/// no new effect.
fn found_by_business_key(mut outcome: Outcome, run: &RunId, key: &CommandKey) -> Outcome {
    outcome.message = format!(
        "not made again: an effect with the same business key was already recorded (run {run}, command {key}), and this is it: {}",
        outcome.message
    );
    outcome.details["existing"] = json!("business_key");
    outcome
}

/// The outcome of a command as it stands.
pub(super) fn settled(run: &RunId, key: &CommandKey, command: &Value) -> Outcome {
    let status = command["status"].as_str().unwrap_or("UNKNOWN");
    let details = json!({
        "status": status,
        "run_id": run,
        "command_key": key.as_str(),
        "external_ref": command["external_ref"],
        "result": command["result"],
    });
    let person = format!("run {run}, command {key}");
    let (is_error, message) = match status {
        "CONFIRMED" => (false, format!("done ({status})")),
        "BLOCKED" => (
            false,
            format!(
                "waiting for a person to approve it ({person}); it has not run. Do not call it again: ask for approval, or go on without it"
            ),
        ),
        "STUCK" => (
            false,
            format!(
                "its outcome is unknown and a person must settle it ({person}); do not call it again, it may have happened"
            ),
        ),
        "SCHEDULED" => (false, format!("scheduled; it runs later ({person})")),
        "FAILED" => (
            true,
            format!(
                "it failed and did not happen ({person}): {}",
                reason_of(command)
            ),
        ),
        "CANCELLED" => (
            true,
            match (
                command["rejection"]["by"].as_str(),
                command["rejection"]["reason"].as_str(),
            ) {
                (Some(by), Some(why)) => format!(
                    "{by} rejected it and it did not happen ({person}): {why}. Do not call it again as it was: change what they objected to, or go on without it"
                ),
                _ => format!("it was cancelled and did not happen ({person})"),
            },
        ),
        "COMPENSATING" | "COMPENSATED" | "NO_COMPENSATION" | "COMPENSATION_FAILED" => {
            (true, format!("it was rolled back ({status}, {person})"))
        }
        _ => (
            false,
            format!(
                "still running ({status}, {person}); it will finish on its own. Do not call it again"
            ),
        ),
    };
    let (message, details) = with_edits(command, message, details);
    Outcome {
        is_error,
        message,
        details,
        retry_same: false,
    }
}

/// The outcome told with the approvers' edits of the command's arguments, if any: who changed
/// which fields (old → new, a secret one by name only) and why, in the message and the details.
fn with_edits(command: &Value, message: String, mut details: Value) -> (String, Value) {
    let Some(revisions) = command["revisions"].as_array().filter(|r| !r.is_empty()) else {
        return (message, details);
    };
    let told: Vec<String> = revisions
        .iter()
        .map(|revision| {
            let changes: Vec<String> = revision["changes"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|change| {
                    let pointer = change["pointer"].as_str().unwrap_or("?");
                    match (change.get("old"), change.get("new")) {
                        (_, _) if change["secret"] == json!(true) => format!("{pointer} (secret)"),
                        (Some(old), Some(new)) => format!("{pointer} from {old} to {new}"),
                        (None, Some(new)) => format!("{pointer} set to {new}"),
                        (Some(_), None) => format!("{pointer} removed"),
                        (None, None) => pointer.to_owned(),
                    }
                })
                .collect();
            format!(
                "{} changed {} ({})",
                revision["by"].as_str().unwrap_or("an approver"),
                changes.join(", "),
                revision["reason"].as_str().unwrap_or("")
            )
        })
        .collect();
    details["revisions"] = json!(
        revisions
            .iter()
            .map(|r| json!({"number": r["number"], "by": r["by"], "reason": r["reason"], "changes": r["changes"]}))
            .collect::<Vec<_>>()
    );
    (
        format!(
            "{message}. An approver edited its arguments before it ran, so it ran with theirs, not yours: {}. Do not call it again with your arguments",
            told.join("; ")
        ),
        details,
    )
}

/// How the model is told to ask after a call Sluice did not answer.
const ASK_AGAIN: &str = "call it again with the same arguments: that takes the same position, so it asks after this command and runs it at most once";

/// A call that was recorded, whose outcome Sluice could not follow (`command` as last seen):
/// running, it is said so; settled already, its outcome.
fn unfollowed(run: &RunId, key: &CommandKey, command: &Value, why: &Unanswered) -> Outcome {
    let mut outcome = settled(run, key, command);
    if !is_running(command) {
        return outcome;
    }
    let status = outcome.details["status"].clone();
    outcome.message = format!(
        "recorded and running ({}, run {run}, command {key}), but Sluice could not follow it ({why}). It will finish on its own; to learn its result, {ASK_AGAIN}",
        status.as_str().unwrap_or("UNKNOWN")
    );
    outcome.is_error = false;
    outcome.retry_same = true;
    outcome.details["unanswered"] = Value::String(why.to_string());
    outcome
}

/// A call Sluice did not answer and had not recorded when asked after.
fn unrecorded(run: &RunId, key: &CommandKey, why: &Unanswered) -> Outcome {
    Outcome {
        is_error: true,
        message: format!(
            "not done: Sluice did not take the call ({why}) and had not recorded it when asked (run {run}, command {key}); {ASK_AGAIN}"
        ),
        details: json!({
            "status": "NOT_RECORDED",
            "run_id": run,
            "command_key": key.as_str(),
            "unanswered": why.to_string(),
        }),
        retry_same: true,
    }
}

/// A call Sluice did not answer and could not be asked about: it may have been recorded.
fn unknown(run: &RunId, key: &CommandKey, why: &Unanswered) -> Outcome {
    Outcome {
        is_error: true,
        message: format!(
            "unknown: Sluice did not answer ({why}), so whether this call was recorded and runs is not known (run {run}, command {key}); {ASK_AGAIN}"
        ),
        details: json!({
            "status": "UNANSWERED",
            "run_id": run,
            "command_key": key.as_str(),
            "unanswered": why.to_string(),
        }),
        retry_same: true,
    }
}

fn reason_of(command: &Value) -> &str {
    command["last_error"]
        .as_str()
        .unwrap_or("no reason recorded")
}

/// A submission the producer refused (4xx): nothing was recorded, and the model is told why.
fn refusal(run: &RunId, key: &CommandKey, status: StatusCode, body: &Value) -> Outcome {
    let code = body["error"]["code"].as_str().unwrap_or("error");
    let text = body["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| body.to_string());
    let message = match code {
        "argument_drift" => format!(
            "refused: this position of run {run} ({key}) already holds a call with other arguments; a re-driven agent must repeat its calls in the same order with the same arguments"
        ),
        "run_rolled_back" => format!("refused: run {run} was rolled back and takes no new effects"),
        "invalid_args" | "invalid" => format!("refused, the arguments do not fit the tool: {text}"),
        _ => format!("refused ({}, {code}): {text}", status.as_u16()),
    };
    Outcome {
        is_error: true,
        retry_same: false,
        message,
        details: json!({
            "status": "REFUSED",
            "http_status": status.as_u16(),
            "code": code,
            "run_id": run,
            "command_key": key.as_str(),
            "error": body["error"],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (RunId, CommandKey) {
        let tool = ToolName::parse("payments/wire").expect("tool");
        (
            RunId::parse("r-1").expect("run"),
            CommandKey::new(1, tool, 0),
        )
    }

    #[test]
    fn a_person_s_wait_is_not_an_error_and_names_the_command() {
        let (run, key) = key();
        for status in ["BLOCKED", "STUCK"] {
            let outcome = settled(&run, &key, &json!({"status": status}));
            assert!(!outcome.is_error, "{status}");
            assert!(
                outcome.message.contains("d-1/payments/wire/0"),
                "{outcome:?}"
            );
            assert!(outcome.message.contains("person"), "{outcome:?}");
        }
    }

    #[test]
    fn failures_and_rollbacks_are_errors_and_confirmed_is_not() {
        let (run, key) = key();
        let confirmed = settled(
            &run,
            &key,
            &json!({"status": "CONFIRMED", "result": {"id": 7}}),
        );
        assert!(!confirmed.is_error);
        assert_eq!(confirmed.details["result"], json!({"id": 7}));
        for status in ["FAILED", "CANCELLED", "COMPENSATED"] {
            assert!(settled(&run, &key, &json!({"status": status})).is_error);
        }
    }

    #[test]
    fn an_edit_tells_the_model_who_changed_which_arguments_and_why() {
        let run = RunId::parse("r-1").expect("run");
        let key = CommandKey::parse("d-1/payments/wire/0").expect("key");
        let outcome = settled(
            &run,
            &key,
            &json!({"status": "CONFIRMED", "revisions": [{"number": 1, "by": "alice", "reason": "invoice says 900", "changes": [
                {"pointer": "/amount_minor", "kind": "changed", "old": 1500, "new": 900},
                {"pointer": "/pin", "kind": "changed", "secret": true}
            ]}]}),
        );
        assert!(!outcome.is_error);
        assert!(
            outcome.message.contains(
                "alice changed /amount_minor from 1500 to 900, /pin (secret) (invoice says 900)"
            ),
            "{}",
            outcome.message
        );
        assert_eq!(outcome.details["revisions"][0]["by"], "alice");
        let plain = settled(&run, &key, &json!({"status": "CONFIRMED"}));
        assert!(!plain.message.contains("edited"), "{}", plain.message);
    }

    #[test]
    fn a_rejection_tells_the_model_who_refused_and_why() {
        let (run, key) = key();
        let rejected = settled(
            &run,
            &key,
            &json!({"status": "CANCELLED", "rejection": {"by": "alice", "reason": "wrong beneficiary", "at": "2026-12-07T10:00:00Z"}}),
        );
        assert!(rejected.is_error);
        assert!(
            rejected
                .message
                .contains("alice rejected it and it did not happen"),
            "{}",
            rejected.message
        );
        assert!(
            rejected.message.contains(": wrong beneficiary."),
            "{}",
            rejected.message
        );
    }

    #[test]
    fn drift_tells_the_model_what_re_driving_needs() {
        let (run, key) = key();
        let outcome = refusal(
            &run,
            &key,
            StatusCode::CONFLICT,
            &json!({"error": {"code": "argument_drift", "message": "m"}}),
        );
        assert!(outcome.is_error);
        assert!(outcome.message.contains("same order"), "{outcome:?}");
    }

    /// A producer that recorded the call and then could not say what became of it: `submit`
    /// answers every submission, the effect stands as `status` when asked after.
    async fn producer(
        submit: (axum::http::StatusCode, Value),
        asked: (axum::http::StatusCode, Value),
    ) -> String {
        let app = axum::Router::new()
            .route(
                "/v1/effects",
                axum::routing::post(move || async move { (submit.0, axum::Json(submit.1)) }),
            )
            .route(
                "/v1/runs/{run}/effects/{key}",
                axum::routing::get(move || async move { (asked.0, axum::Json(asked.1)) }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn unavailable() -> (axum::http::StatusCode, Value) {
        (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            json!({"error": {"code": "ledger_unavailable", "message": "the ledger did not answer"}}),
        )
    }

    fn leased() -> Value {
        json!({"status": "LEASED", "run_id": "r-1", "command_key": "d-1/payments/wire/0"})
    }

    fn says_recorded_and_running(outcome: &Outcome) {
        assert_eq!(outcome.details["status"], json!("LEASED"), "{outcome:?}");
        assert!(!outcome.message.contains("refused"), "{outcome:?}");
        assert!(outcome.message.contains("recorded"), "{outcome:?}");
        assert!(outcome.message.contains("same arguments"), "{outcome:?}");
        assert!(!outcome.is_error, "it runs: {outcome:?}");
        assert!(outcome.retry_same, "its position stays open: {outcome:?}");
    }

    /// A call made now, waiting as long as [`quick`] lets it.
    fn now() -> Calling<'static> {
        Calling {
            trace: None,
            wait: Duration::from_secs(2),
            when: serde_json::Map::new(),
        }
    }

    /// A bridge that retries a 503 without waiting long.
    fn quick(url: &str) -> Bridge {
        Bridge {
            backoff: Duration::from_millis(1),
            ..Bridge::new(url, Duration::from_secs(2))
        }
    }

    #[tokio::test]
    async fn a_503_for_a_call_not_recorded_says_so_and_never_refused() {
        let (run, key) = key();
        let not_found = (
            axum::http::StatusCode::NOT_FOUND,
            json!({"error": {"code": "unknown_command", "message": "no command"}}),
        );
        let url = producer(unavailable(), not_found).await;
        let outcome = quick(&url)
            .run_call(&run, &key, json!({}), Some("t"), &now())
            .await;
        assert_eq!(
            outcome.details["status"],
            json!("NOT_RECORDED"),
            "{outcome:?}"
        );
        assert!(outcome.is_error && outcome.retry_same, "{outcome:?}");
        assert!(outcome.message.contains("same arguments"), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_sluice_that_cannot_be_asked_leaves_the_call_unknown() {
        let (run, key) = key();
        // A port nobody listens on.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let url = format!("http://{}", listener.local_addr().expect("an address"));
        drop(listener);
        let outcome = quick(&url)
            .run_call(&run, &key, json!({}), Some("t"), &now())
            .await;
        assert_eq!(
            outcome.details["status"],
            json!("UNANSWERED"),
            "{outcome:?}"
        );
        assert!(outcome.is_error && outcome.retry_same, "{outcome:?}");
        assert!(outcome.message.contains("not known"), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_503_for_a_call_that_settled_meanwhile_gives_its_outcome() {
        let (run, key) = key();
        let done = json!({"status": "CONFIRMED", "external_ref": "w-1", "result": {"id": "w-1"}});
        let url = producer(unavailable(), (axum::http::StatusCode::OK, done)).await;
        let outcome = quick(&url)
            .run_call(&run, &key, json!({}), Some("t"), &now())
            .await;
        assert_eq!(outcome.details["external_ref"], json!("w-1"), "{outcome:?}");
        assert!(!outcome.is_error && !outcome.retry_same, "{outcome:?}");
    }

    #[tokio::test]
    async fn a_refusal_spends_the_position() {
        let (run, key) = key();
        let drift = (
            axum::http::StatusCode::CONFLICT,
            json!({"error": {"code": "argument_drift", "message": "m"}}),
        );
        let url = producer(drift, (axum::http::StatusCode::OK, leased())).await;
        let outcome = quick(&url)
            .run_call(&run, &key, json!({}), Some("t"), &now())
            .await;
        assert_eq!(outcome.details["status"], json!("REFUSED"), "{outcome:?}");
        assert!(outcome.is_error && !outcome.retry_same, "{outcome:?}");
    }

    #[tokio::test]
    async fn a_503_after_the_call_was_recorded_says_it_runs() {
        let (run, key) = key();
        let url = producer(unavailable(), (axum::http::StatusCode::OK, leased())).await;
        let outcome = quick(&url)
            .run_call(&run, &key, json!({}), Some("t"), &now())
            .await;
        says_recorded_and_running(&outcome);
    }

    #[tokio::test]
    async fn a_call_answered_by_business_key_names_the_command_that_holds_it() {
        let (run, key) = key();
        let holder = |status: &str| {
            json!({"status": status, "run_id": "r-abc", "command_key": "d-3/payments/wire/0",
                   "existing": "business_key", "external_ref": "w-1"})
        };
        // Settled at once, or followed by the holder's own keys (only those are known here).
        for submit in [axum::http::StatusCode::OK, axum::http::StatusCode::ACCEPTED] {
            let status = if submit == axum::http::StatusCode::OK {
                "CONFIRMED"
            } else {
                "LEASED"
            };
            let answer = holder(status);
            let app = axum::Router::new()
                .route(
                    "/v1/effects",
                    axum::routing::post(move || async move { (submit, axum::Json(answer)) }),
                )
                .route(
                    "/v1/runs/{run}/effects/{key}",
                    axum::routing::get(
                        move |axum::extract::Path((run, _)): axum::extract::Path<(
                            String,
                            String,
                        )>| async move {
                            if run == "r-abc" {
                                (
                                    axum::http::StatusCode::OK,
                                    axum::Json(json!({
                                    "status": "CONFIRMED", "run_id": "r-abc",
                                    "command_key": "d-3/payments/wire/0", "external_ref": "w-1"})),
                                )
                            } else {
                                (
                                    axum::http::StatusCode::NOT_FOUND,
                                    axum::Json(json!({
                                    "error": {"code": "unknown_command", "message": "none"}})),
                                )
                            }
                        },
                    ),
                );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let url = format!("http://{}", listener.local_addr().expect("an address"));
            tokio::spawn(async move { axum::serve(listener, app).await });
            let outcome = quick(&url)
                .run_call(&run, &key, json!({}), Some("t"), &now())
                .await;
            assert_eq!(outcome.details["status"], json!("CONFIRMED"), "{outcome:?}");
            assert_eq!(outcome.details["run_id"], json!("r-abc"), "{outcome:?}");
            assert_eq!(
                outcome.details["command_key"],
                json!("d-3/payments/wire/0"),
                "{outcome:?}"
            );
            assert_eq!(outcome.details["existing"], json!("business_key"));
            assert!(
                outcome.message.contains("same business key") && outcome.message.contains("r-abc"),
                "{outcome:?}"
            );
            assert!(!outcome.is_error, "{outcome:?}");
        }
    }

    #[tokio::test]
    async fn a_503_while_following_a_recorded_call_says_it_runs() {
        let (run, key) = key();
        let url = producer((axum::http::StatusCode::ACCEPTED, leased()), unavailable()).await;
        let outcome = quick(&url)
            .run_call(&run, &key, json!({}), Some("t"), &now())
            .await;
        says_recorded_and_running(&outcome);
    }
}
