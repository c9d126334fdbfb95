//! TLS to the CQL cluster (`[ledger.cql.tls]`): the nodes' certificates are checked against a
//! CA file (or the system's roots), a client certificate is presented when one is configured,
//! and the settings are checked once, naming the key that is wrong. Built on rustls, so no
//! system TLS library is needed.
//!
//! The driver connects to each node by its address and checks the node's certificate against
//! that IP address. A cluster whose certificates name a host instead (Scylla Cloud, most
//! managed offers) sets `server_name`; `verify_hostname = false` checks only that a trusted CA
//! signed the certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde::{Deserialize, Serialize};

use crate::CqlError;

/// `[ledger.cql.tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CqlTls {
    /// Encrypt every connection to the cluster.
    pub enabled: bool,
    /// PEM file of the CA certificates the nodes' certificates chain to; unset: the system's
    /// trusted roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM), for a cluster that requires one
    /// (`require_client_auth`); `key_file` holds its private key (PEM, unencrypted PKCS#8,
    /// PKCS#1 or SEC1).
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name the nodes' certificates must carry; unset: each node's IP address.
    pub server_name: Option<String>,
    /// Check the certificate's name (or address) at all. `false` still refuses a certificate
    /// no trusted CA signed; it only accepts one issued for another name.
    pub verify_hostname: bool,
}

impl Default for CqlTls {
    fn default() -> Self {
        Self {
            enabled: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
            verify_hostname: true,
        }
    }
}

fn bad(key: &'static str, why: impl Into<String>) -> CqlError {
    CqlError::Config {
        key,
        why: why.into(),
    }
}

/// A configured file must be there when the service starts, not at its first connection.
fn readable(key: &'static str, path: &Path) -> Result<(), CqlError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| bad(key, format!("cannot read {}: {e}", path.display())))
}

impl CqlTls {
    /// Checks the settings and that every file named can be read.
    pub fn validate(&self) -> Result<(), CqlError> {
        if !self.enabled {
            let set = [
                ("tls.ca_file", self.ca_file.is_some()),
                ("tls.cert_file", self.cert_file.is_some()),
                ("tls.key_file", self.key_file.is_some()),
                ("tls.server_name", self.server_name.is_some()),
            ];
            if let Some((key, _)) = set.iter().find(|(_, set)| *set) {
                return Err(bad(
                    key,
                    "is set while tls.enabled is false: set tls.enabled = true to use TLS",
                ));
            }
            return Ok(());
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(bad("tls.key_file", "a client certificate needs its key"));
            }
            (None, Some(_)) => {
                return Err(bad("tls.cert_file", "a client key needs its certificate"));
            }
            _ => {}
        }
        for (key, path) in [
            ("tls.ca_file", &self.ca_file),
            ("tls.cert_file", &self.cert_file),
            ("tls.key_file", &self.key_file),
        ] {
            if let Some(path) = path {
                readable(key, path)?;
            }
        }
        if let Some(name) = &self.server_name
            && ServerName::try_from(name.as_str()).is_err()
        {
            return Err(bad(
                "tls.server_name",
                format!("{name:?} is not a DNS name or an IP address"),
            ));
        }
        Ok(())
    }

    /// The rustls client configuration the driver's connections use; `None` when TLS is off.
    pub fn client_config(&self) -> Result<Option<Arc<rustls::ClientConfig>>, CqlError> {
        if !self.enabled {
            return Ok(None);
        }
        self.validate()?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let roots = Arc::new(self.roots()?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|e| bad("tls.ca_file", format!("cannot build a verifier: {e}")))?;
        let name = match &self.server_name {
            Some(name) => Expected::Name(
                ServerName::try_from(name.clone())
                    .map_err(|_| bad("tls.server_name", format!("{name:?} is not a name")))?,
            ),
            None if self.verify_hostname => Expected::NodeAddress,
            None => Expected::AnyName,
        };
        let verifier = Arc::new(Verifier {
            webpki,
            name,
            provider: Arc::clone(&provider),
        });
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("tls", format!("no TLS version available: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                let chain = load_chain("tls.cert_file", cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                    bad(
                        "tls.key_file",
                        format!("{} holds no usable PEM private key: {e}", key.display()),
                    )
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    bad(
                        "tls.key_file",
                        format!("does not match the client certificate: {e}"),
                    )
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        Ok(Some(Arc::new(config)))
    }

    fn roots(&self) -> Result<RootCertStore, CqlError> {
        let mut roots = RootCertStore::empty();
        match &self.ca_file {
            Some(path) => {
                for cert in load_chain("tls.ca_file", path)? {
                    roots.add(cert).map_err(|e| {
                        bad(
                            "tls.ca_file",
                            format!("{}: not a CA certificate: {e}", path.display()),
                        )
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(bad(
                        "tls.ca_file",
                        "is unset and the system has no trusted roots: name the cluster's CA file",
                    ));
                }
            }
        }
        Ok(roots)
    }
}

/// Every certificate in a PEM file; an empty file is an error.
fn load_chain(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, CqlError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| {
            bad(
                key,
                format!("{}: not PEM certificates: {e}", path.display()),
            )
        })?;
    if certs.is_empty() {
        return Err(bad(key, format!("{} holds no certificate", path.display())));
    }
    Ok(certs)
}

/// Which name a node's certificate must carry.
#[derive(Debug)]
enum Expected {
    /// The address the driver connected to (its default).
    NodeAddress,
    /// One configured name for every node.
    Name(ServerName<'static>),
    /// Any: only the chain to a trusted CA is checked.
    AnyName,
}

/// rustls's WebPKI verifier with the name the configuration asks for.
#[derive(Debug)]
struct Verifier {
    webpki: Arc<WebPkiServerVerifier>,
    name: Expected,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = match &self.name {
            Expected::Name(name) => name,
            Expected::NodeAddress | Expected::AnyName => server_name,
        };
        let verified =
            self.webpki
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now);
        match verified {
            // The chain is checked before the name: a name error means the chain is trusted.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if matches!(self.name, Expected::AnyName) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(tls: &CqlTls) -> &'static str {
        match tls.validate() {
            Err(CqlError::Config { key, .. }) => key,
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    #[test]
    fn inconsistent_settings_name_their_key() {
        let off_with_ca = CqlTls {
            ca_file: Some("/nowhere/ca.pem".into()),
            ..CqlTls::default()
        };
        assert_eq!(key_of(&off_with_ca), "tls.ca_file");
        let on = |tls: CqlTls| CqlTls {
            enabled: true,
            ..tls
        };
        let missing = on(CqlTls {
            ca_file: Some("/nowhere/ca.pem".into()),
            ..CqlTls::default()
        });
        assert_eq!(key_of(&missing), "tls.ca_file");
        let half = on(CqlTls {
            cert_file: Some("/nowhere/c.pem".into()),
            ..CqlTls::default()
        });
        assert_eq!(key_of(&half), "tls.key_file");
        let bad_name = on(CqlTls {
            server_name: Some("not a name".into()),
            ..CqlTls::default()
        });
        assert_eq!(key_of(&bad_name), "tls.server_name");
        CqlTls::default().validate().expect("off is valid");
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("sluice-cql-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").expect("write");
        let tls = CqlTls {
            enabled: true,
            ca_file: Some(junk),
            ..CqlTls::default()
        };
        let err = tls.client_config().expect_err("no certificate in it");
        assert!(err.to_string().contains("tls.ca_file"), "{err}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
