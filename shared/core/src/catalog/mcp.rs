//! `[mcp_servers.<name>]`: upstream MCP servers whose allowed tools become catalog tools.
//!
//! ```toml
//! [mcp_servers.git]
//! command = "mcp-server-git"                    # stdio: a program (PATH lookup) ...
//! args = ["--repository", "/srv/repo"]
//! env = { GIT_AUTHOR_NAME = "Sluice" }          # plain values
//! env_credentials = { GITHUB_TOKEN = "github" } # the secret of [credentials.github]
//! cwd = "/srv"                                  # optional; relative to the catalog's directory
//! # url = "https://mcp.example.com/mcp"         # ... or streamable HTTP
//! # credential = "vendor"                       # bearer, basic or header: sent on every request
//! timeout_ms = 30000                            # one call's limit (then: unknown)
//! allow = ["git_status", "git_log", "git_commit"]   # exposed as git/git_status, ...
//!
//! [mcp_servers.git.tools.git_commit]            # optional; must name an allowed tool
//! semantics = "NON_IDEMPOTENT"                  # else read from the tool's annotations
//! key_argument = "idempotency_key"              # the key is written into this argument
//! set_arguments = { message = "{args.message}\n\nSluice-Key: {idempotency_key}" }
//! on_error = "refused"                          # or "unknown": how isError reads
//! reference_pointer = "/sha"                    # into structuredContent (or the text as JSON)
//! [mcp_servers.git.tools.git_commit.status_check]
//! tool = "git_log"                              # another tool of the same server
//! arguments = { repo_path = "{args.repo_path}", max_count = 50 }
//! contains = "Sluice-Key: {idempotency_key}"    # or matches / match_where / count, as HTTP
//! [mcp_servers.git.tools.git_commit.compensate]
//! tool = "git_reset"
//! arguments = { repo_path = "{args.repo_path}" }
//! ```
//!
//! The core stays pure: [`super::Catalog`] parses the declarations ([`McpServer`]); the
//! connector crate connects, lists each server's tools and hands the listings to
//! [`super::Catalog::with_mcp_tools`], which builds the allowed ones as catalog tools
//! ([`build_mcp_tool`]). Semantics come from the tool's annotations ([`semantics_from_hints`])
//! unless the catalog names them: the hints are the server's claims, not promises
//! (docs/decisions.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DEFAULT_REFERENCE_POINTER;
use super::args::{FieldUse, check_field};
use super::build::{
    At, build_answers, build_policy, check_pointer, compile_schema, parse_template, toml_to_json,
};
use super::credential::{Credential, CredentialKind, resolve_file};
use super::endpoint::{
    DispatchConnector, EndpointContext, HttpEndpoint, HttpMethod, ReferenceSource, Section,
    StatusAnswers, check_placeholder,
};
use super::error::CatalogError;
use super::raw::{RawEndpoint, RawPolicy, describe};
use super::shape::{BodyTemplate, ContentType, RequestShape, Use};
use super::template::Template;
use super::tool::{Joins, Tool};
use super::variables::Variables;
use crate::command::EffectSemantics;
use crate::ids::{ToolName, check_snake_case};

/// A server's call limit unless it declares `timeout_ms`.
pub const DEFAULT_MCP_TIMEOUT_MS: u64 = 30_000;

/// A declared upstream MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct McpServer {
    /// Its name in the catalog: the namespace of its tools (`git/git_status`).
    pub name: String,
    pub transport: McpTransport,
    /// One call's limit: past it the call is ambiguous.
    pub timeout_ms: u64,
    /// The server's tools exposed as catalog tools, by the server's names.
    pub allow: Vec<String>,
    /// `[mcp_servers.<name>.tools.<tool>]`, kept as written (checked for shape at parse) and
    /// built once the server's listing is known.
    pub(super) overrides: BTreeMap<String, toml::Table>,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A program started by Sluice, speaking MCP on its stdin and stdout.
    Stdio(StdioCommand),
    /// A server speaking MCP's streamable HTTP transport at a URL.
    Http {
        url: String,
        /// Sent on every request, as the credential declares (bearer, basic or header).
        credential: Option<Arc<Credential>>,
    },
}

/// A stdio server's program. `env` values are plain text; `env_credentials` name the
/// credential whose one secret becomes the variable's value, read when the program starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioCommand {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub env_credentials: Vec<(String, Arc<Credential>)>,
    pub cwd: Option<PathBuf>,
}

/// The behaviour hints of a listed tool's `annotations` (MCP `ToolAnnotations`): claims of
/// the server, untrusted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolHints {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destructive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_world: Option<bool>,
}

/// One tool as a server listed it (`tools/list`).
#[derive(Debug, Clone, PartialEq)]
pub struct ListedTool {
    pub name: String,
    pub description: Option<String>,
    /// Its `inputSchema`.
    pub input_schema: Value,
    pub hints: ToolHints,
}

/// The semantics the annotations claim: `readOnlyHint: true` is OBSERVE_ONLY, else
/// `idempotentHint: true` IDEMPOTENT, else NON_IDEMPOTENT (the safe reading: an unknown
/// outcome is looked up or goes to a person, never re-sent blindly).
pub fn semantics_from_hints(hints: &ToolHints) -> EffectSemantics {
    if hints.read_only == Some(true) {
        EffectSemantics::ObserveOnly
    } else if hints.idempotent == Some(true) {
        EffectSemantics::Idempotent
    } else {
        EffectSemantics::NonIdempotent
    }
}

/// Where a tool's semantics came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SemanticsSource {
    /// Declared in the catalog (every `[[tool]]`, and an MCP tool's `semantics =`).
    Catalog,
    /// Read from the MCP server's annotations at load.
    Annotation,
}

impl SemanticsSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Catalog => "catalog",
            Self::Annotation => "annotation",
        }
    }
}

/// How `isError: true` and JSON-RPC errors other than the protocol's own read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Nothing happened: the tool refused.
    #[default]
    Refused,
    /// It may have happened: ambiguous, then a lookup or a person.
    Unknown,
}

/// A call of one of the server's tools with templated arguments (a lookup, a compensation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpCall {
    /// The server's name of the tool.
    pub tool: String,
    /// The arguments object, rendered for the command.
    pub arguments: BodyTemplate,
}

/// The lookup of an MCP tool: another tool of the same server, and how its answer reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpLookup {
    pub call: McpCall,
    /// For text answers: present when found once, duplicate when more than once, absent when
    /// the lookup succeeded without it. `None`: the JSON rules of [`StatusAnswers`].
    pub contains: Option<Template>,
}

/// What makes a catalog tool an MCP server's tool: how its calls are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpBinding {
    /// The server's catalog name.
    pub server: String,
    /// The server's name of the tool.
    pub tool: String,
    /// The argument the idempotency key is written into (a model's own value is replaced).
    pub key_argument: Option<String>,
    /// Top-level arguments rewritten before the call, by name.
    pub set_arguments: Vec<(String, BodyTemplate)>,
    pub on_error: OnError,
    pub status_check: Option<McpLookup>,
    pub compensate: Option<McpCall>,
    pub semantics_source: SemanticsSource,
    /// The annotations the server listed, as it listed them.
    pub hints: ToolHints,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_credentials: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    credential: Option<String>,
    timeout_ms: Option<u64>,
    allow: Vec<String>,
    #[serde(default)]
    tools: BTreeMap<String, toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpTool {
    semantics: Option<EffectSemantics>,
    description: Option<String>,
    business_key: Option<String>,
    key_argument: Option<String>,
    #[serde(default)]
    set_arguments: BTreeMap<String, toml::Value>,
    on_error: Option<OnError>,
    reference_pointer: Option<String>,
    upstream: Option<String>,
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    money: BTreeMap<String, super::money::Money>,
    #[serde(default)]
    events: super::events::RawEvents,
    status_check: Option<RawMcpLookup>,
    compensate: Option<RawMcpCall>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpLookup {
    tool: String,
    #[serde(default)]
    arguments: toml::Table,
    timeout_ms: Option<u64>,
    contains: Option<String>,
    matches: Option<String>,
    match_where: Option<BTreeMap<String, String>>,
    match_reference_pointer: Option<String>,
    count: Option<String>,
    reference_pointer: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpCall {
    tool: String,
    #[serde(default)]
    arguments: toml::Table,
    timeout_ms: Option<u64>,
}

fn server_error(file: &str, server: &str, detail: String) -> CatalogError {
    CatalogError::McpServer {
        file: file.to_owned(),
        server: server.to_owned(),
        detail,
    }
}

/// Builds the catalog's `[mcp_servers.<name>]` declarations. `dir` resolves a relative `cwd`.
pub(super) fn build_servers(
    raw: BTreeMap<String, toml::Table>,
    file: &str,
    dir: Option<&Path>,
    credentials: &BTreeMap<String, Arc<Credential>>,
    variables: &Variables,
) -> Result<Vec<McpServer>, CatalogError> {
    let mut servers = Vec::with_capacity(raw.len());
    for (name, table) in raw {
        let bad = |detail: String| server_error(file, &name, detail);
        check_snake_case(&name).map_err(|why| {
            bad(format!(
                "the server's name is the namespace of its tools, and {why}"
            ))
        })?;
        let raw = RawMcpServer::deserialize(toml::Value::Table(table))
            .map_err(|error| bad(describe(&error)))?;
        let expand = |key: &str, text: &str| {
            variables
                .expand(text)
                .map_err(|detail| bad(format!("{key}: {detail}")))
        };
        let credential = |key: &str, named: &str| {
            credentials.get(named).cloned().ok_or_else(|| {
                bad(format!(
                    "{key}: credential {named:?} is not declared: add [credentials.{named}]"
                ))
            })
        };
        let transport = match (raw.command, raw.url) {
            (Some(command), None) => {
                if raw.credential.is_some() {
                    return Err(bad(
                        "credential applies to a server reached by url; a program gets its secrets by env_credentials".into(),
                    ));
                }
                let command = expand("command", &command)?;
                if command.trim().is_empty() {
                    return Err(bad("command is empty".into()));
                }
                let args = raw
                    .args
                    .iter()
                    .map(|arg| expand("args", arg))
                    .collect::<Result<_, _>>()?;
                let mut env = BTreeMap::new();
                for (key, value) in raw.env {
                    env.insert(key, expand("env", &value)?);
                }
                let mut env_credentials = Vec::new();
                for (variable, named) in raw.env_credentials {
                    if env.contains_key(&variable) {
                        return Err(bad(format!(
                            "env_credentials.{variable}: {variable} is also set by env"
                        )));
                    }
                    let found = credential(&format!("env_credentials.{variable}"), &named)?;
                    if found.kind.secrets().len() != 1
                        || !matches!(
                            found.kind,
                            CredentialKind::Bearer { .. } | CredentialKind::Header { .. }
                        )
                    {
                        return Err(bad(format!(
                            "env_credentials.{variable}: credential {named} is of kind {}; an environment variable takes the one secret of a bearer or header credential",
                            found.kind.as_str()
                        )));
                    }
                    env_credentials.push((variable, found));
                }
                let cwd = match raw.cwd {
                    Some(cwd) => Some(resolve_file(dir, &expand("cwd", &cwd)?)),
                    None => None,
                };
                McpTransport::Stdio(StdioCommand {
                    command,
                    args,
                    env,
                    env_credentials,
                    cwd,
                })
            }
            (None, Some(url)) => {
                let url = expand("url", &url)?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(bad(format!(
                        "url {url:?} is not an http:// or https:// URL"
                    )));
                }
                let authority = url
                    .split_once("://")
                    .map_or("", |(_, rest)| rest)
                    .split(['/', '?', '#'])
                    .next()
                    .unwrap_or_default();
                if authority.contains('@') {
                    return Err(bad(
                        "url has user information before the host: a secret belongs in a credential"
                            .into(),
                    ));
                }
                if !raw.args.is_empty()
                    || !raw.env.is_empty()
                    || !raw.env_credentials.is_empty()
                    || raw.cwd.is_some()
                {
                    return Err(bad(
                        "args, env, env_credentials and cwd apply to a server started by command, not one reached by url".into(),
                    ));
                }
                let credential = match raw.credential {
                    Some(named) => {
                        let found = credential("credential", &named)?;
                        if !matches!(
                            found.kind,
                            CredentialKind::Bearer { .. }
                                | CredentialKind::Basic { .. }
                                | CredentialKind::Header { .. }
                        ) {
                            return Err(bad(format!(
                                "credential {named} is of kind {}; a server's requests carry a bearer, basic or header credential",
                                found.kind.as_str()
                            )));
                        }
                        Some(found)
                    }
                    None => None,
                };
                McpTransport::Http { url, credential }
            }
            (Some(_), Some(_)) | (None, None) => {
                return Err(bad(
                    "declare exactly one of command (a program on stdio) or url (streamable HTTP)"
                        .into(),
                ));
            }
        };
        let timeout_ms = raw.timeout_ms.unwrap_or(DEFAULT_MCP_TIMEOUT_MS);
        if timeout_ms == 0 {
            return Err(bad("timeout_ms must be above 0".into()));
        }
        if raw.allow.is_empty() {
            return Err(bad(
                "allow lists no tool: name the server's tools to expose (allow = [\"…\"])".into(),
            ));
        }
        let mut seen = BTreeSet::new();
        for tool in &raw.allow {
            if !seen.insert(tool.as_str()) {
                return Err(bad(format!("allow names {tool} twice")));
            }
        }
        for (tool, table) in &raw.tools {
            if !raw.allow.contains(tool) {
                return Err(CatalogError::McpTool {
                    file: file.to_owned(),
                    server: name.clone(),
                    tool: tool.clone(),
                    detail: format!(
                        "[mcp_servers.{name}.tools.{tool}] overrides a tool that is not allowed: add it to allow or remove the table"
                    ),
                });
            }
            // Shape errors now, before any server is reached.
            RawMcpTool::deserialize(toml::Value::Table(table.clone())).map_err(|error| {
                CatalogError::McpTool {
                    file: file.to_owned(),
                    server: name.clone(),
                    tool: tool.clone(),
                    detail: describe(&error),
                }
            })?;
        }
        servers.push(McpServer {
            name,
            transport,
            timeout_ms,
            allow: raw.allow,
            overrides: raw.tools,
        });
    }
    Ok(servers)
}

/// The address an MCP tool's endpoints show (`mcp://git/git_commit`): never sent anywhere.
fn endpoint(server: &str, tool: &str, timeout_ms: u64) -> Result<HttpEndpoint, CatalogError> {
    Ok(HttpEndpoint {
        url: Template::parse(&format!("mcp://{server}/{tool}")).map_err(|problem| {
            CatalogError::McpTool {
                file: String::new(),
                server: server.to_owned(),
                tool: tool.to_owned(),
                detail: problem.to_string(),
            }
        })?,
        method: HttpMethod::Post,
        timeout_ms,
        shape: RequestShape {
            content_type: ContentType::Json,
            body: None,
            headers: Vec::new(),
            query: Vec::new(),
            idempotency_header: None,
            credentials: Vec::new(),
        },
    })
}

/// An arguments table as a template, its placeholders checked for `section`.
fn arguments(
    at: &At<'_>,
    section: Section,
    key: &'static str,
    table: toml::Table,
    context: &EndpointContext<'_>,
) -> Result<BodyTemplate, CatalogError> {
    let bad = |detail: String| CatalogError::BadShape {
        file: at.file(),
        tool: at.tool(),
        key: key.to_owned(),
        detail,
    };
    let json = toml_to_json(&toml::Value::Table(table)).map_err(bad)?;
    let template = BodyTemplate::parse(&json)
        .map_err(|(pointer, problem)| bad(format!("{problem} in the string at {pointer}")))?;
    for (name, usage) in template.placeholders() {
        let usage = match usage {
            Use::Text => FieldUse::Text,
            Use::Whole | Use::WholeScalar => FieldUse::Whole,
        };
        check_placeholder(at, section, key, name, usage, context)?;
    }
    Ok(template)
}

/// Builds one allowed tool of `server` from what the server listed for it. `listed` names
/// every tool the server listed (a lookup or compensation may use one that is not allowed).
pub(super) fn build_mcp_tool(
    server: &McpServer,
    tool: &ListedTool,
    listed: &BTreeSet<&str>,
    file: &str,
    clock_skew_ms: u64,
) -> Result<Tool, CatalogError> {
    let label = format!("{}/{}", server.name, tool.name);
    let name =
        ToolName::from_parts(&server.name, &tool.name).map_err(|error| CatalogError::McpTool {
            file: file.to_owned(),
            server: server.name.clone(),
            tool: tool.name.clone(),
            detail: format!("its name cannot be a catalog tool's ({label}): {error}"),
        })?;
    let at = At { file, tool: &name };
    let table = server
        .overrides
        .get(&tool.name)
        .cloned()
        .unwrap_or_default();
    let mut raw = RawMcpTool::deserialize(toml::Value::Table(table)).map_err(|error| {
        CatalogError::McpTool {
            file: file.to_owned(),
            server: server.name.clone(),
            tool: tool.name.clone(),
            detail: describe(&error),
        }
    })?;

    let schema = tool.input_schema.clone();
    let validator = compile_schema(&at, &schema, "inputSchema")?;
    if schema.get("type") != Some(&Value::String("object".into())) {
        return Err(CatalogError::SchemaNotObject {
            file: at.file(),
            tool: at.tool(),
            key: "inputSchema",
        });
    }
    let (semantics, semantics_source) = match raw.semantics {
        Some(semantics) => (semantics, SemanticsSource::Catalog),
        None => (
            semantics_from_hints(&tool.hints),
            SemanticsSource::Annotation,
        ),
    };
    let business_key = match raw.business_key.take() {
        Some(text) => {
            let template = parse_template(&at, "business_key", &text)?;
            for field in template.placeholders() {
                check_field(&at, "business_key", field, &schema, FieldUse::Text)?;
            }
            Some(template)
        }
        None => None,
    };
    // The server's timeout is the call's unless the tool's policy names one.
    let timeout_ms = raw.policy.timeout_ms.unwrap_or(server.timeout_ms);
    raw.policy.timeout_ms = Some(timeout_ms);
    // A server's calls may be slow (a program started on first use, a model behind it): the
    // lease and the last look follow its timeout when the tool does not set them, so a
    // `timeout_ms` alone is a valid declaration.
    let defaults = crate::machine::Rules::defaults(semantics);
    let millis = |ms: i64| u64::try_from(ms).unwrap_or(0);
    let reach = timeout_ms.saturating_add(clock_skew_ms);
    if raw.policy.lease_ttl_ms.is_none() && millis(defaults.lease_ttl_ms) <= reach {
        raw.policy.lease_ttl_ms = Some(reach.saturating_add(timeout_ms));
    }
    let settle_ms = raw.policy.settle_ms.unwrap_or(millis(defaults.settle_ms));
    let landing = raw
        .policy
        .late_commit_ms
        .unwrap_or(timeout_ms)
        .saturating_add(clock_skew_ms)
        .saturating_add(settle_ms);
    if raw.policy.verify_after_ms.is_none() && millis(defaults.verify_after_ms) < landing {
        raw.policy.verify_after_ms = Some(landing);
    }
    let policy = build_policy(&at, raw.policy, semantics, &schema)?;
    let money = super::money::build_money(&at, raw.money, &schema)?;
    let event_args = super::events::build_events(&at, raw.events, &schema)?;
    for (flag, key) in [
        (policy.verify_after_commit, "policy.verify_after_commit"),
        (policy.verify_after_refusal, "policy.verify_after_refusal"),
    ] {
        if flag && raw.status_check.is_none() {
            return Err(CatalogError::MalformedTool {
                file: at.file(),
                tool: at.tool(),
                detail: format!("{key} needs a status_check to look the effect up"),
            });
        }
    }
    let context = EndpointContext {
        schema: &schema,
        policy: &policy,
        has_business_key: business_key.is_some(),
        credentials: &BTreeMap::new(),
        tool_credential: &[],
    };

    let mut set_arguments = Vec::with_capacity(raw.set_arguments.len());
    for (argument, value) in raw.set_arguments {
        let bad = |detail: String| CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: format!("set_arguments.{argument}"),
            detail,
        };
        let json = toml_to_json(&value).map_err(bad)?;
        let template = BodyTemplate::parse(&json)
            .map_err(|(pointer, problem)| bad(format!("{problem} in the string at {pointer}")))?;
        for (placeholder, usage) in template.placeholders() {
            let usage = match usage {
                Use::Text => FieldUse::Text,
                Use::Whole | Use::WholeScalar => FieldUse::Whole,
            };
            check_placeholder(
                &at,
                Section::Dispatch,
                "set_arguments",
                placeholder,
                usage,
                &context,
            )?;
        }
        set_arguments.push((argument, template));
    }
    if let Some(argument) = &raw.key_argument {
        if argument.is_empty() {
            return Err(CatalogError::BadShape {
                file: at.file(),
                tool: at.tool(),
                key: "key_argument".into(),
                detail: "names no argument".into(),
            });
        }
        if set_arguments.iter().any(|(name, _)| name == argument) {
            return Err(CatalogError::BadShape {
                file: at.file(),
                tool: at.tool(),
                key: "key_argument".into(),
                detail: format!("{argument} is also rewritten by set_arguments"),
            });
        }
    }
    let reference_pointer = raw
        .reference_pointer
        .take()
        .unwrap_or_else(|| DEFAULT_REFERENCE_POINTER.to_owned());
    check_pointer(&at, "reference_pointer", &reference_pointer)?;
    let reference = ReferenceSource::JsonPointer(reference_pointer);

    let sibling = |key: &str, named: &str| -> Result<(), CatalogError> {
        if listed.contains(named) {
            Ok(())
        } else {
            Err(CatalogError::McpTool {
                file: file.to_owned(),
                server: server.name.clone(),
                tool: tool.name.clone(),
                detail: format!(
                    "{key}.tool: the server lists no tool {named:?} (it lists {})",
                    listed.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            })
        }
    };
    let (lookup, status_answers, status_endpoint) = match raw.status_check {
        None => (None, StatusAnswers::default(), None),
        Some(check) => {
            sibling("status_check", &check.tool)?;
            let call = McpCall {
                arguments: arguments(
                    &at,
                    Section::StatusCheck,
                    "status_check.arguments",
                    check.arguments,
                    &context,
                )?,
                tool: check.tool,
            };
            let json_rules = check.matches.is_some()
                || check.count.is_some()
                || check.match_where.is_some()
                || check.match_reference_pointer.is_some()
                || check.reference_pointer.is_some();
            let contains = match check.contains {
                Some(_) if json_rules => {
                    return Err(CatalogError::BadShape {
                        file: at.file(),
                        tool: at.tool(),
                        key: "status_check.contains".into(),
                        detail: "contains reads a text answer; matches, match_where, match_reference_pointer, count and reference_pointer read a JSON one: set one kind".into(),
                    });
                }
                Some(text) => {
                    let template = parse_template(&at, "status_check.contains", &text)?;
                    if template.placeholders().next().is_none() {
                        return Err(CatalogError::BadShape {
                            file: at.file(),
                            tool: at.tool(),
                            key: "status_check.contains".into(),
                            detail: "names no key or argument, so every answer would hold it: include {idempotency_key} (or what set_arguments wrote)".into(),
                        });
                    }
                    for placeholder in template.placeholders() {
                        check_placeholder(
                            &at,
                            Section::StatusCheck,
                            "status_check.contains",
                            placeholder,
                            FieldUse::Text,
                            &context,
                        )?;
                    }
                    Some(template)
                }
                None => None,
            };
            let mut rules = RawEndpoint {
                url: String::new(),
                method: None,
                timeout_ms: None,
                content_type: None,
                body: None,
                headers: BTreeMap::new(),
                query: BTreeMap::new(),
                idempotency_header: None,
                credential: None,
                reference_pointer: check.reference_pointer,
                reference_header: None,
                in_progress_status: None,
                require_reference: None,
                absent_status: None,
                duplicate_status: None,
                matches: check.matches,
                match_reference_pointer: check.match_reference_pointer,
                count: check.count,
                match_where: check.match_where,
                done_status: None,
            };
            let answers = build_answers(&at, &mut rules, &reference, &context)?;
            let timeout_ms = check.timeout_ms.unwrap_or(server.timeout_ms);
            let shown = endpoint(&server.name, &call.tool, timeout_ms)?;
            (Some(McpLookup { call, contains }), answers, Some(shown))
        }
    };
    let (compensate, compensate_endpoint) = match raw.compensate {
        None => (None, None),
        Some(undo) => {
            sibling("compensate", &undo.tool)?;
            let call = McpCall {
                arguments: arguments(
                    &at,
                    Section::Compensate,
                    "compensate.arguments",
                    undo.arguments,
                    &context,
                )?,
                tool: undo.tool,
            };
            let timeout_ms = undo.timeout_ms.unwrap_or(server.timeout_ms);
            let shown = endpoint(&server.name, &call.tool, timeout_ms)?;
            (Some(call), Some(shown))
        }
    };
    if semantics == EffectSemantics::ObserveOnly && compensate.is_some() {
        return Err(CatalogError::CompensateOnObserveOnly {
            file: at.file(),
            tool: at.tool(),
        });
    }
    let require_reference = compensate.as_ref().is_some_and(|call| {
        call.arguments
            .placeholders()
            .iter()
            .any(|(name, _)| *name == "external_ref")
    });
    let (upstream, joins) = match raw.upstream {
        Some(named) => (named, Joins::Named),
        None => (format!("mcp:{}", server.name), Joins::ByDefault),
    };
    let dispatch = DispatchConnector {
        endpoint: endpoint(&server.name, &tool.name, policy.timeout_ms)?,
        reference,
        in_progress_status: Vec::new(),
        require_reference,
    };
    let description = raw
        .description
        .or_else(|| tool.description.clone())
        .unwrap_or_default();
    Ok(Tool {
        name,
        description,
        semantics,
        schema,
        validator: Arc::new(validator),
        business_key,
        policy,
        dispatch,
        status_check: status_endpoint,
        status_answers,
        compensate: compensate_endpoint,
        compensate_done_status: Vec::new(),
        // A NON_IDEMPOTENT MCP tool without a lookup is allowed: its unknown outcome goes to
        // a person (the machine's `look_for`), never to a blind second call.
        allow_unsafe: false,
        clock_skew_ms,
        upstream,
        joins,
        money,
        event_args: Arc::from(event_args),
        mcp: Some(Arc::new(McpBinding {
            server: server.name.clone(),
            tool: tool.name.clone(),
            key_argument: raw.key_argument,
            set_arguments,
            on_error: raw.on_error.unwrap_or_default(),
            status_check: lookup,
            compensate,
            semantics_source,
            hints: tool.hints.clone(),
        })),
    })
}
