//! Evidence that comes to Sluice: an upstream's signed webhook (Stripe's `charge.succeeded`, a
//! settlement, an e-signature's completion) that says what became of an effect, received on
//! `POST /v1/evidence/{source}` and applied through the state machine exactly as a status
//! check's answer would be ([`crate::machine::Event::Evidence`]).
//!
//! This module holds the pure parts: the declarations ([`EvidenceSource`], [`ToolEvidence`],
//! read from the catalog by `catalog::evidence`), the signature check of each scheme
//! ([`verify`]), what an event says ([`ToolEvidence::read`]) and what of it is kept as evidence
//! ([`kept`]). The producer reads the secret and carries out the rest.
//!
//! Schemes (docs/security.md, "Evidence by webhook"):
//! * `stripe`: `Stripe-Signature: t=<unix s>,v1=<hex>[,v1=…]`, HMAC-SHA256 of `t.body` under
//!   the endpoint's signing secret (`whsec_…`, used as text, as Stripe does);
//! * `standard_webhooks`: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64>`,
//!   HMAC-SHA256 of `id.timestamp.body` under the `whsec_<base64>` key's bytes;
//! * `hmac`: a named header holding the hex (or base64) HMAC-SHA256 of the body under the
//!   secret's text, with no timestamp: replays are caught only by the event id.
//!
//! The first two carry a timestamp, refused outside `tolerance_s` of now (either way), so a
//! captured request cannot be replayed later once its event id has aged out.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::catalog::SecretRef;
use crate::time::Timestamp;

/// Largest evidence request body accepted, in bytes: larger is a 413 before anything is read.
pub const MAX_EVIDENCE_BYTES: usize = 256 * 1024;

/// Largest event kept as evidence in the audit chain and the evidence record, in bytes of
/// JSON; a larger one is replaced by a marker with its size and digest.
pub const MAX_KEPT_BYTES: usize = 16 * 1024;

/// Longest upstream reference matched by the ledger's reference index, in bytes: a longer
/// one is neither indexed nor looked up (ids are tens of bytes; the cap keeps an upstream's
/// odd answer out of the index's keys).
pub const MAX_REFERENCE_BYTES: usize = 512;

/// How far a signed timestamp may be from now unless the source says otherwise: Stripe's
/// default of five minutes.
pub const DEFAULT_TOLERANCE_S: u64 = 300;

/// How an inbound source signs its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    Stripe,
    StandardWebhooks,
    Hmac { header: String, encoding: Encoding },
}

impl Scheme {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stripe => "stripe",
            Self::StandardWebhooks => "standard_webhooks",
            Self::Hmac { .. } => "hmac",
        }
    }
}

/// How an `hmac` scheme's header writes the digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Hex,
    Base64,
}

/// `[evidence_sources.<name>]`: where signed events come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceSource {
    pub name: String,
    pub scheme: Scheme,
    /// The signing secret, by reference; read by the producer on every request (a rotated
    /// file is picked up without a restart).
    pub secret: SecretRef,
    pub tolerance_s: u64,
    /// Where the event's id is in the body; `None`: the scheme's (Stripe's `/id`, the
    /// `webhook-id` header), or for `hmac` the body's SHA-256.
    pub event_id_pointer: Option<String>,
}

/// What an event says of an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvidenceOutcome {
    /// The effect committed.
    Present,
    /// The effect did not commit (and the event does not say it was refused).
    Absent,
    /// The upstream says the effect failed: it did not commit.
    Failed,
}

impl EvidenceOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Present => "present",
            Self::Absent => "absent",
            Self::Failed => "failed",
        }
    }
}

/// `[tool.evidence]`: how a source's events name the tool's effects and their outcome.
///
/// An event names its command in one of two ways, tried in this order:
/// * **by key**: the command's idempotency key, where the tool's request put it for the
///   upstream to echo (Stripe's `metadata`) — `key_pointer`;
/// * **by reference**: the upstream's own id of the effect (Stripe's `po_…`, the job id a 202
///   answered with) — `reference_pointer`, looked up in the ledger's reference index, which
///   holds `(tool, reference) → idempotency key` for every reference a command of such a tool
///   stored ([`ToolEvidence::by_reference`]), and checked against the command's own
///   `external_ref`.
///
/// An event that carries a key where the tool looks is matched by that key alone; one that
/// carries none is matched by its reference. A tool declares at least one of the two
/// pointers (checked at load).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolEvidence {
    /// An `[evidence_sources.<name>]`.
    pub source: String,
    /// JSON pointer to the command's idempotency key (`<run_id>/<command_key>`), which the
    /// tool's request puts where the upstream echoes it (Stripe: `metadata`). `None`: the
    /// upstream echoes no key, and events are matched by reference only.
    pub key_pointer: Option<String>,
    /// JSON pointer to the upstream's reference of the effect: how an event without a key is
    /// matched to its command, and kept as the command's `external_ref` when the event says
    /// present.
    pub reference_pointer: Option<String>,
    /// JSON pointer to the value that says the outcome (Stripe: `/type`).
    pub outcome_pointer: String,
    pub present: Vec<String>,
    pub absent: Vec<String>,
    pub failed: Vec<String>,
}

/// What one event says, read by a tool's declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The idempotency key as the event wrote it; `None`: it carries none where the tool
    /// looks (or the tool declares no `key_pointer`), and is matched by `external_ref`.
    pub key: Option<String>,
    /// `None`: the outcome value is none the tool lists (a `charge.updated`): nothing to apply.
    pub outcome: Option<EvidenceOutcome>,
    pub outcome_value: String,
    /// The upstream's reference of the effect, where `reference_pointer` says.
    pub external_ref: Option<String>,
}

/// A pointer's value as text: a string as it is, a number or a boolean written out.
pub(crate) fn text_at(event: &Value, pointer: &str) -> Option<String> {
    match event.pointer(pointer)? {
        Value::String(text) => Some(text.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    }
}

impl ToolEvidence {
    /// Whether events may name the tool's effects by the upstream's reference: it declares
    /// `reference_pointer`. Only such a tool's commands are written to the ledger's reference
    /// index when they store a reference; every other tool's writes cost nothing more.
    pub fn by_reference(&self) -> bool {
        self.reference_pointer.is_some()
    }

    /// What `event` says by this declaration; `None` when it names neither a key nor a
    /// reference where the tool looks (an event of another tool, or of something Sluice did
    /// not send). An empty key or reference is none.
    pub fn read(&self, event: &Value) -> Option<Reading> {
        let key = self
            .key_pointer
            .as_deref()
            .and_then(|pointer| text_at(event, pointer))
            .filter(|key| !key.is_empty());
        let external_ref = self
            .reference_pointer
            .as_deref()
            .and_then(|pointer| text_at(event, pointer))
            .filter(|reference| !reference.is_empty());
        if key.is_none() && external_ref.is_none() {
            return None;
        }
        let outcome_value = text_at(event, &self.outcome_pointer).unwrap_or_default();
        let listed = |values: &[String]| values.contains(&outcome_value);
        let outcome = if listed(&self.present) {
            Some(EvidenceOutcome::Present)
        } else if listed(&self.failed) {
            Some(EvidenceOutcome::Failed)
        } else if listed(&self.absent) {
            Some(EvidenceOutcome::Absent)
        } else {
            None
        };
        Some(Reading {
            key,
            outcome,
            outcome_value,
            external_ref,
        })
    }
}

/// Why a request's signature was not accepted. Never quotes a secret or a signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the {0} header is missing")]
    Missing(&'static str),
    #[error("the {header} header is malformed: {why}")]
    Malformed { header: String, why: &'static str },
    #[error("the signed timestamp is {skew_s} s from now, past the tolerance of {tolerance_s} s")]
    OutsideTolerance { skew_s: i64, tolerance_s: u64 },
    #[error("no signature matches")]
    Mismatch,
    #[error("the source's secret is unusable: {0}")]
    BadSecret(String),
}

/// The request as the verifier sees it: its headers by lower-case name, and the raw body.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    pub headers: &'a std::collections::BTreeMap<String, String>,
    pub body: &'a [u8],
}

impl Signed<'_> {
    fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).cloned()
    }
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length")
}

fn within(source: &EvidenceSource, signed_at: i64, now: Timestamp) -> Result<(), SignatureError> {
    let skew_s = now.as_millis().div_euclid(1_000) - signed_at;
    if skew_s.unsigned_abs() > source.tolerance_s {
        return Err(SignatureError::OutsideTolerance {
            skew_s,
            tolerance_s: source.tolerance_s,
        });
    }
    Ok(())
}

/// Checks a request's signature under `secret` (the source's secret as read) at `now`; on
/// success, the event id the scheme gives, if any (the `webhook-id` header).
pub fn verify(
    source: &EvidenceSource,
    secret: &str,
    request: &Signed<'_>,
    now: Timestamp,
) -> Result<Option<String>, SignatureError> {
    match &source.scheme {
        Scheme::Stripe => {
            let header = request
                .header("stripe-signature")
                .ok_or(SignatureError::Missing("Stripe-Signature"))?;
            let malformed = |why| SignatureError::Malformed {
                header: "Stripe-Signature".into(),
                why,
            };
            let mut timestamp = None;
            let mut signatures = Vec::new();
            for part in header.split(',') {
                match part.trim().split_once('=') {
                    Some(("t", value)) => {
                        timestamp = Some(
                            value
                                .parse::<i64>()
                                .map_err(|_| malformed("t is not a number"))?,
                        );
                    }
                    Some(("v1", value)) => signatures.push(value.to_owned()),
                    _ => {}
                }
            }
            let timestamp = timestamp.ok_or_else(|| malformed("it has no t="))?;
            if signatures.is_empty() {
                return Err(malformed("it has no v1= signature"));
            }
            within(source, timestamp, now)?;
            for signature in signatures {
                let Ok(expected) = hex::decode(&signature) else {
                    continue;
                };
                let mut mac = mac(secret.as_bytes());
                mac.update(timestamp.to_string().as_bytes());
                mac.update(b".");
                mac.update(request.body);
                if mac.verify_slice(&expected).is_ok() {
                    return Ok(None);
                }
            }
            Err(SignatureError::Mismatch)
        }
        Scheme::StandardWebhooks => {
            let id = request
                .header("webhook-id")
                .ok_or(SignatureError::Missing("webhook-id"))?;
            let timestamp = request
                .header("webhook-timestamp")
                .ok_or(SignatureError::Missing("webhook-timestamp"))?;
            let timestamp: i64 =
                timestamp
                    .trim()
                    .parse()
                    .map_err(|_| SignatureError::Malformed {
                        header: "webhook-timestamp".into(),
                        why: "not a number of seconds",
                    })?;
            let header = request
                .header("webhook-signature")
                .ok_or(SignatureError::Missing("webhook-signature"))?;
            within(source, timestamp, now)?;
            let key = crate::webhook::decode_key(secret).map_err(SignatureError::BadSecret)?;
            for candidate in header.split_whitespace() {
                let Some(encoded) = candidate.strip_prefix("v1,") else {
                    continue;
                };
                let Ok(expected) = BASE64.decode(encoded) else {
                    continue;
                };
                let mut mac = mac(&key);
                mac.update(id.as_bytes());
                mac.update(b".");
                mac.update(timestamp.to_string().as_bytes());
                mac.update(b".");
                mac.update(request.body);
                if mac.verify_slice(&expected).is_ok() {
                    return Ok(Some(id));
                }
            }
            Err(SignatureError::Mismatch)
        }
        Scheme::Hmac { header, encoding } => {
            let value = request
                .header(&header.to_ascii_lowercase())
                .ok_or(SignatureError::Missing("signature"))?;
            let value = value.trim();
            // `sha256=<hex>` (GitHub's form) is read as the hex after it.
            let value = value.strip_prefix("sha256=").unwrap_or(value);
            let expected = match encoding {
                Encoding::Hex => hex::decode(value).ok(),
                Encoding::Base64 => BASE64.decode(value).ok(),
            }
            .ok_or_else(|| SignatureError::Malformed {
                header: header.clone(),
                why: "not a digest in the declared encoding",
            })?;
            let mut mac = mac(secret.as_bytes());
            mac.update(request.body);
            mac.verify_slice(&expected)
                .map(|()| None)
                .map_err(|_| SignatureError::Mismatch)
        }
    }
}

/// The event's id: the declared pointer's, else the scheme's (`header_id`, from [`verify`]),
/// else Stripe's `/id`, else the body's SHA-256 (the same body twice is the same event).
pub fn event_id(
    source: &EvidenceSource,
    header_id: Option<String>,
    event: &Value,
    body: &[u8],
) -> Option<String> {
    if let Some(pointer) = &source.event_id_pointer {
        return text_at(event, pointer);
    }
    if let Some(id) = header_id {
        return Some(id);
    }
    match source.scheme {
        Scheme::Stripe => text_at(event, "/id"),
        Scheme::StandardWebhooks | Scheme::Hmac { .. } => {
            Some(format!("sha256:{}", hex::encode(Sha256::digest(body))))
        }
    }
}

/// The event as kept in the evidence record and the audit chain: as sent when small, else a
/// marker with its size and digest. (An upstream's event carries no Sluice secret; the source's
/// secret and the signature headers are never kept.)
pub fn kept(event: &Value, body: &[u8]) -> Value {
    if body.len() <= MAX_KEPT_BYTES {
        event.clone()
    } else {
        serde_json::json!({
            "truncated": true,
            "bytes": body.len(),
            "sha256": hex::encode(Sha256::digest(body)),
        })
    }
}

/// What became of a received event, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// Verified and stored; not yet carried to its command (a crash in between leaves it so,
    /// and the sender's retry carries it then).
    Received,
    /// Settled (or confirmed, or escalated) its command through the state machine.
    Applied,
    /// Matched a command that was not waiting for it (PENDING, LEASED, already settled the
    /// same way): kept with the command, not applied.
    Recorded,
    /// Named no command Sluice knows, or an outcome the tool does not list.
    Unmatched,
}

impl Disposition {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Applied => "applied",
            Self::Recorded => "recorded",
            Self::Unmatched => "unmatched",
        }
    }
}

/// One received event, as the ledger keeps it: unique per (source, event id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceRecord {
    pub source: String,
    pub event_id: String,
    pub received_at: Timestamp,
    pub disposition: Disposition,
    /// The command it names (`<run_id>/<command_key>`), when it names one Sluice knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<EvidenceOutcome>,
    /// What was done, in words: the transition, or why not.
    pub note: String,
    /// The event ([`kept`]).
    pub event: Value,
}

/// How long a record left `received` (its carrier crashed or failed, or is still at it) is
/// taken for one in progress: a repeat within it is answered 503 `in_progress` (never 200, so
/// the sender keeps it and retries); after it, carried out again (the state machine refuses
/// what is settled already).
pub const IN_PROGRESS_MS: i64 = 30_000;

/// Whether a repeat of an event received again at `received_at` finds its first copy (received
/// at `first_received_at` and not yet carried out) still in progress: within
/// [`IN_PROGRESS_MS`] of it.
pub fn still_in_progress(first_received_at: Timestamp, received_at: Timestamp) -> bool {
    received_at.millis_since(first_received_at) < IN_PROGRESS_MS
}

#[cfg(test)]
mod tests;
