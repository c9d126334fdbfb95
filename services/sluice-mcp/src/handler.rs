//! The MCP methods `sluice mcp` answers ([`ServerHandler`] for [`SluiceMcp`]): the handshake
//! (its token checked with Sluice), `server/discover`, `tools/list`, `tools/call` (placed in its
//! run's journal, [`super::position`], then run through the producer's API,
//! [`super::bridge`]) and the Tasks extension's `tasks/get` and `tasks/cancel`
//! ([`super::tasks`]).
//!
//! **Where a call's position comes from**, first that applies: the position it names
//! (`dev.sluice/call`, with `dev.sluice/decision`), the same key on any replica; else the
//! conversation it names (`dev.sluice/conversation`, [`super::conversations`]); else its
//! session's (HTTP, handshake versions) or the process's (stdio). A request with none of these
//! (MCP 2026-07-28 over HTTP has no session) is refused with what to name.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, DiscoverResult, GetTaskParams, GetTaskResult, Implementation,
    ListToolsResult, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    TaskStatus, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use sluice_core::trace::TraceContext;
use sluice_core::{CommandKey, RunId, ToolName};

use super::bridge::{BridgeError, Calling, ListedTool, Outcome, settled};
use super::position::{Call, Conversation};
use super::{
    META_CALL, META_CONVERSATION, META_DECISION, META_DELAY_MS, META_NOT_BEFORE, META_RUN_ID,
    SluiceMcp, Transport, bearer, conversations, credential, tasks,
};

/// How long a call of a client that takes tasks waits for its effect before it is answered
/// with a task (the pipeline's usual work is done well within it; what waits for a person or
/// a schedule is answered at once).
const TASK_WAIT: Duration = Duration::from_secs(5);

/// The error `initialize` answers when Sluice refuses the caller's token (or cannot be
/// reached): the client shows it at connection, before any tool is listed. Never the token.
fn unusable_token(error: &BridgeError, transport: Transport, url: &str) -> ErrorData {
    let message = match error {
        BridgeError::Refused { status: 401, .. } => match transport {
            Transport::Stdio => format!(
                "the token is not recognised by Sluice at {url}: set SLUICE_TOKEN (or --token) to a token of its [[auth.tokens]] (sluice dev prints one)"
            ),
            Transport::Http => format!(
                "the bearer token is not recognised by Sluice at {url}: send a token of its [[auth.tokens]] in Authorization"
            ),
        },
        other => format!("sluice mcp cannot check its token with Sluice: {other}"),
    };
    ErrorData::new(rmcp::model::ErrorCode(-32001), message, None)
}

/// What the HTTP transport knows of the caller: its bearer token and its session.
fn http_caller(context: &RequestContext<RoleServer>) -> (Option<String>, Option<String>) {
    let Some(parts) = context.extensions.get::<axum::http::request::Parts>() else {
        return (None, None);
    };
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (bearer(&parts.headers), session)
}

/// A `_meta` field that must be a non-negative 32-bit integer.
fn meta_index(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
    key: &str,
) -> Result<Option<u32>, ErrorData> {
    meta_field(request, context, key)
        .map(|value| {
            value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ErrorData::invalid_params(
                        format!("_meta {key} must be a non-negative integer"),
                        None,
                    )
                })
        })
        .transpose()
}

/// The run of a session: `mcp-` and the session id's characters a run id allows.
fn session_run(session: &str) -> Option<RunId> {
    let kept: String = session
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
        .take(120)
        .collect();
    (!kept.is_empty())
        .then(|| RunId::parse(&format!("mcp-{kept}")).ok())
        .flatten()
}

fn meta_field<'m>(
    request: &'m CallToolRequestParams,
    context: &'m RequestContext<RoleServer>,
    key: &str,
) -> Option<&'m Value> {
    request
        .meta
        .as_ref()
        .and_then(|m| m.0.0.get(key))
        .or_else(|| context.meta.0.0.get(key))
}

fn text_result(outcome: &Outcome) -> CallToolResult {
    let mut details = outcome.details.clone();
    if let Value::Object(map) = &mut details {
        map.insert("message".into(), Value::String(outcome.message.clone()));
    }
    let content = vec![ContentBlock::text(details.to_string())];
    let mut result = if outcome.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = Some(details);
    result
}

fn describe(tool: &ListedTool) -> Tool {
    let schema: Map<String, Value> = match &tool.schema {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    let read_only = tool.semantics == "OBSERVE_ONLY";
    let annotations = ToolAnnotations::new()
        .read_only(read_only)
        .destructive(!read_only)
        .idempotent(tool.semantics != "NON_IDEMPOTENT")
        .open_world(true);
    Tool::new(
        tool.mcp_name.clone(),
        tool.description.clone(),
        Arc::new(schema),
    )
    .with_annotations(annotations)
}

impl SluiceMcp {
    /// The conversation a call is counted in: the one it names (a new one once Sluice knows
    /// the caller's token), else its session's or process's; and whether it has an order at
    /// all.
    async fn conversation_of(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        token: Option<&str>,
        session: Option<&str>,
    ) -> Result<(Arc<Mutex<Conversation>>, bool), ErrorData> {
        let Some(raw) = meta_field(request, context, META_CONVERSATION) else {
            return Ok((
                self.conversation.clone(),
                // Over HTTP a request outside any session has no order to count by.
                self.transport == Transport::Stdio || session.is_some(),
            ));
        };
        let id = raw.as_str().unwrap_or_default();
        conversations::check_id(id).map_err(|why| {
            ErrorData::invalid_params(
                format!("_meta {META_CONVERSATION}: a conversation id {why}"),
                None,
            )
        })?;
        if let Some(known) = self.conversations.find(token, id, Instant::now()) {
            return Ok((known, true));
        }
        self.bridge
            .check_token(token)
            .await
            .map_err(|e| unusable_token(&e, self.transport, self.bridge.url()))?;
        let opened = self
            .conversations
            .open(token, id, Instant::now())
            .map_err(|full| {
                ErrorData::new(rmcp::model::ErrorCode(-32001), full.to_string(), None)
            })?;
        Ok((opened, true))
    }

    /// The run of a call: the one it names, else `--run-id`, else its session's.
    fn run_of(
        &self,
        request: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
        session: Option<&str>,
    ) -> Result<RunId, ErrorData> {
        if let Some(raw) = meta_field(request, context, META_RUN_ID) {
            let raw = raw.as_str().unwrap_or_default();
            return RunId::parse(raw)
                .map_err(|e| ErrorData::invalid_params(format!("_meta {META_RUN_ID}: {e}"), None));
        }
        match (self.run_id.clone(), session.and_then(session_run)) {
            (Some(run), _) | (None, Some(run)) => Ok(run),
            (None, None) => Err(ErrorData::invalid_params(
                format!(
                    "no run for this call: name one in _meta[\"{META_RUN_ID}\"] (a sessionless client must), or start sluice mcp with --run-id"
                ),
                None,
            )),
        }
    }
}

/// The caller's W3C trace context from the request's `_meta` (`traceparent`, `tracestate`, the
/// MCP convention); an invalid `traceparent` is ignored with its `tracestate`, as the API does.
fn trace_of(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Option<TraceContext> {
    let traceparent = meta_field(request, context, "traceparent")?.as_str()?;
    let tracestate = meta_field(request, context, "tracestate").and_then(Value::as_str);
    TraceContext::parse(traceparent, tracestate)
}

/// When the call is to run, as its `_meta` names it (`dev.sluice/delay_ms`,
/// `dev.sluice/not_before`), passed to the API as given: it checks them and says what is wrong.
fn when_of(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Map<String, Value> {
    [(META_DELAY_MS, "delay_ms"), (META_NOT_BEFORE, "not_before")]
        .into_iter()
        .filter_map(|(meta, field)| {
            meta_field(request, context, meta).map(|value| (field.to_owned(), value.clone()))
        })
        .collect()
}

/// Whether the client takes tasks: it declared the Tasks extension (at `initialize`, or in
/// this request's `_meta` when it has no session).
fn takes_tasks(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

/// A task id's command, or a clear refusal.
fn task_command(id: &str) -> Result<(RunId, CommandKey), ErrorData> {
    tasks::parse_task_id(id).map_err(|why| ErrorData::invalid_params(why, None))
}

/// The API's refusal of a task's read or cancel, passed on: the task id is no authorisation.
fn task_refused(status: u16, body: &Value, what: &str) -> ErrorData {
    let code = body["error"]["code"].as_str().unwrap_or("error");
    let message = body["error"]["message"].as_str().unwrap_or("no message");
    let said = format!("Sluice refused {what} ({status} {code}): {message}");
    match status {
        404 => ErrorData::invalid_params(said, None),
        401 | 403 | 409 | 422 => ErrorData::invalid_request(said, None),
        _ => ErrorData::internal_error(said, None),
    }
}

impl ServerHandler for SluiceMcp {
    /// Every version `rmcp` knows, over both transports: the handshake versions
    /// (2024-11-05 … 2025-11-25) with a session (HTTP) or the process (stdio) as the
    /// conversation, and 2026-07-28, stateless over HTTP, whose calls name their position or
    /// conversation in `_meta`.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::KNOWN_VERSIONS)
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("sluice", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Every tool call is recorded in Sluice's ledger before it runs and is executed \
             once. A call that waits for a person (approval, or an outcome nobody can \
             determine) says so with its command key: do not repeat it.",
        )
    }

    /// Checks the caller's token with Sluice first: a wrong token is refused here, with a
    /// message the client shows, rather than at the first `tools/list` as an internal error.
    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, ErrorData> {
        let (bearer, _) = http_caller(&context);
        let token = credential(self.transport, bearer, self.own_token.as_ref())?;
        self.bridge
            .check_token(token.as_deref())
            .await
            .map_err(|e| unusable_token(&e, self.transport, self.bridge.url()))?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    /// `server/discover` (MCP 2026-07-28) checks the caller's token as `initialize` does, so
    /// a client without a handshake learns of a wrong token when it connects.
    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let (bearer, _) = http_caller(&context);
        let token = credential(self.transport, bearer, self.own_token.as_ref())?;
        self.bridge
            .check_token(token.as_deref())
            .await
            .map_err(|e| unusable_token(&e, self.transport, self.bridge.url()))?;
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            self.get_info(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (bearer, _) = http_caller(&context);
        let token = credential(self.transport, bearer, self.own_token.as_ref())?;
        let tools = self
            .bridge
            .tools(token.as_deref())
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(
            tools.iter().map(describe).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = request
            .name
            .split_once("__")
            .and_then(|(namespace, name)| ToolName::from_parts(namespace, name).ok())
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    format!(
                        "unknown tool {:?}: Sluice's tools are named namespace__name (tools/list)",
                        request.name
                    ),
                    None,
                )
            })?;
        let (bearer, session) = http_caller(&context);
        let token = credential(self.transport, bearer, self.own_token.as_ref())?;
        let run = self.run_of(&request, &context, session.as_deref())?;
        let decision = meta_index(&request, &context, META_DECISION)?;
        let index = meta_index(&request, &context, META_CALL)?;
        let (conversation, ordered) = self
            .conversation_of(&request, &context, token.as_deref(), session.as_deref())
            .await?;
        let trace = trace_of(&request, &context);
        let with_task = takes_tasks(&context);
        let when = when_of(&request, &context);
        let args = Value::Object(request.arguments.unwrap_or_default());
        let placed = conversation
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .place(Call {
                run: &run,
                tool: &tool,
                decision,
                index,
                args: &args,
                ordered,
                abandoned: context.ct.clone(),
            })
            .map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        let key = placed.key.clone();
        let wait = if with_task {
            TASK_WAIT.min(self.bridge.max_wait())
        } else {
            self.bridge.max_wait()
        };
        let calling = Calling {
            trace: trace.as_ref(),
            wait,
            when,
        };
        let finish = |answered: bool| {
            conversation
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .finish(&placed, answered);
        };
        let outcome = tokio::select! {
            outcome = self.bridge.run_call(&run, &key, args, token.as_deref(), &calling) => outcome,
            () = context.ct.cancelled() => {
                // The client gave up on this request: nobody reads the answer, and the same
                // call again is its retry, at this position.
                finish(false);
                tracing::info!(run_id = %run, command_key = %key, "mcp tool call cancelled by the client");
                return Err(ErrorData::internal_error(
                    format!("cancelled by the client; the same call again takes the same position ({key})"),
                    None,
                ));
            }
        };
        finish(!outcome.retry_same);
        let status = outcome.details["status"].as_str().unwrap_or_default();
        if with_task && !outcome.retry_same && tasks::waits(status) {
            // The outcome's own run and key: a business key may have found another command.
            let (run, key) = outcome_command(&outcome).unwrap_or((run, key));
            let now = now_rfc3339();
            let task = rmcp::model::Task::new(
                tasks::task_id(&run, &key),
                TaskStatus::Working,
                now.clone(),
                now,
            )
            .with_status_message(outcome.message.clone())
            .with_poll_interval_ms(tasks::POLL_INTERVAL_MS);
            tracing::info!(run_id = %run, command_key = %key, status, "mcp tool call answered with a task");
            return Ok(CallToolResponse::Task(CreateTaskResult::new(task)));
        }
        tracing::info!(run_id = %run, command_key = %key, is_error = outcome.is_error, "mcp tool call");
        Ok(text_result(&outcome).into())
    }

    /// The task's command as the ledger has it now, read with the caller's token.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let (run, key) = task_command(&request.task_id)?;
        let (bearer, _) = http_caller(&context);
        let token = credential(self.transport, bearer, self.own_token.as_ref())?;
        let (status, command) = self
            .bridge
            .command(&run, &key, token.as_deref(), None)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        if status != reqwest::StatusCode::OK {
            return Err(task_refused(
                status.as_u16(),
                &command,
                "this task's command",
            ));
        }
        let outcome = settled(&run, &key, &command);
        let result = text_result(&outcome);
        Ok(GetTaskResult::new(tasks::detailed(
            &run,
            &key,
            &command,
            &outcome.message,
            result,
        )))
    }

    /// The API's cancel of the task's command, with the caller's token: what it refuses (a
    /// command already running may have reached the upstream; an agent's token may not cancel)
    /// is passed on.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (run, key) = task_command(&request.task_id)?;
        let (bearer, _) = http_caller(&context);
        let token = credential(self.transport, bearer, self.own_token.as_ref())?;
        let (status, answer) = self
            .bridge
            .cancel(
                &run,
                &key,
                token.as_deref(),
                "cancelled by its MCP client (tasks/cancel)",
            )
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        if status != reqwest::StatusCode::OK {
            return Err(task_refused(
                status.as_u16(),
                &answer,
                "to cancel this task's command",
            ));
        }
        tracing::info!(run_id = %run, command_key = %key, "mcp task cancelled");
        Ok(())
    }
}

/// The run and key an outcome names (its own command's, or the one a business key found).
fn outcome_command(outcome: &Outcome) -> Option<(RunId, CommandKey)> {
    let run = RunId::parse(outcome.details["run_id"].as_str()?).ok()?;
    let key = CommandKey::parse(outcome.details["command_key"].as_str()?).ok()?;
    Some((run, key))
}

/// Now, as RFC 3339 (a new task's creation: the API's command is not at hand).
fn now_rfc3339() -> String {
    use sluice_core::Clock;
    sluice_core::SystemClock.now().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_names_a_valid_run() {
        let run = session_run("3f2a/9b+c=").expect("a run");
        assert_eq!(run.as_str(), "mcp-3f2a9bc");
        assert!(session_run("///").is_none());
    }

    #[test]
    fn an_outcome_names_its_command() {
        let outcome = Outcome {
            is_error: false,
            message: "m".into(),
            details: serde_json::json!({"run_id": "r-abc", "command_key": "d-3/payments/wire/0"}),
            retry_same: false,
        };
        let (run, key) = outcome_command(&outcome).expect("named");
        assert_eq!(tasks::task_id(&run, &key), "r-abc/d-3/payments/wire/0");
    }

    #[test]
    fn refusals_of_a_task_say_who_refused_and_why() {
        let body = serde_json::json!({"error": {"code": "forbidden", "message": "not yours"}});
        let refused = task_refused(403, &body, "this task's command");
        assert!(
            refused.message.contains("(403 forbidden): not yours"),
            "{refused:?}"
        );
        assert_eq!(
            task_refused(404, &body, "x").code,
            rmcp::model::ErrorCode::INVALID_PARAMS
        );
    }
}
