//! The connector endpoints a tool declares (dispatch, status check, compensate), and how each
//! is built from its raw TOML section and checked against the tool's schema.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::{FieldUse, check_field};
use super::build::{At, parse_template};
use super::error::CatalogError;
use super::raw::RawEndpoint;
use super::template::Template;
use super::tool::ToolPolicy;

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

#[derive(Clone, Copy)]
pub(super) enum Section {
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

pub(super) fn build_endpoint(
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
pub(super) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}
