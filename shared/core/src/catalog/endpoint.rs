//! The connector endpoints a tool declares (dispatch, status check, compensate), and how each
//! is built from its raw TOML section and checked against the tool's schema.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::args::{FieldUse, check_path};
use super::build::{At, parse_template};
use super::credential::Credential;
use super::error::CatalogError;
use super::raw::RawEndpoint;
use super::shape::{BodyTemplate, ContentType, DEFAULT_IDEMPOTENCY_HEADER, RequestShape, Use};
use super::template::{Slot, Template};
use super::tool::ToolPolicy;

/// HTTP method of a connector call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum HttpMethod {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
}

impl HttpMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
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
    /// Body, headers, query, idempotency header and credentials.
    pub shape: RequestShape,
}

impl HttpEndpoint {
    /// Whether a template of the endpoint (its URL, body, headers or query) names the
    /// placeholder `name`.
    pub fn names(&self, name: &str) -> bool {
        self.url.placeholders().any(|named| named == name)
            || self
                .shape
                .body
                .as_ref()
                .is_some_and(|body| body.placeholders().iter().any(|(named, _)| *named == name))
            || self
                .shape
                .headers
                .iter()
                .chain(&self.shape.query)
                .any(|(_, value)| value.placeholders().any(|named| named == name))
    }
}

/// How a status check's answer is read. Only what is declared counts: any other answer (a 401,
/// the 404 of a route the upstream lacks, a 2xx of another shape) is inconclusive.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusAnswers {
    /// Statuses that mean "no such effect" (404 for a by-key lookup, when the tool says so).
    pub absent_status: Vec<u16>,
    /// Statuses that mean "more than one commit", with a `refs` list in the body.
    pub duplicate_status: Vec<u16>,
    /// How a 2xx is read; without one, a 2xx means present.
    pub list: Option<MatchList>,
    /// A JSON pointer to the command's own reference in a 2xx answer, instead of the
    /// dispatch's reference source (or, with a list, the first match's reference).
    pub reference_pointer: Option<String>,
}

/// A lookup that answers with the matching effects: 0 is absent, 1 present, more duplicate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchList {
    /// A JSON pointer to the array of matches, the pointer of each match's reference, and the
    /// fields an item must hold to count as a match (`match_where`: a pointer into the item and
    /// the text it must equal), for APIs whose filters are loose (json-server drops an unknown
    /// query field and answers every record) or missing (a list filtered here).
    Items {
        pointer: String,
        reference: String,
        filter: Vec<(String, Template)>,
    },
    /// A JSON pointer to the number of matches (references unknown).
    Count { pointer: String },
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
    /// A 2xx without a reference is ambiguous (looked up), not a commit without one.
    pub require_reference: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Section {
    Dispatch,
    StatusCheck,
    Compensate,
}

impl Section {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch",
            Self::StatusCheck => "status_check",
            Self::Compensate => "compensate",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch.url",
            Self::StatusCheck => "status_check.url",
            Self::Compensate => "compensate.url",
        }
    }

    pub(super) fn sub_key(self, sub: &'static str) -> &'static str {
        // Static so the catalog's errors can keep `&'static str` keys; every pair is listed.
        match (self, sub) {
            (Self::Dispatch, "body") => "dispatch.body",
            (Self::Dispatch, "headers") => "dispatch.headers",
            (Self::Dispatch, "query") => "dispatch.query",
            (Self::Dispatch, "credential") => "dispatch.credential",
            (Self::StatusCheck, "body") => "status_check.body",
            (Self::StatusCheck, "headers") => "status_check.headers",
            (Self::StatusCheck, "query") => "status_check.query",
            (Self::StatusCheck, "credential") => "status_check.credential",
            (Self::Compensate, "body") => "compensate.body",
            (Self::Compensate, "headers") => "compensate.headers",
            (Self::Compensate, "query") => "compensate.query",
            (Self::Compensate, "credential") => "compensate.credential",
            (Self::Dispatch, _) => "dispatch",
            (Self::StatusCheck, _) => "status_check",
            (Self::Compensate, _) => "compensate",
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

/// What an endpoint's templates may name besides argument fields, and the credentials it may
/// use.
pub(super) struct EndpointContext<'a> {
    pub(super) schema: &'a Value,
    pub(super) policy: &'a ToolPolicy,
    pub(super) has_business_key: bool,
    pub(super) credentials: &'a BTreeMap<String, Arc<Credential>>,
    /// The tool's own `credential`, used by an endpoint that names none.
    pub(super) tool_credential: &'a [String],
    /// The tool declares `[tool.async]`: its dispatch may name `{callback_url}`.
    pub(super) is_async: bool,
}

/// Headers a catalog may not set by name: the transport's own, and `authorization`, which only
/// a credential writes (a secret is never catalog text).
const RESERVED_HEADERS: [&str; 7] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "authorization",
    "proxy-authorization",
];

pub(super) fn build_endpoint(
    at: &At<'_>,
    section: Section,
    raw: &mut RawEndpoint,
    context: &EndpointContext<'_>,
) -> Result<HttpEndpoint, CatalogError> {
    let key = section.key();
    // User information before the host would put a secret in the catalog, the evidence and the
    // audit chain: refused first, before any error could echo the url.
    let after_scheme = raw
        .url
        .split_once("://")
        .map_or(raw.url.as_str(), |(_, rest)| rest);
    let authority = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or_default();
    if authority.contains('@') {
        return Err(CatalogError::UserInfoInUrl {
            file: at.file(),
            tool: at.tool(),
            key,
        });
    }
    if !(raw.url.starts_with("http://") || raw.url.starts_with("https://")) {
        return Err(CatalogError::NotHttp {
            file: at.file(),
            tool: at.tool(),
            key,
            url: raw.url.clone(),
        });
    }
    // The authority (host, port) ends at the first '/', '?' or '#' after the scheme: a
    // placeholder there would let an argument send the call to a host of its choosing.
    if authority.contains(['{', '}']) {
        return Err(CatalogError::PlaceholderInAuthority {
            file: at.file(),
            tool: at.tool(),
            key,
            url: raw.url.clone(),
        });
    }
    let url = parse_template(at, key, &raw.url)?;
    for name in url.placeholders() {
        check_placeholder(at, section, key, name, FieldUse::Text, context)?;
    }
    let timeout_ms = raw.timeout_ms.unwrap_or(context.policy.timeout_ms);
    if timeout_ms == 0 {
        return Err(CatalogError::Zero {
            file: at.file(),
            tool: at.tool(),
            key: section.timeout_key(),
        });
    }
    let shape = build_shape(at, section, raw, context)?;
    Ok(HttpEndpoint {
        url,
        method: raw.method.unwrap_or(section.default_method()),
        timeout_ms,
        shape,
    })
}

/// Checks one placeholder of a template of `section`: a key the section can know, or an
/// argument the schema declares for that use.
pub(super) fn check_placeholder(
    at: &At<'_>,
    section: Section,
    key: &'static str,
    name: &str,
    usage: FieldUse,
    context: &EndpointContext<'_>,
) -> Result<(), CatalogError> {
    let unavailable = |placeholder, why| CatalogError::UnavailableKey {
        file: at.file(),
        tool: at.tool(),
        key,
        placeholder,
        why,
    };
    match Slot::of(name) {
        Slot::Key("business_key") if !context.has_business_key => Err(unavailable(
            "business_key",
            "the tool declares no business_key template",
        )),
        Slot::Key("external_ref") if section != Section::Compensate => Err(unavailable(
            "external_ref",
            "the external reference is only known after a dispatch returns; only compensate may use it",
        )),
        Slot::Key("compensation_key") if section != Section::Compensate => Err(unavailable(
            "compensation_key",
            "only a compensation has a key of its own; only compensate may use it",
        )),
        Slot::Key("callback_url") if section != Section::Dispatch => Err(unavailable(
            "callback_url",
            "only the dispatch request gives the upstream its callback URL; only dispatch may use it",
        )),
        Slot::Key("callback_url") if !context.is_async => Err(unavailable(
            "callback_url",
            "the tool declares no [tool.async]: only an asynchronous tool is given a callback URL",
        )),
        Slot::Key(_) => Ok(()),
        Slot::Arg(path) => {
            if path.iter().any(|segment| segment.is_empty()) {
                return Err(CatalogError::BadShape {
                    file: at.file(),
                    tool: at.tool(),
                    key: key.to_owned(),
                    detail: format!("placeholder {{{name}}} has an empty segment"),
                });
            }
            check_path(at, key, &path, context.schema, usage)
        }
    }
}

fn build_shape(
    at: &At<'_>,
    section: Section,
    raw: &mut RawEndpoint,
    context: &EndpointContext<'_>,
) -> Result<RequestShape, CatalogError> {
    let bad = |key: &str, detail: String| CatalogError::BadShape {
        file: at.file(),
        tool: at.tool(),
        key: key.to_owned(),
        detail,
    };
    let body_key = section.sub_key("body");
    let body = match raw.body.take() {
        None => None,
        Some(value) => {
            let json =
                super::build::toml_to_json(&value).map_err(|detail| bad(body_key, detail))?;
            let template = BodyTemplate::parse(&json).map_err(|(pointer, problem)| {
                bad(body_key, format!("{problem} in the string at {pointer}"))
            })?;
            for (name, usage) in template.placeholders() {
                let usage = match usage {
                    Use::Text => FieldUse::Text,
                    Use::Whole | Use::WholeScalar => FieldUse::Whole,
                };
                check_placeholder(at, section, body_key, name, usage, context)?;
            }
            Some(template)
        }
    };
    let content_type = raw.content_type.unwrap_or_default();

    let headers_key = section.sub_key("headers");
    let mut headers = Vec::with_capacity(raw.headers.len());
    for (name, value) in std::mem::take(&mut raw.headers) {
        if !is_header_name(&name) {
            return Err(bad(
                headers_key,
                format!("{name:?} is not an HTTP header name"),
            ));
        }
        let lower = name.to_ascii_lowercase();
        // A JSON body may be labelled with the JSON media type an API insists on (AWS's JSON
        // protocol answers `application/json` with a 500 and takes only
        // `application/x-amz-json-1.0`): a literal type whose subtype names JSON, so the label
        // always describes the body the connector encodes.
        let json_label = lower == "content-type"
            && content_type == ContentType::Json
            && is_json_media_type(&value);
        if RESERVED_HEADERS.contains(&lower.as_str()) && !json_label {
            return Err(bad(
                headers_key,
                match lower.as_str() {
                    "authorization" | "proxy-authorization" => format!(
                        "{name} is written only by a credential: declare [credentials.<name>] and set credential = \"<name>\""
                    ),
                    "content-type" => format!(
                        "{name} is set by content_type (json or form); with a JSON body it may name another JSON media type (a literal such as \"application/x-amz-json-1.0\" or \"application/vnd.api+json\"), not {value:?}"
                    ),
                    _ => format!("{name} is the transport's to set"),
                },
            ));
        }
        let template = parse_template(at, headers_key, &value)?;
        for name in template.placeholders() {
            let usage = if template.single().is_some() {
                FieldUse::WholeScalar
            } else {
                FieldUse::Text
            };
            check_placeholder(at, section, headers_key, name, usage, context)?;
        }
        headers.push((name, template));
    }

    let query_key = section.sub_key("query");
    let mut query = Vec::with_capacity(raw.query.len());
    for (name, value) in std::mem::take(&mut raw.query) {
        if name.is_empty() {
            return Err(bad(query_key, "a query parameter needs a name".into()));
        }
        let template = parse_template(at, query_key, &value)?;
        for name in template.placeholders() {
            let usage = if template.single().is_some() {
                FieldUse::WholeScalar
            } else {
                FieldUse::Text
            };
            check_placeholder(at, section, query_key, name, usage, context)?;
        }
        query.push((name, template));
    }

    let idempotency_header = match raw.idempotency_header.take() {
        None => Some(DEFAULT_IDEMPOTENCY_HEADER.to_owned()),
        Some(name) if name.is_empty() => None,
        Some(name) if is_header_name(&name) => Some(name),
        Some(name) => {
            return Err(bad(
                section.sub_key("idempotency_header"),
                format!("idempotency_header {name:?} is not an HTTP header name"),
            ));
        }
    };

    let credential_key = section.sub_key("credential");
    let names = match raw.credential.take() {
        Some(named) => named.into_vec(),
        None => context.tool_credential.to_vec(),
    };
    let mut credentials = Vec::with_capacity(names.len());
    for name in names {
        let Some(credential) = context.credentials.get(&name) else {
            return Err(CatalogError::UnknownCredential {
                file: at.file(),
                tool: at.tool(),
                key: credential_key.to_owned(),
                credential: name,
            });
        };
        credentials.push(Arc::clone(credential));
    }
    credentials.sort_by_key(|credential| credential.kind.order());

    // Every header is written by one party: a declared header, the idempotency header or one
    // credential.
    let mut writers: Vec<(String, String)> = headers
        .iter()
        .map(|(name, _)| (name.to_ascii_lowercase(), format!("{headers_key}.{name}")))
        .collect();
    if let Some(name) = &idempotency_header {
        writers.push((name.to_ascii_lowercase(), "the idempotency header".into()));
    }
    for credential in &credentials {
        for header in credential.kind.headers() {
            writers.push((header, format!("credential {}", credential.name)));
        }
    }
    for (index, (header, first)) in writers.iter().enumerate() {
        if let Some((_, second)) = writers[index + 1..]
            .iter()
            .find(|(other, _)| other == header)
        {
            return Err(CatalogError::HeaderConflict {
                file: at.file(),
                tool: at.tool(),
                key: section.name().to_owned(),
                header: header.clone(),
                detail: format!("by {first} and by {second}"),
            });
        }
    }

    Ok(RequestShape {
        content_type,
        body,
        headers,
        query,
        idempotency_header,
        credentials,
    })
}

/// A literal media type whose subtype names JSON (`application/json`,
/// `application/vnd.api+json`, `application/x-amz-json-1.0`), parameters allowed: the body the
/// connector encodes as JSON may be labelled with it.
fn is_json_media_type(value: &str) -> bool {
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    let token = |text: &str| !text.is_empty() && is_header_name(text);
    !value.contains(['{', '}'])
        && token(kind)
        && token(subtype)
        && subtype.to_ascii_lowercase().contains("json")
}

/// An HTTP header name: one or more RFC 9110 token characters.
pub(super) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte))
}
