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
//! upstream = "bank"                 # optional: the [upstream.<name>] whose limits and breaker
//! #                                 # its calls count against (default: its dispatch URL's
//! #                                 # host's, with the default breaker; `upstream`)
//! breaker = false                   # optional, only without `upstream`: no circuit breaker
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
//! verify_after_refusal = false      # look a 4xx refusal up once more, for an upstream that can
//! #                                 # refuse after booking (needs a status check)
//! late_commit_ms = 10000            # how long after its timeout a call may still commit
//! #                                 # upstream (default: the dispatch timeout); an `absent`
//! #                                 # counts only after that
//! verify_after_ms = 30000           # a NON_IDEMPOTENT command that went through UNKNOWN or was
//! #                                 # redispatched is looked up once more this long after it
//! #                                 # settled; at least settle_ms
//! approval_timeout_ms = 86400000    # a BLOCKED command waits this long, then is cancelled
//! max_rate_limited_ms = 300000      # the most a command waits in all, per cycle, on answers
//! #                                 # asking for a later call (Retry-After on a 429 or 503, or
//! #                                 # a 403) without spending attempts or checks; past it they
//! #                                 # count as without the header; 0 turns it off; <= a day
//! rate_limited_commits_nothing = false  # such an answer proves nothing committed: a
//! #                                 # NON_IDEMPOTENT tool is resent after the wait without a
//! #                                 # look first (default: looked up first)
//!
//! [tool.dispatch]                   # required
//! url = "http://127.0.0.1:8787/bank/wires"
//! method = "POST"                   # GET | HEAD | POST | PUT | PATCH | DELETE (POST)
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
//! An upstream's base URL is named once as a variable (`${name}` anywhere in a URL, a body, a
//! header or a query value; see `variables`), overridable by the environment at load:
//!
//! ```toml
//! [variables]
//! bank = { default = "http://127.0.0.1:8787", env = "SLUICE_BANK_URL" }
//! ```
//!
//! Real APIs (Stripe, SES, GitHub, Jira, AWS) need more; every key below is optional:
//!
//! ```toml
//! [credentials.stripe]              # `credential`: secrets only by reference (env or file)
//! kind = "bearer"
//! token = { env = "STRIPE_SECRET_KEY" }
//!
//! [[tool]]
//! credential = "stripe"             # or a list; an endpoint's own `credential` replaces it
//! [tool.policy]
//! idempotency_key_ttl_ms = 86400000 # how long the upstream remembers a key (`shape`)
//! [tool.dispatch]
//! content_type = "form"             # json (default) | form
//! body = { amount = "{args.amount}", metadata = { order = "{args.order.id}" } }
//! headers = { "Stripe-Version" = "2024-06-20" }
//! query = { expand = "balance_transaction" }
//! idempotency_header = "Idempotency-Key"   # the default; "" sends none
//! require_reference = true          # default: when the compensation names {external_ref}
//! [tool.status_check]
//! absent_status = [404]             # only declared answers count; the rest is inconclusive
//! duplicate_status = [409]
//! matches = "/data"                 # or count = "/total": 0 absent, 1 present, more duplicate
//! match_reference_pointer = "/id"
//! match_where = { "/metadata/sluice_key" = "{idempotency_key}" }
//! [tool.compensate]
//! done_status = [404]               # 4xx answers meaning "already undone"
//! [tool.events]
//! include_args = ["currency"]       # top-level arguments its lifecycle events publish (none by
//! #                                 # default; never one the schema marks writeOnly/password)
//! [[tool.rule]]                     # policy rules in CEL (`rules`); `[[rule]]` at the top
//! name = "large-eur"                # level for the catalog, with `tools = ["payments/*"]`
//! when = "args.currency == 'EUR' && args.amount_minor > 100000"
//! then = "require_approval"         # allow | require_approval | deny
//! ```
//!
//! Templates (`business_key`, connector URLs, bodies, headers, query values) are literal text
//! with `{placeholder}`s; braces cannot be escaped. A `business_key` placeholder names a
//! top-level argument field. Any other placeholder names either one of the keys in [`URL_KEYS`]
//! (a key wins over an argument field of the same name), a top-level argument field, or a
//! nested one as `args.a.b` (a number indexes an array: `args.entities.0.name`, required in text
//! only where the schema's `minItems` promises the item). Every field a template names must be declared in the schema's
//! `properties`, listed in its `required`, and not typed as an object or array, so a command
//! that passed [`Tool::validate_args`] always renders. `{business_key}` needs a `business_key`
//! template; `{external_ref}` is only known after a dispatch and `{compensation_key}` is the
//! compensation's own key, so only `compensate` may use them; `{callback_url}` is the signed URL
//! an asynchronous tool's upstream reports the outcome to, so only the `dispatch` request of a
//! tool declaring `[tool.async]` may use it.
//!
//! The rules beyond shape: names are unique after bare-name resolution; the schema compiles
//! (with `format` assertions on) and is `type = "object"` at the top level; a NON_IDEMPOTENT
//! tool declares at least one of `business_key`, `status_check`, `compensate` unless
//! `allow_unsafe = true`; an OBSERVE_ONLY tool declares no `compensate`; `approve_above`
//! names a required numeric field.
//!
//! Upstream MCP servers are declared as `[mcp_servers.<name>]` (a program on stdio or a
//! streamable HTTP URL, and an `allow` list): their allowed tools become tools named
//! `<server>/<tool>` once the servers' listings are added ([`Catalog::with_mcp_tools`]); the
//! format, with the per-tool overrides, is in the `mcp` module.
//!
//! # Modules
//!
//! * `error` — [`CatalogError`], naming file, tool and key.
//! * `template` — `{placeholder}` templates and how they render for a command.
//! * `credential` — named credentials and secret references.
//! * `endpoint` — the dispatch, status check and compensate endpoints and how answers are read.
//! * `shape` — a request's body, headers, query and idempotency header.
//! * `args` — argument checks against the schema.
//! * `events` — `[tool.events]`: the arguments a tool publishes with its events.
//! * `rules` — `[[rule]]` and `[[tool.rule]]`: CEL conditions, compiled and checked at load.
//! * `budgets` — `[budgets.<name>]`: spend budgets over a `[tool.money]` field (format there;
//!   what they decide in `crate::budget`).
//! * `raw` — the TOML as written.
//! * `build` — the rules a tool must satisfy to load.
//! * `tool` — a validated [`Tool`] and its state machine [`Rules`].
//! * `variables` — `${name}`s in URLs, bodies, headers and query values, overridable by the
//!   environment.
//! * `mcp` — `[mcp_servers.<name>]`, the annotation mapping and the builder of a server's
//!   tools.

mod args;
mod asynchronous;
mod budgets;
mod build;
mod credential;
mod endpoint;
mod error;
mod events;
mod evidence;
pub mod mcp;
mod money;
mod raw;
mod rules;
mod schema;
mod shape;
mod template;
mod tool;
pub mod upstream;
mod variables;

#[cfg(test)]
mod callback_tests;
#[cfg(test)]
mod mcp_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

pub use self::args::{ArgsError, Violation};
pub use self::asynchronous::{AtDeadline, CallbackOutcome, MAX_DEADLINE_MS, ToolAsync};
use self::build::{build_tool, check_lease};
use self::credential::build_credentials;
pub use self::credential::{Credential, CredentialKind, SecretRef, TextOrSecret};
pub use self::endpoint::{
    DispatchConnector, HttpEndpoint, HttpMethod, MatchList, ReferenceSource, StatusAnswers,
};
pub use self::error::CatalogError;
pub use self::mcp::{
    ListedTool, McpBinding, McpCall, McpLookup, McpServer, McpTransport, OnError, SemanticsSource,
    StdioCommand, ToolHints, semantics_from_hints,
};
pub use self::money::{MAX_MINOR_UNITS, Money};
use self::raw::{RawCatalog, describe};
pub use self::rules::{MAX_RULE_SOURCE, RULE_VARIABLES, Rule, RuleEffect, RuleScope};
pub use self::shape::{
    BodyTemplate, ContentType, DEFAULT_IDEMPOTENCY_HEADER, RequestShape, form_pairs, render_value,
};
pub use self::template::{
    REDACTED, RenderError, Template, TemplateError, UrlKeys, path_segment, render_text, render_url,
    render_url_redacted, slot_value,
};
use self::tool::Joins;
pub use self::tool::{ApprovalThreshold, Tool, ToolPolicy};
use self::variables::Variables;
use crate::ids::{DEFAULT_NAMESPACE, ToolName, check_snake_case};
#[cfg(doc)]
use crate::machine::Rules;

/// The policy version of a catalog that does not declare one.
pub const DEFAULT_POLICY_VERSION: &str = "1";
/// Connector timeout of a tool that declares none.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// Where the external reference is read from a response unless the tool says otherwise.
pub const DEFAULT_REFERENCE_POINTER: &str = "/id";
/// The keys a template may name besides argument fields. `idempotency_key_sha256` is the
/// key's SHA-256 in hex (64 characters), for an API that limits its deduplication id (SQS: 128
/// characters); `compensation_key` is a compensation's own idempotency key; `callback_url` is
/// the signed, single-use URL an asynchronous tool's upstream POSTs the outcome to
/// (`crate::callback`).
pub const URL_KEYS: [&str; 8] = [
    "run_id",
    "command_key",
    "idempotency_key",
    "idempotency_key_sha256",
    "business_key",
    "external_ref",
    "compensation_key",
    "callback_url",
];
/// Longest violation message kept in an [`ArgsError`]; schema messages quote the instance.
const MAX_MESSAGE_LEN: usize = 300;

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
    credentials: BTreeMap<String, Arc<Credential>>,
    /// `[upstream.<name>]`, by name.
    upstreams: BTreeMap<String, crate::flow::UpstreamSpec>,
    /// The upstreams of tools naming none that the catalog does not declare, by host (or
    /// tool name): the default breaker, no limit.
    implicit: BTreeMap<String, crate::flow::UpstreamSpec>,
    /// `[mcp_servers.<name>]`, by name.
    mcp_servers: Vec<McpServer>,
    /// Their tools were added ([`Catalog::with_mcp_tools`]).
    mcp_listed: bool,
    /// `max_clock_skew_ms`, for the tools added later.
    clock_skew_ms: u64,
    /// `[[rule]]`, attached to the tools added later that they cover.
    catalog_rules: Vec<Arc<Rule>>,
    /// `[budgets.<name>]`, by name.
    budgets: Vec<crate::budget::Budget>,
    /// `[evidence_sources.<name>]`, by name.
    evidence_sources: BTreeMap<String, crate::evidence::EvidenceSource>,
}

/// Operator replays allowed over all of a run's commands unless the catalog says otherwise.
pub const DEFAULT_MAX_REPLAYS_PER_RUN: u32 = 10;

/// The bound on clock skew between Sluice's components unless the catalog says otherwise
/// (`max_clock_skew_ms`): leases and horizons are widened by it.
pub const DEFAULT_MAX_CLOCK_SKEW_MS: u64 = 500;

/// Reads a `schema_file`, given as written in the catalog; returns the path it read and the text.
type SchemaReader<'a> = &'a dyn Fn(&str) -> (String, io::Result<String>);

impl Catalog {
    /// Parses and validates a catalog; `source_name` names it in errors. `schema_file` is
    /// refused here (there is no directory to resolve it against): use [`Catalog::load`].
    pub fn from_toml_str(text: &str, source_name: &str) -> Result<Self, CatalogError> {
        Self::parse(text, source_name, None, None)
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
        Self::parse(&text, &shown, Some(&read), Some(dir))
    }

    fn parse(
        text: &str,
        file: &str,
        schemas: Option<SchemaReader<'_>>,
        dir: Option<&Path>,
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

        let variables = Variables::resolve(raw.variables, &|name| std::env::var(name).ok())
            .map_err(|detail| CatalogError::Malformed {
                file: file.to_owned(),
                detail,
            })?;
        let credentials = build_credentials(raw.credentials, file, dir)?;
        let clock_skew_ms = raw.max_clock_skew_ms.unwrap_or(DEFAULT_MAX_CLOCK_SKEW_MS);
        let upstreams = upstream::build_upstreams(raw.upstream, file)?;
        let mcp_servers = mcp::build_servers(raw.mcp_servers, file, dir, &credentials, &variables)?;
        let catalog_rules = rules::build_catalog_rules(raw.rule, file)?;
        let evidence_sources = evidence::build_sources(raw.evidence_sources, file, dir)?;
        let mut implicit = BTreeMap::new();
        let mut tools = Vec::with_capacity(raw.tool.len());
        let mut index = HashMap::with_capacity_and_hasher(raw.tool.len(), Default::default());
        for (position, entry) in raw.tool.into_iter().enumerate() {
            let mut tool = build_tool(
                entry,
                position + 1,
                file,
                &default_namespace,
                schemas,
                &credentials,
                &variables,
            )?;
            tool.clock_skew_ms = clock_skew_ms;
            match tool.joins {
                Joins::Named if !upstreams.contains_key(&tool.upstream) => {
                    return Err(CatalogError::MalformedTool {
                        file: file.to_owned(),
                        tool: tool.name.to_string(),
                        detail: format!(
                            "upstream {:?} is not declared: add [upstream.{}] or leave the key out",
                            tool.upstream, tool.upstream
                        ),
                    });
                }
                Joins::ByDefault if !upstreams.contains_key(&tool.upstream) => {
                    implicit
                        .entry(tool.upstream.clone())
                        .or_insert_with(|| upstream::by_default(&tool.upstream));
                }
                Joins::Named | Joins::ByDefault | Joins::Alone => {}
            }
            check_lease(&tool, file)?;
            if let Some(declared) = &tool.evidence {
                evidence::check_source(declared, &evidence_sources).map_err(|detail| {
                    CatalogError::MalformedTool {
                        file: file.to_owned(),
                        tool: tool.name.to_string(),
                        detail,
                    }
                })?;
            }
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
        let budgets = budgets::build_budgets(raw.budgets, file, &tools, !mcp_servers.is_empty())?;
        // Rules are checked once the budgets are known: a condition may read them.
        for tool in &mut tools {
            tool.rules = rules::attach(
                &tool.rules,
                &catalog_rules,
                file,
                &tool.name,
                &tool.schema,
                &budgets,
            )?;
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
            credentials,
            upstreams,
            implicit,
            mcp_listed: mcp_servers.is_empty(),
            mcp_servers,
            clock_skew_ms,
            catalog_rules,
            budgets,
            evidence_sources,
        })
    }

    /// `[evidence_sources.<name>]` by name.
    pub fn evidence_source(&self, name: &str) -> Option<&crate::evidence::EvidenceSource> {
        self.evidence_sources.get(name)
    }

    /// The tools whose `[tool.evidence]` names `source`, in catalog order.
    pub fn tools_with_evidence_from<'a>(
        &'a self,
        source: &'a str,
    ) -> impl Iterator<Item = &'a Tool> + 'a {
        self.tools
            .iter()
            .filter(move |tool| tool.evidence().is_some_and(|e| e.source == source))
    }

    /// The declared upstream MCP servers (`[mcp_servers.<name>]`).
    pub fn mcp_servers(&self) -> &[McpServer] {
        &self.mcp_servers
    }

    /// Whether every declared MCP server's tools are in the catalog (always, without servers).
    pub fn mcp_listed(&self) -> bool {
        self.mcp_listed
    }

    /// Adds the allowed tools of every declared MCP server, from what each listed
    /// (`listings`, by server name), after the catalog's own tools. Pure: the listing is the
    /// connector's IO. An allowed tool a server does not list, a server without a listing, or
    /// a tool that cannot be built is an error naming the file, the server and the tool; a
    /// listed tool that is not allowed is left out.
    pub fn with_mcp_tools(
        mut self,
        listings: &BTreeMap<String, Vec<ListedTool>>,
    ) -> Result<Self, CatalogError> {
        if self.mcp_listed {
            return Ok(self);
        }
        let file = self.source_name.clone();
        for server in &self.mcp_servers {
            let Some(listing) = listings.get(&server.name) else {
                return Err(CatalogError::McpServer {
                    file,
                    server: server.name.clone(),
                    detail: "its tools were not listed".into(),
                });
            };
            let names: std::collections::BTreeSet<&str> =
                listing.iter().map(|tool| tool.name.as_str()).collect();
            for allowed in &server.allow {
                let Some(listed) = listing.iter().find(|tool| &tool.name == allowed) else {
                    return Err(CatalogError::McpTool {
                        file,
                        server: server.name.clone(),
                        tool: allowed.clone(),
                        detail: format!(
                            "allowed, but the server does not list it (it lists {})",
                            names.iter().copied().collect::<Vec<_>>().join(", ")
                        ),
                    });
                };
                let mut tool =
                    mcp::build_mcp_tool(server, listed, &names, &file, self.clock_skew_ms)?;
                match tool.joins {
                    Joins::Named if !self.upstreams.contains_key(&tool.upstream) => {
                        return Err(CatalogError::MalformedTool {
                            file,
                            tool: tool.name.to_string(),
                            detail: format!(
                                "upstream {:?} is not declared: add [upstream.{}] or leave the key out",
                                tool.upstream, tool.upstream
                            ),
                        });
                    }
                    Joins::ByDefault if !self.upstreams.contains_key(&tool.upstream) => {
                        self.implicit
                            .entry(tool.upstream.clone())
                            .or_insert_with(|| upstream::by_default(&tool.upstream));
                    }
                    Joins::Named | Joins::ByDefault | Joins::Alone => {}
                }
                check_lease(&tool, &file)?;
                budgets::cover_added(&mut self.budgets, &tool, &file)?;
                tool.rules = rules::attach(
                    &tool.rules,
                    &self.catalog_rules,
                    &file,
                    &tool.name,
                    &tool.schema,
                    &self.budgets,
                )?;
                let position = self.tools.len();
                if let Some(first) = self.index.insert(tool.name.clone(), position) {
                    return Err(CatalogError::DuplicateTool {
                        file,
                        tool: tool.name.to_string(),
                        first: first + 1,
                        second: position + 1,
                    });
                }
                self.tools.push(tool);
            }
        }
        budgets::check_covered(&self.budgets, &file)?;
        self.mcp_listed = true;
        Ok(self)
    }

    /// The spend budgets (`[budgets.<name>]`), by name.
    pub fn budgets(&self) -> &[crate::budget::Budget] {
        &self.budgets
    }

    /// The catalog's named credentials.
    pub fn credentials(&self) -> impl Iterator<Item = &Credential> {
        self.credentials.values().map(|credential| &**credential)
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

    /// The declared upstreams (`[upstream.<name>]`).
    pub fn upstreams(&self) -> impl Iterator<Item = &crate::flow::UpstreamSpec> {
        self.upstreams.values()
    }

    /// The upstreams nobody declared that tools naming none join (by their host), each with
    /// the default breaker and no limit.
    pub fn default_upstreams(&self) -> impl Iterator<Item = &crate::flow::UpstreamSpec> {
        self.implicit.values()
    }

    /// What `tool`'s calls are limited by: the upstream it names, the one of its host (declared
    /// or by default), or — with `breaker = false` — itself with no limit and no breaker.
    pub fn upstream_of(&self, tool: &Tool) -> std::borrow::Cow<'_, crate::flow::UpstreamSpec> {
        match self
            .upstreams
            .get(&tool.upstream)
            .or_else(|| self.implicit.get(&tool.upstream))
        {
            Some(spec) => std::borrow::Cow::Borrowed(spec),
            None => std::borrow::Cow::Owned(crate::flow::UpstreamSpec::unlimited(&tool.upstream)),
        }
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
