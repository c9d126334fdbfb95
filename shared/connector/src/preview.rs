//! A dry run of a tool's calls: the exact request each endpoint would send for a command, its
//! credentials applied with every secret masked, nothing sent. For catalog authors
//! (`sluice catalog requests`).

use std::fmt::Write as _;
use std::time::SystemTime;

use sluice_core::catalog::Tool;
use sluice_core::command::Command;

use crate::credentials::{self, Mode, Outgoing, Secrets};
use crate::request::{self, Call, CallBody, Operation};

/// What `{callback_url}` shows in a dry run: the real one is signed for each attempt by the
/// dispatcher (`crate::callback`) and is a credential.
pub const PREVIEW_CALLBACK_URL: &str = "<public_url>/v1/callbacks/<token>";

/// One request as it would go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub operation: Operation,
    pub method: String,
    pub url: String,
    /// Every header, in the order sent; secrets masked (`<secret: env NAME>`).
    pub headers: Vec<(String, String)>,
    /// The body as text (JSON or the encoded form).
    pub body: Option<String>,
}

impl Preview {
    /// The request as an HTTP/1.1 message would show it.
    pub fn to_http(&self) -> String {
        let mut text = format!("{} {}\n", self.method, self.url);
        for (name, value) in &self.headers {
            let _ = writeln!(text, "{name}: {value}");
        }
        if let Some(body) = &self.body {
            let _ = write!(text, "\n{body}\n");
        }
        text
    }
}

/// The requests of every endpoint the tool declares, for `command`; the compensation for the
/// commit `external_ref`. An endpoint that cannot be rendered for the command says why.
pub fn requests(
    tool: &Tool,
    command: &Command,
    external_ref: Option<&str>,
) -> Vec<(Operation, Result<Preview, String>)> {
    let mut out = vec![(
        Operation::Dispatch,
        request::dispatch(
            tool,
            command,
            tool.uses_callback_url().then_some(PREVIEW_CALLBACK_URL),
        )
        .map_err(|e| e.to_string())
        .and_then(masked),
    )];
    if let Some(endpoint) = tool.status_check() {
        out.push((
            Operation::StatusCheck,
            request::status_check(tool, endpoint, command)
                .map_err(|e| e.to_string())
                .and_then(masked),
        ));
    }
    if let Some(endpoint) = tool.compensate() {
        out.push((
            Operation::Compensate,
            request::compensate(tool, endpoint, command, external_ref)
                .map_err(|e| e.to_string())
                .and_then(masked),
        ));
    }
    out
}

fn masked(call: Call) -> Result<Preview, String> {
    let body = match &call.body {
        Some(body) => Some(body.to_bytes().map_err(|e| e.to_string())?),
        None => None,
    };
    let mut headers = call.headers.clone();
    credentials::apply(
        &Secrets::new(),
        &call.credentials,
        Outgoing {
            method: &call.method,
            url: &call.url,
            headers: &mut headers,
            body: body.as_deref().unwrap_or_default(),
        },
        Mode::Masked,
        SystemTime::now(),
    )
    .map_err(|e| e.to_string())?;
    Ok(Preview {
        operation: call.operation,
        method: call.method.to_string(),
        url: call.url.to_string(),
        headers: headers
            .iter()
            .map(|(name, value)| {
                (
                    name.to_string(),
                    String::from_utf8_lossy(value.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: match &call.body {
            Some(CallBody::Json(value)) => {
                Some(serde_json::to_string_pretty(&**value).map_err(|e| e.to_string())?)
            }
            Some(CallBody::Form(text)) => Some(text.clone()),
            None => None,
        },
    })
}
