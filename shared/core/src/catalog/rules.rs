//! Policy rules: `[[rule]]` (catalog-wide) and `[[tool.rule]]` (one tool's), each a condition in
//! the Common Expression Language (CEL, as Kubernetes' admission policies and Envoy's RBAC write
//! them) over the command's arguments, its tool, tenant, run and submitter, and the time, with
//! what it decides when the condition holds: `allow`, `require_approval` or `deny`.
//!
//! ```toml
//! [[rule]]                              # catalog-wide, for every tool unless `tools` narrows it
//! name = "outside-email"
//! tools = ["email/*"]                   # optional: "namespace/name", "namespace/*" or "*"
//! when = "!args.to.endsWith('@example.com')"
//! then = "require_approval"             # allow | require_approval | deny
//! reason = "mail to another domain"     # optional: shown to approvers and agents (the name)
//!
//! [[tool.rule]]                         # the tool's own
//! name = "large-eur-wire"
//! when = "args.currency == 'EUR' && args.amount_minor > 100000"
//! then = "require_approval"
//! ```
//!
//! A rule is compiled and checked when the catalog loads: its source must parse, name only the
//! variables below, and evaluate to `true` or `false` against two example arguments built from
//! each tool's schema (every declared field present, low and high values), so a misspelt field,
//! a number compared with a string or a condition that is not a boolean is a load error naming
//! the file, the tool and the rule. How rules combine is [`crate::policy`]'s.
//!
//! Variables: `args` (the arguments, as stored), `tool` (`"namespace/name"`), `tenant` and
//! `submitter` (strings, or `null` when the command has none), `run` (the run id) and `now` (a
//! CEL timestamp, UTC: the producer's clock at submission, the dispatcher's at dispatch).
//! `budgets` maps the name of each spend budget covering the command (`[budgets.<name>]` whose
//! tools include it and which sets a limit in its money field's currency) to `used` (minor
//! units other commands hold in the counter this command counts against, in the window of its
//! admission), `limit`, `remaining` (`limit - used`), `amount` (this command's), `currency` and
//! `window` — read from the ledger only for a tool one of whose rules names `budgets`:
//!
//! ```toml
//! [[tool.rule]]
//! name = "most-of-the-day"
//! when = "budgets.daily_wires.used + budgets.daily_wires.amount > budgets.daily_wires.limit * 8 / 10"
//! then = "require_approval"
//! reason = "this wire takes the day's wires past 80% of their budget"
//! ```
//!
//! Such a rule is a threshold read before the hold is taken, not a limit: two agents racing may
//! both read the same `used`. The budget itself (`crate::budget`) is the limit no race passes.
//! A rule naming a budget that does not cover a tool it applies to is a load error (use
//! `has(budgets.name)` in a catalog-wide rule over tools some budgets do not cover).

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::error::CatalogError;
use super::raw::describe;
use crate::budget::BudgetView;
use crate::ids::ToolName;

/// The variables a rule may name.
pub const RULE_VARIABLES: [&str; 7] = [
    "args",
    "tool",
    "tenant",
    "run",
    "submitter",
    "now",
    "budgets",
];
/// The longest condition accepted, in bytes: a policy, not a program.
pub const MAX_RULE_SOURCE: usize = 4096;
/// The CEL parser recurses deeply (over 300 KiB of stack for a short condition in a debug
/// build), so conditions are compiled on a thread with a stack this size, never on the
/// caller's (an async runtime's worker has 2 MiB).
const COMPILE_STACK_BYTES: usize = 32 << 20;

/// What a rule decides when its condition holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleEffect {
    Allow,
    RequireApproval,
    Deny,
}

impl RuleEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::RequireApproval => "require_approval",
            Self::Deny => "deny",
        }
    }
}

/// Where a rule was declared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleScope {
    /// `[[tool.rule]]`.
    Tool,
    /// `[[rule]]`.
    Catalog,
}

/// A compiled rule.
pub struct Rule {
    name: String,
    when: String,
    effect: RuleEffect,
    reason: Option<String>,
    scope: RuleScope,
    /// `[[rule]] tools`; empty: every tool.
    tools: Vec<String>,
    program: cel::Program,
    /// Whether the condition names `budgets`: its evaluation then needs the budgets' counters.
    uses_budgets: bool,
}

impl fmt::Debug for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The compiled program is derived from `when`.
        f.debug_struct("Rule")
            .field("name", &self.name)
            .field("when", &self.when)
            .field("effect", &self.effect)
            .field("reason", &self.reason)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Self) -> bool {
        (
            &self.name,
            &self.when,
            self.effect,
            &self.reason,
            self.scope,
            &self.tools,
        ) == (
            &other.name,
            &other.when,
            other.effect,
            &other.reason,
            other.scope,
            &other.tools,
        )
    }
}

impl Eq for Rule {}

impl Rule {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The condition as written.
    pub fn when(&self) -> &str {
        &self.when
    }

    pub fn effect(&self) -> RuleEffect {
        self.effect
    }

    /// What approvers and agents are told when it decides: its `reason`, else its name.
    pub fn reason(&self) -> String {
        match &self.reason {
            Some(reason) => format!("rule {}: {reason}", self.name),
            None => format!("rule {}", self.name),
        }
    }

    pub fn scope(&self) -> RuleScope {
        self.scope
    }

    /// Whether the condition names `budgets` (the evaluating component then reads the
    /// budgets' counters first).
    pub fn uses_budgets(&self) -> bool {
        self.uses_budgets
    }

    pub(crate) fn program(&self) -> &cel::Program {
        &self.program
    }

    /// Whether a catalog-wide rule applies to `tool`.
    fn covers(&self, tool: &ToolName) -> bool {
        self.tools.is_empty()
            || self.tools.iter().any(|pattern| {
                pattern == "*"
                    || match pattern.strip_suffix("/*") {
                        Some(namespace) => namespace == tool.namespace(),
                        None => *pattern == tool.to_string(),
                    }
            })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    name: String,
    when: String,
    then: RuleEffect,
    reason: Option<String>,
    tools: Option<Vec<String>>,
}

/// Where a rule is being built, for its errors.
struct Place<'a> {
    file: &'a str,
    tool: Option<&'a str>,
}

impl Place<'_> {
    fn error(&self, rule: &str, detail: impl Into<String>) -> CatalogError {
        CatalogError::BadRule {
            file: self.file.to_owned(),
            tool: self.tool.map(str::to_owned),
            rule: rule.to_owned(),
            detail: detail.into(),
        }
    }
}

/// Compiles `[[tool.rule]]` entries of `tool` (checked against its schema and budgets by
/// [`attach`], once the budgets are known).
pub(super) fn build_tool_rules(
    entries: Vec<toml::Table>,
    file: &str,
    tool: &ToolName,
) -> Result<Vec<Arc<Rule>>, CatalogError> {
    let shown = tool.to_string();
    let place = Place {
        file,
        tool: Some(&shown),
    };
    let mut rules: Vec<Arc<Rule>> = Vec::with_capacity(entries.len());
    for (position, entry) in entries.into_iter().enumerate() {
        let rule = build_rule(entry, position, &place, RuleScope::Tool)?;
        if rules.iter().any(|earlier| earlier.name == rule.name) {
            return Err(place.error(&rule.name, "the name is used by another rule of this tool"));
        }
        rules.push(Arc::new(rule));
    }
    Ok(rules)
}

/// Compiles the catalog's `[[rule]]` entries (checked per tool by [`attach`]).
pub(super) fn build_catalog_rules(
    entries: Vec<toml::Table>,
    file: &str,
) -> Result<Vec<Arc<Rule>>, CatalogError> {
    let place = Place { file, tool: None };
    let mut rules: Vec<Arc<Rule>> = Vec::with_capacity(entries.len());
    for (position, entry) in entries.into_iter().enumerate() {
        let rule = build_rule(entry, position, &place, RuleScope::Catalog)?;
        if rules.iter().any(|earlier| earlier.name == rule.name) {
            return Err(place.error(&rule.name, "the name is used by another [[rule]]"));
        }
        rules.push(Arc::new(rule));
    }
    Ok(rules)
}

/// `tool`'s own rules and, after them, the catalog-wide rules that cover it, each checked
/// against its schema and the budgets covering it.
pub(super) fn attach(
    own: &[Arc<Rule>],
    catalog: &[Arc<Rule>],
    file: &str,
    tool: &ToolName,
    schema: &Value,
    budgets: &[crate::budget::Budget],
) -> Result<Arc<[Arc<Rule>]>, CatalogError> {
    let shown = tool.to_string();
    let place = Place {
        file,
        tool: Some(&shown),
    };
    let examples = [false, true].map(|full| BudgetView::examples(budgets, tool, full));
    for rule in own {
        check_against(rule, &place, tool, schema, &examples)?;
    }
    let mut all = own.to_vec();
    for rule in catalog.iter().filter(|rule| rule.covers(tool)) {
        if own.iter().any(|mine| mine.name == rule.name) {
            return Err(place.error(
                &rule.name,
                "a [[tool.rule]] of this tool has the name of a [[rule]] that covers it",
            ));
        }
        check_against(rule, &place, tool, schema, &examples)?;
        all.push(Arc::clone(rule));
    }
    Ok(all.into())
}

fn build_rule(
    entry: toml::Table,
    position: usize,
    place: &Place<'_>,
    scope: RuleScope,
) -> Result<Rule, CatalogError> {
    let label = entry
        .get("name")
        .and_then(toml::Value::as_str)
        .map_or_else(|| format!("#{}", position + 1), str::to_owned);
    let raw = RawRule::deserialize(toml::Value::Table(entry))
        .map_err(|error| place.error(&label, describe(&error)))?;
    let name = raw.name;
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
    {
        return Err(place.error(
            &label,
            "name must be 1 to 64 letters, digits, '-', '_' or '.'",
        ));
    }
    let tools = match (scope, raw.tools) {
        (RuleScope::Tool, Some(_)) => {
            return Err(place.error(
                &name,
                "tools belongs to a catalog-wide [[rule]]; a [[tool.rule]] covers its own tool",
            ));
        }
        (RuleScope::Tool, None) => Vec::new(),
        (RuleScope::Catalog, tools) => {
            let tools = tools.unwrap_or_default();
            for pattern in &tools {
                check_pattern(pattern).map_err(|why| place.error(&name, why))?;
            }
            tools
        }
    };
    if raw.when.trim().is_empty() {
        return Err(place.error(&name, "when must not be empty"));
    }
    if raw.when.len() > MAX_RULE_SOURCE {
        return Err(place.error(
            &name,
            format!(
                "when is {} bytes; at most {MAX_RULE_SOURCE} are accepted",
                raw.when.len()
            ),
        ));
    }
    let program = compile(&raw.when).map_err(|why| place.error(&name, why))?;
    let references = program.references();
    let mut unknown: Vec<&str> = references
        .variables()
        .into_iter()
        .filter(|variable| !RULE_VARIABLES.contains(variable))
        .collect();
    unknown.sort_unstable();
    if let Some(first) = unknown.first() {
        return Err(place.error(
            &name,
            format!(
                "when names {first:?}, which is not one of {}",
                RULE_VARIABLES.join(", ")
            ),
        ));
    }
    let uses_budgets = references.variables().contains(&"budgets");
    Ok(Rule {
        uses_budgets,
        name,
        when: raw.when,
        effect: raw.then,
        reason: raw.reason.filter(|reason| !reason.trim().is_empty()),
        scope,
        tools,
        program,
    })
}

pub(super) fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern == "*" {
        return Ok(());
    }
    let checked = match pattern.strip_suffix("/*") {
        Some(namespace) => crate::ids::check_snake_case(namespace).map_err(str::to_owned),
        None => ToolName::parse(pattern)
            .map(drop)
            .map_err(|error| error.to_string()),
    };
    checked.map_err(|why| {
        format!("tools: {pattern:?} is not \"*\", \"namespace/*\" or a tool name: {why}")
    })
}

/// Compiles a condition on a thread with room for the parser's recursion.
fn compile(source: &str) -> Result<cel::Program, String> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("cel-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, || cel::Program::compile(source))
            .map_err(|error| format!("cannot start the compiler's thread: {error}"))?
            .join()
            .map_err(|_| "the CEL compiler panicked on this condition".to_owned())?
            .map_err(|errors| format!("not valid CEL: {}", one_line(&errors.to_string())))
    })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Evaluates `rule` against example arguments built from `schema`, low and high, and the
/// budgets covering the tool with none and all of their limits used (`budgets`), so what can
/// be known before any command arrives is known at load.
fn check_against(
    rule: &Rule,
    place: &Place<'_>,
    tool: &ToolName,
    schema: &Value,
    budgets: &[Vec<BudgetView>; 2],
) -> Result<(), CatalogError> {
    for (extreme, budgets) in [Extreme::Low, Extreme::High].into_iter().zip(budgets) {
        // A schema with a part whose type cannot be told gives no example: the rule's
        // references are checked, its types are left to evaluation.
        let Some(args) = example(schema, extreme) else {
            return Ok(());
        };
        let input = crate::policy::RuleInput {
            args: &args,
            tool,
            run: "run-example",
            tenant: Some("tenant-example"),
            submitter: Some("agent-example"),
            now: crate::time::Timestamp::from_millis(1_767_225_600_000),
            budgets,
        };
        match crate::policy::context_of(&input)
            .and_then(|context| crate::policy::holds(rule, &context))
        {
            Ok(_) => {}
            Err(why) => {
                let covering = if !rule.uses_budgets() {
                    String::new()
                } else if budgets.is_empty() {
                    " (no budget covers this tool)".to_owned()
                } else {
                    let names: Vec<&str> =
                        budgets.iter().map(|view| view.budget.as_str()).collect();
                    format!(" (the budgets covering this tool: {})", names.join(", "))
                };
                return Err(place.error(
                    &rule.name,
                    format!("with arguments like {args}: {why}{covering}"),
                ));
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Extreme {
    Low,
    High,
}

/// An example value of `schema`: every declared property present, numbers at their bounds.
/// `None` when some part has no type that can be told.
fn example(schema: &Value, extreme: Extreme) -> Option<Value> {
    if let Some(value) = schema.get("const") {
        return Some(value.clone());
    }
    if let Some(Value::Array(values)) = schema.get("enum") {
        return match extreme {
            Extreme::Low => values.first().cloned(),
            Extreme::High => values.last().cloned(),
        };
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        if let Some(Value::Array(choices)) = schema.get(key)
            && let Some(first) = choices.first()
        {
            return example(first, extreme);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        // ["string", "null"]: the first that is not null.
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|kind| *kind != "null")?,
        _ if schema.get("properties").is_some() => "object",
        _ => return None,
    };
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    Some(match kind {
        "object" => {
            let mut fields = Map::new();
            if let Some(Value::Object(properties)) = schema.get("properties") {
                for (name, property) in properties {
                    fields.insert(name.clone(), example(property, extreme)?);
                }
            }
            Value::Object(fields)
        }
        "array" => {
            let item = schema
                .get("items")
                .map_or(Some(Value::Null), |items| example(items, extreme))?;
            Value::Array(vec![item])
        }
        "string" => Value::String(match extreme {
            Extreme::Low => String::new(),
            Extreme::High => "example".to_owned(),
        }),
        "integer" => {
            let value = match extreme {
                Extreme::Low => bound("minimum").unwrap_or(0.0),
                Extreme::High => bound("maximum").unwrap_or(1_000_000_000.0),
            };
            // Bounds are integers for an integer field; the cast keeps the value's magnitude.
            #[expect(clippy::cast_possible_truncation)]
            Value::Number(Number::from(value as i64))
        }
        "number" => {
            let value = match extreme {
                Extreme::Low => bound("minimum").unwrap_or(0.0),
                Extreme::High => bound("maximum").unwrap_or(1_000_000_000.5),
            };
            Value::Number(Number::from_f64(value)?)
        }
        "boolean" => Value::Bool(matches!(extreme, Extreme::High)),
        "null" => Value::Null,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn examples_hold_every_declared_field_at_both_ends() {
        let schema = json!({
            "type": "object",
            "properties": {
                "amount": {"type": "integer", "minimum": 1, "maximum": 500},
                "currency": {"type": "string", "enum": ["EUR", "USD"]},
                "memo": {"type": ["string", "null"]},
                "tags": {"type": "array", "items": {"type": "string"}},
            }
        });
        assert_eq!(
            example(&schema, Extreme::Low),
            Some(json!({"amount": 1, "currency": "EUR", "memo": "", "tags": [""]}))
        );
        assert_eq!(
            example(&schema, Extreme::High),
            Some(json!({"amount": 500, "currency": "USD", "memo": "example", "tags": ["example"]}))
        );
    }

    #[test]
    fn a_part_without_a_type_gives_no_example() {
        let schema = json!({"type": "object", "properties": {"any": {}}});
        assert_eq!(example(&schema, Extreme::Low), None);
    }

    #[test]
    fn patterns_cover_their_tools_only() {
        let rule = |tools: &[&str]| Rule {
            name: "r".into(),
            when: "true".into(),
            effect: RuleEffect::Deny,
            reason: None,
            scope: RuleScope::Catalog,
            tools: tools.iter().map(|tool| (*tool).to_owned()).collect(),
            program: compile("true").expect("compiles"),
            uses_budgets: false,
        };
        let wire = ToolName::parse("payments/wire").expect("valid");
        assert!(rule(&[]).covers(&wire));
        assert!(rule(&["*"]).covers(&wire));
        assert!(rule(&["payments/*"]).covers(&wire));
        assert!(rule(&["payments/wire"]).covers(&wire));
        assert!(!rule(&["email/*"]).covers(&wire));
        assert!(!rule(&["payments/refund"]).covers(&wire));
    }

    #[test]
    fn patterns_are_checked() {
        assert!(check_pattern("*").is_ok());
        assert!(check_pattern("payments/*").is_ok());
        assert!(check_pattern("payments/wire").is_ok());
        assert!(check_pattern("Payments/*").is_err());
        assert!(check_pattern("wire").is_err());
    }
}
