//! What `sluice mcp` does for one tool call: it places the call in its run's journal, submits
//! it to the producer's API as an effect with `Prefer: wait`, follows it to a settled state,
//! and says what happened in terms a model can act on.
//!
//! Nothing here decides anything about the effect: the producer records it before it runs and
//! the pipeline carries it out. The bridge only keeps the journal position (so a re-driven
//! agent gets the same keys, and the stored results back) and maps each answer to a tool result.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_core::journal::Journal;
use sluice_core::{CommandKey, RunId, ToolName};

use crate::console::segment;

/// The longest a submission is held by the server per request (`Prefer: wait`).
const WAIT_PER_REQUEST_S: u64 = 25;
/// How often a 503 (ledger or backlog) is retried before the call gives up.
const UNAVAILABLE_RETRIES: u32 = 5;

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
}

/// The bridge's failures that are not a tool's outcome: the call never reached the ledger.
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

/// The producer's API, as `sluice mcp` uses it, and the journals of the runs it serves. It has
/// no token of its own: each request carries the one its caller is entitled to (`sluice mcp`
/// decides whose, [`super::credential`]).
#[derive(Debug)]
pub struct Bridge {
    http: reqwest::Client,
    base: String,
    /// How long one call waits for its effect to settle before answering "still running".
    max_wait: Duration,
    journals: Mutex<HashMap<RunId, Journal>>,
}

impl Bridge {
    pub fn new(base: &str, max_wait: Duration) -> Self {
        Self {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_owned(),
            max_wait,
            journals: Mutex::new(HashMap::new()),
        }
    }

    /// The catalog's tools, from `GET /v1/tools`, with `token`.
    pub async fn tools(&self, token: Option<&str>) -> Result<Vec<ListedTool>, BridgeError> {
        let (status, body) = self
            .call(Method::GET, "/v1/tools", None, token, None)
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

    /// The journal position of the next call of `tool` in `run`; `decision`, when the client
    /// names one, moves the journal to it (call indexes restart when it changes).
    pub fn next_key(&self, run: &RunId, tool: &ToolName, decision: Option<u32>) -> CommandKey {
        let mut journals = self
            .journals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let journal = journals.entry(run.clone()).or_default();
        if let Some(decision) = decision {
            journal.move_to(decision);
        }
        journal.next_call(tool)
    }

    /// Submits the call as an effect and follows it until it settles or `max_wait` passes.
    pub async fn run_call(
        &self,
        run: &RunId,
        key: &CommandKey,
        args: Value,
        token: Option<&str>,
    ) -> Result<Outcome, BridgeError> {
        let submission = json!({
            "run_id": run,
            "decision": key.decision(),
            "tool": key.tool().to_string(),
            "call_idx": key.call_idx(),
            "args": args,
        });
        let wait = WAIT_PER_REQUEST_S.min(self.max_wait.as_secs().max(1));
        let prefer = format!("wait={wait}");
        let mut tries = 0;
        let (status, body) = loop {
            let (status, body) = self
                .call(
                    Method::POST,
                    "/v1/effects",
                    Some(&submission),
                    token,
                    Some(&prefer),
                )
                .await?;
            if status == StatusCode::SERVICE_UNAVAILABLE && tries < UNAVAILABLE_RETRIES {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200 << tries)).await;
                continue;
            }
            break (status, body);
        };
        match status.as_u16() {
            200 | 201 => Ok(settled(run, key, &body)),
            202 => self.follow(run, key, token).await,
            _ => Ok(refusal(run, key, status, &body)),
        }
    }

    /// Long-polls a command that was still running when the submission's wait passed.
    async fn follow(
        &self,
        run: &RunId,
        key: &CommandKey,
        token: Option<&str>,
    ) -> Result<Outcome, BridgeError> {
        let deadline = tokio::time::Instant::now() + self.max_wait;
        let path = format!("/v1/runs/{run}/effects/{}", segment(key.as_str()));
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = left.as_secs().clamp(1, WAIT_PER_REQUEST_S);
            let (status, body) = self
                .call(
                    Method::GET,
                    &format!("{path}?wait={wait}s"),
                    None,
                    token,
                    None,
                )
                .await?;
            if status != StatusCode::OK {
                return Ok(refusal(run, key, status, &body));
            }
            let outcome = settled(run, key, &body);
            if !is_running(&body) || tokio::time::Instant::now() >= deadline {
                return Ok(outcome);
            }
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        token: Option<&str>,
        prefer: Option<&str>,
    ) -> Result<(StatusCode, Value), BridgeError> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
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

/// The outcome of a command as it stands.
fn settled(run: &RunId, key: &CommandKey, command: &Value) -> Outcome {
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
            format!("it was cancelled and did not happen ({person})"),
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
    Outcome {
        is_error,
        message,
        details,
    }
}

fn reason_of(command: &Value) -> &str {
    command["last_error"]
        .as_str()
        .unwrap_or("no reason recorded")
}

/// A submission the producer refused: nothing was recorded, and the model is told why.
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
}
