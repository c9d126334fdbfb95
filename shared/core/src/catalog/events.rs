//! `[tool.events]`: what the tool's lifecycle events tell stream consumers beyond the fixed
//! projection (`crate::events`, docs/events.md).
//!
//! ```toml
//! [tool.events]
//! include_args = ["currency", "amount_minor"]   # top-level arguments published with the events
//! ```
//!
//! Arguments are left out of events by default: they often hold personal data, and an event is
//! read by every consumer of the topic. A field opted in must be a top-level property of the
//! tool's argument schema, and one the schema marks secret (`writeOnly = true`, or
//! `format = "password"`) is refused. Errors name the file, the tool and the field.

use serde::Deserialize;
use serde_json::Value;

use super::build::At;
use super::error::CatalogError;

/// `[tool.events]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEvents {
    #[serde(default)]
    pub(super) include_args: Vec<String>,
}

/// The argument fields a tool publishes with its events, checked against its `schema`.
pub(super) fn build_events(
    at: &At<'_>,
    raw: RawEvents,
    schema: &Value,
) -> Result<Vec<String>, CatalogError> {
    let mut fields: Vec<String> = Vec::with_capacity(raw.include_args.len());
    for field in raw.include_args {
        let bad = |detail: String| CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: "events.include_args".into(),
            detail,
        };
        let Some(property) = schema
            .get("properties")
            .and_then(Value::as_object)
            .and_then(|properties| properties.get(&field))
        else {
            return Err(bad(format!(
                "{field:?} is not an argument of the tool: declare it under the schema's top-level properties"
            )));
        };
        if property.get("writeOnly") == Some(&Value::Bool(true))
            || property.get("format").and_then(Value::as_str) == Some("password")
        {
            return Err(bad(format!(
                "argument {field:?} is marked secret in the schema (writeOnly or format \"password\"): a secret is never published"
            )));
        }
        if fields.contains(&field) {
            return Err(bad(format!("{field:?} is listed twice")));
        }
        fields.push(field);
    }
    Ok(fields)
}
