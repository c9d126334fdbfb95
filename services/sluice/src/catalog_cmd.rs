//! `sluice catalog`: for catalog authors. `check` loads a catalog and reads every secret its
//! credentials reference, as the services do at start; `requests` prints, for given arguments,
//! the exact request each of a tool's endpoints would send, secrets masked, sending nothing.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::Value;
use sluice_connector::credentials::Secrets;
use sluice_connector::preview;
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, Intent};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::{Clock, SystemClock};

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
}

/// Runs the subcommand; the text to print, or what was wrong.
pub fn run(args: CatalogArgs) -> Result<String, String> {
    match args.command {
        CatalogCommand::Check { catalog } => check(&catalog),
        CatalogCommand::Requests {
            catalog,
            tool,
            args,
            run_id,
            decision,
            call,
            external_ref,
        } => requests(
            &catalog,
            &tool,
            &args,
            &run_id,
            decision,
            call,
            &external_ref,
        ),
    }
}

fn check(path: &std::path::Path) -> Result<String, String> {
    let catalog = Catalog::load(path).map_err(|e| e.to_string())?;
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
    Ok(format!(
        "{}: {} tool(s), {} credential(s); every referenced secret can be read",
        catalog.source_name(),
        catalog.len(),
        credentials
    ))
}

fn requests(
    path: &std::path::Path,
    tool: &str,
    args: &str,
    run_id: &str,
    decision: u32,
    call: u32,
    external_ref: &str,
) -> Result<String, String> {
    let catalog = Catalog::load(path).map_err(|e| e.to_string())?;
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

    #[test]
    fn check_names_every_secret_that_cannot_be_read() {
        let (_dir, path) = catalog();
        let err = check(&path).expect_err("the variable is not set");
        assert!(
            err.contains("credential api: env SLUICE_CATALOG_CMD_TEST_NEVER_SET is not set"),
            "{err}"
        );
    }

    #[test]
    fn requests_prints_each_endpoint_with_the_secret_masked() {
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
            .expect_err("a number is not a title");
        assert!(
            bad.contains("--args do not fit tool tickets/create"),
            "{bad}"
        );
    }
}
