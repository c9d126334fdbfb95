//! Edit and approve (`POST …:approve` with `args`, docs/decisions.md "An edit keeps the
//! effect's key"): an approver corrects a BLOCKED command's arguments as they approve it.
//!
//! The new arguments replace the current ones whole (no merge patch: the approver sends what
//! they saw and corrected, and what is dispatched is exactly that). In order, nothing written
//! until all of it passes:
//!
//! 1. the command is BLOCKED and its tool still in the catalog;
//! 2. the arguments pass the tool's schema (422 naming each pointer, as at submission); the
//!    business key stays the one the submission claimed, as the command key does;
//! 3. policy is evaluated again on them (`sluice_core::revision::check`): a deny refuses the
//!    edit (409 `policy_denied`); a rule or knob requiring approval is covered by this approval;
//! 4. the spend budgets covering the tool are counted on the edited amount: the hold moves
//!    (`BudgetStore::budget_rehold`), or the edit is refused with 409 `budget_exceeded` — past a
//!    `require_approval` budget the approver's approval covers it, as for any BLOCKED hold;
//! 5. the approval and the revision are one state machine step (the audit chain records the
//!    revision's hashes and changed pointers with the reason); the old holds are then given
//!    back (`budget_supersede`), or, if the step was refused, the new ones.

use axum::http::StatusCode;
use serde_json::{Value, json};
use sluice_core::budget::{OnExceed, lines, revision_tag};
use sluice_core::command::{Approval, Command};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, Event, EventKind, Operator, Refusal, Step};
use sluice_core::revision::{self, EditRefusal};
use sluice_ledger::{Held, HoldMode};

use crate::operator::{not_found, operate, refused};
use crate::{Api, ApiError};

fn refusal(e: &EditRefusal) -> ApiError {
    let status = match e {
        EditRefusal::Unchanged => StatusCode::UNPROCESSABLE_ENTITY,
        EditRefusal::TooMany(_) | EditRefusal::Denied { .. } => StatusCode::CONFLICT,
    };
    ApiError::new(status, e.code(), format!("the edit is refused: {e}"))
        .with_details(json!({"pointer": "/args"}))
}

/// Approves the BLOCKED command `run_id`/`key` with `args` as its new arguments.
pub(crate) async fn approve_edited(
    api: &Api,
    run_id: &RunId,
    key: &CommandKey,
    actor: &str,
    reason: &str,
    args: Value,
) -> Result<(Command, Step), ApiError> {
    let command = api
        .ctx
        .ledger
        .get(run_id, key)
        .await
        .map_err(|e| ApiError::unavailable(&e))?
        .ok_or_else(|| not_found(run_id, key))?;
    if !machine::awaits_approval(&command.state) {
        return Err(refused(
            &command,
            &Refusal::NotAllowed {
                status: command.status(),
                event: EventKind::Approve,
            },
        ));
    }
    let catalog = &api.ctx.catalog;
    let tool = catalog.get(&command.tool).ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "tool_removed",
            format!(
                "tool {} is no longer in the catalog: its arguments cannot be checked, so they cannot be edited",
                command.tool
            ),
        )
    })?;
    if !args.is_object() {
        return Err(ApiError::invalid(
            "args must be a JSON object: the command's new arguments, whole",
        )
        .with_details(json!({"pointer": "/args"})));
    }
    tool.validate_args(&args).map_err(|e| {
        let violations: Vec<Value> = e
            .violations()
            .iter()
            .map(|v| json!({"pointer": format!("/args{}", v.pointer), "message": v.message}))
            .collect();
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_arguments",
            format!(
                "the edited arguments of {} do not match its schema: {e}",
                tool.name()
            ),
        )
        .with_details(json!({ "violations": violations }))
    })?;
    // The business key stays the one the submission claimed (the command's identity, like
    // its key): the upstream is told it with every call and looked up by it, so a fields'
    // change of it in the edit does not make the command another effect.
    let now = api.ctx.clock.now();
    let revision =
        revision::revise(&command, tool, args, actor, reason, now).map_err(|e| refusal(&e))?;
    let approval = Approval {
        approver: actor.to_owned(),
        reason: reason.to_owned(),
        at: now,
        policy_version: catalog.policy_version().to_owned(),
    };
    revision::check(
        &command,
        tool,
        &revision,
        &approval,
        catalog.policy_version(),
        now,
    )
    .map_err(|e| refusal(&e))?;

    // The budgets, counted on the edited arguments.
    let mut edited = command.clone();
    edited.state.revisions.push(revision.clone());
    let budget_lines = lines(catalog.budgets(), &edited, now).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_arguments",
            e.to_string(),
        )
    })?;
    let tag = revision_tag(revision.number, revision.args_hash.as_str());
    let ledger = &api.ctx.ledger;
    let unavailable = |e: sluice_ledger::LedgerError| ApiError::unavailable(&e);
    let mut held = ledger
        .budget_rehold(run_id, key, &tag, &budget_lines, HoldMode::Enforce)
        .await
        .map_err(unavailable)?;
    if let Held::Exceeded { line, used } = &held {
        if line.on_exceed == OnExceed::RequireApproval {
            // The approver approves past the limit, as for a command recorded BLOCKED over it.
            held = ledger
                .budget_rehold(run_id, key, &tag, &budget_lines, HoldMode::Defer)
                .await
                .map_err(unavailable)?;
        } else {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "budget_exceeded",
                format!(
                    "the edit is refused: budget {} would pass its limit: {} {} held of {} in this {} window besides this command, and the edited amount is {}; nothing was changed",
                    line.budget,
                    used,
                    line.currency,
                    line.limit,
                    line.window.as_str(),
                    line.amount
                ),
            )
            .with_details(crate::budgets::exceeded(line, *used)));
        }
    }
    let event = Event::Approve {
        operator: Operator {
            actor: actor.to_owned(),
            reason: reason.to_owned(),
        },
        policy_version: catalog.policy_version().to_owned(),
        revision: Some(Box::new(revision)),
    };
    let driven = operate(api, run_id, key, actor, event, |_| true).await;
    let moved = match &driven {
        Ok(_) => ledger.budget_supersede(run_id, key, &tag).await,
        Err(_) if held == Held::Fresh => ledger.budget_unhold(run_id, key, &tag).await,
        Err(_) => Ok(()),
    };
    if let Err(e) = moved {
        // Both counted until the command's end releases them: more than spent, never less.
        tracing::warn!(run_id = %run_id, command_key = %key, error = %e, "an edit's budget holds were not moved");
    }
    driven
}
