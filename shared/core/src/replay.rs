//! Whether an operator's replay of a FAILED or STUCK command may go ahead, and why not: the
//! checks beyond the state machine's own (the run's replay budget, the tool still in the
//! catalog, the stored arguments against today's schema, today's policy), typed, so the API
//! reports them without reading its own JSON back.

use crate::catalog::{ArgsError, Tool};
use crate::command::Command;
use crate::ids::ToolName;
use crate::machine::{self, Event, Refusal, Rules, Step};
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
}

impl ReplayCheck {
    pub fn allowed(&self) -> bool {
        self.problems.is_empty()
    }

    /// The replayed command would be blocked for approval by today's policy.
    pub fn would_block(&self) -> bool {
        matches!(self.decision, Some(PolicyDecision::RequireApproval { .. }))
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
    }
}
