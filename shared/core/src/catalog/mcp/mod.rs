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
//! # a key may also be a JSON pointer: { "/entities/0/observations/-" = "Sluice-Key: …" }
//! on_error = "refused"                          # or "unknown": how isError reads
//! reference_pointer = "/sha"                    # into structuredContent (or the text as JSON)
//! [mcp_servers.git.tools.git_commit.status_check]
//! tool = "git_log"                              # another tool of the same server
//! timeout_ms = 10000                            # default: the server's, at most 10000
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

mod servers;
mod tools;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(super) use self::servers::build_servers;
pub(super) use self::tools::build_mcp_tool;
use super::credential::Credential;
use super::shape::BodyTemplate;
use super::template::Template;
use crate::command::EffectSemantics;

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
    /// The argument the idempotency key is written into (a model's own value is replaced): a
    /// top-level name, or a JSON pointer into the arguments.
    pub key_argument: Option<String>,
    /// Arguments rewritten before the call, in order: a top-level name, or a JSON pointer
    /// (`/entities/0/observations/-` appends to that array).
    pub set_arguments: Vec<(String, BodyTemplate)>,
    pub on_error: OnError,
    pub status_check: Option<McpLookup>,
    pub compensate: Option<McpCall>,
    pub semantics_source: SemanticsSource,
    /// The annotations the server listed, as it listed them.
    pub hints: ToolHints,
}
