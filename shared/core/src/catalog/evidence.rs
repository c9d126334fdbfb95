//! `[evidence_sources.<name>]` and `[tool.evidence]`: signed webhooks that say what became of a
//! tool's effects (`crate::evidence`).
//!
//! ```toml
//! [evidence_sources.stripe]
//! scheme = "stripe"                       # stripe | standard_webhooks | hmac
//! secret = { env = "STRIPE_WEBHOOK_SECRET" }
//! tolerance_s = 300                       # signed timestamps this far from now at most
//! # event_id_pointer = "/id"              # default: the scheme's (Stripe /id, webhook-id)
//! # header = "X-Signature"                # hmac only: the header holding the digest
//! # encoding = "hex"                      # hmac only: hex | base64
//!
//! [[tool]]
//! name = "payments/charge"
//! [tool.evidence]
//! source = "stripe"
//! key_pointer = "/data/object/metadata/sluice_key"   # where the event echoes the key
//! reference_pointer = "/data/object/id"              # the upstream's id of the effect
//! outcome_pointer = "/type"
//! present = ["charge.succeeded"]
//! failed = ["charge.failed"]
//! absent = []
//! ```
//!
//! An event is matched to its command by the idempotency key it echoes (`key_pointer`) when
//! it carries one, else by the upstream's reference (`reference_pointer`) through the ledger's
//! reference index (`crate::evidence::ToolEvidence`). An upstream that echoes no key (Stripe's
//! `payout.paid`, a job's completion naming the job id its 202 answered with) needs only
//! `reference_pointer`; a tool declares at least one of the two.
//!
//! Sources are declared once (one endpoint, one secret, many tools); a tool names one. Checked
//! at load, each error naming the file and the source or tool and the key: the source's name
//! is snake_case, its secret a reference, never text; pointers are JSON pointers; a tool's
//! source is declared, it names a key or a reference pointer (or both), and it lists at least
//! one `present` value and no value twice.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

use super::error::CatalogError;
use crate::evidence::{DEFAULT_TOLERANCE_S, Encoding, EvidenceSource, Scheme, ToolEvidence};
use crate::ids::check_snake_case;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    scheme: String,
    secret: toml::Value,
    tolerance_s: Option<u64>,
    event_id_pointer: Option<String>,
    header: Option<String>,
    encoding: Option<Encoding>,
}

/// `[tool.evidence]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawToolEvidence {
    source: String,
    key_pointer: Option<String>,
    reference_pointer: Option<String>,
    outcome_pointer: String,
    #[serde(default)]
    present: Vec<String>,
    #[serde(default)]
    absent: Vec<String>,
    #[serde(default)]
    failed: Vec<String>,
}

fn check_pointer(key: &str, pointer: &str) -> Result<(), String> {
    if pointer.is_empty() || !pointer.starts_with('/') {
        return Err(format!(
            "{key} {pointer:?} is not a JSON pointer (RFC 6901): it starts with \"/\", such as \"/data/object/id\""
        ));
    }
    Ok(())
}

/// Validates `[evidence_sources.<name>]`.
pub(super) fn build_sources(
    raw: BTreeMap<String, toml::Table>,
    file: &str,
    dir: Option<&Path>,
) -> Result<BTreeMap<String, EvidenceSource>, CatalogError> {
    let mut sources = BTreeMap::new();
    for (name, table) in raw {
        let bad = |key: &str, detail: String| CatalogError::BadEvidenceSource {
            file: file.to_owned(),
            source_name: name.clone(),
            key: key.to_owned(),
            detail,
        };
        if let Err(why) = check_snake_case(&name) {
            return Err(bad("name", format!("{name:?} is not a source name: {why}")));
        }
        let raw = RawSource::deserialize(toml::Value::Table(table))
            .map_err(|error| bad("source", super::raw::describe(&error)))?;
        let secret = super::credential::secret_ref("secret", raw.secret, dir)
            .map_err(|detail| bad("secret", detail))?;
        let hmac_only = |key: &str| {
            bad(
                key,
                format!(
                    "only an hmac source names its {key}; {} fixes its own",
                    raw.scheme
                ),
            )
        };
        let scheme = match raw.scheme.as_str() {
            "stripe" | "standard_webhooks" => {
                if raw.header.is_some() {
                    return Err(hmac_only("header"));
                }
                if raw.encoding.is_some() {
                    return Err(hmac_only("encoding"));
                }
                if raw.scheme == "stripe" {
                    Scheme::Stripe
                } else {
                    Scheme::StandardWebhooks
                }
            }
            "hmac" => {
                let header = raw.header.clone().ok_or_else(|| {
                    bad(
                        "header",
                        "an hmac source names the header that holds the digest, such as header = \"X-Signature\"".into(),
                    )
                })?;
                if header.is_empty()
                    || !header
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(bad("header", format!("{header:?} is not a header name")));
                }
                Scheme::Hmac {
                    header,
                    encoding: raw.encoding.unwrap_or(Encoding::Hex),
                }
            }
            other => {
                return Err(bad(
                    "scheme",
                    format!(
                        "{other:?} is not a signature scheme: stripe, standard_webhooks or hmac"
                    ),
                ));
            }
        };
        if let Some(pointer) = &raw.event_id_pointer {
            check_pointer("event_id_pointer", pointer)
                .map_err(|detail| bad("event_id_pointer", detail))?;
        }
        let tolerance_s = raw.tolerance_s.unwrap_or(DEFAULT_TOLERANCE_S);
        if tolerance_s == 0 || tolerance_s > 3_600 {
            return Err(bad(
                "tolerance_s",
                format!("{tolerance_s} is not between 1 and 3600 seconds"),
            ));
        }
        sources.insert(
            name.clone(),
            EvidenceSource {
                name,
                scheme,
                secret,
                tolerance_s,
                event_id_pointer: raw.event_id_pointer,
            },
        );
    }
    Ok(sources)
}

/// Validates a tool's `[tool.evidence]` (its source is checked against the declared ones by
/// [`check_source`], once every source is read).
pub(super) fn build_tool_evidence(raw: RawToolEvidence) -> Result<ToolEvidence, String> {
    if raw.key_pointer.is_none() && raw.reference_pointer.is_none() {
        return Err(
            "evidence names neither key_pointer nor reference_pointer: an event is matched to its command by the idempotency key it echoes (key_pointer = \"/data/object/metadata/sluice_key\") or by the upstream's reference of the effect (reference_pointer = \"/data/object/id\"); declare at least one"
                .into(),
        );
    }
    if let Some(pointer) = &raw.key_pointer {
        check_pointer("evidence.key_pointer", pointer)?;
    }
    check_pointer("evidence.outcome_pointer", &raw.outcome_pointer)?;
    if let Some(pointer) = &raw.reference_pointer {
        check_pointer("evidence.reference_pointer", pointer)?;
    }
    if raw.present.is_empty() {
        return Err(
            "evidence.present lists no value: name the outcome values that mean the effect committed, such as present = [\"charge.succeeded\"]"
                .into(),
        );
    }
    let mut seen = BTreeSet::new();
    for value in raw.present.iter().chain(&raw.absent).chain(&raw.failed) {
        if !seen.insert(value) {
            return Err(format!(
                "evidence: the outcome value {value:?} is listed twice (present, absent and failed must not overlap)"
            ));
        }
    }
    Ok(ToolEvidence {
        source: raw.source,
        key_pointer: raw.key_pointer,
        reference_pointer: raw.reference_pointer,
        outcome_pointer: raw.outcome_pointer,
        present: raw.present,
        absent: raw.absent,
        failed: raw.failed,
    })
}

/// A tool's evidence source must be declared.
pub(super) fn check_source(
    evidence: &ToolEvidence,
    sources: &BTreeMap<String, EvidenceSource>,
) -> Result<(), String> {
    if sources.contains_key(&evidence.source) {
        Ok(())
    } else {
        Err(format!(
            "evidence.source {:?} is not declared: add [evidence_sources.{}]",
            evidence.source, evidence.source
        ))
    }
}
