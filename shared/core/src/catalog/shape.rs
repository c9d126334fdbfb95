//! The shape of an endpoint's request beyond its URL: the body (a JSON template, sent as JSON or
//! as a form), static and templated headers, templated query parameters, the name of the
//! idempotency header and the credentials it carries.
//!
//! A body template is a JSON value whose strings may hold placeholders. A string that is exactly
//! one placeholder (`"{args.amount}"`) becomes the value itself with its JSON type (a number
//! stays a number, an object stays an object) and is left out when the command lacks that
//! argument; any other string is text with each placeholder rendered into it, which needs the
//! arguments it names. Headers and query parameters follow the same rule, as text.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::credential::Credential;
use super::template::{RenderError, Template, TemplateError, UrlKeys, render_text, slot_value};

/// The header Sluice sends the idempotency key in unless the endpoint names another.
pub const DEFAULT_IDEMPOTENCY_HEADER: &str = "Idempotency-Key";

/// How a body is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentType {
    /// `application/json`.
    #[default]
    Json,
    /// `application/x-www-form-urlencoded`; nested objects and arrays in the bracket form
    /// payment APIs read (`metadata[order_id]=…`, `items[0][price]=…`).
    Form,
}

impl ContentType {
    pub fn mime(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Form => "application/x-www-form-urlencoded",
        }
    }
}

/// A JSON body template, parsed once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyTemplate {
    Literal(Value),
    /// A string that is exactly one placeholder: replaced by the value, omitted when missing.
    Whole(String),
    /// A string with text around its placeholders: rendered as text.
    Text(Template),
    Array(Vec<BodyTemplate>),
    Object(Vec<(String, BodyTemplate)>),
}

/// How a template uses a placeholder, which decides what it may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Rendered into text: the argument must be required and a scalar.
    Text,
    /// The whole value: the argument may be optional (left out when missing), of any type.
    Whole,
    /// The whole value of a header or query parameter: optional, but a scalar.
    WholeScalar,
}

impl BodyTemplate {
    /// Parses a JSON value's strings as templates; the error names the JSON pointer of the bad
    /// string.
    pub fn parse(value: &Value) -> Result<Self, (String, TemplateError)> {
        Self::parse_at(value, "")
    }

    fn parse_at(value: &Value, at: &str) -> Result<Self, (String, TemplateError)> {
        Ok(match value {
            Value::String(text) => {
                let template =
                    Template::parse(text).map_err(|error| (pointer_or_root(at), error))?;
                match (template.single(), template.placeholders().count()) {
                    (Some(name), _) => Self::Whole(name.to_owned()),
                    (None, 0) => Self::Literal(value.clone()),
                    (None, _) => Self::Text(template),
                }
            }
            Value::Array(items) => Self::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(index, item)| Self::parse_at(item, &format!("{at}/{index}")))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Object(members) => Self::Object(
                members
                    .iter()
                    .map(|(key, item)| {
                        let inner = format!("{at}/{}", key.replace('~', "~0").replace('/', "~1"));
                        Ok((key.clone(), Self::parse_at(item, &inner)?))
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Value::Null | Value::Bool(_) | Value::Number(_) => Self::Literal(value.clone()),
        })
    }

    /// Every placeholder and how it is used, in document order.
    pub fn placeholders(&self) -> Vec<(&str, Use)> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<(&'a str, Use)>) {
        match self {
            Self::Literal(_) => {}
            Self::Whole(name) => out.push((name, Use::Whole)),
            Self::Text(template) => {
                out.extend(template.placeholders().map(|name| (name, Use::Text)))
            }
            Self::Array(items) => items.iter().for_each(|item| item.collect(out)),
            Self::Object(members) => members.iter().for_each(|(_, item)| item.collect(out)),
        }
    }

    /// The body for one command; `None` when the whole template is one missing argument.
    pub fn render(&self, args: &Value, keys: &UrlKeys<'_>) -> Result<Option<Value>, RenderError> {
        Ok(match self {
            Self::Literal(value) => Some(value.clone()),
            Self::Whole(name) => slot_value(name, args, keys)?,
            Self::Text(template) => Some(Value::String(render_text(template, args, keys)?)),
            Self::Array(items) => {
                let mut rendered = Vec::with_capacity(items.len());
                for item in items {
                    rendered.extend(item.render(args, keys)?);
                }
                Some(Value::Array(rendered))
            }
            Self::Object(members) => {
                let mut rendered = Map::new();
                for (key, item) in members {
                    if let Some(value) = item.render(args, keys)? {
                        rendered.insert(key.clone(), value);
                    }
                }
                Some(Value::Object(rendered))
            }
        })
    }
}

fn pointer_or_root(at: &str) -> String {
    if at.is_empty() {
        "/".into()
    } else {
        at.to_owned()
    }
}

/// A header's or query parameter's value for one command: `None` when it is one placeholder
/// naming an argument the command lacks (the parameter is left out).
pub fn render_value(
    template: &Template,
    args: &Value,
    keys: &UrlKeys<'_>,
) -> Result<Option<String>, RenderError> {
    match template.single() {
        Some(name) => match slot_value(name, args, keys)? {
            None => Ok(None),
            Some(_) => render_text(template, args, keys).map(Some),
        },
        None => render_text(template, args, keys).map(Some),
    }
}

/// Encodes a JSON object as form pairs, nested values in bracket form; `null` members are left
/// out. A body that is not an object is encoded under the key `value`.
pub fn form_pairs(body: &Value) -> Vec<(String, String)> {
    fn walk(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
        match value {
            Value::Null => {}
            Value::Bool(flag) => out.push((prefix.to_owned(), flag.to_string())),
            Value::Number(number) => out.push((prefix.to_owned(), number.to_string())),
            Value::String(text) => out.push((prefix.to_owned(), text.clone())),
            Value::Array(items) => {
                for (index, item) in items.iter().enumerate() {
                    walk(&format!("{prefix}[{index}]"), item, out);
                }
            }
            Value::Object(members) => {
                for (key, item) in members {
                    walk(&format!("{prefix}[{key}]"), item, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    match body {
        Value::Object(members) => {
            for (key, item) in members {
                walk(key, item, &mut out);
            }
        }
        other => walk("value", other, &mut out),
    }
    out
}

/// An endpoint's request beyond URL, method and timeout.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestShape {
    pub content_type: ContentType,
    /// `None`: the section's default body (the arguments for a dispatch or status check that
    /// carries content, `{"args", "external_ref"}` for a compensation; none on GET and DELETE).
    pub body: Option<BodyTemplate>,
    /// Header names as declared, with their value templates.
    pub headers: Vec<(String, Template)>,
    /// Query parameters appended to the rendered URL, each value encoded.
    pub query: Vec<(String, Template)>,
    /// The header that carries the idempotency key; `None` sends none.
    pub idempotency_header: Option<String>,
    /// The credentials every call of the endpoint carries, signers last.
    pub credentials: Vec<Arc<Credential>>,
}
