//! `sluice catalog`: for catalog authors. `check` loads a catalog and reads every secret its
//! credentials reference, as the services do at start; `requests` prints, for given arguments,
//! the exact request each of a tool's endpoints would send, secrets masked, sending nothing;
//! `explain` shows, for given arguments, what each policy rule made of them and what decided.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use futures::future::BoxFuture;
use serde_json::Value;
use sluice_connector::credentials::Secrets;
use sluice_connector::{McpConnector, preview};
use sluice_core::budget::BudgetView;
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, Intent};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::policy::{self, PolicyDecision, RuleInput, RuleVerdict};
use sluice_core::time::{Clock, SystemClock, Timestamp};

#[derive(Debug, Args)]
pub struct CatalogArgs {
    #[command(subcommand)]
    pub command: CatalogCommand,
}

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// Load a catalog as the services would, and check that every secret it references can be
    /// read (no value is printed).
    Check {
        /// The catalog file.
        #[arg(long)]
        catalog: PathBuf,
    },
    /// Print the request each endpoint of a tool would send for the given arguments, with every
    /// secret masked. Nothing is sent.
    Requests {
        /// The catalog file.
        #[arg(long)]
        catalog: PathBuf,
        /// The tool (namespace/name, or a bare name in the default namespace).
        #[arg(long)]
        tool: String,
        /// The arguments, as JSON.
        #[arg(long, default_value = "{}")]
        args: String,
        /// The run the command would belong to.
        #[arg(long, default_value = "r-dry-run")]
        run_id: String,
        /// Its journal position: decision and call index.
        #[arg(long, default_value_t = 1)]
        decision: u32,
        #[arg(long, default_value_t = 0)]
        call: u32,
        /// The reference a compensation would undo (what the dispatch's answer named).
        #[arg(long, default_value = "<external_ref>")]
        external_ref: String,
    },
    /// Show what each policy rule of a tool makes of the given arguments and who, and what
    /// decides: a rule, or the tool's `requires_approval` / `approve_above`. Nothing is sent.
    Explain {
        /// The catalog file.
        #[arg(long)]
        catalog: PathBuf,
        /// The tool (namespace/name, or a bare name in the default namespace).
        #[arg(long)]
        tool: String,
        /// The arguments, as JSON.
        #[arg(long, default_value = "{}")]
        args: String,
        /// The run the command would belong to.
        #[arg(long, default_value = "r-dry-run")]
        run_id: String,
        /// The tenant it would count against.
        #[arg(long)]
        tenant: Option<String>,
        /// The principal (token name) submitting it.
        #[arg(long)]
        submitter: Option<String>,
        /// The time to evaluate at (RFC 3339); now by default.
        #[arg(long)]
        at: Option<String>,
        /// What other commands hold in a budget covering the tool, as NAME=MINOR_UNITS
        /// (repeatable; a budget not given has nothing held): what rules read as
        /// `budgets.<name>.used`.
        #[arg(long = "budget-used", value_name = "NAME=MINOR_UNITS")]
        budget_used: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the subcommand; the text to print, or what was wrong.
pub fn run(args: CatalogArgs) -> BoxFuture<'static, Result<String, String>> {
    Box::pin(run_body(args))
}

async fn run_body(args: CatalogArgs) -> Result<String, String> {
    match args.command {
        CatalogCommand::Check { catalog } => check(&catalog).await,
        CatalogCommand::Requests {
            catalog,
            tool,
            args,
            run_id,
            decision,
            call,
            external_ref,
        } => {
            requests(
                &catalog,
                &tool,
                &args,
                &run_id,
                decision,
                call,
                &external_ref,
            )
            .await
        }
        CatalogCommand::Explain {
            catalog,
            tool,
            args,
            run_id,
            tenant,
            submitter,
            at,
            budget_used,
            json,
        } => {
            explain(
                &catalog,
                &Who {
                    tool: &tool,
                    args: &args,
                    run_id: &run_id,
                    tenant: tenant.as_deref(),
                    submitter: submitter.as_deref(),
                    at: at.as_deref(),
                    budget_used: &budget_used,
                },
                json,
            )
            .await
        }
    }
}

/// What `explain` evaluates: the command as it would be submitted.
struct Who<'a> {
    tool: &'a str,
    args: &'a str,
    run_id: &'a str,
    tenant: Option<&'a str>,
    submitter: Option<&'a str>,
    at: Option<&'a str>,
    /// `--budget-used NAME=MINOR_UNITS`.
    budget_used: &'a [String],
}

async fn explain(path: &std::path::Path, who: &Who<'_>, json: bool) -> Result<String, String> {
    let catalog = load(path).await?;
    let tool = catalog.resolve(who.tool).map_err(|e| e.to_string())?;
    let args: Value =
        serde_json::from_str(who.args).map_err(|e| format!("--args is not valid JSON: {e}"))?;
    tool.validate_args(&args)
        .map_err(|e| format!("--args do not fit tool {}: {e}", tool.name()))?;
    let run_id = RunId::parse(who.run_id).map_err(|e| format!("--run-id: {e}"))?;
    let now = match who.at {
        Some(at) => Timestamp::parse_rfc3339(at).map_err(|e| format!("--at: {e}"))?,
        None => SystemClock.now(),
    };
    let budgets = budget_views(&catalog, tool, &args, who.budget_used)?;
    let input = RuleInput {
        args: &args,
        tool: tool.name(),
        run: run_id.as_str(),
        tenant: who.tenant,
        submitter: who.submitter,
        now,
        budgets: &budgets,
    };
    let explained = policy::explain(tool, &input, None, catalog.policy_version());
    if json {
        return serde_json::to_string_pretty(&explained).map_err(|e| e.to_string());
    }
    let mut out = format!(
        "{} under policy version {}\n",
        tool.name(),
        catalog.policy_version()
    );
    if explained.rules.is_empty() {
        out.push_str("no rule covers this tool\n");
    }
    for rule in &explained.rules {
        let verdict = match &rule.verdict {
            RuleVerdict::Holds => "holds".to_owned(),
            RuleVerdict::DoesNotHold => "does not hold".to_owned(),
            RuleVerdict::Error { error } => format!("cannot be evaluated: {error}"),
        };
        out.push_str(&format!(
            "  {} rule {} ({} when {}): {verdict}\n",
            rule.scope, rule.rule, rule.then, rule.when
        ));
    }
    let decided = match &explained.decided_by {
        Some(rule) => format!("rule {rule}"),
        None => "the tool's [tool.policy] (requires_approval, approve_above)".to_owned(),
    };
    let decision = match &explained.decision {
        PolicyDecision::Allow => "allow".to_owned(),
        PolicyDecision::RequireApproval { reason } => format!("require approval: {reason}"),
        PolicyDecision::Deny { reason } => format!("deny: {reason}"),
    };
    out.push_str(&format!("decided by {decided}: {decision}"));
    Ok(out)
}

/// The budgets covering `tool` as its rules would read them for `args`, with what
/// `--budget-used` says others hold (nothing for a budget not named).
fn budget_views(
    catalog: &Catalog,
    tool: &sluice_core::catalog::Tool,
    args: &Value,
    used: &[String],
) -> Result<Vec<BudgetView>, String> {
    let mut views = BudgetView::examples(catalog.budgets(), tool.name(), false);
    for given in used {
        let (name, minor) = given
            .split_once('=')
            .ok_or_else(|| format!("--budget-used {given:?}: write NAME=MINOR_UNITS"))?;
        let minor: i64 = minor
            .trim()
            .parse()
            .map_err(|e| format!("--budget-used {given:?}: {e}"))?;
        let Some(view) = views.iter().position(|view| view.budget == name.trim()) else {
            let covering: Vec<&str> = views.iter().map(|v| v.budget.as_str()).collect();
            return Err(format!(
                "--budget-used {given:?}: no budget {name:?} covers {} (covering: {})",
                tool.name(),
                if covering.is_empty() {
                    "none".to_owned()
                } else {
                    covering.join(", ")
                }
            ));
        };
        views[view].used = minor;
    }
    let tool_name = tool.name().to_string();
    for view in &mut views {
        let field = catalog
            .budgets()
            .iter()
            .find(|budget| budget.name == view.budget)
            .and_then(|budget| budget.fields.get(&tool_name))
            .map(|(field, _)| field.as_str());
        view.amount = field
            .and_then(|field| args.get(field))
            .and_then(Value::as_i64)
            .unwrap_or(0);
    }
    Ok(views)
}

/// Loads the catalog and, when it declares MCP servers, connects to each, lists its tools and
/// adds the allowed ones, as the services do at start (then closes the connections).
async fn load(path: &std::path::Path) -> Result<Catalog, String> {
    let catalog = Catalog::load(path).map_err(|e| e.to_string())?;
    if catalog.mcp_servers().is_empty() {
        return Ok(catalog);
    }
    let mcp = McpConnector::new(&catalog, std::sync::Arc::new(Secrets::new()));
    let listed = sluice_connector::mcp::discover(catalog, &mcp).await;
    mcp.close().await;
    listed.map_err(|e| e.to_string())
}

async fn check(path: &std::path::Path) -> Result<String, String> {
    let catalog = Catalog::load(path).map_err(|e| e.to_string())?;
    // Secrets first: a server started with an unreadable one would fail for that reason.
    if let Err(problems) = Secrets::new().check(&catalog) {
        let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        return Err(format!(
            "{}: {} tool(s) load, but credentials cannot be used:\n{}",
            catalog.source_name(),
            catalog.len(),
            lines.join("\n")
        ));
    }
    let catalog = load(path).await?;
    // The services refuse a status check that cannot fit the sweep's item budget at start;
    // the author hears it here, against the default configuration.
    let item_budget = sluice_runtime::config::ReconcilerConfig::default().sweep_item_timeout_ms;
    let budgets = sluice_core::sweep::looks_that_do_not_fit(&catalog, item_budget);
    if !budgets.is_empty() {
        let lines: Vec<String> = budgets.iter().map(|p| format!("  {p}")).collect();
        return Err(format!(
            "{}: does not fit the reconciler's default sweep budget:\n{}",
            catalog.source_name(),
            lines.join("\n")
        ));
    }
    let secrets = Secrets::new();
    if let Err(problems) = secrets.check(&catalog) {
        let lines: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        return Err(format!(
            "{}: {} tool(s) load, but credentials cannot be used:\n{}",
            catalog.source_name(),
            catalog.len(),
            lines.join("\n")
        ));
    }
    let credentials = catalog.credentials().count();
    let mut out = format!(
        "{}: {} tool(s), {} credential(s); every referenced secret can be read",
        catalog.source_name(),
        catalog.len(),
        credentials
    );
    if !catalog.mcp_servers().is_empty() {
        out.push_str(&format!(
            "\n{} MCP server(s) reached; their tools, with where their semantics come from:",
            catalog.mcp_servers().len()
        ));
        for tool in catalog.tools().iter().filter(|tool| tool.mcp().is_some()) {
            out.push_str(&format!(
                "\n  {}  {} ({})",
                tool.name(),
                tool.semantics(),
                tool.semantics_source().as_str()
            ));
        }
    }
    Ok(out)
}

async fn requests(
    path: &std::path::Path,
    tool: &str,
    args: &str,
    run_id: &str,
    decision: u32,
    call: u32,
    external_ref: &str,
) -> Result<String, String> {
    let catalog = load(path).await?;
    let tool = catalog.resolve(tool).map_err(|e| e.to_string())?;
    let args: Value =
        serde_json::from_str(args).map_err(|e| format!("--args is not valid JSON: {e}"))?;
    tool.validate_args(&args)
        .map_err(|e| format!("--args do not fit tool {}: {e}", tool.name()))?;
    let business_key = tool
        .business_key(&args)
        .map_err(|e| format!("business key: {e}"))?;
    let run_id = RunId::parse(run_id).map_err(|e| format!("--run-id: {e}"))?;
    let intent = Intent {
        run_id,
        command_key: CommandKey::new(decision, tool.name().clone(), call),
        semantics: tool.semantics(),
        args,
        business_key,
        policy_version: catalog.policy_version().to_owned(),
        max_attempts: tool.policy().max_attempts,
        not_before: None,
    };
    let command = Command::from_intent(intent, SystemClock.now(), 10_000);
    if let Some(binding) = tool.mcp() {
        return Ok(mcp_requests(binding, &command, external_ref));
    }
    let mut out = String::new();
    for (operation, request) in preview::requests(tool, &command, Some(external_ref)) {
        out.push_str(&format!("== {operation}\n"));
        match request {
            Ok(request) => out.push_str(&request.to_http()),
            Err(why) => out.push_str(&format!("cannot be rendered: {why}\n")),
        }
        out.push('\n');
    }
    Ok(out.trim_end().to_owned())
}

/// The `tools/call`s of an MCP server's tool: the tool called and its arguments.
fn mcp_requests(
    binding: &sluice_core::catalog::McpBinding,
    command: &Command,
    external_ref: &str,
) -> String {
    use sluice_connector::mcp::wire;
    let shown =
        |tool: &str, arguments: Result<serde_json::Map<String, Value>, String>| match arguments {
            Ok(arguments) => format!(
                "tools/call {}/{tool}\n{}\n",
                binding.server,
                serde_json::to_string_pretty(&Value::Object(arguments)).unwrap_or_default()
            ),
            Err(why) => format!("cannot be rendered: {why}\n"),
        };
    let key = command.idempotency_key.to_string();
    let mut out = format!(
        "== dispatch\n{}_meta {}\n",
        shown(&binding.tool, wire::dispatch_arguments(binding, command)),
        Value::Object(wire::meta(command, &key, None))
    );
    if let Some(lookup) = &binding.status_check {
        out.push_str("\n== status_check\n");
        out.push_str(&shown(
            &lookup.call.tool,
            wire::call_arguments(&lookup.call, command, None, None).map_err(|e| e.to_string()),
        ));
        if let Some(contains) = &lookup.contains {
            match wire::needle(contains, command) {
                Ok(text) => out.push_str(&format!("contains {text:?}\n")),
                Err(why) => out.push_str(&format!("contains cannot be rendered: {why}\n")),
            }
        }
    }
    if let Some(undo) = &binding.compensate {
        let key = sluice_connector::request::compensation_key(command, Some(external_ref));
        out.push_str("\n== compensate\n");
        out.push_str(&shown(
            &undo.tool,
            wire::call_arguments(undo, command, Some(external_ref), Some(&key))
                .map_err(|e| e.to_string()),
        ));
    }
    out.trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CATALOG: &str = r#"
[credentials.api]
kind = "header"
header = "X-Api-Key"
value = { env = "SLUICE_CATALOG_CMD_TEST_NEVER_SET" }

[[tool]]
name = "tickets/create"
semantics = "IDEMPOTENT"
credential = "api"
schema = { type = "object", required = ["title"], properties = { title = { type = "string" } } }
[tool.dispatch]
url = "https://tickets.test/api/issues"
body = { fields = { summary = "{args.title}" } }
[tool.compensate]
url = "https://tickets.test/api/issues/{external_ref}"
method = "DELETE"
"#;

    fn catalog() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("catalog.toml");
        std::fs::write(&path, CATALOG).expect("written");
        (dir, path)
    }

    #[tokio::test]
    async fn explain_shows_each_rule_and_what_decided() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("catalog.toml");
        let text = format!(
            "{CATALOG}\n[[tool.rule]]\nname = \"urgent\"\nwhen = \"args.title.startsWith('URGENT')\"\nthen = \"require_approval\"\n\n[[rule]]\nname = \"trial\"\nwhen = \"tenant == 'trial'\"\nthen = \"deny\"\n"
        );
        std::fs::write(&path, text).expect("written");
        let who = |args: &'static str, tenant: Option<&'static str>| Who {
            tool: "tickets/create",
            args,
            run_id: "r-1",
            tenant,
            submitter: None,
            at: Some("2026-12-07T10:00:00Z"),
            budget_used: &[],
        };
        let out = explain(&path, &who(r#"{"title": "URGENT: disk"}"#, None), false)
            .await
            .expect("explained");
        assert!(
            out.contains(
                "tool rule urgent (require_approval when args.title.startsWith('URGENT')): holds"
            ),
            "{out}"
        );
        assert!(
            out.contains("catalog rule trial (deny when tenant == 'trial'): does not hold"),
            "{out}"
        );
        assert!(
            out.ends_with("decided by rule urgent: require approval: rule urgent"),
            "{out}"
        );

        let out = explain(&path, &who(r#"{"title": "disk"}"#, Some("trial")), true)
            .await
            .expect("explained");
        let parsed: Value = serde_json::from_str(&out).expect("JSON");
        assert_eq!(parsed["decided_by"], "trial");
        assert_eq!(parsed["decision"]["decision"], "deny");

        let out = explain(&path, &who(r#"{"title": "disk"}"#, None), false)
            .await
            .expect("explained");
        assert!(
            out.ends_with(
                "decided by the tool's [tool.policy] (requires_approval, approve_above): allow"
            ),
            "{out}"
        );

        let err = explain(&path, &who(r#"{"title": 5}"#, None), false)
            .await
            .expect_err("bad args");
        assert!(
            err.starts_with("--args do not fit tool tickets/create"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn explain_reads_budgets_as_given_and_names_the_covering_ones() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("catalog.toml");
        let text = r#"
[[tool]]
name = "payments/wire"
semantics = "IDEMPOTENT"
schema = { type = "object", required = ["amount_minor"], properties = { amount_minor = { type = "integer", minimum = 0 } } }
[tool.dispatch]
url = "https://bank.test/wires"
[tool.money.amount_minor]
currency = "EUR"
minor_units = 2
[[tool.rule]]
name = "most-of-the-day"
when = "budgets.daily.used + budgets.daily.amount > budgets.daily.limit * 8 / 10"
then = "require_approval"

[budgets.daily]
tools = ["payments/wire"]
scope = "tenant"
window = "day"
limits = { EUR = 1000 }
on_exceed = "deny"
"#;
        std::fs::write(&path, text).expect("written");
        let explain_with = |used: Vec<String>| {
            let path = path.clone();
            async move {
                explain(
                    &path,
                    &Who {
                        tool: "payments/wire",
                        args: r#"{"amount_minor": 300}"#,
                        run_id: "r-1",
                        tenant: None,
                        submitter: None,
                        at: Some("2026-12-07T10:00:00Z"),
                        budget_used: &used,
                    },
                    false,
                )
                .await
            }
        };
        let nothing_held = explain_with(Vec::new()).await.expect("explained");
        assert!(nothing_held.ends_with(": allow"), "{nothing_held}");
        let most_held = explain_with(vec!["daily=501".into()])
            .await
            .expect("explained");
        assert!(
            most_held.ends_with(
                "decided by rule most-of-the-day: require approval: rule most-of-the-day"
            ),
            "{most_held}"
        );
        let unknown = explain_with(vec!["weekly=1".into()])
            .await
            .expect_err("no such budget");
        assert!(
            unknown.contains("no budget \"weekly\" covers payments/wire (covering: daily)"),
            "{unknown}"
        );
        let malformed = explain_with(vec!["daily".into()])
            .await
            .expect_err("no amount");
        assert!(malformed.contains("write NAME=MINOR_UNITS"), "{malformed}");
    }

    #[tokio::test]
    async fn check_names_every_secret_that_cannot_be_read() {
        let (_dir, path) = catalog();
        let err = check(&path).await.expect_err("the variable is not set");
        assert!(
            err.contains("credential api: env SLUICE_CATALOG_CMD_TEST_NEVER_SET is not set"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn requests_prints_each_endpoint_with_the_secret_masked() {
        let (_dir, path) = catalog();
        let out = requests(
            &path,
            "tickets/create",
            r#"{"title": "printer"}"#,
            "r-1",
            2,
            0,
            "PRJ-7",
        )
        .await
        .expect("renders");
        assert!(
            out.contains("== dispatch\nPOST https://tickets.test/api/issues\n"),
            "{out}"
        );
        assert!(
            out.contains("x-api-key: <secret: env SLUICE_CATALOG_CMD_TEST_NEVER_SET>"),
            "{out}"
        );
        assert!(out.contains("\"summary\": \"printer\""), "{out}");
        assert!(
            out.contains("idempotency-key: r-1/d-2/tickets/create/0\n"),
            "{out}"
        );
        assert!(
            out.contains("== compensate\nDELETE https://tickets.test/api/issues/PRJ-7\n"),
            "{out}"
        );
        let bad = requests(&path, "tickets/create", r#"{"title": 7}"#, "r-1", 1, 0, "x")
            .await
            .expect_err("a number is not a title");
        assert!(
            bad.contains("--args do not fit tool tickets/create"),
            "{bad}"
        );
    }
}
