//! `sluice health URL`: one GET for a container's healthcheck. The image is distroless (no
//! shell, curl or wget), so the binary that is there asks: exit 0 when the URL answers 2xx,
//! otherwise exit 1 with what it answered or why nothing answered. Kubernetes probes call the
//! endpoints themselves and do not need it (docs/deploy.md).

use std::time::Duration;

use futures::future::BoxFuture;

/// The arguments of `sluice health`.
#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// The URL to GET, e.g. http://127.0.0.1:8700/readyz (the producer) or
    /// http://127.0.0.1:9464/readyz (the telemetry listener of the other services).
    pub url: String,
    /// Seconds to wait for the answer.
    #[arg(long, default_value_t = 5)]
    pub timeout: u64,
}

/// GETs the URL once. `Ok` with the status line when it answered 2xx; `Err` with what was
/// wrong (a URL that is not http(s), no answer within the timeout, a status that is not 2xx).
pub fn check(args: &HealthArgs) -> BoxFuture<'_, Result<String, String>> {
    Box::pin(check_body(args))
}

async fn check_body(args: &HealthArgs) -> Result<String, String> {
    let url =
        reqwest::Url::parse(&args.url).map_err(|e| format!("`{}` is not a URL: {e}", args.url))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "`{}` is not an http or https URL (scheme `{}`)",
            args.url,
            url.scheme()
        ));
    }
    if args.timeout == 0 {
        return Err("--timeout must be at least 1 second".to_owned());
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(args.timeout))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| format!("no HTTP client: {e}"))?;
    let answer = client.get(url.clone()).send().await.map_err(|e| {
        let mut message = format!("GET {url}: no answer: {e}");
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        message
    })?;
    let status = answer.status();
    if status.is_success() {
        Ok(format!("GET {url}: {status}"))
    } else {
        Err(format!("GET {url}: {status}"))
    }
}
