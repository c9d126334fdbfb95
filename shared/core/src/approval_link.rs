//! Approval links (issue 42, part 4): a signed, expiring, single-use token that lets a person
//! approve or reject one BLOCKED command without a console login — from Slack, an email, a
//! ticket. The token is the credential, so it says exactly what it may decide:
//!
//! - the command: its run id and command key;
//! - what the person saw: the arguments' canonical hash ([`link_binding`]), so a command whose
//!   arguments were edited since the link was issued is not decided by it;
//! - under which policy: the catalog's policy version when the link was issued, so a link
//!   issued under rules since changed is not used to approve under the new ones;
//! - until when: an expiry, at most [`MAX_EXPIRES_S`] after issue;
//! - which link: a random id, consumed in the ledger with its first decision (single use).
//!
//! The token: `v1.<claims>.<mac>`, both parts base64url without padding; the claims are JSON,
//! the MAC is HMAC-SHA256 under the configured key over `sluice-approval-link-v1\n<claims>`.
//! Verifying compares MACs in constant time (`hmac`'s `verify_slice`). Nothing here reads a
//! clock or draws a random number: the producer passes both in.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::command::Command;
use crate::time::Timestamp;

/// Shortest life a link may be given, in seconds.
pub const MIN_EXPIRES_S: u64 = 60;
/// Longest life a link may be given, in seconds: 7 days.
pub const MAX_EXPIRES_S: u64 = 7 * 24 * 3_600;
/// A link's life when none is asked for: 24 hours.
pub const DEFAULT_EXPIRES_S: u64 = 24 * 3_600;
/// Bytes of a signing key at least: HMAC-SHA256's own output length.
pub const MIN_KEY_BYTES: usize = 32;
/// Longest token accepted before decoding, in bytes (a real one is a few hundred).
pub const MAX_TOKEN_BYTES: usize = 4_096;

const VERSION: &str = "v1";
const DOMAIN: &[u8] = b"sluice-approval-link-v1\n";

/// What a link is bound to: the command and the state of it the approver is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub run_id: String,
    pub command_key: String,
    pub args_hash: String,
    pub policy_version: String,
}

/// The binding of a link to `command` under the catalog's current `policy_version`: the one
/// place that says which of the command's arguments a link approves. (With argument revisions
/// that is the latest revision's hash: `Command::current_args_hash`.)
pub fn link_binding(command: &Command, policy_version: &str) -> Binding {
    Binding {
        run_id: command.run_id.to_string(),
        command_key: command.command_key.to_string(),
        args_hash: command.current_args_hash().to_string(),
        policy_version: policy_version.to_owned(),
    }
}

/// What a token carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// The link's id: random, recorded in the audit chain (never the token) and consumed once.
    pub id: String,
    pub run_id: String,
    pub command_key: String,
    pub args_hash: String,
    pub policy_version: String,
    /// Milliseconds since the epoch.
    pub issued_at: i64,
    /// Milliseconds since the epoch; the link is refused from this instant on.
    pub expires_at: i64,
    /// Who created the link (the caller's token name).
    pub issuer: String,
    /// Who the link is meant for, as its issuer wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient: Option<String>,
}

impl Claims {
    /// The claims of a new link to `binding`, issued at `now` for `expires_in_s` seconds.
    pub fn new(
        id: String,
        binding: Binding,
        now: Timestamp,
        expires_in_s: u64,
        issuer: String,
        recipient: Option<String>,
    ) -> Self {
        let life = i64::try_from(expires_in_s.saturating_mul(1_000)).unwrap_or(i64::MAX);
        Self {
            id,
            run_id: binding.run_id,
            command_key: binding.command_key,
            args_hash: binding.args_hash,
            policy_version: binding.policy_version,
            issued_at: now.as_millis(),
            expires_at: now.as_millis().saturating_add(life),
            issuer,
            recipient,
        }
    }

    /// The actor a decision by this link is recorded as in the audit chain: `link:<id>`, with
    /// whom it was for and who issued it.
    pub fn actor(&self) -> String {
        match &self.recipient {
            Some(recipient) => format!(
                "link:{} (for {recipient}, issued by {})",
                self.id, self.issuer
            ),
            None => format!("link:{} (issued by {})", self.id, self.issuer),
        }
    }

    /// Whether the command as it is now (`current`) is still the one the link was issued
    /// for; which difference, if not. The command itself is checked first, then its
    /// arguments, then the policy.
    pub fn check(&self, current: &Binding) -> Result<(), Gone> {
        if self.run_id != current.run_id || self.command_key != current.command_key {
            return Err(Gone::Forged);
        }
        if self.args_hash != current.args_hash {
            return Err(Gone::Edited);
        }
        if self.policy_version != current.policy_version {
            return Err(Gone::Repolicied);
        }
        Ok(())
    }
}

/// Why a link no longer decides anything (answered 410 Gone, nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Gone {
    /// Not a token this deployment signed (altered, truncated, another key, another command).
    #[error("this link is not valid: it was not issued by this Sluice, or it was altered")]
    Forged,
    #[error("this link has expired")]
    Expired,
    #[error("this link was already used: a link decides once")]
    Used,
    #[error("the command's arguments changed since this link was issued; ask for a new link")]
    Edited,
    #[error("the approval policy changed since this link was issued; ask for a new link")]
    Repolicied,
    #[error("the command is no longer waiting for approval")]
    Decided,
}

impl Gone {
    /// A stable code for the API and the page.
    pub fn code(self) -> &'static str {
        match self {
            Self::Forged => "link_invalid",
            Self::Expired => "link_expired",
            Self::Used => "link_used",
            Self::Edited => "link_edited",
            Self::Repolicied => "link_repolicied",
            Self::Decided => "link_decided",
        }
    }
}

/// Why a signing key is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an approval-link key must be at least {MIN_KEY_BYTES} bytes")]
pub struct ShortKey;

/// The key that signs and verifies links. Every producer replica holds the same one, so any
/// replica verifies any replica's links.
#[derive(Clone)]
pub struct LinkKey(Hmac<Sha256>);

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(<redacted>)")
    }
}

impl LinkKey {
    pub fn new(secret: &[u8]) -> Result<Self, ShortKey> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(ShortKey);
        }
        Ok(Self(
            <Hmac<Sha256> as KeyInit>::new_from_slice(secret).map_err(|_| ShortKey)?,
        ))
    }

    fn mac(&self, claims_b64: &str) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(DOMAIN);
        mac.update(claims_b64.as_bytes());
        mac
    }

    /// The token of `claims`.
    pub fn sign(&self, claims: &Claims) -> String {
        let json = serde_json::to_vec(claims).expect("claims serialize");
        let body = URL_SAFE_NO_PAD.encode(json);
        let tag = URL_SAFE_NO_PAD.encode(self.mac(&body).finalize().into_bytes());
        format!("{VERSION}.{body}.{tag}")
    }

    /// The claims of `token` if this key signed it and it has not expired at `now`. A token
    /// that does not verify is [`Gone::Forged`] whatever else is wrong with it; only a
    /// verified one is read.
    pub fn open(&self, token: &str, now: Timestamp) -> Result<Claims, Gone> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Gone::Forged);
        }
        let mut parts = token.split('.');
        let (Some(VERSION), Some(body), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Gone::Forged);
        };
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Gone::Forged)?;
        self.mac(body)
            .verify_slice(&tag)
            .map_err(|_| Gone::Forged)?;
        let json = URL_SAFE_NO_PAD.decode(body).map_err(|_| Gone::Forged)?;
        let claims: Claims = serde_json::from_slice(&json).map_err(|_| Gone::Forged)?;
        if now.as_millis() >= claims.expires_at {
            return Err(Gone::Expired);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn binding() -> Binding {
        Binding {
            run_id: "run-1".into(),
            command_key: "pay/0".into(),
            args_hash: "sha256:aa".into(),
            policy_version: "p1".into(),
        }
    }

    fn claims(now: i64, life_s: u64) -> Claims {
        Claims::new(
            "l-1".into(),
            binding(),
            Timestamp::from_millis(now),
            life_s,
            "ops".into(),
            Some("alice@example.com".into()),
        )
    }

    #[test]
    fn a_signed_link_opens_with_its_claims_until_it_expires() {
        let key = LinkKey::new(SECRET).expect("key");
        let token = key.sign(&claims(1_000, 60));
        assert!(token.starts_with("v1."), "{token}");
        let opened = key
            .open(&token, Timestamp::from_millis(60_999))
            .expect("open");
        assert_eq!(opened, claims(1_000, 60));
        assert_eq!(opened.check(&binding()), Ok(()));
        assert_eq!(
            key.open(&token, Timestamp::from_millis(61_000)),
            Err(Gone::Expired)
        );
    }

    #[test]
    fn a_link_altered_or_signed_with_another_key_is_forged() {
        let key = LinkKey::new(SECRET).expect("key");
        let other = LinkKey::new(b"another key of thirty-two bytes!!").expect("key");
        let now = Timestamp::from_millis(2_000);
        let token = key.sign(&claims(1_000, 60));
        assert_eq!(other.open(&token, now), Err(Gone::Forged));
        // The claims changed (a later expiry) under the original MAC.
        let mut longer = claims(1_000, 60);
        longer.expires_at += 1_000_000;
        let forged_body = key.sign(&longer);
        let (_, body_and_tag) = forged_body.split_once('.').expect("dot");
        let (body, _) = body_and_tag.split_once('.').expect("dot");
        let (_, tag) = token.rsplit_once('.').expect("dot");
        assert_eq!(
            key.open(&format!("v1.{body}.{tag}"), now),
            Err(Gone::Forged)
        );
        for bad in [
            "",
            "v1",
            "v1..",
            "v2.a.b",
            "v1.a.b.c",
            &token[..token.len() - 2],
        ] {
            assert_eq!(key.open(bad, now), Err(Gone::Forged), "{bad:?}");
        }
        // An expired forgery is forged, not expired: nothing unverified is read.
        let later = Timestamp::from_millis(10_000_000);
        assert_eq!(other.open(&token, later), Err(Gone::Forged));
    }

    #[test]
    fn a_link_names_what_changed_since_it_was_issued() {
        let issued = claims(0, 60);
        let mut edited = binding();
        edited.args_hash = "sha256:bb".into();
        assert_eq!(issued.check(&edited), Err(Gone::Edited));
        let mut repolicied = binding();
        repolicied.policy_version = "p2".into();
        assert_eq!(issued.check(&repolicied), Err(Gone::Repolicied));
        let mut other = binding();
        other.command_key = "pay/1".into();
        assert_eq!(issued.check(&other), Err(Gone::Forged));
    }

    #[test]
    fn a_short_key_is_refused_and_a_key_never_shows() {
        assert_eq!(LinkKey::new(b"short").err(), Some(ShortKey));
        let key = LinkKey::new(SECRET).expect("key");
        assert!(!format!("{key:?}").contains("0123"));
    }

    #[test]
    fn the_actor_names_the_link_its_recipient_and_its_issuer() {
        assert_eq!(
            claims(0, 60).actor(),
            "link:l-1 (for alice@example.com, issued by ops)"
        );
        let mut anonymous = claims(0, 60);
        anonymous.recipient = None;
        assert_eq!(anonymous.actor(), "link:l-1 (issued by ops)");
    }
}
