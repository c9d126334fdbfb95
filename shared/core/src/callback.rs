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
use sha2::{Digest, Sha256};

use crate::time::Timestamp;

/// The shortest signing key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

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
