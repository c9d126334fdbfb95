//! The tool catalog: every tool an agent may call, loaded from TOML and validated once at start.
//!
//! Loading is decoration-time enforcement (docs/architecture.md, "Catalog"): what loads is
//! coherent, so the services never meet a half-declared tool at dispatch time. Everything here
//! is pure except [`Catalog::load`], which reads the catalog file and any `schema_file` it names.
//! Each refusal is a [`CatalogError`] naming the file, the tool and the key.
//!
//! # Format
//!
//! ```toml
//! default_namespace = "default"     # optional; bare tool names resolve here ("default")
//! policy_version = "2026-11-01"     # optional ("1"); stored on each command and approval
//! max_replays_per_run = 10          # optional (10); operator replays over all of a run's commands
//!
//! [[tool]]
//! name = "payments/wire"            # namespace/name, both snake_case; or a bare name
//! description = "Send a wire"       # optional, shown to agents
//! semantics = "NON_IDEMPOTENT"      # IDEMPOTENT | NON_IDEMPOTENT | OBSERVE_ONLY
//! business_key = "{account}:{amount_minor}:{date}"   # optional
//! allow_unsafe = false              # optional (false)
//! schema = { type = "object", required = ["account"], properties = { account = { type = "string" } } }
//! # or: schema_file = "schemas/wire.json", relative to the catalog file (Catalog::load only)
//!
//! [tool.policy]                     # optional; every key has a default
//! requires_approval = false         # false
//! approve_above = { field = "amount_minor", value = 1000000 }   # none
//! max_attempts = 3                  # dispatch attempts per cycle, at least 1
//! timeout_ms = 10000                # connector call timeout, unless a connector sets its own
//! max_checks = 5                    # status checks per UNKNOWN episode before STUCK, >= 1
//! max_replays = 3                   # operator replays per command
//! settle_ms = 2000                  # an `absent` must hold this long before a redispatch
//! on_absent = "redispatch"          # or "fail" (NON_IDEMPOTENT only)
//! lease_ttl_ms = 30000              # must exceed the dispatch timeout plus max_clock_skew_ms
//! verify_after_commit = false       # look a 2xx commit up once more (needs a status check)
//! late_commit_ms = 10000            # how long after its timeout a call may still commit
//! #                                 # upstream (default: the dispatch timeout); an `absent`
//! #                                 # counts only after that
//! verify_after_ms = 30000           # a NON_IDEMPOTENT command that went through UNKNOWN or was
//! #                                 # redispatched is looked up once more this long after it
//! #                                 # settled; at least settle_ms
//! approval_timeout_ms = 86400000    # a BLOCKED command waits this long, then is cancelled
//!
//! [tool.dispatch]                   # required
//! url = "http://127.0.0.1:8787/bank/wires"
//! method = "POST"                   # GET | POST | PUT | PATCH | DELETE (POST)
//! reference_pointer = "/id"         # JSON pointer of the external reference (default "/id"),
//! # or reference_header = "Location"; used for dispatch and status check responses
//! timeout_ms = 10000                # optional, overrides policy.timeout_ms
//! in_progress_status = [409]        # 4xx answers meaning "a request with this key is still in
//! #                                 # progress": ambiguous, not a refusal (none)
//!
//! [tool.status_check]               # optional; method defaults to GET
//! url = "http://127.0.0.1:8787/bank/wires/by-key/{business_key}"
//!
//! [tool.compensate]                 # optional; method defaults to POST
//! url = "http://127.0.0.1:8787/bank/wires/{external_ref}/reverse"
//! ```
//!
//! Templates (`business_key` and connector URLs) are literal text with `{placeholder}`s; braces
//! cannot be escaped. A `business_key` placeholder names a top-level argument field. A URL
//! placeholder names either one of the keys `run_id`, `command_key`, `idempotency_key`,
//! `business_key`, `external_ref` (a key wins over an argument field of the same name) or a
//! top-level argument field. Every field a template names must be declared in the schema's
//! `properties`, listed in its `required`, and not typed as an object or array, so a command
//! that passed [`Tool::validate_args`] always renders. `{business_key}` needs a `business_key`
//! template; `{external_ref}` is only known after a dispatch, so only `compensate` may use it.
//!
//! The rules beyond shape: names are unique after bare-name resolution; the schema compiles
//! (with `format` assertions on) and is `type = "object"` at the top level; a NON_IDEMPOTENT
//! tool declares at least one of `business_key`, `status_check`, `compensate` unless
//! `allow_unsafe = true`; an OBSERVE_ONLY tool declares no `compensate`; `approve_above`
//! names a required numeric field.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::command::EffectSemantics;
use crate::error::IdError;
use crate::ids::{BusinessKey, DEFAULT_NAMESPACE, IdempotencyKey, ToolName, check_snake_case};
use crate::machine::{OnAbsent, Rules};

/// The policy version of a catalog that does not declare one.
pub const DEFAULT_POLICY_VERSION: &str = "1";
/// Connector timeout of a tool that declares none.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Where the external reference is read from a response unless the tool says otherwise.
pub const DEFAULT_REFERENCE_POINTER: &str = "/id";
/// The keys a connector URL template may name besides argument fields.
pub const URL_KEYS: [&str; 5] = [
    "run_id",
    "command_key",
    "idempotency_key",
    "business_key",
    "external_ref",
];
/// Longest violation message kept in an [`ArgsError`]; schema messages quote the instance.
const MAX_MESSAGE_LEN: usize = 300;

/// Why a catalog was refused, or a tool name did not resolve.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("cannot read catalog file {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{file}: not valid TOML")]
    Syntax {
        file: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    /// The document's top level has an unknown key or a value of the wrong type.
    #[error("{file}: {detail}")]
    Malformed { file: String, detail: String },
    /// A `[[tool]]` entry has an unknown key or a value of the wrong type (`detail` names it).
    #[error("{file}: tool {tool}: {detail}")]
    MalformedTool {
        file: String,
        tool: String,
        detail: String,
    },
    #[error("{file}: default_namespace {value:?} is invalid: {why}")]
    BadDefaultNamespace {
        file: String,
        value: String,
        why: &'static str,
    },
    #[error("{file}: policy_version must not be empty")]
    EmptyPolicyVersion { file: String },
    #[error("{file}: tool {tool}: name {tool:?} is invalid: {why}")]
    BadToolName {
        file: String,
        tool: String,
        why: String,
    },
    #[error(
        "{file}: tool {tool}: name is declared twice (entries {first} and {second}); tool names must be unique"
    )]
    DuplicateTool {
        file: String,
        tool: String,
        first: usize,
        second: usize,
    },
    #[error(
        "{file}: tool {tool}: declare the argument schema with exactly one of schema or schema_file"
    )]
    SchemaChoice { file: String, tool: String },
    #[error(
        "{file}: tool {tool}: schema_file {path:?} can only be used when the catalog is loaded from a file; inline it as schema"
    )]
    SchemaFileWithoutDirectory {
        file: String,
        tool: String,
        path: String,
    },
    #[error("{file}: tool {tool}: schema_file: cannot read {path}")]
    SchemaFileRead {
        file: String,
        tool: String,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{file}: tool {tool}: schema_file: {path} is not valid JSON")]
    SchemaFileJson {
        file: String,
        tool: String,
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{file}: tool {tool}: {key} is not a valid JSON Schema: {detail}")]
    InvalidSchema {
        file: String,
        tool: String,
        key: &'static str,
        detail: String,
    },
    #[error(
        "{file}: tool {tool}: {key} must be type = \"object\" at the top level (arguments are a JSON object)"
    )]
    SchemaNotObject {
        file: String,
        tool: String,
        key: &'static str,
    },
    #[error("{file}: tool {tool}: {key}: {problem} in {template:?}")]
    BadTemplate {
        file: String,
        tool: String,
        key: &'static str,
        template: String,
        problem: TemplateError,
    },
    #[error(
        "{file}: tool {tool}: {key} names field {field:?}, which is not in the schema's properties"
    )]
    UnknownField {
        file: String,
        tool: String,
        key: &'static str,
        field: String,
    },
    #[error(
        "{file}: tool {tool}: {key} names field {field:?}, which the schema does not list in required; a command without it could not be handled"
    )]
    OptionalField {
        file: String,
        tool: String,
        key: &'static str,
        field: String,
    },
    #[error(
        "{file}: tool {tool}: {key} names field {field:?}, which the schema types as {declared}"
    )]
    FieldType {
        file: String,
        tool: String,
        key: &'static str,
        field: String,
        /// The declared type and what it must be instead.
        declared: String,
    },
    #[error("{file}: tool {tool}: {key} uses {{{placeholder}}}, but {why}")]
    UnavailableKey {
        file: String,
        tool: String,
        key: &'static str,
        placeholder: &'static str,
        why: &'static str,
    },
    #[error(
        "{file}: tool {tool} is NON_IDEMPOTENT and declares none of business_key, status_check, compensate; set allow_unsafe = true only after explicit review"
    )]
    UnsafeNonIdempotent { file: String, tool: String },
    #[error("{file}: tool {tool}: {key} must be at least 1")]
    Zero {
        file: String,
        tool: String,
        key: &'static str,
    },
    #[error(
        "{file}: tool {tool}: compensate is declared, but an OBSERVE_ONLY tool is never compensated; remove [tool.compensate]"
    )]
    CompensateOnObserveOnly { file: String, tool: String },
    #[error(
        "{file}: tool {tool}: dispatch is missing; add a [tool.dispatch] section with the connector url"
    )]
    MissingDispatch { file: String, tool: String },
    #[error("{file}: tool {tool}: {key} {url:?} must start with http:// or https://")]
    NotHttp {
        file: String,
        tool: String,
        key: &'static str,
        url: String,
    },
    #[error(
        "{file}: tool {tool}: {key} {url:?} has a placeholder in its scheme, host or port; placeholders go in the path and query only, so no argument or key chooses where the request goes"
    )]
    PlaceholderInAuthority {
        file: String,
        tool: String,
        key: &'static str,
        url: String,
    },
    #[error("{file}: tool {tool}: dispatch: set reference_pointer or reference_header, not both")]
    ReferenceChoice { file: String, tool: String },
    #[error(
        "{file}: tool {tool}: dispatch.reference_pointer {pointer:?} is not a JSON pointer (empty, or starting with /)"
    )]
    BadReferencePointer {
        file: String,
        tool: String,
        pointer: String,
    },
    #[error(
        "{file}: tool {tool}: dispatch.in_progress_status {status} is not a 4xx status: list the client errors this upstream answers while a request with the same idempotency key is in progress (409 for Stripe-like APIs)"
    )]
    BadInProgressStatus {
        file: String,
        tool: String,
        status: u16,
    },
    #[error("{file}: tool {tool}: dispatch.reference_header {header:?} is not an HTTP header name")]
    BadReferenceHeader {
        file: String,
        tool: String,
        header: String,
    },
    #[error(
        "{file}: tool {tool}: policy.lease_ttl_ms ({lease_ttl_ms}) must exceed the dispatch timeout ({timeout_ms}, from dispatch.timeout_ms or policy.timeout_ms) plus max_clock_skew_ms ({skew_ms}), or the lease can expire while the call is in flight"
    )]
    LeaseShorterThanTimeout {
        file: String,
        tool: String,
        lease_ttl_ms: u64,
        timeout_ms: u64,
        skew_ms: u64,
    },
    #[error(
        "{file}: tool {tool}: policy.verify_after_ms ({verify_after_ms}) must be at least policy.settle_ms ({settle_ms}): the last look must come after lookups have caught up"
    )]
    VerifyBeforeSettle {
        file: String,
        tool: String,
        verify_after_ms: u64,
        settle_ms: u64,
    },
    #[error(
        "{file}: tool {tool}: policy.verify_after_ms ({verify_after_ms}) must be at least policy.late_commit_ms + max_clock_skew_ms + policy.settle_ms ({landing_ms}): the last look must come after a late attempt can land and lookups have caught up"
    )]
    VerifyBeforeLanding {
        file: String,
        tool: String,
        verify_after_ms: u64,
        landing_ms: u64,
    },
    #[error("unknown tool {tool}")]
    UnknownTool { tool: ToolName },
    #[error(transparent)]
    InvalidName(#[from] IdError),
}

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
enum Part {
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

    /// Renders by appending each placeholder's value as `fill` writes it.
    fn render<E>(
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

/// HTTP method of a connector call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
        }
    }
}

impl fmt::Display for HttpMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One HTTP call of a connector: where, how, and how long to wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    pub url: Template,
    pub method: HttpMethod,
    /// The section's own `timeout_ms`, else the tool's `policy.timeout_ms`.
    pub timeout_ms: u64,
}

/// Where the external reference of an effect is read from an upstream response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReferenceSource {
    /// A JSON pointer into the response body (`""` is the whole body).
    JsonPointer(String),
    /// A response header.
    Header(String),
}

/// The dispatch connector. Its reference source also applies to status check responses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatchConnector {
    pub endpoint: HttpEndpoint,
    /// A response without a value there leaves the command's `external_ref` empty.
    pub reference: ReferenceSource,
    /// 4xx statuses that this upstream answers while a request with the same idempotency key
    /// is still being processed (Stripe's and the IETF idempotency-key draft's 409): the
    /// outcome is not known yet, so they are ambiguous, not refusals.
    pub in_progress_status: Vec<u16>,
}

/// `approve_above`: the command needs approval when this numeric argument exceeds `value`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalThreshold {
    pub field: String,
    pub value: Number,
}

/// A tool's `[tool.policy]`, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    pub requires_approval: bool,
    pub approve_above: Option<ApprovalThreshold>,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub max_checks: u32,
    pub max_replays: u32,
    pub settle_ms: u64,
    pub on_absent: OnAbsent,
    pub lease_ttl_ms: u64,
    pub verify_after_commit: bool,
    /// `None`: the dispatch timeout (known once the dispatch section is read).
    pub late_commit_ms: Option<u64>,
    pub verify_after_ms: u64,
    pub approval_timeout_ms: u64,
}

/// One argument that does not fit: where (a JSON pointer into the arguments) and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub pointer: String,
    pub message: String,
}

/// Arguments refused by a tool's schema or business key template; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ArgsError {
    violations: Vec<Violation>,
}

impl ArgsError {
    fn one(pointer: String, message: String) -> Self {
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

/// A connector URL that cannot be rendered for a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("url template needs argument {field}, which is missing")]
    MissingField { field: String },
    #[error("url template needs argument {field} as a string, number or boolean, not {kind}")]
    NotScalar { field: String, kind: &'static str },
    #[error("url template needs {key}, which this command does not have")]
    MissingKey { key: &'static str },
    #[error("{name} is {value:?}, which cannot be placed in a url (it would change the path)")]
    UnsafeValue { name: String, value: String },
}

/// The keys a connector URL may name, for one command.
#[derive(Debug, Clone, Copy)]
pub struct UrlKeys<'a> {
    /// Also supplies `run_id` and `command_key`.
    pub idempotency_key: &'a IdempotencyKey,
    pub business_key: Option<&'a BusinessKey>,
    pub external_ref: Option<&'a str>,
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
        let text = match name {
            "run_id" => keys.idempotency_key.run_id().to_string(),
            "command_key" => keys.idempotency_key.command_key().to_string(),
            "idempotency_key" => keys.idempotency_key.to_string(),
            "business_key" => keys
                .business_key
                .ok_or(RenderError::MissingKey {
                    key: "business_key",
                })?
                .to_string(),
            "external_ref" => keys
                .external_ref
                .ok_or(RenderError::MissingKey {
                    key: "external_ref",
                })?
                .to_owned(),
            field => {
                let value = args.get(field).ok_or_else(|| RenderError::MissingField {
                    field: field.to_owned(),
                })?;
                scalar_text(value).map_err(|kind| RenderError::NotScalar {
                    field: field.to_owned(),
                    kind,
                })?
            }
        };
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

/// The text of a scalar argument: strings as-is, numbers and booleans as their JSON text.
fn scalar_text(value: &Value) -> Result<String, &'static str> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Number(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        Value::Null => Err("null"),
        Value::Array(_) => Err("an array"),
        Value::Object(_) => Err("an object"),
    }
}

fn push_path_segment(out: &mut String, raw: &str) {
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

/// The JSON pointer of a top-level field (`~` and `/` escaped per RFC 6901).
fn field_pointer(field: &str) -> String {
    format!("/{}", field.replace('~', "~0").replace('/', "~1"))
}

fn bounded(mut message: String) -> String {
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

/// A declared tool, validated. Cheap to clone: the compiled schema is shared.
#[derive(Clone)]
pub struct Tool {
    name: ToolName,
    description: String,
    semantics: EffectSemantics,
    schema: Value,
    validator: Arc<jsonschema::Validator>,
    business_key: Option<Template>,
    policy: ToolPolicy,
    dispatch: DispatchConnector,
    status_check: Option<HttpEndpoint>,
    compensate: Option<HttpEndpoint>,
    allow_unsafe: bool,
    /// The catalog's `max_clock_skew_ms`.
    clock_skew_ms: u64,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The compiled validator is derived from `schema`; printing it adds only noise.
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("semantics", &self.semantics)
            .field("schema", &self.schema)
            .field("business_key", &self.business_key)
            .field("policy", &self.policy)
            .field("dispatch", &self.dispatch)
            .field("status_check", &self.status_check)
            .field("compensate", &self.compensate)
            .field("allow_unsafe", &self.allow_unsafe)
            .finish_non_exhaustive()
    }
}

impl Tool {
    pub fn name(&self) -> &ToolName {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn semantics(&self) -> EffectSemantics {
        self.semantics
    }

    /// The JSON Schema of the arguments, as declared.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    pub fn business_key_template(&self) -> Option<&Template> {
        self.business_key.as_ref()
    }

    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    pub fn dispatch(&self) -> &DispatchConnector {
        &self.dispatch
    }

    pub fn status_check(&self) -> Option<&HttpEndpoint> {
        self.status_check.as_ref()
    }

    pub fn compensate(&self) -> Option<&HttpEndpoint> {
        self.compensate.as_ref()
    }

    pub fn allow_unsafe(&self) -> bool {
        self.allow_unsafe
    }

    /// The state machine's rules for this tool: the defaults of its semantics, overridden by
    /// its policy and by which connectors it declares.
    pub fn rules(&self) -> Rules {
        let defaults = Rules::defaults(self.semantics);
        let millis = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
        // The sweep redoes a compensation that outlives this: twice the call's own timeout
        // leaves room for one whole call, and no more, so a crash delays it only that long.
        let compensation_timeout_ms = self
            .compensate
            .as_ref()
            .map_or(defaults.compensation_timeout_ms, |endpoint| {
                millis(endpoint.timeout_ms).saturating_mul(2).max(1_000)
            });
        Rules {
            max_attempts: self.policy.max_attempts,
            max_checks: self.policy.max_checks,
            max_replays: self.policy.max_replays,
            has_status_check: self.status_check.is_some(),
            has_compensate: self.compensate.is_some(),
            on_absent: self.policy.on_absent,
            settle_ms: millis(self.policy.settle_ms),
            lease_ttl_ms: millis(self.policy.lease_ttl_ms),
            dispatch_timeout_ms: millis(self.dispatch.endpoint.timeout_ms),
            compensation_timeout_ms,
            verify_after_commit: self.policy.verify_after_commit && self.status_check.is_some(),
            late_commit_ms: millis(
                self.policy
                    .late_commit_ms
                    .unwrap_or(self.dispatch.endpoint.timeout_ms),
            ),
            verify_after_ms: millis(self.policy.verify_after_ms),
            clock_skew_ms: millis(self.clock_skew_ms),
            approval_timeout_ms: millis(self.policy.approval_timeout_ms),
            ..defaults
        }
    }

    /// Checks `args` against the tool's schema, listing every violation.
    pub fn validate_args(&self, args: &Value) -> Result<(), ArgsError> {
        let violations: Vec<Violation> = self
            .validator
            .iter_errors(args)
            .map(|error| Violation {
                pointer: error.instance_path().to_string(),
                message: bounded(error.to_string()),
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ArgsError { violations })
        }
    }

    /// Renders the business key from `args`, or `None` when the tool declares no template.
    pub fn business_key(&self, args: &Value) -> Result<Option<BusinessKey>, ArgsError> {
        let Some(template) = &self.business_key else {
            return Ok(None);
        };
        let key = template.render(|field, out| {
            let value = args.get(field).ok_or_else(|| {
                ArgsError::one(
                    field_pointer(field),
                    format!("business_key needs field {field}, which is missing"),
                )
            })?;
            let text = scalar_text(value).map_err(|kind| {
                ArgsError::one(
                    field_pointer(field),
                    format!("business_key needs field {field} as a string, number or boolean, not {kind}"),
                )
            })?;
            out.push_str(&text);
            Ok(())
        })?;
        Ok(Some(BusinessKey::new(key)))
    }
}

/// The validated catalog, tools in declaration order.
#[derive(Debug, Clone)]
pub struct Catalog {
    source_name: String,
    default_namespace: String,
    policy_version: String,
    max_replays_per_run: u32,
    tools: Vec<Tool>,
    /// Looked up on every hop of every effect; the operator names the tools.
    index: HashMap<ToolName, usize, foldhash::fast::RandomState>,
}

/// Operator replays allowed over all of a run's commands unless the catalog says otherwise.
pub const DEFAULT_MAX_REPLAYS_PER_RUN: u32 = 10;

/// The bound on clock skew between Sluice's components unless the catalog says otherwise
/// (`max_clock_skew_ms`): leases and horizons are widened by it.
pub const DEFAULT_MAX_CLOCK_SKEW_MS: u64 = 500;

/// A lease must outlast the whole call, measured on clocks that may disagree by the skew bound;
/// the last look must come after a late attempt can land and lookups have caught up.
fn check_lease(tool: &Tool, file: &str) -> Result<(), CatalogError> {
    let timeout_ms = tool.dispatch.endpoint.timeout_ms;
    if tool.policy.lease_ttl_ms <= timeout_ms.saturating_add(tool.clock_skew_ms) {
        return Err(CatalogError::LeaseShorterThanTimeout {
            file: file.to_owned(),
            tool: tool.name.to_string(),
            lease_ttl_ms: tool.policy.lease_ttl_ms,
            timeout_ms,
            skew_ms: tool.clock_skew_ms,
        });
    }
    let rules = tool.rules();
    let landing = rules
        .late_commit_ms
        .saturating_add(rules.clock_skew_ms)
        .saturating_add(rules.settle_ms);
    if rules.verify_after_ms < landing {
        return Err(CatalogError::VerifyBeforeLanding {
            file: file.to_owned(),
            tool: tool.name.to_string(),
            verify_after_ms: tool.policy.verify_after_ms,
            landing_ms: u64::try_from(landing).unwrap_or(u64::MAX),
        });
    }
    Ok(())
}

/// Reads a `schema_file`, given as written in the catalog; returns the path it read and the text.
type SchemaReader<'a> = &'a dyn Fn(&str) -> (String, io::Result<String>);

impl Catalog {
    /// Parses and validates a catalog; `source_name` names it in errors. `schema_file` is
    /// refused here (there is no directory to resolve it against): use [`Catalog::load`].
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<Self, CatalogError> {
        Self::parse(text, source_name, None)
    }

    /// Reads, parses and validates the catalog file at `path`; `schema_file`s resolve against
    /// its directory.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, CatalogError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: shown.clone(),
            source,
        })?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let read = |relative: &str| {
            let full = dir.join(relative);
            (full.display().to_string(), std::fs::read_to_string(&full))
        };
        Self::parse(&text, &shown, Some(&read))
    }

    fn parse(
        text: &str,
        file: &str,
        schemas: Option<SchemaReader<'_>>,
    ) -> Result<Self, CatalogError> {
        let table: toml::Table = toml::from_str(text).map_err(|source| CatalogError::Syntax {
            file: file.to_owned(),
            source: Box::new(source),
        })?;
        let raw = RawCatalog::deserialize(toml::Value::Table(table)).map_err(|error| {
            CatalogError::Malformed {
                file: file.to_owned(),
                detail: describe(&error),
            }
        })?;
        let default_namespace = raw
            .default_namespace
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        if let Err(why) = check_snake_case(&default_namespace) {
            return Err(CatalogError::BadDefaultNamespace {
                file: file.to_owned(),
                value: default_namespace,
                why,
            });
        }
        let policy_version = raw
            .policy_version
            .unwrap_or_else(|| DEFAULT_POLICY_VERSION.to_owned());
        if policy_version.trim().is_empty() {
            return Err(CatalogError::EmptyPolicyVersion {
                file: file.to_owned(),
            });
        }

        let clock_skew_ms = raw.max_clock_skew_ms.unwrap_or(DEFAULT_MAX_CLOCK_SKEW_MS);
        let mut tools = Vec::with_capacity(raw.tool.len());
        let mut index = HashMap::with_capacity_and_hasher(raw.tool.len(), Default::default());
        for (position, entry) in raw.tool.into_iter().enumerate() {
            let mut tool = build_tool(entry, position + 1, file, &default_namespace, schemas)?;
            tool.clock_skew_ms = clock_skew_ms;
            check_lease(&tool, file)?;
            if let Some(first) = index.insert(tool.name.clone(), position) {
                return Err(CatalogError::DuplicateTool {
                    file: file.to_owned(),
                    tool: tool.name.to_string(),
                    first: first + 1,
                    second: position + 1,
                });
            }
            tools.push(tool);
        }
        Ok(Self {
            source_name: file.to_owned(),
            default_namespace,
            policy_version,
            max_replays_per_run: raw
                .max_replays_per_run
                .unwrap_or(DEFAULT_MAX_REPLAYS_PER_RUN),
            tools,
            index,
        })
    }

    /// The file name (or source name) the catalog was loaded from.
    pub fn source_name(&self) -> &str {
        &self.source_name
    }

    pub fn default_namespace(&self) -> &str {
        &self.default_namespace
    }

    pub fn policy_version(&self) -> &str {
        &self.policy_version
    }

    /// Operator replays allowed over all of a run's commands together.
    pub fn max_replays_per_run(&self) -> u32 {
        self.max_replays_per_run
    }

    pub fn get(&self, name: &ToolName) -> Option<&Tool> {
        self.index.get(name).map(|&position| &self.tools[position])
    }

    /// Finds a tool by a qualified name, or a bare name in the default namespace.
    pub fn resolve(&self, raw_name: &str) -> Result<&Tool, CatalogError> {
        let name = ToolName::resolve(raw_name, &self.default_namespace)?;
        self.get(&name)
            .ok_or(CatalogError::UnknownTool { tool: name })
    }

    /// Every tool, in declaration order.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCatalog {
    default_namespace: Option<String>,
    policy_version: Option<String>,
    max_replays_per_run: Option<u32>,
    max_clock_skew_ms: Option<u64>,
    /// Kept as tables so each entry is deserialized on its own and its errors name the tool.
    #[serde(default)]
    tool: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    #[serde(default)]
    description: String,
    semantics: EffectSemantics,
    business_key: Option<String>,
    #[serde(default)]
    allow_unsafe: bool,
    schema: Option<toml::Table>,
    schema_file: Option<String>,
    #[serde(default)]
    policy: RawPolicy,
    dispatch: Option<RawDispatch>,
    status_check: Option<RawEndpoint>,
    compensate: Option<RawEndpoint>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    requires_approval: bool,
    approve_above: Option<ApprovalThreshold>,
    max_attempts: Option<u32>,
    timeout_ms: Option<u64>,
    max_checks: Option<u32>,
    max_replays: Option<u32>,
    settle_ms: Option<u64>,
    on_absent: Option<OnAbsent>,
    lease_ttl_ms: Option<u64>,
    #[serde(default)]
    verify_after_commit: bool,
    late_commit_ms: Option<u64>,
    verify_after_ms: Option<u64>,
    approval_timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDispatch {
    url: String,
    method: Option<HttpMethod>,
    reference_pointer: Option<String>,
    reference_header: Option<String>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    in_progress_status: Vec<u16>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    url: String,
    method: Option<HttpMethod>,
    timeout_ms: Option<u64>,
}

/// A deserialization error as `path: message`; the toml crate keeps the path only in Display.
fn describe(error: &toml::de::Error) -> String {
    let shown = error.to_string();
    let path = shown
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("in `")?.strip_suffix('`'));
    let message = error.message().trim_end();
    match path {
        Some(path) => format!("{path}: {message}"),
        None => message.to_owned(),
    }
}

/// Error context of one tool: the file and the tool's resolved name.
struct At<'a> {
    file: &'a str,
    tool: &'a ToolName,
}

impl At<'_> {
    fn file(&self) -> String {
        self.file.to_owned()
    }

    fn tool(&self) -> String {
        self.tool.to_string()
    }
}

fn build_tool(
    entry: toml::Table,
    position: usize,
    file: &str,
    default_namespace: &str,
    schemas: Option<SchemaReader<'_>>,
) -> Result<Tool, CatalogError> {
    // Name the entry by its raw name if it has one, so shape errors point at the right tool.
    let label = match entry.get("name").and_then(toml::Value::as_str) {
        Some(name) => name.to_owned(),
        None => format!("#{position}"),
    };
    let raw = RawTool::deserialize(toml::Value::Table(entry)).map_err(|error| {
        CatalogError::MalformedTool {
            file: file.to_owned(),
            tool: label.clone(),
            detail: describe(&error),
        }
    })?;
    let name = ToolName::resolve(&raw.name, default_namespace).map_err(|error| {
        CatalogError::BadToolName {
            file: file.to_owned(),
            tool: label.clone(),
            why: match error {
                IdError::ToolName { why, .. } => why.to_owned(),
                other => other.to_string(),
            },
        }
    })?;
    let at = At { file, tool: &name };

    let (schema, schema_key) = load_schema(&at, raw.schema, raw.schema_file, schemas)?;
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|error| CatalogError::InvalidSchema {
            file: at.file(),
            tool: at.tool(),
            key: schema_key,
            // The path inside the schema document: `/properties/amount/minimum`.
            detail: bounded(match error.instance_path().as_str() {
                "" => error.to_string(),
                path => format!("{path}: {error}"),
            }),
        })?;
    if schema.get("type") != Some(&Value::String("object".into())) {
        return Err(CatalogError::SchemaNotObject {
            file: at.file(),
            tool: at.tool(),
            key: schema_key,
        });
    }

    let business_key = match raw.business_key {
        Some(text) => {
            let template = parse_template(&at, "business_key", &text)?;
            for field in template.placeholders() {
                check_field(&at, "business_key", field, &schema, FieldUse::Text)?;
            }
            Some(template)
        }
        None => None,
    };

    let policy = build_policy(&at, raw.policy, raw.semantics, &schema)?;
    if policy.verify_after_commit && raw.status_check.is_none() {
        return Err(CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail: "policy.verify_after_commit needs a [tool.status_check] to look the commit up"
                .into(),
        });
    }

    let Some(dispatch) = raw.dispatch else {
        return Err(CatalogError::MissingDispatch {
            file: at.file(),
            tool: at.tool(),
        });
    };
    let has_business_key = business_key.is_some();
    let reference = match (dispatch.reference_pointer, dispatch.reference_header) {
        (Some(_), Some(_)) => {
            return Err(CatalogError::ReferenceChoice {
                file: at.file(),
                tool: at.tool(),
            });
        }
        (Some(pointer), None) => {
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(CatalogError::BadReferencePointer {
                    file: at.file(),
                    tool: at.tool(),
                    pointer,
                });
            }
            ReferenceSource::JsonPointer(pointer)
        }
        (None, Some(header)) => {
            if !is_header_name(&header) {
                return Err(CatalogError::BadReferenceHeader {
                    file: at.file(),
                    tool: at.tool(),
                    header,
                });
            }
            ReferenceSource::Header(header)
        }
        (None, None) => ReferenceSource::JsonPointer(DEFAULT_REFERENCE_POINTER.to_owned()),
    };
    let dispatch = DispatchConnector {
        endpoint: build_endpoint(
            &at,
            Section::Dispatch,
            RawEndpoint {
                url: dispatch.url,
                method: dispatch.method,
                timeout_ms: dispatch.timeout_ms,
            },
            &schema,
            &policy,
            has_business_key,
        )?,
        reference,
        in_progress_status: dispatch.in_progress_status,
    };
    // 408, 425 and 429 are ambiguous already; other codes here would turn a success or a
    // server error into something it is not.
    if let Some(&status) = dispatch
        .in_progress_status
        .iter()
        .find(|status| !(400..=499).contains(*status))
    {
        return Err(CatalogError::BadInProgressStatus {
            file: at.file(),
            tool: at.tool(),
            status,
        });
    }
    let status_check = raw
        .status_check
        .map(|raw| {
            build_endpoint(
                &at,
                Section::StatusCheck,
                raw,
                &schema,
                &policy,
                has_business_key,
            )
        })
        .transpose()?;
    let compensate = raw
        .compensate
        .map(|raw| {
            build_endpoint(
                &at,
                Section::Compensate,
                raw,
                &schema,
                &policy,
                has_business_key,
            )
        })
        .transpose()?;

    match raw.semantics {
        EffectSemantics::NonIdempotent
            if business_key.is_none()
                && status_check.is_none()
                && compensate.is_none()
                && !raw.allow_unsafe =>
        {
            return Err(CatalogError::UnsafeNonIdempotent {
                file: at.file(),
                tool: at.tool(),
            });
        }
        EffectSemantics::ObserveOnly if compensate.is_some() => {
            return Err(CatalogError::CompensateOnObserveOnly {
                file: at.file(),
                tool: at.tool(),
            });
        }
        EffectSemantics::Idempotent
        | EffectSemantics::NonIdempotent
        | EffectSemantics::ObserveOnly => {}
    }

    Ok(Tool {
        name,
        description: raw.description,
        semantics: raw.semantics,
        schema,
        validator: Arc::new(validator),
        business_key,
        policy,
        dispatch,
        status_check,
        compensate,
        allow_unsafe: raw.allow_unsafe,
        clock_skew_ms: DEFAULT_MAX_CLOCK_SKEW_MS,
    })
}

fn load_schema(
    at: &At<'_>,
    inline: Option<toml::Table>,
    file: Option<String>,
    schemas: Option<SchemaReader<'_>>,
) -> Result<(Value, &'static str), CatalogError> {
    match (inline, file) {
        (Some(table), None) => {
            let schema = toml_to_json(&toml::Value::Table(table)).map_err(|detail| {
                CatalogError::InvalidSchema {
                    file: at.file(),
                    tool: at.tool(),
                    key: "schema",
                    detail,
                }
            })?;
            Ok((schema, "schema"))
        }
        (None, Some(relative)) => {
            let Some(read) = schemas else {
                return Err(CatalogError::SchemaFileWithoutDirectory {
                    file: at.file(),
                    tool: at.tool(),
                    path: relative,
                });
            };
            let (path, text) = read(&relative);
            let text = text.map_err(|source| CatalogError::SchemaFileRead {
                file: at.file(),
                tool: at.tool(),
                path: path.clone(),
                source,
            })?;
            let schema =
                serde_json::from_str(&text).map_err(|source| CatalogError::SchemaFileJson {
                    file: at.file(),
                    tool: at.tool(),
                    path,
                    source,
                })?;
            Ok((schema, "schema_file"))
        }
        (Some(_), Some(_)) | (None, None) => Err(CatalogError::SchemaChoice {
            file: at.file(),
            tool: at.tool(),
        }),
    }
}

/// Converts an inline TOML schema to JSON, refusing what JSON cannot hold.
fn toml_to_json(value: &toml::Value) -> Result<Value, String> {
    Ok(match value {
        toml::Value::String(text) => Value::String(text.clone()),
        toml::Value::Integer(number) => Value::from(*number),
        toml::Value::Float(number) => Number::from_f64(*number)
            .map(Value::Number)
            .ok_or_else(|| format!("{number} is not a JSON number"))?,
        toml::Value::Boolean(flag) => Value::Bool(*flag),
        // JSON has no date type; the toml crate already hands dates over as strings.
        toml::Value::Datetime(at) => Value::String(at.to_string()),
        toml::Value::Array(items) => {
            Value::Array(items.iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(table) => Value::Object(
            table
                .iter()
                .map(|(key, value)| Ok((key.clone(), toml_to_json(value)?)))
                .collect::<Result<Map<_, _>, String>>()?,
        ),
    })
}

fn parse_template(at: &At<'_>, key: &'static str, text: &str) -> Result<Template, CatalogError> {
    Template::parse(text).map_err(|problem| CatalogError::BadTemplate {
        file: at.file(),
        tool: at.tool(),
        key,
        template: text.to_owned(),
        problem,
    })
}

/// How a template or policy uses an argument field, which decides the types it may have.
#[derive(Clone, Copy)]
enum FieldUse {
    /// Rendered into a key or URL: a string, number or boolean.
    Text,
    /// Compared with a threshold: a number.
    Number,
}

/// Checks that `field` is declared in the schema's properties, required, and of a usable type.
fn check_field(
    at: &At<'_>,
    key: &'static str,
    field: &str,
    schema: &Value,
    usage: FieldUse,
) -> Result<(), CatalogError> {
    let Some(property) = schema
        .get("properties")
        .and_then(Value::as_object)
        .and_then(|properties| properties.get(field))
    else {
        return Err(CatalogError::UnknownField {
            file: at.file(),
            tool: at.tool(),
            key,
            field: field.to_owned(),
        });
    };
    let required = schema
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|required| required.iter().any(|name| name.as_str() == Some(field)));
    if !required {
        return Err(CatalogError::OptionalField {
            file: at.file(),
            tool: at.tool(),
            key,
            field: field.to_owned(),
        });
    }
    let declared: Vec<&str> = match property.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        Some(_) | None => Vec::new(),
    };
    let (allowed, expected): (&[&str], &'static str) = match usage {
        FieldUse::Text => (
            &["string", "number", "integer", "boolean"],
            "a string, number, integer or boolean",
        ),
        FieldUse::Number => (&["number", "integer"], "a number or integer"),
    };
    if declared.iter().any(|ty| !allowed.contains(ty)) {
        return Err(CatalogError::FieldType {
            file: at.file(),
            tool: at.tool(),
            key,
            field: field.to_owned(),
            declared: format!("{}; it must be {expected}", declared.join(" or ")),
        });
    }
    Ok(())
}

fn build_policy(
    at: &At<'_>,
    raw: RawPolicy,
    semantics: EffectSemantics,
    schema: &Value,
) -> Result<ToolPolicy, CatalogError> {
    let defaults = Rules::defaults(semantics);
    let millis = |ms: i64| u64::try_from(ms).unwrap_or(0);
    let policy = ToolPolicy {
        requires_approval: raw.requires_approval,
        approve_above: raw.approve_above,
        max_attempts: raw.max_attempts.unwrap_or(defaults.max_attempts),
        timeout_ms: raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        max_checks: raw.max_checks.unwrap_or(defaults.max_checks),
        max_replays: raw.max_replays.unwrap_or(defaults.max_replays),
        settle_ms: raw.settle_ms.unwrap_or(millis(defaults.settle_ms)),
        on_absent: raw.on_absent.unwrap_or(defaults.on_absent),
        lease_ttl_ms: raw.lease_ttl_ms.unwrap_or(millis(defaults.lease_ttl_ms)),
        verify_after_commit: raw.verify_after_commit,
        late_commit_ms: raw.late_commit_ms,
        verify_after_ms: raw
            .verify_after_ms
            .unwrap_or(millis(defaults.verify_after_ms)),
        approval_timeout_ms: raw
            .approval_timeout_ms
            .unwrap_or(millis(defaults.approval_timeout_ms)),
    };
    if policy.verify_after_ms < policy.settle_ms {
        return Err(CatalogError::VerifyBeforeSettle {
            file: at.file(),
            tool: at.tool(),
            verify_after_ms: policy.verify_after_ms,
            settle_ms: policy.settle_ms,
        });
    }
    for (key, value) in [
        ("policy.max_attempts", u64::from(policy.max_attempts)),
        ("policy.max_checks", u64::from(policy.max_checks)),
        ("policy.timeout_ms", policy.timeout_ms),
        ("policy.lease_ttl_ms", policy.lease_ttl_ms),
        ("policy.approval_timeout_ms", policy.approval_timeout_ms),
    ] {
        if value == 0 {
            return Err(CatalogError::Zero {
                file: at.file(),
                tool: at.tool(),
                key,
            });
        }
    }
    if let Some(threshold) = &policy.approve_above {
        check_field(
            at,
            "policy.approve_above.field",
            &threshold.field,
            schema,
            FieldUse::Number,
        )?;
    }
    Ok(policy)
}

#[derive(Clone, Copy)]
enum Section {
    Dispatch,
    StatusCheck,
    Compensate,
}

impl Section {
    fn key(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch.url",
            Self::StatusCheck => "status_check.url",
            Self::Compensate => "compensate.url",
        }
    }

    fn timeout_key(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch.timeout_ms",
            Self::StatusCheck => "status_check.timeout_ms",
            Self::Compensate => "compensate.timeout_ms",
        }
    }

    fn default_method(self) -> HttpMethod {
        match self {
            Self::Dispatch | Self::Compensate => HttpMethod::Post,
            Self::StatusCheck => HttpMethod::Get,
        }
    }
}

fn build_endpoint(
    at: &At<'_>,
    section: Section,
    raw: RawEndpoint,
    schema: &Value,
    policy: &ToolPolicy,
    has_business_key: bool,
) -> Result<HttpEndpoint, CatalogError> {
    let key = section.key();
    if !(raw.url.starts_with("http://") || raw.url.starts_with("https://")) {
        return Err(CatalogError::NotHttp {
            file: at.file(),
            tool: at.tool(),
            key,
            url: raw.url,
        });
    }
    // The authority (user info, host, port) ends at the first '/', '?' or '#' after the scheme:
    // a placeholder there would let an argument send the call to a host of its choosing.
    let authority = raw
        .url
        .split_once("://")
        .map_or("", |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if authority.contains(['{', '}']) {
        return Err(CatalogError::PlaceholderInAuthority {
            file: at.file(),
            tool: at.tool(),
            key,
            url: raw.url,
        });
    }
    let url = parse_template(at, key, &raw.url)?;
    for name in url.placeholders() {
        let unavailable = |placeholder, why| CatalogError::UnavailableKey {
            file: at.file(),
            tool: at.tool(),
            key,
            placeholder,
            why,
        };
        match name {
            "run_id" | "command_key" | "idempotency_key" => {}
            "business_key" if !has_business_key => {
                return Err(unavailable(
                    "business_key",
                    "the tool declares no business_key template",
                ));
            }
            "business_key" => {}
            "external_ref" => match section {
                Section::Compensate => {}
                Section::Dispatch | Section::StatusCheck => {
                    return Err(unavailable(
                        "external_ref",
                        "the external reference is only known after a dispatch returns; only compensate may use it",
                    ));
                }
            },
            field => check_field(at, key, field, schema, FieldUse::Text)?,
        }
    }
    let timeout_ms = raw.timeout_ms.unwrap_or(policy.timeout_ms);
    if timeout_ms == 0 {
        return Err(CatalogError::Zero {
            file: at.file(),
            tool: at.tool(),
            key: section.timeout_key(),
        });
    }
    Ok(HttpEndpoint {
        url,
        method: raw.method.unwrap_or(section.default_method()),
        timeout_ms,
    })
}

/// An HTTP header name: one or more RFC 9110 token characters.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ids::{CommandKey, RunId};

    const WIRE: &str = r#"
        policy_version = "7"
        [[tool]]
        name = "payments/wire"
        semantics = "NON_IDEMPOTENT"
        business_key = "{account}:{amount_minor}:{date}"
        schema = { type = "object", required = ["account", "amount_minor", "date"], additionalProperties = false, properties = { account = { type = "string" }, amount_minor = { type = "integer", minimum = 1 }, date = { type = "string", format = "date" } } }
        [tool.policy]
        approve_above = { field = "amount_minor", value = 1000000 }
        max_attempts = 4
        on_absent = "fail"
        settle_ms = 5000
        lease_ttl_ms = 20000
        [tool.dispatch]
        url = "http://bank/wires"
        timeout_ms = 3000
        [tool.status_check]
        url = "http://bank/wires/by-key/{business_key}?run={run_id}"
        [tool.compensate]
        url = "http://bank/wires/{external_ref}/reverse"
        timeout_ms = 40000
    "#;

    fn wire() -> Tool {
        let catalog = Catalog::from_toml_str(WIRE, "wire.toml").expect("the wire catalog is valid");
        catalog.tools()[0].clone()
    }

    #[test]
    fn templates_parse_placeholders_and_refuse_unbalanced_braces() {
        let template = Template::parse("x{a}-{b}y").expect("balanced");
        assert_eq!(template.placeholders().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(template.to_string(), "x{a}-{b}y");
        assert_eq!(
            Template::parse("a{b"),
            Err(TemplateError::Unclosed { at: 1 })
        );
        assert_eq!(
            Template::parse("a}b"),
            Err(TemplateError::Unopened { at: 1 })
        );
        assert_eq!(
            Template::parse("{a{b}}"),
            Err(TemplateError::Nested { at: 2 })
        );
        assert_eq!(Template::parse("a{}"), Err(TemplateError::Empty { at: 1 }));
        assert_eq!(
            Template::parse("{a b}"),
            Err(TemplateError::Whitespace { at: 0 })
        );
        assert_eq!(
            Template::parse("plain")
                .expect("no placeholders")
                .placeholders()
                .count(),
            0
        );
    }

    #[test]
    fn placeholders_stay_out_of_a_urls_scheme_host_and_port() {
        // Each declares a field `host`, so only the placeholder's position is at fault.
        let with_url = |section: &str, url: &str| {
            let text = WIRE
                .replace(
                    "required = [\"account\", \"amount_minor\", \"date\"]",
                    "required = [\"account\", \"amount_minor\", \"date\", \"host\"]",
                )
                .replace(
                    "date = { type = \"string\", format = \"date\" } }",
                    "date = { type = \"string\", format = \"date\" }, host = { type = \"string\" } }",
                )
                .replace(
                    &format!("[tool.{section}]\n        url = \""),
                    &format!("[tool.{section}]\n        url = \"{url}\"\n        x_was = \""),
                );
            // The old url is moved to a key that does not exist: drop that line again.
            let text: String = text
                .lines()
                .filter(|line| !line.trim_start().starts_with("x_was"))
                .map(|line| format!("{line}\n"))
                .collect();
            Catalog::from_toml_str(&text, "ssrf.toml")
        };
        for (section, key, url) in [
            ("dispatch", "dispatch.url", "http://{host}/wires"),
            ("dispatch", "dispatch.url", "https://{host}"),
            ("dispatch", "dispatch.url", "http://bank:{host}/wires"),
            (
                "dispatch",
                "dispatch.url",
                "http://{host}.bank.internal/wires",
            ),
            ("dispatch", "dispatch.url", "http://user:{host}@bank/wires"),
            (
                "status_check",
                "status_check.url",
                "http://bank{host}/by-key",
            ),
            (
                "compensate",
                "compensate.url",
                "http://{external_ref}/reverse",
            ),
        ] {
            let err = with_url(section, url).expect_err(url);
            assert!(
                matches!(err, CatalogError::PlaceholderInAuthority { .. }),
                "{url}: {err}"
            );
            let message = err.to_string();
            assert!(
                message.contains("ssrf.toml")
                    && message.contains("payments/wire")
                    && message.contains(key),
                "the error names the file, tool and key: {message}"
            );
        }
        for (section, url) in [
            ("dispatch", "http://bank/wires/{host}"),
            ("dispatch", "http://bank:8787/wires?to={host}"),
            ("status_check", "http://bank/by-key/{business_key}#{host}"),
        ] {
            with_url(section, url).unwrap_or_else(|e| panic!("{url} is fine: {e}"));
        }
    }

    #[test]
    fn rules_come_from_the_policy_and_the_declared_connectors() {
        let rules = wire().rules();
        assert_eq!(rules.semantics, EffectSemantics::NonIdempotent);
        assert_eq!(rules.max_attempts, 4);
        assert_eq!(rules.on_absent, OnAbsent::Fail);
        assert_eq!(rules.settle_ms, 5_000);
        assert_eq!(rules.lease_ttl_ms, 20_000);
        assert!(rules.has_status_check);
        assert!(rules.has_compensate);
        // The compensate call may take 40 s, so the sweep must wait longer than that.
        assert_eq!(rules.compensation_timeout_ms, 80_000);
        let defaults = Rules::defaults(EffectSemantics::NonIdempotent);
        assert_eq!(rules.max_checks, defaults.max_checks);
        assert_eq!(rules.backoff_base_ms, defaults.backoff_base_ms);
    }

    #[test]
    fn connector_timeouts_fall_back_to_the_policy_timeout() {
        let tool = wire();
        assert_eq!(tool.dispatch().endpoint.timeout_ms, 3_000);
        assert_eq!(tool.dispatch().endpoint.method, HttpMethod::Post);
        assert_eq!(
            tool.dispatch().reference,
            ReferenceSource::JsonPointer("/id".into())
        );
        let status = tool.status_check().expect("declared");
        assert_eq!(status.timeout_ms, DEFAULT_TIMEOUT_MS);
        assert_eq!(status.method, HttpMethod::Get);
    }

    #[test]
    fn validate_args_lists_every_violation_with_its_pointer() {
        let tool = wire();
        let ok = json!({"account": "acc-1", "amount_minor": 125000, "date": "2026-11-22"});
        assert_eq!(tool.validate_args(&ok), Ok(()));
        let bad = json!({"account": 7, "amount_minor": -5, "date": "2026-11-22"});
        let err = tool.validate_args(&bad).expect_err("two violations");
        let pointers: Vec<&str> = err
            .violations()
            .iter()
            .map(|v| v.pointer.as_str())
            .collect();
        assert!(pointers.contains(&"/account"), "{pointers:?}");
        assert!(pointers.contains(&"/amount_minor"), "{pointers:?}");
        assert_eq!(err.violations().len(), 2);
        assert!(err.to_string().ends_with("(and 1 more violation)"), "{err}");
        let only_amount = json!({"account": "a", "amount_minor": -5, "date": "2026-11-22"});
        let err = tool.validate_args(&only_amount).expect_err("below minimum");
        assert_eq!(
            err.to_string(),
            "/amount_minor: -5 is less than the minimum of 1"
        );
    }

    #[test]
    fn formats_are_asserted() {
        let args = json!({"account": "a", "amount_minor": 5, "date": "22/11/2026"});
        let err = wire().validate_args(&args).expect_err("not a date");
        assert_eq!(err.violations()[0].pointer, "/date");
    }

    #[test]
    fn missing_required_fields_are_reported_at_the_root() {
        let err = wire()
            .validate_args(&json!({"account": "a", "date": "2026-11-22"}))
            .expect_err("amount missing");
        assert_eq!(err.violations()[0].pointer, "");
        assert!(err.to_string().starts_with("arguments: "), "{err}");
        assert!(err.to_string().contains("amount_minor"), "{err}");
    }

    #[test]
    fn business_key_renders_strings_as_is_and_numbers_as_json() {
        let tool = wire();
        let args = json!({"account": "acc-1", "amount_minor": 125000, "date": "2026-11-22"});
        assert_eq!(
            tool.business_key(&args).expect("renders"),
            Some(BusinessKey::new("acc-1:125000:2026-11-22"))
        );
        let missing = tool
            .business_key(&json!({"account": "acc-1", "date": "d"}))
            .expect_err("amount missing");
        assert_eq!(missing.violations()[0].pointer, "/amount_minor");
        assert!(missing.to_string().contains("amount_minor"), "{missing}");
        let nested = tool
            .business_key(&json!({"account": {"id": 1}, "amount_minor": 1, "date": "d"}))
            .expect_err("object field");
        assert!(nested.to_string().contains("not an object"), "{nested}");
    }

    #[test]
    fn a_tool_without_a_business_key_template_has_none() {
        let text = WIRE
            .replace("business_key = \"{account}:{amount_minor}:{date}\"\n", "")
            .replace("/by-key/{business_key}", "/by-key/{idempotency_key}");
        let catalog = Catalog::from_toml_str(&text, "x.toml").expect("status check suffices");
        assert_eq!(catalog.tools()[0].business_key(&json!({})), Ok(None));
    }

    #[test]
    fn render_url_fills_keys_and_fields_and_encodes_each_as_a_path_segment() {
        let idem = IdempotencyKey::new(
            RunId::parse("r-abc").expect("valid"),
            CommandKey::parse("d-3/payments/wire/0").expect("valid"),
        );
        let business = BusinessKey::new("acc 1:5");
        let keys = UrlKeys {
            idempotency_key: &idem,
            business_key: Some(&business),
            external_ref: Some("w/1?x"),
        };
        let args = json!({"q": "a&b=c", "n": 12, "flag": true, "obj": {}});
        let render = |text: &str| render_url(&Template::parse(text).expect("valid"), &args, &keys);
        assert_eq!(
            render("http://h/{run_id}/{command_key}/{idempotency_key}").expect("renders"),
            "http://h/r-abc/d-3%2Fpayments%2Fwire%2F0/r-abc%2Fd-3%2Fpayments%2Fwire%2F0"
        );
        assert_eq!(
            render("http://h/{business_key}/{external_ref}?q={q}&n={n}&f={flag}").expect("renders"),
            "http://h/acc%201%3A5/w%2F1%3Fx?q=a%26b%3Dc&n=12&f=true"
        );
        assert_eq!(
            render("http://h/é{q}").expect("literal text is kept"),
            "http://h/éa%26b%3Dc"
        );
        assert_eq!(
            render("http://h/{missing}"),
            Err(RenderError::MissingField {
                field: "missing".into()
            })
        );
        assert_eq!(
            render("http://h/{obj}"),
            Err(RenderError::NotScalar {
                field: "obj".into(),
                kind: "an object"
            })
        );
        let bare = UrlKeys {
            idempotency_key: &idem,
            business_key: None,
            external_ref: None,
        };
        let template = Template::parse("http://h/{external_ref}").expect("valid");
        assert_eq!(
            render_url(&template, &args, &bare),
            Err(RenderError::MissingKey {
                key: "external_ref"
            })
        );
    }

    #[test]
    fn render_url_refuses_values_that_would_change_the_path() {
        let idem = IdempotencyKey::parse("r/d-1/a/b/0").expect("valid");
        let template = Template::parse("http://h/wires/{external_ref}/reverse").expect("valid");
        for value in ["..", ".", ""] {
            let keys = UrlKeys {
                idempotency_key: &idem,
                business_key: None,
                external_ref: Some(value),
            };
            assert!(
                matches!(
                    render_url(&template, &json!({}), &keys),
                    Err(RenderError::UnsafeValue { .. })
                ),
                "{value:?} must be refused"
            );
        }
    }

    #[test]
    fn tools_are_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tool>();
        assert_send_sync::<Catalog>();
    }

    #[test]
    fn debug_omits_the_compiled_validator() {
        let shown = format!("{:?}", wire());
        assert!(shown.contains("namespace: \"payments\""), "{shown}");
        assert!(shown.contains("business_key"), "{shown}");
        assert!(!shown.contains("validator"), "{shown}");
    }

    #[test]
    fn remote_schema_references_are_refused_without_fetching() {
        let text = WIRE.replace(
            "account = { type = \"string\" }",
            "account = { \"$ref\" = \"http://127.0.0.1:9/account.json\" }",
        );
        let err = Catalog::from_toml_str(&text, "x.toml").expect_err("no remote refs");
        assert!(
            matches!(err, CatalogError::InvalidSchema { key: "schema", .. }),
            "{err}"
        );
    }

    #[test]
    fn schema_dates_in_toml_become_json_strings() {
        let text = WIRE.replace(
            "format = \"date\" }",
            "format = \"date\", default = 2026-01-01 }",
        );
        let catalog = Catalog::from_toml_str(&text, "x.toml").expect("a date is kept as a string");
        assert_eq!(
            catalog.tools()[0].schema()["properties"]["date"]["default"],
            json!("2026-01-01")
        );
    }

    #[test]
    fn non_finite_floats_in_an_inline_schema_are_refused() {
        let text = WIRE.replace("minimum = 1 }", "minimum = 1, maximum = inf }");
        let err = Catalog::from_toml_str(&text, "x.toml").expect_err("inf is not JSON");
        assert!(
            err.to_string()
                .contains("x.toml: tool payments/wire: schema"),
            "{err}"
        );
        assert!(err.to_string().contains("not a JSON number"), "{err}");
    }
}
