//! The tool catalog as operators meet it: the shipped `deploy/catalog.toml` loads and means what
//! its comments say, and every kind of mistake is refused with an error naming the file, the
//! tool and the key.

use serde_json::json;
use sluice_core::catalog::{
    Catalog, CatalogError, HttpMethod, ReferenceSource, UrlKeys, render_url,
};
use sluice_core::machine::OnAbsent;
use sluice_core::policy::{PolicyDecision, RuleInput, evaluate};
use sluice_core::{BusinessKey, EffectSemantics, IdempotencyKey, ToolName};

const DEPLOY_CATALOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/catalog.toml");
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

fn deploy() -> Catalog {
    Catalog::load(DEPLOY_CATALOG).expect("deploy/catalog.toml is valid")
}

fn name(raw: &str) -> ToolName {
    ToolName::parse(raw).expect("valid tool name")
}

fn wire_args() -> serde_json::Value {
    json!({"account": "acc-1", "amount_minor": 125000, "beneficiary": "b-9", "date": "2026-11-22"})
}

// ---- the shipped catalog -------------------------------------------------------------------

#[test]
fn deploy_catalog_declares_its_tools_in_order() {
    let catalog = deploy();
    let names: Vec<String> = catalog
        .tools()
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(
        names,
        [
            "payments/wire",
            "email/send",
            "tickets/create",
            "search/lookup"
        ]
    );
    assert_eq!(catalog.policy_version(), "2026-11-01");
    assert_eq!(catalog.default_namespace(), "default");
    assert!(catalog.source_name().ends_with("deploy/catalog.toml"));
}

#[test]
fn deploy_wire_is_non_idempotent_with_every_resolution_strategy() {
    let catalog = deploy();
    let wire = catalog.get(&name("payments/wire")).expect("declared");
    assert_eq!(wire.semantics(), EffectSemantics::NonIdempotent);
    assert!(!wire.allow_unsafe());
    assert_eq!(
        wire.business_key(&wire_args()).expect("renders"),
        Some(BusinessKey::new("acc-1:b-9:125000:2026-11-22"))
    );
    assert_eq!(wire.validate_args(&wire_args()), Ok(()));
    // The beneficiary is part of the wire's identity, and no ':' in a field lets two wires
    // (account "a:b" to "c", account "a" to "b:c") render one key.
    let mut other = wire_args();
    other["beneficiary"] = json!("b-7");
    assert_ne!(
        wire.business_key(&other).expect("renders"),
        wire.business_key(&wire_args()).expect("renders")
    );
    for field in ["account", "beneficiary"] {
        let mut colon = wire_args();
        colon[field] = json!("a:b");
        assert!(wire.validate_args(&colon).is_err(), "{field} with ':'");
    }
    let threshold = wire.policy().approve_above.as_ref().expect("declared");
    assert_eq!(threshold.field, "amount_minor");
    assert_eq!(threshold.value, serde_json::Number::from(1_000_000));

    let rules = wire.rules();
    assert!(rules.has_status_check && rules.has_compensate);
    assert!(
        rules.verify_after_commit,
        "wires are looked up once more after a 2xx"
    );
    assert_eq!(rules.max_attempts, 3);
    assert_eq!(rules.max_checks, 5);
    assert_eq!(rules.settle_ms, 2_000);
    assert_eq!(rules.on_absent, OnAbsent::Redispatch);
    assert_eq!(rules.lease_ttl_ms, 30_000);

    let dispatch = wire.dispatch();
    assert_eq!(
        dispatch.endpoint.url.as_str(),
        "http://127.0.0.1:8787/bank/wires"
    );
    assert_eq!(dispatch.endpoint.method, HttpMethod::Post);
    assert_eq!(dispatch.endpoint.timeout_ms, 10_000);
    assert_eq!(
        dispatch.reference,
        ReferenceSource::JsonPointer("/id".into())
    );

    let idem = IdempotencyKey::parse("r-abc/d-3/payments/wire/0").expect("valid");
    let business = wire.business_key(&wire_args()).expect("renders");
    let keys = UrlKeys {
        idempotency_key: &idem,
        business_key: business.as_ref(),
        external_ref: Some("w-123"),
        compensation_key: None,
        callback_url: None,
    };
    let status = wire.status_check().expect("declared");
    assert_eq!(status.method, HttpMethod::Get);
    assert_eq!(
        render_url(&status.url, &wire_args(), &keys).expect("renders"),
        "http://127.0.0.1:8787/bank/wires/by-key/acc-1%3Ab-9%3A125000%3A2026-11-22"
    );
    let compensate = wire.compensate().expect("declared");
    assert_eq!(
        render_url(&compensate.url, &wire_args(), &keys).expect("renders"),
        "http://127.0.0.1:8787/bank/wires/w-123/reverse"
    );
}

/// The policy input of a command of `tool` with `args`, in a run of no tenant, at time 0.
fn at<'a>(tool: &'a sluice_core::catalog::Tool, args: &'a serde_json::Value) -> RuleInput<'a> {
    RuleInput {
        args,
        tool: tool.name(),
        run: "run-1",
        tenant: None,
        submitter: None,
        now: sluice_core::time::Timestamp::from_millis(0),
        budgets: &[],
    }
}

#[test]
fn deploy_wire_needs_approval_above_ten_thousand() {
    let catalog = deploy();
    let wire = catalog.get(&name("payments/wire")).expect("declared");
    let version = catalog.policy_version();
    assert_eq!(
        evaluate(wire, &at(wire, &wire_args()), None, version),
        PolicyDecision::Allow
    );
    let mut big = wire_args();
    big["amount_minor"] = json!(1_000_001);
    assert!(matches!(
        evaluate(wire, &at(wire, &big), None, version),
        PolicyDecision::RequireApproval { .. }
    ));
}

#[test]
fn deploy_wire_refuses_bad_arguments_with_pointers() {
    let catalog = deploy();
    let wire = catalog.resolve("payments/wire").expect("declared");
    let mut args = wire_args();
    args["amount_minor"] = json!(-5);
    let err = wire.validate_args(&args).expect_err("negative amount");
    assert_eq!(
        err.to_string(),
        "/amount_minor: -5 is less than the minimum of 1"
    );
    args["amount_minor"] = json!(5);
    args["date"] = json!("tomorrow");
    args["extra"] = json!(true);
    let err = wire
        .validate_args(&args)
        .expect_err("bad date and extra field");
    assert_eq!(err.violations().len(), 2, "{:?}", err.violations());
    assert!(err.violations().iter().any(|v| v.pointer == "/date"));
}

#[test]
fn deploy_email_is_idempotent_without_compensate() {
    let catalog = deploy();
    let email = catalog.get(&name("email/send")).expect("declared");
    assert_eq!(email.semantics(), EffectSemantics::Idempotent);
    assert!(email.compensate().is_none());
    assert!(email.status_check().is_none());
    assert_eq!(email.business_key(&json!({})), Ok(None));
    let rules = email.rules();
    assert!(!rules.has_compensate && !rules.has_status_check);
    assert_eq!(rules.max_attempts, 5);
    assert_eq!(email.dispatch().endpoint.timeout_ms, 5_000);
    assert_eq!(
        email.dispatch().endpoint.url.as_str(),
        "http://127.0.0.1:8787/email/messages"
    );
    let ok = json!({"to": "a@example.com", "subject": "hi", "body": "hello"});
    assert_eq!(email.validate_args(&ok), Ok(()));
    assert!(
        email
            .validate_args(&json!({"to": "a@example.com"}))
            .is_err()
    );
}

#[test]
fn deploy_tickets_are_compensated_by_closing() {
    let catalog = deploy();
    let tickets = catalog.get(&name("tickets/create")).expect("declared");
    assert_eq!(tickets.semantics(), EffectSemantics::Idempotent);
    let compensate = tickets.compensate().expect("close is declared");
    assert_eq!(compensate.method, HttpMethod::Post);
    assert_eq!(compensate.timeout_ms, 5_000);
    let idem = IdempotencyKey::parse("r-1/d-0/tickets/create/0").expect("valid");
    let keys = UrlKeys {
        idempotency_key: &idem,
        business_key: None,
        external_ref: Some("T 42"),
        compensation_key: None,
        callback_url: None,
    };
    assert_eq!(
        render_url(&compensate.url, &json!({"title": "x"}), &keys).expect("renders"),
        "http://127.0.0.1:8787/tickets/T%2042/close"
    );
    assert!(tickets.rules().has_compensate);
}

#[test]
fn deploy_search_is_observe_only() {
    let catalog = deploy();
    let search = catalog.get(&name("search/lookup")).expect("declared");
    assert_eq!(search.semantics(), EffectSemantics::ObserveOnly);
    assert!(search.compensate().is_none());
    assert_eq!(search.rules().lease_ttl_ms, 10_000);
    assert_eq!(search.dispatch().endpoint.timeout_ms, 3_000);
    assert!(
        search
            .validate_args(&json!({"query": "refunds", "limit": 10}))
            .is_ok()
    );
    assert!(
        search
            .validate_args(&json!({"query": "refunds", "limit": 500}))
            .is_err()
    );
}

#[test]
fn resolve_finds_qualified_and_bare_names_and_refuses_unknown_ones() {
    let text = r#"
        default_namespace = "search"
        [[tool]]
        name = "lookup"
        semantics = "OBSERVE_ONLY"
        schema = { type = "object" }
        [tool.dispatch]
        url = "http://h/search"
    "#;
    let catalog = Catalog::from_toml_str(text, "bare.toml").expect("valid");
    assert_eq!(
        catalog.resolve("lookup").expect("bare").name().to_string(),
        "search/lookup"
    );
    assert_eq!(
        catalog
            .resolve("search/lookup")
            .expect("qualified")
            .name()
            .to_string(),
        "search/lookup"
    );
    let err = catalog.resolve("x/y").expect_err("not declared");
    assert!(matches!(err, CatalogError::UnknownTool { .. }));
    assert_eq!(err.to_string(), "unknown tool x/y");
    assert_eq!(
        catalog.resolve("nope").expect_err("bare").to_string(),
        "unknown tool search/nope"
    );
    assert!(matches!(
        catalog.resolve("Bad/Name"),
        Err(CatalogError::InvalidName(_))
    ));
}

#[test]
fn schema_file_resolves_against_the_catalog_directory() {
    let catalog = Catalog::load(format!("{FIXTURES}/schema_file/catalog.toml")).expect("valid");
    let wire = catalog.resolve("wire").expect("bare name in payments");
    assert_eq!(wire.name().to_string(), "payments/wire");
    assert_eq!(
        wire.schema()["required"],
        json!(["account", "amount_minor"])
    );
    assert_eq!(
        wire.dispatch().reference,
        ReferenceSource::Header("Location".into())
    );
    assert!(
        wire.validate_args(&json!({"account": "a", "amount_minor": 0}))
            .is_err()
    );
    assert_eq!(catalog.policy_version(), "1", "the default policy version");
}

#[test]
fn a_missing_catalog_file_is_a_read_error_naming_the_path() {
    let err = Catalog::load(format!("{FIXTURES}/nope.toml")).expect_err("missing");
    assert!(matches!(err, CatalogError::Read { .. }));
    assert!(err.to_string().contains("nope.toml"), "{err}");
}

// ---- refusals ------------------------------------------------------------------------------

/// A valid catalog of one NON_IDEMPOTENT tool; each refusal test breaks one thing in it.
const BASE: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
business_key = "{account}:{amount_minor}"
schema = { type = "object", required = ["account", "amount_minor"], properties = { account = { type = "string" }, amount_minor = { type = "integer" }, memo = { type = "string" } } }

[tool.policy]
max_attempts = 3

[tool.dispatch]
url = "http://127.0.0.1:8787/bank/wires"

[tool.status_check]
url = "http://127.0.0.1:8787/bank/wires/by-key/{business_key}"

[tool.compensate]
url = "http://127.0.0.1:8787/bank/wires/{external_ref}/reverse"
"#;

/// Applies one replacement to [`BASE`] (checking it applied) and returns the refusal.
fn refused(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "the base catalog contains {from:?}");
    let text = BASE.replacen(from, to, 1);
    let err = Catalog::from_toml_str(&text, "fixture.toml").expect_err("must be refused");
    err.to_string()
}

/// Asserts the message names the file, the tool and every given key.
fn assert_names(message: &str, keys: &[&str]) {
    assert!(message.starts_with("fixture.toml: "), "{message}");
    assert!(message.contains("payments/wire"), "{message}");
    for key in keys {
        assert!(message.contains(key), "{message} should name {key}");
    }
}

#[test]
fn the_base_catalog_is_valid() {
    let catalog = Catalog::from_toml_str(BASE, "fixture.toml").expect("valid");
    assert_eq!(catalog.len(), 1);
}

#[test]
fn unknown_top_level_keys_are_refused() {
    let text = format!("tools_dir = \"x\"\n{BASE}");
    let err = Catalog::from_toml_str(&text, "fixture.toml").expect_err("unknown key");
    let message = err.to_string();
    assert!(message.starts_with("fixture.toml: "), "{message}");
    assert!(message.contains("tools_dir"), "{message}");
}

#[test]
fn unknown_keys_in_a_tool_are_refused() {
    let message = refused("semantics = ", "retries = 3\nsemantics = ");
    assert_names(&message, &["unknown field `retries`"]);
}

#[test]
fn unknown_keys_in_policy_are_refused_with_their_section() {
    let message = refused("max_attempts = 3", "max_attempts = 3\nmax_attempt = 4");
    assert_names(&message, &["policy", "unknown field `max_attempt`"]);
}

#[test]
fn unknown_keys_in_a_connector_are_refused_with_their_section() {
    let message = refused(
        "url = \"http://127.0.0.1:8787/bank/wires\"\n",
        "url = \"http://127.0.0.1:8787/bank/wires\"\nretries = 1\n",
    );
    assert_names(&message, &["dispatch", "unknown field `retries`"]);
}

#[test]
fn values_of_the_wrong_type_name_their_key() {
    let message = refused("max_attempts = 3", "max_attempts = \"three\"");
    assert_names(&message, &["policy.max_attempts", "expected u32"]);
    let message = refused("semantics = \"NON_IDEMPOTENT\"", "semantics = \"SAFE\"");
    assert_names(&message, &["semantics", "SAFE"]);
}

#[test]
fn duplicate_tool_names_are_refused_after_bare_name_resolution() {
    let second = BASE.replacen("name = \"payments/wire\"", "name = \"wire\"", 1);
    let text = format!("default_namespace = \"payments\"\n{BASE}\n{second}");
    let err = Catalog::from_toml_str(&text, "fixture.toml").expect_err("declared twice");
    assert!(matches!(
        err,
        CatalogError::DuplicateTool {
            first: 1,
            second: 2,
            ..
        }
    ));
    assert_names(&err.to_string(), &["declared twice", "name"]);
}

#[test]
fn bad_tool_names_are_refused() {
    let text = BASE.replacen("name = \"payments/wire\"", "name = \"Payments/wire\"", 1);
    let message = Catalog::from_toml_str(&text, "fixture.toml")
        .expect_err("not snake_case")
        .to_string();
    assert!(
        message.starts_with("fixture.toml: tool Payments/wire: name"),
        "{message}"
    );
    assert!(message.contains("snake_case"), "{message}");
}

#[test]
fn invalid_json_schemas_are_refused() {
    let message = refused("type = \"object\", required", "type = \"objekt\", required");
    assert_names(&message, &["schema is not a valid JSON Schema"]);
    let message = refused(
        "amount_minor = { type = \"integer\" }",
        "amount_minor = { minimum = \"x\" }",
    );
    assert_names(&message, &["schema is not a valid JSON Schema"]);
}

#[test]
fn a_schema_that_is_not_an_object_is_refused() {
    let message = refused("type = \"object\", required", "type = \"array\", required");
    assert_names(&message, &["schema must be type = \"object\""]);
}

#[test]
fn schema_and_schema_file_are_exclusive_and_one_is_required() {
    let message = refused("schema = {", "schema_file = \"x.json\"\nschema = {");
    assert_names(&message, &["schema", "schema_file"]);
    let without = BASE
        .lines()
        .filter(|line| !line.starts_with("schema = "))
        .collect::<Vec<_>>()
        .join("\n");
    let message = Catalog::from_toml_str(&without, "fixture.toml")
        .expect_err("no schema")
        .to_string();
    assert_names(&message, &["exactly one of schema or schema_file"]);
}

#[test]
fn schema_file_needs_a_catalog_file() {
    let text = BASE
        .lines()
        .map(|line| {
            if line.starts_with("schema = ") {
                "schema_file = \"schemas/wire.json\""
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let message = Catalog::from_toml_str(&text, "fixture.toml")
        .expect_err("no directory")
        .to_string();
    assert_names(&message, &["schema_file", "schemas/wire.json"]);
}

#[test]
fn a_missing_schema_file_names_the_file_the_tool_and_the_path() {
    let err = Catalog::load(format!("{FIXTURES}/schema_file/missing.toml")).expect_err("missing");
    let message = err.to_string();
    assert!(
        message.contains("missing.toml: tool payments/wire: schema_file"),
        "{message}"
    );
    assert!(message.contains("nope.json"), "{message}");
}

#[test]
fn business_key_fields_must_be_declared_in_the_schema() {
    let message = refused("{account}:{amount_minor}\"", "{account}:{amount}\"");
    assert_names(
        &message,
        &[
            "business_key",
            "\"amount\"",
            "not in the schema's properties",
        ],
    );
}

#[test]
fn template_fields_must_be_required_and_scalar() {
    let message = refused("{account}:{amount_minor}\"", "{account}:{memo}\"");
    assert_names(&message, &["business_key", "\"memo\"", "required"]);
    let message = refused(
        "account = { type = \"string\" }",
        "account = { type = \"object\" }",
    );
    assert_names(&message, &["business_key", "\"account\"", "object"]);
}

#[test]
fn url_placeholders_must_be_keys_or_declared_fields() {
    let message = refused(
        "/bank/wires/by-key/{business_key}",
        "/bank/wires/by-key/{business}",
    );
    assert_names(
        &message,
        &[
            "status_check.url",
            "\"business\"",
            "not in the schema's properties",
        ],
    );
    let message = refused(
        "url = \"http://127.0.0.1:8787/bank/wires\"",
        "url = \"http://127.0.0.1:8787/bank/{account}/wires/{idempotency_key}/{run_id}/{command_key}/{nope}\"",
    );
    assert_names(&message, &["dispatch.url", "\"nope\""]);
}

#[test]
fn external_ref_is_only_available_to_compensate() {
    let message = refused(
        "/bank/wires/by-key/{business_key}",
        "/bank/wires/{external_ref}",
    );
    assert_names(&message, &["status_check.url", "{external_ref}"]);
}

#[test]
fn business_key_placeholder_needs_a_template() {
    let text = BASE.replacen("business_key = \"{account}:{amount_minor}\"\n", "", 1);
    let message = Catalog::from_toml_str(&text, "fixture.toml")
        .expect_err("no template")
        .to_string();
    assert_names(
        &message,
        &[
            "status_check.url",
            "{business_key}",
            "no business_key template",
        ],
    );
}

#[test]
fn unbalanced_braces_are_refused() {
    let message = refused("{account}:{amount_minor}\"", "{account:{amount_minor}\"");
    assert_names(&message, &["business_key", "unbalanced braces"]);
    let message = refused("/{external_ref}/reverse", "/{external_ref/reverse");
    assert_names(&message, &["compensate.url", "unbalanced braces"]);
    let message = refused("/by-key/{business_key}", "/by-key/business_key}");
    assert_names(&message, &["status_check.url", "unbalanced braces"]);
}

const UNSAFE_MESSAGE: &str = "tool payments/wire is NON_IDEMPOTENT and declares none of business_key, status_check, compensate; set allow_unsafe = true only after explicit review";

fn without_resolution_strategies() -> String {
    let text = BASE.replacen("business_key = \"{account}:{amount_minor}\"\n", "", 1);
    let cut = text.find("[tool.status_check]").expect("in the base");
    text[..cut].to_owned()
}

#[test]
fn a_non_idempotent_tool_without_a_resolution_strategy_is_refused() {
    let err = Catalog::from_toml_str(&without_resolution_strategies(), "deploy/catalog.toml")
        .expect_err("unsafe");
    assert_eq!(
        err.to_string(),
        format!("deploy/catalog.toml: {UNSAFE_MESSAGE}")
    );
}

#[test]
fn the_unsafe_refusal_names_the_loaded_file() {
    let path = format!("{FIXTURES}/unsafe_wire.toml");
    let err = Catalog::load(&path).expect_err("unsafe");
    assert_eq!(err.to_string(), format!("{path}: {UNSAFE_MESSAGE}"));
}

#[test]
fn allow_unsafe_accepts_a_reviewed_non_idempotent_tool() {
    let text = without_resolution_strategies().replacen(
        "semantics = \"NON_IDEMPOTENT\"",
        "semantics = \"NON_IDEMPOTENT\"\nallow_unsafe = true",
        1,
    );
    let catalog = Catalog::from_toml_str(&text, "fixture.toml").expect("reviewed");
    let tool = &catalog.tools()[0];
    assert!(tool.allow_unsafe());
    assert!(!tool.rules().has_status_check && !tool.rules().has_compensate);
}

#[test]
fn each_strategy_alone_satisfies_the_non_idempotent_rule() {
    // Only a business key.
    let mut text = BASE.to_owned();
    let cut = text.find("[tool.status_check]").expect("in the base");
    text.truncate(cut);
    assert!(Catalog::from_toml_str(&text, "fixture.toml").is_ok());
    // Only a compensate.
    let text = BASE
        .replacen("business_key = \"{account}:{amount_minor}\"\n", "", 1)
        .replacen(
            "[tool.status_check]\nurl = \"http://127.0.0.1:8787/bank/wires/by-key/{business_key}\"\n",
            "",
            1,
        );
    assert!(Catalog::from_toml_str(&text, "fixture.toml").is_ok());
}

#[test]
fn zero_max_attempts_is_refused() {
    let message = refused("max_attempts = 3", "max_attempts = 0");
    assert_names(&message, &["policy.max_attempts must be at least 1"]);
}

#[test]
fn retry_after_waiting_is_declared_per_tool_and_bounded_at_load() {
    let catalog = Catalog::from_toml_str(BASE, "fixture.toml").expect("valid");
    let rules = catalog.tools()[0].rules();
    assert_eq!(
        rules.max_rate_limited_ms,
        sluice_core::machine::DEFAULT_MAX_RATE_LIMITED_MS
    );
    assert!(
        !rules.rate_limited_commits_nothing,
        "a look first, by default"
    );

    let declared = BASE.replacen(
        "max_attempts = 3",
        "max_attempts = 3\nmax_rate_limited_ms = 0\nrate_limited_commits_nothing = true",
        1,
    );
    let catalog = Catalog::from_toml_str(&declared, "fixture.toml").expect("valid");
    let rules = catalog.tools()[0].rules();
    assert_eq!(rules.max_rate_limited_ms, 0, "0 turns the waiting off");
    assert!(rules.rate_limited_commits_nothing);

    let message = refused(
        "max_attempts = 3",
        "max_attempts = 3\nmax_rate_limited_ms = 86400001",
    );
    assert_names(&message, &["policy.max_rate_limited_ms", "86400001"]);
    let message = refused(
        "max_attempts = 3",
        "max_attempts = 3\nmax_rate_limited_ms = -1",
    );
    assert_names(&message, &["policy.max_rate_limited_ms"]);
}

#[test]
fn compensate_on_an_observe_only_tool_is_refused() {
    let message = refused(
        "semantics = \"NON_IDEMPOTENT\"",
        "semantics = \"OBSERVE_ONLY\"",
    );
    assert_names(&message, &["compensate", "OBSERVE_ONLY"]);
}

#[test]
fn a_tool_without_dispatch_is_refused() {
    let message = refused(
        "[tool.dispatch]\nurl = \"http://127.0.0.1:8787/bank/wires\"\n",
        "",
    );
    assert_names(&message, &["[tool.dispatch]"]);
}

#[test]
fn connector_urls_must_be_http() {
    let message = refused(
        "url = \"http://127.0.0.1:8787/bank/wires\"",
        "url = \"ftp://bank/wires\"",
    );
    assert_names(&message, &["dispatch.url", "ftp://bank/wires"]);
}

#[test]
fn the_reference_comes_from_a_pointer_or_a_header_not_both() {
    let message = refused(
        "url = \"http://127.0.0.1:8787/bank/wires\"\n",
        "url = \"http://127.0.0.1:8787/bank/wires\"\nreference_pointer = \"/id\"\nreference_header = \"Location\"\n",
    );
    assert_names(&message, &["reference_pointer", "reference_header"]);
    let message = refused(
        "url = \"http://127.0.0.1:8787/bank/wires\"\n",
        "url = \"http://127.0.0.1:8787/bank/wires\"\nreference_pointer = \"id\"\n",
    );
    assert_names(&message, &["dispatch.reference_pointer"]);
}

#[test]
fn in_progress_statuses_are_client_errors() {
    let message = refused(
        "url = \"http://127.0.0.1:8787/bank/wires\"\n",
        "url = \"http://127.0.0.1:8787/bank/wires\"\nin_progress_status = [409, 503]\n",
    );
    assert_names(&message, &["dispatch.in_progress_status", "503", "4xx"]);
}

#[test]
fn the_lease_must_outlive_the_dispatch_timeout() {
    let message = refused("max_attempts = 3", "max_attempts = 3\ntimeout_ms = 30000");
    assert_names(&message, &["policy.lease_ttl_ms", "timeout_ms"]);
}

#[test]
fn approve_above_must_name_a_required_numeric_field() {
    let message = refused(
        "max_attempts = 3",
        "approve_above = { field = \"amount\", value = 10 }",
    );
    assert_names(&message, &["policy.approve_above.field", "\"amount\""]);
    let message = refused(
        "max_attempts = 3",
        "approve_above = { field = \"account\", value = 10 }",
    );
    assert_names(
        &message,
        &["policy.approve_above.field", "\"account\"", "number"],
    );
}

#[test]
fn a_bad_default_namespace_is_refused() {
    let text = format!("default_namespace = \"Pay\"\n{BASE}");
    let message = Catalog::from_toml_str(&text, "fixture.toml")
        .expect_err("not snake_case")
        .to_string();
    assert!(
        message.starts_with("fixture.toml: default_namespace \"Pay\""),
        "{message}"
    );
}

#[test]
fn invalid_toml_is_a_syntax_error_naming_the_file() {
    let err = Catalog::from_toml_str("[[tool]\nname = ", "fixture.toml").expect_err("bad toml");
    assert!(matches!(err, CatalogError::Syntax { .. }));
    assert!(err.to_string().starts_with("fixture.toml: "), "{err}");
}

#[test]
fn verify_after_commit_needs_a_status_check() {
    let text = BASE
        .replacen(
            "max_attempts = 3",
            "max_attempts = 3\nverify_after_commit = true",
            1,
        )
        .replacen(
            "[tool.status_check]\nurl = \"http://127.0.0.1:8787/bank/wires/by-key/{business_key}\"\n",
            "",
            1,
        );
    let err = Catalog::from_toml_str(&text, "fixture.toml").expect_err("refused");
    assert_names(&err.to_string(), &["verify_after_commit", "status_check"]);
    let with_check = BASE.replacen(
        "max_attempts = 3",
        "max_attempts = 3\nverify_after_commit = true",
        1,
    );
    let catalog = Catalog::from_toml_str(&with_check, "fixture.toml").expect("valid");
    assert!(catalog.tools()[0].rules().verify_after_commit);
}

/// The horizons of late commits: the lease covers the call plus the skew bound, and the last
/// look comes after a late attempt can land and lookups have caught up.
#[test]
fn the_lease_covers_the_skew_bound_and_the_last_look_comes_after_the_landing_horizon() {
    let skew = refused("[[tool]]", "max_clock_skew_ms = 25000\n\n[[tool]]");
    assert_names(&skew, &["policy.lease_ttl_ms", "max_clock_skew_ms"]);
    let early = refused(
        "[tool.policy]",
        "[tool.policy]\nlate_commit_ms = 40000\nverify_after_ms = 41000",
    );
    assert_names(&early, &["policy.verify_after_ms", "policy.late_commit_ms"]);
    let before_settle = refused("[tool.policy]", "[tool.policy]\nverify_after_ms = 1");
    assert_names(
        &before_settle,
        &["policy.verify_after_ms", "policy.settle_ms"],
    );
}
