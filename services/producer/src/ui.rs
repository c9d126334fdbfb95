//! The operator's web console at `/ui`: static HTML, CSS and ES modules compiled into the
//! binary (`include_str!` of `services/producer/ui/`), so nothing is read from disk or built
//! at run time, and every page is what was reviewed.
//!
//! The console holds no authority of its own: it signs in with the API's bearer tokens, kept
//! in the browser's `sessionStorage` and sent as `Authorization` headers by `fetch` (never in a
//! URL, a cookie or a log), and every action goes through the same API routes and role checks
//! as `sluice` on the command line. No cookie means no cross-site request can act with a
//! signed-in person's authority. Every answer here carries a Content-Security-Policy that
//! allows scripts, styles and connections from this origin only (no inline script, no
//! `eval`), forbids framing (`frame-ancestors 'none'`), and sends no referrer; see
//! `docs/architecture.md`, "Web console".
//!
//! Served when `producer.console` is true: by default in `sluice dev`, by configuration in
//! `sluice-producer`.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::Api;

/// The policy every console answer carries: this origin's scripts, styles and API only.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One embedded file: its path under `/ui/`, content type and bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_str!(concat!("../ui/", $path)),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

/// Every file the console is made of.
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("style.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("js/main.js", JS),
    asset!("js/api.js", JS),
    asset!("js/dom.js", JS),
    asset!("js/actions.js", JS),
    asset!("js/live.js", JS),
    asset!("js/format.js", JS),
    asset!("js/views/runs.js", JS),
    asset!("js/views/run.js", JS),
    asset!("js/views/queues.js", JS),
    asset!("js/views/scheduled.js", JS),
    asset!("js/views/audit.js", JS),
    asset!("js/views/overview.js", JS),
    asset!("js/views/flow.js", JS),
    asset!("js/views/budgets.js", JS),
];

/// The console's routes, or none when it is not enabled (`/ui` is then no route, 404).
pub(crate) fn routes(enabled: bool) -> Router<Api> {
    if !enabled {
        return Router::new();
    }
    Router::new()
        .route("/ui", get(|| async { serve("index.html") }))
        .route("/ui/", get(|| async { serve("index.html") }))
        .route(
            "/ui/{*path}",
            get(|Path(path): Path<String>| async move { serve(&path) }),
        )
}

/// The embedded file at `path`, or a plain 404.
fn serve(path: &str) -> Response {
    let response = match ASSETS.iter().find(|a| a.path == path) {
        Some(asset) => (
            [
                (header::CONTENT_TYPE, asset.content_type),
                // Small files, compiled in: revalidate each time so a new build shows at once.
                (header::CACHE_CONTROL, "no-cache"),
            ],
            asset.body,
        )
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "no such console file; open /ui/",
        )
            .into_response(),
    };
    secured(response)
}

/// Adds the console's security headers to `response`.
pub(crate) fn secured(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (
            header::HeaderName::from_static("cross-origin-opener-policy"),
            "same-origin",
        ),
        (
            header::HeaderName::from_static("permissions-policy"),
            "camera=(), microphone=(), geolocation=()",
        ),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_is_served_with_the_security_headers() {
        for asset in ASSETS {
            let response = serve(asset.path);
            assert_eq!(response.status(), StatusCode::OK, "{}", asset.path);
            let csp = response.headers()[header::CONTENT_SECURITY_POLICY]
                .to_str()
                .expect("ascii");
            assert!(csp.contains("script-src 'self'"), "{csp}");
            assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"));
        }
        assert_eq!(serve("../Cargo.toml").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_pages_hold_no_inline_script_or_handler() {
        // The policy would block them: a page that needs one is broken in the browser.
        for asset in ASSETS.iter().filter(|a| a.path.ends_with(".html")) {
            for line in asset.body.lines() {
                let line = line.trim();
                if line.starts_with("<script") {
                    assert!(line.contains("src="), "inline script in {}", asset.path);
                }
                assert!(
                    !line.contains(" onclick=") && !line.contains(" onload="),
                    "inline handler in {}: {line}",
                    asset.path
                );
            }
        }
    }
}
