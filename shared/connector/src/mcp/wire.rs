//! Pure: the `tools/call` of each operation for a command (arguments and `_meta`), and what a
//! server's answer means — the MCP layer's column of the classification table.
//!
//! | answer                                                        | dispatch            |
//! |---------------------------------------------------------------|---------------------|
//! | no connection (spawn, connect, handshake, HTTP connect refused) | not sent            |
//! | a result                                                       | committed           |
//! | a result with `isError: true`                                  | as `on_error` says  |
//! | JSON-RPC -32700, -32600, -32601, -32602 (nothing ran)          | refused             |
//! | any other JSON-RPC error                                       | as `on_error` says  |
//! | written, then: stream closed, child died, connection lost, timeout, an answer of another kind | ambiguous |

use serde_json::{Map, Value, json};
use sluice_core::catalog::{
    BodyTemplate, McpBinding, McpCall, OnError, RenderError, Tool, UrlKeys, render_text,
};
use sluice_core::command::{Command, Observation};
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};
use sluice_core::trace::TraceContext;

use crate::classify::{self, excerpt};
use crate::port::StatusReport;

/// `_meta` key of the call's idempotency key (a compensation's own key on a compensation).
pub const META_IDEMPOTENCY_KEY: &str = "dev.sluice/idempotency_key";
/// `_meta` key of the command's run.
pub const META_RUN_ID: &str = "dev.sluice/run_id";
/// `_meta` key of the command's key inside its run.
pub const META_COMMAND_KEY: &str = "dev.sluice/command_key";

/// The JSON-RPC errors that say the request was not understood, so nothing ran: parse error,
/// invalid request, method not found, invalid params.
pub const PROTOCOL_ERRORS: [i32; 4] = [-32700, -32600, -32601, -32602];

/// The keys of a command's calls, for templates.
fn keys<'a>(
    command: &'a Command,
    external_ref: Option<&'a str>,
    compensation_key: Option<&'a str>,
) -> UrlKeys<'a> {
    UrlKeys {
        idempotency_key: &command.idempotency_key,
        business_key: command.business_key.as_ref(),
        external_ref,
        compensation_key,
        callback_url: None,
    }
}

/// The arguments of the dispatch: the command's, with `set_arguments` rendered over them and
/// the idempotency key written into `key_argument` (replacing whatever the model put there).
/// A name starting with `/` is a JSON pointer into the arguments; its last token `-` appends to
/// an array. An error says which rewrite could not be made (nothing is sent).
pub fn dispatch_arguments(
    binding: &McpBinding,
    command: &Command,
) -> Result<Map<String, Value>, String> {
    let mut arguments = match command.current_args().as_ref() {
        Value::Object(members) => Value::Object(members.clone()),
        _ => Value::Object(Map::new()),
    };
    let keys = keys(command, None, None);
    for (name, template) in &binding.set_arguments {
        let value = template
            .render(command.current_args(), &keys)
            .map_err(|e| format!("set_arguments {name}: {e}"))?;
        place(&mut arguments, name, value).map_err(|e| format!("set_arguments {name}: {e}"))?;
    }
    if let Some(name) = &binding.key_argument {
        let key = Value::String(command.idempotency_key.to_string());
        place(&mut arguments, name, Some(key)).map_err(|e| format!("key_argument {name}: {e}"))?;
    }
    match arguments {
        Value::Object(members) => Ok(members),
        _ => Ok(Map::new()),
    }
}

/// Writes `value` at `name` (a top-level name, or a JSON pointer) in `arguments`; `None`
/// removes what is there.
fn place(arguments: &mut Value, name: &str, value: Option<Value>) -> Result<(), String> {
    let Some(pointer) = name.strip_prefix('/') else {
        if let Value::Object(members) = arguments {
            match value {
                Some(value) => members.insert(name.to_owned(), value),
                None => members.remove(name),
            };
        }
        return Ok(());
    };
    let tokens: Vec<String> = pointer
        .split('/')
        .map(|token| token.replace("~1", "/").replace("~0", "~"))
        .collect();
    let Some((last, parents)) = tokens.split_last() else {
        return Err("an empty pointer".into());
    };
    let mut target = arguments;
    for token in parents {
        target = match target {
            Value::Object(members) => members.get_mut(token.as_str()),
            Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
            _ => None,
        }
        .ok_or_else(|| format!("the arguments have nothing at {token:?}"))?;
    }
    match (target, value) {
        (Value::Object(members), Some(value)) => {
            members.insert(last.clone(), value);
        }
        (Value::Object(members), None) => {
            members.remove(last.as_str());
        }
        (Value::Array(items), Some(value)) if last == "-" => items.push(value),
        (Value::Array(items), value) => {
            let index = last
                .parse::<usize>()
                .ok()
                .filter(|index| *index < items.len())
                .ok_or_else(|| format!("no item {last:?} in the array"))?;
            match value {
                Some(value) => items[index] = value,
                None => {
                    items.remove(index);
                }
            }
        }
        (_, _) => {
            return Err("the pointer leads into a value that is not an object or array".into());
        }
    }
    Ok(())
}

/// The arguments of a lookup or compensation call, rendered for the command.
pub fn call_arguments(
    call: &McpCall,
    command: &Command,
    external_ref: Option<&str>,
    compensation_key: Option<&str>,
) -> Result<Map<String, Value>, RenderError> {
    let keys = keys(command, external_ref, compensation_key);
    match call.arguments.render(command.current_args(), &keys)? {
        Some(Value::Object(members)) => Ok(members),
        Some(_) | None => Ok(Map::new()),
    }
}

/// The `_meta` of a call: the keys the system owns, and the W3C trace context of the call
/// (MCP's convention: `traceparent` and `tracestate` at the top of `_meta`).
pub fn meta(
    command: &Command,
    idempotency_key: &str,
    trace: Option<&TraceContext>,
) -> Map<String, Value> {
    let mut meta = Map::new();
    meta.insert(META_IDEMPOTENCY_KEY.into(), json!(idempotency_key));
    meta.insert(META_RUN_ID.into(), json!(command.run_id.to_string()));
    meta.insert(
        META_COMMAND_KEY.into(),
        json!(command.command_key.to_string()),
    );
    if let Some(trace) = trace {
        meta.insert("traceparent".into(), json!(trace.traceparent));
        if let Some(state) = &trace.tracestate {
            meta.insert("tracestate".into(), json!(state));
        }
    }
    meta
}

/// What came back from one `tools/call`.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// A `CallToolResult`, as JSON (`content`, `structuredContent`, `isError`).
    Result(Value),
    /// A JSON-RPC error answer.
    Error { code: i32, message: String },
    /// Nothing could be sent: no connection to the server.
    NotSent(String),
    /// Sent (or possibly sent), and no answer that says what happened.
    Lost(String),
}

/// `isError: true`.
fn is_error(result: &Value) -> bool {
    result.get("isError").and_then(Value::as_bool) == Some(true)
}

/// The text blocks of a result's `content`, joined by newlines.
pub fn text_of(result: &Value) -> String {
    result
        .get("content")
        .and_then(Value::as_array)
        .map(|blocks| {
            blocks
                .iter()
                .filter(|block| block.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|block| block.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// The result as JSON data: its `structuredContent`, else its text parsed as JSON.
pub fn json_of(result: &Value) -> Option<Value> {
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
        return Some(structured.clone());
    }
    serde_json::from_str(text_of(result).trim()).ok()
}

/// A result as a reason: its text (or its JSON) cut to `max` bytes.
fn summary(result: &Value, max: usize) -> String {
    let text = text_of(result);
    let text = if text.is_empty() {
        result.to_string()
    } else {
        text
    };
    excerpt(text.as_bytes(), max)
}

/// What a result keeps as the command's result: the `CallToolResult` itself, unless larger
/// than `max_bytes`, then its text excerpt.
fn kept(result: &Value, max_bytes: usize, excerpt_bytes: usize) -> Value {
    if result.to_string().len() <= max_bytes {
        result.clone()
    } else {
        json!({
            "truncated": true,
            "text": excerpt(text_of(result).as_bytes(), excerpt_bytes),
        })
    }
}

/// What a dispatch's reply means for the effect.
pub fn dispatch(
    tool: &Tool,
    binding: &McpBinding,
    reply: Reply,
    max_bytes: usize,
    excerpt_bytes: usize,
) -> DispatchOutcome {
    let by_on_error = |reason: String| match binding.on_error {
        OnError::Refused => DispatchOutcome::Refused { reason },
        OnError::Unknown => DispatchOutcome::Ambiguous { reason },
    };
    match reply {
        Reply::Result(result) if is_error(&result) => by_on_error(format!(
            "MCP tool {} answered isError: {}",
            binding.tool,
            summary(&result, excerpt_bytes)
        )),
        Reply::Result(result) => {
            let external_ref = json_of(&result).and_then(|data| {
                classify::read_reference(
                    &tool.dispatch().reference,
                    &reqwest::header::HeaderMap::new(),
                    Some(&data),
                )
            });
            DispatchOutcome::Committed {
                external_ref,
                result: Some(std::sync::Arc::new(kept(&result, max_bytes, excerpt_bytes))),
            }
        }
        Reply::Error { code, message } if PROTOCOL_ERRORS.contains(&code) => {
            DispatchOutcome::Refused {
                reason: format!(
                    "MCP error {code} (the server did not run the call): {}",
                    excerpt(message.as_bytes(), excerpt_bytes)
                ),
            }
        }
        Reply::Error { code, message } => by_on_error(format!(
            "MCP error {code}: {}",
            excerpt(message.as_bytes(), excerpt_bytes)
        )),
        Reply::NotSent(reason) => DispatchOutcome::NotSent {
            reason: format!("not sent: {reason}"),
        },
        Reply::Lost(reason) => DispatchOutcome::Ambiguous { reason },
    }
}

/// How often `needle` occurs in `text`. `bounded` (a `contains` ending with a placeholder):
/// an occurrence followed by a character that would continue a key or an argument's value
/// (an ASCII letter or digit, `-`, `_` or `/`) is the start of another value, not this one —
/// call 1's key is the beginning of call 10's.
pub fn occurrences(text: &str, needle: &str, bounded: bool) -> usize {
    if needle.is_empty() {
        return 0;
    }
    text.match_indices(needle)
        .filter(|(at, _)| {
            !bounded
                || text[at + needle.len()..]
                    .chars()
                    .next()
                    .is_none_or(|next| !(next.is_ascii_alphanumeric() || "-_/".contains(next)))
        })
        .count()
}

/// What a lookup's reply says about the command's effect. `needle`: the rendered `contains`
/// text (a text lookup) and whether it ends with a placeholder (see [`occurrences`]);
/// `filter`: the rendered `match_where` (a JSON lookup).
pub fn status_check(
    tool: &Tool,
    lookup_tool: &str,
    needle: Option<(&str, bool)>,
    filter: &[(String, String)],
    reply: Reply,
    excerpt_bytes: usize,
) -> StatusReport {
    let mut evidence = Map::new();
    evidence.insert("mcp_tool".into(), json!(lookup_tool));
    let inconclusive = |mut evidence: Map<String, Value>, why: String| {
        evidence.insert("reading".into(), json!(why));
        StatusReport::inconclusive(Value::Object(evidence))
    };
    let result = match reply {
        Reply::Result(result) => result,
        Reply::Error { code, message } => {
            evidence.insert("mcp_error".into(), json!(code));
            evidence.insert(
                "message".into(),
                json!(excerpt(message.as_bytes(), excerpt_bytes)),
            );
            return inconclusive(evidence, "the lookup answered an MCP error".into());
        }
        Reply::NotSent(reason) | Reply::Lost(reason) => {
            evidence.insert("error".into(), json!(reason));
            return inconclusive(evidence, "the lookup got no answer".into());
        }
    };
    let text = text_of(&result);
    evidence.insert(
        "text".into(),
        json!(excerpt(text.as_bytes(), excerpt_bytes)),
    );
    evidence.insert("text_truncated".into(), json!(text.len() > excerpt_bytes));
    if is_error(&result) {
        return inconclusive(evidence, "the lookup answered isError".into());
    }
    if let Some((needle, bounded)) = needle {
        let found = occurrences(&text, needle, bounded);
        evidence.insert("matches".into(), json!(found));
        let observation = match found {
            0 => Observation::Absent,
            1 => Observation::Present,
            _ => Observation::Duplicate,
        };
        return StatusReport {
            observation,
            external_ref: None,
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record: None,
        };
    }
    let Some(data) = json_of(&result) else {
        return inconclusive(
            evidence,
            "the answer has no structuredContent and its text is not JSON".into(),
        );
    };
    // The HTTP lookup's rules, on the JSON as if it were a 200's body: one reading of
    // matches / match_where / count / reference pointers for both kinds of tool.
    let answer = classify::Answer {
        status: reqwest::StatusCode::OK,
        headers: reqwest::header::HeaderMap::new(),
        body: serde_json::to_vec(&data).unwrap_or_default(),
        truncated: false,
        body_error: None,
        retry_after_ms: None,
    };
    let mut report = classify::status_check(
        &answer,
        &tool.dispatch().reference,
        tool.status_answers(),
        filter,
        excerpt_bytes,
    );
    if let Value::Object(read) = &mut report.evidence {
        read.remove("http_status");
        read.remove("body");
        read.remove("body_truncated");
        for (key, value) in evidence {
            read.insert(key, value);
        }
    }
    report
}

/// What a compensation's reply means.
pub fn compensation(reply: Reply, excerpt_bytes: usize) -> CompensationOutcome {
    match reply {
        Reply::Result(result) if is_error(&result) => CompensationOutcome::Impossible {
            reason: format!(
                "the compensation answered isError: {}",
                summary(&result, excerpt_bytes)
            ),
        },
        Reply::Result(_) => CompensationOutcome::Done { reference: None },
        Reply::Error { code, message } if PROTOCOL_ERRORS.contains(&code) => {
            CompensationOutcome::Impossible {
                reason: format!(
                    "MCP error {code}: {}",
                    excerpt(message.as_bytes(), excerpt_bytes)
                ),
            }
        }
        Reply::Error { code, message } => CompensationOutcome::Retry {
            reason: format!(
                "MCP error {code}: {}",
                excerpt(message.as_bytes(), excerpt_bytes)
            ),
            retry_after_ms: None,
        },
        Reply::NotSent(reason) | Reply::Lost(reason) => CompensationOutcome::Retry {
            reason,
            retry_after_ms: None,
        },
    }
}

/// The `contains` text of a lookup, rendered for the command.
pub fn needle(
    contains: &sluice_core::catalog::Template,
    command: &Command,
) -> Result<String, RenderError> {
    render_text(contains, command.current_args(), &keys(command, None, None))
}

/// A template that renders to an object, for tests and previews.
pub fn render_object(
    template: &BodyTemplate,
    command: &Command,
) -> Result<Option<Value>, RenderError> {
    template.render(command.current_args(), &keys(command, None, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pointer_rewrites_inside_the_arguments_and_appends_to_an_array() {
        let mut arguments = json!({"entities": [{"name": "a", "observations": ["x"]}]});
        place(
            &mut arguments,
            "/entities/0/observations/-",
            Some(json!("key k")),
        )
        .expect("placed");
        place(&mut arguments, "/entities/0/name", Some(json!("b"))).expect("placed");
        place(&mut arguments, "top", Some(json!(1))).expect("placed");
        assert_eq!(
            arguments,
            json!({"entities": [{"name": "b", "observations": ["x", "key k"]}], "top": 1})
        );
        let missing = place(
            &mut arguments,
            "/entities/3/observations/-",
            Some(json!("k")),
        );
        assert!(missing.is_err(), "{missing:?}");
    }

    #[test]
    fn text_and_json_of_a_result() {
        let result = json!({"content": [
            {"type": "text", "text": "{\"sha\": \"abc\"}"},
            {"type": "image", "data": "…"},
        ]});
        assert_eq!(text_of(&result), "{\"sha\": \"abc\"}");
        assert_eq!(json_of(&result), Some(json!({"sha": "abc"})));
        let structured = json!({"content": [], "structuredContent": {"id": 7}});
        assert_eq!(json_of(&structured), Some(json!({"id": 7})));
        assert_eq!(
            json_of(&json!({"content": [{"type": "text", "text": "ok"}]})),
            None
        );
    }

    #[test]
    fn a_key_at_the_end_of_a_needle_is_not_found_inside_a_longer_key() {
        let log = "Sluice-Key: r/d-1/git/git_commit/10\nSluice-Key: r/d-1/git/git_commit/1\n";
        let needle = "Sluice-Key: r/d-1/git/git_commit/1";
        assert_eq!(occurrences(log, needle, true), 1);
        assert_eq!(
            occurrences(log, needle, false),
            2,
            "unbounded: a plain substring count"
        );
        // Punctuation after the key ends it.
        assert_eq!(
            occurrences(
                "see r/d-1/git/git_commit/1.",
                "r/d-1/git/git_commit/1",
                true
            ),
            1
        );
        assert_eq!(
            occurrences("x r/d-1/git/git_commit/1", "r/d-1/git/git_commit/1", true),
            1
        );
        assert_eq!(occurrences("[key k-1]", "[key k-1]", true), 1);
        assert_eq!(occurrences("anything", "", true), 0);
    }

    #[test]
    fn a_compensation_reads_errors_as_the_table_says() {
        assert!(matches!(
            compensation(Reply::Result(json!({"content": []})), 64),
            CompensationOutcome::Done { .. }
        ));
        assert!(matches!(
            compensation(Reply::Result(json!({"isError": true, "content": []})), 64),
            CompensationOutcome::Impossible { .. }
        ));
        assert!(matches!(
            compensation(
                Reply::Error {
                    code: -32602,
                    message: "bad".into()
                },
                64
            ),
            CompensationOutcome::Impossible { .. }
        ));
        assert!(matches!(
            compensation(
                Reply::Error {
                    code: -32000,
                    message: "busy".into()
                },
                64
            ),
            CompensationOutcome::Retry { .. }
        ));
        assert!(matches!(
            compensation(Reply::Lost("closed".into()), 64),
            CompensationOutcome::Retry { .. }
        ));
    }
}
