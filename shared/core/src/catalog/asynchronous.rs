//! `[tool.async]`: a tool whose upstream answers "accepted, the outcome comes later" (a 202)
//! and tells the outcome by a callback to a signed URL Sluice gives it, or by its webhook
//! (`[tool.evidence]`).
//!
//! ```toml
//! [[tool]]
//! name = "payouts/send"
//! [tool.async]
//! accepted_status = [202]     # the answers that mean "accepted, outcome later"
//! deadline_ms = 600000        # how long the callback or webhook is awaited
//! then = "look"               # at the deadline: look (the status check) | escalate
//! outcome_pointer = "/status" # in the callback's body; default: [tool.evidence]'s
//! present = ["succeeded"]
//! failed = ["failed"]
//! absent = []
//! reference_pointer = "/id"   # the upstream's reference of the effect in the callback's body,
//! #                           # kept as external_ref on present; default: [tool.evidence]'s
//! #                           # when its pointers are borrowed, else none
//! ```
//!
//! The dispatch request gives the upstream where to report the outcome by naming
//! `{callback_url}` (in its body, a header, the query or the URL): a signed, single-use URL
//! `<public_url>/v1/callbacks/<token>` (`crate::callback`), which only such a tool may name.
//!
//! Checked at load, each error naming the file, the tool and the key: the statuses are 2xx
//! (anything else already means committed, refused or ambiguous), not 200 or 201, listed once;
//! the deadline is positive and at most 30 days; `then = "look"` needs a status check; the
//! callback's outcome is readable — its own `outcome_pointer` with at least one `present`
//! value, or the tool's `[tool.evidence]` to borrow them from; `reference_pointer` is a JSON
//! pointer.

use std::collections::BTreeSet;

use serde::Deserialize;

/// The longest deadline a tool may declare: 30 days.
pub const MAX_DEADLINE_MS: u64 = 30 * 86_400_000;

/// What happens when the deadline passes with no callback or webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AtDeadline {
    /// Ask the tool's status check.
    Look,
    /// A person decides (STUCK).
    Escalate,
}

/// `[tool.async]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAsync {
    accepted_status: Vec<u16>,
    deadline_ms: u64,
    then: AtDeadline,
    outcome_pointer: Option<String>,
    #[serde(default)]
    present: Vec<String>,
    #[serde(default)]
    absent: Vec<String>,
    #[serde(default)]
    failed: Vec<String>,
    reference_pointer: Option<String>,
}

/// How the callback's body tells the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackOutcome {
    pub outcome_pointer: String,
    pub present: Vec<String>,
    pub absent: Vec<String>,
    pub failed: Vec<String>,
}

/// A tool's `[tool.async]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolAsync {
    pub accepted_status: Vec<u16>,
    pub deadline_ms: u64,
    pub then: AtDeadline,
    /// The callback's own reading; `None`: the tool's `[tool.evidence]` pointers and values.
    pub outcome: Option<CallbackOutcome>,
    /// Where the callback's body holds the upstream's reference of the effect; `None`: the
    /// `[tool.evidence]`'s when its reading is borrowed, else none.
    pub reference_pointer: Option<String>,
}

/// Validates `[tool.async]`. `has_status_check` and `has_evidence`: what else the tool
/// declares. Errors name the key (the caller adds the file and the tool).
pub(super) fn build_tool_async(
    raw: RawAsync,
    has_status_check: bool,
    has_evidence: bool,
) -> Result<ToolAsync, String> {
    if raw.accepted_status.is_empty() {
        return Err(
            "async.accepted_status lists no status: name the answers that mean \"accepted, the outcome comes later\", such as accepted_status = [202]"
                .into(),
        );
    }
    let mut seen = BTreeSet::new();
    for status in &raw.accepted_status {
        if !(202..=299).contains(status) {
            return Err(format!(
                "async.accepted_status {status} is not a 2xx status other than 200 and 201 (those mean committed); use 202"
            ));
        }
        if !seen.insert(*status) {
            return Err(format!("async.accepted_status lists {status} twice"));
        }
    }
    if raw.deadline_ms == 0 || raw.deadline_ms > MAX_DEADLINE_MS {
        return Err(format!(
            "async.deadline_ms {} is not between 1 and {MAX_DEADLINE_MS} (30 days)",
            raw.deadline_ms
        ));
    }
    if raw.then == AtDeadline::Look && !has_status_check {
        return Err(
            "async.then = \"look\" needs a status check: declare [tool.status_check], or then = \"escalate\" for a person to decide at the deadline"
                .into(),
        );
    }
    if let Some(pointer) = &raw.reference_pointer
        && !pointer.starts_with('/')
    {
        return Err(format!(
            "async.reference_pointer {pointer:?} is not a JSON pointer (RFC 6901): it starts with \"/\", such as \"/id\""
        ));
    }
    let outcome = match raw.outcome_pointer {
        Some(pointer) => {
            if !pointer.starts_with('/') {
                return Err(format!(
                    "async.outcome_pointer {pointer:?} is not a JSON pointer (RFC 6901): it starts with \"/\", such as \"/status\""
                ));
            }
            if raw.present.is_empty() {
                return Err(
                    "async.present lists no value: name the callback's values that mean the effect committed, such as present = [\"succeeded\"]"
                        .into(),
                );
            }
            let mut seen = BTreeSet::new();
            for value in raw.present.iter().chain(&raw.absent).chain(&raw.failed) {
                if !seen.insert(value) {
                    return Err(format!(
                        "async: the outcome value {value:?} is listed twice (present, absent and failed must not overlap)"
                    ));
                }
            }
            Some(CallbackOutcome {
                outcome_pointer: pointer,
                present: raw.present,
                absent: raw.absent,
                failed: raw.failed,
            })
        }
        None if !raw.present.is_empty() || !raw.absent.is_empty() || !raw.failed.is_empty() => {
            return Err(
                "async lists outcome values but no outcome_pointer: name where the callback's body holds them, such as outcome_pointer = \"/status\""
                    .into(),
            );
        }
        None if !has_evidence => {
            return Err(
                "async: the callback's outcome cannot be read: declare async.outcome_pointer and present (or [tool.evidence], whose pointers it then uses)"
                    .into(),
            );
        }
        None => None,
    };
    Ok(ToolAsync {
        accepted_status: raw.accepted_status,
        deadline_ms: raw.deadline_ms,
        then: raw.then,
        outcome,
        reference_pointer: raw.reference_pointer,
    })
}
