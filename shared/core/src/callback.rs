//! Callback tokens for asynchronous tools (`[tool.async]`): the dispatcher gives an upstream
//! that answers 202 a URL `<public_url>/v1/callbacks/<token>`; the upstream POSTs the outcome
//! there. The token is the only credential the call carries, so it says which command it is
//! for and is signed:
//!
//! `base64url(claims JSON) "." base64url(HMAC-SHA256(key, claims JSON))`
//!
//! with the claims the run, the command key, the lease epoch of the attempt that was accepted
//! and an expiry (the tool's deadline plus a margin). Verification is in constant time
//! (`hmac`'s `verify_slice`) and checks the expiry; the service then matches the claims to the
//! command and records the callback once, as evidence whose event id is [`token_id`] — so a
//! second use of a token is a replay, never applied twice, and a forged or expired token
//! changes nothing. The key is at least 32 bytes and never leaves the services.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::catalog::Tool;
use crate::command::Command;
use crate::evidence::{EvidenceOutcome, Reading, text_at};
use crate::time::Timestamp;

/// The shortest signing key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// The path under the producer's public URL that callbacks are POSTed to, before the token.
pub const PATH: &str = "/v1/callbacks/";

/// How long past the tool's deadline a token still verifies: a day. A callback that comes
/// after the deadline is still the upstream's word on the effect (it settles a command the
/// look left UNKNOWN, or confirms what the look found), and an upstream retries a callback it
/// could not deliver for hours; a day covers the retries without keeping tokens alive for long.
pub const EXPIRY_MARGIN_MS: i64 = 86_400_000;

/// The longest a token lives: 30 days, no longer than the ledger keeps a received callback's
/// record (`sluice_ledger::EVIDENCE_RETENTION_MS`), so a token used again is always either
/// found as a replay or refused as expired — never applied a second time.
pub const MAX_LIFETIME_MS: i64 = 30 * 86_400_000;

/// What stands for a token where a callback URL is shown (a dispatch's evidence, a dry run).
pub const REDACTED_TOKEN: &str = "<redacted>";

/// The longest token accepted (checked before anything is decoded).
pub const MAX_TOKEN_CHARS: usize = 2_048;

/// What a callback token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// Run id.
    pub r: String,
    /// Command key.
    pub k: String,
    /// The lease epoch of the accepted attempt.
    pub e: u64,
    /// Expiry, in Unix milliseconds.
    pub x: i64,
}

/// Why a token is refused. The messages never quote the token or the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the callback token is malformed")]
    Malformed,
    #[error("the callback token's signature does not verify")]
    BadSignature,
    #[error("the callback token expired at {0}")]
    Expired(Timestamp),
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// Checks a signing key's length; the error never quotes it.
pub fn check_key(key: &[u8]) -> Result<(), String> {
    if key.len() < MIN_KEY_BYTES {
        return Err(format!(
            "the callback signing key holds {} bytes; it needs at least {MIN_KEY_BYTES}",
            key.len()
        ));
    }
    Ok(())
}

/// Signs `claims` into a token.
pub fn sign(key: &[u8], claims: &Claims) -> String {
    let payload = serde_json::to_vec(claims).expect("claims serialize");
    let mut signer = mac(key);
    signer.update(&payload);
    let signature = signer.finalize().into_bytes();
    format!("{}.{}", B64.encode(&payload), B64.encode(signature))
}

/// Verifies a token's signature and expiry at `now`, and returns its claims.
pub fn verify(key: &[u8], token: &str, now: Timestamp) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_CHARS {
        return Err(TokenError::Malformed);
    }
    let (payload, signature) = token.split_once('.').ok_or(TokenError::Malformed)?;
    let payload = B64.decode(payload).map_err(|_| TokenError::Malformed)?;
    let signature = B64.decode(signature).map_err(|_| TokenError::Malformed)?;
    let mut verifier = mac(key);
    verifier.update(&payload);
    verifier
        .verify_slice(&signature)
        .map_err(|_| TokenError::BadSignature)?;
    let claims: Claims = serde_json::from_slice(&payload).map_err(|_| TokenError::Malformed)?;
    let expires = Timestamp::from_millis(claims.x);
    if now >= expires {
        return Err(TokenError::Expired(expires));
    }
    Ok(claims)
}

/// The claims of the callback URL given to `command`'s dispatch attempt at `now`, for a tool
/// whose deadline is `deadline_ms`: the run, the command key, the attempt's lease epoch, and
/// an expiry [`EXPIRY_MARGIN_MS`] past the deadline (at most [`MAX_LIFETIME_MS`] from now).
pub fn claims_for(command: &Command, deadline_ms: u64, now: Timestamp) -> Claims {
    let deadline_ms = i64::try_from(deadline_ms).unwrap_or(i64::MAX);
    let lifetime = deadline_ms
        .saturating_add(EXPIRY_MARGIN_MS)
        .min(MAX_LIFETIME_MS);
    Claims {
        r: command.run_id.to_string(),
        k: command.command_key.to_string(),
        e: command.epoch().get(),
        x: now.as_millis().saturating_add(lifetime),
    }
}

/// The callback URL of `token` under the producer's public URL `base` (no trailing slash).
pub fn url(base: &str, token: &str) -> String {
    format!("{base}{PATH}{token}")
}

/// What a callback's body says, read by the tool's `[tool.async]` (its own pointers and
/// values, else its `[tool.evidence]`'s); `key` is the command's idempotency key, which the
/// token named. `None` for a tool that is not asynchronous.
pub fn read(tool: &Tool, key: String, body: &Value) -> Option<Reading> {
    let declared = tool.asynchronous()?;
    let evidence = tool.evidence();
    let (pointer, present, absent, failed, borrowed_reference) = match &declared.outcome {
        Some(own) => (
            own.outcome_pointer.as_str(),
            &own.present,
            &own.absent,
            &own.failed,
            None,
        ),
        None => {
            // Checked at load: a tool without its own reading declares [tool.evidence].
            let evidence = evidence?;
            (
                evidence.outcome_pointer.as_str(),
                &evidence.present,
                &evidence.absent,
                &evidence.failed,
                evidence.reference_pointer.as_deref(),
            )
        }
    };
    let outcome_value = text_at(body, pointer).unwrap_or_default();
    let outcome = if present.contains(&outcome_value) {
        Some(EvidenceOutcome::Present)
    } else if failed.contains(&outcome_value) {
        Some(EvidenceOutcome::Failed)
    } else if absent.contains(&outcome_value) {
        Some(EvidenceOutcome::Absent)
    } else {
        None
    };
    let external_ref = declared
        .reference_pointer
        .as_deref()
        .or(borrowed_reference)
        .and_then(|pointer| text_at(body, pointer));
    Some(Reading {
        key: Some(key),
        outcome,
        outcome_value,
        external_ref,
    })
}

/// The id a callback is recorded under as evidence: a digest of the token, so the same token
/// used twice is the same event (a replay), and the token itself is never stored.
pub fn token_id(token: &str) -> String {
    format!(
        "cb_{}",
        hex::encode(&Sha256::digest(token.as_bytes())[..16])
    )
}

/// The evidence source a tool's callbacks are recorded under.
pub fn source_of(tool: &str) -> String {
    format!("callback:{tool}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn claims() -> Claims {
        Claims {
            r: "run-1".into(),
            k: "d-0/payouts.send/0".into(),
            e: 3,
            x: 2_000,
        }
    }

    #[test]
    fn a_signed_token_verifies_to_its_claims_until_it_expires() {
        let token = sign(KEY, &claims());
        assert_eq!(
            verify(KEY, &token, Timestamp::from_millis(1_999)),
            Ok(claims())
        );
        assert_eq!(
            verify(KEY, &token, Timestamp::from_millis(2_000)),
            Err(TokenError::Expired(Timestamp::from_millis(2_000)))
        );
    }

    #[test]
    fn a_forged_or_altered_token_is_refused() {
        let token = sign(KEY, &claims());
        let other_key = b"ffffffffffffffffffffffffffffffff";
        assert_eq!(
            verify(other_key, &token, Timestamp::from_millis(0)),
            Err(TokenError::BadSignature)
        );
        // Claims for another command under the first token's signature.
        let mut other = claims();
        other.k = "d-0/payouts.send/1".into();
        let forged_payload = B64.encode(serde_json::to_vec(&other).expect("json"));
        let signature = token.split_once('.').expect("two parts").1;
        assert_eq!(
            verify(
                KEY,
                &format!("{forged_payload}.{signature}"),
                Timestamp::from_millis(0)
            ),
            Err(TokenError::BadSignature)
        );
        for malformed in ["", "abc", "a.b", &"x".repeat(MAX_TOKEN_CHARS + 1)] {
            assert!(
                matches!(
                    verify(KEY, malformed, Timestamp::from_millis(0)),
                    Err(TokenError::Malformed | TokenError::BadSignature)
                ),
                "{malformed:.20}"
            );
        }
    }

    #[test]
    fn an_attempts_claims_name_its_command_and_epoch_and_outlive_the_deadline_by_a_day() {
        use crate::command::{EffectSemantics, Intent};
        use crate::ids::{CommandKey, LeaseEpoch, RunId};
        let mut command = Command::from_intent(
            Intent {
                run_id: RunId::parse("r-1").expect("valid"),
                command_key: CommandKey::parse("d-1/payouts/send/0").expect("valid"),
                semantics: EffectSemantics::Idempotent,
                args: serde_json::json!({}),
                business_key: None,
                policy_version: "1".into(),
                max_attempts: 3,
                not_before: None,
            },
            Timestamp::from_millis(0),
            10_000,
        );
        command.state.lease.epoch = LeaseEpoch::new(4);
        let now = Timestamp::from_millis(1_000);
        let claims = claims_for(&command, 600_000, now);
        assert_eq!(
            claims,
            Claims {
                r: "r-1".into(),
                k: "d-1/payouts/send/0".into(),
                e: 4,
                x: 1_000 + 600_000 + EXPIRY_MARGIN_MS,
            }
        );
        // Never longer than the records that catch a replay are kept.
        let long = claims_for(&command, u64::MAX, now);
        assert_eq!(long.x, 1_000 + MAX_LIFETIME_MS);
        let token = sign(KEY, &claims);
        assert_eq!(
            url("https://sluice.example.com", &token),
            format!("https://sluice.example.com/v1/callbacks/{token}")
        );
    }

    #[test]
    fn a_tokens_id_is_stable_and_does_not_reveal_it() {
        let token = sign(KEY, &claims());
        assert_eq!(token_id(&token), token_id(&token));
        assert_ne!(
            token_id(&token),
            token_id(&sign(KEY, &Claims { e: 4, ..claims() }))
        );
        assert!(!token_id(&token).contains(&token[..10]));
        assert!(check_key(&KEY[..31]).is_err());
        assert!(check_key(KEY).is_ok());
    }
}
