//! The part of a command that never changes after reservation.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_core::command::{Command, CommandState, EffectSemantics};
use sluice_core::ids::{ArgsHash, BusinessKey, CommandKey, IdempotencyKey, RunId, ToolName};
use sluice_core::time::Timestamp;
use sluice_core::trace::TraceContext;

/// A command's fixed part — everything but its state — stored once, as JSON, by every ledger
/// (the `identity` column of SQLite and CQL alike), so both read and write the same shape.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    run_id: RunId,
    command_key: CommandKey,
    idempotency_key: IdempotencyKey,
    tool: ToolName,
    semantics: EffectSemantics,
    args: Arc<Value>,
    args_hash: ArgsHash,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    business_key: Option<BusinessKey>,
    policy_version: Arc<str>,
    max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    not_before: Option<Timestamp>,
    created_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    submitted_by: Option<Arc<str>>,
    /// Absent from rows written before tenants were stored: those read as their submitter
    /// (`Command::tenant`), or as the anonymous principal when they have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<Arc<str>>,
    /// Absent from rows written before traces were stored: those read as `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace: Option<TraceContext>,
}

impl Identity {
    pub fn of(command: &Command) -> Self {
        Self {
            run_id: command.run_id.clone(),
            command_key: command.command_key.clone(),
            idempotency_key: command.idempotency_key.clone(),
            tool: command.tool.clone(),
            semantics: command.semantics,
            args: command.args.clone(),
            args_hash: command.args_hash.clone(),
            business_key: command.business_key.clone(),
            policy_version: command.policy_version.clone(),
            max_attempts: command.max_attempts,
            not_before: command.not_before,
            created_at: command.created_at,
            submitted_by: command.submitted_by.clone(),
            tenant: command.tenant.clone(),
            trace: command.trace.clone(),
        }
    }

    pub fn command_key(&self) -> &CommandKey {
        &self.command_key
    }

    pub fn with_state(self, state: CommandState) -> Command {
        Command {
            run_id: self.run_id,
            command_key: self.command_key,
            idempotency_key: self.idempotency_key,
            tool: self.tool,
            semantics: self.semantics,
            args: self.args,
            args_hash: self.args_hash,
            business_key: self.business_key,
            policy_version: self.policy_version,
            max_attempts: self.max_attempts,
            not_before: self.not_before,
            created_at: self.created_at,
            // An older row reads as its submitter's, so every command read back names its tenant.
            tenant: Some(self.tenant.unwrap_or_else(|| {
                self.submitted_by
                    .clone()
                    .unwrap_or_else(|| Arc::from(sluice_core::tenant::ANONYMOUS))
            })),
            submitted_by: self.submitted_by,
            trace: self.trace,
            state,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A row written before trace contexts were stored has no `trace` in its identity: it
    /// reads as none, and writing it back adds nothing.
    #[test]
    fn an_identity_without_a_trace_reads_as_none() {
        let old = json!({
            "run_id": "r-1",
            "command_key": "d-1/email/send/0",
            "idempotency_key": "r-1/d-1/email/send/0",
            "tool": "email/send",
            "semantics": "IDEMPOTENT",
            "args": {},
            "args_hash": "0".repeat(64),
            "policy_version": "v1",
            "max_attempts": 3,
            "created_at": "2026-11-25T00:00:00Z",
        });
        let identity: Identity = serde_json::from_value(old).expect("an old row decodes");
        assert_eq!(identity.trace, None);
        let written = serde_json::to_value(&identity).expect("encodes");
        assert!(written.get("trace").is_none(), "{written}");
    }

    /// A row written before tenants were stored reads as its submitter's; one recorded without
    /// authentication as the anonymous principal's. Writing it back adds nothing.
    #[test]
    fn an_identity_without_a_tenant_reads_as_its_submitter() {
        let mut old = json!({
            "run_id": "r-1",
            "command_key": "d-1/email/send/0",
            "idempotency_key": "r-1/d-1/email/send/0",
            "tool": "email/send",
            "semantics": "IDEMPOTENT",
            "args": {},
            "args_hash": "0".repeat(64),
            "policy_version": "v1",
            "max_attempts": 3,
            "created_at": "2026-11-25T00:00:00Z",
        });
        let state =
            || CommandState::reserved(sluice_core::time::Timestamp::from_millis(0), None, 1_000);
        let identity: Identity = serde_json::from_value(old.clone()).expect("decodes");
        assert!(
            serde_json::to_value(&identity)
                .expect("encodes")
                .get("tenant")
                .is_none()
        );
        let anonymous = identity.with_state(state());
        assert_eq!(anonymous.tenant(), "anonymous");
        assert_eq!(anonymous.tenant.as_deref(), Some("anonymous"));
        old["submitted_by"] = json!("bot");
        let identity: Identity = serde_json::from_value(old).expect("decodes");
        let command = identity.with_state(state());
        assert_eq!(command.tenant(), "bot");
        let named = Identity::of(&command.clone().for_tenant("acme")).with_state(state());
        assert_eq!(
            (named.tenant(), named.submitted_by.as_deref()),
            ("acme", Some("bot"))
        );
    }
}
