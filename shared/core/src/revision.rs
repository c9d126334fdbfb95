//! Edit and approve: an approver who sees the wrong beneficiary or amount corrects the
//! arguments of a BLOCKED command as they approve it, and the correction is recorded as a
//! **revision** of the same command (docs/decisions.md, "An edit keeps the effect's key").
//!
//! A revision never makes a second effect: the run, the command key, the idempotency key, the
//! tool and the tenant stay; only the arguments change, and the dispatcher sends the latest
//! ([`crate::command::Command::current_args`]). The submitted arguments and their hash stay
//! the command's identity, so an agent re-driving with what it first submitted (or with the
//! edited arguments) is answered with the edited command, never 409.
//!
//! [`revise`] makes a revision from new arguments and [`check`] decides whether policy lets it
//! stand: new arguments must pass the tool's schema (checked by the caller, with the same
//! validation as a submission) and policy is evaluated again on them (`crate::policy`) — a rule
//! or knob that now *denies* refuses the edit, and one that *requires approval* is covered by
//! the approval being given. Budgets are re-counted by the ledger (`crate::budget`): the hold
//! moves from the old amount to the new one, or the edit is refused.
//!
//! A changed field the schema marks secret (`writeOnly`, or `format: "password"`) is listed by
//! pointer only: its old and new values never reach the command's record, the audit chain or
//! the agent.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::catalog::Tool;
use crate::command::{Approval, Command};
use crate::ids::ArgsHash;
use crate::policy::{self, PolicyDecision, RuleInput};
use crate::time::Timestamp;

/// Most revisions one command may have: each is kept in its state.
pub const MAX_REVISIONS: usize = 16;

/// What happened to one argument field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

/// One changed field of a revision, by JSON pointer into the arguments.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub pointer: String,
    pub kind: ChangeKind,
    /// The value before (absent when added, or secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<Value>,
    /// The value after (absent when removed, or secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<Value>,
    /// The schema marks the field secret: its values are not kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

/// One edit of a command's arguments by a person, as they approved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revision {
    /// 1 for the first edit.
    pub number: u32,
    /// The arguments the command is now dispatched with.
    pub args: Arc<Value>,
    /// Their canonical hash (`crate::canonical::args_hash`).
    pub args_hash: ArgsHash,
    /// The hash of the arguments it replaced (the submitted ones for revision 1).
    pub previous_hash: ArgsHash,
    pub changes: Vec<Change>,
    /// Who edited (their token's name).
    pub by: String,
    /// Why, as they wrote it.
    pub reason: String,
    pub at: Timestamp,
}

impl Revision {
    /// What the audit chain and the lifecycle record of the edit: hashes and changes, never
    /// the full arguments.
    pub fn summary(&self) -> Value {
        serde_json::json!({
            "revision": self.number,
            "args_hash": self.args_hash,
            "previous_hash": self.previous_hash,
            "changes": self.changes,
            "by": self.by,
            "reason": self.reason,
        })
    }

    /// The changed pointers, for a reason line.
    pub fn pointers(&self) -> String {
        self.changes
            .iter()
            .map(|change| change.pointer.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Why an edit is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditRefusal {
    #[error("the new arguments are the command's current ones: nothing to edit")]
    Unchanged,
    #[error("the command has {0} revisions already, the most one may have")]
    TooMany(usize),
    #[error("policy denies the edited arguments: {reason}")]
    Denied { reason: String },
}

impl EditRefusal {
    pub fn code(&self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged_arguments",
            Self::TooMany(_) => "too_many_revisions",
            Self::Denied { .. } => "policy_denied",
        }
    }
}

/// The revision that replaces `command`'s current arguments with `args`, by `by` for `reason`
/// at `now`; `tool` tells which fields are secret.
pub fn revise(
    command: &Command,
    tool: &Tool,
    args: Value,
    by: &str,
    reason: &str,
    now: Timestamp,
) -> Result<Revision, EditRefusal> {
    let current = command.current_args();
    let args_hash = crate::canonical::args_hash(&args);
    if &args_hash == command.current_args_hash() {
        return Err(EditRefusal::Unchanged);
    }
    let made = command.state.revisions.len();
    if made >= MAX_REVISIONS {
        return Err(EditRefusal::TooMany(made));
    }
    let mut changes = Vec::new();
    diff(
        tool.schema(),
        "",
        Some(current),
        Some(&args),
        false,
        &mut changes,
    );
    Ok(Revision {
        number: u32::try_from(made + 1).unwrap_or(u32::MAX),
        args: Arc::new(args),
        args_hash,
        previous_hash: command.current_args_hash().clone(),
        changes,
        by: by.to_owned(),
        reason: reason.to_owned(),
        at: now,
    })
}

/// Policy on the edited arguments, as the command would be dispatched with them and the
/// approval being given (`approval`): a deny refuses the edit; anything else lets it stand
/// (a rule requiring approval is covered by this very approval).
pub fn check(
    command: &Command,
    tool: &Tool,
    revision: &Revision,
    approval: &Approval,
    current_policy_version: &str,
    now: Timestamp,
) -> Result<PolicyDecision, EditRefusal> {
    let input = RuleInput {
        args: &revision.args,
        ..RuleInput::of(command, now)
    };
    match policy::evaluate(tool, &input, Some(approval), current_policy_version) {
        PolicyDecision::Deny { reason } => Err(EditRefusal::Denied { reason }),
        decision => Ok(decision),
    }
}

/// Whether the schema at `pointer`'s property marks it secret.
fn is_secret(schema: &Value) -> bool {
    schema.get("writeOnly") == Some(&Value::Bool(true))
        || schema.get("format").and_then(Value::as_str) == Some("password")
}

fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The changes from `old` to `new` under `pointer`, objects compared field by field, anything
/// else whole; `schema` is the schema at `pointer` (`Null` when unknown).
fn diff(
    schema: &Value,
    pointer: &str,
    old: Option<&Value>,
    new: Option<&Value>,
    secret: bool,
    out: &mut Vec<Change>,
) {
    let secret = secret || is_secret(schema);
    if let (Some(Value::Object(old)), Some(Value::Object(new))) = (old, new) {
        let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let below = schema
                .get("properties")
                .and_then(|properties| properties.get(key))
                .unwrap_or(&Value::Null);
            diff(
                below,
                &format!("{pointer}/{}", escape(key)),
                old.get(key),
                new.get(key),
                secret,
                out,
            );
        }
        return;
    }
    let kind = match (old, new) {
        (None, None) => return,
        (Some(old), Some(new)) if old == new => return,
        (None, Some(_)) => ChangeKind::Added,
        (Some(_), None) => ChangeKind::Removed,
        (Some(_), Some(_)) => ChangeKind::Changed,
    };
    let shown = |value: Option<&Value>| if secret { None } else { value.cloned() };
    out.push(Change {
        pointer: pointer.to_owned(),
        kind,
        old: shown(old),
        new: shown(new),
        secret,
    });
}

#[cfg(test)]
mod tests;
