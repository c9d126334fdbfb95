//! Deterministic policy: whether a command may run, needs a person's approval first, or is denied.
//!
//! [`evaluate`] is pure, so the producer (at submission) and the dispatcher (after taking the
//! lease, against the *stored* arguments) reach the same answer. An approval counts only under
//! the policy version it was given in: when the catalog's `policy_version` changes, commands
//! that still need approval are blocked again rather than riding on an approval of old rules.

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use crate::catalog::Tool;
use crate::command::Approval;

/// What policy says about one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "snake_case")]
pub enum PolicyDecision {
    Allow,
    /// A person must approve first (the command goes BLOCKED).
    RequireApproval {
        reason: String,
    },
    /// The command must not run at all.
    Deny {
        reason: String,
    },
}

/// Evaluates `tool`'s policy for a command with `command_args`, given its approval (if any)
/// and the catalog's current policy version.
pub fn evaluate(
    tool: &Tool,
    command_args: &Value,
    approval: Option<&Approval>,
    current_policy_version: &str,
) -> PolicyDecision {
    let policy = tool.policy();
    let mut reason = policy
        .requires_approval
        .then(|| format!("tool {} requires approval", tool.name()));

    if let Some(threshold) = &policy.approve_above {
        let field = &threshold.field;
        // Deny rather than guess: a threshold that cannot be evaluated must not let money through,
        // and an approval cannot make a malformed amount meaningful.
        let amount = match command_args.get(field) {
            Some(Value::Number(amount)) => amount,
            Some(other) => {
                return PolicyDecision::Deny {
                    reason: format!(
                        "approve_above needs argument {field} to be a number, not {}",
                        kind(other)
                    ),
                };
            }
            None => {
                return PolicyDecision::Deny {
                    reason: format!("approve_above needs argument {field}, which is missing"),
                };
            }
        };
        if reason.is_none() && exceeds(amount, &threshold.value) {
            reason = Some(format!(
                "{field} = {amount} is above the approval threshold {}",
                threshold.value
            ));
        }
    }

    let Some(reason) = reason else {
        return PolicyDecision::Allow;
    };
    match approval {
        Some(approval) if approval.policy_version == current_policy_version => {
            PolicyDecision::Allow
        }
        Some(approval) => PolicyDecision::RequireApproval {
            reason: format!(
                "{reason}; the approval by {} was given under policy version {}, the current version is {current_policy_version}",
                approval.approver, approval.policy_version
            ),
        },
        None => PolicyDecision::RequireApproval { reason },
    }
}

/// `value > limit`, exactly for integers and as floats otherwise.
fn exceeds(value: &Number, limit: &Number) -> bool {
    let exact = |number: &Number| {
        number
            .as_i64()
            .map(i128::from)
            .or_else(|| number.as_u64().map(i128::from))
    };
    match (exact(value), exact(limit)) {
        (Some(value), Some(limit)) => value > limit,
        // Neither side is NaN: serde_json numbers are always finite.
        _ => value.as_f64().unwrap_or(f64::INFINITY) > limit.as_f64().unwrap_or(f64::INFINITY),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::catalog::Catalog;
    use crate::time::Timestamp;

    fn tool(policy: &str) -> Tool {
        let text = format!(
            r#"
            [[tool]]
            name = "payments/wire"
            semantics = "IDEMPOTENT"
            schema = {{ type = "object", required = ["amount_minor"], properties = {{ amount_minor = {{}} }} }}
            [tool.policy]
            {policy}
            [tool.dispatch]
            url = "http://bank/wires"
            "#
        );
        let catalog = Catalog::from_toml_str(&text, "policy.toml").expect("valid catalog");
        catalog.tools()[0].clone()
    }

    fn approval(version: &str) -> Approval {
        Approval {
            approver: "alice".into(),
            reason: "checked with the customer".into(),
            at: Timestamp::from_millis(1),
            policy_version: version.into(),
        }
    }

    const ABOVE: &str = "approve_above = { field = \"amount_minor\", value = 1000 }";

    #[test]
    fn no_approval_rule_allows() {
        let tool = tool("");
        assert_eq!(
            evaluate(&tool, &json!({"amount_minor": 5}), None, "1"),
            PolicyDecision::Allow
        );
    }

    #[test]
    fn requires_approval_blocks_until_approved_under_the_current_version() {
        let tool = tool("requires_approval = true");
        let args = json!({"amount_minor": 5});
        let PolicyDecision::RequireApproval { reason } = evaluate(&tool, &args, None, "1") else {
            panic!("approval is required");
        };
        assert!(
            reason.contains("payments/wire requires approval"),
            "{reason}"
        );
        assert_eq!(
            evaluate(&tool, &args, Some(&approval("1")), "1"),
            PolicyDecision::Allow
        );
    }

    #[test]
    fn an_approval_under_an_older_policy_version_requires_approval_again() {
        let tool = tool("requires_approval = true");
        let decision = evaluate(
            &tool,
            &json!({"amount_minor": 5}),
            Some(&approval("1")),
            "2",
        );
        let PolicyDecision::RequireApproval { reason } = decision else {
            panic!("an old approval does not count: {decision:?}");
        };
        assert!(reason.contains("policy version 1"), "{reason}");
        assert!(reason.contains("current version is 2"), "{reason}");
    }

    #[test]
    fn approve_above_blocks_only_amounts_above_the_threshold() {
        let tool = tool(ABOVE);
        assert_eq!(
            evaluate(&tool, &json!({"amount_minor": 1000}), None, "1"),
            PolicyDecision::Allow,
            "equal to the threshold is not above it"
        );
        let PolicyDecision::RequireApproval { reason } =
            evaluate(&tool, &json!({"amount_minor": 1001}), None, "1")
        else {
            panic!("above the threshold");
        };
        assert!(reason.contains("amount_minor = 1001"), "{reason}");
        assert_eq!(
            evaluate(
                &tool,
                &json!({"amount_minor": 1001}),
                Some(&approval("1")),
                "1"
            ),
            PolicyDecision::Allow
        );
        assert!(matches!(
            evaluate(&tool, &json!({"amount_minor": 1000.5}), None, "1"),
            PolicyDecision::RequireApproval { .. }
        ));
        assert!(matches!(
            evaluate(&tool, &json!({"amount_minor": u64::MAX}), None, "1"),
            PolicyDecision::RequireApproval { .. }
        ));
    }

    #[test]
    fn a_non_numeric_threshold_field_is_denied_even_with_an_approval() {
        let tool = tool(ABOVE);
        for args in [
            json!({"amount_minor": "5000"}),
            json!({"amount_minor": null}),
            json!({}),
        ] {
            let decision = evaluate(&tool, &args, Some(&approval("1")), "1");
            let PolicyDecision::Deny { reason } = decision else {
                panic!("{args} must be denied, got {decision:?}");
            };
            assert!(reason.contains("amount_minor"), "{reason}");
        }
    }

    #[test]
    fn exceeds_compares_integers_exactly() {
        let big = Number::from(9_007_199_254_740_993_u64);
        let limit = Number::from(9_007_199_254_740_992_u64);
        assert!(exceeds(&big, &limit), "f64 would round these to equal");
        assert!(!exceeds(&limit, &big));
        assert!(exceeds(&Number::from(0), &Number::from(-1)));
    }
}
