//! Deterministic policy: whether a command may run, needs a person's approval first, or is denied.
//!
//! [`evaluate`] is pure, so the producer (at submission) and the dispatcher (after taking the
//! lease, against the *stored* arguments) reach the same answer. An approval counts only under
//! the policy version it was given in: when the catalog's `policy_version` changes, commands
//! that still need approval are blocked again rather than riding on an approval of old rules.

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use crate::budget::BudgetView;
use crate::catalog::{Rule, RuleEffect, RuleScope, Tool};
use crate::command::{Approval, Command};
use crate::ids::ToolName;
use crate::time::Timestamp;

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

/// What a rule's condition sees (`crate::catalog::rules` lists the variables).
#[derive(Debug, Clone, Copy)]
pub struct RuleInput<'a> {
    pub args: &'a Value,
    pub tool: &'a ToolName,
    pub run: &'a str,
    pub tenant: Option<&'a str>,
    pub submitter: Option<&'a str>,
    /// The evaluating component's clock.
    pub now: Timestamp,
    /// The budgets covering the command as the evaluating component read them
    /// ([`RuleInput::with_budgets`]); empty unless one of the tool's rules names `budgets`.
    pub budgets: &'a [BudgetView],
}

impl<'a> RuleInput<'a> {
    /// The input of a recorded command, evaluated at `now`.
    pub fn of(command: &'a Command, now: Timestamp) -> Self {
        Self {
            args: command.current_args(),
            tool: &command.tool,
            run: command.run_id.as_str(),
            tenant: command.tenant.as_deref(),
            submitter: command.submitted_by.as_deref(),
            now,
            budgets: &[],
        }
    }

    /// The same input, with the budgets covering the command as they stand.
    pub fn with_budgets(self, budgets: &'a [BudgetView]) -> Self {
        Self { budgets, ..self }
    }
}

/// What one rule made of one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum RuleVerdict {
    Holds,
    DoesNotHold,
    /// The condition could not be evaluated: a restricting rule counts as holding (its
    /// decision is taken, with this said), an `allow` as not holding.
    Error {
        error: String,
    },
}

/// One rule's verdict, for `sluice catalog explain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleExplained {
    pub rule: String,
    pub scope: &'static str,
    pub when: String,
    pub then: &'static str,
    #[serde(flatten)]
    pub verdict: RuleVerdict,
}

/// Why policy decided as it did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// Every rule that covers the tool, the tool's own first, in declaration order.
    pub rules: Vec<RuleExplained>,
    /// The rule that decided; `None` when no rule held and the tool's `[tool.policy]` knobs
    /// (`requires_approval`, `approve_above`) decided.
    pub decided_by: Option<String>,
    pub decision: PolicyDecision,
}

/// Evaluates `tool`'s policy for a command, given its approval (if any) and the catalog's
/// current policy version.
///
/// Rules combine by what they decide, not by their order, so a broad `allow` can never open
/// what a `deny` or `require_approval` closes: any rule that holds and denies denies (no
/// approval lifts it); else any that holds and requires approval requires it; else any that
/// holds and allows allows, past the tool's `requires_approval` and `approve_above`; else those
/// two knobs decide as before rules existed.
pub fn evaluate(
    tool: &Tool,
    input: &RuleInput<'_>,
    approval: Option<&Approval>,
    current_policy_version: &str,
) -> PolicyDecision {
    if tool.policy_rules().is_empty() {
        return with_approval(knobs(tool, input.args), approval, current_policy_version);
    }
    explain(tool, input, approval, current_policy_version).decision
}

/// [`evaluate`], with every rule's verdict and the one that decided.
pub fn explain(
    tool: &Tool,
    input: &RuleInput<'_>,
    approval: Option<&Approval>,
    current_policy_version: &str,
) -> Explanation {
    // The variables are made once for all of the tool's rules: the arguments' conversion is the
    // costly part of an evaluation.
    let context = context_of(input);
    let rules: Vec<(&Rule, RuleVerdict)> = tool
        .policy_rules()
        .iter()
        .map(|rule| {
            let verdict = match context
                .as_ref()
                .map_err(Clone::clone)
                .and_then(|context| holds(rule, context))
            {
                Ok(true) => RuleVerdict::Holds,
                Ok(false) => RuleVerdict::DoesNotHold,
                Err(error) => RuleVerdict::Error { error },
            };
            (&**rule, verdict)
        })
        .collect();
    let deciding = |effect: RuleEffect| {
        rules.iter().find(|(rule, verdict)| {
            rule.effect() == effect
                && match verdict {
                    RuleVerdict::Holds => true,
                    RuleVerdict::DoesNotHold => false,
                    RuleVerdict::Error { .. } => effect != RuleEffect::Allow,
                }
        })
    };
    let reason_of = |rule: &Rule, verdict: &RuleVerdict| match verdict {
        RuleVerdict::Error { error } => format!(
            "{} (its condition could not be evaluated: {error}; a rule that restricts counts as holding then)",
            rule.reason()
        ),
        RuleVerdict::Holds | RuleVerdict::DoesNotHold => rule.reason(),
    };
    let (decided_by, restriction) = if let Some((rule, verdict)) = deciding(RuleEffect::Deny) {
        (
            Some(rule.name().to_owned()),
            Restriction::Deny(reason_of(rule, verdict)),
        )
    } else if let Some((rule, verdict)) = deciding(RuleEffect::RequireApproval) {
        (
            Some(rule.name().to_owned()),
            Restriction::Approval(reason_of(rule, verdict)),
        )
    } else if let Some((rule, _)) = deciding(RuleEffect::Allow) {
        (Some(rule.name().to_owned()), Restriction::None)
    } else {
        (None, knobs(tool, input.args))
    };
    Explanation {
        rules: rules
            .into_iter()
            .map(|(rule, verdict)| RuleExplained {
                rule: rule.name().to_owned(),
                scope: match rule.scope() {
                    RuleScope::Tool => "tool",
                    RuleScope::Catalog => "catalog",
                },
                when: rule.when().to_owned(),
                then: rule.effect().as_str(),
                verdict,
            })
            .collect(),
        decided_by,
        decision: with_approval(restriction, approval, current_policy_version),
    }
}

/// The variables a condition sees for `input`; why not, when they cannot be made.
pub(crate) fn context_of(input: &RuleInput<'_>) -> Result<cel::Context<'static>, String> {
    let mut context = cel::Context::default();
    let args =
        cel::to_value(AsCel(input.args)).map_err(|error| format!("the arguments: {error}"))?;
    context.add_variable_from_value("args", args);
    context.add_variable_from_value("tool", input.tool.to_string());
    context.add_variable_from_value("run", input.run.to_owned());
    let text =
        |value: Option<&str>| value.map_or(cel::Value::Null, |value| value.to_owned().into());
    context.add_variable_from_value("tenant", text(input.tenant));
    context.add_variable_from_value("submitter", text(input.submitter));
    let now = chrono::DateTime::from_timestamp_millis(input.now.as_millis())
        .ok_or_else(|| format!("the time {} is out of range", input.now.as_millis()))?;
    context.add_variable_from_value("now", cel::Value::Timestamp(now.fixed_offset()));
    let budgets: serde_json::Map<String, Value> = input
        .budgets
        .iter()
        .map(|view| {
            let fields = serde_json::json!({
                "used": view.used,
                "limit": view.limit,
                "remaining": view.remaining(),
                "amount": view.amount,
                "currency": view.currency,
                "window": view.window.as_str(),
            });
            (view.budget.clone(), fields)
        })
        .collect();
    let budgets = cel::to_value(AsCel(&Value::Object(budgets)))
        .map_err(|error| format!("the budgets: {error}"))?;
    context.add_variable_from_value("budgets", budgets);
    Ok(context)
}

/// Whether `rule`'s condition holds in `context` ([`context_of`]); why not, when it cannot be
/// evaluated.
pub(crate) fn holds(rule: &Rule, context: &cel::Context<'_>) -> Result<bool, String> {
    match rule.program().execute(context) {
        Ok(cel::Value::Bool(holds)) => Ok(holds),
        Ok(other) => Err(format!(
            "the condition gives {}, not true or false",
            cel_kind(&other)
        )),
        Err(error) => Err(execution_error(&error)),
    }
}

/// JSON as CEL reads it best: an integer is CEL's `int` (not `uint`, which serde would make of
/// every non-negative one), so `args.amount_minor + 1` and `args.amount_minor > 1` mean what
/// they say; only integers past `int`'s range are `uint`.
struct AsCel<'a>(&'a Value);

impl Serialize for AsCel<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Number(number) => match (number.as_i64(), number.as_u64()) {
                (Some(int), _) => serializer.serialize_i64(int),
                (None, Some(uint)) => serializer.serialize_u64(uint),
                (None, None) => serializer.serialize_f64(number.as_f64().unwrap_or(f64::NAN)),
            },
            Value::Array(items) => serializer.collect_seq(items.iter().map(AsCel)),
            Value::Object(fields) => {
                serializer.collect_map(fields.iter().map(|(name, value)| (name, AsCel(value))))
            }
            other => other.serialize(serializer),
        }
    }
}

fn execution_error(error: &cel::ExecutionError) -> String {
    match error {
        cel::ExecutionError::NoSuchKey(key) => {
            format!("there is no field {key:?} (use has() for a field that may be absent)")
        }
        cel::ExecutionError::NoSuchOverload => "an operator or function is applied to values of \
             types it does not take (a number compared with a string?)"
            .to_owned(),
        other => other.to_string(),
    }
}

fn cel_kind(value: &cel::Value) -> &'static str {
    match value {
        cel::Value::Null => "null",
        cel::Value::Bool(_) => "a boolean",
        cel::Value::Int(_) | cel::Value::UInt(_) | cel::Value::Float(_) => "a number",
        cel::Value::String(_) => "a string",
        cel::Value::List(_) => "a list",
        cel::Value::Map(_) => "a map",
        _ => "a value of another type",
    }
}

/// What a policy requires before an approval is counted.
enum Restriction {
    None,
    Approval(String),
    Deny(String),
}

/// The tool's `requires_approval` and `approve_above`.
fn knobs(tool: &Tool, command_args: &Value) -> Restriction {
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
                return Restriction::Deny(format!(
                    "approve_above needs argument {field} to be a number, not {}",
                    kind(other)
                ));
            }
            None => {
                return Restriction::Deny(format!(
                    "approve_above needs argument {field}, which is missing"
                ));
            }
        };
        if reason.is_none() && exceeds(amount, &threshold.value) {
            reason = Some(format!(
                "{field} = {amount} is above the approval threshold {}",
                threshold.value
            ));
        }
    }
    reason.map_or(Restriction::None, Restriction::Approval)
}

/// The decision once a given approval is counted: only under the current policy version.
fn with_approval(
    restriction: Restriction,
    approval: Option<&Approval>,
    current_policy_version: &str,
) -> PolicyDecision {
    let reason = match restriction {
        Restriction::None => return PolicyDecision::Allow,
        Restriction::Deny(reason) => return PolicyDecision::Deny { reason },
        Restriction::Approval(reason) => reason,
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

    /// Policy for a command of `tool` with `args`, in run `run-1` of no tenant, at time 0.
    fn decide(
        tool: &Tool,
        args: &Value,
        approval: Option<&Approval>,
        version: &str,
    ) -> PolicyDecision {
        evaluate(tool, &input(tool, args), approval, version)
    }

    fn input<'a>(tool: &'a Tool, args: &'a Value) -> RuleInput<'a> {
        RuleInput {
            args,
            tool: tool.name(),
            run: "run-1",
            tenant: None,
            submitter: None,
            now: Timestamp::from_millis(0),
            budgets: &[],
        }
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
            decide(&tool, &json!({"amount_minor": 5}), None, "1"),
            PolicyDecision::Allow
        );
    }

    #[test]
    fn requires_approval_blocks_until_approved_under_the_current_version() {
        let tool = tool("requires_approval = true");
        let args = json!({"amount_minor": 5});
        let PolicyDecision::RequireApproval { reason } = decide(&tool, &args, None, "1") else {
            panic!("approval is required");
        };
        assert!(
            reason.contains("payments/wire requires approval"),
            "{reason}"
        );
        assert_eq!(
            decide(&tool, &args, Some(&approval("1")), "1"),
            PolicyDecision::Allow
        );
    }

    #[test]
    fn an_approval_under_an_older_policy_version_requires_approval_again() {
        let tool = tool("requires_approval = true");
        let decision = decide(
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
            decide(&tool, &json!({"amount_minor": 1000}), None, "1"),
            PolicyDecision::Allow,
            "equal to the threshold is not above it"
        );
        let PolicyDecision::RequireApproval { reason } =
            decide(&tool, &json!({"amount_minor": 1001}), None, "1")
        else {
            panic!("above the threshold");
        };
        assert!(reason.contains("amount_minor = 1001"), "{reason}");
        assert_eq!(
            decide(
                &tool,
                &json!({"amount_minor": 1001}),
                Some(&approval("1")),
                "1"
            ),
            PolicyDecision::Allow
        );
        assert!(matches!(
            decide(&tool, &json!({"amount_minor": 1000.5}), None, "1"),
            PolicyDecision::RequireApproval { .. }
        ));
        assert!(matches!(
            decide(&tool, &json!({"amount_minor": u64::MAX}), None, "1"),
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
            let decision = decide(&tool, &args, Some(&approval("1")), "1");
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
