//! Each fault of the proxy against a small real axum upstream that keeps a log of every request
//! it received. The log shows whether the upstream really saw a request.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::routing::any;

use super::{Fault, Proxy, lock};

/// What the upstream received: method, path and query, headers, body.
type Received = Arc<Mutex<Vec<(Method, String, HeaderMap, Bytes)>>>;

struct Upstream {
    url: String,
    received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Answers every request `201` with `x-upstream: seen` and the request's body echoed.
    async fn start() -> Self {
        async fn log(
            State(received): State<Received>,
            method: Method,
            uri: Uri,
            headers: HeaderMap,
            body: Bytes,
        ) -> (StatusCode, [(&'static str, &'static str); 1], Bytes) {
            let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
            lock(&received).push((method, path, headers, body.clone()));
            (StatusCode::CREATED, [("x-upstream", "seen")], body)
        }
        let received = Received::default();
        let router = Router::new()
            .route("/{*rest}", any(log))
            .with_state(Arc::clone(&received));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Self {
            url: format!("http://{addr}"),
            received,
            task,
        }
    }

    fn count(&self) -> usize {
        lock(&self.received).len()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn setup() -> (Upstream, Proxy, reqwest::Client) {
    let upstream = Upstream::start().await;
    let proxy = Proxy::start(&upstream.url).await.expect("the proxy starts");
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    (upstream, proxy, client)
}

async fn post(client: &reqwest::Client, proxy: &Proxy, path: &str) -> reqwest::Result<String> {
    let answer = client
        .post(format!("{}{path}", proxy.base_url()))
        .body("amount=100")
        .send()
        .await?;
    Ok(format!(
        "{} {}",
        answer.status().as_u16(),
        answer.text().await?
    ))
}

#[tokio::test]
async fn forwards_requests_and_answers_unchanged() {
    let (upstream, proxy, client) = setup().await;
    let body: &[u8] = &[0, 159, 146, 150, b'\n', 255];
    let answer = client
        .put(format!("{}/v1/things/7?a=1&b=%2F", proxy.base_url()))
        .header("authorization", "Bearer sk_test_123")
        .header("idempotency-key", "k-1")
        .body(body.to_vec())
        .send()
        .await
        .expect("an answer through the proxy");
    assert_eq!(answer.status(), StatusCode::CREATED);
    assert_eq!(answer.headers()["x-upstream"], "seen");
    assert_eq!(answer.bytes().await.expect("a body").as_ref(), body);

    let received = lock(&upstream.received).clone();
    let (method, path, headers, got) = &received[0];
    assert_eq!(
        (method, path.as_str()),
        (&Method::PUT, "/v1/things/7?a=1&b=%2F")
    );
    assert_eq!(headers["authorization"], "Bearer sk_test_123");
    assert_eq!(headers["idempotency-key"], "k-1");
    assert_eq!(headers["host"], upstream.url.trim_start_matches("http://"));
    assert_eq!(got.as_ref(), body);

    let seen = proxy.seen();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].forwarded && seen[0].fault.is_none());
    assert_eq!(seen[0].upstream_status, Some(StatusCode::CREATED));
    assert_eq!(seen[0].headers["authorization"], "Bearer sk_test_123");
}

#[tokio::test]
async fn keep_host_passes_the_clients_host_on() {
    let (upstream, proxy, client) = setup().await;
    proxy.keep_host(true);
    post(&client, &proxy, "/x").await.expect("an answer");
    let received = lock(&upstream.received).clone();
    let proxy_host = proxy.addr().to_string();
    assert_eq!(received[0].2["host"], proxy_host.as_str());
}

#[tokio::test]
async fn drop_before_arrival_never_reaches_the_upstream() {
    let (upstream, proxy, client) = setup().await;
    proxy.arm(Method::POST, "/v1/charges", Fault::DropBeforeArrival);
    let failed = post(&client, &proxy, "/v1/charges").await;
    let error = failed.expect_err("the connection closes without an answer");
    assert!(!error.is_timeout(), "closed, not timed out: {error}");
    assert_eq!(upstream.count(), 0, "the upstream never saw the request");
    let seen = proxy.seen();
    assert_eq!(seen[0].fault, Some(Fault::DropBeforeArrival));
    assert!(!seen[0].forwarded);
    assert_eq!(
        seen[0].body.as_ref(),
        b"amount=100",
        "the request was read in full"
    );

    // The rule was one-shot: the retry goes through.
    let retried = post(&client, &proxy, "/v1/charges").await;
    assert_eq!(retried.expect("an answer"), "201 amount=100");
    assert_eq!(upstream.count(), 1);
    assert_eq!(proxy.forwarded(&Method::POST, "/v1/charges"), 1);
}

#[tokio::test]
async fn commit_then_503_reaches_the_upstream_and_answers_503() {
    let (upstream, proxy, client) = setup().await;
    proxy.arm(Method::POST, "/v1/charges", Fault::CommitThen503);
    let answer = post(&client, &proxy, "/v1/charges")
        .await
        .expect("an answer");
    assert!(answer.starts_with("503 "), "{answer}");
    assert_eq!(upstream.count(), 1, "the upstream saw the request");
    let seen = proxy.seen();
    assert!(seen[0].forwarded);
    assert_eq!(seen[0].upstream_status, Some(StatusCode::CREATED));
}

#[tokio::test]
async fn commit_then_drop_reaches_the_upstream_and_closes() {
    let (upstream, proxy, client) = setup().await;
    proxy.arm(Method::POST, "/v1/charges", Fault::CommitThenDrop);
    let error = post(&client, &proxy, "/v1/charges")
        .await
        .expect_err("the connection closes without an answer");
    assert!(!error.is_timeout(), "closed, not timed out: {error}");
    assert_eq!(upstream.count(), 1, "the upstream saw the request");
    let seen = proxy.seen();
    assert_eq!(seen[0].fault, Some(Fault::CommitThenDrop));
    assert_eq!(seen[0].upstream_status, Some(StatusCode::CREATED));
}

#[tokio::test]
async fn delay_holds_the_request_then_forwards_it() {
    let (upstream, proxy, client) = setup().await;
    proxy.arm(
        Method::POST,
        "/v1/charges",
        Fault::Delay(Duration::from_millis(300)),
    );
    let started = Instant::now();
    let answer = post(&client, &proxy, "/v1/charges")
        .await
        .expect("an answer");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(answer, "201 amount=100");
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn rules_match_method_and_path_prefix_in_the_order_armed() {
    let (upstream, proxy, client) = setup().await;
    proxy.arm(Method::POST, "/v1/refunds", Fault::CommitThen503);
    proxy.arm(Method::POST, "/v1/refunds", Fault::DropBeforeArrival);

    // Neither another method nor another path uses up a rule.
    let other_method = client
        .get(format!("{}/v1/refunds?charge=ch_1", proxy.base_url()))
        .send()
        .await
        .expect("an answer");
    assert_eq!(other_method.status(), StatusCode::CREATED);
    let other_path = post(&client, &proxy, "/v1/charges")
        .await
        .expect("an answer");
    assert!(other_path.starts_with("201 "), "{other_path}");
    assert_eq!(proxy.armed(), 2);

    let first = post(&client, &proxy, "/v1/refunds/x")
        .await
        .expect("an answer");
    assert!(
        first.starts_with("503 "),
        "the first rule armed applies first: {first}"
    );
    assert!(post(&client, &proxy, "/v1/refunds").await.is_err());
    assert_eq!(proxy.armed(), 0);
    assert_eq!(
        upstream.count(),
        3,
        "GET, POST /v1/charges and the first refund"
    );

    proxy.arm(Method::DELETE, "/", Fault::DropBeforeArrival);
    proxy.disarm();
    let kept = client
        .delete(format!("{}/api/v1/messages", proxy.base_url()))
        .send()
        .await
        .expect("a disarmed rule does nothing");
    assert_eq!(kept.status(), StatusCode::CREATED);
}
