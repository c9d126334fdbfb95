//! [`Secret`]: a configuration value (a password, a key's passphrase) that never reaches a log,
//! `Debug` or `Display` output, or a serialized configuration. Only [`Secret::expose`] hands
//! the text out, so every place that uses one is explicit.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What [`Secret`]'s `Debug`, `Display` and serialization show instead of the value.
pub const REDACTED: &str = "<redacted>";

/// A secret string. Compared in full (configuration equality), never shown.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret text, for the one call that needs it (a driver's credentials).
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    /// Written out as [`REDACTED`]: a configuration dumped for a report or a support ticket
    /// carries no secret (and cannot be loaded back with one).
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_never_shown() {
        let secret = Secret::new("hunter2");
        for shown in [
            format!("{secret:?}"),
            format!("{secret}"),
            format!("{:?}", Some(&secret)),
            serde_json::to_string(&secret).expect("serializes"),
        ] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains(REDACTED), "{shown}");
        }
        assert_eq!(secret.expose(), "hunter2");
        let read: Secret = serde_json::from_str("\"s3cret\"").expect("a string");
        assert_eq!(read.expose(), "s3cret");
    }
}
