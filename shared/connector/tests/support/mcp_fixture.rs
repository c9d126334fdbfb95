//! A real MCP server written here for the connector's tests (rmcp's server side): a notebook
//! whose notes the tests read back to check what the server did. Served over stdio by the
//! `sluice-mcp-fixture` binary and over streamable HTTP in process by `tests/mcp.rs`.
//!
//! Tools: `append` (adds a note; no annotations, so NON_IDEMPOTENT), `append_slow` (adds the
//! note, then waits `delay_ms` before answering), `notes` (read-only: the notes as text lines
//! and as `structuredContent.items`), `remove` (by id; `isError` when there is none),
//! `refuse` (always `isError`), `explode` (a JSON-RPC error: -32000, or the `code` argument).
//!
//! State: in memory, and in the JSON file `FIXTURE_STATE` names when set (read at start,
//! written after each change), so a restarted stdio server keeps its notes and a test can
//! read them. `FIXTURE_PID`: a file the server writes its process id to at start.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value, json};

/// One note, as the server keeps it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Note {
    pub id: String,
    pub text: String,
    /// The `idempotency_key` argument, when the call had one.
    pub key_argument: Option<String>,
    /// The call's `_meta`, as received.
    pub meta: Value,
    /// The names of the server's environment variables, and `FIXTURE_TOKEN`'s value: what a
    /// stdio server was given.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub token: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Notebook {
    notes: Arc<Mutex<Vec<Note>>>,
    state: Option<PathBuf>,
}

fn schema(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(members) => Arc::new(members),
        _ => Arc::new(Map::new()),
    }
}

impl Notebook {
    /// A notebook kept in memory only.
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A notebook kept in `state` too (read now if it exists).
    pub fn in_file(state: PathBuf) -> Self {
        let notes = std::fs::read_to_string(&state)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        Self {
            notes: Arc::new(Mutex::new(notes)),
            state: Some(state),
        }
    }

    pub fn notes(&self) -> Vec<Note> {
        self.notes
            .lock()
            .map(|notes| notes.clone())
            .unwrap_or_default()
    }

    fn save(&self, notes: &[Note]) {
        if let Some(path) = &self.state {
            let text = serde_json::to_string(notes).unwrap_or_default();
            let temporary = path.with_extension("tmp");
            if std::fs::write(&temporary, text).is_ok() {
                let _ = std::fs::rename(&temporary, path);
            }
        }
    }

    fn append(&self, arguments: &Map<String, Value>, meta: Value) -> Note {
        let mut notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
        let note = Note {
            id: format!("n-{}", notes.len() + 1),
            text: arguments
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            key_argument: arguments
                .get("idempotency_key")
                .and_then(Value::as_str)
                .map(str::to_owned),
            meta,
            env: std::env::vars_os()
                .filter_map(|(name, _)| name.into_string().ok())
                .collect(),
            token: std::env::var("FIXTURE_TOKEN").ok(),
        };
        notes.push(note.clone());
        self.save(&notes);
        note
    }

    fn tools() -> Vec<Tool> {
        let text_schema = || {
            schema(json!({
                "type": "object",
                "required": ["text"],
                "properties": {
                    "text": {"type": "string"},
                    "idempotency_key": {"type": "string"},
                },
            }))
        };
        let mut notes = Tool::new(
            "notes",
            "Every note, one a line",
            schema(json!({"type": "object"})),
        );
        notes.annotations = Some(ToolAnnotations::from_raw(
            None,
            Some(true),
            None,
            None,
            None,
        ));
        let mut remove = Tool::new(
            "remove",
            "Removes a note by id",
            schema(
                json!({"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}),
            ),
        );
        remove.annotations = Some(ToolAnnotations::from_raw(
            None,
            None,
            Some(true),
            Some(true),
            None,
        ));
        let mut slow = Tool::new(
            "append_slow",
            "Adds a note, then waits before answering",
            schema(json!({
                "type": "object",
                "required": ["text", "delay_ms"],
                "properties": {"text": {"type": "string"}, "delay_ms": {"type": "integer"}},
            })),
        );
        slow.annotations = Some(ToolAnnotations::from_raw(
            None,
            Some(false),
            None,
            Some(false),
            None,
        ));
        vec![
            Tool::new("append", "Adds a note", text_schema()),
            slow,
            notes,
            remove,
            Tool::new(
                "refuse",
                "Always refuses",
                schema(json!({"type": "object"})),
            ),
            Tool::new(
                "explode",
                "Always fails at the protocol level",
                schema(json!({"type": "object"})),
            ),
        ]
    }
}

impl ServerHandler for Notebook {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(Self::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let arguments = request.arguments.clone().unwrap_or_default();
        let meta = match &request.meta {
            Some(meta) => serde_json::to_value(meta).unwrap_or(Value::Null),
            None => serde_json::to_value(&context.meta).unwrap_or(Value::Null),
        };
        let result = match request.name.as_ref() {
            "append" => {
                let note = self.append(&arguments, meta);
                CallToolResult::structured(json!({"id": note.id, "text": note.text}))
            }
            "append_slow" => {
                let note = self.append(&arguments, meta);
                let delay = arguments
                    .get("delay_ms")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
                CallToolResult::structured(json!({"id": note.id}))
            }
            "notes" => {
                let notes = self.notes();
                let lines: Vec<String> = notes
                    .iter()
                    .map(|note| format!("{} {}", note.id, note.text))
                    .collect();
                let items: Vec<Value> = notes
                    .iter()
                    .map(|note| json!({"id": note.id, "text": note.text, "key": note.key_argument}))
                    .collect();
                let mut result =
                    CallToolResult::success(vec![ContentBlock::text(lines.join("\n"))]);
                result.structured_content = Some(json!({"items": items}));
                result
            }
            "remove" => {
                let id = arguments
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let mut notes = self.notes.lock().unwrap_or_else(|e| e.into_inner());
                let before = notes.len();
                notes.retain(|note| note.id != id);
                if notes.len() == before {
                    CallToolResult::error(vec![ContentBlock::text(format!("no note {id}"))])
                } else {
                    self.save(&notes);
                    CallToolResult::success(vec![ContentBlock::text(format!("removed {id}"))])
                }
            }
            "refuse" => CallToolResult::error(vec![ContentBlock::text("no such branch")]),
            "explode" => {
                let code = arguments
                    .get("code")
                    .and_then(Value::as_i64)
                    .unwrap_or(-32000);
                let code = i32::try_from(code).unwrap_or(-32000);
                return Err(ErrorData::new(
                    ErrorCode(code),
                    "the notebook is on fire",
                    None,
                ));
            }
            other => {
                return Err(ErrorData::invalid_params(format!("no tool {other}"), None));
            }
        };
        Ok(CallToolResponse::Complete(result))
    }
}
