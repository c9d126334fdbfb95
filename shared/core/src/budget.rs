//! Spend budgets: which budgets cover a command, the counter (budget, scope, window, currency)
//! it counts against, whether it fits, and what a status change does to its hold. Pure; the
//! ledgers carry it out atomically (`sluice_ledger::BudgetStore`).
//!
//! # How a command is counted
//!
//! At admission every budget covering the command's tool (`[budgets.<name>]`, see
//! `catalog::budgets`) gives a [`BudgetLine`]: the amount of the tool's money field, in the
//! field's currency, against the counter of the budget's scope (the run, the tenant or the
//! tool) in the current UTC window. A currency the budget sets no limit for gives no line.
//!
//! * It **fits** when the counter's spend plus the amount stays at or under the limit: the
//!   amount is *held* (reserved) in the same atomic write that checks it.
//! * It **exceeds**: with `on_exceed = "deny"` nothing is recorded and the submission is refused;
//!   with `"require_approval"` the command is recorded BLOCKED with a *deferred* hold that
//!   counts nothing until a person approves it — then it counts, past the limit, because a
//!   person decided so.
//!
//! A hold is keyed by the command (run id and command key), so a retried admission, a
//! replayed write or two producers admitting the same command hold it once; a release is
//! idempotent. [`hold_change`] says what each status change does: ending FAILED, CANCELLED or
//! COMPENSATED releases the hold (nothing was spent, or it was given back); an operator's
//! replay out of those statuses takes it again. A command that ends STUCK, UNKNOWN,
//! COMPENSATION_FAILED or NO_COMPENSATION keeps its hold: it may have committed, so the money
//! stays counted until a person resolves it (resolving it FAILED releases it).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::command::{Command, CommandStatus};
use crate::ids::ToolName;
use crate::time::Timestamp;

/// Whose spend a budget sums.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Each run on its own.
    Run,
    /// Each tenant (a command recorded without one counts as `-`; the producer always
    /// records one, `anonymous` without authentication).
    Tenant,
    /// Each tool, across runs and tenants.
    Tool,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Run => "run",
            Self::Tenant => "tenant",
            Self::Tool => "tool",
        }
    }
}

/// The span of time a budget's spend is summed over, aligned to UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Window {
    Hour,
    Day,
    /// For ever: the window starts at the epoch.
    Total,
}

impl Window {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Total => "total",
        }
    }

    /// The start of the window holding `at`, in milliseconds since the epoch.
    pub fn start(self, at: Timestamp) -> i64 {
        let span: i64 = match self {
            Self::Hour => 3_600_000,
            Self::Day => 86_400_000,
            Self::Total => return 0,
        };
        at.as_millis().div_euclid(span) * span
    }

    /// When the window starting at `start` ends (`None`: never).
    pub fn end(self, start: i64) -> Option<i64> {
        match self {
            Self::Hour => Some(start + 3_600_000),
            Self::Day => Some(start + 86_400_000),
            Self::Total => None,
        }
    }
}

/// What a command that would exceed a budget gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnExceed {
    Deny,
    RequireApproval,
}

impl OnExceed {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deny => "deny",
            Self::RequireApproval => "require_approval",
        }
    }
}

/// A validated `[budgets.<name>]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub name: String,
    /// Tool patterns: `*`, `namespace/*` or a tool name.
    pub tools: Vec<String>,
    /// For each covered tool (by name): the money field counted and its currency.
    pub fields: BTreeMap<String, (String, String)>,
    /// `field` as declared: the money field of every covered tool, when it names one.
    pub field: Option<String>,
    pub scope: Scope,
    pub window: Window,
    /// Minor units per currency.
    pub limits: BTreeMap<String, i64>,
    pub on_exceed: OnExceed,
}

impl Budget {
    /// Whether the budget's patterns cover `tool`.
    pub fn covers(&self, tool: &ToolName) -> bool {
        self.tools.iter().any(|pattern| {
            pattern == "*"
                || match pattern.strip_suffix("/*") {
                    Some(namespace) => namespace == tool.namespace(),
                    None => *pattern == tool.to_string(),
                }
        })
    }

    /// The counter's scope value for `command`: its run, tenant (`-` for none) or tool.
    pub fn scope_value(&self, command: &Command) -> String {
        match self.scope {
            Scope::Run => command.run_id.to_string(),
            Scope::Tenant => command.tenant.as_deref().unwrap_or("-").to_owned(),
            Scope::Tool => command.tool.to_string(),
        }
    }
}

/// One budget's claim on one command: an amount against one counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetLine {
    pub budget: String,
    /// The counter's key: budget, scope value, window start and currency, stable across
    /// replicas and restarts (see [`counter_key`]).
    pub counter: String,
    pub scope: Scope,
    pub scope_value: String,
    pub window: Window,
    pub window_start: i64,
    pub currency: String,
    /// Minor units, never negative.
    pub amount: i64,
    pub limit: i64,
    pub on_exceed: OnExceed,
}

/// The key of the counter of `budget` for `scope_value`, the window starting at `window_start`
/// and `currency`. Fields are separated by a control character no name or id may hold.
pub fn counter_key(budget: &str, scope_value: &str, window_start: i64, currency: &str) -> String {
    format!("{budget}\u{1f}{scope_value}\u{1f}{window_start}\u{1f}{currency}")
}

/// Why a command's amount could not be counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "budget {budget}: argument {field:?} must be a whole, non-negative number of minor units"
    )]
    BadAmount { budget: String, field: String },
}

/// The lines of every budget covering `command` at `now` (its admission), in budget name
/// order. A budget without a limit for the field's currency gives none.
pub fn lines(
    budgets: &[Budget],
    command: &Command,
    now: Timestamp,
) -> Result<Vec<BudgetLine>, BudgetError> {
    let tool = command.tool.to_string();
    let mut lines = Vec::new();
    for budget in budgets {
        let Some((field, currency)) = budget.fields.get(&tool) else {
            continue;
        };
        let Some(&limit) = budget.limits.get(currency) else {
            continue;
        };
        let amount = match command.current_args().get(field) {
            Some(Value::Number(number)) => number.as_i64().filter(|amount| *amount >= 0),
            // A nullable field left null spends nothing.
            Some(Value::Null) | None => Some(0),
            Some(_) => None,
        }
        .ok_or_else(|| BudgetError::BadAmount {
            budget: budget.name.clone(),
            field: field.clone(),
        })?;
        let scope_value = budget.scope_value(command);
        let window_start = budget.window.start(now);
        lines.push(BudgetLine {
            budget: budget.name.clone(),
            counter: counter_key(&budget.name, &scope_value, window_start, currency),
            scope: budget.scope,
            scope_value,
            window: budget.window,
            window_start,
            currency: currency.clone(),
            amount,
            limit,
            on_exceed: budget.on_exceed,
        });
    }
    lines.sort_by(|a, b| a.counter.cmp(&b.counter));
    Ok(lines)
}

/// What a policy rule sees of one budget covering a command: `budgets.<name>` in CEL
/// (`crate::catalog::rules`), with `used`, `limit`, `remaining`, `amount`, `currency` and
/// `window`. `used` is what *other* commands hold in the counter the command counts against
/// (its run's, tenant's or tool's, in the window of its admission): the same number at
/// submission, before the command holds anything, and at dispatch, when its own hold is
/// already counted — so a rule reads alike at both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetView {
    pub budget: String,
    pub currency: String,
    pub window: Window,
    pub limit: i64,
    /// Minor units held by other commands in the counter.
    pub used: i64,
    /// This command's amount.
    pub amount: i64,
}

impl BudgetView {
    /// The view of `line` when other commands hold `used_by_others` of its counter.
    pub fn of(line: &BudgetLine, used_by_others: i64) -> Self {
        Self {
            budget: line.budget.clone(),
            currency: line.currency.clone(),
            window: line.window,
            limit: line.limit,
            used: used_by_others,
            amount: line.amount,
        }
    }

    /// What the limit leaves to others' spend (negative when a person approved past it).
    pub fn remaining(&self) -> i64 {
        self.limit.saturating_sub(self.used)
    }

    /// The views a rule of `tool` is checked against when the catalog loads: every budget
    /// that would give the tool a line, with nothing (`full = false`) or all (`full = true`)
    /// of its limit used.
    pub fn examples(budgets: &[Budget], tool: &ToolName, full: bool) -> Vec<Self> {
        let name = tool.to_string();
        budgets
            .iter()
            .filter_map(|budget| {
                let (_, currency) = budget.fields.get(&name)?;
                let limit = *budget.limits.get(currency)?;
                Some(Self {
                    budget: budget.name.clone(),
                    currency: currency.clone(),
                    window: budget.window,
                    limit,
                    used: if full { limit } else { 0 },
                    amount: 0,
                })
            })
            .collect()
    }
}

/// What other commands hold of a counter that holds `used` in all, `own` being this command's
/// holds on it (amount and state; one per submission that held it).
pub fn used_by_others(used: i64, own: impl IntoIterator<Item = (i64, HoldState)>) -> i64 {
    let mine: i64 = own
        .into_iter()
        .filter(|(_, state)| *state == HoldState::Held)
        .map(|(amount, _)| amount)
        .sum();
    used.saturating_sub(mine).max(0)
}

/// The latest window start whose window has surely ended at `now`, whatever the budget's
/// window: the longest window that ends is a day. A purge removes the holds of purged runs
/// from such counters only (nothing can change them any more), and never from a `total`
/// counter (start 0), where what was spent counts for ever.
pub fn ended_windows_start_by(now: Timestamp) -> i64 {
    now.as_millis().saturating_sub(86_400_000)
}

/// Whether the counter `counter` (a [`counter_key`]) is of a window that has surely ended at
/// `now` ([`ended_windows_start_by`]); `false` for a `total` counter or a key that is not one.
pub fn counter_window_ended(counter: &str, now: Timestamp) -> bool {
    counter
        .split('\u{1f}')
        .nth(2)
        .and_then(|start| start.parse::<i64>().ok())
        .is_some_and(|start| start > 0 && start <= ended_windows_start_by(now))
}

/// Whether `amount` fits a counter that has `used` of `limit` spent.
pub fn fits(used: i64, amount: i64, limit: i64) -> bool {
    used.checked_add(amount).is_some_and(|total| total <= limit)
}

/// How a command is held against its counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HoldState {
    /// Counted.
    Held,
    /// Recorded past the limit, waiting for a person: not counted until approved.
    Deferred,
    /// No longer counted: the command ended without spending.
    Released,
    /// No longer counted, for good: an approver's edit moved the command's spend to the
    /// edited amount (`crate::revision`), held under the revision's own tag. No status change
    /// brings it back, and a re-submission of the arguments it was taken for finds it (so
    /// holds nothing afresh).
    Moved,
}

impl HoldState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Deferred => "deferred",
            Self::Released => "released",
            Self::Moved => "moved",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "held" => Some(Self::Held),
            "deferred" => Some(Self::Deferred),
            "released" => Some(Self::Released),
            "moved" => Some(Self::Moved),
            _ => None,
        }
    }
}

/// What a status change does to a command's holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldChange {
    Keep,
    /// Approved: a deferred hold now counts (past the limit: a person decided).
    Activate,
    /// Ended without spending: held and deferred holds are released.
    Release,
    /// Brought back from such an end (an operator's replay): released holds count again.
    Reclaim,
}

/// The statuses in which a command has spent nothing: FAILED (refused, denied, or found
/// absent), CANCELLED (never sent, or rejected) and COMPENSATED (undone).
pub fn spends_nothing(status: CommandStatus) -> bool {
    matches!(
        status,
        CommandStatus::Failed | CommandStatus::Cancelled | CommandStatus::Compensated
    )
}

/// What the change of a command's status from `from` to `to` does to its holds.
pub fn hold_change(from: CommandStatus, to: CommandStatus) -> HoldChange {
    if from == to {
        HoldChange::Keep
    } else if spends_nothing(to) && !spends_nothing(from) {
        HoldChange::Release
    } else if spends_nothing(from) && !spends_nothing(to) {
        HoldChange::Reclaim
    } else if to == CommandStatus::Approved {
        HoldChange::Activate
    } else {
        HoldChange::Keep
    }
}

/// What one hold becomes under `change`, and how much the counter's spend moves by.
pub fn apply_change(state: HoldState, amount: i64, change: HoldChange) -> (HoldState, i64) {
    match (change, state) {
        (HoldChange::Activate, HoldState::Deferred) => (HoldState::Held, amount),
        (HoldChange::Release, HoldState::Held) => (HoldState::Released, -amount),
        (HoldChange::Release, HoldState::Deferred) => (HoldState::Released, 0),
        (HoldChange::Reclaim, HoldState::Released) => (HoldState::Held, amount),
        (_, state) => (state, 0),
    }
}

/// The tag of the holds an edit takes (`crate::revision`): the revision's number and
/// arguments' hash. Never a submission's tag, so a re-submission's own holds, given back when
/// the ledger refuses it, are never the edit's.
pub fn revision_tag(number: u32, args_hash: &str) -> String {
    format!("revision-{number}:{args_hash}")
}

/// One counter as the API and the CLI show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetCounter {
    pub budget: String,
    pub scope_value: String,
    pub window_start: i64,
    pub currency: String,
    /// Minor units held now.
    pub used: i64,
    /// Commands holding an amount now.
    pub holds: u64,
}
