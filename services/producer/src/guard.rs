//! What every request passes before its route: a browser's origin, the media type of a body,
//! and the time the answer took.
//!
//! * A request carrying `Origin` is a browser's. It is served when the origin is the producer's
//!   own (the console at `/ui` calls the API with `fetch` from there) or is listed in
//!   `producer.allowed_origins`; any other is refused with 403 `cross_origin` before its route
//!   runs, so a page the operator happens to visit cannot submit, approve, roll back or purge
//!   — not even in open mode, where the API has no token to ask for. A listed origin gets the
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
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::{Api, ApiError};

/// The request headers a listed origin's page may send.
const ALLOW_HEADERS: &str = "authorization, content-type, prefer, traceparent, tracestate";
/// The answer headers a listed origin's page may read.
const EXPOSE_HEADERS: &str = "location, retry-after, preference-applied";

/// Whose the request's origin is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin<'a> {
    /// No `Origin`: not a browser's cross-origin request (curl, an SDK, a same-origin GET).
    None,
    /// The producer's own origin.
    Same,
    /// One of `producer.allowed_origins`.
    Allowed(&'a str),
    Refused,
}

/// `open`: the API is served without tokens, where the server's own origin counts only under a
/// loopback name (`localhost`, an IP literal): a page on a name the attacker controls, made to
/// resolve to 127.0.0.1 (DNS rebinding), would otherwise pass as the server's own.
fn origin_of<'a>(headers: &'a HeaderMap, allowed: &[String], open: bool) -> Origin<'a> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Origin::None;
    };
    let Ok(origin) = origin.to_str() else {
        return Origin::Refused;
    };
    // The console's own origin: the authority the browser reached this server at. (Any scheme:
    // behind a proxy that ends TLS the page is https and the request reaches us as http.)
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    if let (Some(authority), Some(host)) = (authority, host)
        && !authority.is_empty()
        && authority.eq_ignore_ascii_case(host)
        && (!open || is_loopback_name(host))
    {
        return Origin::Same;
    }
    if allowed.iter().any(|listed| listed == origin) {
        return Origin::Allowed(origin);
    }
    // `Origin: null` (a sandboxed frame, a file) and every other site.
    Origin::Refused
}

/// `localhost` or an IP literal, with or without a port.
fn is_loopback_name(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
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
    let origin = origin_of(
        request.headers(),
        &api.config.allowed_origins,
        api.auth.is_open(),
    );
    let answer = match origin {
        Origin::Refused => ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_origin",
            "a browser request from another origin; the producer serves its own origin and \
             those in producer.allowed_origins",
        )
        .into_response(),
        Origin::Allowed(origin) if method == Method::OPTIONS => {
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
            let allowed = match origin {
                Origin::Allowed(origin) => Some(origin.to_owned()),
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
    fn origins_are_the_servers_own_or_listed() {
        let listed = vec!["https://console.example.com".to_owned()];
        let host = (header::HOST, "127.0.0.1:8700");
        assert_eq!(
            origin_of(&headers(std::slice::from_ref(&host)), &listed, false),
            Origin::None
        );
        for own in ["http://127.0.0.1:8700", "https://127.0.0.1:8700"] {
            let with = headers(&[host.clone(), (header::ORIGIN, own)]);
            assert_eq!(origin_of(&with, &listed, true), Origin::Same, "{own}");
        }
        // A name that resolves to loopback by the attacker's DNS: the server's own with
        // tokens (a page there has none), refused in open mode.
        let rebound = headers(&[
            (header::HOST, "rebind.example:8700"),
            (header::ORIGIN, "http://rebind.example:8700"),
        ]);
        assert_eq!(origin_of(&rebound, &listed, false), Origin::Same);
        assert_eq!(origin_of(&rebound, &listed, true), Origin::Refused);
        let local = headers(&[
            (header::HOST, "localhost:8700"),
            (header::ORIGIN, "http://localhost:8700"),
        ]);
        assert_eq!(origin_of(&local, &listed, true), Origin::Same);
        let listed_one = headers(&[
            host.clone(),
            (header::ORIGIN, "https://console.example.com"),
        ]);
        assert_eq!(
            origin_of(&listed_one, &listed, true),
            Origin::Allowed("https://console.example.com")
        );
        for other in [
            "https://evil.example",
            "null",
            "http://127.0.0.1:8701",
            "http://",
            "https://console.example.com.evil.example",
        ] {
            let with = headers(&[host.clone(), (header::ORIGIN, other)]);
            assert_eq!(origin_of(&with, &listed, false), Origin::Refused, "{other}");
        }
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
