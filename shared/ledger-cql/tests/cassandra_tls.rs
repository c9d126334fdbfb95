//! The CQL ledger over TLS with a password, against the second Cassandra node of
//! `scripts/engines` (`start.sh cassandra-tls`, `SLUICE_TEST_CQL_TLS_NODES`, default
//! `127.0.0.1:19142`): the node takes TLS only, requires a client certificate of the test CA
//! (`SLUICE_TEST_TLS_DIR`) and runs PasswordAuthenticator with the test role
//! (`SLUICE_TEST_CQL_USER`/`SLUICE_TEST_CQL_PASSWORD`, defaults in `scripts/engines/env.sh`).
//!
//! With the CA, the client certificate and the right password the ledger migrates its schema
//! and writes and reads a command; a wrong password, a missing client certificate or an
//! untrusted CA each fail to connect. `SLUICE_SKIP_CQL=1` or `SLUICE_ENGINES_TLS=0` skip the
//! file (the node is not started then).

use std::io::Write;
use std::path::PathBuf;

use serde_json::json;
use sluice_core::Secret;
use sluice_ledger::CommandStore;
use sluice_ledger::contract::{command, fresh_run};
use sluice_ledger_cql::{CqlConfig, CqlLedger, CqlTls, Replication, connect_session};

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn skip_if_asked() {
    let skip = std::env::var("SLUICE_SKIP_CQL").is_ok_and(|v| v == "1")
        || std::env::var("SLUICE_ENGINES_TLS").is_ok_and(|v| v == "0");
    if skip {
        let _ = writeln!(
            std::io::stderr(),
            "SLUICE_SKIP_CQL=1 or SLUICE_ENGINES_TLS=0: the CQL TLS tests are skipped"
        );
        std::process::exit(0);
    }
}

fn pki() -> PathBuf {
    std::env::var("SLUICE_TEST_TLS_DIR").map_or_else(
        |_| {
            let home = std::env::var("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/sluice/engines/run/pki")
        },
        PathBuf::from,
    )
}

/// What a Sluice service on this node is configured with.
fn secure(keyspace: &str) -> CqlConfig {
    let pki = pki();
    assert!(
        pki.join("ca.pem").exists(),
        "{} has no test CA: start the node with `scripts/engines/start.sh cassandra-tls`, or \
         set SLUICE_ENGINES_TLS=0 to skip these tests",
        pki.display()
    );
    CqlConfig {
        nodes: vec![var("SLUICE_TEST_CQL_TLS_NODES", "127.0.0.1:19142")],
        username: Some(var("SLUICE_TEST_CQL_USER", "sluice")),
        password: Some(Secret::new(var(
            "SLUICE_TEST_CQL_PASSWORD",
            "cql-test-password",
        ))),
        tls: CqlTls {
            enabled: true,
            ca_file: Some(pki.join("ca.pem")),
            cert_file: Some(pki.join("client.pem")),
            key_file: Some(pki.join("client.key")),
            ..CqlTls::default()
        },
        keyspace: keyspace.to_owned(),
        replication: Replication::Simple {
            replication_factor: 1,
        },
        connect_timeout_ms: 5_000,
        ..CqlConfig::default()
    }
}

fn keyspace() -> String {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    format!("sluice_tls_{}", &unique[..12])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_works_over_tls_with_a_password() {
    skip_if_asked();
    let keyspace = keyspace();
    let config = secure(&keyspace);
    let ledger = CqlLedger::connect(config.clone())
        .await
        .unwrap_or_else(|e| panic!("TLS and a password: {:#}", anyhow::Error::from(e)));
    let run = fresh_run("tls");
    let wanted = command(&run, 0, "bank/wire", 0, json!({"amount": 7}));
    let audit = wanted.reservation_audit("tls-test");
    let reserved = ledger
        .reserve(wanted.clone(), audit)
        .await
        .expect("reserve over TLS")
        .into_command();
    let read = ledger
        .get(&run, &wanted.command_key)
        .await
        .expect("read over TLS")
        .expect("the command is there");
    assert_eq!(read, reserved);
    assert_eq!(read.args.as_ref(), &json!({"amount": 7}));
    sluice_ledger_cql::drop_keyspace(ledger.session(), &keyspace)
        .await
        .expect("drop the test keyspace");
}

/// The error of a connection that must fail, with its causes.
async fn refused(config: CqlConfig) -> String {
    match connect_session(&config).await {
        Ok(_) => panic!("connected although it should have been refused"),
        Err(e) => format!("{:#}", anyhow::Error::from(e)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused() {
    skip_if_asked();
    let err = refused(CqlConfig {
        password: Some(Secret::new("not-the-password")),
        ..secure("sluice")
    })
    .await;
    assert!(
        err.to_ascii_lowercase().contains("authentication")
            || err.to_ascii_lowercase().contains("credentials"),
        "the error says the login failed: {err}"
    );
    assert!(!err.contains("not-the-password"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_client_certificate_or_with_another_ca_nothing_connects() {
    skip_if_asked();
    let base = secure("sluice");
    let no_client_cert = CqlConfig {
        tls: CqlTls {
            cert_file: None,
            key_file: None,
            ..base.tls.clone()
        },
        ..base.clone()
    };
    refused(no_client_cert).await;
    // The client certificate is no CA: the node's certificate does not chain to it.
    let other_ca = CqlConfig {
        tls: CqlTls {
            ca_file: Some(pki().join("client.pem")),
            ..base.tls.clone()
        },
        ..base.clone()
    };
    let err = refused(other_ca).await;
    assert!(
        err.to_ascii_lowercase().contains("certificate")
            || err.to_ascii_lowercase().contains("issuer"),
        "the error names the certificate problem: {err}"
    );
    // Plain text to a TLS-only port.
    let plaintext = CqlConfig {
        tls: CqlTls::default(),
        ..base
    };
    refused(plaintext).await;
}
