//! Spend budgets at admission (`sluice_core::budget`, docs/operations.md "Spend budgets"): the
//! amount of a submission is held in the ledger before its command is recorded, in one atomic
//! step per counter, so racing agents on any number of producers cannot pass a limit; and
//! `GET /v1/budgets`, each budget's counters in their current window.
//!
//! Over a limit, `on_exceed = "deny"` refuses the submission (409 `budget_exceeded`, nothing
//! recorded) and `"require_approval"` records the command BLOCKED with a deferred hold that
//! counts once a person approves it. The holds and the reservation are one ledger call
//! (`BudgetStore::reserve_held`): one write transaction on SQLite; on CQL the holds first, so a
//! crash in between leaves them under the command's key, which the retried admission takes
//! over (more counted than spent until then, never less). A reservation the ledger refuses
//! (argument drift, another agent's run, a closed run, a business key held elsewhere) gives
//! back this submission's own holds.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use sluice_core::budget::{BudgetLine, OnExceed, lines};
use sluice_core::command::Command;
use sluice_core::machine::{self, Event};
use sluice_core::time::Timestamp;
use sluice_ledger::{Budgeted, Held, HoldMode, LedgerError, Reserved, submission_tag};

use crate::auth::{Caller, Need};
use crate::{Api, ApiError, Q};

/// The budgets covering a submission: the lines it counts against and its tag.
#[derive(Debug, Default)]
pub(crate) struct Budgets {
    pub lines: Vec<BudgetLine>,
    /// The command's state before any lease its reservation would take: what is blocked when
    /// a `require_approval` budget would be passed.
    pub unleased: Option<sluice_core::command::CommandState>,
    /// The submission's tag (`sluice_ledger::submission_tag`).
    pub tag: String,
}

/// The details of a 409 `budget_exceeded`: the budget, its limit, what is held and the amount.
pub(crate) fn exceeded(line: &BudgetLine, used: i64) -> Value {
    json!({
        "budget": line.budget,
        "scope": line.scope.as_str(),
        "scope_value": line.scope_value,
        "window": line.window.as_str(),
        "window_start": Timestamp::from_millis(line.window_start),
        "currency": line.currency,
        "limit": line.limit,
        "used": used,
        "amount": line.amount,
        "on_exceed": line.on_exceed.as_str(),
    })
}

impl Api {
    /// The budget lines of `command` at `now` (422 for an amount that cannot be counted).
    pub(crate) fn budgets_of(
        &self,
        command: &Command,
        now: Timestamp,
    ) -> Result<Budgets, ApiError> {
        let lines = lines(self.ctx.catalog.budgets(), command, now).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_arguments",
                e.to_string(),
            )
        })?;
        Ok(Budgets {
            lines,
            unleased: Some(command.state.clone()),
            tag: submission_tag(command.args_hash.as_str(), command.submitted_by.as_deref()),
        })
    }

    fn count_budget(&self, budget: &str, outcome: &str) {
        self.ctx
            .metrics
            .budget_admissions
            .with_label_values(&[budget, outcome])
            .inc();
    }

    /// Reserves a submission: with its budget holds when budgets cover it, else as before
    /// (`reserve_own` for an agent confined to its own runs).
    pub(crate) async fn reserve_submission(
        &self,
        command: Command,
        audit: sluice_core::audit::AuditDraft,
        confined: bool,
        budgets: &Budgets,
        rules: &sluice_core::machine::Rules,
        now: Timestamp,
    ) -> Result<(Result<Reserved, LedgerError>, Option<machine::Step>), ApiError> {
        if !budgets.lines.is_empty() {
            return self
                .reserve_within_budgets(command, audit, confined, budgets, rules, now)
                .await;
        }
        let ledger = &self.ctx.ledger;
        let reserved = if confined {
            ledger.reserve_own(command, audit).await
        } else {
            ledger.reserve(command, audit).await
        };
        Ok((reserved, None))
    }

    /// Publishes the BLOCKED event of a command recorded blocked past a budget.
    pub(crate) async fn announce_blocked(&self, command: &Command, block: &machine::Step) {
        let carried = self
            .ctx
            .carry_out(
                crate::ACTOR,
                command,
                block,
                sluice_runtime::messages::Cause::Reserved,
            )
            .await;
        if let Err(e) = carried {
            tracing::warn!(
                run_id = %command.run_id,
                command_key = %command.command_key,
                error = %e,
                "the BLOCKED event of a command over its budget was not published"
            );
        }
    }

    /// Reserves `command` with its budget holds (`BudgetStore::reserve_held`). Past a
    /// `require_approval` budget it is recorded BLOCKED instead, from `budgets.unleased` (its
    /// state before any lease its reservation would have taken), with a deferred hold; the step that
    /// blocked it comes back so that its event is published. Past a `deny` budget: 409.
    pub(crate) async fn reserve_within_budgets(
        &self,
        command: Command,
        audit: sluice_core::audit::AuditDraft,
        confined: bool,
        budgets: &Budgets,
        rules: &sluice_core::machine::Rules,
        now: Timestamp,
    ) -> Result<(Result<Reserved, LedgerError>, Option<machine::Step>), ApiError> {
        let ledger = &self.ctx.ledger;
        let first = ledger
            .reserve_held(
                command.clone(),
                audit,
                confined,
                &budgets.tag,
                &budgets.lines,
                HoldMode::Enforce,
            )
            .await;
        let (line, used) = match first {
            Err(e) => return Ok((Err(e), None)),
            Ok(Budgeted::Recorded { reserved, held }) => {
                if held == Held::Fresh {
                    for line in &budgets.lines {
                        self.count_budget(&line.budget, "held");
                    }
                }
                return Ok((Ok(*reserved), None));
            }
            Ok(Budgeted::Exceeded { line, used }) => (line, used),
        };
        let reason = format!(
            "budget {} would pass its limit: {} {} held of {} in this {} window, and this is {}",
            line.budget,
            used,
            line.currency,
            line.limit,
            line.window.as_str(),
            line.amount
        );
        let over = |why: String| {
            ApiError::new(StatusCode::CONFLICT, "budget_exceeded", why)
                .with_details(exceeded(&line, used))
        };
        // Pending only: a command scheduled for later cannot wait for a person now.
        let unleased = budgets
            .unleased
            .as_ref()
            .filter(|state| machine::may_block_past_budget(state));
        let (OnExceed::RequireApproval, Some(unleased)) = (line.on_exceed, unleased) else {
            self.count_budget(&line.budget, "denied");
            return Err(over(format!("{reason}; nothing was recorded")));
        };
        let step = machine::apply(
            unleased,
            rules,
            &Event::Block {
                reason,
                epoch: None,
            },
            now,
        )
        .map_err(|refusal| {
            over(format!(
                "over budget {} and cannot wait for approval: {refusal}",
                line.budget
            ))
        })?;
        let mut blocked = command;
        blocked.state = step.state.clone();
        let mut audit = blocked.reservation_audit(crate::ACTOR);
        audit.reason = format!("reserved and {}", step.reason);
        self.count_budget(&line.budget, "deferred");
        let second = ledger
            .reserve_held(
                blocked,
                audit,
                confined,
                &budgets.tag,
                &budgets.lines,
                HoldMode::Defer,
            )
            .await;
        match second {
            Err(e) => Ok((Err(e), None)),
            Ok(Budgeted::Recorded { reserved, .. }) => Ok((Ok(*reserved), Some(step))),
            // A deferred hold is never over a limit.
            Ok(Budgeted::Exceeded { .. }) => Err(over("over budget".into())),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BudgetQuery {
    /// Any time in the window to show (RFC 3339); the current one by default.
    at: Option<String>,
}

/// `GET /v1/budgets`: every budget, its declaration and its counters (one per scope value and
/// currency) in the window holding `at` (now by default). Operators and admins: the counters
/// name runs and tenants.
pub(crate) async fn list(
    State(api): State<Api>,
    Caller(principal): Caller,
    Q(query): Q<BudgetQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadAll)?;
    let at = match query.at.as_deref() {
        None => api.ctx.clock.now(),
        Some(text) => Timestamp::parse_rfc3339(text).map_err(|_| {
            ApiError::invalid(format!("at: {text:?} is not an RFC 3339 time"))
                .with_details(json!({"pointer": "/at"}))
        })?,
    };
    let mut budgets = Vec::new();
    for budget in api.ctx.catalog.budgets() {
        let start = budget.window.start(at);
        let counters = api
            .ctx
            .ledger
            .budget_counters(&budget.name, start)
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
        for currency in budget.limits.keys() {
            let held: i64 = counters
                .iter()
                .filter(|counter| &counter.currency == currency)
                .map(|counter| counter.used)
                .sum();
            if query.at.is_none() {
                api.ctx
                    .metrics
                    .budget_held
                    .with_label_values(&[budget.name.as_str(), currency.as_str()])
                    .set(held);
            }
        }
        let counters: Vec<Value> = counters
            .iter()
            .map(|counter| {
                let limit = budget.limits.get(&counter.currency).copied();
                json!({
                    "scope_value": counter.scope_value,
                    "currency": counter.currency,
                    "used": counter.used,
                    "limit": limit,
                    "remaining": limit.map(|limit| (limit - counter.used).max(0)),
                    "holds": counter.holds,
                })
            })
            .collect();
        budgets.push(json!({
            "name": budget.name,
            "tools": budget.tools,
            "scope": budget.scope.as_str(),
            "window": budget.window.as_str(),
            "window_start": Timestamp::from_millis(start),
            "window_end": budget.window.end(start).map(Timestamp::from_millis),
            "limits": budget.limits,
            "on_exceed": budget.on_exceed.as_str(),
            "counters": counters,
        }));
    }
    Ok(Json(json!({ "budgets": budgets })).into_response())
}
