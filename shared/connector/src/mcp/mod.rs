//! [`McpConnector`]: the gateway's connector. The tools of upstream MCP servers declared in
//! the catalog (`[mcp_servers.<name>]`) are called through an MCP client (rmcp) instead of
//! HTTP; everything else about them — ledger, keys, leases, policy, audit — is the same as for
//! an HTTP tool.
//!
//! * [`wire`] — pure: each call's arguments and `_meta`, and what an answer means.
//! * [`link`] — the IO: one connection per server per process, shared by concurrent calls.
//!
//! At load, [`discover`] connects to each declared server, lists its tools and hands them to
//! the catalog's pure builder (`Catalog::with_mcp_tools`); the connections stay open for the
//! calls that follow.

pub mod link;
pub mod wire;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_core::catalog::{Catalog, CatalogError, ListedTool, Tool, ToolHints};
use sluice_core::command::Command;
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};
use tracing::{Instrument, debug, info_span, warn};

use self::link::Link;
use crate::classify::DEFAULT_EXCERPT_BYTES;
use crate::credentials::Secrets;
use crate::http::DEFAULT_MAX_RESPONSE_BYTES;
use crate::port::{CompensationTarget, Connector, StatusReport};
use crate::request::compensation_key;

/// How often a server that cannot be reached at load is tried, and the wait before the
/// second try (doubled each time).
pub const LOAD_ATTEMPTS: u32 = 3;
const LOAD_BACKOFF: Duration = Duration::from_millis(500);

/// The MCP connector: a [`Link`] per declared server.
#[derive(Debug, Clone)]
pub struct McpConnector {
    links: Arc<HashMap<String, Arc<Link>>>,
    /// A result larger than this is kept as an excerpt.
    max_result_bytes: usize,
    excerpt_bytes: usize,
}

impl McpConnector {
    /// A connector for the catalog's declared servers; nothing is connected yet.
    pub fn new(catalog: &Catalog, secrets: Arc<Secrets>) -> Self {
        let links = catalog
            .mcp_servers()
            .iter()
            .map(|server| {
                (
                    server.name.clone(),
                    Arc::new(Link::new(server.clone(), Arc::clone(&secrets))),
                )
            })
            .collect();
        Self {
            links: Arc::new(links),
            max_result_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            excerpt_bytes: DEFAULT_EXCERPT_BYTES,
        }
    }

    /// The link of a server, by its catalog name.
    pub fn link(&self, server: &str) -> Option<&Arc<Link>> {
        self.links.get(server)
    }

    /// Closes every connection (stdio programs are stopped).
    pub async fn close(&self) {
        for link in self.links.values() {
            link.close().await;
        }
    }

    fn link_of(&self, server: &str) -> Result<&Arc<Link>, String> {
        self.links
            .get(server)
            .ok_or_else(|| format!("MCP server {server} is not connected by this process"))
    }
}

/// What a server's `tools/list` entry says, for the catalog's builder.
pub fn listed(tool: &rmcp::model::Tool) -> ListedTool {
    let hints = tool
        .annotations
        .as_ref()
        .map(|annotations| ToolHints {
            read_only: annotations.read_only_hint,
            destructive: annotations.destructive_hint,
            idempotent: annotations.idempotent_hint,
            open_world: annotations.open_world_hint,
        })
        .unwrap_or_default();
    ListedTool {
        name: tool.name.to_string(),
        description: tool.description.as_ref().map(ToString::to_string),
        input_schema: Value::Object(tool.input_schema.as_ref().clone()),
        hints,
    }
}

/// Lists every declared server's tools through `connector` (bounded retries each) and adds the
/// allowed ones to the catalog. A server that cannot be reached is an error naming it and why.
pub async fn discover(catalog: Catalog, connector: &McpConnector) -> Result<Catalog, CatalogError> {
    if catalog.mcp_listed() {
        return Ok(catalog);
    }
    let mut listings = BTreeMap::new();
    for server in catalog.mcp_servers() {
        let link = connector
            .link(&server.name)
            .ok_or_else(|| CatalogError::McpServer {
                file: catalog.source_name().to_owned(),
                server: server.name.clone(),
                detail: "the connector was made for another catalog".into(),
            })?;
        let mut wait = LOAD_BACKOFF;
        let mut attempt = 1;
        let tools = loop {
            match link.list().await {
                Ok(tools) => break tools,
                Err(why) if attempt < LOAD_ATTEMPTS => {
                    warn!(server = %server.name, attempt, %why, "MCP server not reachable at load; trying again");
                    link.close().await;
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    attempt += 1;
                }
                Err(why) => {
                    return Err(CatalogError::McpServer {
                        file: catalog.source_name().to_owned(),
                        server: server.name.clone(),
                        detail: format!(
                            "cannot list its tools after {LOAD_ATTEMPTS} attempts: {why}"
                        ),
                    });
                }
            }
        };
        listings.insert(server.name.clone(), tools.iter().map(listed).collect());
    }
    catalog.with_mcp_tools(&listings)
}

/// The span of one `tools/call`, named and attributed by OpenTelemetry's MCP conventions
/// (`tools/call <tool>`, `mcp.method.name`, `gen_ai.tool.name`), with Sluice's own fields.
macro_rules! mcp_span {
    ($name:literal, $call:literal, $tool:expr, $command:expr, $binding:expr, $called:expr) => {
        info_span!(
            $name,
            otel.name = %format_args!("tools/call {}", $called),
            otel.kind = "client",
            mcp.method.name = "tools/call",
            gen_ai.tool.name = %$called,
            sluice.mcp_server = %$binding.server,
            sluice.call = $call,
            run_id = %$command.run_id,
            command_key = %$command.command_key,
            tool = %$tool.name(),
            outcome = tracing::field::Empty,
        )
    };
}

impl McpConnector {
    /// The `_meta` of a call in the current span: the keys, and the span's trace context in
    /// the command's trace.
    fn meta(command: &Command, key: &str) -> serde_json::Map<String, Value> {
        let trace = sluice_trace::for_call(command.trace.as_ref());
        wire::meta(command, key, trace.as_ref())
    }

    async fn dispatch_in(&self, tool: &Tool, command: &Command) -> DispatchOutcome {
        let Some(binding) = tool.mcp() else {
            return DispatchOutcome::NotSent {
                reason: format!("not sent: tool {} is not an MCP server's tool", tool.name()),
            };
        };
        let span = mcp_span!(
            "connector.mcp.dispatch",
            "dispatch",
            tool,
            command,
            binding,
            binding.tool
        );
        sluice_trace::adopt(&span, command.trace.as_ref());
        let arguments = match wire::dispatch_arguments(binding, command) {
            Ok(arguments) => arguments,
            Err(error) => {
                return DispatchOutcome::NotSent {
                    reason: format!("not sent: {error}"),
                };
            }
        };
        let link = match self.link_of(&binding.server) {
            Ok(link) => Arc::clone(link),
            Err(reason) => return DispatchOutcome::NotSent { reason },
        };
        let timeout = Duration::from_millis(tool.dispatch().endpoint.timeout_ms);
        let meta = span.in_scope(|| Self::meta(command, &command.idempotency_key.to_string()));
        let outcome = async {
            sluice_faults::point!("connector.dispatch.pre");
            let reply = link.call(&binding.tool, arguments, meta, timeout).await;
            sluice_faults::point!("connector.dispatch.post");
            let outcome = wire::dispatch(
                tool,
                binding,
                reply,
                self.max_result_bytes,
                self.excerpt_bytes,
            );
            tracing::Span::current().record("outcome", outcome.label());
            outcome
        }
        .instrument(span)
        .await;
        match &outcome {
            DispatchOutcome::Ambiguous { reason } | DispatchOutcome::NotSent { reason } => {
                warn!(tool = %tool.name(), %reason, "MCP dispatch without a verdict");
            }
            other => debug!(tool = %tool.name(), outcome = other.label(), "MCP dispatch"),
        }
        outcome
    }

    async fn status_check_in(&self, tool: &Tool, command: &Command) -> StatusReport {
        let Some((binding, lookup)) = tool
            .mcp()
            .and_then(|binding| Some((binding, binding.status_check.as_ref()?)))
        else {
            return StatusReport::inconclusive(json!({
                "error": format!("tool {} declares no status_check, so the effect cannot be observed", tool.name()),
            }));
        };
        let span = mcp_span!(
            "connector.mcp.status_check",
            "status_check",
            tool,
            command,
            binding,
            lookup.call.tool
        );
        sluice_trace::adopt(&span, command.trace.as_ref());
        let rendered = wire::call_arguments(&lookup.call, command, None, None).and_then(|args| {
            let needle = lookup
                .contains
                .as_ref()
                .map(|contains| {
                    wire::needle(contains, command)
                        .map(|text| (text, contains.ends_with_placeholder()))
                })
                .transpose()?;
            Ok((args, needle))
        });
        let filter = crate::request::match_filter(tool, command);
        let ((arguments, needle), filter) = match (rendered, filter) {
            (Ok(rendered), Ok(filter)) => (rendered, filter),
            (Err(error), _) => {
                return StatusReport::inconclusive(json!({ "error": error.to_string() }));
            }
            (_, Err(error)) => {
                return StatusReport::inconclusive(json!({ "error": error.to_string() }));
            }
        };
        let link = match self.link_of(&binding.server) {
            Ok(link) => Arc::clone(link),
            Err(error) => return StatusReport::inconclusive(json!({ "error": error })),
        };
        let timeout = Duration::from_millis(
            tool.status_check()
                .map_or(tool.dispatch().endpoint.timeout_ms, |check| {
                    check.timeout_ms
                }),
        );
        let meta = span.in_scope(|| Self::meta(command, &command.idempotency_key.to_string()));
        async {
            let reply = link.call(&lookup.call.tool, arguments, meta, timeout).await;
            let report = wire::status_check(
                tool,
                &lookup.call.tool,
                needle
                    .as_ref()
                    .map(|(text, bounded)| (text.as_str(), *bounded)),
                &filter,
                reply,
                self.excerpt_bytes,
            );
            tracing::Span::current().record("outcome", field_of(&report));
            debug!(observation = ?report.observation, "MCP status checked");
            report
        }
        .instrument(span)
        .await
    }

    async fn compensate_in(
        &self,
        tool: &Tool,
        command: &Command,
        target: CompensationTarget,
    ) -> CompensationOutcome {
        let Some((binding, undo)) = tool
            .mcp()
            .and_then(|binding| Some((binding, binding.compensate.as_ref()?)))
        else {
            return CompensationOutcome::Impossible {
                reason: format!(
                    "tool {} declares no compensate, so the commit cannot be undone automatically",
                    tool.name()
                ),
            };
        };
        let span = mcp_span!(
            "connector.mcp.compensate",
            "compensate",
            tool,
            command,
            binding,
            undo.tool
        );
        sluice_trace::adopt(&span, command.trace.as_ref());
        let external_ref = target.external_ref(command);
        let key = compensation_key(command, external_ref);
        let arguments = match wire::call_arguments(undo, command, external_ref, Some(&key)) {
            Ok(arguments) => arguments,
            Err(error) => {
                return CompensationOutcome::Impossible {
                    reason: format!("cannot call compensate: {error}"),
                };
            }
        };
        let link = match self.link_of(&binding.server) {
            Ok(link) => Arc::clone(link),
            Err(reason) => {
                return CompensationOutcome::Retry {
                    reason,
                    retry_after_ms: None,
                };
            }
        };
        let timeout = Duration::from_millis(
            tool.compensate()
                .map_or(tool.dispatch().endpoint.timeout_ms, |undo| undo.timeout_ms),
        );
        let meta = span.in_scope(|| Self::meta(command, &key));
        async {
            sluice_faults::point!("connector.compensate.pre");
            let reply = link.call(&undo.tool, arguments, meta, timeout).await;
            sluice_faults::point!("connector.compensate.post");
            wire::compensation(reply, self.excerpt_bytes)
        }
        .instrument(span)
        .await
    }
}

fn field_of(report: &StatusReport) -> &'static str {
    report.observation.as_str()
}

#[async_trait]
impl Connector for McpConnector {
    async fn dispatch(&self, tool: &Tool, command: &Command) -> DispatchOutcome {
        self.dispatch_in(tool, command).await
    }

    async fn status_check(&self, tool: &Tool, command: &Command) -> StatusReport {
        self.status_check_in(tool, command).await
    }

    async fn compensate(
        &self,
        tool: &Tool,
        command: &Command,
        target: CompensationTarget,
    ) -> CompensationOutcome {
        self.compensate_in(tool, command, target).await
    }
}

/// The connector services use: an MCP server's tools through [`McpConnector`], every other
/// tool through the HTTP connector.
#[derive(Debug, Clone)]
pub struct Routed<H> {
    pub http: H,
    pub mcp: McpConnector,
}

#[async_trait]
impl<H: Connector> Connector for Routed<H> {
    async fn dispatch(&self, tool: &Tool, command: &Command) -> DispatchOutcome {
        match tool.mcp() {
            Some(_) => self.mcp.dispatch(tool, command).await,
            None => self.http.dispatch(tool, command).await,
        }
    }

    async fn status_check(&self, tool: &Tool, command: &Command) -> StatusReport {
        match tool.mcp() {
            Some(_) => self.mcp.status_check(tool, command).await,
            None => self.http.status_check(tool, command).await,
        }
    }

    async fn compensate(
        &self,
        tool: &Tool,
        command: &Command,
        target: CompensationTarget,
    ) -> CompensationOutcome {
        match tool.mcp() {
            Some(_) => self.mcp.compensate(tool, command, target).await,
            None => self.http.compensate(tool, command, target).await,
        }
    }
}
