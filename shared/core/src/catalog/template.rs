//! `{placeholder}` templates and how a connector URL is rendered from one for a command.

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use super::URL_KEYS;
use crate::ids::{BusinessKey, IdempotencyKey};

/// A malformed `{placeholder}` template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("unbalanced braces: {{ at byte {at} is never closed")]
    Unclosed { at: usize },
    #[error("unbalanced braces: }} at byte {at} has no opening {{")]
    Unopened { at: usize },
    #[error("unbalanced braces: {{ at byte {at} opens inside another placeholder")]
    Nested { at: usize },
    #[error("empty placeholder {{}} at byte {at}")]
    Empty { at: usize },
    #[error("placeholder at byte {at} contains whitespace")]
    Whitespace { at: usize },
}

/// Literal text with `{placeholder}`s, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    raw: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Part {
    Text(String),
    Placeholder(String),
}

impl Template {
    pub fn parse(raw: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut open: Option<usize> = None;
        for (at, c) in raw.char_indices() {
            match (c, open) {
                ('{', None) => open = Some(at),
                ('{', Some(_)) => return Err(TemplateError::Nested { at }),
                ('}', None) => return Err(TemplateError::Unopened { at }),
                ('}', Some(start)) => {
                    let name = &raw[start + 1..at];
                    if name.is_empty() {
                        return Err(TemplateError::Empty { at: start });
                    }
                    if name.chars().any(char::is_whitespace) {
                        return Err(TemplateError::Whitespace { at: start });
                    }
                    if !text.is_empty() {
                        parts.push(Part::Text(std::mem::take(&mut text)));
                    }
                    parts.push(Part::Placeholder(name.to_owned()));
                    open = None;
                }
                (c, None) => text.push(c),
                (_, Some(_)) => {}
            }
        }
        if let Some(at) = open {
            return Err(TemplateError::Unclosed { at });
        }
        if !text.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Self {
            raw: raw.to_owned(),
            parts,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The placeholder names, in order of appearance (repeats included).
    pub fn placeholders(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|part| match part {
            Part::Placeholder(name) => Some(name.as_str()),
            Part::Text(_) => None,
        })
    }

    /// The placeholder's name when the whole template is one placeholder (`"{args.amount}"`):
    /// in a body, such a string is replaced by the value itself, with its JSON type.
    pub fn single(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Placeholder(name)] => Some(name),
            _ => None,
        }
    }

    /// Whether the template ends with a placeholder (`"Sluice-Key: {idempotency_key}"`): its
    /// rendered text may then be the beginning of a longer value (call 1's key begins call
    /// 10's), so a search for it must see where the value ends.
    pub fn ends_with_placeholder(&self) -> bool {
        matches!(self.parts.last(), Some(Part::Placeholder(_)))
    }

    /// Renders by appending each placeholder's value as `fill` writes it.
    pub(super) fn render<E>(
        &self,
        mut fill: impl FnMut(&str, &mut String) -> Result<(), E>,
    ) -> Result<String, E> {
        let mut out = String::with_capacity(self.raw.len());
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Placeholder(name) => fill(name, &mut out)?,
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl FromStr for Template {
    type Err = TemplateError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A template that cannot be rendered for a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("template needs argument {field}, which is missing")]
    MissingField { field: String },
    #[error("template needs argument {field} as a string, number or boolean, not {kind}")]
    NotScalar { field: String, kind: &'static str },
    #[error("template needs {key}, which this command does not have")]
    MissingKey { key: &'static str },
    #[error("{name} is {value:?}, which cannot be placed in a url (it would change the path)")]
    UnsafeValue { name: String, value: String },
}

/// The keys a template may name, for one command.
#[derive(Debug, Clone, Copy)]
pub struct UrlKeys<'a> {
    /// Also supplies `run_id` and `command_key`.
    pub idempotency_key: &'a IdempotencyKey,
    pub business_key: Option<&'a BusinessKey>,
    pub external_ref: Option<&'a str>,
    /// A compensation's own idempotency key; `None` outside a compensation.
    pub compensation_key: Option<&'a str>,
    /// The signed callback URL of an asynchronous tool's dispatch (`crate::callback`); `None`
    /// elsewhere, and for a tool that does not name it.
    pub callback_url: Option<&'a str>,
}

/// What a placeholder names: one of the command's keys, or an argument by its path
/// (`{args.metadata.order_id}`, or `{amount}` for a top-level field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slot<'n> {
    Key(&'static str),
    Arg(Vec<&'n str>),
}

impl<'n> Slot<'n> {
    /// A key wins over a top-level argument of the same name.
    pub fn of(name: &'n str) -> Self {
        if let Some(key) = URL_KEYS.iter().find(|key| **key == name) {
            return Self::Key(key);
        }
        match name.strip_prefix("args.") {
            Some(path) => Self::Arg(path.split('.').collect()),
            None => Self::Arg(vec![name]),
        }
    }
}

/// The value a placeholder names, or `None` for an argument the command does not have.
pub fn slot_value(
    name: &str,
    args: &Value,
    keys: &UrlKeys<'_>,
) -> Result<Option<Value>, RenderError> {
    let text = match Slot::of(name) {
        Slot::Key("run_id") => keys.idempotency_key.run_id().to_string(),
        Slot::Key("command_key") => keys.idempotency_key.command_key().to_string(),
        Slot::Key("idempotency_key") => keys.idempotency_key.to_string(),
        Slot::Key("idempotency_key_sha256") => {
            use sha2::Digest;
            let digest = sha2::Sha256::digest(keys.idempotency_key.to_string().as_bytes());
            hex::encode(digest)
        }
        Slot::Key("compensation_key") => keys
            .compensation_key
            .ok_or(RenderError::MissingKey {
                key: "compensation_key",
            })?
            .to_owned(),
        Slot::Key("callback_url") => keys
            .callback_url
            .ok_or(RenderError::MissingKey {
                key: "callback_url",
            })?
            .to_owned(),
        Slot::Key("business_key") => keys
            .business_key
            .ok_or(RenderError::MissingKey {
                key: "business_key",
            })?
            .to_string(),
        Slot::Key(key) => {
            // `external_ref`, the one key left in URL_KEYS.
            keys.external_ref
                .ok_or(RenderError::MissingKey { key })?
                .to_owned()
        }
        Slot::Arg(path) => {
            let mut value = args;
            for segment in path {
                // A number indexes an array (`args.entities.0.name`).
                let inner = match value {
                    Value::Array(items) => segment
                        .parse::<usize>()
                        .ok()
                        .and_then(|index| items.get(index)),
                    other => other.get(segment),
                };
                match inner {
                    Some(inner) => value = inner,
                    None => return Ok(None),
                }
            }
            return Ok(Some(value.clone()));
        }
    };
    Ok(Some(Value::String(text)))
}

/// The text a placeholder stands for inside a longer string: present, and a scalar.
pub fn slot_text(name: &str, args: &Value, keys: &UrlKeys<'_>) -> Result<String, RenderError> {
    let value = slot_value(name, args, keys)?.ok_or_else(|| RenderError::MissingField {
        field: name.to_owned(),
    })?;
    scalar_text(&value).map_err(|kind| RenderError::NotScalar {
        field: name.to_owned(),
        kind,
    })
}

/// Renders a template as text (a header value, a query value, a string in a body).
pub fn render_text(
    template: &Template,
    args: &Value,
    keys: &UrlKeys<'_>,
) -> Result<String, RenderError> {
    template.render(|name, out| {
        out.push_str(&slot_text(name, args, keys)?);
        Ok(())
    })
}

/// Renders a connector URL: each placeholder becomes its key or argument value, percent-encoded
/// as one URL path segment (every byte but `A-Z a-z 0-9 - . _ ~` is escaped, `/` included).
///
/// Empty, `.` and `..` values are refused: HTTP clients normalise dot segments (even encoded
/// ones), so an upstream reference of `..` could otherwise redirect a compensate call.
pub fn render_url(
    template: &Template,
    args: &Value,
    keys: &UrlKeys<'_>,
) -> Result<String, RenderError> {
    template.render(|name, out| {
        let text = slot_text(name, args, keys)?;
        if matches!(text.as_str(), "" | "." | "..") {
            return Err(RenderError::UnsafeValue {
                name: name.to_owned(),
                value: text,
            });
        }
        push_path_segment(out, &text);
        Ok(())
    })
}

/// What stands for a value left out of a URL shown in telemetry ([`render_url_redacted`]).
pub const REDACTED: &str = "REDACTED";

/// A connector URL as telemetry may show it (a span's `url.full`): rendered as
/// [`render_url`] does, but each argument placeholder becomes [`REDACTED`] — a path may carry
/// an argument, and arguments are often personal data — and so does the business key, which
/// is made of arguments, and the callback URL, which is a credential. The other keys (run id,
/// command key, idempotency key and its digest, compensation key, external reference) are
/// rendered: they are the effect's identity, in its spans already. `None` when the template
/// names none of those: the rendered URL can be shown.
pub fn render_url_redacted(template: &Template, keys: &UrlKeys<'_>) -> Option<String> {
    let hidden = |name: &str| {
        matches!(
            Slot::of(name),
            Slot::Arg(_) | Slot::Key("business_key" | "callback_url")
        )
    };
    if !template.placeholders().any(hidden) {
        return None;
    }
    template
        .render::<std::convert::Infallible>(|name, out| {
            // An argument has no value here (no arguments are passed): only keys render.
            match slot_text(name, &Value::Null, keys) {
                Ok(text) if !hidden(name) => push_path_segment(out, &text),
                _ => out.push_str(REDACTED),
            }
            Ok(())
        })
        .ok()
}

/// The text of a scalar argument: strings as-is, numbers and booleans as their JSON text.
pub(super) fn scalar_text(value: &Value) -> Result<String, &'static str> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Number(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        Value::Null => Err("null"),
        Value::Array(_) => Err("an array"),
        Value::Object(_) => Err("an object"),
    }
}

/// `raw` percent-encoded as one URL path segment, as [`render_url`] encodes a value: what the
/// API's clients (the console, the MCP server) put a run id or command key in a path with
/// (command keys hold `/`).
pub fn path_segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    push_path_segment(&mut out, raw);
    out
}

pub(super) fn push_path_segment(out: &mut String, raw: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
    }
}
