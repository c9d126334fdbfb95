//! `[mcp_servers.<name>]` as written, and the declarations built from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::tools::RawMcpTool;
use super::{DEFAULT_MCP_TIMEOUT_MS, McpServer, McpTransport, StdioCommand};
use crate::catalog::credential::{Credential, CredentialKind, resolve_file};
use crate::catalog::error::CatalogError;
use crate::catalog::raw::describe;
use crate::catalog::variables::Variables;
use crate::ids::check_snake_case;

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

fn server_error(file: &str, server: &str, detail: String) -> CatalogError {
    CatalogError::McpServer {
        file: file.to_owned(),
        server: server.to_owned(),
        detail,
    }
}

/// Builds the catalog's `[mcp_servers.<name>]` declarations. `dir` resolves a relative `cwd`.
pub(in crate::catalog) fn build_servers(
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
