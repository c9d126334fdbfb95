//! `sluice budgets`: every spend budget of the catalog (`[budgets.<name>]`) and its counters in
//! the window holding now (or `--at`), read from the ledger the configuration names — the same
//! numbers as `GET /v1/budgets`, for an operator at a shell.

use std::sync::Arc;

use clap::Args;
use comfy_table::Table;
use sluice_core::budget::Budget;
use sluice_core::time::{Clock, SystemClock, Timestamp};
use sluice_runtime::cli::ServiceArgs;

#[derive(Debug, Args)]
pub struct BudgetsArgs {
    /// Show the windows holding this time (RFC 3339) instead of now.
    #[arg(long)]
    pub at: Option<String>,
    #[command(flatten)]
    pub service: ServiceArgs,
}

/// Runs the command; its output, or an error message.
pub async fn run(args: BudgetsArgs) -> Result<String, String> {
    let config = args.service.load().map_err(|e| format!("{e:#}"))?;
    let catalog = sluice_assemble::load_catalog(&config.catalog)
        .map_err(|e| format!("cannot load the catalog: {e}"))?;
    if catalog.budgets().is_empty() {
        return Ok("the catalog declares no [budgets.<name>]".to_owned());
    }
    let at = match args.at.as_deref() {
        None => SystemClock.now(),
        Some(text) => Timestamp::parse_rfc3339(text)
            .map_err(|_| format!("--at {text:?} is not an RFC 3339 time"))?,
    };
    let ledger = sluice_assemble::open_ledger(&config, Arc::new(SystemClock))
        .await
        .map_err(|e| format!("cannot open the ledger: {e}"))?;
    let mut out = String::new();
    for budget in catalog.budgets() {
        let start = budget.window.start(at);
        let counters = ledger
            .budget_counters(&budget.name, start)
            .await
            .map_err(|e| format!("cannot read budget {}: {e}", budget.name))?;
        out.push_str(&heading(budget, start));
        let mut table = Table::new();
        table.set_header([
            budget.scope.as_str(),
            "currency",
            "held",
            "limit",
            "left",
            "holds",
        ]);
        for counter in &counters {
            let limit = budget.limits.get(&counter.currency).copied();
            table.add_row([
                counter.scope_value.clone(),
                counter.currency.clone(),
                counter.used.to_string(),
                limit.map_or("-".into(), |l| l.to_string()),
                limit.map_or("-".into(), |l| (l - counter.used).max(0).to_string()),
                counter.holds.to_string(),
            ]);
        }
        if counters.is_empty() {
            out.push_str("  nothing held in this window\n\n");
        } else {
            out.push_str(&format!("{table}\n\n"));
        }
    }
    Ok(out.trim_end().to_owned())
}

fn heading(budget: &Budget, start: i64) -> String {
    let limits: Vec<String> = budget
        .limits
        .iter()
        .map(|(currency, limit)| format!("{currency} {limit}"))
        .collect();
    format!(
        "budget {} — tools {}, per {}, {} window from {}, limits {} (minor units), over it: {}\n",
        budget.name,
        budget.tools.join(", "),
        budget.scope.as_str(),
        budget.window.as_str(),
        Timestamp::from_millis(start),
        limits.join(", "),
        budget.on_exceed.as_str()
    )
}
