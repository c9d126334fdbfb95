//! The demo upstream over real HTTP on loopback, seen from a real reqwest client: the wire
//! contract of each endpoint, idempotency where promised (and its absence at the bank), every
//! fault kind as the client meets it and as the stats count it, and seeded determinism.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use reqwest::{Client, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use sluice_upstream::{Family, FaultKind, FaultRates, Faults, Stats, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ANY_PORT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);
const SEED: u64 = 7;

async fn start(faults: Faults) -> Upstream {
    Upstream::start(ANY_PORT, faults, SEED)
        .await
        .expect("the demo upstream binds a free loopback port")
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a plain HTTP client builds")
}

fn wire(account: &str, amount_minor: i64) -> Value {
    json!({
        "account": account,
        "amount_minor": amount_minor,
        "beneficiary": "Ada Lovelace",
        "date": "2026-11-02",
        "reference": "invoice 42",
    })
}

fn sluice_headers(request: RequestBuilder, idempotency_key: &str) -> RequestBuilder {
    request
        .header("Idempotency-Key", idempotency_key)
        .header("X-Sluice-Run-Id", "run-1")
        .header("X-Sluice-Command-Key", format!("cmd-{idempotency_key}"))
}

async fn post_wire(
    client: &Client,
    upstream: &Upstream,
    body: &Value,
    key: &str,
) -> reqwest::Result<Response> {
    sluice_headers(
        client.post(format!("{}/bank/wires", upstream.base_url())),
        key,
    )
    .json(body)
    .send()
    .await
}

async fn by_key(client: &Client, upstream: &Upstream, business_key: &str) -> (StatusCode, Value) {
    let response = client
        .get(format!(
            "{}/bank/wires/by-key/{business_key}",
            upstream.base_url()
        ))
        .send()
        .await
        .expect("the status check answers");
    let status = response.status();
    (
        status,
        response
            .json()
            .await
            .expect("the status check answers JSON"),
    )
}

async fn json_of(response: reqwest::Result<Response>) -> (StatusCode, Value) {
    let response = response.expect("the upstream answers");
    let status = response.status();
    (
        status,
        response.json().await.expect("the upstream answers JSON"),
    )
}

fn bank_only(kind: FaultKind) -> Faults {
    Faults::none().with_rates(Family::Bank, FaultRates::only(kind, 1.0))
}

#[tokio::test]
async fn the_bank_books_every_post_and_by_key_tells_present_absent_duplicate() {
    let upstream = start(Faults::none()).await;
    let client = client();

    let (status, first) = json_of(
        sluice_headers(
            client.post(format!("{}/bank/wires", upstream.base_url())),
            "idem-1",
        )
        .header("X-Sluice-Business-Key", "bk-1")
        .json(&wire("acct-1", 5000))
        .send()
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(first["id"], "w-1");
    assert_eq!(first["status"], "booked");
    assert_eq!(
        first["business_key"], "bk-1",
        "the header names the business key"
    );
    assert_eq!(first["run_id"], "run-1");

    let (status, present) = by_key(&client, &upstream, "bk-1").await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );
    let (status, _) = by_key(&client, &upstream, "bk-never").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Same Idempotency-Key again: the bank is NON-idempotent and books a second wire.
    let (status, second) = json_of(
        sluice_headers(
            client.post(format!("{}/bank/wires", upstream.base_url())),
            "idem-1",
        )
        .header("X-Sluice-Business-Key", "bk-1")
        .json(&wire("acct-1", 5000))
        .send()
        .await,
    )
    .await;
    assert_eq!(
        (status, second["id"].clone()),
        (StatusCode::CREATED, json!("w-2"))
    );
    let (status, duplicate) = by_key(&client, &upstream, "bk-1").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(duplicate["refs"], json!(["w-1", "w-2"]));
    assert_eq!(duplicate["id"], "w-1");
    assert_eq!(upstream.stats().double_commits().get("bk-1"), Some(&2));

    // Reversing the duplicate restores the invariant; a second reversal and an unknown wire
    // are refused.
    let reverse = |id: &str| {
        client
            .post(format!("{}/bank/wires/{id}/reverse", upstream.base_url()))
            .json(&json!({"args": wire("acct-1", 5000), "external_ref": id}))
            .send()
    };
    let (status, reversal) = json_of(reverse("w-2").await).await;
    assert_eq!(
        (status, reversal["id"].clone()),
        (StatusCode::OK, json!("rev-1"))
    );
    let (status, present) = by_key(&client, &upstream, "bk-1").await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );
    let (status, _) = json_of(reverse("w-2").await).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = json_of(reverse("w-99").await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Without the header the key is the catalog's `{account}:{beneficiary}:{amount_minor}:{date}`.
    let (status, computed) =
        json_of(post_wire(&client, &upstream, &wire("acct-2", 700), "idem-2").await).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        computed["business_key"],
        "acct-2:Ada Lovelace:700:2026-11-02"
    );
    let (status, present) = by_key(&client, &upstream, "acct-2:Ada Lovelace:700:2026-11-02").await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-3"))
    );

    let stats = upstream.stats();
    assert_eq!((stats.wires, stats.wires_reversed), (3, 1));
    assert_eq!(stats.standing_wires("bk-1"), 1);
    assert!(stats.double_commits().is_empty(), "{stats:?}");
    assert_eq!(stats.faults.total(), 0);
    upstream.shutdown().await;
}

#[tokio::test]
async fn bad_wire_orders_are_refused_without_booking() {
    let upstream = start(Faults::none()).await;
    let client = client();
    let (status, _) = json_of(post_wire(&client, &upstream, &wire("acct-1", 0), "k").await).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, body) =
        json_of(post_wire(&client, &upstream, &json!({"account": "a"}), "k").await).await;
    assert!(status.is_client_error(), "{status}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("amount_minor")),
        "{body}"
    );
    assert_eq!(upstream.stats().wires, 0);
    upstream.shutdown().await;
}

#[tokio::test]
async fn email_and_tickets_deduplicate_by_idempotency_key() {
    let upstream = start(Faults::none()).await;
    let client = client();
    let email = json!({"to": "ops@example.com", "subject": "wire sent", "body": "w-1"});
    let send = |key: &'static str| {
        sluice_headers(
            client.post(format!("{}/email/messages", upstream.base_url())),
            key,
        )
        .json(&email)
        .send()
    };
    let (status, first) = json_of(send("mail-1").await).await;
    assert_eq!(
        (status, first["id"].clone()),
        (StatusCode::CREATED, json!("m-1"))
    );
    let (status, again) = json_of(send("mail-1").await).await;
    assert_eq!(
        (status, again["id"].clone()),
        (StatusCode::OK, json!("m-1"))
    );
    let (status, other) = json_of(send("mail-2").await).await;
    assert_eq!(
        (status, other["id"].clone()),
        (StatusCode::CREATED, json!("m-2"))
    );

    let ticket = json!({"title": "refund stuck", "priority": "high"});
    let open = |key: &'static str| {
        sluice_headers(client.post(format!("{}/tickets", upstream.base_url())), key)
            .json(&ticket)
            .send()
    };
    let (status, opened) = json_of(open("ticket-1").await).await;
    assert_eq!(
        (status, opened["id"].clone()),
        (StatusCode::CREATED, json!("t-1"))
    );
    let (status, replayed) = json_of(open("ticket-1").await).await;
    assert_eq!(
        (status, replayed["id"].clone()),
        (StatusCode::OK, json!("t-1"))
    );
    let close = |id: &'static str| {
        client
            .post(format!("{}/tickets/{id}/close", upstream.base_url()))
            .json(&json!({"args": ticket, "external_ref": id}))
            .send()
    };
    let (status, closed) = json_of(close("t-1").await).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (closed["id"].clone(), closed["status"].clone()),
        (json!("t-1"), json!("closed"))
    );
    let (status, _) = json_of(close("t-9").await).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let stats = upstream.stats();
    assert_eq!((stats.emails, stats.email_replays), (2, 1));
    assert_eq!(
        (stats.tickets, stats.ticket_replays, stats.tickets_closed),
        (1, 1, 1)
    );
    upstream.shutdown().await;
}

#[tokio::test]
async fn search_answers_hits_and_changes_nothing() {
    let upstream = start(Faults::demo()).await;
    let client = client();
    let (status, body) = json_of(
        client
            .post(format!("{}/search", upstream.base_url()))
            .json(&json!({"query": "wire cutoff", "limit": 4}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let results = body["results"].as_array().expect("results is an array");
    assert_eq!(results.len(), 4);
    assert!(
        results[0]["title"]
            .as_str()
            .is_some_and(|t| t.contains("wire cutoff"))
    );
    let (status, _) = json_of(
        client
            .post(format!("{}/search", upstream.base_url()))
            .json(&json!({"query": "x", "limit": 0}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let stats = upstream.stats();
    assert_eq!(stats.searches, 1);
    assert_eq!((stats.wires, stats.emails, stats.tickets), (0, 0, 0));
    assert_eq!(stats.faults.total(), 0, "search is never faulted");
    upstream.shutdown().await;
}

#[tokio::test]
async fn commit_then_timeout_commits_and_outlasts_the_client() {
    let hold = Duration::from_millis(1500);
    let upstream = start(bank_only(FaultKind::CommitThenTimeout).with_timeout_sleep(hold)).await;
    let impatient = Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("a plain HTTP client builds");
    let started = Instant::now();
    let failed = post_wire(&impatient, &upstream, &wire("acct-1", 5000), "k")
        .await
        .expect_err("the response is held past the client's timeout");
    assert!(failed.is_timeout(), "expected a timeout, got {failed:?}");
    assert!(
        started.elapsed() < hold,
        "the client gave up before the hold ended"
    );

    // The effect was committed before the hold: the ambiguity is real.
    let stats = upstream.stats();
    assert_eq!(stats.wires, 1);
    assert_eq!(stats.faults.commit_then_timeout, 1);
    let (status, present) =
        by_key(&client(), &upstream, "acct-1:Ada Lovelace:5000:2026-11-02").await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );

    // A patient client gets the normal answer once the hold is over.
    let (status, late) =
        json_of(post_wire(&client(), &upstream, &wire("acct-1", 6000), "k2").await).await;
    assert_eq!(
        (status, late["id"].clone()),
        (StatusCode::CREATED, json!("w-2"))
    );
    upstream.shutdown().await;
}

#[tokio::test]
async fn drop_response_commits_then_closes_the_connection_without_a_status() {
    let upstream = start(Faults::uniform(FaultRates::only(
        FaultKind::DropResponse,
        1.0,
    )))
    .await;
    let client = client();
    // Warm a pooled connection first, so the faulted request runs on a reused one: a client
    // that silently resent it would book a second wire.
    let (status, _) = json_of(
        client
            .post(format!("{}/search", upstream.base_url()))
            .json(&json!({"query": "warm"}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);

    let started = Instant::now();
    let failed = post_wire(&client, &upstream, &wire("acct-1", 5000), "k")
        .await
        .expect_err("the connection closes without a response");
    assert!(
        !failed.is_timeout(),
        "a closed connection, not a timeout: {failed:?}"
    );
    assert!(
        failed.status().is_none(),
        "no HTTP status was sent: {failed:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the close is immediate"
    );
    let chain = error_chain(&failed);
    assert!(
        chain.contains("closed") || chain.contains("reset"),
        "the client sees the connection closed: {chain}"
    );

    let failed = sluice_headers(
        client.post(format!("{}/email/messages", upstream.base_url())),
        "m",
    )
    .json(&json!({"to": "a@example.com", "subject": "s", "body": "b"}))
    .send()
    .await
    .expect_err("the mail service drops the connection too");
    assert!(
        failed.status().is_none() && !failed.is_timeout(),
        "{failed:?}"
    );

    // On the wire: not a single byte of a response before the close.
    let body = wire("acct-2", 100).to_string();
    let mut raw = tokio::net::TcpStream::connect(upstream.local_addr())
        .await
        .expect("the upstream accepts a raw connection");
    let request = format!(
        "POST /bank/wires HTTP/1.1\r\nHost: upstream\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    raw.write_all(request.as_bytes())
        .await
        .expect("the request is sent");
    let mut answer = Vec::new();
    // EOF (Ok) and a reset (Err) are both a close; what matters is that nothing came first.
    let _eof_or_reset = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer))
        .await
        .expect("the upstream closes the connection promptly");
    assert!(
        answer.is_empty(),
        "no response bytes: {:?}",
        String::from_utf8_lossy(&answer)
    );

    let stats = upstream.stats();
    assert_eq!(
        stats.wires, 2,
        "each wire committed exactly once despite the lost responses"
    );
    assert_eq!(stats.emails, 1);
    assert_eq!(stats.faults.drop_response, 3);
    let (status, present) = by_key(&client, &upstream, "acct-1:Ada Lovelace:5000:2026-11-02").await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );
    upstream.shutdown().await;
}

#[tokio::test]
async fn error_5xx_answers_503_and_commits_nothing() {
    let upstream = start(Faults::uniform(FaultRates::only(FaultKind::Error5xx, 1.0))).await;
    let client = client();
    let (status, _) =
        json_of(post_wire(&client, &upstream, &wire("acct-1", 5000), "k").await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = json_of(
        sluice_headers(
            client.post(format!("{}/email/messages", upstream.base_url())),
            "m",
        )
        .json(&json!({"to": "a@example.com", "subject": "s", "body": "b"}))
        .send()
        .await,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = json_of(
        sluice_headers(client.post(format!("{}/tickets", upstream.base_url())), "t")
            .json(&json!({"title": "x"}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let (status, _) = by_key(&client, &upstream, "acct-1:Ada Lovelace:5000:2026-11-02").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a refused wire is not booked"
    );

    let stats = upstream.stats();
    assert_eq!((stats.wires, stats.emails, stats.tickets), (0, 0, 0));
    assert_eq!(stats.faults.error_5xx, 3);
    upstream.shutdown().await;
}

/// A rate limit: 429 with `Retry-After`, nothing booked; the status check can be rate
/// limited the same way.
#[tokio::test]
async fn rate_limited_answers_429_with_retry_after_and_commits_nothing() {
    let faults = Faults {
        status_rate_limited: 1.0,
        retry_after_secs: 2,
        ..Faults::uniform(FaultRates::only(FaultKind::RateLimited, 1.0))
    };
    let upstream = start(faults).await;
    let client = client();
    let response = post_wire(&client, &upstream, &wire("acct-1", 5000), "k")
        .await
        .expect("an answer");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|value| value.to_str().ok()),
        Some("2")
    );
    let (status, _) = by_key(&client, &upstream, "acct-1:Ada Lovelace:5000:2026-11-02").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the lookup is rate limited too"
    );
    let mut faults = upstream.faults();
    faults.status_rate_limited = 0.0;
    upstream.set_faults(faults).expect("valid faults");
    let (status, _) = by_key(&client, &upstream, "acct-1:Ada Lovelace:5000:2026-11-02").await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a rate-limited wire is not booked"
    );
    let stats = upstream.stats();
    assert_eq!(stats.wires, 0);
    assert_eq!(stats.faults.rate_limited, 1);
    assert_eq!(stats.faults.status_rate_limited, 1);
    upstream.shutdown().await;
}

#[tokio::test]
async fn commit_then_5xx_answers_500_after_booking() {
    let upstream = start(bank_only(FaultKind::CommitThen5xx)).await;
    let client = client();
    let (status, _) =
        json_of(post_wire(&client, &upstream, &wire("acct-1", 5000), "k").await).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let (status, present) = by_key(&client, &upstream, "acct-1:Ada Lovelace:5000:2026-11-02").await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );
    let stats = upstream.stats();
    assert_eq!(stats.wires, 1);
    assert_eq!(stats.faults.commit_then_5xx, 1);
    upstream.shutdown().await;
}

#[tokio::test]
async fn commit_twice_is_found_by_key_and_undone_by_reversal() {
    let upstream = start(bank_only(FaultKind::CommitTwice)).await;
    let client = client();
    let (status, booked) =
        json_of(post_wire(&client, &upstream, &wire("acct-1", 5000), "k").await).await;
    assert_eq!(
        (status, booked["id"].clone()),
        (StatusCode::CREATED, json!("w-1"))
    );

    let key = "acct-1:Ada Lovelace:5000:2026-11-02";
    let (status, duplicate) = by_key(&client, &upstream, key).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(duplicate["refs"], json!(["w-1", "w-2"]));
    let stats = upstream.stats();
    assert_eq!(stats.double_commits().get(key), Some(&2), "{stats:?}");
    assert_eq!(stats.faults.commit_twice, 1);

    let (status, _) = json_of(
        client
            .post(format!("{}/bank/wires/w-2/reverse", upstream.base_url()))
            .json(&json!({"args": wire("acct-1", 5000), "external_ref": "w-2"}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, present) = by_key(&client, &upstream, key).await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );
    assert!(upstream.stats().double_commits().is_empty());
    upstream.shutdown().await;
}

#[tokio::test]
async fn status_inconclusive_answers_503_until_faults_are_cleared() {
    let upstream = start(Faults::none().with_status_inconclusive(1.0)).await;
    let client = client();
    let (status, _) =
        json_of(post_wire(&client, &upstream, &wire("acct-1", 5000), "k").await).await;
    assert_eq!(status, StatusCode::CREATED, "dispatch is not affected");
    let key = "acct-1:Ada Lovelace:5000:2026-11-02";
    let (status, _) = by_key(&client, &upstream, key).await;
    assert_eq!(
        status,
        StatusCode::SERVICE_UNAVAILABLE,
        "even though the wire exists"
    );
    assert_eq!(upstream.stats().faults.status_inconclusive, 1);

    upstream
        .set_faults(Faults::none())
        .expect("no faults is valid");
    let (status, present) = by_key(&client, &upstream, key).await;
    assert_eq!(
        (status, present["id"].clone()),
        (StatusCode::OK, json!("w-1"))
    );
    let stats = upstream.stats();
    assert_eq!(stats.status_checks, 2);
    assert_eq!(stats.faults.status_inconclusive, 1);
    upstream.shutdown().await;
}

#[tokio::test]
async fn faults_and_stats_are_reachable_over_http() {
    let upstream = start(Faults::none()).await;
    let client = client();
    let url = format!("{}/_faults", upstream.base_url());

    let (status, set) = json_of(
        client
            .post(&url)
            .json(&json!({"bank": {"error_5xx": 1.0}}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(set["bank"]["error_5xx"], 1.0);
    assert_eq!(upstream.faults(), bank_only(FaultKind::Error5xx));
    let (status, _) =
        json_of(post_wire(&client, &upstream, &wire("acct-1", 5000), "k").await).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

    // An invalid change is refused with the key named, and the old rates stay.
    let (status, refused) = json_of(
        client
            .post(&url)
            .json(&json!({"email": {"commit_twice": 0.5}}))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("email.commit_twice")),
        "{refused}"
    );
    let (status, _) = json_of(
        client
            .post(&url)
            .json(&json!({"bank": {"drop_respons": 1.0}}))
            .send()
            .await,
    )
    .await;
    assert!(
        status.is_client_error(),
        "a misspelt rate is refused, not ignored"
    );
    let (_, current) = json_of(client.get(&url).send().await).await;
    assert_eq!(current["bank"]["error_5xx"], 1.0);

    // `{}` is the clean phase.
    let (status, _) = json_of(client.post(&url).json(&json!({})).send().await).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) =
        json_of(post_wire(&client, &upstream, &wire("acct-1", 5000), "k").await).await;
    assert_eq!(status, StatusCode::CREATED);

    let (status, stats) = json_of(
        client
            .get(format!("{}/_stats", upstream.base_url()))
            .send()
            .await,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let stats: Stats = serde_json::from_value(stats).expect("/_stats is a Stats");
    assert_eq!(stats, upstream.stats());
    assert_eq!((stats.wires, stats.faults.error_5xx), (1, 1));
    assert_eq!(
        stats.standing_wires("acct-1:Ada Lovelace:5000:2026-11-02"),
        1
    );
    upstream.shutdown().await;
}

/// What one request of the determinism script met, as the client saw it.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Status(u16),
    NoResponse,
}

async fn run_script(seed: u64) -> (Vec<Seen>, Stats) {
    let rates = FaultRates {
        commit_then_timeout: 0.0,
        drop_response: 0.15,
        error_5xx: 0.15,
        commit_then_5xx: 0.15,
        commit_twice: 0.15,
        rate_limited: 0.0,
    };
    let faults = Faults::none()
        .with_rates(Family::Bank, rates)
        .with_status_inconclusive(0.3);
    let upstream = Upstream::start(ANY_PORT, faults, seed)
        .await
        .expect("upstream starts");
    let client = client();
    let mut seen = Vec::new();
    for n in 1..=30 {
        let body = wire("acct-1", n);
        seen.push(
            match post_wire(&client, &upstream, &body, &format!("k{n}")).await {
                Ok(response) => Seen::Status(response.status().as_u16()),
                Err(_) => Seen::NoResponse,
            },
        );
        let (status, _) = by_key(
            &client,
            &upstream,
            &format!("acct-1:Ada Lovelace:{n}:2026-11-02"),
        )
        .await;
        seen.push(Seen::Status(status.as_u16()));
    }
    let stats = upstream.stats();
    upstream.shutdown().await;
    (seen, stats)
}

#[tokio::test]
async fn the_same_seed_and_requests_give_the_same_faults() {
    let (first, first_stats) = run_script(42).await;
    let (again, again_stats) = run_script(42).await;
    assert_eq!(first, again);
    assert_eq!(first_stats, again_stats);
    for kind in [
        FaultKind::DropResponse,
        FaultKind::Error5xx,
        FaultKind::CommitThen5xx,
        FaultKind::CommitTwice,
        FaultKind::StatusInconclusive,
    ] {
        assert!(
            first_stats.faults.get(kind) > 0,
            "the script never met {kind}: {first_stats:?}"
        );
    }
    assert!(first.contains(&Seen::NoResponse));
    assert!(
        first.contains(&Seen::Status(409)),
        "a double commit shows as 409 by key"
    );

    let (other, _) = run_script(43).await;
    assert_ne!(first, other, "another seed draws other faults");
}

#[tokio::test]
async fn invalid_faults_are_refused_at_start() {
    let faults = Faults::none().with_status_inconclusive(2.0);
    let refused = Upstream::start(ANY_PORT, faults, SEED)
        .await
        .expect_err("a rate above 1 is refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidInput);
    assert!(
        refused.to_string().contains("status_inconclusive"),
        "{refused}"
    );
}

#[tokio::test]
async fn shutdown_stops_listening_even_with_a_response_on_hold() {
    let upstream = start(bank_only(FaultKind::CommitThenTimeout)).await;
    let addr = upstream.local_addr();
    let handle = upstream.handle();
    let held = tokio::spawn({
        let base = upstream.base_url();
        async move {
            client()
                .post(format!("{base}/bank/wires"))
                .json(&wire("acct-1", 5000))
                .send()
                .await
        }
    });
    // Wait until the held request has committed, so shutdown meets it in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    while handle.stats().wires == 0 {
        assert!(Instant::now() < deadline, "the held request never arrived");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    upstream.shutdown().await;
    assert!(
        started.elapsed() < sluice_upstream::SHUTDOWN_GRACE + Duration::from_secs(1),
        "shutdown does not wait out the 15 s hold"
    );
    let outcome = held.await.expect("the client task does not panic");
    assert!(
        outcome.is_err(),
        "the held request gets no response: {outcome:?}"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "nothing listens on {addr} after shutdown"
    );
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        chain.push_str(": ");
        chain.push_str(&cause.to_string());
        source = cause.source();
    }
    chain
}
