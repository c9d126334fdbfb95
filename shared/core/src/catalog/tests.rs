//! The catalog's unit tests: loading, templates, rules and argument checks.

use serde_json::json;

use super::*;
use crate::command::EffectSemantics;
use crate::ids::{BusinessKey, CommandKey, IdempotencyKey, RunId};
use crate::machine::{OnAbsent, Rules};

const WIRE: &str = r#"
    policy_version = "7"
    [[tool]]
    name = "payments/wire"
    semantics = "NON_IDEMPOTENT"
    business_key = "{account}:{amount_minor}:{date}"
    schema = { type = "object", required = ["account", "amount_minor", "date"], additionalProperties = false, properties = { account = { type = "string" }, amount_minor = { type = "integer", minimum = 1 }, date = { type = "string", format = "date" } } }
    [tool.policy]
    approve_above = { field = "amount_minor", value = 1000000 }
    max_attempts = 4
    on_absent = "fail"
    settle_ms = 5000
    lease_ttl_ms = 20000
    [tool.dispatch]
    url = "http://bank/wires"
    timeout_ms = 3000
    [tool.status_check]
    url = "http://bank/wires/by-key/{business_key}?run={run_id}"
    [tool.compensate]
    url = "http://bank/wires/{external_ref}/reverse"
    timeout_ms = 40000
"#;

fn wire() -> Tool {
    let catalog = Catalog::from_toml_str(WIRE, "wire.toml").expect("the wire catalog is valid");
    catalog.tools()[0].clone()
}

#[test]
fn templates_parse_placeholders_and_refuse_unbalanced_braces() {
    let template = Template::parse("x{a}-{b}y").expect("balanced");
    assert_eq!(template.placeholders().collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(template.to_string(), "x{a}-{b}y");
    assert_eq!(
        Template::parse("a{b"),
        Err(TemplateError::Unclosed { at: 1 })
    );
    assert_eq!(
        Template::parse("a}b"),
        Err(TemplateError::Unopened { at: 1 })
    );
    assert_eq!(
        Template::parse("{a{b}}"),
        Err(TemplateError::Nested { at: 2 })
    );
    assert_eq!(Template::parse("a{}"), Err(TemplateError::Empty { at: 1 }));
    assert_eq!(
        Template::parse("{a b}"),
        Err(TemplateError::Whitespace { at: 0 })
    );
    assert_eq!(
        Template::parse("plain")
            .expect("no placeholders")
            .placeholders()
            .count(),
        0
    );
}

#[test]
fn placeholders_stay_out_of_a_urls_scheme_host_and_port() {
    // Each declares a field `host`, so only the placeholder's position is at fault.
    let with_url = |section: &str, url: &str| {
        let text = WIRE
            .replace(
                "required = [\"account\", \"amount_minor\", \"date\"]",
                "required = [\"account\", \"amount_minor\", \"date\", \"host\"]",
            )
            .replace(
                "date = { type = \"string\", format = \"date\" } }",
                "date = { type = \"string\", format = \"date\" }, host = { type = \"string\" } }",
            )
            .replace(
                &format!("[tool.{section}]\n    url = \""),
                &format!("[tool.{section}]\n    url = \"{url}\"\n    x_was = \""),
            );
        // The old url is moved to a key that does not exist: drop that line again.
        let text: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("x_was"))
            .map(|line| format!("{line}\n"))
            .collect();
        Catalog::from_toml_str(&text, "ssrf.toml")
    };
    for (section, key, url) in [
        ("dispatch", "dispatch.url", "http://{host}/wires"),
        ("dispatch", "dispatch.url", "https://{host}"),
        ("dispatch", "dispatch.url", "http://bank:{host}/wires"),
        (
            "dispatch",
            "dispatch.url",
            "http://{host}.bank.internal/wires",
        ),
        (
            "status_check",
            "status_check.url",
            "http://bank{host}/by-key",
        ),
        (
            "compensate",
            "compensate.url",
            "http://{external_ref}/reverse",
        ),
    ] {
        let err = with_url(section, url).expect_err(url);
        assert!(
            matches!(err, CatalogError::PlaceholderInAuthority { .. }),
            "{url}: {err}"
        );
        let message = err.to_string();
        assert!(
            message.contains("ssrf.toml")
                && message.contains("payments/wire")
                && message.contains(key),
            "the error names the file, tool and key: {message}"
        );
    }
    for (section, url) in [
        ("dispatch", "http://bank/wires/{host}"),
        ("dispatch", "http://bank:8787/wires?to={host}"),
        ("status_check", "http://bank/by-key/{business_key}#{host}"),
    ] {
        with_url(section, url).unwrap_or_else(|e| panic!("{url} is fine: {e}"));
    }
}

#[test]
fn rules_come_from_the_policy_and_the_declared_connectors() {
    let rules = wire().rules();
    assert_eq!(rules.semantics, EffectSemantics::NonIdempotent);
    assert_eq!(rules.max_attempts, 4);
    assert_eq!(rules.on_absent, OnAbsent::Fail);
    assert_eq!(rules.settle_ms, 5_000);
    assert_eq!(rules.lease_ttl_ms, 20_000);
    assert!(rules.has_status_check);
    assert!(rules.has_compensate);
    // The compensate call may take 40 s, so the sweep must wait longer than that.
    assert_eq!(rules.compensation_timeout_ms, 80_000);
    let defaults = Rules::defaults(EffectSemantics::NonIdempotent);
    assert_eq!(rules.max_checks, defaults.max_checks);
    assert_eq!(rules.backoff_base_ms, defaults.backoff_base_ms);
}

#[test]
fn connector_timeouts_fall_back_to_the_policy_timeout() {
    let tool = wire();
    assert_eq!(tool.dispatch().endpoint.timeout_ms, 3_000);
    assert_eq!(tool.dispatch().endpoint.method, HttpMethod::Post);
    assert_eq!(
        tool.dispatch().reference,
        ReferenceSource::JsonPointer("/id".into())
    );
    let status = tool.status_check().expect("declared");
    assert_eq!(status.timeout_ms, DEFAULT_TIMEOUT_MS);
    assert_eq!(status.method, HttpMethod::Get);
}

#[test]
fn validate_args_lists_every_violation_with_its_pointer() {
    let tool = wire();
    let ok = json!({"account": "acc-1", "amount_minor": 125000, "date": "2026-11-22"});
    assert_eq!(tool.validate_args(&ok), Ok(()));
    let bad = json!({"account": 7, "amount_minor": -5, "date": "2026-11-22"});
    let err = tool.validate_args(&bad).expect_err("two violations");
    let pointers: Vec<&str> = err
        .violations()
        .iter()
        .map(|v| v.pointer.as_str())
        .collect();
    assert!(pointers.contains(&"/account"), "{pointers:?}");
    assert!(pointers.contains(&"/amount_minor"), "{pointers:?}");
    assert_eq!(err.violations().len(), 2);
    assert!(err.to_string().ends_with("(and 1 more violation)"), "{err}");
    let only_amount = json!({"account": "a", "amount_minor": -5, "date": "2026-11-22"});
    let err = tool.validate_args(&only_amount).expect_err("below minimum");
    assert_eq!(
        err.to_string(),
        "/amount_minor: -5 is less than the minimum of 1"
    );
}

#[test]
fn formats_are_asserted() {
    let args = json!({"account": "a", "amount_minor": 5, "date": "22/11/2026"});
    let err = wire().validate_args(&args).expect_err("not a date");
    assert_eq!(err.violations()[0].pointer, "/date");
}

#[test]
fn missing_required_fields_are_reported_at_the_root() {
    let err = wire()
        .validate_args(&json!({"account": "a", "date": "2026-11-22"}))
        .expect_err("amount missing");
    assert_eq!(err.violations()[0].pointer, "");
    assert!(err.to_string().starts_with("arguments: "), "{err}");
    assert!(err.to_string().contains("amount_minor"), "{err}");
}

#[test]
fn business_key_renders_strings_as_is_and_numbers_as_json() {
    let tool = wire();
    let args = json!({"account": "acc-1", "amount_minor": 125000, "date": "2026-11-22"});
    assert_eq!(
        tool.business_key(&args).expect("renders"),
        Some(BusinessKey::new("acc-1:125000:2026-11-22"))
    );
    let missing = tool
        .business_key(&json!({"account": "acc-1", "date": "d"}))
        .expect_err("amount missing");
    assert_eq!(missing.violations()[0].pointer, "/amount_minor");
    assert!(missing.to_string().contains("amount_minor"), "{missing}");
    let nested = tool
        .business_key(&json!({"account": {"id": 1}, "amount_minor": 1, "date": "d"}))
        .expect_err("object field");
    assert!(nested.to_string().contains("not an object"), "{nested}");
}

#[test]
fn a_tool_without_a_business_key_template_has_none() {
    let text = WIRE
        .replace("business_key = \"{account}:{amount_minor}:{date}\"\n", "")
        .replace("/by-key/{business_key}", "/by-key/{idempotency_key}");
    let catalog = Catalog::from_toml_str(&text, "x.toml").expect("status check suffices");
    assert_eq!(catalog.tools()[0].business_key(&json!({})), Ok(None));
}

#[test]
fn render_url_fills_keys_and_fields_and_encodes_each_as_a_path_segment() {
    let idem = IdempotencyKey::new(
        RunId::parse("r-abc").expect("valid"),
        CommandKey::parse("d-3/payments/wire/0").expect("valid"),
    );
    let business = BusinessKey::new("acc 1:5");
    let keys = UrlKeys {
        idempotency_key: &idem,
        business_key: Some(&business),
        external_ref: Some("w/1?x"),
        compensation_key: None,
        callback_url: None,
    };
    let args = json!({"q": "a&b=c", "n": 12, "flag": true, "obj": {}});
    let render = |text: &str| render_url(&Template::parse(text).expect("valid"), &args, &keys);
    assert_eq!(
        render("http://h/{run_id}/{command_key}/{idempotency_key}").expect("renders"),
        "http://h/r-abc/d-3%2Fpayments%2Fwire%2F0/r-abc%2Fd-3%2Fpayments%2Fwire%2F0"
    );
    assert_eq!(
        render("http://h/{business_key}/{external_ref}?q={q}&n={n}&f={flag}").expect("renders"),
        "http://h/acc%201%3A5/w%2F1%3Fx?q=a%26b%3Dc&n=12&f=true"
    );
    assert_eq!(
        render("http://h/é{q}").expect("literal text is kept"),
        "http://h/éa%26b%3Dc"
    );
    assert_eq!(
        render("http://h/{missing}"),
        Err(RenderError::MissingField {
            field: "missing".into()
        })
    );
    assert_eq!(
        render("http://h/{obj}"),
        Err(RenderError::NotScalar {
            field: "obj".into(),
            kind: "an object"
        })
    );
    let bare = UrlKeys {
        idempotency_key: &idem,
        business_key: None,
        external_ref: None,
        compensation_key: None,
        callback_url: None,
    };
    let template = Template::parse("http://h/{external_ref}").expect("valid");
    assert_eq!(
        render_url(&template, &args, &bare),
        Err(RenderError::MissingKey {
            key: "external_ref"
        })
    );
}

#[test]
fn render_url_refuses_values_that_would_change_the_path() {
    let idem = IdempotencyKey::parse("r/d-1/a/b/0").expect("valid");
    let template = Template::parse("http://h/wires/{external_ref}/reverse").expect("valid");
    for value in ["..", ".", ""] {
        let keys = UrlKeys {
            idempotency_key: &idem,
            business_key: None,
            external_ref: Some(value),
            compensation_key: None,
            callback_url: None,
        };
        assert!(
            matches!(
                render_url(&template, &json!({}), &keys),
                Err(RenderError::UnsafeValue { .. })
            ),
            "{value:?} must be refused"
        );
    }
}

#[test]
fn tools_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tool>();
    assert_send_sync::<Catalog>();
}

#[test]
fn debug_omits_the_compiled_validator() {
    let shown = format!("{:?}", wire());
    assert!(shown.contains("namespace: \"payments\""), "{shown}");
    assert!(shown.contains("business_key"), "{shown}");
    assert!(!shown.contains("validator"), "{shown}");
}

#[test]
fn remote_schema_references_are_refused_without_fetching() {
    let text = WIRE.replace(
        "account = { type = \"string\" }",
        "account = { \"$ref\" = \"http://127.0.0.1:9/account.json\" }",
    );
    let err = Catalog::from_toml_str(&text, "x.toml").expect_err("no remote refs");
    assert!(
        matches!(err, CatalogError::InvalidSchema { key: "schema", .. }),
        "{err}"
    );
}

#[test]
fn schema_dates_in_toml_become_json_strings() {
    let text = WIRE.replace(
        "format = \"date\" }",
        "format = \"date\", default = 2026-01-01 }",
    );
    let catalog = Catalog::from_toml_str(&text, "x.toml").expect("a date is kept as a string");
    assert_eq!(
        catalog.tools()[0].schema()["properties"]["date"]["default"],
        json!("2026-01-01")
    );
}

#[test]
fn non_finite_floats_in_an_inline_schema_are_refused() {
    let text = WIRE.replace("minimum = 1 }", "minimum = 1, maximum = inf }");
    let err = Catalog::from_toml_str(&text, "x.toml").expect_err("inf is not JSON");
    assert!(
        err.to_string()
            .contains("x.toml: tool payments/wire: schema"),
        "{err}"
    );
    assert!(err.to_string().contains("not a JSON number"), "{err}");
}

#[test]
fn money_fields_are_declared_per_argument_and_checked_at_load() {
    let with_money = |section: &str| {
        Catalog::from_toml_str(
            &WIRE.replace("[tool.policy]", &format!("{section}\n[tool.policy]")),
            "wire.toml",
        )
    };
    let catalog = with_money("[tool.money.amount_minor]\ncurrency = \"EUR\"\nminor_units = 2")
        .expect("a money field on an integer argument loads");
    let money = catalog.tools()[0].money();
    assert_eq!(
        money.get("amount_minor"),
        Some(&Money {
            currency: "EUR".into(),
            minor_units: 2
        })
    );
    assert!(wire().money().is_empty(), "no declaration, no money field");

    // Each refusal names the key, and says what is wrong with it.
    for (section, names) in [
        (
            "[tool.money.amount]\ncurrency = \"EUR\"\nminor_units = 2",
            "money.amount: \"amount\" is not an argument",
        ),
        (
            "[tool.money.account]\ncurrency = \"EUR\"\nminor_units = 2",
            "money.account: argument \"account\" must have type \"integer\"",
        ),
        (
            "[tool.money.amount_minor]\ncurrency = \"eur\"\nminor_units = 2",
            "money.amount_minor: currency \"eur\" is not an ISO 4217 code",
        ),
        (
            "[tool.money.amount_minor]\ncurrency = \"EURO\"\nminor_units = 2",
            "money.amount_minor: currency \"EURO\"",
        ),
        (
            "[tool.money.amount_minor]\ncurrency = \"EUR\"\nminor_units = 5",
            "money.amount_minor: minor_units = 5 is more than 4",
        ),
    ] {
        let error = with_money(section).expect_err(section).to_string();
        assert!(
            error.contains("tool payments/wire") && error.contains(names),
            "{section}: {error}"
        );
    }
    // Unknown and missing keys are refused by the shape, naming the section.
    for section in [
        "[tool.money.amount_minor]\ncurrency = \"EUR\"\nminor_units = 2\nsymbol = \"€\"",
        "[tool.money.amount_minor]\ncurrency = \"EUR\"",
    ] {
        let error = with_money(section).expect_err(section).to_string();
        assert!(error.contains("money"), "{section}: {error}");
    }
}

const SHARED_BANK: &str = r#"
    [upstream.bank]
    rate = "50/s"
    burst = 10
    max_in_flight = 8
    [upstream.bank.breaker]
    failures = 3
    open_ms = 2000
    [[tool]]
    name = "payments/wire"
    semantics = "IDEMPOTENT"
    upstream = "bank"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://bank/wires"
    [[tool]]
    name = "payments/refund"
    semantics = "IDEMPOTENT"
    upstream = "bank"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://bank/refunds"
    [[tool]]
    name = "email/send"
    semantics = "IDEMPOTENT"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://mail/send"
"#;

/// Tools share a declared upstream's limits and breaker; a tool naming none joins its host's
/// upstream, with the default breaker and no limit.
#[test]
fn tools_share_a_declared_upstreams_limits_and_breaker() {
    let catalog = Catalog::from_toml_str(SHARED_BANK, "bank.toml").expect("valid");
    let [wire, refund, email] = catalog.tools() else {
        panic!("three tools");
    };
    assert_eq!((wire.upstream(), refund.upstream()), ("bank", "bank"));
    let bank = catalog.upstream_of(wire);
    assert_eq!(bank.rate.map(|r| r.to_string()), Some("50/s".into()));
    assert_eq!((bank.burst, bank.max_in_flight), (10, Some(8)));
    let breaker = bank.breaker.expect("a breaker");
    assert_eq!((breaker.failures, breaker.open_ms), (3, 2_000));
    assert_eq!(breaker.max_open_ms, upstream::DEFAULT_BREAKER_MAX_OPEN_MS);
    assert_eq!(email.upstream(), "mail");
    let own = catalog.upstream_of(email);
    assert_eq!(
        (own.rate, own.max_in_flight, own.breaker),
        (None, None, Some(upstream::DEFAULT_BREAKER))
    );
}

/// A catalog that declares nothing still has a breaker per host: tools calling one host share
/// it, another host has its own, and `breaker = false` turns it off for a tool or an upstream.
#[test]
fn an_upstream_nobody_declared_gets_the_default_breaker_by_host() {
    let tool = |name: &str, url: &str, extra: &str| {
        format!(
            "[[tool]]\nname = \"{name}\"\nsemantics = \"IDEMPOTENT\"\nschema = {{ type = \"object\" }}\n{extra}\n[tool.dispatch]\nurl = \"{url}\"\n"
        )
    };
    let text = [
        tool("payments/wire", "http://127.0.0.1:8787/bank/wires", ""),
        tool("payments/refund", "http://127.0.0.1:8787/bank/refunds", ""),
        tool("email/send", "https://Mail.Example.com:443/send", ""),
        tool(
            "tickets/open",
            "http://127.0.0.1:8787/tickets",
            "breaker = false",
        ),
    ]
    .concat();
    let catalog = Catalog::from_toml_str(&text, "hosts.toml").expect("valid");
    let [wire, refund, email, ticket] = catalog.tools() else {
        panic!("four tools");
    };
    assert_eq!(wire.upstream(), "127.0.0.1:8787");
    assert_eq!(refund.upstream(), wire.upstream());
    assert_eq!(email.upstream(), "mail.example.com");
    for joined in [wire, email] {
        assert_eq!(
            catalog.upstream_of(joined).breaker,
            Some(upstream::DEFAULT_BREAKER),
            "{}",
            joined.name()
        );
    }
    assert_eq!(ticket.upstream(), "tickets/open");
    assert_eq!(catalog.upstream_of(ticket).breaker, None);
    let names: Vec<&str> = catalog
        .default_upstreams()
        .map(|spec| spec.name.as_str())
        .collect();
    assert_eq!(names, ["127.0.0.1:8787", "mail.example.com"]);
    assert_eq!(catalog.upstreams().count(), 0);

    // A declared upstream of the host's name is what the host's tools join.
    let declared = format!("[upstream.\"mail.example.com\"]\nbreaker = false\n{text}");
    let catalog = Catalog::from_toml_str(&declared, "hosts.toml").expect("valid");
    let email = catalog.resolve("email/send").expect("declared");
    assert_eq!(catalog.upstream_of(email).breaker, None);
    assert_eq!(catalog.default_upstreams().count(), 1);
    // A declared upstream without a [breaker] table has the default one.
    let bank = "[upstream.bank]\nrate = \"5/s\"\n";
    let catalog = Catalog::from_toml_str(bank, "bank.toml").expect("valid");
    let spec = catalog.upstreams().next().expect("bank");
    assert_eq!(spec.breaker, Some(upstream::DEFAULT_BREAKER));
}

#[test]
fn the_host_of_a_url_is_its_host_and_a_port_other_than_the_schemes() {
    use upstream::host_of;
    assert_eq!(
        host_of("http://127.0.0.1:8787/x").as_deref(),
        Some("127.0.0.1:8787")
    );
    assert_eq!(
        host_of("https://API.stripe.com/v1").as_deref(),
        Some("api.stripe.com")
    );
    assert_eq!(host_of("http://bank:80?x=1").as_deref(), Some("bank"));
    assert_eq!(
        host_of("https://user:secret@bank.example/x").as_deref(),
        Some("bank.example")
    );
    assert_eq!(
        host_of("http://[::1]:9000/x").as_deref(),
        Some("[::1]:9000")
    );
    assert_eq!(host_of("http://[::1]/x").as_deref(), Some("[::1]"));
    assert_eq!(host_of("http://{host}/x"), None);
    assert_eq!(host_of("{base}/x"), None);
    assert_eq!(host_of("http://bank/{path}").as_deref(), Some("bank"));
}

#[test]
fn an_international_domain_name_is_its_ascii_form() {
    // UTS #46 mapping, whichever IDNA back end `url` is built with (`idna_adapter` is pinned
    // to the lighter one): lowercased, then Punycode.
    use upstream::host_of;
    assert_eq!(
        host_of("https://Bücher.example/api").as_deref(),
        Some("xn--bcher-kva.example")
    );
    assert_eq!(
        host_of("https://xn--bcher-kva.example:8443/api").as_deref(),
        Some("xn--bcher-kva.example:8443")
    );
    assert_eq!(host_of("https://bü cher.example/api"), None);
}

/// Each mistake in an upstream is refused naming the upstream and the key.
#[test]
fn a_bad_upstream_is_refused_naming_it_and_the_key() {
    let cases = [
        (
            SHARED_BANK.replace("\"50/s\"", "\"fast\""),
            "upstream.bank: rate",
        ),
        (SHARED_BANK.replace("burst = 10", "burst = 0"), "burst is 0"),
        (
            SHARED_BANK.replace("max_in_flight = 8", "max_in_flight = 0"),
            "max_in_flight is 0",
        ),
        (
            SHARED_BANK.replace("failures = 3", "failures = 0"),
            "breaker.failures",
        ),
        (
            SHARED_BANK.replace("open_ms = 2000", "open_ms = 2000\n    max_open_ms = 10"),
            "max_open_ms",
        ),
        (
            SHARED_BANK.replace("max_in_flight = 8", "max_inflight = 8"),
            "upstream.bank: unknown field",
        ),
        (
            SHARED_BANK
                .replace("[upstream.bank]", "[upstream.Bank]")
                .replace("[upstream.bank.", "[upstream.Bank."),
            "upstream name \"Bank\"",
        ),
        (
            SHARED_BANK.replacen("upstream = \"bank\"", "upstream = \"bnak\"", 1),
            "upstream \"bnak\" is not declared",
        ),
        (
            SHARED_BANK.replacen(
                "upstream = \"bank\"",
                "upstream = \"bank\"\n    breaker = false",
                1,
            ),
            "set breaker = false in [upstream.bank]",
        ),
        (
            "[upstream.bank]\nbreaker = 3\n".to_owned(),
            "upstream.bank: breaker is 3",
        ),
    ];
    for (text, expected) in cases {
        let error = Catalog::from_toml_str(&text, "bank.toml")
            .expect_err(expected)
            .to_string();
        assert!(error.contains(expected), "{expected}: {error}");
    }
}

#[test]
fn event_arguments_are_opted_in_per_tool_and_checked_at_load() {
    let with_events = |section: &str, schema_extra: &str| {
        let text = WIRE
            .replace("[tool.policy]", &format!("{section}\n[tool.policy]"))
            .replace(
                "date = { type = \"string\", format = \"date\" } }",
                &format!("date = {{ type = \"string\", format = \"date\" }}{schema_extra} }}"),
            );
        Catalog::from_toml_str(&text, "wire.toml")
    };
    assert!(wire().event_args().is_empty(), "none unless opted in");
    let catalog = with_events(
        "[tool.events]\ninclude_args = [\"amount_minor\", \"date\"]",
        "",
    )
    .expect("declared arguments load");
    assert_eq!(catalog.tools()[0].event_args(), ["amount_minor", "date"]);

    let secret = ", pin = { type = \"string\", writeOnly = true }, passphrase = { type = \"string\", format = \"password\" }";
    for (section, extra, names) in [
        (
            "[tool.events]\ninclude_args = [\"iban\"]",
            "",
            "wire.toml: tool payments/wire: events.include_args: \"iban\" is not an argument",
        ),
        (
            "[tool.events]\ninclude_args = [\"pin\"]",
            secret,
            "events.include_args: argument \"pin\" is marked secret",
        ),
        (
            "[tool.events]\ninclude_args = [\"passphrase\"]",
            secret,
            "events.include_args: argument \"passphrase\" is marked secret",
        ),
        (
            "[tool.events]\ninclude_args = [\"date\", \"date\"]",
            "",
            "events.include_args: \"date\" is listed twice",
        ),
    ] {
        let error = with_events(section, extra).expect_err(section).to_string();
        assert!(error.contains(names), "{section}: {error}");
    }
    let unknown = with_events("[tool.events]\ninclude = [\"date\"]", "")
        .expect_err("unknown key")
        .to_string();
    assert!(unknown.contains("include"), "{unknown}");
}

const CHARGE_WITH_EVIDENCE: &str = r#"
    [evidence_sources.stripe]
    scheme = "stripe"
    secret = { env = "STRIPE_WEBHOOK_SECRET" }
    [[tool]]
    name = "payments/charge"
    semantics = "IDEMPOTENT"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://stripe/v1/charges"
    [tool.evidence]
    source = "stripe"
    key_pointer = "/data/object/metadata/sluice_key"
    reference_pointer = "/data/object/id"
    outcome_pointer = "/type"
    present = ["charge.succeeded"]
    failed = ["charge.failed"]
"#;

#[test]
fn evidence_sources_are_declared_once_and_tools_name_them() {
    let catalog = Catalog::from_toml_str(CHARGE_WITH_EVIDENCE, "pay.toml").expect("valid");
    let source = catalog.evidence_source("stripe").expect("declared");
    assert_eq!(source.scheme, crate::evidence::Scheme::Stripe);
    assert_eq!(source.tolerance_s, crate::evidence::DEFAULT_TOLERANCE_S);
    let tools: Vec<_> = catalog.tools_with_evidence_from("stripe").collect();
    assert_eq!(tools.len(), 1);
    let declared = tools[0].evidence().expect("declared");
    assert_eq!(declared.failed, vec!["charge.failed".to_owned()]);
    assert_eq!(catalog.tools_with_evidence_from("other").count(), 0);
}

#[test]
fn evidence_declarations_are_checked_at_load_naming_file_source_or_tool_and_key() {
    let refused = |text: &str| {
        Catalog::from_toml_str(text, "pay.toml")
            .expect_err("refused")
            .to_string()
    };
    let undeclared = CHARGE_WITH_EVIDENCE.replace("source = \"stripe\"", "source = \"adyen\"");
    let why = refused(&undeclared);
    assert!(
        why.contains("pay.toml") && why.contains("payments/charge") && why.contains("adyen"),
        "{why}"
    );
    let inline = CHARGE_WITH_EVIDENCE.replace(
        "secret = { env = \"STRIPE_WEBHOOK_SECRET\" }",
        "secret = \"whsec_abc\"",
    );
    let why = refused(&inline);
    assert!(
        why.contains("evidence_sources.stripe: secret") && why.contains("never in the catalog"),
        "{why}"
    );
    let scheme = CHARGE_WITH_EVIDENCE.replace("scheme = \"stripe\"", "scheme = \"md5\"");
    assert!(refused(&scheme).contains("evidence_sources.stripe: scheme"));
    let hmac = CHARGE_WITH_EVIDENCE.replace("scheme = \"stripe\"", "scheme = \"hmac\"");
    assert!(refused(&hmac).contains("evidence_sources.stripe: header"));
    let pointer = CHARGE_WITH_EVIDENCE.replace("\"/type\"", "\"type\"");
    assert!(refused(&pointer).contains("evidence.outcome_pointer \"type\" is not a JSON pointer"));
    let overlap = CHARGE_WITH_EVIDENCE.replace("[\"charge.failed\"]", "[\"charge.succeeded\"]");
    assert!(refused(&overlap).contains("listed twice"));
    let nothing_present = CHARGE_WITH_EVIDENCE.replace("present = [\"charge.succeeded\"]", "");
    assert!(refused(&nothing_present).contains("evidence.present lists no value"));
    let neither = CHARGE_WITH_EVIDENCE
        .replace("key_pointer = \"/data/object/metadata/sluice_key\"", "")
        .replace("reference_pointer = \"/data/object/id\"", "");
    let why = refused(&neither);
    assert!(
        why.contains("pay.toml")
            && why.contains("payments/charge")
            && why.contains("key_pointer")
            && why.contains("reference_pointer"),
        "{why}"
    );
    let bad_key = CHARGE_WITH_EVIDENCE.replace(
        "\"/data/object/metadata/sluice_key\"",
        "\"data/object/metadata/sluice_key\"",
    );
    assert!(refused(&bad_key).contains("evidence.key_pointer"));
}

#[test]
fn a_tool_whose_upstream_echoes_no_key_matches_its_evidence_by_reference() {
    let by_reference =
        CHARGE_WITH_EVIDENCE.replace("key_pointer = \"/data/object/metadata/sluice_key\"", "");
    let catalog = Catalog::from_toml_str(&by_reference, "pay.toml").expect("valid");
    let tool = &catalog.tools()[0];
    let declared = tool.evidence().expect("declared");
    assert_eq!(declared.key_pointer, None);
    assert_eq!(
        declared.reference_pointer.as_deref(),
        Some("/data/object/id")
    );
    assert!(tool.evidence_by_reference());
    // Declaring both matches by key first, and by reference too: indexed.
    let both = Catalog::from_toml_str(CHARGE_WITH_EVIDENCE, "pay.toml").expect("valid");
    assert!(both.tools()[0].evidence_by_reference());
    // By key only: never indexed, so its writes cost nothing more.
    let by_key = CHARGE_WITH_EVIDENCE.replace("reference_pointer = \"/data/object/id\"", "");
    let by_key = Catalog::from_toml_str(&by_key, "pay.toml").expect("valid");
    assert!(!by_key.tools()[0].evidence_by_reference());
    // No evidence at all: never indexed.
    let none = Catalog::from_toml_str(PAYOUT_ASYNC, "psp.toml").expect("valid");
    assert!(!none.tools()[0].evidence_by_reference());
}

const PAYOUT_ASYNC: &str = r#"
    [[tool]]
    name = "payouts/send"
    semantics = "NON_IDEMPOTENT"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://psp/payouts"
    [tool.status_check]
    url = "http://psp/payouts/by-key/{idempotency_key}"
    [tool.async]
    accepted_status = [202]
    deadline_ms = 600000
    then = "look"
    outcome_pointer = "/status"
    present = ["succeeded"]
    failed = ["failed"]
"#;

#[test]
fn an_asynchronous_tool_declares_its_accepted_statuses_deadline_and_callback_reading() {
    let catalog = Catalog::from_toml_str(PAYOUT_ASYNC, "psp.toml").expect("valid");
    let tool = &catalog.tools()[0];
    let declared = tool.asynchronous().expect("declared");
    assert_eq!(declared.accepted_status, vec![202]);
    assert_eq!(declared.then, AtDeadline::Look);
    let outcome = declared.outcome.as_ref().expect("its own reading");
    assert_eq!(outcome.outcome_pointer, "/status");
    let rules = tool.rules();
    assert_eq!(rules.async_deadline_ms, Some(600_000));
    assert!(!rules.async_escalate);
    let escalate = Catalog::from_toml_str(
        &PAYOUT_ASYNC.replace("then = \"look\"", "then = \"escalate\""),
        "psp.toml",
    )
    .expect("valid");
    assert!(escalate.tools()[0].rules().async_escalate);
    // A tool without [tool.async] never waits for a callback.
    assert_eq!(wire().rules().async_deadline_ms, None);
}

#[test]
fn async_declarations_are_checked_at_load_naming_file_tool_and_key() {
    let refused = |text: &str| {
        Catalog::from_toml_str(text, "psp.toml")
            .expect_err("refused")
            .to_string()
    };
    let no_check = PAYOUT_ASYNC.replace(
        "[tool.status_check]\n    url = \"http://psp/payouts/by-key/{idempotency_key}\"",
        "",
    );
    let why = refused(&no_check);
    assert!(
        why.contains("psp.toml")
            && why.contains("payouts/send")
            && why.contains("async.then = \"look\" needs a status check"),
        "{why}"
    );
    // Without a status check, a person decides at the deadline: valid (for a tool safe
    // without a status check).
    Catalog::from_toml_str(
        &no_check
            .replace("then = \"look\"", "then = \"escalate\"")
            .replace("NON_IDEMPOTENT", "IDEMPOTENT"),
        "psp.toml",
    )
    .expect("escalate needs no status check");
    let ok_status = PAYOUT_ASYNC.replace("[202]", "[200]");
    assert!(
        refused(&ok_status)
            .contains("async.accepted_status 200 is not a 2xx status other than 200 and 201")
    );
    let twice = PAYOUT_ASYNC.replace("[202]", "[202, 202]");
    assert!(refused(&twice).contains("lists 202 twice"));
    let none = PAYOUT_ASYNC.replace("[202]", "[]");
    assert!(refused(&none).contains("async.accepted_status lists no status"));
    let zero = PAYOUT_ASYNC.replace("600000", "0");
    assert!(refused(&zero).contains("async.deadline_ms 0 is not between"));
    let then = PAYOUT_ASYNC.replace("then = \"look\"", "then = \"wait\"");
    assert!(refused(&then).contains("wait"), "{}", refused(&then));
    let pointer = PAYOUT_ASYNC.replace("\"/status\"", "\"status\"");
    assert!(refused(&pointer).contains("async.outcome_pointer \"status\" is not a JSON pointer"));
    let unreadable = PAYOUT_ASYNC.replace(
        "outcome_pointer = \"/status\"\n    present = [\"succeeded\"]\n    failed = [\"failed\"]",
        "",
    );
    assert!(refused(&unreadable).contains("the callback's outcome cannot be read"));
    let values_only = PAYOUT_ASYNC.replace("outcome_pointer = \"/status\"", "");
    assert!(refused(&values_only).contains("no outcome_pointer"));
    let overlap = PAYOUT_ASYNC.replace("[\"failed\"]", "[\"succeeded\"]");
    assert!(refused(&overlap).contains("listed twice"));
}
