//! Callback URLs of asynchronous tools (`[callbacks]`, `sluice_core::callback`): the key that
//! signs them and the address upstreams reach the producer at.
//!
//! ```toml
//! [callbacks]
//! secret = { env = "SLUICE_CALLBACK_KEY" }     # at least 32 bytes; never logged
//! public_url = "https://sluice.example.com"    # what a callback URL starts with
//! ```
//!
//! A tool that names `{callback_url}` in its dispatch request (`[tool.async]`) is given
//! `<public_url>/v1/callbacks/<token>`, the token signed by `secret`. The dispatchers sign, the
//! producers verify with the secret: every one of them holds the same secret and public URL.
//! A catalog with such a tool is refused at start, naming the tool, where either is missing.
//! `sluice dev` fills both: a key kept in its data directory and its own address.

use serde::{Deserialize, Serialize};
use sluice_core::Secret;
use sluice_core::callback::check_key;

use crate::ConfigError;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CallbacksConfig {
    /// The HMAC-SHA256 key that signs and verifies callback tokens.
    pub secret: Option<Secret>,
    /// The scheme, host and optional path prefix of the producer's API as upstreams reach it
    /// (`https://sluice.example.com`).
    pub public_url: Option<String>,
}

impl CallbacksConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message,
            })
        };
        if let Some(secret) = &self.secret
            && let Err(why) = check_key(secret.expose().as_bytes())
        {
            return invalid(
                "callbacks.secret",
                format!("{why} (for example `openssl rand -hex 32`)"),
            );
        }
        if let Some(public) = &self.public_url {
            crate::links::check_base_url("callbacks.public_url", public)?;
        }
        Ok(())
    }

    /// Whether callbacks are configured (a key and an address).
    pub fn is_set(&self) -> bool {
        self.secret.is_some() && self.public_url.is_some()
    }

    /// `public_url` without its trailing slashes.
    pub fn base(&self) -> Option<&str> {
        self.public_url.as_deref().map(|b| b.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(secret: Option<&str>, public_url: Option<&str>) -> CallbacksConfig {
        CallbacksConfig {
            secret: secret.map(Secret::new),
            public_url: public_url.map(str::to_owned),
        }
    }

    #[test]
    fn a_short_key_or_a_bad_address_is_refused_by_name() {
        let err = config(Some("short-key"), Some("https://sluice.example.com"))
            .validate()
            .expect_err("short")
            .to_string();
        assert!(
            err.contains("callbacks.secret") && err.contains("32") && !err.contains("short-key"),
            "{err}"
        );
        let key = "k".repeat(32);
        for bad in [
            "ftp://x",
            "not a url",
            "/v1",
            "https://x/?a=1",
            "https://x/#f",
            "https://user:pw@x",
        ] {
            let err = config(Some(&key), Some(bad))
                .validate()
                .expect_err(bad)
                .to_string();
            assert!(err.contains("callbacks.public_url"), "{err}");
            assert!(!err.contains(&key), "{err}");
        }
        // Half a section is valid: a producer verifies with the key alone, and `sluice dev`
        // fills what is missing. A dispatcher of a tool naming `{callback_url}` needs both
        // (refused at start, naming the tool).
        assert!(config(Some(&key), None).validate().is_ok());
        assert!(!config(Some(&key), None).is_set());
        assert!(config(None, Some("https://x")).validate().is_ok());

        let good = config(Some(&key), Some("https://sluice.example.com/api/"));
        assert!(good.validate().is_ok());
        assert!(good.is_set());
        assert_eq!(good.base(), Some("https://sluice.example.com/api"));
        assert!(
            !format!("{good:?}").contains(&key),
            "the key is never printed"
        );
        assert!(CallbacksConfig::default().validate().is_ok());
        assert!(!CallbacksConfig::default().is_set());
    }

    #[test]
    fn the_key_comes_by_environment_or_by_reference_and_is_never_serialized() {
        let key = "0123456789abcdef0123456789abcdef";
        let by_env = crate::Config::load_with(
            None,
            [
                ("SLUICE_CALLBACKS__SECRET", key),
                ("SLUICE_CALLBACKS__PUBLIC_URL", "https://sluice.example.com"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            &|_| None,
        )
        .expect("valid");
        assert_eq!(
            by_env.callbacks.secret.as_ref().map(Secret::expose),
            Some(key)
        );
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sluice.toml");
        std::fs::write(
            &path,
            "[callbacks]\nsecret = { env = \"CB_KEY\" }\npublic_url = \"http://127.0.0.1:8700\"\n",
        )
        .expect("write");
        let lookup = |var: &str| (var == "CB_KEY").then(|| key.to_owned());
        let by_reference =
            crate::Config::load_with(Some(&path), Vec::new(), &lookup).expect("valid");
        assert_eq!(by_reference.callbacks.base(), Some("http://127.0.0.1:8700"));
        let written = toml::to_string(&by_reference).expect("serializes");
        assert!(!written.contains(key), "{written}");
    }
}
