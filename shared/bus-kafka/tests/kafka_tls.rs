//! The Kafka bus over SASL_SSL against the real broker of `scripts/engines`: its SASL_SSL
//! listener (`SLUICE_TEST_KAFKA_SASL_BROKERS`, default `127.0.0.1:19094`) presents a
//! certificate of the test CA in `SLUICE_TEST_TLS_DIR` and knows one PLAIN and one
//! SCRAM-SHA-512 user (`SLUICE_TEST_KAFKA_{PLAIN,SCRAM}_{USER,PASSWORD}`, defaults in
//! `scripts/engines/env.sh`).
//!
//! A round trip (publish, consume, acknowledge) works with each mechanism and the right
//! password; a wrong password, or a CA that did not sign the broker's certificate, fails
//! `connect` with an error that says why. Compiled out with `SLUICE_SKIP_KAFKA=1` or
//! `SLUICE_ENGINES_TLS=0` (see `build.rs`).

#![cfg(not(any(sluice_skip_kafka, sluice_skip_kafka_tls)))]

use std::path::PathBuf;
use std::time::Duration;

use sluice_bus::contract::{fresh_group, fresh_prefix, next_within};
use sluice_bus::{Bus, BusError, Topic};
use sluice_bus_kafka::{
    KafkaBus, KafkaConfig, KafkaSasl, KafkaSecurity, KafkaTls, SaslMechanism, SecurityProtocol,
};
use sluice_core::Secret;

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// The test CA's directory: what `scripts/engines/start.sh` made.
fn pki() -> PathBuf {
    std::env::var("SLUICE_TEST_TLS_DIR").map_or_else(
        |_| {
            let home = std::env::var("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/sluice/engines/run/pki")
        },
        PathBuf::from,
    )
}

fn security(mechanism: SaslMechanism, password: &str, ca_file: PathBuf) -> KafkaSecurity {
    let user = match mechanism {
        SaslMechanism::Plain => var("SLUICE_TEST_KAFKA_PLAIN_USER", "sluiceplain"),
        _ => var("SLUICE_TEST_KAFKA_SCRAM_USER", "sluicescram"),
    };
    KafkaSecurity {
        protocol: SecurityProtocol::SaslSsl,
        sasl: Some(KafkaSasl {
            mechanism,
            username: user,
            password: Secret::new(password),
        }),
        tls: KafkaTls {
            ca_file: Some(ca_file),
            ..KafkaTls::default()
        },
        oauthbearer: None,
    }
}

fn config(security: KafkaSecurity, start_timeout: Duration) -> KafkaConfig {
    KafkaConfig {
        brokers: var("SLUICE_TEST_KAFKA_SASL_BROKERS", "127.0.0.1:19094"),
        prefix: fresh_prefix(),
        partitions: 2,
        replication_factor: Some(1),
        client_id: "sluice-test-tls".to_owned(),
        start_timeout,
        security,
        extra: [
            ("session.timeout.ms", "6000"),
            ("heartbeat.interval.ms", "500"),
            ("fetch.wait.max.ms", "100"),
            ("linger.ms", "1"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into(),
        ..KafkaConfig::default()
    }
}

async fn round_trip(mechanism: SaslMechanism, password: &str) {
    let ca = pki().join("ca.pem");
    assert!(
        ca.exists(),
        "{} is missing: start the engines with `scripts/engines/start.sh kafka` (it makes the \
         test CA), or set SLUICE_ENGINES_TLS=0 to skip these tests",
        ca.display()
    );
    let bus = KafkaBus::connect(config(
        security(mechanism, password, ca),
        Duration::from_secs(30),
    ))
    .await
    .unwrap_or_else(|e| panic!("SASL_SSL with {mechanism:?}: {:#}", anyhow::Error::from(e)));
    let mut sub = bus
        .subscribe(Topic::Requested, &fresh_group("tls"), "m-1")
        .await
        .expect("subscribe over SASL_SSL");
    let payload = format!("over SASL_SSL with {mechanism:?}").into_bytes();
    bus.publish(
        Topic::Requested,
        "r-tls",
        payload.clone(),
        vec![("h".to_owned(), b"v".to_vec())],
    )
    .await
    .expect("publish over SASL_SSL");
    let got = next_within(&mut sub, "the message published over SASL_SSL").await;
    assert_eq!(got.payload(), payload.as_slice());
    assert_eq!(got.key(), "r-tls");
    got.ack().await.expect("ack over SASL_SSL");
    drop(sub);
    bus.delete_topics().await.expect("delete the test topics");
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_over_sasl_ssl_with_scram_sha_512() {
    let password = var("SLUICE_TEST_KAFKA_SCRAM_PASSWORD", "scram-test-password");
    round_trip(SaslMechanism::ScramSha512, &password).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_trip_over_sasl_ssl_with_plain() {
    let password = var("SLUICE_TEST_KAFKA_PLAIN_PASSWORD", "plain-test-password");
    round_trip(SaslMechanism::Plain, &password).await;
}

/// The error of a `connect` that must fail, as one line with its causes.
async fn refused(config: KafkaConfig) -> String {
    match KafkaBus::connect(config).await {
        Ok(bus) => {
            bus.close().await;
            panic!("connected although it should have been refused");
        }
        Err(e @ BusError::Backend { .. }) => format!("{:#}", anyhow::Error::from(e)),
        Err(other) => panic!("expected a connect error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_and_said_so() {
    for mechanism in [SaslMechanism::ScramSha512, SaslMechanism::Plain] {
        let err = refused(config(
            security(mechanism, "not-the-password", pki().join("ca.pem")),
            Duration::from_secs(8),
        ))
        .await;
        assert!(
            err.to_ascii_lowercase().contains("authentication"),
            "{mechanism:?}: the error says authentication failed: {err}"
        );
        assert!(
            !err.contains("not-the-password"),
            "the password is not in the error: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_an_untrusted_ca_is_refused() {
    // The client certificate is not a CA: nothing the broker presents chains to it.
    let err = refused(config(
        security(
            SaslMechanism::ScramSha512,
            &var("SLUICE_TEST_KAFKA_SCRAM_PASSWORD", "scram-test-password"),
            pki().join("client.pem"),
        ),
        Duration::from_secs(8),
    ))
    .await;
    assert!(
        err.to_ascii_lowercase().contains("certificate"),
        "the error names the certificate problem: {err}"
    );
}
