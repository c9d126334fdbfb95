//! The embedded ledger's spend budgets (`crate::BudgetStore`): holds through the writer
//! (`writer/budgets.rs`), in its write transaction; counters read on a pooled connection.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use sluice_core::audit::AuditDraft;
use sluice_core::budget::{BudgetCounter, BudgetLine, HoldState, used_by_others};
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};

use super::SqliteLedger;
use super::schema::map_err;
use super::writer::{BudgetHoldOp, Op, Reply};
use crate::{BudgetStore, Budgeted, Held, HoldMode, LedgerError, Reserved};

impl SqliteLedger {
    async fn hold_op(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
        net: bool,
    ) -> Result<Held, LedgerError> {
        let op = Op::BudgetHold {
            run_id: run_id.to_string(),
            command_key: command_key.to_string(),
            tag: tag.to_owned(),
            lines: lines.to_vec(),
            mode,
            net,
        };
        match self.submit(op).await?.result? {
            Reply::Budget(Some(held)) => Ok(held),
            _ => Err(LedgerError::Closed),
        }
    }
}

#[async_trait]
impl BudgetStore for SqliteLedger {
    async fn budget_hold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Held, LedgerError> {
        if lines.is_empty() {
            return Ok(Held::Already);
        }
        self.hold_op(run_id, command_key, tag, lines, mode, false)
            .await
    }

    async fn budget_rehold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Held, LedgerError> {
        if lines.is_empty() {
            return Ok(Held::Already);
        }
        self.hold_op(run_id, command_key, tag, lines, mode, true)
            .await
    }

    async fn budget_supersede(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        keep: &str,
    ) -> Result<(), LedgerError> {
        let op = Op::BudgetSupersede {
            run_id: run_id.to_string(),
            command_key: command_key.to_string(),
            keep: keep.to_owned(),
        };
        match self.submit(op).await?.result? {
            Reply::Budget(None) => Ok(()),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn budget_unhold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
    ) -> Result<(), LedgerError> {
        let op = Op::BudgetUnhold {
            run_id: run_id.to_string(),
            command_key: command_key.to_string(),
            tag: tag.to_owned(),
        };
        match self.submit(op).await?.result? {
            Reply::Budget(None) => Ok(()),
            _ => Err(LedgerError::Closed),
        }
    }

    async fn reserve_held(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Budgeted, LedgerError> {
        let budget = (!lines.is_empty()).then(|| {
            Box::new(BudgetHoldOp {
                tag: tag.to_owned(),
                lines: lines.to_vec(),
                mode,
            })
        });
        let held_any = budget.is_some();
        match self.reserve_with(command, audit, confined, budget).await? {
            Ok(reserved) => {
                // One transaction: the holds are fresh exactly when the command is new.
                let held = if held_any && matches!(reserved, Reserved::Created(_)) {
                    Held::Fresh
                } else {
                    Held::Already
                };
                Ok(Budgeted::Recorded {
                    reserved: Box::new(reserved),
                    held,
                })
            }
            Err(Held::Exceeded { line, used }) => Ok(Budgeted::Exceeded { line, used }),
            Err(_) => Err(LedgerError::Closed),
        }
    }

    async fn budget_used_by_others(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        counters: &[String],
    ) -> Result<Vec<i64>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let (run_id, command_key) = (run_id.to_string(), command_key.to_string());
        let counters = counters.to_vec();
        self.read("budget_used_by_others", move |conn| {
            let failed = |e| map_err(e, "budget_used_by_others", &path, &config);
            let mut used = conn
                .prepare_cached("SELECT used FROM budget_counters WHERE counter = ?1")
                .map_err(failed)?;
            let mut own = conn
                .prepare_cached(
                    "SELECT amount, state FROM budget_holds \
                     WHERE run_id = ?1 AND command_key = ?2 AND counter = ?3",
                )
                .map_err(failed)?;
            counters
                .iter()
                .map(|counter| {
                    let total: i64 = used
                        .query_row(params![counter], |row| row.get(0))
                        .optional()
                        .map_err(failed)?
                        .unwrap_or(0);
                    let holds = own
                        .query_map(params![run_id, command_key, counter], |row| {
                            Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
                        })
                        .map_err(failed)?
                        .collect::<Result<Vec<_>, _>>()
                        .map_err(failed)?;
                    Ok(used_by_others(
                        total,
                        holds.into_iter().filter_map(|(amount, state)| {
                            HoldState::parse(&state).map(|state| (amount, state))
                        }),
                    ))
                })
                .collect()
        })
        .await
    }

    async fn budget_counters(
        &self,
        budget: &str,
        window_start: i64,
    ) -> Result<Vec<BudgetCounter>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let budget = budget.to_owned();
        self.read("budget_counters", move |conn| {
            let failed = |e| map_err(e, "budget_counters", &path, &config);
            let mut stmt = conn
                .prepare_cached(
                    "SELECT scope_value, currency, used, holds FROM budget_counters \
                     WHERE budget = ?1 AND window_start = ?2 ORDER BY scope_value, currency",
                )
                .map_err(failed)?;
            let rows = stmt
                .query_map(params![budget, window_start], |row| {
                    Ok(BudgetCounter {
                        budget: budget.clone(),
                        scope_value: row.get(0)?,
                        window_start,
                        currency: row.get(1)?,
                        used: row.get(2)?,
                        holds: u64::try_from(row.get::<_, i64>(3)?).unwrap_or(0),
                    })
                })
                .map_err(failed)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(failed)?;
            Ok(rows)
        })
        .await
    }
}
