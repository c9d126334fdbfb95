//! SASL/OAUTHBEARER with OIDC client credentials against a real broker: the OAUTHBEARER
//! listener of `scripts/engines/kafka-secure.sh` (127.0.0.1:29094, Kafka's
//! `OAuthBearerValidatorCallbackHandler` checking RS256 signatures against the JWKS the script
//! wrote, audience `sluice-kafka`, an authorizer), started through the script when it is not
//! running. The token endpoint is this test's own, on loopback: it checks the client's id and
//! secret (HTTP Basic, as librdkafka sends them) and issues a JWT signed with the script's key.
//! librdkafka fetches the token itself (`sasl.oauthbearer.method = oidc`).
//!
//! `SLUICE_SKIP_KAFKA=1` compiles this out (see `build.rs`).

#![cfg(not(sluice_skip_kafka))]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use sluice_bus::contract::{fresh_group, fresh_prefix, next_within};
use sluice_bus::{Bus, BusError, Topic};
use sluice_bus_kafka::{KafkaBus, KafkaConfig, KafkaOauth, KafkaSecurity, SecurityProtocol};
use sluice_core::secret::Secret;

/// The principal the broker sees: the token's `sub`.
const PRINCIPAL: &str = "sluice-oauth-test";
const CLIENT_ID: &str = "sluice-bus";
const CLIENT_SECRET: &str = "oidc-client-secret";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("shared/bus-kafka lives two levels down")
        .to_owned()
}

fn script(args: &[&str]) -> String {
    let out = std::process::Command::new(repo().join("scripts/engines/kafka-secure.sh"))
        .args(args)
        .output()
        .expect("scripts/engines/kafka-secure.sh runs");
    assert!(
        out.status.success(),
        "kafka-secure.sh {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts the authorizing broker if needed; its run dir (the issuer's key).
fn secure_broker() -> PathBuf {
    let printed = script(&["start"]);
    printed
        .lines()
        .find_map(|line| line.strip_prefix("export SLUICE_KAFKA_SECURE_RUN="))
        .map(PathBuf::from)
        .expect("the script prints its run dir")
}

#[derive(Clone)]
struct Issuer {
    key: Arc<jsonwebtoken::EncodingKey>,
    /// Token requests with the right credentials, and with wrong ones.
    granted: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

async fn token(
    State(issuer): State<Issuer>,
    headers: HeaderMap,
) -> (StatusCode, Json<serde_json::Value>) {
    use base64::Engine as _;
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"))
    );
    let given = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if given != expected {
        issuer.refused.fetch_add(1, Ordering::SeqCst);
        return (
            StatusCode::UNAUTHORIZED,
            Json(serde_json::json!({ "error": "invalid_client" })),
        );
    }
    issuer.granted.fetch_add(1, Ordering::SeqCst);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let claims = serde_json::json!({
        "sub": PRINCIPAL,
        "aud": "sluice-kafka",
        "iss": "sluice-test-idp",
        "iat": now,
        "exp": now + 3_600,
        "scope": "kafka",
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
    header.kid = Some("sluice-test".to_owned());
    let jwt = jsonwebtoken::encode(&header, &claims, &issuer.key).expect("a signed token");
    let body = serde_json::json!({
        "access_token": jwt,
        "token_type": "Bearer",
        "expires_in": 3_600,
    });
    (StatusCode::OK, Json(body))
}

/// The token endpoint on a free loopback port: its URL and its counters.
async fn start_issuer(run: &Path) -> (String, Issuer) {
    let pem = std::fs::read(run.join("oauth/key.pem")).expect("the script's issuer key");
    let issuer = Issuer {
        key: Arc::new(jsonwebtoken::EncodingKey::from_rsa_pem(&pem).expect("an RSA key")),
        granted: Arc::default(),
        refused: Arc::default(),
    };
    let app = axum::Router::new()
        .route("/token", post(token))
        .with_state(issuer.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!(
        "http://{}/token",
        listener.local_addr().expect("its address")
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, issuer)
}

fn config(prefix: String, url: &str, secret: &str) -> KafkaConfig {
    KafkaConfig {
        brokers: std::env::var("SLUICE_TEST_KAFKA_SECURE_OAUTH_BROKERS")
            .unwrap_or_else(|_| "127.0.0.1:29094".to_owned()),
        prefix,
        partitions: 1,
        replication_factor: Some(1),
        client_id: "sluice-test-oauth".to_owned(),
        start_timeout: Duration::from_secs(20),
        security: KafkaSecurity {
            protocol: SecurityProtocol::SaslPlaintext,
            oauthbearer: Some(KafkaOauth {
                token_endpoint_url: url.to_owned(),
                client_id: CLIENT_ID.to_owned(),
                client_secret: Secret::new(secret),
                scope: Some("kafka".to_owned()),
                extensions: BTreeMap::new(),
            }),
            ..KafkaSecurity::default()
        },
        extra: BTreeMap::from([("session.timeout.ms".to_owned(), "6000".to_owned())]),
        ..KafkaConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oidc_client_credentials_authenticate_and_a_wrong_secret_is_refused() {
    let run = tokio::task::spawn_blocking(secure_broker)
        .await
        .expect("the start task");
    let (url, issuer) = start_issuer(&run).await;
    let prefix = fresh_prefix();
    let group = fresh_group("oauth");
    for args in [
        vec![
            // Delete: the test removes its topics at the end.
            "--operation",
            "Create",
            "--operation",
            "Write",
            "--operation",
            "Read",
            "--operation",
            "Describe",
            "--operation",
            "Delete",
            "--topic",
            prefix.as_str(),
            "--resource-pattern-type",
            "prefixed",
        ],
        vec!["--operation", "Read", "--group", group.as_str()],
    ] {
        let principal = format!("User:{PRINCIPAL}");
        let mut all = vec![
            "acl",
            "--add",
            "--force",
            "--allow-principal",
            principal.as_str(),
        ];
        all.extend(args);
        tokio::task::spawn_blocking({
            let all: Vec<String> = all.iter().map(|s| (*s).to_owned()).collect();
            move || script(&all.iter().map(String::as_str).collect::<Vec<_>>())
        })
        .await
        .expect("the acl task");
    }

    let bus = KafkaBus::connect(config(prefix.clone(), &url, CLIENT_SECRET))
        .await
        .unwrap_or_else(|e| {
            panic!(
                "OAUTHBEARER with OIDC connects: {:#}",
                anyhow::Error::from(e)
            )
        });
    let mut sub = bus
        .subscribe(Topic::Events, &group, "m1")
        .await
        .expect("subscribe as the token's principal");
    bus.publish(Topic::Events, "r-oauth", b"over oauth".to_vec(), Vec::new())
        .await
        .expect("publish as the token's principal");
    let got = next_within(&mut sub, "the message published over OAUTHBEARER").await;
    assert_eq!(got.payload(), b"over oauth");
    got.ack().await.expect("ack");
    assert!(
        issuer.granted.load(Ordering::SeqCst) >= 1,
        "librdkafka fetched its token from the endpoint"
    );
    bus.delete_topics().await.expect("delete the test's topics");
    bus.close().await;

    let refused_before = issuer.refused.load(Ordering::SeqCst);
    match KafkaBus::connect(KafkaConfig {
        start_timeout: Duration::from_secs(8),
        ..config(fresh_prefix(), &url, "not-the-secret")
    })
    .await
    {
        Err(BusError::Backend { op: "connect", .. }) => {}
        other => panic!("a wrong client secret must not connect: {other:?}"),
    }
    assert!(
        issuer.refused.load(Ordering::SeqCst) > refused_before,
        "the endpoint was asked with the wrong secret"
    );
}
