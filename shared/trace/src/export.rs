//! The OTLP exporter: spans go out over OTLP http/protobuf when an endpoint is configured
//! (`telemetry.otlp_endpoint`, or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), and nothing is built or sent when none is.
//!
//! Spans are batched on the SDK's own thread, so exporting never blocks a handler; a
//! collector that is down costs dropped spans, never a stalled pipeline. [`shutdown`] flushes
//! what is batched, and every binary calls it on its way out. Only Sluice's own spans (targets
//! `sluice*`, debug level included) and its events at info and above are exported, whatever
//! the log filter says.

use std::sync::Mutex;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;

/// The environment variables that configure an endpoint without `telemetry.otlp_endpoint`.
pub const ENDPOINT_ENV: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// How long one export may take before its batch is dropped.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The provider of this process's exporter, kept for [`shutdown`].
static PROVIDER: Mutex<Option<SdkTracerProvider>> = Mutex::new(None);

/// The exporter could not be built from its configuration.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint {endpoint:?}: {reason}")]
pub struct ExportError {
    pub endpoint: String,
    pub reason: String,
}

/// Where spans go: `configured` (its `/v1/traces` path added when it names none), or `None`
/// when neither it nor the standard variables name an endpoint.
pub fn endpoint(configured: Option<&str>) -> Option<Endpoint> {
    if let Some(url) = configured.map(str::trim).filter(|url| !url.is_empty()) {
        let trimmed = url.trim_end_matches('/');
        let has_path = trimmed
            .split_once("://")
            .is_some_and(|(_, rest)| rest.contains('/'));
        let url = if has_path {
            trimmed.to_owned()
        } else {
            format!("{trimmed}/v1/traces")
        };
        return Some(Endpoint::Url(url));
    }
    ENDPOINT_ENV
        .iter()
        .any(|name| std::env::var(name).is_ok_and(|value| !value.trim().is_empty()))
        .then_some(Endpoint::FromEnvironment)
}

/// Where the exporter sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// This URL (from the configuration).
    Url(String),
    /// Where the standard OpenTelemetry variables say.
    FromEnvironment,
}

/// The layer that exports this process's spans to `endpoint` as `service_name`
/// (`OTEL_SERVICE_NAME` wins when set). Installs the provider [`shutdown`] flushes.
pub fn layer<S>(
    endpoint: &Endpoint,
    service_name: &str,
) -> Result<Box<dyn Layer<S> + Send + Sync>, ExportError>
where
    S: Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
{
    let failed = |reason: String| ExportError {
        endpoint: match endpoint {
            Endpoint::Url(url) => url.clone(),
            Endpoint::FromEnvironment => "(from OTEL_EXPORTER_OTLP_*)".into(),
        },
        reason,
    };
    let builder = SpanExporter::builder()
        .with_http()
        .with_http_client(BlockingClient::new(EXPORT_TIMEOUT).map_err(failed)?)
        .with_timeout(EXPORT_TIMEOUT);
    let builder = match endpoint {
        Endpoint::Url(url) => builder.with_endpoint(url.clone()),
        Endpoint::FromEnvironment => builder,
    };
    let exporter = builder.build().map_err(|e| failed(e.to_string()))?;
    let resource = if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        Resource::builder().build()
    } else {
        Resource::builder()
            .with_service_name(service_name.to_owned())
            .build()
    };
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("sluice");
    if let Ok(mut slot) = PROVIDER.lock()
        && let Some(previous) = slot.replace(provider)
    {
        let _ = previous.shutdown();
    }
    // Sluice's spans (most are at debug level, so that without this layer they cost nothing),
    // and its events at info and above as span events: never another crate's, never debug
    // chatter.
    let only_ours = filter_fn(|meta| {
        meta.target().starts_with("sluice")
            && (meta.is_span() || *meta.level() <= tracing::Level::INFO)
    });
    Ok(tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(only_ours)
        .boxed())
}

/// Exports what is batched and stops the exporter; a no-op when none was installed. Waits at
/// most the export timeout.
pub fn shutdown() {
    let provider = PROVIDER.lock().ok().and_then(|mut slot| slot.take());
    if let Some(provider) = provider {
        let _ = provider.force_flush();
        if let Err(e) = provider.shutdown_with_timeout(EXPORT_TIMEOUT) {
            tracing::warn!(error = %e, "traces not all exported at shutdown");
        }
    }
}

/// The exporter's HTTP client: the workspace's reqwest, blocking, for the SDK's batch thread,
/// which waits on each export in turn (`futures_executor::block_on`, no async runtime there).
/// `opentelemetry-otlp`'s own reqwest clients are left out (see the workspace `Cargo.toml`).
#[derive(Debug)]
struct BlockingClient(reqwest::blocking::Client);

impl BlockingClient {
    /// Built on a thread of its own: a blocking client starts (and on drop stops) a runtime,
    /// which must not happen on a thread inside a Tokio runtime, as the caller may be.
    fn new(timeout: Duration) -> Result<Self, String> {
        let build = move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .build()
                .map_err(|e| format!("the HTTP client: {e}"))
        };
        std::thread::spawn(build)
            .join()
            .map_err(|_| "the HTTP client's construction panicked".to_owned())?
            .map(Self)
    }
}

#[async_trait::async_trait]
impl HttpClient for BlockingClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::blocking::Request::try_from(request)?;
        let mut response = self.0.execute(request)?.error_for_status()?;
        let headers = std::mem::take(response.headers_mut());
        let mut answer = Response::builder()
            .status(response.status())
            .body(response.bytes()?)?;
        *answer.headers_mut() = headers;
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_endpoint_gets_the_traces_path_unless_it_names_one() {
        assert_eq!(
            endpoint(Some("http://127.0.0.1:4318")),
            Some(Endpoint::Url("http://127.0.0.1:4318/v1/traces".into()))
        );
        assert_eq!(
            endpoint(Some("http://127.0.0.1:4318/")),
            Some(Endpoint::Url("http://127.0.0.1:4318/v1/traces".into()))
        );
        assert_eq!(
            endpoint(Some("https://otel.example/custom/path")),
            Some(Endpoint::Url("https://otel.example/custom/path".into()))
        );
    }
}
