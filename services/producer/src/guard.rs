//! What every request passes before its route: the name it was sent to and a browser's
//! origin, the media type of a body, and the time the answer took.
//!
//! * Where a browser could have sent it from (`sluice_core::browser`, which has the rules and
//!   why): a `Host` that is not a name of this server — `localhost`, an IP address, or one of
//!   `producer.allowed_hosts` — is refused with 421 `host_not_allowed` (DNS rebinding); an
//!   `Origin` that is neither the producer's own (the console at `/ui` calls the API with
//!   `fetch` from there) nor listed in `producer.allowed_origins` with 403 `cross_origin`; a
//!   request another site's page made the browser send without an `Origin`, other than a
//!   navigation, with 403 `cross_site`. Each before its route runs, so a page the operator
//!   happens to visit cannot submit, approve, roll back, purge or read — not even in open mode,
//!   where the API has no token to ask for. The answer's `details` say what was refused
//!   (`refused`, `value`) and the key that allows it (`config_key`). A listed origin gets the
//!   CORS headers that let its page read the answers, and its preflights are answered.
//! * A request with a body must say `Content-Type: application/json` (415
//!   `unsupported_media_type` otherwise): a cross-site form can send only `text/plain`,
//!   `multipart/form-data` or `application/x-www-form-urlencoded` without a preflight, so none
//!   of those reaches a route.
//! * `sluice_http_request_duration_seconds{method, route, status}` observes each answer, by
//!   the route's template (`/v1/runs/{run_id}/effects/{*command_key}`), never its concrete
//!   path: runs and keys would make the labels unbounded. The time is to the answer's head (an
//!   event stream's body goes on after it).

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sluice_core::browser::{self, Refusal, Verdict};

use crate::{Api, ApiError};

/// The request headers a listed origin's page may send.
const ALLOW_HEADERS: &str = "authorization, content-type, prefer, traceparent, tracestate";
/// The answer headers a listed origin's page may read.
const EXPOSE_HEADERS: &str = "location, retry-after, preference-applied, sluice-existing";

/// A header's value as the rules read it: `None` when absent, and a value that is not text as
/// text that matches nothing.
fn text<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    headers
        .get(name)
        .map(|value| value.to_str().unwrap_or("\u{FFFD}"))
}

/// What the request says about where it comes from.
fn seen<'a>(method: &'a Method, headers: &'a HeaderMap) -> browser::Request<'a> {
    const SITE: HeaderName = HeaderName::from_static("sec-fetch-site");
    const MODE: HeaderName = HeaderName::from_static("sec-fetch-mode");
    const DEST: HeaderName = HeaderName::from_static("sec-fetch-dest");
    browser::Request {
        method: method.as_str(),
        host: text(headers, &header::HOST),
        origin: text(headers, &header::ORIGIN),
        fetch_site: text(headers, &SITE),
        fetch_mode: text(headers, &MODE),
        fetch_dest: text(headers, &DEST),
    }
}

/// The answer to a refused request: 421 for a name that is not this server's, 403 otherwise.
fn refused(refusal: &Refusal<'_>) -> Response {
    let (status, code) = match refusal {
        Refusal::Host(_) => (StatusCode::MISDIRECTED_REQUEST, "host_not_allowed"),
        Refusal::Origin(_) => (StatusCode::FORBIDDEN, "cross_origin"),
        Refusal::Site(_) => (StatusCode::FORBIDDEN, "cross_site"),
    };
    let value: String = refusal.value().chars().take(100).collect();
    ApiError::new(status, code, refusal.explain())
        .with_details(json!({
            "refused": refusal.refused(),
            "value": value,
            "config_key": refusal.config_key(),
        }))
        .into_response()
}

/// Whether the request has a body: a length above zero, or a chunked one.
fn has_body(headers: &HeaderMap) -> bool {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return true;
    }
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|length| length.trim() != "0")
}

/// Whether `Content-Type` is `application/json` (parameters such as `charset` allowed).
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

fn cors(response: &mut Response, origin: &str) {
    let headers = response.headers_mut();
    if let Ok(origin) = HeaderValue::from_str(origin) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    }
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSE_HEADERS),
    );
    headers.append(header::VARY, HeaderValue::from_static("origin"));
}

/// The checks and the timing above, around every route (and the answers to no route).
pub(crate) async fn guard(State(api): State<Api>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let verdict = api.browser.judge(&seen(&method, request.headers()));
    let answer = match verdict {
        Verdict::Refuse(refusal) => refused(&refusal),
        Verdict::Cors(origin) if method == Method::OPTIONS => {
            // A preflight of a listed origin's page.
            let mut response = StatusCode::NO_CONTENT.into_response();
            cors(&mut response, origin);
            let headers = response.headers_mut();
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, DELETE"),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(ALLOW_HEADERS),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static("600"),
            );
            response
        }
        _ if has_body(request.headers()) && !is_json(request.headers()) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "a request body must be JSON, sent with Content-Type: application/json",
        )
        .into_response(),
        _ => {
            let allowed = match verdict {
                Verdict::Cors(origin) => Some(origin.to_owned()),
                _ => None,
            };
            let mut response = next.run(request).await;
            if let Some(origin) = allowed {
                cors(&mut response, &origin);
            }
            response
        }
    };
    api.ctx
        .metrics
        .http_seconds
        .with_label_values(&[method.as_str(), &route, answer.status().as_str()])
        .observe(started.elapsed().as_secs_f64());
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(name, value)| {
                (
                    name.clone(),
                    HeaderValue::from_str(value).expect("a header value"),
                )
            })
            .collect()
    }

    #[test]
    fn a_body_must_be_declared_json() {
        assert!(!has_body(&headers(&[(header::CONTENT_LENGTH, "0")])));
        assert!(has_body(&headers(&[(header::CONTENT_LENGTH, "12")])));
        assert!(has_body(&headers(&[(
            header::TRANSFER_ENCODING,
            "chunked"
        )])));
        assert!(is_json(&headers(&[(
            header::CONTENT_TYPE,
            "Application/JSON; charset=utf-8"
        )])));
        for other in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
        ] {
            assert!(
                !is_json(&headers(&[(header::CONTENT_TYPE, other)])),
                "{other}"
            );
        }
        assert!(!is_json(&HeaderMap::new()));
    }
}
