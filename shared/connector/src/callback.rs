//! The callback URLs of asynchronous tools (`sluice_core::callback`): the dispatcher's side.
//!
//! A tool whose dispatch request names `{callback_url}` (only a `[tool.async]` tool may) is
//! given `<public_url>/v1/callbacks/<token>` in that request, the token signed for the attempt
//! being made — the run, the command key, the attempt's lease epoch and an expiry past the
//! tool's deadline (`sluice_core::callback::claims_for`) — at the moment the call is built.
//! Any other tool's call costs nothing here: whether a tool names it is known at load
//! (`Tool::uses_callback_url`).
//!
//! The token is a credential: it is never logged, and what a dispatch leaves in the audit
//! chain (its outcome's reason, the answer's excerpt, an unsendable call's error) is written
//! with the token replaced by `<redacted>` ([`redact`]).

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use sluice_core::Secret;
use sluice_core::callback::{self, REDACTED_TOKEN};
use sluice_core::catalog::Tool;
use sluice_core::command::Command;
use sluice_core::machine::DispatchOutcome;
use sluice_core::time::Clock;

/// Signs callback URLs: the `[callbacks]` key, the producer's public URL and the clock the
/// services read "now" from. Its `Debug` never shows the key.
pub struct CallbackSigner {
    key: Secret,
    /// `public_url` without its trailing slashes.
    base: String,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for CallbackSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallbackSigner")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// One attempt's callback URL and the token in it.
#[derive(Clone, PartialEq, Eq)]
pub struct CallbackUrl {
    pub url: String,
    pub token: String,
}

impl fmt::Debug for CallbackUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CallbackUrl(<redacted>)")
    }
}

impl CallbackSigner {
    /// A signer with `key` (at least 32 bytes; the error never quotes it) for the producer at
    /// `public_url`.
    pub fn new(key: Secret, public_url: &str, clock: Arc<dyn Clock>) -> Result<Self, String> {
        callback::check_key(key.expose().as_bytes())?;
        Ok(Self {
            key,
            base: public_url.trim_end_matches('/').to_owned(),
            clock,
        })
    }

    /// The callback URL of the attempt `command` is making with `tool`; `None` for a tool
    /// whose dispatch does not name it (nothing is signed or allocated then).
    pub fn for_attempt(&self, tool: &Tool, command: &Command) -> Option<CallbackUrl> {
        if !tool.uses_callback_url() {
            return None;
        }
        let declared = tool.asynchronous()?;
        let claims = callback::claims_for(command, declared.deadline_ms, self.clock.now());
        let token = callback::sign(self.key.expose().as_bytes(), &claims);
        Some(CallbackUrl {
            url: callback::url(&self.base, &token),
            token,
        })
    }
}

/// `outcome` with every occurrence of `token` replaced by `<redacted>`: an upstream may echo
/// the URL it was given in its answer, and an unsendable call's error may quote its URL.
pub fn redact(outcome: DispatchOutcome, token: &str) -> DispatchOutcome {
    let text = |reason: String| {
        if reason.contains(token) {
            reason.replace(token, REDACTED_TOKEN)
        } else {
            reason
        }
    };
    match outcome {
        DispatchOutcome::Committed {
            external_ref,
            result,
        } => DispatchOutcome::Committed {
            external_ref: external_ref.map(text),
            result: result.map(|value| {
                if value.to_string().contains(token) {
                    Arc::new(redact_value(&value, token))
                } else {
                    value
                }
            }),
        },
        DispatchOutcome::Refused { reason } => DispatchOutcome::Refused {
            reason: text(reason),
        },
        DispatchOutcome::Ambiguous { reason } => DispatchOutcome::Ambiguous {
            reason: text(reason),
        },
        DispatchOutcome::NotSent { reason } => DispatchOutcome::NotSent {
            reason: text(reason),
        },
        DispatchOutcome::Accepted {
            reason,
            external_ref,
        } => DispatchOutcome::Accepted {
            reason: text(reason),
            external_ref: external_ref.map(text),
        },
        DispatchOutcome::RateLimited {
            reason,
            retry_after_ms,
            refusal,
        } => DispatchOutcome::RateLimited {
            reason: text(reason),
            retry_after_ms,
            refusal,
        },
    }
}

/// Every string of `value` (keys included) with `token` replaced.
fn redact_value(value: &Value, token: &str) -> Value {
    match value {
        Value::String(text) => Value::String(text.replace(token, REDACTED_TOKEN)),
        Value::Array(items) => Value::Array(items.iter().map(|v| redact_value(v, token)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.replace(token, REDACTED_TOKEN), redact_value(v, token)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_text_a_dispatch_leaves_behind_is_written_without_the_token() {
        let token = "eyJyIjoi.c2lnbmF0dXJl";
        let accepted = redact(
            DispatchOutcome::Accepted {
                reason: format!("HTTP 202: {{\"callback\":\"https://s/v1/callbacks/{token}\"}}"),
                external_ref: Some("job_1".into()),
            },
            token,
        );
        assert_eq!(
            accepted,
            DispatchOutcome::Accepted {
                reason: "HTTP 202: {\"callback\":\"https://s/v1/callbacks/<redacted>\"}".into(),
                external_ref: Some("job_1".into()),
            }
        );
        let committed = redact(
            DispatchOutcome::Committed {
                external_ref: Some("po_1".into()),
                result: Some(Arc::new(
                    json!({"id": "po_1", "echo": [format!("x{token}")]}),
                )),
            },
            token,
        );
        let DispatchOutcome::Committed { result, .. } = committed else {
            panic!("still committed");
        };
        assert_eq!(
            result.as_deref(),
            Some(&json!({"id": "po_1", "echo": ["x<redacted>"]}))
        );
        let untouched = DispatchOutcome::Refused {
            reason: "HTTP 400".into(),
        };
        assert_eq!(redact(untouched.clone(), token), untouched);
    }
}
