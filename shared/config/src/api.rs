//! The `[producer]` and `[auth]` sections: where the API listens, its bounds, and who may call
//! it. Open mode (no tokens) is an explicit opt-in, and only on a loopback address.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProducerConfig {
    pub listen: SocketAddr,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most effects in one batch submission.
    pub max_batch: usize,
    /// Longest `?wait=` a client may ask for, in milliseconds.
    pub max_wait_ms: u64,
    /// Longest a submission waits for room in the dispatch backlog (`bus.admission`) before
    /// it is refused with 503 `dispatch_backlog_full`, nothing recorded; in milliseconds.
    pub admission_wait_ms: u64,
    /// The ledger's measured write latency past which a submission is refused with 503
    /// `ledger_behind` and `Retry-After`, nothing recorded (`sluice_core::load::admit`); in
    /// milliseconds, 0 for no limit.
    pub max_write_latency_ms: u64,
    /// Messages waiting in the bus client past which a submission is refused with 503
    /// `bus_behind`; 0 for no limit.
    pub max_bus_backlog: u64,
    /// How much of the dispatchers' work may wait for them, in milliseconds at their measured
    /// rate (at least `sluice_core::load::QUEUE_FLOOR` requests), before a submission is
    /// refused with 503 `dispatch_behind` (`sluice_core::load::admit_queue`); 0 for no limit.
    /// Read from the bus once a second where it measures it (Kafka: the dispatchers' committed
    /// offsets); the embedded bus bounds its queue at publish instead (`bus.admission`).
    pub max_dispatch_queue_ms: u64,
    /// How long one page of `GET /v1/effects` reads runs before it answers with what it has and
    /// a `next` (it always covers one run whole); in milliseconds. On a slow ledger a page of
    /// 1,000 runs would outlast a client's or a load balancer's timeout, and the client would
    /// ask for the same page again and never get past it.
    pub list_page_budget_ms: u64,
    /// Serve the operator's web console at `/ui`. Unset: on in `sluice dev`, off in
    /// `sluice-producer` (a deployment opts in).
    pub console: Option<bool>,
    /// Most `GET /v1/events/stream` connections open at once; past it 503 `too_many_streams`.
    pub max_event_streams: usize,
    /// Serve the API without bearer tokens, every caller the anonymous admin. An explicit
    /// choice, refused unless `listen` is a loopback address and `[[auth.tokens]]` is empty;
    /// without it a producer with no tokens does not start.
    pub open: bool,
    /// Browser origins (`https://console.example.com`) whose cross-origin requests are served.
    /// A request whose `Origin` is neither one of these nor the producer's own (its `Host`) is
    /// refused with 403: a web page the operator visits cannot drive the API.
    pub allowed_origins: Vec<String>,
    /// Host names (`sluice.example.com`, or `name:port` for that port only) the API answers to
    /// besides `localhost` and IP addresses, which it always does. A request whose `Host` is
    /// none of these is refused with 421 before any route: a page at a name its author made
    /// resolve to this address (DNS rebinding) cannot read the API. Empty by default; a
    /// deployment reached by a name (a Kubernetes Service, an ingress) lists it
    /// (`sluice_core::browser`).
    pub allowed_hosts: Vec<String>,
    /// Most long polls (`GET …?wait=`, `Prefer: wait`) held at once in all; past it 503
    /// `too_many_waits` with `Retry-After`.
    pub max_waits: usize,
    /// Most long polls held at once for one principal (one token; the anonymous admin in open
    /// mode); past it 503 `too_many_waits`.
    pub max_waits_per_principal: usize,
    /// `[producer.tls]`: serve HTTPS instead of HTTP.
    pub tls: Option<ServerTls>,
}

/// The API's certificate and key, read from PEM files and read again when they change (a
/// renewed Kubernetes TLS Secret, cert-manager): new connections get the new certificate,
/// open ones keep theirs. A new pair that does not load is logged and the old one kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// The certificate chain, leaf first (PEM).
    pub cert_file: PathBuf,
    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1, unencrypted).
    pub key_file: PathBuf,
    /// How often the files' modification times are looked at, in milliseconds; 0 never
    /// reloads.
    #[serde(default = "default_reload_ms")]
    pub reload_interval_ms: u64,
}

fn default_reload_ms() -> u64 {
    DEFAULT_TLS_RELOAD_MS
}

/// `producer.tls.reload_interval_ms` unless configured.
pub const DEFAULT_TLS_RELOAD_MS: u64 = 10_000;

impl ProducerConfig {
    /// Whether `/ui` is served: the configured choice, else `default` (the binary's).
    pub fn console_enabled(&self, default: bool) -> bool {
        self.console.unwrap_or(default)
    }
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8700)),
            max_body_bytes: 1024 * 1024,
            max_batch: 1_000,
            max_wait_ms: 60_000,
            admission_wait_ms: 10_000,
            max_write_latency_ms: 1_000,
            max_bus_backlog: 20_000,
            max_dispatch_queue_ms: 5_000,
            list_page_budget_ms: 5_000,
            console: None,
            max_event_streams: 64,
            open: false,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_waits: 4_096,
            max_waits_per_principal: 256,
            tls: None,
        }
    }
}

impl ProducerConfig {
    /// Checks the API's own settings: open mode, origins, bounds.
    pub(super) fn validate(&self, auth: &AuthConfig) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message,
            })
        };
        if self.open && !self.listen.ip().is_loopback() {
            return invalid(
                "producer.open",
                format!(
                    "an open API (no tokens) is served on loopback only, and the producer \
                     listens on {}: add [[auth.tokens]] entries and leave producer.open out",
                    self.listen
                ),
            );
        }
        if self.open && !auth.tokens.is_empty() {
            return invalid(
                "producer.open",
                "an open API takes no tokens, and [[auth.tokens]] names some: leave one out".into(),
            );
        }
        if let Err(entry) = self.browser_rules() {
            return invalid(&format!("{}[{}]", entry.key, entry.index), entry.why);
        }
        if self.max_waits == 0 || self.max_waits_per_principal == 0 {
            let key = if self.max_waits == 0 {
                "producer.max_waits"
            } else {
                "producer.max_waits_per_principal"
            };
            return invalid(key, "must be at least 1".into());
        }
        if let Some(tls) = &self.tls {
            for (key, path) in [
                ("producer.tls.cert_file", &tls.cert_file),
                ("producer.tls.key_file", &tls.key_file),
            ] {
                if let Err(e) = std::fs::File::open(path) {
                    return invalid(key, format!("cannot read {}: {e}", path.display()));
                }
            }
            if tls.reload_interval_ms > 0 && tls.reload_interval_ms < 100 {
                return invalid(
                    "producer.tls.reload_interval_ms",
                    "must be 0 (never reload) or at least 100".into(),
                );
            }
        }
        Ok(())
    }

    /// The hosts and origins the API allows (`producer.allowed_hosts`, `allowed_origins`);
    /// the first entry that is not valid is named.
    pub fn browser_rules(
        &self,
    ) -> Result<sluice_core::browser::Allowed, sluice_core::browser::EntryError> {
        sluice_core::browser::Allowed::new(&self.allowed_hosts, &self.allowed_origins)
    }

    /// Whether the producer may serve with `auth`: tokens, or an explicit `producer.open`.
    /// Checked when the producer starts rather than at load, so `sluice dev` can add the
    /// admin token it generates to a configuration that names none.
    pub fn check_serving(&self, auth: &AuthConfig) -> Result<(), ConfigError> {
        if auth.tokens.is_empty() && !self.open {
            return Err(ConfigError::Invalid {
                key: "auth.tokens".into(),
                message: "the API has no bearer tokens: add [[auth.tokens]] entries, or set \
                          producer.open = true to serve it open on a loopback address (every \
                          caller then acts as admin)"
                    .into(),
            });
        }
        Ok(())
    }
}

/// Who may call the API: bearer tokens, each with a role and a name.
///
/// With no tokens the API is open (every caller is an anonymous admin), which is allowed only
/// while the producer listens on a loopback address; `sluice dev` generates an admin token
/// instead. Tokens are compared by their SHA-256 digest in constant time, never logged, and
/// never serialized back out (`token_sha256` lets a file hold no secret at all).
///
/// ```toml
/// [[auth.tokens]]
/// name = "billing-agent"     # the principal recorded on commands and in the audit chain
/// role = "agent"             # agent | operator | admin
/// token = "..."              # at least 16 characters; or token_sha256 = "<64 hex digits>"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub tokens: Vec<TokenConfig>,
}

/// One bearer token.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    pub name: String,
    pub role: Role,
    /// The token itself; never serialized.
    #[serde(default, skip_serializing)]
    pub token: Option<String>,
    /// The token's SHA-256 digest in hex, for configuration that must not hold the secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// Tenants this token may submit for (the `tenant` of a submission) besides itself: a
    /// platform's one token acting for each of its customers. Empty: only for itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
}

impl std::fmt::Debug for TokenConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConfig")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field(
                "token_sha256",
                &self.token_sha256.as_ref().map(|_| "<redacted>"),
            )
            .field("tenants", &self.tenants)
            .finish()
    }
}

/// What a token may do. Each role includes the ones before it, except that an operator does
/// not submit effects: agent (submit, read its own runs) < operator (read everything) < admin
/// (approve, reject, cancel, replay, resolve, rollback, purge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Agent,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Operator => "operator",
            Self::Admin => "admin",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The shortest token accepted in configuration.
pub const MIN_TOKEN_CHARS: usize = 16;

impl AuthConfig {
    /// Checks names, secrets and uniqueness; `listen` is where the producer serves.
    pub(super) fn validate(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        let invalid = |key: String, message: String| Err(ConfigError::Invalid { key, message });
        if self.tokens.is_empty() && !listen.ip().is_loopback() {
            return invalid(
                "auth.tokens".into(),
                format!(
                    "the producer listens on {listen}, beyond loopback, so the API needs bearer \
                     tokens: add [[auth.tokens]] entries with name, role and token (an open API, \
                     producer.open, is for loopback only)"
                ),
            );
        }
        let mut names = std::collections::BTreeSet::new();
        let mut secrets = std::collections::BTreeSet::new();
        for (i, entry) in self.tokens.iter().enumerate() {
            let key = |field: &str| format!("auth.tokens[{i}].{field}");
            let name_ok = !entry.name.is_empty()
                && entry.name.len() <= 64
                && entry
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'));
            if !name_ok {
                return invalid(
                    key("name"),
                    "must be 1 to 64 letters, digits, '-', '_', '.' or '@'".into(),
                );
            }
            for (j, tenant) in entry.tenants.iter().enumerate() {
                if let Err(e) = sluice_core::tenant::parse(tenant) {
                    return invalid(key(&format!("tenants[{j}]")), e.to_string());
                }
            }
            if !names.insert(entry.name.as_str()) {
                return invalid(key("name"), format!("{:?} is used twice", entry.name));
            }
            match (&entry.token, &entry.token_sha256) {
                (Some(token), None) => {
                    if token.chars().count() < MIN_TOKEN_CHARS
                        || token.chars().any(char::is_whitespace)
                    {
                        return invalid(
                            key("token"),
                            format!("must be at least {MIN_TOKEN_CHARS} characters without spaces"),
                        );
                    }
                    if !secrets.insert(token.clone()) {
                        return invalid(key("token"), "the same token is given twice".into());
                    }
                }
                (None, Some(digest)) => {
                    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return invalid(key("token_sha256"), "must be 64 hex digits".into());
                    }
                    if !secrets.insert(digest.to_ascii_lowercase()) {
                        return invalid(
                            key("token_sha256"),
                            "the same digest is given twice".into(),
                        );
                    }
                }
                (Some(_), Some(_)) | (None, None) => {
                    return invalid(
                        key("token"),
                        "give exactly one of token and token_sha256".into(),
                    );
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn load(pairs: &[(&str, &str)]) -> Result<Config, crate::ConfigError> {
        Config::load(
            None,
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        )
    }

    #[test]
    fn open_mode_is_explicit_and_loopback_only() {
        let quiet = load(&[]).expect("defaults load: tokens may still be added (sluice dev)");
        let err = quiet
            .producer
            .check_serving(&quiet.auth)
            .expect_err("no tokens and not open: not served");
        assert!(
            err.to_string().contains("producer.open") && err.to_string().contains("auth.tokens"),
            "{err}"
        );
        let open = load(&[("SLUICE_PRODUCER__OPEN", "true")]).expect("open on loopback");
        open.producer
            .check_serving(&open.auth)
            .expect("open by choice is served");
        load(&[
            ("SLUICE_PRODUCER__OPEN", "true"),
            ("SLUICE_PRODUCER__LISTEN", "[::1]:8700"),
        ])
        .expect("open on IPv6 loopback");
        let err = load(&[
            ("SLUICE_PRODUCER__OPEN", "true"),
            ("SLUICE_PRODUCER__LISTEN", "0.0.0.0:8700"),
        ])
        .expect_err("open beyond loopback");
        assert!(err.to_string().contains("producer.open"), "{err}");
        let tokens = "[{ name = \"ops\", role = \"admin\", token = \"s3cret-s3cret-s3cret\" }]";
        let err = load(&[
            ("SLUICE_PRODUCER__OPEN", "true"),
            ("SLUICE_AUTH__TOKENS", tokens),
        ])
        .expect_err("open beside tokens");
        assert!(err.to_string().contains("producer.open"), "{err}");
        let with_tokens = load(&[
            ("SLUICE_AUTH__TOKENS", tokens),
            ("SLUICE_PRODUCER__LISTEN", "0.0.0.0:8700"),
        ])
        .expect("tokens beyond loopback");
        with_tokens
            .producer
            .check_serving(&with_tokens.auth)
            .expect("served with tokens");
    }

    #[test]
    fn origins_and_wait_bounds_are_checked() {
        let ok = load(&[(
            "SLUICE_PRODUCER__ALLOWED_ORIGINS",
            "[\"https://ops.example.com\", \"http://127.0.0.1:3000\"]",
        )])
        .expect("origins as browsers send them");
        assert_eq!(ok.producer.allowed_origins.len(), 2);
        for bad in [
            "[\"ops.example.com\"]",
            "[\"https://ops.example.com/\"]",
            "[\"https://Ops.example.com\"]",
            "[\"*\"]",
        ] {
            let err = load(&[("SLUICE_PRODUCER__ALLOWED_ORIGINS", bad)]).expect_err(bad);
            assert!(
                err.to_string().contains("producer.allowed_origins[0]"),
                "{bad}: {err}"
            );
        }
        let ok = load(&[(
            "SLUICE_PRODUCER__ALLOWED_HOSTS",
            "[\"sluice-producer\", \"sluice.example.com:443\"]",
        )])
        .expect("host names as clients send them");
        assert_eq!(ok.producer.allowed_hosts.len(), 2);
        for bad in [
            "[\"https://sluice.example.com\"]",
            "[\"*\"]",
            "[\"sluice.example.com/api\"]",
            "[\"sluice.example.com:http\"]",
        ] {
            let err = load(&[("SLUICE_PRODUCER__ALLOWED_HOSTS", bad)]).expect_err(bad);
            assert!(
                err.to_string().contains("producer.allowed_hosts[0]"),
                "{bad}: {err}"
            );
        }
        for key in ["MAX_WAITS", "MAX_WAITS_PER_PRINCIPAL"] {
            let err = load(&[(&format!("SLUICE_PRODUCER__{key}"), "0")]).expect_err(key);
            assert!(
                err.to_string()
                    .contains(&format!("producer.{}", key.to_ascii_lowercase())),
                "{err}"
            );
        }
    }
}
