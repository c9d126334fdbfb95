//! Approval links (`[approval_links]`, `sluice_core::approval_link`): the key that signs them
//! and the address they are given at.
//!
//! ```toml
//! [approval_links]
//! secret = { env = "SLUICE_APPROVAL_LINK_KEY" }   # at least 32 bytes; never logged
//! base_url = "https://sluice.example.com"          # what a link starts with
//! ```
//!
//! Every producer replica holds the same secret, so any replica verifies any replica's links.
//! Without one a producer issues no links (503 `approval_links_off`), except `sluice dev`,
//! which generates one once and keeps it in its data directory (mode 0600). Without
//! `base_url` a link starts with the address the request that created it was sent to.

use serde::{Deserialize, Serialize};
use sluice_core::Secret;
use sluice_core::approval_link::MIN_KEY_BYTES;

use crate::ConfigError;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApprovalLinksConfig {
    /// The HMAC-SHA256 key that signs and verifies links.
    pub secret: Option<Secret>,
    /// The scheme, host and optional path prefix links start with (`https://sluice.example.com`).
    pub base_url: Option<String>,
}

/// Checks an address Sluice gives out for others to call back (an approval link's, a callback
/// URL's): absolute http(s), with a host and no user information, query or fragment, since
/// what Sluice appends is a path.
pub(crate) fn check_base_url(key: &str, value: &str) -> Result<(), ConfigError> {
    let ok = url::Url::parse(value).is_ok_and(|url| {
        matches!(url.scheme(), "http" | "https")
            && url.host().is_some()
            && url.username().is_empty()
            && url.password().is_none()
            && url.query().is_none()
            && url.fragment().is_none()
    });
    if ok {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        key: key.to_owned(),
        message: format!(
            "{value:?} is not an absolute http(s) address without user information, a query or a fragment"
        ),
    })
}

impl ApprovalLinksConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                message,
            })
        };
        if let Some(secret) = &self.secret
            && secret.expose().len() < MIN_KEY_BYTES
        {
            return invalid(
                "approval_links.secret",
                format!(
                    "must be at least {MIN_KEY_BYTES} bytes (for example `openssl rand -base64 48`)"
                ),
            );
        }
        if let Some(base) = &self.base_url {
            check_base_url("approval_links.base_url", base)?;
        }
        Ok(())
    }

    /// `base_url` without its trailing slashes.
    pub fn base(&self) -> Option<&str> {
        self.base_url.as_deref().map(|b| b.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_secret_or_a_bad_address_is_refused_by_name() {
        let short = ApprovalLinksConfig {
            secret: Some(Secret::new("short")),
            base_url: None,
        };
        let err = short.validate().expect_err("short").to_string();
        assert!(
            err.contains("approval_links.secret") && !err.contains("short\""),
            "{err}"
        );
        for bad in ["ftp://x", "not a url", "https://x/?a=1"] {
            let config = ApprovalLinksConfig {
                secret: None,
                base_url: Some(bad.into()),
            };
            let err = config.validate().expect_err(bad).to_string();
            assert!(err.contains("approval_links.base_url"), "{err}");
        }
        let good = ApprovalLinksConfig {
            secret: Some(Secret::new("k".repeat(32))),
            base_url: Some("https://sluice.example.com/".into()),
        };
        assert!(good.validate().is_ok());
        assert_eq!(good.base(), Some("https://sluice.example.com"));
    }
}
