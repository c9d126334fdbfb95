//! Why a catalog was refused: every error names the file, the tool and the key.

use std::io;

use super::template::TemplateError;
use crate::error::IdError;
use crate::ids::ToolName;

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
    /// A policy rule: `tool` is `None` for a catalog-wide `[[rule]]` refused on its own.
    #[error("{file}: {}rule {rule}: {detail}", tool.as_ref().map(|tool| format!("tool {tool}: ")).unwrap_or_default())]
    BadRule {
        file: String,
        tool: Option<String>,
        rule: String,
        detail: String,
    },
    /// A `[budgets.<name>]` entry: `key` names the key at fault.
    #[error("{file}: budgets.{budget}: {key}: {detail}")]
    BadBudget {
        file: String,
        budget: String,
        key: String,
        detail: String,
    },
    /// An `[evidence_sources.<name>]` entry: `key` names the key at fault.
    #[error("{file}: evidence_sources.{source_name}: {key}: {detail}")]
    BadEvidenceSource {
        file: String,
        source_name: String,
        key: String,
        detail: String,
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
    #[error("{file}: credentials.{credential}: {detail}")]
    BadCredential {
        file: String,
        credential: String,
        detail: String,
    },
    #[error(
        "{file}: tool {tool}: {key} names credential {credential:?}, which is not declared; add a [credentials.{credential}] table"
    )]
    UnknownCredential {
        file: String,
        tool: String,
        key: String,
        credential: String,
    },
    #[error(
        "{file}: tool {tool}: {key}: header {header:?} would be written twice ({detail}); a call sends each header once"
    )]
    HeaderConflict {
        file: String,
        tool: String,
        key: String,
        header: String,
        detail: String,
    },
    #[error(
        "{file}: tool {tool}: {key} has user information (user:password@) before its host: a url never carries a secret; declare [credentials.<name>] with kind = \"basic\" or \"bearer\" and its secret in an env variable or a file, and set credential = \"<name>\" on the tool"
    )]
    UserInfoInUrl {
        file: String,
        tool: String,
        key: &'static str,
    },
    /// A request shape (body, headers, query, content type) or an answer reading that cannot be
    /// used; `detail` says why.
    #[error("{file}: tool {tool}: {key}: {detail}")]
    BadShape {
        file: String,
        tool: String,
        key: String,
        detail: String,
    },
    /// An `[mcp_servers.<name>]` declaration, or what the server listed, cannot be used.
    #[error("{file}: mcp server {server}: {detail}")]
    McpServer {
        file: String,
        server: String,
        detail: String,
    },
    /// One tool of an MCP server cannot be exposed as declared.
    #[error("{file}: mcp server {server}: tool {tool}: {detail}")]
    McpTool {
        file: String,
        server: String,
        tool: String,
        detail: String,
    },
    #[error("unknown tool {tool}")]
    UnknownTool { tool: ToolName },
    #[error(transparent)]
    InvalidName(#[from] IdError),
}
