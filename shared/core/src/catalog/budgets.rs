//! `[budgets.<name>]`: spend budgets over a money argument that tools declare
//! (`[tool.money.<field>]`), which no agent — nor any number of them racing — can exceed.
//!
//! ```toml
//! [budgets.daily_wires]
//! tools = ["payments/*"]            # patterns as a [[rule]]'s: "*", "namespace/*" or a name
//! field = "amount_minor"            # optional when every covered tool declares one
//! #                                 # [tool.money] field
//! scope = "tenant"                  # run | tenant | tool: whose spend is summed
//! window = "day"                    # hour | day | total (UTC-aligned: 10:00-11:00, a UTC day)
//! limits = { EUR = 5000000 }        # minor units per currency; a currency not listed: no limit
//! on_exceed = "deny"                # or "require_approval"
//! ```
//!
//! Checked at load, each error naming the file, the budget and the key: the name is snake_case;
//! `tools` covers at least one tool; every covered tool declares the money `field` (or exactly
//! one money field when `field` is left out), and lists it in its schema's `required`, so no
//! command of a covered tool escapes its budget by leaving the amount out; currencies are ISO
//! 4217 codes and limits positive.
//!
//! What a budget decides is in [`crate::budget`]; the ledgers enforce it atomically.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::Tool;
use super::error::CatalogError;
use crate::budget::{Budget, OnExceed, Scope, Window};
use crate::ids::check_snake_case;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBudget {
    tools: Vec<String>,
    field: Option<String>,
    scope: Scope,
    window: Window,
    limits: BTreeMap<String, i64>,
    on_exceed: OnExceed,
}

/// Validates `[budgets.<name>]` against the loaded tools.
pub(super) fn build_budgets(
    raw: BTreeMap<String, toml::Table>,
    file: &str,
    tools: &[Tool],
    servers_pending: bool,
) -> Result<Vec<Budget>, CatalogError> {
    let mut budgets = Vec::with_capacity(raw.len());
    for (name, table) in raw {
        let bad = |key: &str, detail: String| CatalogError::BadBudget {
            file: file.to_owned(),
            budget: name.clone(),
            key: key.to_owned(),
            detail,
        };
        if let Err(why) = check_snake_case(&name) {
            return Err(bad("name", format!("{name:?} is not a budget name: {why}")));
        }
        let raw = RawBudget::deserialize(toml::Value::Table(table))
            .map_err(|error| bad("budget", super::raw::describe(&error)))?;
        if raw.tools.is_empty() {
            return Err(bad(
                "tools",
                "list the tools the budget covers (\"*\" for every tool with a money field)".into(),
            ));
        }
        for pattern in &raw.tools {
            super::rules::check_pattern(pattern)
                .map_err(|why| bad("tools", why.trim_start_matches("tools: ").to_owned()))?;
        }
        if raw.limits.is_empty() {
            return Err(bad(
                "limits",
                "give at least one limit, such as limits = { EUR = 5000000 } (minor units)".into(),
            ));
        }
        for (currency, limit) in &raw.limits {
            let code = currency.as_bytes();
            if code.len() != 3 || !code.iter().all(u8::is_ascii_uppercase) {
                return Err(bad(
                    "limits",
                    format!(
                        "currency {currency:?} is not an ISO 4217 code (three capital letters, such as \"EUR\")"
                    ),
                ));
            }
            if *limit <= 0 {
                return Err(bad(
                    "limits",
                    format!(
                        "the limit for {currency} must be a positive number of minor units, not {limit}"
                    ),
                ));
            }
        }
        let mut budget = Budget {
            name: name.clone(),
            tools: raw.tools,
            fields: BTreeMap::new(),
            scope: raw.scope,
            window: raw.window,
            limits: raw.limits,
            on_exceed: raw.on_exceed,
            field: raw.field,
        };
        let covered: Vec<&Tool> = tools
            .iter()
            .filter(|tool| budget.covers(tool.name()))
            .collect();
        for tool in covered {
            let counted = counted_field(&budget, tool).map_err(|(key, detail)| bad(key, detail))?;
            budget.fields.insert(tool.name().to_string(), counted);
        }
        // Without MCP servers every tool is known: a budget covering none is a mistake now.
        // With them, the check waits for their tools ([`check_covered`]).
        if !servers_pending && budget.fields.is_empty() {
            return Err(bad(
                "tools",
                format!("{:?} covers no tool of the catalog", budget.tools),
            ));
        }
        budgets.push(budget);
    }
    Ok(budgets)
}

/// The money field `budget` counts for `tool`, and its currency; else the key at fault and why.
fn counted_field(budget: &Budget, tool: &Tool) -> Result<(String, String), (&'static str, String)> {
    let money = tool.money();
    let field = match &budget.field {
        Some(field) => field.clone(),
        None if money.len() == 1 => money.keys().next().cloned().unwrap_or_default(),
        None if money.is_empty() => {
            return Err((
                "tools",
                format!(
                    "tool {} covered by the budget declares no [tool.money] field: declare the amount's currency, or narrow tools",
                    tool.name()
                ),
            ));
        }
        None => {
            return Err((
                "field",
                format!(
                    "tool {} declares {} [tool.money] fields: name the one the budget counts with field = \"...\"",
                    tool.name(),
                    money.len()
                ),
            ));
        }
    };
    let Some(declared) = money.get(&field) else {
        return Err((
            "field",
            format!(
                "tool {} covered by the budget declares no [tool.money.{field}]: declare its currency, or narrow tools",
                tool.name()
            ),
        ));
    };
    let required = tool
        .schema()
        .get("required")
        .and_then(Value::as_array)
        .is_some_and(|required| required.iter().any(|r| r == field.as_str()));
    if !required {
        return Err((
            "field",
            format!(
                "tool {}: list {field:?} in the schema's required, so that no command escapes the budget by leaving the amount out",
                tool.name()
            ),
        ));
    }
    Ok((field, declared.currency.clone()))
}

/// Counts an MCP server's tool, added once its server is listed, in the budgets covering it.
pub(super) fn cover_added(
    budgets: &mut [Budget],
    tool: &Tool,
    file: &str,
) -> Result<(), CatalogError> {
    for budget in budgets
        .iter_mut()
        .filter(|budget| budget.covers(tool.name()))
    {
        let counted =
            counted_field(budget, tool).map_err(|(key, detail)| CatalogError::BadBudget {
                file: file.to_owned(),
                budget: budget.name.clone(),
                key: key.to_owned(),
                detail,
            })?;
        budget.fields.insert(tool.name().to_string(), counted);
    }
    Ok(())
}

/// Once every tool is known: a budget that covers none is a mistake.
pub(super) fn check_covered(budgets: &[Budget], file: &str) -> Result<(), CatalogError> {
    match budgets.iter().find(|budget| budget.fields.is_empty()) {
        Some(budget) => Err(CatalogError::BadBudget {
            file: file.to_owned(),
            budget: budget.name.clone(),
            key: "tools".to_owned(),
            detail: format!("{:?} covers no tool of the catalog", budget.tools),
        }),
        None => Ok(()),
    }
}
