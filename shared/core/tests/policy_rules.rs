//! Policy rules (`[[rule]]`, `[[tool.rule]]`): how they load, what refuses them, and how they
//! combine with each other, the tool's knobs and approvals.

use serde_json::{Value, json};
use sluice_core::catalog::{Catalog, CatalogError, Tool};
use sluice_core::command::Approval;
use sluice_core::policy::{PolicyDecision, RuleInput, RuleVerdict, evaluate, explain};
use sluice_core::time::Timestamp;

const WIRE: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
allow_unsafe = true
schema = { type = "object", required = ["amount_minor", "currency", "to"], properties = { amount_minor = { type = "integer", minimum = 1 }, currency = { type = "string", enum = ["EUR", "USD"] }, to = { type = "string" }, memo = { type = "string" } } }
[tool.dispatch]
url = "http://bank/wires"
"#;

fn catalog(extra: &str) -> Result<Catalog, CatalogError> {
    Catalog::from_toml_str(&format!("{WIRE}\n{extra}"), "rules.toml")
}

fn wire(catalog: &Catalog) -> &Tool {
    catalog.resolve("payments/wire").expect("declared")
}

struct Who {
    tenant: Option<&'static str>,
    submitter: Option<&'static str>,
    at: &'static str,
}

const NOBODY: Who = Who {
    tenant: None,
    submitter: None,
    at: "2026-12-07T10:00:00Z",
};

fn input<'a>(tool: &'a Tool, args: &'a Value, who: &Who) -> RuleInput<'a> {
    RuleInput {
        args,
        tool: tool.name(),
        run: "run-7",
        tenant: who.tenant,
        submitter: who.submitter,
        now: Timestamp::parse_rfc3339(who.at).expect("a time"),
        budgets: &[],
    }
}

fn decide(
    catalog: &Catalog,
    args: &Value,
    who: &Who,
    approval: Option<&Approval>,
) -> PolicyDecision {
    let tool = wire(catalog);
    evaluate(
        tool,
        &input(tool, args, who),
        approval,
        catalog.policy_version(),
    )
}

fn approval(version: &str) -> Approval {
    Approval {
        approver: "alice".into(),
        reason: "checked".into(),
        at: Timestamp::from_millis(1),
        policy_version: version.into(),
    }
}

fn args(amount: i64, currency: &str, to: &str) -> Value {
    json!({"amount_minor": amount, "currency": currency, "to": to})
}

fn reason(decision: &PolicyDecision) -> &str {
    match decision {
        PolicyDecision::RequireApproval { reason } | PolicyDecision::Deny { reason } => reason,
        PolicyDecision::Allow => panic!("allowed, expected a restriction"),
    }
}

const LARGE_EUR: &str = r#"
[[tool.rule]]
name = "large-eur"
when = "args.currency == 'EUR' && args.amount_minor > 100000"
then = "require_approval"
reason = "a large wire in euros"
"#;

#[test]
fn a_tool_rule_requires_approval_with_its_name_as_the_reason_and_an_approval_lifts_it() {
    let catalog = catalog(LARGE_EUR).expect("valid");
    assert_eq!(
        decide(&catalog, &args(100_000, "EUR", "x"), &NOBODY, None),
        PolicyDecision::Allow
    );
    assert_eq!(
        decide(&catalog, &args(500_000, "USD", "x"), &NOBODY, None),
        PolicyDecision::Allow
    );
    let blocked = decide(&catalog, &args(100_001, "EUR", "x"), &NOBODY, None);
    assert!(
        matches!(blocked, PolicyDecision::RequireApproval { .. }),
        "{blocked:?}"
    );
    assert_eq!(reason(&blocked), "rule large-eur: a large wire in euros");
    assert_eq!(
        decide(
            &catalog,
            &args(100_001, "EUR", "x"),
            &NOBODY,
            Some(&approval("1"))
        ),
        PolicyDecision::Allow
    );
    let stale = decide(
        &catalog,
        &args(100_001, "EUR", "x"),
        &NOBODY,
        Some(&approval("0")),
    );
    assert!(
        reason(&stale).contains("given under policy version 0"),
        "{stale:?}"
    );
}

#[test]
fn deny_beats_approval_beats_allow_whatever_their_order() {
    // The tool's own rule follows its [[tool]] entry; the catalog's come after, in an order
    // that would let a first-match reading allow everything.
    let rules = r#"
[[tool.rule]]
name = "large"
when = "args.amount_minor > 1000"
then = "require_approval"

[[rule]]
name = "anything-goes"
when = "true"
then = "allow"

[[rule]]
name = "sanctioned"
tools = ["payments/*"]
when = "args.to.startsWith('sanctioned-')"
then = "deny"
"#;
    let catalog = catalog(rules).expect("valid");
    assert_eq!(
        decide(&catalog, &args(5, "EUR", "bob"), &NOBODY, None),
        PolicyDecision::Allow
    );
    let large = decide(&catalog, &args(5_000, "EUR", "bob"), &NOBODY, None);
    assert_eq!(reason(&large), "rule large");
    let denied = decide(
        &catalog,
        &args(5_000, "EUR", "sanctioned-bob"),
        &NOBODY,
        Some(&approval("1")),
    );
    assert!(
        matches!(denied, PolicyDecision::Deny { .. }),
        "no approval lifts a deny: {denied:?}"
    );
    assert_eq!(reason(&denied), "rule sanctioned");
}

#[test]
fn an_allow_rule_that_holds_passes_the_tools_own_knobs_and_only_then() {
    let knobs = "[tool.policy]\nrequires_approval = true\n";
    let rules = r#"
[[tool.rule]]
name = "small-internal"
when = "args.amount_minor <= 100 && args.to.endsWith('@internal')"
then = "allow"
"#;
    let catalog = catalog(&format!("{knobs}{rules}")).expect("valid");
    assert_eq!(
        decide(&catalog, &args(50, "EUR", "ops@internal"), &NOBODY, None),
        PolicyDecision::Allow
    );
    let outside = decide(&catalog, &args(50, "EUR", "ops@elsewhere"), &NOBODY, None);
    assert_eq!(reason(&outside), "tool payments/wire requires approval");
}

#[test]
fn tenant_submitter_run_and_time_are_there_to_be_named() {
    let rules = r#"
[[tool.rule]]
name = "night"
when = "now.getHours() >= 22 || now.getHours() < 6"
then = "require_approval"

[[tool.rule]]
name = "trial-tenant"
when = "tenant == 'trial'"
then = "deny"

[[tool.rule]]
name = "interns"
when = "submitter != null && submitter.startsWith('intern-') && run.startsWith('run-')"
then = "require_approval"
"#;
    let catalog = catalog(rules).expect("valid");
    let small = args(5, "EUR", "bob");
    assert_eq!(
        decide(&catalog, &small, &NOBODY, None),
        PolicyDecision::Allow
    );
    let night = Who {
        at: "2026-12-07T23:30:00Z",
        ..NOBODY
    };
    assert_eq!(
        reason(&decide(&catalog, &small, &night, None)),
        "rule night"
    );
    let trial = Who {
        tenant: Some("trial"),
        ..NOBODY
    };
    assert!(matches!(
        decide(&catalog, &small, &trial, None),
        PolicyDecision::Deny { .. }
    ));
    let intern = Who {
        submitter: Some("intern-7"),
        ..NOBODY
    };
    assert_eq!(
        reason(&decide(&catalog, &small, &intern, None)),
        "rule interns"
    );
}

#[test]
fn a_condition_that_cannot_be_evaluated_restricts_and_never_allows() {
    // `memo` is declared but optional: a command without it makes `args.memo` fail.
    let rules = r#"
[[tool.rule]]
name = "memo-says-urgent"
when = "args.memo == 'urgent'"
then = "allow"

[[tool.rule]]
name = "memo-mentions-crypto"
when = "args.memo.contains('crypto')"
then = "require_approval"
"#;
    let catalog = catalog(rules).expect("valid");
    let without_memo = args(5, "EUR", "bob");
    let decision = decide(&catalog, &without_memo, &NOBODY, None);
    let why = reason(&decision);
    assert!(why.starts_with("rule memo-mentions-crypto"), "{why}");
    assert!(why.contains("could not be evaluated"), "{why}");
    assert!(why.contains("\"memo\""), "names the field: {why}");

    let tool = wire(&catalog);
    let explained = explain(tool, &input(tool, &without_memo, &NOBODY), None, "1");
    assert_eq!(
        explained.decided_by.as_deref(),
        Some("memo-mentions-crypto")
    );
    assert!(matches!(
        explained.rules[0].verdict,
        RuleVerdict::Error { .. }
    ));
    assert_eq!(explained.rules[0].then, "allow");
}

#[test]
fn explain_names_every_rule_and_which_decided() {
    let rules = format!(
        "{LARGE_EUR}\n[[rule]]\nname = \"usd\"\nwhen = \"args.currency == 'USD'\"\nthen = \"deny\"\n"
    );
    let catalog = catalog(&rules).expect("valid");
    let tool = wire(&catalog);
    let big = args(200_000, "EUR", "x");
    let explained = explain(tool, &input(tool, &big, &NOBODY), None, "1");
    let verdicts: Vec<(&str, &str, &RuleVerdict)> = explained
        .rules
        .iter()
        .map(|rule| (rule.rule.as_str(), rule.scope, &rule.verdict))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("large-eur", "tool", &RuleVerdict::Holds),
            ("usd", "catalog", &RuleVerdict::DoesNotHold)
        ]
    );
    assert_eq!(explained.decided_by.as_deref(), Some("large-eur"));

    let small = args(5, "EUR", "x");
    let explained = explain(tool, &input(tool, &small, &NOBODY), None, "1");
    assert_eq!(
        explained.decided_by, None,
        "no rule held: the knobs decided"
    );
    assert_eq!(explained.decision, PolicyDecision::Allow);
}

#[test]
fn a_catalog_rule_covers_only_the_tools_it_names() {
    let email = r#"
[[tool]]
name = "email/send"
semantics = "IDEMPOTENT"
schema = { type = "object", properties = { to = { type = "string" } } }
[tool.dispatch]
url = "http://mail/send"

[[rule]]
name = "outside"
tools = ["email/*"]
when = "!args.to.endsWith('@example.com')"
then = "require_approval"
"#;
    let catalog = catalog(email).expect("valid: the rule is checked only against email/send");
    assert!(wire(&catalog).policy_rules().is_empty());
    let send = catalog.resolve("email/send").expect("declared");
    assert_eq!(send.policy_rules().len(), 1);
}

fn refused(extra: &str) -> String {
    catalog(extra).expect_err("must be refused").to_string()
}

#[test]
fn load_errors_name_the_file_the_tool_and_the_rule() {
    let cases: [(&str, &str); 9] = [
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"args.amount_minor >\"\nthen = \"deny\"\n",
            "rules.toml: tool payments/wire: rule r: not valid CEL",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"request.amount > 1\"\nthen = \"deny\"\n",
            "rule r: when names \"request\", which is not one of args, tool, tenant, run, submitter, now",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"args.amount > 1\"\nthen = \"deny\"\n",
            "rules.toml: tool payments/wire: rule r: with arguments like",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"args.amount_minor > 'a lot'\"\nthen = \"deny\"\n",
            "a number compared with a string?",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"args.amount_minor * 2 + 1\"\nthen = \"deny\"\n",
            "the condition gives a number, not true or false",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\ntools = [\"*\"]\nwhen = \"true\"\nthen = \"deny\"\n",
            "tools belongs to a catalog-wide [[rule]]",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"true\"\nthen = \"deny\"\n[[tool.rule]]\nname = \"r\"\nwhen = \"false\"\nthen = \"deny\"\n",
            "rule r: the name is used by another rule of this tool",
        ),
        (
            "[[rule]]\nname = \"r\"\ntools = [\"wire\"]\nwhen = \"true\"\nthen = \"deny\"\n",
            "rules.toml: rule r: tools: \"wire\" is not",
        ),
        (
            "[[tool.rule]]\nname = \"r\"\nwhen = \"true\"\nthen = \"maybe\"\n",
            "rule r: then: unknown variant `maybe`",
        ),
    ];
    for (extra, expected) in cases {
        let shown = refused(extra);
        assert!(
            shown.contains(expected),
            "{extra}\n→ {shown}\nexpected: {expected}"
        );
    }
}

#[test]
fn a_catalog_rule_meets_each_tool_it_covers_at_load() {
    let shown = refused(
        "[[rule]]\nname = \"needs-iban\"\nwhen = \"args.iban.startsWith('DE')\"\nthen = \"deny\"\n",
    );
    assert!(
        shown.starts_with("rules.toml: tool payments/wire: rule needs-iban: with arguments like"),
        "{shown}"
    );
    assert!(shown.contains("\"iban\""), "{shown}");
    let shown = refused(
        "[[tool.rule]]\nname = \"dup\"\nwhen = \"true\"\nthen = \"allow\"\n[[rule]]\nname = \"dup\"\nwhen = \"false\"\nthen = \"deny\"\n",
    );
    assert!(
        shown.contains("has the name of a [[rule]] that covers it"),
        "{shown}"
    );
}

#[test]
fn a_condition_is_a_policy_not_a_program() {
    let long = format!("args.to == '{}'", "x".repeat(5000));
    let shown = refused(&format!(
        "[[tool.rule]]\nname = \"r\"\nwhen = \"{long}\"\nthen = \"deny\"\n"
    ));
    assert!(shown.contains("at most 4096 are accepted"), "{shown}");
}

#[test]
fn arithmetic_on_arguments_means_what_it_says() {
    let rules = "[[tool.rule]]\nname = \"r\"\nwhen = \"args.amount_minor + 1 > 10 && args.amount_minor * 2 < 100\"\nthen = \"deny\"\n";
    let catalog = catalog(rules).expect("valid: JSON integers are CEL ints");
    assert_eq!(
        decide(&catalog, &args(9, "EUR", "x"), &NOBODY, None),
        PolicyDecision::Allow
    );
    assert!(matches!(
        decide(&catalog, &args(10, "EUR", "x"), &NOBODY, None),
        PolicyDecision::Deny { .. }
    ));
    assert_eq!(
        decide(&catalog, &args(50, "EUR", "x"), &NOBODY, None),
        PolicyDecision::Allow
    );
}

/// The wire, counted by a daily budget of 10,000.00 EUR per tenant.
const DAILY: &str = r#"
[tool.money.amount_minor]
currency = "EUR"
minor_units = 2

[[tool.rule]]
name = "most-of-the-day"
when = "budgets.daily_wires.used + budgets.daily_wires.amount > budgets.daily_wires.limit * 8 / 10"
then = "require_approval"
reason = "past 80% of the day's wires"

[budgets.daily_wires]
tools = ["payments/wire"]
scope = "tenant"
window = "day"
limits = { EUR = 1000000 }
on_exceed = "deny"
"#;

fn view(used: i64, amount: i64) -> sluice_core::budget::BudgetView {
    sluice_core::budget::BudgetView {
        budget: "daily_wires".into(),
        currency: "EUR".into(),
        window: sluice_core::budget::Window::Day,
        limit: 1_000_000,
        used,
        amount,
    }
}

#[test]
fn a_rule_reads_the_budgets_covering_the_command_as_they_stand() {
    let catalog = catalog(DAILY).expect("valid");
    let tool = wire(&catalog);
    assert!(tool.rules_use_budgets());
    let args = args(100_000, "EUR", "x");
    let decide = |views: &[sluice_core::budget::BudgetView]| {
        evaluate(
            tool,
            &input(tool, &args, &NOBODY).with_budgets(views),
            None,
            catalog.policy_version(),
        )
    };
    // 7,000 + 1,000 of 10,000: 80%, not past it.
    assert_eq!(decide(&[view(700_000, 100_000)]), PolicyDecision::Allow);
    let past = decide(&[view(700_001, 100_000)]);
    assert_eq!(
        reason(&past),
        "rule most-of-the-day: past 80% of the day's wires"
    );
    // Without the counters (an evaluator that did not read them), the restricting rule cannot
    // be evaluated and counts as holding: fail closed, saying why.
    let unread = decide(&[]);
    assert!(
        reason(&unread).contains("could not be evaluated"),
        "{unread:?}"
    );
}

#[test]
fn every_budget_field_is_a_variable_and_remaining_is_what_the_limit_leaves() {
    let catalog = catalog(&DAILY.replace(
        "budgets.daily_wires.used + budgets.daily_wires.amount > budgets.daily_wires.limit * 8 / 10",
        "budgets.daily_wires.remaining < budgets.daily_wires.amount && budgets.daily_wires.currency == 'EUR' && budgets.daily_wires.window == 'day'",
    ))
    .expect("valid");
    let tool = wire(&catalog);
    let args = args(100_000, "EUR", "x");
    let explained = explain(
        tool,
        &input(tool, &args, &NOBODY).with_budgets(&[view(900_001, 100_000)]),
        None,
        "1",
    );
    assert_eq!(explained.decided_by.as_deref(), Some("most-of-the-day"));
    assert_eq!(explained.rules[0].verdict, RuleVerdict::Holds);
    let fits = explain(
        tool,
        &input(tool, &args, &NOBODY).with_budgets(&[view(900_000, 100_000)]),
        None,
        "1",
    );
    assert_eq!(fits.rules[0].verdict, RuleVerdict::DoesNotHold);
}

#[test]
fn a_rule_naming_a_budget_that_does_not_cover_the_tool_is_a_load_error() {
    let error = catalog(&DAILY.replace("budgets.daily_wires.used +", "budgets.weekly.used +"))
        .expect_err("no budget weekly");
    let shown = error.to_string();
    assert!(
        shown.contains("most-of-the-day")
            && shown.contains("\"weekly\"")
            && shown.contains("budgets covering this tool: daily_wires"),
        "{shown}"
    );
    // A catalog-wide rule over a tool no budget covers says which; `has()` guards it.
    let email = r#"
[[tool]]
name = "email/send"
semantics = "IDEMPOTENT"
schema = { type = "object", properties = { to = { type = "string" } } }
[tool.dispatch]
url = "http://mail/send"
"#;
    let unguarded = r#"
[[rule]]
name = "day-nearly-spent"
when = "budgets.daily_wires.remaining < 100000"
then = "require_approval"
"#;
    let with_budget = DAILY.replace(
        "[[tool.rule]]\nname = \"most-of-the-day\"",
        "[[tool.rule]]\nname = \"own\"",
    );
    let error = catalog(&format!("{with_budget}\n{email}\n{unguarded}"))
        .expect_err("email/send has no budget");
    let shown = error.to_string();
    assert!(
        shown.contains("email/send")
            && shown.contains("day-nearly-spent")
            && shown.contains("no budget covers this tool"),
        "{shown}"
    );
    let guarded = unguarded.replace(
        "budgets.daily_wires.remaining < 100000",
        "has(budgets.daily_wires) && budgets.daily_wires.remaining < 100000",
    );
    let loaded = catalog(&format!("{with_budget}\n{email}\n{guarded}")).expect("guarded");
    assert!(
        loaded
            .resolve("email/send")
            .expect("declared")
            .rules_use_budgets()
    );
}

#[test]
fn what_others_hold_leaves_out_the_commands_own_hold() {
    use sluice_core::budget::{HoldState, used_by_others};
    assert_eq!(used_by_others(500, []), 500);
    assert_eq!(used_by_others(500, [(200, HoldState::Held)]), 300);
    assert_eq!(used_by_others(500, [(200, HoldState::Deferred)]), 500);
    assert_eq!(used_by_others(500, [(200, HoldState::Released)]), 500);
    assert_eq!(
        used_by_others(500, [(200, HoldState::Held), (100, HoldState::Held)]),
        200
    );
}
