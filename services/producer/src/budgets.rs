//! Spend budgets at admission (`sluice_core::budget`, docs/operations.md "Spend budgets"): the
//! amount of a submission is held in the ledger before its command is recorded, in one atomic
//! step per counter, so racing agents on any number of producers cannot pass a limit; and
//! `GET /v1/budgets`, each budget's counters in their current window.
//!
//! Over a limit, `on_exceed = "deny"` refuses the submission (409 `budget_exceeded`, nothing
//! recorded) and `"require_approval"` records the command BLOCKED with a deferred hold that
//! counts once a person approves it. The hold is taken before the reservation: a crash in
//! between leaves it held under the command's key, which the retried admission finds (more
//! counted than spent until then, never less). A reservation the ledger refuses (argument
//! drift, another agent's run, a closed run, a business key held elsewhere) gives back this
//! submission's own hold at once.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use sluice_core::budget::{BudgetLine, OnExceed, lines};
use sluice_core::command::{Command, CommandStatus};
use sluice_core::machine::{self, Event};
use sluice_core::time::Timestamp;
use sluice_ledger::{Held, HoldMode, LedgerError, Reserved, submission_tag};

use crate::auth::{Caller, Need};
use crate::{Api, ApiError, Q};

/// What admission did with a submission's budgets.
#[derive(Debug, Default)]
pub(crate) struct Admitted {
    /// This submission took holds now: given back if the ledger refuses its reservation.
    pub fresh: bool,
    /// The submission's tag (`sluice_ledger::submission_tag`).
    pub tag: String,
    /// Why the command is recorded BLOCKED: a `require_approval` budget it would pass.
    pub blocked: Option<String>,
    /// The step that blocked it: its lifecycle event is published once the command is recorded.
    pub block: Option<Box<machine::Step>>,
}

fn exceeded(line: &BudgetLine, used: i64) -> Value {
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
    /// Holds `command`'s amount against every budget covering it. Returns the command to
    /// record: as given, or BLOCKED when a `require_approval` budget would be passed.
    pub(crate) async fn hold_budgets(
        &self,
        command: Command,
        rules: &sluice_core::machine::Rules,
        now: Timestamp,
    ) -> Result<(Command, Admitted), ApiError> {
        let catalog = &self.ctx.catalog;
        let lines = lines(catalog.budgets(), &command, now).map_err(|e| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_arguments",
                e.to_string(),
            )
        })?;
        let mut admitted = Admitted {
            fresh: false,
            blocked: None,
            block: None,
            tag: submission_tag(command.args_hash.as_str(), command.submitted_by.as_deref()),
        };
        if lines.is_empty() {
            return Ok((command, admitted));
        }
        let ledger = &self.ctx.ledger;
        let held = ledger
            .budget_hold(
                &command.run_id,
                &command.command_key,
                &admitted.tag,
                &lines,
                HoldMode::Enforce,
            )
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
        let count = |budget: &str, outcome: &str| {
            self.ctx
                .metrics
                .budget_admissions
                .with_label_values(&[budget, outcome])
                .inc();
        };
        let (line, used) = match held {
            Held::Fresh => {
                for line in &lines {
                    count(&line.budget, "held");
                }
                admitted.fresh = true;
                return Ok((command, admitted));
            }
            Held::Already => return Ok((command, admitted)),
            Held::Exceeded { line, used } => (line, used),
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
        // Pending only: a command scheduled for later cannot wait for a person now.
        let blockable = command.status() == CommandStatus::Pending;
        if line.on_exceed == OnExceed::Deny || !blockable {
            count(&line.budget, "denied");
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "budget_exceeded",
                format!("{reason}; nothing was recorded"),
            )
            .with_details(exceeded(&line, used)));
        }
        count(&line.budget, "deferred");
        let deferred = ledger
            .budget_hold(
                &command.run_id,
                &command.command_key,
                &admitted.tag,
                &lines,
                HoldMode::Defer,
            )
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
        admitted.fresh = deferred == Held::Fresh;
        let step = machine::apply(
            &command.state,
            rules,
            &Event::Block {
                reason,
                epoch: None,
            },
            now,
        )
        .map_err(|refusal| {
            ApiError::new(
                StatusCode::CONFLICT,
                "budget_exceeded",
                format!(
                    "over budget {} and cannot wait for approval: {refusal}",
                    line.budget
                ),
            )
        })?;
        let mut command = command;
        command.state = step.state.clone();
        admitted.blocked = Some(step.reason.clone());
        admitted.block = Some(Box::new(step));
        Ok((command, admitted))
    }

    /// Gives back a submission's fresh holds when the ledger refused to record its command.
    pub(crate) async fn unhold_refused(
        &self,
        command: (&sluice_core::ids::RunId, &sluice_core::ids::CommandKey),
        admitted: &Admitted,
        reserved: &Result<Reserved, LedgerError>,
    ) {
        let refused = matches!(
            reserved,
            Ok(Reserved::BusinessKeyHeld(_))
                | Err(LedgerError::ArgumentDrift { .. }
                    | LedgerError::ForeignRun { .. }
                    | LedgerError::RunClosed { .. })
        );
        if !admitted.fresh || !refused {
            return;
        }
        if let Err(e) = self
            .ctx
            .ledger
            .budget_unhold(command.0, command.1, &admitted.tag)
            .await
        {
            // Held all the same: more counted than spent, never less.
            tracing::warn!(run_id = %command.0, command_key = %command.1, error = %e, "budget hold of a refused submission not given back");
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
