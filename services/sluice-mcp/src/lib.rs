//! `sluice mcp`: a Model Context Protocol server (on the `rmcp` crate, over stdio or streamable
//! HTTP) that puts every tool call of an MCP agent through Sluice. It lists the catalog's tools
//! with their schemas and descriptions; each `tools/call` is recorded in the ledger before it
//! runs, executed under a lease with a stable idempotency key, reconciled when its outcome is
//! ambiguous, and answered with its result or with what a person must do.
//!
//! It is a client of the producer's HTTP API (`--url`), so it runs beside `sluice dev` or a
//! distributed deployment alike, and the API's roles apply.
//!
//! **Whose token.** Over stdio the client is whoever started the process, and the process's
//! token (`--token`, `SLUICE_TOKEN`) is its. Over HTTP every caller brings its own bearer token,
//! which is passed through, so each MCP client acts as its own agent; a request without one is
//! refused with 401 before MCP sees it. The process's token is never lent to an HTTP caller:
//! `sluice mcp --transport http` started where `SLUICE_TOKEN` holds an admin token would
//! otherwise make every local process an admin.
//!
//! **Protocol versions.** Every version `rmcp` knows, over both transports: the handshake
//! versions (2024-11-05 … 2025-11-25), where `initialize` opens a session, and 2026-07-28,
//! which over HTTP has none (`server/discover`, then self-contained requests: rmcp serves each
//! with a fresh [`SluiceMcp`] and cancels it when the client drops its stream).
//!
//! **Runs and journal positions.** The run is the MCP session: one per `sluice mcp` process
//! over stdio, one per `Mcp-Session-Id` over HTTP (`mcp-<session id>`), or the run a client
//! names in a call's `_meta` (`dev.sluice/run_id`), which a re-driven HTTP client must do (its
//! new session is a new default run) and a client without a session always does. The journal
//! position is kept per run *and conversation*: the process over stdio, the session over HTTP,
//! or the conversation a call names (`dev.sluice/conversation`, [`conversations`]), which a
//! client without a session keeps instead. So a new conversation naming a run re-drives it from
//! the start: the same calls in the same order get the same keys and the stored results. A
//! retry does not advance the journal: a call the client cancelled (its own timeout), or that
//! Sluice could not answer, leaves its position to the same call again; and a client may name
//! every position itself (`dev.sluice/call`, with `dev.sluice/decision`), the same key on any
//! replica. The rule, and what two conversations sharing a run get, is in [`position`]; where a
//! call's position comes from, in [`handler`].
//!
//! **Tasks and traces.** A client that declares the MCP Tasks extension gets a task for a call
//! that waits ([`tasks`]: the task is the command, read and cancelled through the API with the
//! caller's token). A call's `_meta.traceparent` and `tracestate` go to the API as the W3C
//! headers, so the effect joins the caller's trace.

mod bridge;
mod conversations;
mod handler;
mod position;
mod tasks;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Args, ValueEnum};
use futures::future::BoxFuture;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServiceExt};
use sluice_core::RunId;
use tokio_util::sync::CancellationToken;

pub use bridge::{Bridge, BridgeError, ListedTool, Outcome, mcp_name};
use conversations::Conversations;
use position::Conversation;

/// The `_meta` key naming the run of a call.
pub const META_RUN_ID: &str = "dev.sluice/run_id";
/// The `_meta` key naming the decision of a call.
pub const META_DECISION: &str = "dev.sluice/decision";
/// The `_meta` key naming the call index of a call (its position among the calls of its tool
/// in its decision).
pub const META_CALL: &str = "dev.sluice/call";
/// The `_meta` key naming the conversation a call is counted in, kept by the client: what a
/// client without a session (MCP 2026-07-28 over HTTP) names instead of each position.
pub const META_CONVERSATION: &str = "dev.sluice/conversation";
/// The `_meta` key delaying a call's effect by this many milliseconds (SCHEDULED until then).
pub const META_DELAY_MS: &str = "dev.sluice/delay_ms";
/// The `_meta` key naming when a call's effect runs (an RFC 3339 time; SCHEDULED until then).
pub const META_NOT_BEFORE: &str = "dev.sluice/not_before";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// JSON-RPC over this process's stdin and stdout (an MCP client starts `sluice mcp`).
    Stdio,
    /// Streamable HTTP on `--listen`, path `/mcp`.
    Http,
}

#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// How MCP clients reach this server.
    #[arg(long, value_enum, default_value = "stdio")]
    pub transport: Transport,
    /// Where the HTTP transport listens (loopback unless `--allowed-host` names others).
    #[arg(long, default_value = "127.0.0.1:8701")]
    pub listen: SocketAddr,
    /// Host names (or host:port) the HTTP transport accepts in `Host`, besides loopback: a
    /// guard against DNS rebinding. Repeat for each.
    #[arg(long = "allowed-host")]
    pub allowed_hosts: Vec<String>,
    /// The run of every call that names none: the default is a new `mcp-<uuid>` per process
    /// over stdio, and the session over HTTP.
    #[arg(long)]
    pub run_id: Option<String>,
    /// The longest one call waits for its effect to settle before answering "still running".
    #[arg(long, default_value = "120", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub max_wait_s: u64,
    /// Log filter on stderr, e.g. `info` or `sluice=debug,warn`; else `RUST_LOG`; else `warn`
    /// over stdio (an MCP client shows a server's stderr to its user) and `info` over HTTP.
    #[arg(long)]
    pub log_level: Option<String>,
}

impl McpArgs {
    /// The log filter: `--log-level`, else `rust_log` (the `RUST_LOG` variable), else quiet
    /// over stdio and `info` over HTTP.
    pub fn log_filter(&self, rust_log: Option<String>) -> String {
        self.log_level
            .clone()
            .or_else(|| rust_log.filter(|filter| !filter.trim().is_empty()))
            .unwrap_or_else(|| match self.transport {
                Transport::Stdio => "warn".to_owned(),
                Transport::Http => "info".to_owned(),
            })
    }
}

/// Serves MCP until the client goes (stdio) or `shutdown` (HTTP).
pub fn run(
    url: &str,
    token: Option<String>,
    args: McpArgs,
    shutdown: CancellationToken,
) -> BoxFuture<'_, anyhow::Result<()>> {
    Box::pin(run_body(url, token, args, shutdown))
}

async fn run_body(
    url: &str,
    token: Option<String>,
    args: McpArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let run_id = match &args.run_id {
        Some(raw) => Some(RunId::parse(raw).map_err(|e| anyhow::anyhow!("--run-id: {e}"))?),
        None if args.transport == Transport::Stdio => Some(RunId::parse(&format!(
            "mcp-{}",
            uuid::Uuid::new_v4().simple()
        ))?),
        None => None,
    };
    let bridge = Arc::new(Bridge::new(url, Duration::from_secs(args.max_wait_s)));
    let own_token = match args.transport {
        Transport::Stdio => token.map(Secret),
        Transport::Http => {
            if token.is_some() {
                tracing::info!(
                    "the process's token (--token, SLUICE_TOKEN) is not used over HTTP: each caller brings its own bearer token"
                );
            }
            None
        }
    };
    let server = SluiceMcp {
        bridge,
        run_id,
        transport: args.transport,
        own_token,
        conversation: Arc::default(),
        conversations: Arc::default(),
    };
    match args.transport {
        Transport::Stdio => {
            let running = server.serve(rmcp::transport::stdio()).await?;
            tokio::select! {
                quit = running.waiting() => { quit?; }
                () = shutdown.cancelled() => {}
            }
        }
        Transport::Http => {
            let mut allowed: Vec<String> =
                vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
            allowed.extend(args.allowed_hosts.iter().cloned());
            // Loopback hosts only unless named (DNS rebinding), and no browser origin at
            // all: an MCP client is not a web page, and a page must not drive an agent's tools.
            let config = StreamableHttpServerConfig::default()
                .with_cancellation_token(shutdown.child_token())
                .with_allowed_hosts(allowed)
                .enforce_origin_validation();
            // One server per session, each a conversation with its own journals (and one per
            // request without a session, MCP 2026-07-28, whose calls name their positions).
            let service: StreamableHttpService<SluiceMcp, LocalSessionManager> =
                StreamableHttpService::new(
                    move || Ok(server.new_conversation()),
                    Default::default(),
                    config,
                );
            let router = axum::Router::new()
                .nest_service("/mcp", service)
                .layer(axum::middleware::from_fn(a_deleted_session_is_204))
                .layer(axum::middleware::from_fn(callers_bring_a_token));
            let listener = tokio::net::TcpListener::bind(args.listen).await?;
            // The first line of stdout says where it listens (scripts and tests read it).
            println!(
                "sluice mcp listening on http://{}/mcp",
                listener.local_addr()?
            );
            axum::serve(listener, router)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await?;
        }
    }
    Ok(())
}

/// The MCP server: one per session (HTTP) or process (stdio), each its own conversation; the
/// bridge is shared.
#[derive(Debug, Clone)]
pub struct SluiceMcp {
    bridge: Arc<Bridge>,
    run_id: Option<RunId>,
    transport: Transport,
    /// The process's token: the stdio client's, never an HTTP caller's.
    own_token: Option<Secret>,
    /// The journal positions of this conversation's runs.
    conversation: Arc<Mutex<Conversation>>,
    /// The conversations clients name (`dev.sluice/conversation`), shared by all sessions.
    conversations: Arc<Conversations>,
}

impl SluiceMcp {
    /// The same server for a new conversation: its journals start empty.
    fn new_conversation(&self) -> Self {
        Self {
            conversation: Arc::default(),
            ..self.clone()
        }
    }
}

/// A token: never printed.
#[derive(Clone)]
struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The bearer token of an `Authorization` header, if it carries one.
fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// The token a request acts with: over stdio the process's, over HTTP the caller's own, and
/// none lent to an HTTP caller that sent none.
fn credential(
    transport: Transport,
    bearer: Option<String>,
    own: Option<&Secret>,
) -> Result<Option<String>, ErrorData> {
    match transport {
        Transport::Stdio => Ok(own.map(|secret| secret.0.clone())),
        Transport::Http => bearer
            .map(Some)
            .ok_or_else(|| ErrorData::invalid_request(NEEDS_A_TOKEN, None)),
    }
}

const NEEDS_A_TOKEN: &str = "a bearer token is needed: send your own Sluice token in Authorization (sluice mcp over HTTP lends none)";

/// The HTTP transport's door: a request without a bearer token of its own is refused (401)
/// before MCP sees it.
async fn callers_bring_a_token(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if bearer(request.headers()).is_some() {
        return next.run(request).await;
    }
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32001, "message": NEEDS_A_TOKEN},
    });
    (
        axum::http::StatusCode::UNAUTHORIZED,
        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(body),
    )
        .into_response()
}

/// A session's DELETE (the client ends it, as the transport specification has it) is
/// answered 204 No Content: rmcp closes the session before it answers, so the deletion is
/// done, not accepted for later, and its 202 made the official Python SDK log "Session
/// termination failed" (it takes 200 or 204).
async fn a_deleted_session_is_204(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let delete = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    if delete && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_stdio_acts_with_the_process_s_token() {
        let own = Secret("admin-token-0123456789".into());
        assert_eq!(
            credential(Transport::Stdio, None, Some(&own)).expect("stdio"),
            Some(own.0.clone())
        );
        assert_eq!(
            credential(Transport::Http, Some("mine".into()), Some(&own)).expect("http"),
            Some("mine".into()),
            "an HTTP caller acts as itself"
        );
        let refused = credential(Transport::Http, None, Some(&own)).expect_err("no token");
        assert!(refused.message.contains("bearer token"), "{refused:?}");
        assert_eq!(format!("{own:?}"), "<redacted>");
    }

    #[test]
    fn a_bearer_token_is_read_from_authorization_only() {
        let with = |value: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(
                axum::http::header::AUTHORIZATION,
                value.parse().expect("a header value"),
            );
            bearer(&headers)
        };
        assert_eq!(with("Bearer abc"), Some("abc".into()));
        assert_eq!(with("bearer abc"), Some("abc".into()));
        assert_eq!(with("BEARER  abc "), Some("abc".into()));
        assert_eq!(with("Bearer "), None);
        assert_eq!(with("Basic dXNlcjpwdw=="), None);
        assert_eq!(bearer(&axum::http::HeaderMap::new()), None);
    }

    #[test]
    fn mcp_names_have_no_slash() {
        let tool = sluice_core::ToolName::parse("payments/wire").expect("tool");
        assert_eq!(mcp_name(&tool), "payments__wire");
    }
}
