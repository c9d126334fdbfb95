//! Argument checks: violations of a tool's schema, and the rule that a field a template or a
//! policy names is declared, required and of a usable type.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::MAX_MESSAGE_LEN;
use super::build::At;
use super::error::CatalogError;

/// One argument that does not fit: where (a JSON pointer into the arguments) and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub pointer: String,
    pub message: String,
}

/// Arguments refused by a tool's schema or business key template; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ArgsError {
    pub(super) violations: Vec<Violation>,
}

impl ArgsError {
    pub(super) fn one(pointer: String, message: String) -> Self {
        Self {
            violations: vec![Violation { pointer, message }],
        }
    }

    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }
}

impl fmt::Display for ArgsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The constructors never build an empty list; the fallback keeps Display total anyway.
        let Some(first) = self.violations.first() else {
            return f.write_str("invalid arguments");
        };
        if first.pointer.is_empty() {
            write!(f, "arguments: {}", first.message)?;
        } else {
            write!(f, "{}: {}", first.pointer, first.message)?;
        }
        match self.violations.len() - 1 {
            0 => Ok(()),
            1 => f.write_str(" (and 1 more violation)"),
            more => write!(f, " (and {more} more violations)"),
        }
    }
}

/// The JSON pointer of a top-level field (`~` and `/` escaped per RFC 6901).
pub(super) fn field_pointer(field: &str) -> String {
    format!("/{}", field.replace('~', "~0").replace('/', "~1"))
}

pub(super) fn bounded(mut message: String) -> String {
    if message.len() > MAX_MESSAGE_LEN {
        let mut end = MAX_MESSAGE_LEN;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

/// How a template or policy uses an argument field, which decides the types it may have.
#[derive(Clone, Copy)]
pub(super) enum FieldUse {
    /// Rendered into a key, a URL or other text: required, a string, number or boolean.
    Text,
    /// Compared with a threshold: required, a number.
    Number,
    /// A body's whole value: may be optional (left out when missing), of any type.
    Whole,
    /// A header's or query parameter's whole value: may be optional, a scalar.
    WholeScalar,
}

/// Checks that `field` is declared in the schema's properties, required, and of a usable type.
pub(super) fn check_field(
    at: &At<'_>,
    key: &'static str,
    field: &str,
    schema: &Value,
    usage: FieldUse,
) -> Result<(), CatalogError> {
    check_path(at, key, &[field], schema, usage)
}

/// The index a path segment names when `level` declares an array.
fn array_index(level: &Value, segment: &str) -> Option<u64> {
    let is_array = match level.get("type") {
        Some(Value::String(one)) => one == "array",
        Some(Value::Array(many)) => many.iter().any(|ty| ty == "array"),
        Some(_) | None => false,
    };
    if !is_array || segment.is_empty() || !segment.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    segment.parse().ok()
}

/// [`check_field`] for a nested argument (`args.metadata.order_id` is `["metadata",
/// "order_id"]`): each level is declared in its parent's properties and, unless the use allows
/// a missing value, required.
pub(super) fn check_path(
    at: &At<'_>,
    key: &'static str,
    path: &[&str],
    schema: &Value,
    usage: FieldUse,
) -> Result<(), CatalogError> {
    let shown = path.join(".");
    let may_be_missing = matches!(usage, FieldUse::Whole | FieldUse::WholeScalar);
    let mut level = schema;
    for field in path {
        // An index into an array the schema declares with `items` (`args.entities.0.name`):
        // there when `minItems` says so.
        if let Some(index) = array_index(level, field) {
            let Some(items) = level.get("items").filter(|items| items.is_object()) else {
                return Err(CatalogError::UnknownField {
                    file: at.file(),
                    tool: at.tool(),
                    key,
                    field: shown,
                });
            };
            let there = level
                .get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|min| min > index);
            if !there && !may_be_missing {
                return Err(CatalogError::OptionalField {
                    file: at.file(),
                    tool: at.tool(),
                    key,
                    field: shown,
                });
            }
            level = items;
            continue;
        }
        let Some(property) = level
            .get("properties")
            .and_then(Value::as_object)
            .and_then(|properties| properties.get(*field))
        else {
            return Err(CatalogError::UnknownField {
                file: at.file(),
                tool: at.tool(),
                key,
                field: shown,
            });
        };
        let required = level
            .get("required")
            .and_then(Value::as_array)
            .is_some_and(|required| required.iter().any(|name| name.as_str() == Some(field)));
        if !required && !may_be_missing {
            return Err(CatalogError::OptionalField {
                file: at.file(),
                tool: at.tool(),
                key,
                field: shown,
            });
        }
        level = property;
    }
    let declared: Vec<&str> = match level.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        Some(_) | None => Vec::new(),
    };
    let (allowed, expected): (&[&str], &'static str) = match usage {
        FieldUse::Text | FieldUse::WholeScalar => (
            &["string", "number", "integer", "boolean"],
            "a string, number, integer or boolean",
        ),
        FieldUse::Number => (&["number", "integer"], "a number or integer"),
        FieldUse::Whole => return Ok(()),
    };
    if declared.iter().any(|ty| !allowed.contains(ty)) {
        return Err(CatalogError::FieldType {
            file: at.file(),
            tool: at.tool(),
            key,
            field: shown,
            declared: format!("{}; it must be {expected}", declared.join(" or ")),
        });
    }
    Ok(())
}
