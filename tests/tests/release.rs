//! What a release promises about its binaries, on the binaries this build made: every one's
//! `--version` names the workspace's version and the commit (the revision `sluice_build_info`
//! reports too); the copies of the version in the SDKs, the image and the manifests agree with
//! the workspace's (`scripts/release/versions.py`); and `sluice health`, the image's
//! healthcheck, against a real HTTP server.

use std::path::Path;
use std::process::{Command, Output};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use sluice_runtime::build_info::{LONG_VERSION, REVISION, VERSION};
use sluice_tests::processes::binary;

const BINARIES: [&str; 6] = [
    "sluice",
    "sluice-producer",
    "sluice-dispatcher",
    "sluice-reconciler",
    "sluice-compensator",
    "sluice-upstream",
];

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The revision the build must have found: `SLUICE_GIT_REVISION` when set (cargo rebuilds when
/// it changes, so the build and this test see the same), else the commit checked out, else
/// `unknown` (no git).
fn expected_revision() -> String {
    if let Some(given) = std::env::var("SLUICE_GIT_REVISION")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        return given.trim().to_owned();
    }
    Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root())
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn run(name: &str, args: &[&str]) -> Output {
    Command::new(binary(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{name} starts: {e}"))
}

#[test]
fn every_binary_names_its_version_and_commit() {
    let revision = expected_revision();
    assert_eq!(REVISION, revision, "the build's revision is the checkout's");
    assert_eq!(VERSION, env!("CARGO_PKG_VERSION"));
    assert_eq!(LONG_VERSION, format!("{VERSION} (commit {revision})"));
    for name in BINARIES {
        let out = run(name, &["--version"]);
        assert!(out.status.success(), "{name} --version: {out:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("{name} {VERSION} (commit {revision})\n"),
            "{name} --version"
        );
    }
}

#[test]
fn every_copy_of_the_version_agrees_with_the_workspace() {
    let out = Command::new("python3")
        .arg(root().join("scripts/release/versions.py"))
        .arg("--check")
        .output()
        .expect("python3 runs scripts/release/versions.py");
    assert!(
        out.status.success(),
        "scripts/release/versions.py --check:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), VERSION);
}

/// `sluice health URL` in a blocking task (the server runs on this test's runtime).
async fn health(args: &[&str]) -> (bool, String, String) {
    let args: Vec<String> = std::iter::once("health")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run("sluice", &args)
    })
    .await
    .expect("the health check runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_health_passes_on_2xx_only_and_says_why_not() {
    let app = Router::new()
        .route("/readyz", get(|| async { "ready" }))
        .route(
            "/busy",
            get(|| async { (StatusCode::SERVICE_UNAVAILABLE, "not ready") }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                "late"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let (passed, stdout, _) = health(&[&format!("{base}/readyz")]).await;
    assert!(passed, "{stdout}");
    assert_eq!(stdout, format!("GET {base}/readyz: 200 OK\n"));

    let (passed, _, stderr) = health(&[&format!("{base}/busy")]).await;
    assert!(!passed);
    assert_eq!(
        stderr,
        format!("error: GET {base}/busy: 503 Service Unavailable\n")
    );

    let (passed, _, stderr) = health(&[&format!("{base}/nowhere")]).await;
    assert!(!passed);
    assert!(stderr.contains("404 Not Found"), "{stderr}");

    let (passed, _, stderr) = health(&["--timeout", "1", &format!("{base}/slow")]).await;
    assert!(!passed);
    assert!(
        stderr.contains(&format!("GET {base}/slow: no answer")),
        "{stderr}"
    );

    server.abort();
    let _ = server.await;
    // Nothing listens there any more.
    let (passed, _, stderr) = health(&[&format!("{base}/readyz")]).await;
    assert!(!passed);
    assert!(stderr.contains("no answer"), "{stderr}");

    for (url, says) in [
        ("ftp://127.0.0.1/readyz", "not an http or https URL"),
        (
            "localhost:8700/readyz",
            "is not an http or https URL (scheme `localhost`)",
        ),
        ("http//nowhere", "is not a URL"),
    ] {
        let (passed, _, stderr) = health(&[url]).await;
        assert!(!passed, "{url}");
        assert!(stderr.contains(says), "{url}: {stderr}");
    }
}
