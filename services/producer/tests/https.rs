//! The API over HTTPS with a real rustls client (reqwest trusting only the test's CA): the
//! producer answers with the configured certificate; a broken replacement is logged, without
//! key material, and the old certificate stays; once the files hold a good new pair, a new
//! connection is handed the new certificate. A pair that does not load keeps the producer from
//! starting.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use sluice_assemble::{assemble, load_catalog};
use sluice_runtime::config::ServerTls;
use sluice_runtime::{Config, Shutdown};

/// The test's CA, and leaf certificates for 127.0.0.1 signed by it.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "Sluice HTTPS test CA");
        let key = KeyPair::generate().expect("a CA key");
        let cert = params.self_signed(&key).expect("the CA certificate");
        Self {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for 127.0.0.1 and localhost: (certificate PEM, its DER, key PEM).
    fn leaf(&self, name: &str) -> (String, Vec<u8>, String) {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a leaf certificate");
        (cert.pem(), cert.der().to_vec(), key.serialize_pem())
    }
}

/// Replaces a file at once (rename), as a Kubernetes Secret update does.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The certificate a new connection is handed, and the answer to `/healthz` on it.
async fn presented(ca_pem: &str, base: &str) -> Result<Vec<u8>, String> {
    // A client per look: a new connection, a new handshake.
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).expect("CA pem")])
        .tls_info(true)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client");
    let response = client
        .get(format!("{base}/healthz"))
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let cert = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate().map(<[u8]>::to_vec))
        .ok_or("no TLS info")?;
    Ok(cert)
}

/// The log, kept for the assertions on what the reload reported.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
    }
}

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_the_certificate_and_a_new_connection_gets_the_reloaded_one() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();

    let dir = tempfile::tempdir().expect("a directory");
    let ca = Ca::new();
    let (first_pem, first_der, first_key) = ca.leaf("first");
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    replace(&cert_file, &first_pem);
    replace(&key_file, &first_key);

    let mut config = Config::default();
    config.ledger.data_dir = dir.path().join("ledger");
    config.producer.open = true;
    config.producer.tls = Some(ServerTls {
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        reload_interval_ms: 100,
    });
    config.validate().expect("a valid configuration");
    let ctx = assemble(&config, load_catalog(&config.catalog).expect("catalog"))
        .await
        .expect("a context");

    // A pair that does not load: the producer does not start.
    let mut broken = config.clone();
    let wrong_key = dir.path().join("wrong.key");
    std::fs::write(&wrong_key, ca.leaf("other").2).expect("write");
    broken.producer.tls = Some(ServerTls {
        key_file: wrong_key,
        ..config.producer.tls.clone().expect("tls")
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let refused = sluice_producer::serve(ctx.clone(), &broken, listener, Shutdown::new())
        .await
        .expect_err("a key that is not the certificate's");
    assert!(refused.to_string().contains("producer.tls"), "{refused}");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let base = format!("https://{}", listener.local_addr().expect("an address"));
    let shutdown = Shutdown::new();
    let served = tokio::spawn({
        let (ctx, config, shutdown) = (ctx.clone(), config.clone(), shutdown.clone());
        async move { sluice_producer::serve(ctx, &config, listener, shutdown).await }
    });

    let mut first_seen = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(cert) = presented(&ca.pem, &base).await {
            first_seen = Some(cert);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        first_seen.as_deref(),
        Some(first_der.as_slice()),
        "the configured certificate"
    );
    let plain = reqwest::get(format!("http://{}/healthz", &base["https://".len()..])).await;
    assert!(
        plain.map_or(true, |r| !r.status().is_success()),
        "plain HTTP is not served"
    );

    // A broken certificate: logged, the first one stays.
    replace(
        &cert_file,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log.text().contains("cannot be used") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = log.text();
    assert!(
        text.contains("cannot be used"),
        "the failed reload is logged: {text}"
    );
    assert!(text.contains("tls.crt"), "the log names the file: {text}");
    let key_body = first_key.lines().nth(1).expect("a key line");
    assert!(
        !text.contains(key_body) && !text.contains("PRIVATE KEY"),
        "no key material: {text}"
    );
    assert_eq!(
        presented(&ca.pem, &base).await.expect("still served"),
        first_der,
        "the old certificate stays in use"
    );

    // A good new pair: a new connection gets it.
    let (second_pem, second_der, second_key) = ca.leaf("second");
    replace(&key_file, &second_key);
    replace(&cert_file, &second_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now_seen = presented(&ca.pem, &base).await;
    while now_seen.as_deref() != Ok(second_der.as_slice()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        now_seen = presented(&ca.pem, &base).await;
    }
    assert_eq!(
        now_seen.as_deref(),
        Ok(second_der.as_slice()),
        "a new connection sees the new certificate"
    );
    assert!(log.text().contains("reloaded"), "{}", log.text());

    shutdown.cancel();
    served
        .await
        .expect("the server task")
        .expect("the server stopped cleanly");
}
