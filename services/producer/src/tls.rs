//! HTTPS for the API (`[producer.tls]`): rustls, the certificate chain and key read from PEM
//! files, and read again when either file changes.
//!
//! * **Reload.** A task looks at both files' modification times and sizes every
//!   `reload_interval_ms`. When they changed, it loads the pair; new connections get the new
//!   certificate, connections already open keep theirs. A pair that does not load (half
//!   written, key and certificate not matching, not PEM) is logged with the reason and the
//!   paths — never the key material — and the old pair stays in use; it is tried again at the
//!   files' next change.
//! * **Handshakes off the accept loop.** Each TCP connection's handshake runs in a task of its
//!   own, bounded in time and in number, so a client that opens a connection and sends nothing
//!   holds no one else up.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sluice_runtime::Shutdown;
use sluice_runtime::config::ServerTls;
use thiserror::Error;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once; further connections wait to be accepted.
const MAX_HANDSHAKES: usize = 256;

/// A certificate pair that cannot be used. The message names the file and what is wrong with
/// it, never its content.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("the TLS configuration cannot be built: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Reads the chain and the key and checks that they belong together.
pub fn load_pair(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, TlsError> {
    let invalid = |path: &Path, why: String| TlsError::Invalid {
        path: path.to_owned(),
        why,
    };
    let cert_pem = std::fs::read(cert_file).map_err(|source| TlsError::Read {
        path: cert_file.to_owned(),
        source,
    })?;
    let key_pem = std::fs::read(key_file).map_err(|source| TlsError::Read {
        path: key_file.to_owned(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(cert_file, format!("not a PEM certificate chain ({e})")))?;
    if chain.is_empty() {
        return Err(invalid(cert_file, "holds no certificate".into()));
    }
    // The parser's error names the PEM section it expected, not the bytes it read.
    let key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| invalid(key_file, format!("holds no usable PEM private key ({e})")))?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
        invalid(
            key_file,
            format!(
                "does not go with the certificate in {} ({e})",
                cert_file.display()
            ),
        )
    })
}

/// The certificate handed to each new handshake; swapped by the reload task.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self.0.read().unwrap_or_else(PoisonError::into_inner),
        ))
    }
}

/// What a file looks like from outside: a change in either means "load again".
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// A TCP listener that hands out connections once their TLS handshake is done.
#[derive(Debug)]
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Loads the pair (failing if it does not load: a producer does not start without its
    /// certificate), then accepts on `tcp` and reloads until `shutdown`.
    pub fn start(tcp: TcpListener, tls: &ServerTls, shutdown: Shutdown) -> Result<Self, TlsError> {
        let local = tcp.local_addr().map_err(|source| TlsError::Read {
            path: PathBuf::from("<listener>"),
            source,
        })?;
        let first = load_pair(&tls.cert_file, &tls.key_file)?;
        let current = Arc::new(Current(RwLock::new(Arc::new(first))));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&current) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, acceptor, tx, shutdown.clone()));
        if tls.reload_interval_ms > 0 {
            tokio::spawn(reload_loop(
                tls.clone(),
                current,
                Duration::from_millis(tls.reload_interval_ms),
                shutdown,
            ));
        }
        Ok(Self { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ended (shutdown): nothing will come; graceful shutdown ends the
            // server meanwhile.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    shutdown: Shutdown,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            accepted = tcp.accept() => accepted,
            () = shutdown.cancelled() => return,
            () = ready.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

async fn reload_loop(tls: ServerTls, current: Arc<Current>, every: Duration, shutdown: Shutdown) {
    let stamps = || (stamp(&tls.cert_file), stamp(&tls.key_file));
    // What the files looked like when last loaded or last found unusable: a bad pair is
    // reported once, and tried again only once a file changes again.
    let mut seen = stamps();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let now = stamps();
        if now == seen {
            continue;
        }
        seen = now;
        match load_pair(&tls.cert_file, &tls.key_file) {
            Ok(pair) => {
                *current.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(pair);
                tracing::info!(
                    cert_file = %tls.cert_file.display(),
                    "the API's TLS certificate was reloaded; new connections use it"
                );
            }
            Err(e) => tracing::warn!(
                error = %e,
                "the API's new TLS certificate or key cannot be used; the previous pair stays \
                 in use until the files change again"
            ),
        }
    }
}
