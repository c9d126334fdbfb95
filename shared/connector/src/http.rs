//! [`HttpConnector`]: the wire contract (docs/architecture.md, "Wire contract") over one
//! shared HTTP client.
//!
//! This is the only code in the crate that does IO. It sends the calls built by
//! [`crate::request`], reads each answer up to a size cap and hands it to
//! [`crate::classify`]; its own judgement is limited to one question, answered in
//! [`no_answer`]: when a call failed without an answer, could the upstream have seen it?
//!
//! Guarantees:
//! * one call is at most one request on the wire: reqwest's retries are off and redirects are
//!   not followed, so the state machine alone decides when to call again;
//! * `NotSent` is reported only when no connection was established (or the request could not
//!   even be built), so nothing reached the upstream;
//! * each call, body included, ends within the endpoint's `timeout_ms`;
//! * no header value is logged: spans carry `run_id`, `command_key` and `tool`, events the
//!   outcome and the HTTP status. The contract's headers, the endpoint's declared ones and its
//!   credentials (`crate::credentials`, applied last, as the request is sent) go out, plus the
//!   W3C `traceparent`/`tracestate` of the call's own span, in the effect's trace.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Client, Response};
use serde_json::{Value, json};
use sluice_core::catalog::Tool;
use sluice_core::command::Command;
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};
use tracing::{Instrument, Span, debug, field, info, warn};

use crate::callback::{self, CallbackSigner, CallbackUrl};
use crate::classify::{self, Answer, DEFAULT_EXCERPT_BYTES, NoAnswer};
use crate::credentials::{self, Mode, Outgoing, Secrets};
use crate::error::ConnectorError;
use crate::port::{CompensationTarget, Connector, StatusReport};
use crate::request::{self, Call};

/// Default cap on how much of a response body is read (1 MiB).
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 1024 * 1024;

/// Settings of the HTTP client shared by every tool. Per-tool settings (URL, method,
/// `timeout_ms`) come from the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOptions {
    /// How long establishing a connection (TCP and TLS) may take. A connect that fails within
    /// it is `NotSent`; a tool whose `timeout_ms` is shorter cuts the connect off first, and
    /// that is reported as ambiguous (see [`no_answer`]), so keep it below the tools' timeouts.
    pub connect_timeout: Duration,
    /// How long an idle pooled connection is kept. Short, because a request written to a
    /// connection the upstream closes at the same moment (Node.js closes idle keep-alive
    /// connections after 5 s) fails after sending and is reported as ambiguous.
    pub pool_idle_timeout: Duration,
    /// A response body is read up to this many bytes; the rest is not read.
    pub max_response_bytes: usize,
    /// Longest body excerpt in a reason or in evidence, in bytes.
    pub excerpt_bytes: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            pool_idle_timeout: Duration::from_secs(4),
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            excerpt_bytes: DEFAULT_EXCERPT_BYTES,
        }
    }
}

/// The HTTP connector: one client (one connection pool, rustls for TLS) for every tool.
/// Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct HttpConnector {
    client: Client,
    options: HttpOptions,
    /// Shared by clones, so a file secret is cached once per process.
    secrets: Arc<Secrets>,
    /// Signs the callback URLs of asynchronous tools that name `{callback_url}`
    /// (`[callbacks]`); `None` where none is configured.
    callbacks: Option<Arc<CallbackSigner>>,
}

impl HttpConnector {
    /// A connector with [`HttpOptions::default`].
    pub fn new() -> Result<Self, ConnectorError> {
        Self::with_options(HttpOptions::default())
    }

    pub fn with_options(options: HttpOptions) -> Result<Self, ConnectorError> {
        let client = Client::builder()
            // A redirect would be followed as a second request (and 301–303 turn a POST into
            // a GET): a 3xx is returned to the classifier instead.
            .redirect(reqwest::redirect::Policy::none())
            // One call, one request: the state machine owns retries, with the same key.
            .retry(reqwest::retry::never())
            .connect_timeout(options.connect_timeout)
            .pool_idle_timeout(options.pool_idle_timeout)
            .user_agent(concat!("sluice-connector/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| ConnectorError::Client { source })?;
        Ok(Self {
            client,
            options,
            secrets: Arc::new(Secrets::new()),
            callbacks: None,
        })
    }

    /// The connector, signing the callback URLs of the tools that name `{callback_url}` with
    /// `signer` (`crate::callback`).
    #[must_use]
    pub fn with_callbacks(mut self, signer: CallbackSigner) -> Self {
        self.callbacks = Some(Arc::new(signer));
        self
    }

    pub fn options(&self) -> &HttpOptions {
        &self.options
    }

    /// The secrets the connector reads: [`Secrets::check`] them against the catalog at start.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The secrets reader, to share with another connector (one file cache per process).
    pub fn shared_secrets(&self) -> Arc<Secrets> {
        Arc::clone(&self.secrets)
    }

    /// Sends `call` and waits for the answer's status and headers (or the exchange's failure).
    /// Split from [`HttpConnector::read`] so a failpoint can stand between the request having
    /// gone out and its answer being read.
    async fn send(&self, call: Call) -> Result<Sent, NoAnswer> {
        let timeout = call.timeout;
        let bytes = match &call.body {
            Some(body) => body.to_bytes().map_err(|e| NoAnswer::NotSent {
                reason: format!("not sent: the request body could not be encoded: {e}"),
            })?,
            None => Vec::new(),
        };
        // Built as a request, not through `RequestBuilder`, which copied the headers in one by
        // one and re-checked the content type: one call per effect.
        let mut request = reqwest::Request::new(call.method, call.url);
        // `request::build` gave a call with a body its content type.
        *request.headers_mut() = call.headers;
        if !call.credentials.is_empty() {
            let (method, url, headers) = (
                request.method().clone(),
                request.url().clone(),
                request.headers_mut(),
            );
            credentials::apply(
                &self.secrets,
                &call.credentials,
                Outgoing {
                    method: &method,
                    url: &url,
                    headers,
                    body: &bytes,
                },
                Mode::Send,
                SystemTime::now(),
            )
            .map_err(|error| NoAnswer::NotSent {
                reason: format!("not sent: {error}"),
            })?;
        }
        // The total budget: connect, write, response headers and the body read below.
        *request.timeout_mut() = Some(timeout);
        if call.body.is_some() {
            *request.body_mut() = Some(bytes.into());
        }
        let response = self
            .client
            .execute(request)
            .await
            .map_err(|error| no_answer(&error, timeout))?;
        Ok(Sent { response, timeout })
    }

    /// Reads the answer of a call [`HttpConnector::send`] sent, body capped at
    /// `max_response_bytes`, within what is left of the call's timeout.
    async fn read(&self, sent: Result<Sent, NoAnswer>) -> Result<Answer, NoAnswer> {
        let Sent {
            mut response,
            timeout,
        } = sent?;
        let status = response.status();
        // Taken, not copied: only the body is read from the response after this.
        let headers = std::mem::take(response.headers_mut());
        let retry_after_ms =
            crate::retry_after::retry_after_ms(&headers, std::time::SystemTime::now());
        let (body, truncated, body_error) =
            read_capped(&mut response, self.options.max_response_bytes, timeout).await;
        Ok(Answer {
            status,
            headers,
            body,
            truncated,
            body_error,
            retry_after_ms,
        })
    }
}

/// A call whose request went out and whose answer's head came back; its body is not read yet.
struct Sent {
    response: Response,
    timeout: Duration,
}

/// Reads at most `cap` bytes of the body; a larger body is left unread (the connection is
/// then dropped rather than reused). A failure part-way keeps what had arrived.
async fn read_capped(
    response: &mut Response,
    cap: usize,
    timeout: Duration,
) -> (Vec<u8>, bool, Option<String>) {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = cap - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    return (body, true, None);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return (body, false, None),
            Err(error) => {
                let reason = if error.is_timeout() {
                    format!(
                        "timed out after {} ms reading the body",
                        timeout.as_millis()
                    )
                } else {
                    chain(&error)
                };
                return (body, false, Some(reason));
            }
        }
    }
}

/// Where the line runs between "nothing was sent" and "the upstream may have processed it".
///
/// reqwest reports `is_connect()` for every failure inside its connector: DNS resolution, the
/// TCP connect (refused, unreachable, `connect_timeout`), the TLS handshake, a proxy's
/// CONNECT. The connector hands hyper a connection only once all of that succeeded, and hyper
/// writes no byte of the request before it has one, so a connect error means the upstream
/// never saw the request: `NotSent`, which the state machine retries as PENDING. The TLS
/// ClientHello does reach the server, but it carries no request. `is_builder()` means the
/// request was never built. `is_connect()` is checked before `is_timeout()` because a
/// `connect_timeout` is both, and it too happened before anything was written.
///
/// Every other failure happened after hyper had a connection, while it was writing the request
/// or waiting for the answer: a reset or close before a complete response (`is_request()`:
/// hyper's "connection closed before message completed", a broken pipe), a body error, or
/// the total timeout. The upstream may have received and acted on the request, so the answer
/// is `Lost` (ambiguous). The total timeout is the one imprecise case: it is a timer around
/// the whole exchange and does not say which phase it interrupted, so a connect still pending
/// when it fires is reported as ambiguous too — the safe side of the line (a reconciliation
/// too many, never a blind retry of an effect that may have happened).
///
/// hyper's own retry (a pooled connection found closed before the request was written, so
/// the request was provably not sent) stays within this contract.
fn no_answer(error: &reqwest::Error, timeout: Duration) -> NoAnswer {
    if error.is_builder() {
        NoAnswer::NotSent {
            reason: format!("not sent: the request could not be built: {}", chain(error)),
        }
    } else if error.is_connect() {
        NoAnswer::NotSent {
            reason: format!("not sent: could not connect: {}", chain(error)),
        }
    } else if error.is_timeout() {
        NoAnswer::Lost {
            reason: format!(
                "no answer within {} ms; the request may have been processed",
                timeout.as_millis()
            ),
            timed_out: true,
        }
    } else {
        NoAnswer::Lost {
            reason: format!(
                "the connection failed after the request was sent; it may have been processed: {}",
                chain(error)
            ),
            timed_out: false,
        }
    }
}

/// An error and its sources as one line, `a: b: c`, skipping a source that repeats its parent.
fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let shown = cause.to_string();
        if shown != last && !last.ends_with(&shown) {
            text.push_str(": ");
            text.push_str(&shown);
        }
        last = shown;
        source = cause.source();
    }
    text
}

/// The request part of status check evidence.
fn request_evidence(call: &Call) -> Value {
    json!({ "method": call.method.as_str(), "url": call.url.as_str() })
}

fn with_request(mut report: StatusReport, request: Value) -> StatusReport {
    if let Value::Object(evidence) = &mut report.evidence {
        evidence.insert("request".into(), request);
    }
    report
}

/// The span of one upstream HTTP request: a client span after OpenTelemetry's HTTP
/// conventions, whose id the request carries in its `traceparent`. Named by the method once
/// the request is built ([`describe`]: `http.request.method`, `server.address`, `server.port`,
/// `url.full` without arguments or query values), then `http.response.status_code` and, for
/// an error status, `error.type`. Sluice's own attributes: `sluice.call` (`dispatch`,
/// `status_check`, `compensate`), run id, command key, tool and the outcome; never arguments
/// or header values.
macro_rules! http_span {
    ($name:literal, $call:literal, $tool:expr, $command:expr) => {{
        tracing::info_span!(
            $name,
            otel.name = "HTTP",
            otel.kind = "client",
            http.request.method = field::Empty,
            http.response.status_code = field::Empty,
            server.address = field::Empty,
            server.port = field::Empty,
            url.full = field::Empty,
            error.type = field::Empty,
            sluice.call = $call,
            run_id = %$command.run_id,
            command_key = %$command.command_key,
            tool = %$tool.name(),
            target = field::Empty,
            outcome = field::Empty,
        )
    }};
}

/// Records what `call` is on its span ([`http_span`]), if the span is enabled. Before the span
/// is first entered: `tracing-opentelemetry` takes a span's name only until it starts.
fn describe(span: &Span, call: &Call) {
    if span.is_disabled() {
        return;
    }
    span.record("otel.name", call.method.as_str());
    span.record("http.request.method", call.method.as_str());
    if let Some(host) = call.url.host_str() {
        span.record("server.address", host);
    }
    if let Some(port) = call.url.port_or_known_default() {
        span.record("server.port", i64::from(port));
    }
    span.record("url.full", call.shown_url());
}

/// Records the answer's status on the request's span.
fn answered(span: &Span, status: reqwest::StatusCode) {
    // As an integer attribute: `tracing-opentelemetry` exports unsigned fields as strings.
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_client_error() || status.is_server_error() {
        span.record("error.type", status.as_str());
    }
}

#[async_trait]
impl Connector for HttpConnector {
    /// The tool call: an `execute_tool <tool>` span after OpenTelemetry's GenAI conventions
    /// (`gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id` =
    /// the effect's idempotency key), in the command's trace, around the HTTP request's span.
    async fn dispatch(&self, tool: &Tool, command: &Command) -> DispatchOutcome {
        let span = tracing::info_span!(
            "connector.execute_tool",
            otel.name = %format_args!("execute_tool {}", tool.name()),
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %tool.name(),
            gen_ai.tool.call.id = %command.idempotency_key,
            run_id = %command.run_id,
            command_key = %command.command_key,
            tool = %tool.name(),
            outcome = field::Empty,
        );
        sluice_trace::adopt(&span, command.trace.as_ref());
        self.dispatch_in(tool, command).instrument(span).await
    }

    /// A status check's request span ([`http_span`]), in the command's trace.
    async fn status_check(&self, tool: &Tool, command: &Command) -> StatusReport {
        self.status_check_in(tool, command).await
    }

    /// A compensation's request span ([`http_span`]), in the command's trace.
    async fn compensate(
        &self,
        tool: &Tool,
        command: &Command,
        target: CompensationTarget,
    ) -> CompensationOutcome {
        self.compensate_in(tool, command, target).await
    }
}

/// `call` with the W3C trace headers of the current (call) span: its own span id, in the
/// command's trace (`sluice_trace::for_call`).
fn traced(mut call: Call, command: &Command) -> Call {
    if let Some(trace) = sluice_trace::for_call(command.trace.as_ref()) {
        if let Ok(value) = HeaderValue::from_str(&trace.traceparent) {
            call.headers
                .insert(HeaderName::from_static(sluice_trace::TRACEPARENT), value);
        }
        if let Some(value) = trace
            .tracestate
            .as_deref()
            .and_then(|state| HeaderValue::from_str(state).ok())
        {
            call.headers
                .insert(HeaderName::from_static(sluice_trace::TRACESTATE), value);
        }
    }
    call
}

/// `outcome` without the attempt's callback token, if it was given one.
fn without_token(outcome: DispatchOutcome, callback: Option<&CallbackUrl>) -> DispatchOutcome {
    match callback {
        Some(given) => callback::redact(outcome, &given.token),
        None => outcome,
    }
}

fn compensation_kind(outcome: &CompensationOutcome) -> &'static str {
    match outcome {
        CompensationOutcome::Done { .. } => "done",
        CompensationOutcome::Impossible { .. } => "impossible",
        CompensationOutcome::Retry { .. } => "retry",
    }
}

impl HttpConnector {
    async fn dispatch_in(&self, tool: &Tool, command: &Command) -> DispatchOutcome {
        // The request's own span, the child of the tool call's.
        let http = http_span!("connector.dispatch", "dispatch", tool, command);
        // Signed only for a tool that names it (known at load): no cost for any other.
        let callback = self
            .callbacks
            .as_ref()
            .and_then(|signer| signer.for_attempt(tool, command));
        let call = match request::dispatch(
            tool,
            command,
            callback.as_ref().map(|given| given.url.as_str()),
        ) {
            Ok(call) => {
                describe(&http, &call);
                http.in_scope(|| traced(call, command))
            }
            Err(error) => {
                let outcome = without_token(
                    DispatchOutcome::NotSent {
                        reason: format!("not sent: {}", chain(&error)),
                    },
                    callback.as_ref(),
                );
                if let DispatchOutcome::NotSent { reason } = &outcome {
                    warn!(outcome = "not_sent", %reason, "dispatch could not be sent");
                }
                return outcome;
            }
        };
        let outcome = async {
            sluice_faults::point!("connector.dispatch.pre");
            let sent = self.send(call).await;
            sluice_faults::point!("connector.dispatch.post");
            let outcome = match self.read(sent).await {
                Ok(answer) => {
                    answered(&Span::current(), answer.status);
                    let excerpt = self.options.excerpt_bytes;
                    tool.asynchronous()
                        .and_then(|declared| {
                            classify::accepted(
                                &answer,
                                &declared.accepted_status,
                                tool.dispatch(),
                                excerpt,
                            )
                        })
                        .unwrap_or_else(|| classify::dispatch(&answer, tool.dispatch(), excerpt))
                }
                Err(no_answer) => classify::dispatch_without_answer(no_answer),
            };
            Span::current().record("outcome", outcome.label());
            outcome
        }
        .instrument(http)
        .await;
        // Before anything logs or keeps it: an upstream may echo the URL it was given.
        let outcome = without_token(outcome, callback.as_ref());
        Span::current().record("outcome", outcome.label());
        match &outcome {
            DispatchOutcome::Committed { external_ref, .. } => {
                debug!(outcome = "committed", external_ref = ?external_ref, "dispatch committed");
            }
            DispatchOutcome::Refused { reason } => {
                debug!(outcome = "refused", %reason, "dispatch refused");
            }
            DispatchOutcome::Ambiguous { reason } => {
                warn!(outcome = "ambiguous", %reason, "dispatch outcome unknown");
            }
            DispatchOutcome::NotSent { reason } => {
                warn!(outcome = "not_sent", %reason, "dispatch not sent");
            }
            DispatchOutcome::Accepted {
                reason,
                external_ref,
            } => {
                info!(outcome = "accepted", %reason, external_ref = ?external_ref, "dispatch accepted; the outcome comes later");
            }
            DispatchOutcome::RateLimited {
                reason,
                retry_after_ms,
                ..
            } => {
                info!(outcome = "rate_limited", %reason, retry_after_ms, "dispatch asked to call again later");
            }
        }
        outcome
    }

    async fn status_check_in(&self, tool: &Tool, command: &Command) -> StatusReport {
        let Some(endpoint) = tool.status_check() else {
            let error = format!(
                "tool {} declares no status_check, so the effect cannot be observed",
                tool.name()
            );
            warn!(
                run_id = %command.run_id,
                command_key = %command.command_key,
                observation = "inconclusive",
                %error,
                "no status check"
            );
            return StatusReport::inconclusive(json!({ "error": error }));
        };
        let built = request::status_check(tool, endpoint, command)
            .and_then(|call| Ok((call, request::match_filter(tool, command)?)));
        let span = http_span!("connector.status_check", "status_check", tool, command);
        sluice_trace::adopt(&span, command.trace.as_ref());
        let (call, filter) = match built {
            Ok((call, filter)) => {
                describe(&span, &call);
                (span.in_scope(|| traced(call, command)), filter)
            }
            Err(error) => {
                let error = chain(&error);
                span.in_scope(|| {
                    warn!(observation = "inconclusive", %error, "status check could not be sent");
                });
                return StatusReport::inconclusive(json!({ "error": error }));
            }
        };
        self.status_check_sent(tool, call, filter)
            .instrument(span)
            .await
    }

    /// The status check `call`, sent in its span.
    async fn status_check_sent(
        &self,
        tool: &Tool,
        call: Call,
        filter: Vec<(String, String)>,
    ) -> StatusReport {
        let request = request_evidence(&call);
        sluice_faults::point!("connector.status_check.pre");
        let sent = self.send(call).await;
        sluice_faults::point!("connector.status_check.post");
        let report = match self.read(sent).await {
            Ok(answer) => {
                answered(&Span::current(), answer.status);
                classify::status_check(
                    &answer,
                    &tool.dispatch().reference,
                    tool.status_answers(),
                    &filter,
                    self.options.excerpt_bytes,
                )
            }
            Err(no_answer) => classify::status_check_without_answer(&no_answer),
        };
        Span::current().record("outcome", report.observation.as_str());
        debug!(
            observation = report.observation.as_str(),
            external_ref = ?report.external_ref,
            "status checked"
        );
        with_request(report, request)
    }

    async fn compensate_in(
        &self,
        tool: &Tool,
        command: &Command,
        target: CompensationTarget,
    ) -> CompensationOutcome {
        let Some(endpoint) = tool.compensate() else {
            let reason = format!(
                "tool {} declares no compensate, so the commit cannot be undone automatically",
                tool.name()
            );
            warn!(
                run_id = %command.run_id,
                command_key = %command.command_key,
                outcome = "impossible",
                %reason,
                "no compensate"
            );
            return CompensationOutcome::Impossible { reason };
        };
        let span = http_span!("connector.compensate", "compensate", tool, command);
        sluice_trace::adopt(&span, command.trace.as_ref());
        span.record("target", field::debug(&target));
        // A call that cannot be built now never can (the URL needs a reference the command
        // lacks, or a value that cannot be sent): a person must act, so it is not retried.
        let call = match request::compensate(tool, endpoint, command, target.external_ref(command))
        {
            Ok(call) => {
                describe(&span, &call);
                span.in_scope(|| traced(call, command))
            }
            Err(error) => {
                let reason = format!("cannot call compensate: {}", chain(&error));
                span.in_scope(|| {
                    warn!(outcome = "impossible", %reason, "compensate could not be sent");
                });
                return CompensationOutcome::Impossible { reason };
            }
        };
        self.compensate_sent(tool, call).instrument(span).await
    }

    /// The compensate `call`, sent in its span.
    async fn compensate_sent(&self, tool: &Tool, call: Call) -> CompensationOutcome {
        sluice_faults::point!("connector.compensate.pre");
        let sent = self.send(call).await;
        sluice_faults::point!("connector.compensate.post");
        let outcome = match self.read(sent).await {
            Ok(answer) => {
                answered(&Span::current(), answer.status);
                classify::compensation(
                    &answer,
                    &tool.dispatch().reference,
                    tool.compensate_done_status(),
                    self.options.excerpt_bytes,
                )
            }
            Err(no_answer) => classify::compensation_without_answer(no_answer),
        };
        Span::current().record("outcome", compensation_kind(&outcome));
        match &outcome {
            CompensationOutcome::Done { reference } => {
                debug!(outcome = "done", reference = ?reference, "compensated");
            }
            CompensationOutcome::Impossible { reason } => {
                warn!(outcome = "impossible", %reason, "compensation impossible");
            }
            CompensationOutcome::Retry { reason, .. } => {
                warn!(outcome = "retry", %reason, "compensation to be retried");
            }
        }
        outcome
    }
}
