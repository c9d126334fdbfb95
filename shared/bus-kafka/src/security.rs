//! How the bus's clients authenticate to Kafka and encrypt their connections
//! ([`KafkaSecurity`]): librdkafka's `security.protocol`, SASL (PLAIN, SCRAM-SHA-256,
//! SCRAM-SHA-512, or OAUTHBEARER with OIDC client credentials) and TLS (a CA file or the
//! system's roots, an optional client certificate), validated once with the key that is wrong
//! named, and turned into librdkafka properties.
//!
//! librdkafka is built with a vendored, statically linked OpenSSL (the `ssl-vendored` feature):
//! with no `ca_file` it probes the usual system CA bundle paths itself. Passwords are
//! [`Secret`]s: the configuration's `Debug` never shows them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[cfg(feature = "librdkafka")]
use rdkafka::ClientConfig;
use serde::{Deserialize, Serialize};
use sluice_bus::BusError;
use sluice_core::secret::Secret;

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    /// No TLS, no authentication: a broker on a network you trust.
    #[default]
    Plaintext,
    /// TLS, no SASL (a client certificate may authenticate).
    Ssl,
    /// SASL without TLS: the password of PLAIN crosses the network in the clear.
    SaslPlaintext,
    /// SASL over TLS: what MSK, Confluent Cloud and Aiven offer.
    SaslSsl,
}

impl SecurityProtocol {
    fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }

    fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }
}

/// A SASL mechanism librdkafka has without Kerberos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SaslMechanism {
    Plain,
    #[serde(rename = "scram_sha_256")]
    ScramSha256,
    #[serde(rename = "scram_sha_512")]
    ScramSha512,
}

impl SaslMechanism {
    #[cfg(feature = "librdkafka")]
    fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// `[bus.kafka.sasl]`: one user's credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSasl {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: Secret,
}

/// `[bus.kafka.oauthbearer]`: SASL/OAUTHBEARER with OIDC client credentials (what Confluent
/// Cloud, Aiven, Redpanda and Strimzi with Keycloak use). librdkafka asks the token endpoint
/// for a token with the client's id and secret (`grant_type=client_credentials`), sends it to
/// the brokers, and fetches a new one before it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaOauth {
    /// The identity provider's token endpoint, e.g.
    /// `https://idp.example.com/realms/kafka/protocol/openid-connect/token`.
    pub token_endpoint_url: String,
    pub client_id: String,
    /// Given by reference in the configuration (`{ file = … }`, `{ env = … }`).
    pub client_secret: Secret,
    /// Scopes asked for, separated by spaces; unset: the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// SASL extensions sent with the token (Confluent Cloud's `logicalCluster` and
    /// `identityPoolId`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extensions: BTreeMap<String, String>,
}

impl KafkaOauth {
    fn validate(&self) -> Result<(), BusError> {
        let url = &self.token_endpoint_url;
        if !(url.starts_with("https://") || url.starts_with("http://"))
            || url.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(invalid(
                "oauthbearer.token_endpoint_url",
                format!("{url:?} must be the identity provider's https:// token endpoint URL"),
            ));
        }
        if self.client_id.is_empty() || self.client_id.chars().any(char::is_control) {
            return Err(invalid(
                "oauthbearer.client_id",
                "must be non-empty, without control characters",
            ));
        }
        if self.client_secret.is_empty()
            || self.client_secret.expose().chars().any(char::is_control)
        {
            return Err(invalid(
                "oauthbearer.client_secret",
                "must be non-empty, without control characters (give it by reference: \
                 { file = … } or { env = … })",
            ));
        }
        if self
            .scope
            .as_ref()
            .is_some_and(|scope| scope.is_empty() || scope.chars().any(char::is_control))
        {
            return Err(invalid(
                "oauthbearer.scope",
                "must be scopes separated by spaces (or unset for the provider's default)",
            ));
        }
        for (key, value) in &self.extensions {
            let bad = |s: &str| {
                s.is_empty() || s.chars().any(|c| matches!(c, ',' | '=') || c.is_control())
            };
            if bad(key) || bad(value) {
                return Err(invalid(
                    "oauthbearer.extensions",
                    format!(
                        "{key:?} = {value:?}: keys and values must be non-empty, without , or ="
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `[bus.kafka.tls]`: how the brokers' certificates are checked, and the client's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaTls {
    /// PEM file of the CAs the brokers' certificates chain to; unset: the system's CA bundle.
    pub ca_file: Option<PathBuf>,
    /// A client certificate (PEM) and its private key (PEM), for brokers that require one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The passphrase of an encrypted `key_file`.
    pub key_password: Option<Secret>,
    /// Check that a broker's certificate names the host connected to (librdkafka's
    /// `ssl.endpoint.identification.algorithm = https`). Turning it off still checks the CA.
    pub verify_hostname: bool,
}

impl Default for KafkaTls {
    fn default() -> Self {
        Self {
            ca_file: None,
            cert_file: None,
            key_file: None,
            key_password: None,
            verify_hostname: true,
        }
    }
}

/// The security settings of every client of the bus.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KafkaSecurity {
    pub protocol: SecurityProtocol,
    /// A user and password (PLAIN, SCRAM). With `sasl_plaintext` and `sasl_ssl`, this or
    /// `oauthbearer` is required; neither is allowed with the other protocols.
    pub sasl: Option<KafkaSasl>,
    /// OAUTHBEARER with OIDC client credentials, instead of `sasl`.
    pub oauthbearer: Option<KafkaOauth>,
    /// Used by `ssl` and `sasl_ssl`; must be left at its defaults otherwise.
    pub tls: KafkaTls,
}

/// librdkafka properties these settings own: `extra` may not set them.
pub(crate) const OWNED_PROPERTIES: &[(&str, &str)] = &[
    ("security.protocol", "set `security_protocol` instead"),
    ("sasl.mechanism", "set `sasl.mechanism` instead"),
    ("sasl.mechanisms", "set `sasl.mechanism` instead"),
    ("sasl.username", "set `sasl.username` instead"),
    ("sasl.password", "set `sasl.password` instead"),
    ("ssl.ca.location", "set `tls.ca_file` instead"),
    ("ssl.certificate.location", "set `tls.cert_file` instead"),
    ("ssl.key.location", "set `tls.key_file` instead"),
    ("ssl.key.password", "set `tls.key_password` instead"),
    (
        "ssl.endpoint.identification.algorithm",
        "set `tls.verify_hostname` instead",
    ),
    (
        "enable.ssl.certificate.verification",
        "a broker's certificate is always checked against a CA",
    ),
    (
        "sasl.oauthbearer.method",
        "set [bus.kafka.oauthbearer] instead",
    ),
    (
        "sasl.oauthbearer.client.id",
        "set `oauthbearer.client_id` instead",
    ),
    (
        "sasl.oauthbearer.client.secret",
        "set `oauthbearer.client_secret` instead",
    ),
    (
        "sasl.oauthbearer.token.endpoint.url",
        "set `oauthbearer.token_endpoint_url` instead",
    ),
    ("sasl.oauthbearer.scope", "set `oauthbearer.scope` instead"),
    (
        "sasl.oauthbearer.extensions",
        "set `oauthbearer.extensions` instead",
    ),
    (
        "sasl.oauthbearer.config",
        "unsecured tokens are for tests; set [bus.kafka.oauthbearer]",
    ),
];

fn invalid(key: &'static str, why: impl Into<String>) -> BusError {
    BusError::InvalidConfig {
        key,
        why: why.into(),
    }
}

fn readable(key: &'static str, path: &Path) -> Result<(), BusError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))
}

impl KafkaSecurity {
    /// Checks that the protocol, SASL and TLS settings agree and that every file can be read.
    pub fn validate(&self) -> Result<(), BusError> {
        if self.sasl.is_some() && self.oauthbearer.is_some() {
            return Err(invalid(
                "oauthbearer",
                "is set together with [bus.kafka.sasl]: a client authenticates one way, keep one",
            ));
        }
        if let Some(oauth) = &self.oauthbearer {
            if !self.protocol.uses_sasl() {
                return Err(invalid(
                    "security_protocol",
                    format!(
                        "is \"{}\", which sends no SASL token, yet [bus.kafka.oauthbearer] is \
                         set: use sasl_ssl (or sasl_plaintext)",
                        self.protocol.as_librdkafka()
                    ),
                ));
            }
            oauth.validate()?;
            return self.validate_tls();
        }
        match (&self.sasl, self.protocol.uses_sasl()) {
            (None, true) => {
                return Err(invalid(
                    "sasl",
                    format!(
                        "security_protocol = \"{}\" needs [bus.kafka.sasl] with mechanism, \
                         username and password (or [bus.kafka.oauthbearer])",
                        self.protocol.as_librdkafka()
                    ),
                ));
            }
            (Some(_), false) => {
                return Err(invalid(
                    "security_protocol",
                    format!(
                        "is \"{}\", which sends no SASL credentials, yet [bus.kafka.sasl] is \
                         set: use sasl_ssl (or sasl_plaintext)",
                        self.protocol.as_librdkafka()
                    ),
                ));
            }
            _ => {}
        }
        if let Some(sasl) = &self.sasl {
            if sasl.username.is_empty() || sasl.username.chars().any(char::is_control) {
                return Err(invalid(
                    "sasl.username",
                    "must be non-empty, without control characters",
                ));
            }
            if sasl.password.is_empty() || sasl.password.expose().chars().any(char::is_control) {
                return Err(invalid(
                    "sasl.password",
                    "must be non-empty, without control characters",
                ));
            }
        }
        self.validate_tls()
    }

    fn validate_tls(&self) -> Result<(), BusError> {
        let tls = &self.tls;
        if !self.protocol.uses_tls() && *tls != KafkaTls::default() {
            return Err(invalid(
                "tls",
                format!(
                    "is set while security_protocol = \"{}\" uses no TLS: use ssl or sasl_ssl",
                    self.protocol.as_librdkafka()
                ),
            ));
        }
        match (&tls.cert_file, &tls.key_file) {
            (Some(_), None) => {
                return Err(invalid(
                    "tls.key_file",
                    "a client certificate needs its key",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "tls.cert_file",
                    "a client key needs its certificate",
                ));
            }
            _ => {}
        }
        if tls.key_password.is_some() && tls.key_file.is_none() {
            return Err(invalid("tls.key_password", "is set without tls.key_file"));
        }
        for (key, path) in [
            ("tls.ca_file", &tls.ca_file),
            ("tls.cert_file", &tls.cert_file),
            ("tls.key_file", &tls.key_file),
        ] {
            if let Some(path) = path {
                readable(key, path)?;
                if path.to_str().is_none() {
                    return Err(invalid(key, "must be a UTF-8 path (librdkafka takes text)"));
                }
            }
        }
        Ok(())
    }

    #[cfg(feature = "librdkafka")]
    /// Sets the librdkafka properties of these settings on `config`.
    pub(crate) fn apply(&self, config: &mut ClientConfig) {
        config.set("security.protocol", self.protocol.as_librdkafka());
        if let Some(sasl) = &self.sasl {
            config
                .set("sasl.mechanism", sasl.mechanism.as_librdkafka())
                .set("sasl.username", &sasl.username)
                .set("sasl.password", sasl.password.expose());
        }
        if let Some(oauth) = &self.oauthbearer {
            config
                .set("sasl.mechanism", "OAUTHBEARER")
                .set("sasl.oauthbearer.method", "oidc")
                .set("sasl.oauthbearer.client.id", &oauth.client_id)
                .set(
                    "sasl.oauthbearer.client.secret",
                    oauth.client_secret.expose(),
                )
                .set(
                    "sasl.oauthbearer.token.endpoint.url",
                    &oauth.token_endpoint_url,
                );
            if let Some(scope) = &oauth.scope {
                config.set("sasl.oauthbearer.scope", scope);
            }
            if !oauth.extensions.is_empty() {
                let extensions: Vec<String> = oauth
                    .extensions
                    .iter()
                    .map(|(key, value)| format!("{key}={value}"))
                    .collect();
                config.set("sasl.oauthbearer.extensions", extensions.join(","));
            }
        }
        if !self.protocol.uses_tls() {
            return;
        }
        let tls = &self.tls;
        let path = |p: &Path| p.to_string_lossy().into_owned();
        if let Some(ca) = &tls.ca_file {
            config.set("ssl.ca.location", path(ca));
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            config
                .set("ssl.certificate.location", path(cert))
                .set("ssl.key.location", path(key));
        }
        if let Some(password) = &tls.key_password {
            config.set("ssl.key.password", password.expose());
        }
        config.set(
            "ssl.endpoint.identification.algorithm",
            if tls.verify_hostname { "https" } else { "none" },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_of(security: &KafkaSecurity) -> &'static str {
        match security.validate() {
            Err(BusError::InvalidConfig { key, .. }) => key,
            other => panic!("expected an invalid configuration, got {other:?}"),
        }
    }

    fn sasl() -> Option<KafkaSasl> {
        Some(KafkaSasl {
            mechanism: SaslMechanism::ScramSha512,
            username: "sluice".into(),
            password: Secret::new("hunter2"),
        })
    }

    #[test]
    fn protocol_sasl_and_tls_must_agree() {
        let sasl_ssl = KafkaSecurity {
            protocol: SecurityProtocol::SaslSsl,
            ..KafkaSecurity::default()
        };
        assert_eq!(key_of(&sasl_ssl), "sasl");
        let plaintext_with_sasl = KafkaSecurity {
            sasl: sasl(),
            ..KafkaSecurity::default()
        };
        assert_eq!(key_of(&plaintext_with_sasl), "security_protocol");
        let plaintext_with_tls = KafkaSecurity {
            tls: KafkaTls {
                verify_hostname: false,
                ..KafkaTls::default()
            },
            ..KafkaSecurity::default()
        };
        assert_eq!(key_of(&plaintext_with_tls), "tls");
        let half_cert = KafkaSecurity {
            protocol: SecurityProtocol::Ssl,
            tls: KafkaTls {
                cert_file: Some("/nowhere/c.pem".into()),
                ..KafkaTls::default()
            },
            ..KafkaSecurity::default()
        };
        assert_eq!(key_of(&half_cert), "tls.key_file");
        let missing_ca = KafkaSecurity {
            protocol: SecurityProtocol::Ssl,
            tls: KafkaTls {
                ca_file: Some("/nowhere/ca.pem".into()),
                ..KafkaTls::default()
            },
            ..KafkaSecurity::default()
        };
        assert_eq!(key_of(&missing_ca), "tls.ca_file");
        let empty_password = KafkaSecurity {
            protocol: SecurityProtocol::SaslSsl,
            sasl: Some(KafkaSasl {
                password: Secret::new(""),
                ..sasl().expect("credentials")
            }),
            ..KafkaSecurity::default()
        };
        assert_eq!(key_of(&empty_password), "sasl.password");
    }

    #[test]
    fn properties_follow_the_settings_and_debug_hides_the_password() {
        let security = KafkaSecurity {
            protocol: SecurityProtocol::SaslSsl,
            sasl: sasl(),
            tls: KafkaTls {
                verify_hostname: false,
                ..KafkaTls::default()
            },
            oauthbearer: None,
        };
        security.validate().expect("valid");
        let mut config = ClientConfig::new();
        security.apply(&mut config);
        assert_eq!(config.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(config.get("sasl.mechanism"), Some("SCRAM-SHA-512"));
        assert_eq!(config.get("sasl.username"), Some("sluice"));
        assert_eq!(config.get("sasl.password"), Some("hunter2"));
        assert_eq!(
            config.get("ssl.endpoint.identification.algorithm"),
            Some("none")
        );
        assert_eq!(config.get("ssl.ca.location"), None, "the system's roots");
        let shown = format!("{security:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("sluice"),
            "{shown}"
        );
    }

    fn oauth() -> KafkaOauth {
        KafkaOauth {
            token_endpoint_url: "https://idp.example.com/token".into(),
            client_id: "sluice".into(),
            client_secret: Secret::new("oidc-s3cret"),
            scope: Some("kafka".into()),
            extensions: BTreeMap::from([("logicalCluster".into(), "lkc-1".into())]),
        }
    }

    #[test]
    fn oauthbearer_is_checked_and_becomes_oidc_client_credentials() {
        let security = KafkaSecurity {
            protocol: SecurityProtocol::SaslSsl,
            oauthbearer: Some(oauth()),
            ..KafkaSecurity::default()
        };
        security.validate().expect("valid");
        let mut config = ClientConfig::new();
        security.apply(&mut config);
        assert_eq!(config.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(config.get("sasl.oauthbearer.method"), Some("oidc"));
        assert_eq!(config.get("sasl.oauthbearer.client.id"), Some("sluice"));
        assert_eq!(
            config.get("sasl.oauthbearer.client.secret"),
            Some("oidc-s3cret")
        );
        assert_eq!(
            config.get("sasl.oauthbearer.token.endpoint.url"),
            Some("https://idp.example.com/token")
        );
        assert_eq!(config.get("sasl.oauthbearer.scope"), Some("kafka"));
        assert_eq!(
            config.get("sasl.oauthbearer.extensions"),
            Some("logicalCluster=lkc-1")
        );
        assert_eq!(config.get("sasl.username"), None);
        assert!(!format!("{security:?}").contains("oidc-s3cret"));

        let both = KafkaSecurity {
            sasl: sasl(),
            ..security.clone()
        };
        assert_eq!(key_of(&both), "oauthbearer");
        let no_sasl_protocol = KafkaSecurity {
            protocol: SecurityProtocol::Ssl,
            ..security.clone()
        };
        assert_eq!(key_of(&no_sasl_protocol), "security_protocol");
        for (bad, key) in [
            (
                KafkaOauth {
                    token_endpoint_url: "idp.example.com/token".into(),
                    ..oauth()
                },
                "oauthbearer.token_endpoint_url",
            ),
            (
                KafkaOauth {
                    client_id: String::new(),
                    ..oauth()
                },
                "oauthbearer.client_id",
            ),
            (
                KafkaOauth {
                    client_secret: Secret::new(""),
                    ..oauth()
                },
                "oauthbearer.client_secret",
            ),
            (
                KafkaOauth {
                    extensions: BTreeMap::from([("a=b".into(), "c".into())]),
                    ..oauth()
                },
                "oauthbearer.extensions",
            ),
        ] {
            let security = KafkaSecurity {
                oauthbearer: Some(bad),
                ..security.clone()
            };
            assert_eq!(key_of(&security), key);
        }
    }
}
