//! The HTTP call of each connector operation for one command, built without IO.
//!
//! Everything about the wire contract that does not depend on the network lives here: which
//! URL (the tool's template rendered by `catalog::render_url`), which method, which headers
//! and which body. A command that cannot be turned into a call (a URL that does not render or
//! parse, a business key that is not a valid header value) is refused here, before anything
//! could be sent — which is what lets the caller report it as `NotSent`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use serde_json::{Value, json};
use sluice_core::catalog::{
    ContentType, Credential, HttpEndpoint, HttpMethod, MatchList, REDACTED, RenderError,
    RequestShape, Tool, UrlKeys, form_pairs, render_text, render_url, render_url_redacted,
    render_value,
};
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, ToolName};

/// The idempotency key of the command (`<run_id>/d-<decision>/<tool>/<call_idx>`).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
pub const RUN_ID: &str = "x-sluice-run-id";
pub const COMMAND_KEY: &str = "x-sluice-command-key";
/// Sent only when the command has a business key.
pub const BUSINESS_KEY: &str = "x-sluice-business-key";
/// On a compensate call: the dispatch's idempotency key, so the upstream can tie the
/// compensation to the effect it undoes.
pub const DISPATCH_KEY: &str = "x-sluice-dispatch-idempotency-key";

/// The three things a connector does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Dispatch,
    StatusCheck,
    Compensate,
}

impl Operation {
    /// The catalog section that declares the operation's endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dispatch => "dispatch",
            Self::StatusCheck => "status_check",
            Self::Compensate => "compensate",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One HTTP request, ready to send but for its credentials.
#[derive(Debug, Clone)]
pub struct Call {
    pub operation: Operation,
    pub method: Method,
    pub url: Url,
    /// The URL as telemetry shows it when the tool's URL template names an argument: rendered
    /// with each argument [`sluice_core::catalog::REDACTED`] (`catalog::render_url_redacted`);
    /// `None` when `url` itself holds no argument. Its query is the real one's, values left out
    /// ([`Call::shown_url`]).
    pub redacted_url: Option<String>,
    /// The contract's headers and the endpoint's declared ones: no credentials, so the map may
    /// be shown (a dry run) and logged by name.
    pub headers: HeaderMap,
    /// The body, sent with its content type in `headers`; `None` when there is none (GET and
    /// DELETE unless the endpoint declares a body).
    pub body: Option<CallBody>,
    /// The whole call — connect, request, response headers and body — must fit in this.
    pub timeout: Duration,
    /// Applied by the connector as the request is sent (`crate::credentials`), signers last.
    pub credentials: Vec<Arc<Credential>>,
}

impl Call {
    /// The URL for a span's `url.full`: without user name, password or fragment, each query
    /// value [`REDACTED`] (a query may carry arguments, or a signature), and the path with its
    /// arguments left out ([`Call::redacted_url`]).
    pub fn shown_url(&self) -> String {
        let mut shown = match &self.redacted_url {
            Some(text) => match Url::parse(text) {
                Ok(url) => url,
                Err(_) => return REDACTED.to_owned(),
            },
            None => self.url.clone(),
        };
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
        shown.set_fragment(None);
        shown.set_query(None);
        if self.url.query().is_some_and(|query| !query.is_empty()) {
            let mut pairs = shown.query_pairs_mut();
            for (name, _) in self.url.query_pairs() {
                pairs.append_pair(&name, REDACTED);
            }
        }
        shown.into()
    }
}

/// A request body.
#[derive(Debug, Clone, PartialEq)]
pub enum CallBody {
    /// JSON; a dispatch without a body template shares the command's arguments.
    Json(Arc<Value>),
    /// `application/x-www-form-urlencoded`, already encoded.
    Form(String),
}

impl CallBody {
    /// The bytes sent (and signed).
    pub fn to_bytes(&self) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            Self::Json(value) => serde_json::to_vec(&**value),
            Self::Form(text) => Ok(text.as_bytes().to_vec()),
        }
    }

    /// The JSON value of a JSON body (tests and the dry run read it).
    pub fn json(&self) -> Option<&Value> {
        match self {
            Self::Json(value) => Some(value),
            Self::Form(_) => None,
        }
    }
}

/// Why a command could not be turned into a call. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// A caller bug: a command may only be sent with the tool it was recorded for.
    #[error("command {command_key} is for tool {}, not {tool}", command_key.tool())]
    WrongTool {
        command_key: CommandKey,
        tool: ToolName,
    },
    #[error("{operation}.url of tool {tool} cannot be rendered for this command")]
    Render {
        operation: Operation,
        tool: ToolName,
        #[source]
        source: RenderError,
    },
    #[error(
        "{operation}.url of tool {tool} rendered to {url:?}, which is not a valid url: {detail}"
    )]
    InvalidUrl {
        operation: Operation,
        tool: ToolName,
        url: String,
        detail: String,
    },
    #[error(
        "{header} cannot be sent: its value is not a valid HTTP header value (control characters)"
    )]
    HeaderValue { header: String },
    #[error("{operation} of tool {tool}: the body cannot be rendered for this command")]
    Body {
        operation: Operation,
        tool: ToolName,
        #[source]
        source: RenderError,
    },
    #[error("{operation} of tool {tool}: header or query parameter {name} cannot be rendered")]
    Part {
        operation: Operation,
        tool: ToolName,
        name: String,
        #[source]
        source: RenderError,
    },
}

/// The dispatch call: the tool's dispatch endpoint; its body is the endpoint's template, else the
/// arguments. `callback_url` is what `{callback_url}` renders to (`crate::callback`): the
/// attempt's signed URL, for a tool that names it.
pub fn dispatch(
    tool: &Tool,
    command: &Command,
    callback_url: Option<&str>,
) -> Result<Call, CallError> {
    check_tool(tool, command)?;
    let endpoint = &tool.dispatch().endpoint;
    build(
        Operation::Dispatch,
        tool,
        endpoint,
        command,
        Parts {
            external_ref: None,
            callback_url,
        },
        &command.idempotency_key.to_string(),
        || Arc::clone(command.current_args()),
    )
}

/// What a call's templates may name besides the command's own keys.
#[derive(Clone, Copy, Default)]
struct Parts<'a> {
    /// The commit a compensation undoes.
    external_ref: Option<&'a str>,
    /// An asynchronous tool's dispatch: its signed callback URL.
    callback_url: Option<&'a str>,
}

/// The status check call: the given endpoint (the tool's `status_check`).
pub fn status_check(
    tool: &Tool,
    endpoint: &HttpEndpoint,
    command: &Command,
) -> Result<Call, CallError> {
    check_tool(tool, command)?;
    build(
        Operation::StatusCheck,
        tool,
        endpoint,
        command,
        Parts::default(),
        &command.idempotency_key.to_string(),
        || Arc::clone(command.current_args()),
    )
}

/// The `match_where` of the tool's status check list, rendered for the command: the pointer
/// into each listed item and the text it must hold.
pub fn match_filter(tool: &Tool, command: &Command) -> Result<Vec<(String, String)>, CallError> {
    let Some(MatchList::Items { filter, .. }) = &tool.status_answers().list else {
        return Ok(Vec::new());
    };
    let keys = UrlKeys {
        idempotency_key: &command.idempotency_key,
        business_key: command.business_key.as_ref(),
        external_ref: None,
        compensation_key: None,
        callback_url: None,
    };
    filter
        .iter()
        .map(|(pointer, template)| {
            render_text(template, command.current_args(), &keys)
                .map(|text| (pointer.clone(), text))
                .map_err(|source| CallError::Part {
                    operation: Operation::StatusCheck,
                    tool: tool.name().clone(),
                    name: format!("match_where {pointer}"),
                    source,
                })
        })
        .collect()
}

/// The compensate call for the commit named `external_ref`; without a body template its body is
/// `{"args": …, "external_ref": …}`.
///
/// A compensation is a request of its own: an upstream that remembers idempotency keys (and
/// refuses a key reused on another endpoint, as payment APIs do) must not see the dispatch's
/// key again. Its key is derived from the dispatch's and the commit it undoes, so a retried
/// compensation of the same commit reuses it.
pub fn compensate(
    tool: &Tool,
    endpoint: &HttpEndpoint,
    command: &Command,
    external_ref: Option<&str>,
) -> Result<Call, CallError> {
    check_tool(tool, command)?;
    let mut call = build(
        Operation::Compensate,
        tool,
        endpoint,
        command,
        Parts {
            external_ref,
            callback_url: None,
        },
        &compensation_key(command, external_ref),
        || Arc::new(json!({ "args": command.current_args(), "external_ref": external_ref })),
    )?;
    let dispatch = HeaderValue::from_str(&command.idempotency_key.to_string()).map_err(|_| {
        CallError::HeaderValue {
            header: DISPATCH_KEY.into(),
        }
    })?;
    call.headers
        .insert(HeaderName::from_static(DISPATCH_KEY), dispatch);
    Ok(call)
}

/// The idempotency key of a compensate call: `<dispatch key>/compensate[/<commit>]`, the
/// commit named only when it is not the command's own.
pub fn compensation_key(command: &Command, external_ref: Option<&str>) -> String {
    match external_ref.filter(|r| Some(*r) != command.state.external_ref.as_deref()) {
        Some(extra) => format!("{}/compensate/{extra}", command.idempotency_key),
        None => format!("{}/compensate", command.idempotency_key),
    }
}

fn check_tool(tool: &Tool, command: &Command) -> Result<(), CallError> {
    if &command.tool == tool.name() {
        Ok(())
    } else {
        Err(CallError::WrongTool {
            command_key: command.command_key.clone(),
            tool: tool.name().clone(),
        })
    }
}

fn build(
    operation: Operation,
    tool: &Tool,
    endpoint: &HttpEndpoint,
    command: &Command,
    parts: Parts<'_>,
    idempotency_key: &str,
    default_body: impl FnOnce() -> Arc<Value>,
) -> Result<Call, CallError> {
    let keys = UrlKeys {
        idempotency_key: &command.idempotency_key,
        business_key: command.business_key.as_ref(),
        external_ref: parts.external_ref,
        // The compensation's own key (the idempotency header's value) for its templates.
        compensation_key: (operation == Operation::Compensate).then_some(idempotency_key),
        callback_url: parts.callback_url,
    };
    let rendered = render_url(&endpoint.url, command.current_args(), &keys).map_err(|source| {
        CallError::Render {
            operation,
            tool: tool.name().clone(),
            source,
        }
    })?;
    let mut url = parse_url(&rendered).map_err(|error| CallError::InvalidUrl {
        operation,
        tool: tool.name().clone(),
        url: rendered.clone(),
        detail: error,
    })?;
    let shape = &endpoint.shape;
    let part = |name: &str, source| CallError::Part {
        operation,
        tool: tool.name().clone(),
        name: name.to_owned(),
        source,
    };
    if !shape.query.is_empty() {
        let mut pairs = url.query_pairs_mut();
        for (name, template) in &shape.query {
            if let Some(value) =
                render_value(template, command.current_args(), &keys).map_err(|e| part(name, e))?
            {
                pairs.append_pair(name, &value);
            }
        }
    }
    let body = match &shape.body {
        Some(template) => template
            .render(command.current_args(), &keys)
            .map_err(|source| CallError::Body {
                operation,
                tool: tool.name().clone(),
                source,
            })?
            .map(Arc::new),
        None => carries_content(endpoint.method).then(default_body),
    };
    let body = body.map(|value| match shape.content_type {
        ContentType::Json => CallBody::Json(value),
        ContentType::Form => {
            let mut form = form_urlencoded::Serializer::new(String::new());
            for (name, text) in form_pairs(&value) {
                form.append_pair(&name, &text);
            }
            CallBody::Form(form.finish())
        }
    });
    let mut headers = headers(command, shape, idempotency_key, body.is_some())?;
    for (name, template) in &shape.headers {
        let Some(text) =
            render_value(template, command.current_args(), &keys).map_err(|e| part(name, e))?
        else {
            continue;
        };
        let value =
            HeaderValue::from_bytes(text.as_bytes()).map_err(|_| CallError::HeaderValue {
                header: name.clone(),
            })?;
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| CallError::HeaderValue {
            header: name.clone(),
        })?;
        headers.insert(name, value);
    }
    Ok(Call {
        operation,
        method: method(endpoint.method),
        redacted_url: render_url_redacted(&endpoint.url, &keys),
        url,
        headers,
        body,
        timeout: Duration::from_millis(endpoint.timeout_ms),
        credentials: shape.credentials.clone(),
    })
}

/// URLs parsed before, by their text. Parsing one took ~6k instructions, and most tools' URLs
/// are the same for every call, so every effect parsed the same text again; a clone is a copy.
/// A URL with per-call parts (keys, arguments) takes a slot too, so past [`MAX_PARSED`] entries
/// the cache starts afresh.
static PARSED: LazyLock<Mutex<HashMap<String, Url, foldhash::fast::RandomState>>> =
    LazyLock::new(Mutex::default);
const MAX_PARSED: usize = 1_024;

/// `text` as a URL, or why it is not one.
fn parse_url(text: &str) -> Result<Url, String> {
    if let Some(url) = PARSED
        .lock()
        .ok()
        .and_then(|cache| cache.get(text).cloned())
    {
        return Ok(url);
    }
    let url = Url::parse(text).map_err(|e| e.to_string())?;
    if let Ok(mut cache) = PARSED.lock() {
        if cache.len() >= MAX_PARSED {
            cache.clear();
        }
        cache.insert(text.to_owned(), url.clone());
    }
    Ok(url)
}

/// GET and DELETE carry no body unless the endpoint declares one: RFC 9110 gives content on
/// them no defined meaning and intermediaries may drop it, so by default such an endpoint takes
/// what it needs from its URL template; an API that reads a DELETE's body (Mailpit's) declares
/// it.
fn carries_content(method: HttpMethod) -> bool {
    match method {
        HttpMethod::Post | HttpMethod::Put | HttpMethod::Patch => true,
        HttpMethod::Get | HttpMethod::Head | HttpMethod::Delete => false,
    }
}

fn method(method: HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Delete => Method::DELETE,
        HttpMethod::Head => Method::HEAD,
    }
}

/// The contract's headers. Every operation sends the same ones, so an upstream can tie a
/// status check or a compensation to the dispatch it is about; the idempotency key goes in the
/// endpoint's `idempotency_header` (none when it names none).
fn headers(
    command: &Command,
    shape: &RequestShape,
    idempotency_key: &str,
    has_body: bool,
) -> Result<HeaderMap, CallError> {
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
    if has_body {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(shape.content_type.mime()),
        );
    }
    let mut insert = |header: HeaderName, text: &str| {
        // `from_bytes` also admits UTF-8 (RFC 9110 obs-text): a business key is free text and
        // is passed through unchanged; only control characters cannot be sent.
        let value =
            HeaderValue::from_bytes(text.as_bytes()).map_err(|_| CallError::HeaderValue {
                header: header.as_str().to_owned(),
            })?;
        headers.insert(header, value);
        Ok(())
    };
    if let Some(name) = &shape.idempotency_header {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| CallError::HeaderValue {
            header: name.clone(),
        })?;
        insert(name, idempotency_key)?;
    }
    insert(HeaderName::from_static(RUN_ID), command.run_id.as_str())?;
    insert(
        HeaderName::from_static(COMMAND_KEY),
        &command.command_key.to_string(),
    )?;
    if let Some(business_key) = &command.business_key {
        insert(HeaderName::from_static(BUSINESS_KEY), business_key.as_str())?;
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use sluice_core::catalog::Catalog;
    use sluice_core::command::{EffectSemantics, Intent};
    use sluice_core::ids::{BusinessKey, RunId};
    use sluice_core::time::Timestamp;

    use super::*;

    const CATALOG: &str = r#"
        [[tool]]
        name = "payments/wire"
        semantics = "NON_IDEMPOTENT"
        business_key = "{account}:{amount_minor}"
        schema = { type = "object", required = ["account", "amount_minor"], properties = { account = { type = "string" }, amount_minor = { type = "integer" } } }
        [tool.dispatch]
        url = "http://bank.test/accounts/{account}/wires"
        timeout_ms = 1500
        [tool.status_check]
        url = "http://bank.test/wires/by-key/{business_key}"
        [tool.compensate]
        url = "http://bank.test/wires/{external_ref}/reverse"
        method = "DELETE"
    "#;

    fn dispatch_plain(tool: &Tool, command: &Command) -> Result<Call, CallError> {
        dispatch(tool, command, None)
    }

    fn tool() -> Tool {
        let catalog = Catalog::from_toml_str(CATALOG, "test.toml").expect("the catalog is valid");
        catalog.tools()[0].clone()
    }

    fn command(business_key: &str) -> Command {
        let intent = Intent {
            run_id: RunId::parse("r-1").expect("valid run id"),
            command_key: CommandKey::parse("d-2/payments/wire/0").expect("valid command key"),
            semantics: EffectSemantics::NonIdempotent,
            args: json!({"account": "acc 1", "amount_minor": 5}),
            business_key: Some(BusinessKey::new(business_key)),
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        };
        Command::from_intent(intent, Timestamp::from_millis(1_000), 10_000)
    }

    #[test]
    fn parsed_urls_are_the_parser_s_and_the_cache_stays_bounded() {
        for text in [
            "http://bank.test/accounts/a-1/wires",
            "http://127.0.0.1:8787/email/send?x=%20y",
            "https://bank.test:8443/wires/by-key/k",
        ] {
            let first = parse_url(text).expect("valid");
            assert_eq!(first, Url::parse(text).expect("valid"));
            assert_eq!(parse_url(text).expect("cached"), first);
        }
        assert!(parse_url("not a url").is_err());
        assert!(parse_url("http://[::1").is_err());
        for n in 0..(MAX_PARSED + 10) {
            let text = format!("http://bank.test/wires/{n}");
            assert_eq!(
                parse_url(&text).expect("valid").path(),
                format!("/wires/{n}")
            );
        }
        let held = PARSED.lock().expect("cache").len();
        assert!(held <= MAX_PARSED, "{held} URLs held");
    }

    #[test]
    fn the_url_telemetry_shows_leaves_out_arguments_query_values_and_credentials() {
        let mut call = dispatch_plain(&tool(), &command("acc 1:5")).expect("renders");
        assert_eq!(call.url.as_str(), "http://bank.test/accounts/acc%201/wires");
        assert_eq!(
            call.shown_url(),
            "http://bank.test/accounts/REDACTED/wires",
            "the path's argument is left out"
        );
        call.url =
            Url::parse("https://u:p@bank.test:8443/wires?sig=abc&to=acc#frag").expect("valid");
        call.redacted_url = None;
        assert_eq!(
            call.shown_url(),
            "https://bank.test:8443/wires?sig=REDACTED&to=REDACTED"
        );
    }

    #[test]
    fn dispatch_posts_the_args_with_the_contract_headers_and_the_tool_timeout() {
        let call = dispatch_plain(&tool(), &command("acc 1:5")).expect("renders");
        assert_eq!(call.method, Method::POST);
        assert_eq!(call.url.as_str(), "http://bank.test/accounts/acc%201/wires");
        assert_eq!(
            call.body.as_ref().and_then(CallBody::json),
            Some(&json!({"account": "acc 1", "amount_minor": 5}))
        );
        assert_eq!(call.timeout, Duration::from_millis(1_500));
        let header = |name: &str| call.headers.get(name).map(HeaderValue::as_bytes);
        assert_eq!(
            header(IDEMPOTENCY_KEY),
            Some(&b"r-1/d-2/payments/wire/0"[..])
        );
        assert_eq!(header(RUN_ID), Some(&b"r-1"[..]));
        assert_eq!(header(COMMAND_KEY), Some(&b"d-2/payments/wire/0"[..]));
        assert_eq!(header(BUSINESS_KEY), Some(&b"acc 1:5"[..]));
        assert_eq!(
            header(CONTENT_TYPE.as_str()),
            Some(&b"application/json"[..])
        );
    }

    #[test]
    fn bodiless_methods_send_no_body_and_no_content_type() {
        let tool = tool();
        let command = command("k");
        let status =
            status_check(&tool, tool.status_check().expect("declared"), &command).expect("renders");
        assert_eq!(status.method, Method::GET);
        assert_eq!(status.body, None);
        assert!(status.headers.get(CONTENT_TYPE).is_none());
        let compensation = compensate(
            &tool,
            tool.compensate().expect("declared"),
            &command,
            Some("w-1"),
        )
        .expect("renders");
        assert_eq!(compensation.method, Method::DELETE);
        assert_eq!(compensation.body, None);
    }

    #[test]
    fn a_business_key_that_is_not_a_header_value_is_refused_before_sending() {
        let err = dispatch_plain(&tool(), &command("a\nb")).expect_err("newline in a header");
        assert_eq!(
            err,
            CallError::HeaderValue {
                header: BUSINESS_KEY.into()
            }
        );
        // UTF-8 is passed through as it is.
        let call = dispatch_plain(&tool(), &command("café")).expect("utf-8 is obs-text");
        assert_eq!(
            call.headers.get(BUSINESS_KEY).map(HeaderValue::as_bytes),
            Some("café".as_bytes())
        );
    }

    #[test]
    fn compensate_without_a_reference_cannot_render_a_url_that_needs_one() {
        let tool = tool();
        let err = compensate(
            &tool,
            tool.compensate().expect("declared"),
            &command("k"),
            None,
        )
        .expect_err("no external_ref");
        assert!(
            matches!(
                err,
                CallError::Render {
                    operation: Operation::Compensate,
                    source: RenderError::MissingKey {
                        key: "external_ref"
                    },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_command_is_only_sent_with_its_own_tool() {
        let other = CATALOG.replace("payments/wire", "payments/refund");
        let catalog = Catalog::from_toml_str(&other, "other.toml").expect("valid");
        let err = dispatch(&catalog.tools()[0], &command("k"), None).expect_err("wrong tool");
        assert_eq!(
            err.to_string(),
            "command d-2/payments/wire/0 is for tool payments/wire, not payments/refund"
        );
    }
}
