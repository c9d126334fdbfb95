//! The keys that sign the command's copy in each dispatch request on Kafka
//! (`[[bus.copy_keys]]`), so a dispatcher can act on the producer's copy without reading the
//! command from the ledger, and nobody who can only publish to the topic can choose what is
//! called (docs/decisions.md, "The dispatcher acts on a signed copy").
//!
//! ```toml
//! [[bus.copy_keys]]
//! id = "2026-11"                                # letters, digits, '_', '-'; at most 32
//! secret = { env = "SLUICE_COPY_KEY_2026_11" }  # at least 32 bytes; never logged
//! ```
//!
//! The first key signs; every key listed verifies, so a key is rotated by listing the new one
//! first beside the old, then dropping the old once every request signed with it is handled.
//! With no key (the default) requests carry no copy and the dispatcher reads the command.

use serde::{Deserialize, Serialize};
use sluice_core::Secret;

use crate::ConfigError;

/// Keys at most: verifying tries the one named, so the list only bounds the configuration.
pub const MAX_COPY_KEYS: usize = 8;
/// Bytes of a key at least: HMAC-SHA256's own output length.
pub const MIN_COPY_KEY_BYTES: usize = 32;

/// One key of `[[bus.copy_keys]]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyKey {
    /// Named in each request it signs, so a verifier knows which key to use.
    pub id: String,
    /// The shared secret: every producer, reconciler and dispatcher holds the same.
    pub secret: Secret,
}

pub(crate) fn validate(keys: &[CopyKey]) -> Result<(), ConfigError> {
    let invalid = |key: String, message: String| Err(ConfigError::Invalid { key, message });
    if keys.len() > MAX_COPY_KEYS {
        return invalid(
            "bus.copy_keys".into(),
            format!("at most {MAX_COPY_KEYS} keys (the first signs, the rest only verify)"),
        );
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, key) in keys.iter().enumerate() {
        let id_ok = !key.id.is_empty()
            && key.id.len() <= 32
            && key
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
        if !id_ok {
            return invalid(
                format!("bus.copy_keys[{i}].id"),
                "must be 1 to 32 letters, digits, '_' or '-'".into(),
            );
        }
        if !seen.insert(key.id.as_str()) {
            return invalid(
                format!("bus.copy_keys[{i}].id"),
                format!("{:?} is listed twice", key.id),
            );
        }
        if key.secret.expose().len() < MIN_COPY_KEY_BYTES {
            return invalid(
                format!("bus.copy_keys[{i}].secret"),
                format!(
                    "must be at least {MIN_COPY_KEY_BYTES} bytes (for example `openssl rand -base64 48`)"
                ),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, secret: &str) -> CopyKey {
        CopyKey {
            id: id.into(),
            secret: Secret::new(secret),
        }
    }

    #[test]
    fn keys_are_named_once_long_enough_and_few() {
        let long = "k".repeat(MIN_COPY_KEY_BYTES);
        assert!(validate(&[]).is_ok());
        assert!(validate(&[key("2026-11", &long), key("2026-10", &long)]).is_ok());
        let refused = |keys: &[CopyKey], named: &str| {
            let err = validate(keys).expect_err("refused").to_string();
            assert!(err.contains(named), "{err}");
            assert!(!err.contains(&long), "the secret reached the error: {err}");
        };
        refused(&[key("a", &long), key("a", &long)], "bus.copy_keys[1].id");
        refused(&[key("", &long)], "bus.copy_keys[0].id");
        refused(&[key("has space", &long)], "bus.copy_keys[0].id");
        refused(&[key("a", "short")], "bus.copy_keys[0].secret");
        let many: Vec<CopyKey> = (0..=MAX_COPY_KEYS)
            .map(|i| key(&i.to_string(), &long))
            .collect();
        refused(&many, "bus.copy_keys");
    }
}
