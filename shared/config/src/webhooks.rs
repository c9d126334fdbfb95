//! Webhook subscriptions (`[[webhooks]]`): which lifecycle and tool events are pushed to which
//! receiver, signed with which key, retried how (docs/operations.md, "Webhooks").
//!
//! ```toml
//! [[webhooks]]
//! name = "on-call"                        # letters, digits, '.', '_', '-'
//! url = "https://hooks.example.com/sluice"
//! secret = { env = "SLUICE_WEBHOOK_ON_CALL" }   # whsec_<base64>, or a file; never logged
//! types = ["dev.sluice.effect.stuck.v1", "dev.sluice.effect.blocked.v1", "dev.sluice.flow.*"]
//! # timeout_ms = 10000, max_attempts = 20, first_backoff_ms = 1000, max_backoff_ms = 600000
//! ```

use serde::{Deserialize, Serialize};
use sluice_core::Secret;
use sluice_core::webhook::{RetryRules, decode_key, pattern_problem};

use crate::ConfigError;

/// One webhook subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// How the CLI, the metrics and the ledger name it.
    pub name: String,
    /// The receiver: an `http://` or `https://` URL, without credentials in it.
    pub url: String,
    /// The Standard Webhooks signing key, `whsec_<base64>` (at least 24 bytes).
    pub secret: Secret,
    /// The CloudEvents `type`s it takes: exact, or ending in `*` for every type that starts
    /// with what precedes it (`"dev.sluice.effect.*"`); `"*"` takes everything. A type named
    /// without its version (`"dev.sluice.effect.stuck"`) takes version 1 (docs/events.md).
    pub types: Vec<String>,
    /// How long one attempt may take, connection and answer included.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Attempts before a delivery is given up (FAILED; `sluice webhooks retry` sends it again).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    /// The pause after the first failed attempt; it doubles after each, up to
    /// `max_backoff_ms`, each drawn between half of it and all of it.
    #[serde(default = "default_first_backoff_ms")]
    pub first_backoff_ms: u64,
    #[serde(default = "default_max_backoff_ms")]
    pub max_backoff_ms: u64,
}

fn default_timeout_ms() -> u64 {
    10_000
}

/// Twenty attempts: 1 s doubling to 10 minutes, about two and a half hours in all, so a
/// receiver down for a deploy or an afternoon's outage still gets every event.
fn default_max_attempts() -> u32 {
    20
}

fn default_first_backoff_ms() -> u64 {
    1_000
}

fn default_max_backoff_ms() -> u64 {
    600_000
}

impl WebhookConfig {
    /// How its deliveries are retried.
    pub fn retry_rules(&self) -> RetryRules {
        RetryRules {
            max_attempts: self.max_attempts,
            first_backoff_ms: self.first_backoff_ms,
            max_backoff_ms: self.max_backoff_ms,
        }
    }

    /// The signing key's bytes; checked at load, so only a configuration built by hand fails.
    pub fn key(&self) -> Result<Vec<u8>, String> {
        decode_key(self.secret.expose())
    }
}

/// Checks every subscription; each error names its key (`webhooks[0].url`).
pub(crate) fn validate(webhooks: &[WebhookConfig]) -> Result<(), ConfigError> {
    let mut names = std::collections::BTreeSet::new();
    for (i, hook) in webhooks.iter().enumerate() {
        let invalid = |field: &str, message: String| {
            Err(ConfigError::Invalid {
                key: format!("webhooks[{i}].{field}"),
                message,
            })
        };
        let name_ok = !hook.name.is_empty()
            && hook.name.len() <= 64
            && hook
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !name_ok {
            return invalid(
                "name",
                "must be 1 to 64 letters, digits, '.', '_' or '-'".into(),
            );
        }
        if !names.insert(hook.name.as_str()) {
            return invalid(
                "name",
                format!("{:?} names another webhook already", hook.name),
            );
        }
        match url::Url::parse(&hook.url) {
            Err(e) => return invalid("url", format!("is not a URL: {e}")),
            Ok(url) if !matches!(url.scheme(), "http" | "https") => {
                return invalid("url", "must be an http:// or https:// URL".into());
            }
            Ok(url) if !url.username().is_empty() || url.password().is_some() => {
                return invalid(
                    "url",
                    "may not hold credentials: the receiver checks the signature instead".into(),
                );
            }
            Ok(url) if url.host_str().is_none_or(str::is_empty) => {
                return invalid("url", "must name a host".into());
            }
            Ok(_) => {}
        }
        if let Err(why) = hook.key() {
            return invalid("secret", why);
        }
        if hook.types.is_empty() {
            return invalid(
                "types",
                "must list at least one event type, e.g. \"dev.sluice.effect.stuck\"".into(),
            );
        }
        for (j, pattern) in hook.types.iter().enumerate() {
            if let Some(why) = pattern_problem(pattern) {
                return Err(ConfigError::Invalid {
                    key: format!("webhooks[{i}].types[{j}]"),
                    message: why.into(),
                });
            }
        }
        if !(100..=120_000).contains(&hook.timeout_ms) {
            return invalid(
                "timeout_ms",
                "must be between 100 and 120000 (milliseconds)".into(),
            );
        }
        if hook.max_attempts == 0 || hook.max_attempts > 1_000 {
            return invalid("max_attempts", "must be between 1 and 1000".into());
        }
        if hook.first_backoff_ms < 10 {
            return invalid("first_backoff_ms", "must be at least 10".into());
        }
        if hook.max_backoff_ms < hook.first_backoff_ms || hook.max_backoff_ms > 86_400_000 {
            return invalid(
                "max_backoff_ms",
                "must be at least first_backoff_ms and at most a day (86400000)".into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{Config, ConfigError};

    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn load(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, text).expect("write");
        let env = |var: &str| (var == "HOOK_KEY").then(|| KEY.to_owned());
        Config::load_with(Some(&path), Vec::new(), &env)
    }

    fn hook(extra: &str) -> String {
        format!(
            "[[webhooks]]\nname = \"ops\"\nurl = \"https://hooks.example.com/x\"\n\
             secret = {{ env = \"HOOK_KEY\" }}\ntypes = [\"dev.sluice.effect.stuck\"]\n{extra}"
        )
    }

    fn error_of(text: &str) -> (String, String) {
        match load(text).expect_err("invalid") {
            ConfigError::Invalid { key, message } => (key, message),
            other => panic!("not a keyed error: {other}"),
        }
    }

    #[test]
    fn a_subscription_loads_with_its_defaults_and_its_secret_from_the_environment() {
        let config = load(&hook("")).expect("valid");
        let hook = &config.webhooks[0];
        assert_eq!(hook.name, "ops");
        assert_eq!(hook.secret.expose(), KEY);
        assert_eq!(
            (hook.timeout_ms, hook.max_attempts, hook.first_backoff_ms),
            (10_000, 20, 1_000)
        );
        assert!(
            !format!("{config:?}").contains("MfKQ9r8"),
            "the key is never shown"
        );
    }

    #[test]
    fn each_bad_setting_is_named() {
        let cases = [
            (
                hook("").replace("https://hooks.example.com/x", "ftp://x/y"),
                "webhooks[0].url",
                "http",
            ),
            (
                hook("").replace("https://hooks.example.com/x", "https://u:p@x/y"),
                "webhooks[0].url",
                "credentials",
            ),
            (
                hook("").replace("https://hooks.example.com/x", "not a url"),
                "webhooks[0].url",
                "not a URL",
            ),
            (
                hook("").replace("{ env = \"HOOK_KEY\" }", "\"hunter2hunter2\""),
                "webhooks[0].secret",
                "whsec_",
            ),
            (
                hook("").replace("{ env = \"HOOK_KEY\" }", "\"whsec_c2hvcnQ=\""),
                "webhooks[0].secret",
                "24 bytes",
            ),
            (
                hook("").replace("[\"dev.sluice.effect.stuck\"]", "[]"),
                "webhooks[0].types",
                "at least one",
            ),
            (
                hook("").replace("\"dev.sluice.effect.stuck\"", "\"dev.*.stuck\""),
                "webhooks[0].types[0]",
                "'*'",
            ),
            (hook("timeout_ms = 5"), "webhooks[0].timeout_ms", "between"),
            (
                hook("max_attempts = 0"),
                "webhooks[0].max_attempts",
                "between",
            ),
            (
                hook("first_backoff_ms = 5000\nmax_backoff_ms = 10"),
                "webhooks[0].max_backoff_ms",
                "first_backoff_ms",
            ),
            (
                hook("").replace("\"ops\"", "\"on call\""),
                "webhooks[0].name",
                "letters",
            ),
            (
                format!("{}{}", hook(""), hook("")),
                "webhooks[1].name",
                "another webhook",
            ),
        ];
        for (text, key, words) in cases {
            let (got_key, message) = error_of(&text);
            assert_eq!(got_key, key, "{text}");
            assert!(message.contains(words), "{key}: {message}");
            assert!(!message.contains("MfKQ9r8"), "{message}");
        }
        let missing = load(&hook("").replace("HOOK_KEY", "NOT_SET")).expect_err("unset");
        assert!(
            missing.to_string().contains("webhooks[0].secret"),
            "{missing}"
        );
        let unknown = load(&hook("retries = 3")).expect_err("unknown key");
        assert!(unknown.to_string().contains("retries"), "{unknown}");
    }
}
