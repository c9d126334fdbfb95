//! The command's copy in a dispatch request (docs/decisions.md, "The dispatcher acts on a
//! signed copy"). On Kafka a dispatcher used to read every command it was asked to dispatch
//! (one CQL read per effect), so that whoever can publish to the topic cannot choose what is
//! called. With `[[bus.copy_keys]]` configured, the producer (and a reconciler's sweep) puts
//! the command as it wrote it, with the ledger's basis for it, in the request's
//! [`COPY_HEADER`], signed with HMAC-SHA256 under a key the services share; a dispatcher that
//! verifies it adopts the copy as its own ledger's hint (`CommandStore::adopt`) and leases or
//! calls from it. A copy that does not verify, names a key not configured, or is older than
//! [`COPY_FRESH_MS`] is not used: the dispatcher reads the command, as without keys.
//!
//! What a copy can and cannot do: it is a hint of the kind `CommandStore::cached` gives, fit
//! only to start a compare-and-set from (a stale one loses it and is read) or to call an
//! IDEMPOTENT tool under its reservation's lease (a stale one costs a repeated call with the
//! same idempotency key and an outcome write that does not apply). Only a holder of a key
//! can make one, and it carries exactly what the producer recorded.
//!
//! The header: `v1.<key id>.<MAC, base64url>.<body, JSON>`, the MAC over
//! `sluice-copy-v1\n<key id>\n<body>`. Key ids have no '.'.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use sluice_config::CopyKey;
use sluice_core::command::{Command, CommandState};
use sluice_core::time::Timestamp;
use sluice_ledger::identity::Identity;

/// The dispatch request's header that holds the signed copy.
pub const COPY_HEADER: &str = "sluice-copy";
/// How old a copy may be and still be used. A request handled within seconds of its
/// publication is the common case; one redelivered later (a dispatcher restarted before its
/// offsets were committed) is likelier to be stale, and is read instead.
pub const COPY_FRESH_MS: i64 = 5_000;
/// Bytes of a header at most: a command's arguments are capped by the API (64 KiB), its
/// result by the ledgers; what is larger is not a copy this build made.
const MAX_HEADER_BYTES: usize = 512 * 1024;

const VERSION: &str = "v1";
const DOMAIN: &[u8] = b"sluice-copy-v1\n";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    identity: Identity,
    state: CommandState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    basis: Option<String>,
    issued_at: Timestamp,
}

/// A verified copy: the command, and the ledger's basis for it if the producer had one.
#[derive(Debug)]
pub struct Copy {
    pub command: Command,
    pub basis: Option<String>,
}

/// Why a copy was not used, for the metric and the log (never the copy itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not in the header's shape, or not a command.
    Malformed,
    /// Signed with a key this process does not hold.
    UnknownKey,
    /// The signature does not match: altered, or made without the key.
    BadSignature,
    /// Older than [`COPY_FRESH_MS`].
    Stale,
    /// Of another command than the request names.
    Mismatch,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownKey => "unknown_key",
            Self::BadSignature => "bad_signature",
            Self::Stale => "stale",
            Self::Mismatch => "mismatch",
        }
    }
}

/// The configured keys: the first signs, all verify.
#[derive(Clone)]
pub struct Copies {
    signing: String,
    keys: HashMap<String, Hmac<Sha256>>,
}

impl std::fmt::Debug for Copies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<&String> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("Copies")
            .field("signing", &self.signing)
            .field("verifying", &ids)
            .finish()
    }
}

impl Copies {
    /// `None` without keys: requests then carry no copy.
    pub fn new(keys: &[CopyKey]) -> Option<Self> {
        let signing = keys.first()?.id.clone();
        let keys = keys
            .iter()
            .map(|key| {
                let mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key.secret.expose().as_bytes())
                    .expect("HMAC takes a key of any length");
                (key.id.clone(), mac)
            })
            .collect();
        Some(Self { signing, keys })
    }

    fn mac(&self, id: &str, body: &[u8]) -> Option<Hmac<Sha256>> {
        let mut mac = self.keys.get(id)?.clone();
        mac.update(DOMAIN);
        mac.update(id.as_bytes());
        mac.update(b"\n");
        mac.update(body);
        Some(mac)
    }

    /// The header for `command` as this process wrote it, with its ledger `basis`.
    pub fn seal(&self, command: &Command, basis: Option<String>, now: Timestamp) -> Vec<u8> {
        let body = serde_json::to_vec(&Body {
            identity: Identity::of(command),
            state: command.state.clone(),
            basis,
            issued_at: now,
        })
        .expect("a command serializes");
        let tag = self
            .mac(&self.signing, &body)
            .expect("the signing key is one of the keys")
            .finalize()
            .into_bytes();
        let mut header = format!(
            "{VERSION}.{}.{}.",
            self.signing,
            URL_SAFE_NO_PAD.encode(tag)
        )
        .into_bytes();
        header.extend_from_slice(&body);
        header
    }

    /// The copy in `header`, verified, for the request naming `command`, at `now`.
    pub fn open(
        &self,
        header: &[u8],
        command: (&sluice_core::ids::RunId, &sluice_core::ids::CommandKey),
        now: Timestamp,
    ) -> Result<Copy, Refused> {
        if header.len() > MAX_HEADER_BYTES {
            return Err(Refused::Malformed);
        }
        let mut parts = header.splitn(4, |&b| b == b'.');
        let (Some(version), Some(id), Some(tag), Some(body)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Refused::Malformed);
        };
        if version != VERSION.as_bytes() {
            return Err(Refused::Malformed);
        }
        let id = std::str::from_utf8(id).map_err(|_| Refused::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| Refused::Malformed)?;
        let mac = self.mac(id, body).ok_or(Refused::UnknownKey)?;
        mac.verify_slice(&tag).map_err(|_| Refused::BadSignature)?;
        let body: Body = serde_json::from_slice(body).map_err(|_| Refused::Malformed)?;
        let age = now.as_millis() - body.issued_at.as_millis();
        if age > COPY_FRESH_MS {
            return Err(Refused::Stale);
        }
        let copy = body.identity.with_state(body.state);
        if (&copy.run_id, &copy.command_key) != command {
            return Err(Refused::Mismatch);
        }
        Ok(Copy {
            command: copy,
            basis: body.basis,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Secret;
    use sluice_ledger::contract::{command, fresh_run};

    fn keys(ids: &[(&str, &str)]) -> Copies {
        let keys: Vec<CopyKey> = ids
            .iter()
            .map(|(id, secret)| CopyKey {
                id: (*id).into(),
                secret: Secret::new(secret.repeat(32)),
            })
            .collect();
        Copies::new(&keys).expect("keys")
    }

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    /// A wire of 5 as decision 1 of `run`.
    fn wire_of(run: &sluice_core::ids::RunId) -> Command {
        command(run, 1, "payments/wire", 0, serde_json::json!({"amount": 5}))
    }

    #[test]
    fn a_copy_opens_as_sealed_and_only_for_its_command() {
        let copies = keys(&[("k1", "a")]);
        let run = fresh_run("copy");
        let wire = wire_of(&run);
        let header = copies.seal(&wire, Some("basis".into()), at(1_000));
        let opened = copies
            .open(&header, (&wire.run_id, &wire.command_key), at(1_500))
            .expect("opens");
        assert_eq!(opened.command, wire);
        assert_eq!(opened.basis.as_deref(), Some("basis"));
        let other = command(&run, 2, "payments/wire", 0, serde_json::json!({}));
        assert_eq!(
            copies
                .open(&header, (&other.run_id, &other.command_key), at(1_500))
                .expect_err("refused"),
            Refused::Mismatch
        );
        assert_eq!(
            copies
                .open(
                    &header,
                    (&wire.run_id, &wire.command_key),
                    at(1_001 + COPY_FRESH_MS)
                )
                .expect_err("refused"),
            Refused::Stale
        );
    }

    #[test]
    fn an_altered_or_foreign_copy_is_refused() {
        let copies = keys(&[("k1", "a")]);
        let run = fresh_run("copy");
        let wire = wire_of(&run);
        let named = (&wire.run_id, &wire.command_key);
        let header = copies.seal(&wire, None, at(0));
        // The amount changed in transit.
        let altered = String::from_utf8(header.clone())
            .expect("text")
            .replace("\"amount\":5", "\"amount\":500")
            .into_bytes();
        assert_ne!(altered, header);
        assert_eq!(
            copies.open(&altered, named, at(0)).expect_err("refused"),
            Refused::BadSignature
        );
        // Made with another secret under the same id, or under an id not configured.
        let forged = keys(&[("k1", "b")]).seal(&wire, None, at(0));
        assert_eq!(
            copies.open(&forged, named, at(0)).expect_err("refused"),
            Refused::BadSignature
        );
        let stranger = keys(&[("k9", "a")]).seal(&wire, None, at(0));
        assert_eq!(
            copies.open(&stranger, named, at(0)).expect_err("refused"),
            Refused::UnknownKey
        );
        for junk in [&b""[..], b"v1.k1", b"v2.k1.AAAA.{}", b"v1.k1.!!!.{}"] {
            assert_eq!(
                copies.open(junk, named, at(0)).expect_err("refused"),
                Refused::Malformed
            );
        }
    }

    #[test]
    fn a_rotated_key_still_verifies_what_it_signed() {
        let old = keys(&[("2026-10", "a")]);
        let rotated = keys(&[("2026-11", "b"), ("2026-10", "a")]);
        let run = fresh_run("copy");
        let wire = command(&run, 1, "payments/wire", 0, serde_json::json!({}));
        let named = (&wire.run_id, &wire.command_key);
        assert!(
            rotated
                .open(&old.seal(&wire, None, at(0)), named, at(0))
                .is_ok()
        );
        let new = rotated.seal(&wire, None, at(0));
        assert!(new.starts_with(b"v1.2026-11."), "the first key signs");
        assert_eq!(
            old.open(&new, named, at(0)).expect_err("refused"),
            Refused::UnknownKey
        );
        assert!(!format!("{rotated:?}").contains(&"b".repeat(32)));
    }
}
