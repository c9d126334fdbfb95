//! Spend budgets (`[budgets.<name>]`): how they load, what refuses them, and what the core
//! decides — the lines of a command, windows, scopes, fits, and what each status change does
//! to a hold.

use serde_json::{Value, json};
use sluice_core::budget::{
    Budget, HoldChange, HoldState, OnExceed, Scope, Window, apply_change, fits, hold_change, lines,
};
use sluice_core::catalog::{Catalog, CatalogError};
use sluice_core::command::{Command, CommandStatus, EffectSemantics, Intent};
use sluice_core::ids::{CommandKey, RunId, ToolName};
use sluice_core::time::Timestamp;

const TOOLS: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
allow_unsafe = true
schema = { type = "object", required = ["amount_minor", "to"], properties = { amount_minor = { type = "integer" }, fee_minor = { type = "integer" }, to = { type = "string" } } }
[tool.money.amount_minor]
currency = "EUR"
minor_units = 2
[tool.dispatch]
url = "http://bank/wires"

[[tool]]
name = "payments/refund"
semantics = "NON_IDEMPOTENT"
allow_unsafe = true
schema = { type = "object", required = ["amount_minor"], properties = { amount_minor = { type = "integer" } } }
[tool.money.amount_minor]
currency = "USD"
minor_units = 2
[tool.dispatch]
url = "http://bank/refunds"

[[tool]]
name = "email/send"
semantics = "IDEMPOTENT"
schema = { type = "object", properties = { to = { type = "string" } } }
[tool.dispatch]
url = "http://mail/send"
"#;

fn catalog(budgets: &str) -> Result<Catalog, CatalogError> {
    Catalog::from_toml_str(&format!("{TOOLS}\n{budgets}"), "budgets.toml")
}

fn refused(budgets: &str) -> String {
    catalog(budgets).expect_err("refused").to_string()
}

const DAILY: &str = r#"
[budgets.daily_wires]
tools = ["payments/*"]
scope = "tenant"
window = "day"
limits = { EUR = 5000000 }
on_exceed = "deny"
"#;

fn at(text: &str) -> Timestamp {
    Timestamp::parse_rfc3339(text).expect("a time")
}

fn command(tool: &str, run: &str, tenant: Option<&str>, args: Value) -> Command {
    let tool = ToolName::parse(tool).expect("a tool");
    let command = Command::from_intent(
        Intent {
            run_id: RunId::parse(run).expect("a run"),
            command_key: CommandKey::new(1, tool, 0),
            semantics: EffectSemantics::NonIdempotent,
            args,
            business_key: None,
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        Timestamp::from_millis(0),
        30_000,
    );
    match tenant {
        Some(tenant) => command.for_tenant(tenant),
        None => command,
    }
}

#[test]
fn a_budget_loads_with_the_field_and_currency_of_each_covered_tool() {
    let catalog = catalog(DAILY).expect("loads");
    let [budget] = catalog.budgets() else {
        panic!("one budget")
    };
    assert_eq!(budget.name, "daily_wires");
    assert_eq!(budget.scope, Scope::Tenant);
    assert_eq!(budget.window, Window::Day);
    assert_eq!(budget.on_exceed, OnExceed::Deny);
    assert_eq!(
        budget.fields.get("payments/wire"),
        Some(&("amount_minor".to_owned(), "EUR".to_owned()))
    );
    assert_eq!(
        budget.fields.get("payments/refund"),
        Some(&("amount_minor".to_owned(), "USD".to_owned()))
    );
    assert!(!budget.fields.contains_key("email/send"));
}

#[test]
fn load_refuses_what_would_let_a_command_escape_or_is_misspelt() {
    let cases = [
        (
            DAILY.replace("tools = [\"payments/*\"]", "tools = [\"email/*\"]"),
            "budgets.daily_wires: tools: tool email/send covered by the budget declares no [tool.money] field",
        ),
        (
            DAILY.replace("tools = [\"payments/*\"]", "tools = [\"crm/*\"]"),
            "budgets.daily_wires: tools: [\"crm/*\"] covers no tool",
        ),
        (
            DAILY.replace("tools = [\"payments/*\"]", "tools = []"),
            "budgets.daily_wires: tools: list the tools",
        ),
        (
            DAILY.replace("tools = [\"payments/*\"]", "tools = [\"Payments/*\"]"),
            "budgets.daily_wires: tools: \"Payments/*\" is not",
        ),
        (
            DAILY.replace("EUR = 5000000", "eur = 5000000"),
            "budgets.daily_wires: limits: currency \"eur\" is not an ISO 4217 code",
        ),
        (
            DAILY.replace("EUR = 5000000", "EUR = 0"),
            "budgets.daily_wires: limits: the limit for EUR must be a positive",
        ),
        (
            DAILY.replace("limits = { EUR = 5000000 }", "limits = {}"),
            "budgets.daily_wires: limits: give at least one limit",
        ),
        (
            DAILY.replace("window = \"day\"", "window = \"week\""),
            "budgets.daily_wires: budget: window: unknown variant `week`",
        ),
        (
            DAILY.replace("scope = \"tenant\"", "scope = \"tenant\"\ncap = 1"),
            "budgets.daily_wires: budget: unknown field `cap`",
        ),
        (
            DAILY.replace("[budgets.daily_wires]", "[budgets.Daily]"),
            "budgets.Daily: name:",
        ),
        (
            DAILY.replace(
                "tools = [\"payments/*\"]",
                "tools = [\"payments/wire\"]\nfield = \"fee_minor\"",
            ),
            "budgets.daily_wires: field: tool payments/wire covered by the budget declares no [tool.money.fee_minor]",
        ),
    ];
    for (budgets, expected) in cases {
        let error = refused(&budgets);
        assert!(
            error.contains(expected),
            "{error:?} should contain {expected:?}"
        );
        assert!(error.starts_with("budgets.toml: "), "{error}");
    }
}

#[test]
fn an_amount_the_schema_does_not_require_is_refused() {
    let tools = TOOLS.replace(
        "required = [\"amount_minor\", \"to\"]",
        "required = [\"to\"]",
    );
    let error = Catalog::from_toml_str(&format!("{tools}\n{DAILY}"), "budgets.toml")
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("tool payments/wire: list \"amount_minor\" in the schema's required"),
        "{error}"
    );
}

#[test]
fn two_money_fields_need_the_budget_to_name_one() {
    let tools = TOOLS.replacen(
        "[tool.dispatch]\nurl = \"http://bank/wires\"",
        "[tool.money.fee_minor]\ncurrency = \"EUR\"\nminor_units = 2\n[tool.dispatch]\nurl = \"http://bank/wires\"",
        1,
    );
    let error = Catalog::from_toml_str(&format!("{tools}\n{DAILY}"), "budgets.toml")
        .expect_err("refused")
        .to_string();
    assert!(
        error.contains("tool payments/wire declares 2 [tool.money] fields"),
        "{error}"
    );
}

fn daily(catalog: &Catalog) -> Vec<Budget> {
    catalog.budgets().to_vec()
}

#[test]
fn a_command_gets_one_line_per_covering_budget_with_a_limit_in_its_currency() {
    let catalog = catalog(DAILY).expect("loads");
    let now = at("2026-12-07T10:30:00Z");
    let wire = command(
        "payments/wire",
        "run-1",
        Some("acme"),
        json!({"amount_minor": 1250, "to": "x"}),
    );
    let got = lines(&daily(&catalog), &wire, now).expect("counted");
    assert_eq!(got.len(), 1);
    let line = &got[0];
    assert_eq!(line.amount, 1250);
    assert_eq!(line.limit, 5_000_000);
    assert_eq!(line.currency, "EUR");
    assert_eq!(line.scope_value, "acme");
    assert_eq!(line.window_start, at("2026-12-07T00:00:00Z").as_millis());
    // USD has no limit in this budget: a refund is not counted.
    let refund = command(
        "payments/refund",
        "run-1",
        Some("acme"),
        json!({"amount_minor": 99}),
    );
    assert_eq!(lines(&daily(&catalog), &refund, now).expect("counted"), []);
    // Not covered at all.
    let mail = command("email/send", "run-1", Some("acme"), json!({"to": "x"}));
    assert_eq!(lines(&daily(&catalog), &mail, now).expect("counted"), []);
    // A negative amount would give room back: refused.
    let negative = command(
        "payments/wire",
        "run-1",
        Some("acme"),
        json!({"amount_minor": -5, "to": "x"}),
    );
    let error = lines(&daily(&catalog), &negative, now).expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("budget daily_wires: argument \"amount_minor\""),
        "{error}"
    );
}

#[test]
fn scopes_and_windows_pick_the_counter() {
    let now = at("2026-12-07T10:30:00Z");
    let wire = command(
        "payments/wire",
        "run-9",
        None,
        json!({"amount_minor": 10, "to": "x"}),
    );
    let cases = [
        ("run", "hour", "run-9", "2026-12-07T10:00:00Z"),
        ("tenant", "day", "anonymous", "2026-12-07T00:00:00Z"),
        ("tool", "total", "payments/wire", "1970-01-01T00:00:00Z"),
    ];
    for (scope, window, value, start) in cases {
        let budgets = DAILY
            .replace("scope = \"tenant\"", &format!("scope = \"{scope}\""))
            .replace("window = \"day\"", &format!("window = \"{window}\""));
        let catalog = catalog(&budgets).expect("loads");
        let got = lines(&daily(&catalog), &wire, now).expect("counted");
        assert_eq!(got[0].scope_value, value, "{scope}");
        assert_eq!(got[0].window_start, at(start).as_millis(), "{window}");
        // Two commands in one scope and window share a counter; the next window does not.
        let later = lines(
            &daily(&catalog),
            &wire,
            Timestamp::from_millis(now.as_millis() + 3_600_000),
        )
        .expect("counted");
        assert_eq!(later[0].counter == got[0].counter, window != "hour");
    }
}

#[test]
fn fits_up_to_the_limit_and_never_past_it_or_by_overflow() {
    assert!(fits(0, 5_000_000, 5_000_000));
    assert!(fits(4_999_500, 500, 5_000_000));
    assert!(!fits(4_999_501, 500, 5_000_000));
    assert!(!fits(i64::MAX - 1, 10, i64::MAX));
    assert!(fits(0, 0, 1));
}

#[test]
fn ending_without_spending_releases_and_a_replay_takes_it_back() {
    use CommandStatus as S;
    let cases = [
        (S::Leased, S::Failed, HoldChange::Release),
        (S::Blocked, S::Cancelled, HoldChange::Release),
        (S::Pending, S::Cancelled, HoldChange::Release),
        (S::Compensating, S::Compensated, HoldChange::Release),
        (S::Unknown, S::Failed, HoldChange::Release),
        (S::Stuck, S::Failed, HoldChange::Release),
        (S::Blocked, S::Approved, HoldChange::Activate),
        (S::Failed, S::Pending, HoldChange::Reclaim),
        (S::Cancelled, S::Pending, HoldChange::Reclaim),
        // May have committed: the money stays counted until a person resolves it.
        (S::Unknown, S::Stuck, HoldChange::Keep),
        (S::Leased, S::Unknown, HoldChange::Keep),
        (S::Compensating, S::CompensationFailed, HoldChange::Keep),
        (S::Leased, S::Confirmed, HoldChange::Keep),
        (S::Confirmed, S::Compensating, HoldChange::Keep),
        (S::Failed, S::Failed, HoldChange::Keep),
    ];
    for (from, to, change) in cases {
        assert_eq!(hold_change(from, to), change, "{from} -> {to}");
    }
    assert_eq!(
        apply_change(HoldState::Held, 70, HoldChange::Release),
        (HoldState::Released, -70)
    );
    // Idempotent: a second release moves nothing.
    assert_eq!(
        apply_change(HoldState::Released, 70, HoldChange::Release),
        (HoldState::Released, 0)
    );
    assert_eq!(
        apply_change(HoldState::Deferred, 70, HoldChange::Release),
        (HoldState::Released, 0)
    );
    assert_eq!(
        apply_change(HoldState::Deferred, 70, HoldChange::Activate),
        (HoldState::Held, 70)
    );
    assert_eq!(
        apply_change(HoldState::Held, 70, HoldChange::Activate),
        (HoldState::Held, 0)
    );
    assert_eq!(
        apply_change(HoldState::Released, 70, HoldChange::Reclaim),
        (HoldState::Held, 70)
    );
}
