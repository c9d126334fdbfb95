//! What policy rules read of spend budgets (`sluice_core::budget::BudgetView`, `budgets.<name>`
//! in a rule): the counters of the budgets covering a command, less its own holds — read from
//! the ledger only for a tool one of whose rules names `budgets`, so no other evaluation costs
//! a read.

use sluice_core::budget::{BudgetView, lines};
use sluice_core::catalog::Tool;
use sluice_core::command::Command;
use sluice_ledger::LedgerError;

use crate::pipeline::Context;

impl Context {
    /// The budgets covering `command` (of `tool`) as its rules read them, in the counters of
    /// its admission's window (`created_at`, where its holds are): empty for a tool whose rules
    /// do not read budgets. An amount that cannot be counted gives none either (the submission
    /// refuses it; a rule then cannot be evaluated, and one that restricts counts as holding).
    pub async fn budget_views(
        &self,
        tool: &Tool,
        command: &Command,
    ) -> Result<Vec<BudgetView>, LedgerError> {
        if !tool.rules_use_budgets() {
            return Ok(Vec::new());
        }
        let Ok(lines) = lines(self.catalog.budgets(), command, command.created_at) else {
            return Ok(Vec::new());
        };
        if lines.is_empty() {
            return Ok(Vec::new());
        }
        let counters: Vec<String> = lines.iter().map(|line| line.counter.clone()).collect();
        let used = self
            .ledger
            .budget_used_by_others(&command.run_id, &command.command_key, &counters)
            .await?;
        Ok(lines
            .iter()
            .zip(used)
            .map(|(line, used)| BudgetView::of(line, used))
            .collect())
    }
}
