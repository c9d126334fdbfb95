//! One connection per MCP server per process, shared by concurrent calls: a stdio program is
//! started on first use and started again after it dies; an HTTP server is connected again
//! after its connection is lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::Method;
use reqwest::header::HeaderMap;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, RequestMetaObject};
use rmcp::service::{Peer, RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Map, Value};
use sluice_core::catalog::{McpServer, McpTransport, StdioCommand};
use tokio::io::AsyncBufReadExt;
use tracing::{debug, info};

use super::wire::Reply;
use crate::credentials::{self, Mode, Outgoing, Secrets};

/// The environment a stdio server inherits from Sluice's own: what a program needs to run
/// (the MCP SDKs' default list, and the locale and temporary directory). Nothing else —
/// Sluice's environment holds its own secrets; a server gets what its `env` and
/// `env_credentials` give it.
const INHERITED_ENV: [&str; 9] = [
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "LC_ALL", "TMPDIR",
];

/// A server's connection, made on first use.
#[derive(Debug)]
pub struct Link {
    server: McpServer,
    secrets: Arc<Secrets>,
    client: tokio::sync::Mutex<Option<RunningService<RoleClient, ()>>>,
}

impl Link {
    pub fn new(server: McpServer, secrets: Arc<Secrets>) -> Self {
        Self {
            server,
            secrets,
            client: tokio::sync::Mutex::new(None),
        }
    }

    pub fn server(&self) -> &McpServer {
        &self.server
    }

    /// The live connection, made (or made again, after the last one closed) now if need be.
    /// An error means nothing was sent.
    pub async fn peer(&self) -> Result<Peer<RoleClient>, String> {
        let mut slot = self.client.lock().await;
        if let Some(running) = slot.as_ref() {
            if !running.peer().is_transport_closed() {
                return Ok(running.peer().clone());
            }
            info!(server = %self.server.name, "MCP server connection closed; connecting again");
        }
        // The old service (and a stdio child with it) goes when it is replaced.
        let limit = Duration::from_millis(self.server.timeout_ms);
        let running = tokio::time::timeout(limit, self.connect())
            .await
            .map_err(|_| {
                format!(
                    "MCP server {}: no handshake within {} ms",
                    self.server.name, self.server.timeout_ms
                )
            })??;
        let peer = running.peer().clone();
        *slot = Some(running);
        Ok(peer)
    }

    /// Drops the connection (a stdio child is killed): the next call connects again.
    pub async fn close(&self) {
        if let Some(running) = self.client.lock().await.take() {
            let _ = running.cancel().await;
        }
    }

    async fn connect(&self) -> Result<RunningService<RoleClient, ()>, String> {
        let name = &self.server.name;
        match &self.server.transport {
            McpTransport::Stdio(command) => {
                let (transport, stderr) = self.spawn(command)?;
                if let Some(stderr) = stderr {
                    let server = name.clone();
                    tokio::spawn(async move {
                        let mut lines = tokio::io::BufReader::new(stderr).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            debug!(server = %server, stderr = %line, "MCP server stderr");
                        }
                    });
                }
                ().serve(transport)
                    .await
                    .map_err(|e| format!("MCP server {name}: handshake failed: {e}"))
            }
            McpTransport::Http { url, credential } => {
                let mut headers = HeaderMap::new();
                if let Some(credential) = credential {
                    let parsed = reqwest::Url::parse(url)
                        .map_err(|e| format!("MCP server {name}: url: {e}"))?;
                    credentials::apply(
                        &self.secrets,
                        std::slice::from_ref(credential),
                        Outgoing {
                            method: &Method::POST,
                            url: &parsed,
                            headers: &mut headers,
                            body: &[],
                        },
                        Mode::Send,
                        SystemTime::now(),
                    )
                    .map_err(|e| format!("MCP server {name}: {e}"))?;
                }
                let custom: HashMap<_, _> = headers
                    .iter()
                    .map(|(name, value)| (name.clone(), value.clone()))
                    .collect();
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let transport = StreamableHttpClientTransport::from_config(config);
                ().serve(transport)
                    .await
                    .map_err(|e| format!("MCP server {name}: handshake failed: {e}"))
            }
        }
    }

    fn spawn(
        &self,
        command: &StdioCommand,
    ) -> Result<(TokioChildProcess, Option<tokio::process::ChildStderr>), String> {
        let name = &self.server.name;
        let mut program = tokio::process::Command::new(&command.command);
        program.args(&command.args).env_clear();
        for key in INHERITED_ENV {
            if let Some(value) = std::env::var_os(key) {
                program.env(key, value);
            }
        }
        program.envs(&command.env);
        for (variable, credential) in &command.env_credentials {
            let Some(reference) = credential.kind.secrets().into_iter().next() else {
                continue;
            };
            let secret = self
                .secrets
                .read(&credential.name, reference)
                .map_err(|e| format!("MCP server {name}: {e}"))?;
            program.env(variable, secret.expose());
        }
        if let Some(cwd) = &command.cwd {
            program.current_dir(cwd);
        }
        TokioChildProcess::builder(program)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("MCP server {name}: cannot start {:?}: {e}", command.command))
    }

    /// One `tools/call`, within `timeout`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        meta: Map<String, Value>,
        timeout: Duration,
    ) -> Reply {
        let peer = match self.peer().await {
            Ok(peer) => peer,
            Err(reason) => return Reply::NotSent(reason),
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        params.meta = Some(RequestMetaObject::from(meta));
        match tokio::time::timeout(timeout, peer.call_tool(params)).await {
            Err(_) => Reply::Lost(format!(
                "MCP tool {tool}: no answer within {} ms",
                timeout.as_millis()
            )),
            Ok(Ok(result)) => match serde_json::to_value(&result) {
                Ok(value) => Reply::Result(value),
                Err(e) => Reply::Lost(format!("MCP tool {tool}: unreadable result: {e}")),
            },
            Ok(Err(ServiceError::McpError(error))) => Reply::Error {
                code: error.code.0,
                message: error.message.into_owned(),
            },
            Ok(Err(ServiceError::TransportSend(error))) if never_left(&error) => Reply::NotSent(
                format!("MCP tool {tool}: no connection to the server: {error}"),
            ),
            Ok(Err(other)) => Reply::Lost(format!("MCP tool {tool}: {}", describe(&other))),
        }
    }

    /// Every tool the server lists (`tools/list`, all pages).
    pub async fn list(&self) -> Result<Vec<rmcp::model::Tool>, String> {
        let peer = self.peer().await?;
        let limit = Duration::from_millis(self.server.timeout_ms);
        match tokio::time::timeout(limit, peer.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(e)) => Err(format!("tools/list failed: {}", describe(&e))),
            Err(_) => Err(format!(
                "tools/list: no answer within {} ms",
                self.server.timeout_ms
            )),
        }
    }
}

/// Whether a send failed before the request could reach the server: the HTTP connection was
/// refused or could not be made (a server that went away since the last call). Anything
/// else — a connection that broke, a timeout, a status — may have been after the server read
/// the request.
fn never_left(error: &rmcp::transport::DynamicTransportError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error.error.as_ref());
    while let Some(current) = source {
        // rmcp's HTTP error holds reqwest's without naming it as its source.
        if let Some(StreamableHttpError::Client(http)) =
            current.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            return http.is_connect();
        }
        if let Some(http) = current.downcast_ref::<reqwest::Error>() {
            return http.is_connect();
        }
        source = current.source();
    }
    false
}

fn describe(error: &ServiceError) -> String {
    match error {
        ServiceError::TransportClosed => {
            "the connection closed before the answer (the server may have acted)".into()
        }
        ServiceError::TransportSend(e) => format!("sending failed part-way: {e}"),
        ServiceError::Timeout { timeout } => {
            format!("no answer within {} ms", timeout.as_millis())
        }
        ServiceError::UnexpectedResponse => {
            "an answer of another kind than a tool result (a task or an input request)".into()
        }
        other => other.to_string(),
    }
}
