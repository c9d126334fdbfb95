//! Whether an operator's replay of a FAILED or STUCK command may go ahead, and why not: the
//! checks beyond the state machine's own (the run's replay budget, the tool still in the
//! catalog, the stored arguments against today's schema, today's policy), typed, so the API
//! reports them without reading its own JSON back.

use crate::catalog::{ArgsError, Tool};
use crate::command::{Command, CommandStatus, EffectSemantics};
use crate::ids::ToolName;
use crate::machine::{self, Action, Event, Refusal, Rules, Step};
use crate::policy::{self, PolicyDecision};
use crate::time::Timestamp;

/// One reason a replay is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayProblem {
    /// The run's commands were replayed `replays` times already, the catalog's limit.
    RunLimit {
        replays: u32,
        limit: u32,
    },
    ToolRemoved {
        tool: ToolName,
    },
    /// The stored arguments no longer fit the tool's schema.
    InvalidArguments {
        tool: ToolName,
        error: ArgsError,
    },
    PolicyDenied {
        reason: String,
    },
    /// The state machine refuses the replay event.
    Refused(Refusal),
}

impl ReplayProblem {
    /// The API's error code for it; a machine refusal's code is the API's to choose.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            Self::RunLimit { .. } => Some("run_replay_limit"),
            Self::ToolRemoved { .. } => Some("tool_removed"),
            Self::InvalidArguments { .. } => Some("invalid_arguments"),
            Self::PolicyDenied { .. } => Some("policy_denied"),
            Self::Refused(_) => None,
        }
    }

    /// What an operator reads.
    pub fn message(&self, run: &str) -> String {
        match self {
            Self::RunLimit { replays, limit } => {
                format!("run {run} was replayed {replays} times already (limit {limit} per run)")
            }
            Self::ToolRemoved { tool } => format!("tool {tool} is no longer in the catalog"),
            Self::InvalidArguments { tool, error } => {
                format!("the stored arguments no longer match the schema of {tool}: {error}")
            }
            Self::PolicyDenied { reason } => format!("policy denies the command: {reason}"),
            Self::Refused(refusal) => refusal.to_string(),
        }
    }
}

/// What checking a replay found.
#[derive(Debug, Clone)]
pub struct ReplayCheck {
    /// Empty: the replay may go ahead.
    pub problems: Vec<ReplayProblem>,
    /// Today's policy for the stored arguments (`None` when the tool is gone).
    pub decision: Option<PolicyDecision>,
    /// The machine's step, when it allows the replay.
    pub step: Option<Step>,
    /// The command's last outcome is unknown ([`outcome_unknown`]).
    pub outcome_unknown: bool,
    /// A resend of it may commit twice (NON_IDEMPOTENT): with its outcome unknown, the
    /// evidence given is recorded as why a second commit is not feared.
    pub may_commit_twice: bool,
    /// The attempts the replayed command has.
    pub max_attempts: u32,
}

/// What a replay does, read off the machine's own step: the dry run shows it, the replay
/// carries the same step out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayNext {
    /// Refused: nothing happens.
    Refused,
    /// The command goes `to`, and the dispatcher blocks it for approval under today's policy.
    BlockedForApproval { to: CommandStatus },
    /// The command goes `to` and is dispatched again with its idempotency key, as attempt
    /// `attempt` of `max_attempts`; `evidence_recorded`: its earlier outcome was unknown and
    /// a resend may commit twice, so the evidence given is recorded as why that is not feared.
    Dispatched {
        to: CommandStatus,
        attempt: u32,
        max_attempts: u32,
        evidence_recorded: bool,
    },
    /// The command goes `to`, asking for nothing more.
    Moves { to: CommandStatus },
}

/// Whether a command replayed from `status` had an unknown outcome (STUCK; a FAILED one is
/// known to have committed nothing): the machine's replay then asks for evidence where a
/// resend could commit twice.
pub fn outcome_unknown(status: CommandStatus) -> bool {
    match status {
        CommandStatus::Stuck => true,
        CommandStatus::Scheduled
        | CommandStatus::Pending
        | CommandStatus::Blocked
        | CommandStatus::Approved
        | CommandStatus::Leased
        | CommandStatus::Confirmed
        | CommandStatus::Failed
        | CommandStatus::Unknown
        | CommandStatus::Cancelled
        | CommandStatus::Compensating
        | CommandStatus::Compensated
        | CommandStatus::CompensationFailed
        | CommandStatus::NoCompensation => false,
    }
}

impl ReplayCheck {
    pub fn allowed(&self) -> bool {
        self.problems.is_empty()
    }

    /// The replayed command would be blocked for approval by today's policy.
    pub fn would_block(&self) -> bool {
        matches!(self.decision, Some(PolicyDecision::RequireApproval { .. }))
    }

    /// The status the replay leaves the command in; `None` when it is refused.
    pub fn to(&self) -> Option<CommandStatus> {
        self.step.as_ref().filter(|_| self.allowed()).map(Step::to)
    }

    /// What the replay does.
    pub fn next(&self) -> ReplayNext {
        let Some(step) = self.step.as_ref().filter(|_| self.allowed()) else {
            return ReplayNext::Refused;
        };
        if self.would_block() {
            return ReplayNext::BlockedForApproval { to: step.to() };
        }
        if step.actions.contains(&Action::Dispatch) {
            return ReplayNext::Dispatched {
                to: step.to(),
                attempt: step.state.attempts + 1,
                max_attempts: self.max_attempts,
                evidence_recorded: self.outcome_unknown && self.may_commit_twice,
            };
        }
        ReplayNext::Moves { to: step.to() }
    }
}

/// The run's replays so far and the catalog's limit per run.
#[derive(Debug, Clone, Copy)]
pub struct RunReplays {
    pub replays: u32,
    pub limit: u32,
}

/// Today's policy, as a replay is checked against it.
#[derive(Debug, Clone, Copy)]
pub struct ReplayPolicy<'a> {
    /// The catalog's policy version now.
    pub version: &'a str,
    /// The budgets covering the command as its rules read them (`BudgetView`; empty unless
    /// one of the tool's rules reads budgets).
    pub budgets: &'a [crate::budget::BudgetView],
}

/// Checks a replay of `command` (of `tool`, which may be gone, with its arguments as stored)
/// under `event` (an `Event::Replay`).
pub fn check(
    command: &Command,
    tool: Option<&Tool>,
    rules: &Rules,
    run: RunReplays,
    policy: ReplayPolicy<'_>,
    event: &Event,
    now: Timestamp,
) -> ReplayCheck {
    let (state, args) = (&command.state, &**command.current_args());
    let mut problems = Vec::new();
    if run.replays >= run.limit {
        problems.push(ReplayProblem::RunLimit {
            replays: run.replays,
            limit: run.limit,
        });
    }
    let decision = match tool {
        None => {
            problems.push(ReplayProblem::ToolRemoved {
                tool: command.tool.clone(),
            });
            None
        }
        Some(tool) => {
            if let Err(error) = tool.validate_args(args) {
                problems.push(ReplayProblem::InvalidArguments {
                    tool: tool.name().clone(),
                    error,
                });
            }
            let decision = policy::evaluate(
                tool,
                &policy::RuleInput::of(command, now).with_budgets(policy.budgets),
                state.approval.as_deref(),
                policy.version,
            );
            if let PolicyDecision::Deny { reason } = &decision {
                problems.push(ReplayProblem::PolicyDenied {
                    reason: reason.clone(),
                });
            }
            Some(decision)
        }
    };
    let step = match machine::apply(state, rules, event, now) {
        Ok(step) => Some(step),
        Err(refusal) => {
            problems.push(ReplayProblem::Refused(refusal));
            None
        }
    };
    ReplayCheck {
        problems,
        decision,
        step,
        outcome_unknown: outcome_unknown(state.status),
        may_commit_twice: command.semantics == EffectSemantics::NonIdempotent,
        max_attempts: rules.max_attempts,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::catalog::Catalog;
    use crate::command::{EffectSemantics, Intent};
    use crate::ids::{CommandKey, RunId};
    use crate::machine::Operator;

    const WIRE: &str = r#"
        policy_version = "1"
        [[tool]]
        name = "payments/wire"
        semantics = "NON_IDEMPOTENT"
        schema = { type = "object", required = ["amount_minor"], properties = { amount_minor = { type = "integer" } } }
        [tool.policy]
        approve_above = { field = "amount_minor", value = 1000 }
        [tool.dispatch]
        url = "http://bank/wires"
        [tool.status_check]
        url = "http://bank/wires/{idempotency_key}"
    "#;

    fn stuck(amount_minor: u64) -> (Tool, Command) {
        let tool = Catalog::from_toml_str(WIRE, "wire.toml")
            .expect("the catalog is valid")
            .tools()[0]
            .clone();
        let mut command = Command::from_intent(
            Intent {
                run_id: RunId::parse("r-1").expect("run"),
                command_key: CommandKey::parse("d-1/payments/wire/0").expect("key"),
                semantics: EffectSemantics::NonIdempotent,
                args: json!({ "amount_minor": amount_minor }),
                business_key: None,
                policy_version: "1".into(),
                max_attempts: 3,
                not_before: None,
            },
            Timestamp::from_millis(1_000),
            60_000,
        );
        command.state.status = CommandStatus::Stuck;
        command.state.attempts = 2;
        (tool, command)
    }

    fn checked(
        tool: &Tool,
        command: &Command,
        evidence: Option<Value>,
        replays: u32,
    ) -> ReplayCheck {
        let event = Event::Replay {
            operator: Operator {
                actor: "ops".into(),
                reason: "replayed: upstream says nothing landed".into(),
            },
            evidence,
        };
        check(
            command,
            Some(tool),
            &tool.rules(),
            RunReplays { replays, limit: 5 },
            ReplayPolicy {
                version: "1",
                budgets: &[],
            },
            &event,
            Timestamp::from_millis(2_000),
        )
    }

    #[test]
    fn a_replay_s_preview_is_read_off_the_machine_s_own_step() {
        let (tool, command) = stuck(10);
        let check = checked(&tool, &command, Some(json!({"bank": "no such wire"})), 0);
        let step = check.step.clone().expect("the machine allows the replay");
        assert_eq!(check.to(), Some(step.to()));
        assert_eq!(
            check.next(),
            ReplayNext::Dispatched {
                to: CommandStatus::Pending,
                attempt: step.state.attempts + 1,
                max_attempts: 3,
                evidence_recorded: true,
            }
        );
        assert_eq!(step.state.attempts, 0, "a replay starts the attempts again");
    }

    #[test]
    fn a_replay_over_a_threshold_is_blocked_and_one_without_evidence_refused() {
        let (tool, command) = stuck(5_000);
        let blocked = checked(&tool, &command, Some(json!({"bank": "no such wire"})), 0);
        assert_eq!(
            blocked.next(),
            ReplayNext::BlockedForApproval {
                to: CommandStatus::Pending
            }
        );
        let refused = checked(&tool, &command, None, 0);
        assert_eq!(refused.next(), ReplayNext::Refused);
        assert_eq!(refused.to(), None);
        assert_eq!(
            refused.problems,
            vec![ReplayProblem::Refused(Refusal::ReplayNeedsEvidence)]
        );
        let over = checked(&tool, &command, Some(json!({"bank": "none"})), 5);
        assert!(over.step.is_some(), "the machine alone would allow it");
        assert_eq!(
            over.next(),
            ReplayNext::Refused,
            "the run's budget refuses it"
        );
    }

    #[test]
    fn only_a_stuck_command_is_replayed_from_an_unknown_outcome() {
        for status in CommandStatus::ALL {
            assert_eq!(outcome_unknown(status), status == CommandStatus::Stuck);
        }
    }
}
