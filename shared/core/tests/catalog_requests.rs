//! Catalogs that describe real APIs: named credentials whose secrets are only references, the
//! request's shape (body templates, form bodies, headers, query), how a status check's answers
//! are read, and the refusals a catalog author meets, each naming file, tool and key and never
//! echoing a secret.

use serde_json::json;
use sluice_core::catalog::{
    BodyTemplate, Catalog, CatalogError, ContentType, CredentialKind, MatchList, SecretRef,
    Template, UrlKeys, form_pairs, render_value,
};
use sluice_core::{BusinessKey, IdempotencyKey};

/// A Stripe-like charge: a form body with nested metadata, a key header of Stripe's name, a
/// lookup that reads a list, a refund that needs the charge's id.
const CHARGE: &str = r#"
[credentials.stripe]
kind = "bearer"
token = { env = "STRIPE_SECRET_KEY" }

[[tool]]
name = "payments/charge"
semantics = "IDEMPOTENT"
credential = "stripe"
schema = { type = "object", required = ["amount", "order"], properties = { amount = { type = "integer" }, order = { type = "object", required = ["id"], properties = { id = { type = "string" }, note = { type = "string" } } } } }
[tool.dispatch]
url = "http://stripe.test/v1/charges"
content_type = "form"
body = { amount = "{args.amount}", currency = "usd", description = "order {args.order.id}", metadata = { order_id = "{args.order.id}", note = "{args.order.note}", sluice_key = "{idempotency_key}" } }
headers = { "Stripe-Version" = "2024-06-20" }
[tool.status_check]
url = "http://stripe.test/v1/charges/search"
query = { query = "metadata['sluice_key']:'{idempotency_key}'" }
matches = "/data"
[tool.compensate]
url = "http://stripe.test/v1/refunds"
content_type = "form"
body = { charge = "{external_ref}" }
"#;

fn charge() -> Catalog {
    Catalog::from_toml_str(CHARGE, "stripe.toml").expect("the charge catalog is valid")
}

fn refused(text: &str) -> String {
    let err = Catalog::from_toml_str(text, "api.toml").expect_err("refused");
    err.to_string()
}

#[test]
fn a_named_credential_is_a_reference_and_applies_to_every_endpoint() {
    let catalog = charge();
    let tool = &catalog.tools()[0];
    for (section, endpoint) in tool.endpoints() {
        let names: Vec<&str> = endpoint
            .shape
            .credentials
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["stripe"], "{section}");
    }
    let credential = catalog.credentials().next().expect("declared");
    assert_eq!(
        credential.kind,
        CredentialKind::Bearer {
            token: SecretRef::Env("STRIPE_SECRET_KEY".into())
        }
    );
}

#[test]
fn a_secret_written_as_text_is_refused_without_being_shown() {
    let text = CHARGE.replace(
        "token = { env = \"STRIPE_SECRET_KEY\" }",
        "token = \"sk_test_4eC39HqLyjWDarjtT1zdp7dc\"",
    );
    let message = refused(&text);
    assert!(
        message.contains("api.toml: credentials.stripe: token is written as text"),
        "{message}"
    );
    assert!(message.contains("{ env = \"NAME\" }"), "{message}");
    assert!(
        !message.contains("sk_test"),
        "the secret is echoed: {message}"
    );
}

#[test]
fn user_information_in_a_url_is_refused_with_what_to_use_instead() {
    let text = CHARGE.replace(
        "http://stripe.test/v1/charges\"",
        "http://sk_test_4eC39HqLyjWDarjtT1zdp7dc:@stripe.test/v1/charges\"",
    );
    let err = Catalog::from_toml_str(&text, "api.toml").expect_err("refused");
    assert!(matches!(err, CatalogError::UserInfoInUrl { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("payments/charge") && message.contains("dispatch.url"),
        "{message}"
    );
    assert!(message.contains("[credentials.<name>]"), "{message}");
    assert!(
        !message.contains("sk_test"),
        "the secret is echoed: {message}"
    );
    // Even in a url that is not http(s), where the error would quote the url.
    let ftp = CHARGE.replace(
        "http://stripe.test/v1/charges\"",
        "ftp://user:hunter2@stripe.test/v1\"",
    );
    assert!(!refused(&ftp).contains("hunter2"));
}

#[test]
fn credentials_must_be_declared_and_well_formed() {
    let unknown = CHARGE.replace("credential = \"stripe\"", "credential = \"stripe_live\"");
    assert!(
        refused(&unknown).contains("names credential \"stripe_live\", which is not declared"),
        "{}",
        refused(&unknown)
    );
    let kind = CHARGE.replace("kind = \"bearer\"", "kind = \"oauth\"");
    assert!(refused(&kind).contains("credentials.stripe: kind \"oauth\" is unknown"));
    let extra = CHARGE.replace("kind = \"bearer\"", "kind = \"bearer\"\nusername = \"x\"");
    assert!(refused(&extra).contains("unknown key \"username\" for kind bearer"));
    let sigv4 = CHARGE.replace(
        "kind = \"bearer\"\ntoken = { env = \"STRIPE_SECRET_KEY\" }",
        "kind = \"aws_sigv4\"\nservice = \"sqs\"\nregion = \"us-east-1\"\naccess_key_id = { env = \"A\" }",
    );
    assert!(refused(&sigv4).contains("secret_access_key is missing"));
}

#[test]
fn two_writers_of_one_header_are_refused() {
    let both = CHARGE.replace(
        "[[tool]]",
        "[credentials.basic]\nkind = \"basic\"\nusername = \"u\"\npassword = { file = \"pw\" }\n\n[[tool]]",
    );
    let both = both.replace(
        "credential = \"stripe\"",
        "credential = [\"stripe\", \"basic\"]",
    );
    let message = refused(&both);
    assert!(
        message.contains("header \"authorization\" would be written twice"),
        "{message}"
    );
    let declared = CHARGE.replace(
        "headers = { \"Stripe-Version\" = \"2024-06-20\" }",
        "headers = { \"Authorization\" = \"Bearer sk_test_x\" }",
    );
    let message = refused(&declared);
    assert!(
        message.contains("dispatch.headers: Authorization is written only by a credential"),
        "{message}"
    );
    let key_twice = CHARGE.replace(
        "headers = { \"Stripe-Version\" = \"2024-06-20\" }",
        "headers = { \"idempotency-key\" = \"{run_id}\" }",
    );
    assert!(refused(&key_twice).contains("would be written twice"));
}

#[test]
fn body_templates_are_checked_against_the_schema_at_load() {
    // A text placeholder needs a required field at every level.
    let optional = CHARGE.replace(
        "description = \"order {args.order.id}\"",
        "description = \"{args.amount} {args.order.note}\"",
    );
    let message = refused(&optional);
    assert!(
        message.contains(
            "dispatch.body names field \"order.note\", which the schema does not list in required"
        ),
        "{message}"
    );
    let unknown = CHARGE.replace("{args.order.id}\"", "{args.order.sku}\"");
    assert!(
        refused(&unknown)
            .contains("names field \"order.sku\", which is not in the schema's properties")
    );
    // external_ref is known only to a compensation.
    let early = CHARGE.replace(
        "sluice_key = \"{idempotency_key}\"",
        "sluice_key = \"{external_ref}\"",
    );
    assert!(refused(&early).contains("only compensate may use it"));
    let braces = CHARGE.replace("\"order {args.order.id}\"", "\"order {args.order.id\"");
    assert!(refused(&braces).contains("in the string at /description"));
}

#[test]
fn a_body_renders_nested_arguments_with_their_types_and_leaves_out_missing_ones() {
    let catalog = charge();
    let tool = &catalog.tools()[0];
    let body = tool
        .dispatch()
        .endpoint
        .shape
        .body
        .as_ref()
        .expect("declared");
    let key = IdempotencyKey::parse("r-1/d-1/payments/charge/0").expect("valid");
    let keys = UrlKeys {
        idempotency_key: &key,
        business_key: None,
        external_ref: None,
        compensation_key: None,
        callback_url: None,
    };
    let args = json!({"amount": 1999, "order": {"id": "o-7"}});
    let rendered = body.render(&args, &keys).expect("renders").expect("a body");
    assert_eq!(
        rendered,
        json!({
            "amount": 1999,
            "currency": "usd",
            "description": "order o-7",
            "metadata": {"order_id": "o-7", "sluice_key": "r-1/d-1/payments/charge/0"}
        })
    );
    assert_eq!(
        tool.dispatch().endpoint.shape.content_type,
        ContentType::Form
    );
    let pairs = form_pairs(&rendered);
    assert!(
        pairs.contains(&("amount".into(), "1999".into())),
        "{pairs:?}"
    );
    assert!(
        pairs.contains(&("metadata[order_id]".into(), "o-7".into())),
        "{pairs:?}"
    );
    let with_note = json!({"amount": 5, "order": {"id": "o", "note": "gift"}});
    let rendered = body
        .render(&with_note, &keys)
        .expect("renders")
        .expect("a body");
    assert_eq!(rendered["metadata"]["note"], json!("gift"));
}

#[test]
fn form_pairs_use_brackets_for_arrays_and_skip_nulls() {
    let pairs =
        form_pairs(&json!({"items": [{"price": "p_1", "qty": 2}], "gone": null, "ok": true}));
    assert_eq!(
        pairs,
        [
            ("items[0][price]".to_owned(), "p_1".to_owned()),
            ("items[0][qty]".to_owned(), "2".to_owned()),
            ("ok".to_owned(), "true".to_owned()),
        ]
    );
}

#[test]
fn a_query_value_that_is_one_missing_argument_is_left_out() {
    let key = IdempotencyKey::parse("r-1/d-1/a/b/0").expect("valid");
    let business = BusinessKey::new("k 1");
    let keys = UrlKeys {
        idempotency_key: &key,
        business_key: Some(&business),
        external_ref: None,
        compensation_key: None,
        callback_url: None,
    };
    let whole = Template::parse("{args.cursor}").expect("valid");
    assert_eq!(render_value(&whole, &json!({}), &keys), Ok(None));
    assert_eq!(
        render_value(&whole, &json!({"cursor": 3}), &keys),
        Ok(Some("3".into()))
    );
    let text = Template::parse("key:{business_key}").expect("valid");
    assert_eq!(
        render_value(&text, &json!({}), &keys),
        Ok(Some("key:k 1".into()))
    );
    assert!(BodyTemplate::parse(&json!({"a": "{"})).is_err());
}

#[test]
fn a_status_check_reads_only_what_it_declares() {
    let catalog = charge();
    let tool = &catalog.tools()[0];
    let answers = tool.status_answers();
    assert!(
        answers.absent_status.is_empty(),
        "404 is not absent by default"
    );
    assert!(answers.duplicate_status.is_empty());
    assert_eq!(
        answers.list,
        Some(MatchList::Items {
            pointer: "/data".into(),
            reference: "/id".into(),
            filter: Vec::new(),
        })
    );
    // A compensation that names the reference makes the dispatch require one.
    assert!(tool.dispatch().require_reference);
    let explicit = CHARGE.replace(
        "headers = { \"Stripe-Version\" = \"2024-06-20\" }",
        "headers = { \"Stripe-Version\" = \"2024-06-20\" }\nrequire_reference = false",
    );
    let catalog = Catalog::from_toml_str(&explicit, "x.toml").expect("valid");
    assert!(!catalog.tools()[0].dispatch().require_reference);

    let both = CHARGE.replace(
        "matches = \"/data\"",
        "matches = \"/data\"\ncount = \"/total\"",
    );
    assert!(refused(&both).contains("set matches or count, not both"));
    let server_error = CHARGE.replace("matches = \"/data\"", "absent_status = [404, 503]");
    assert!(refused(&server_error).contains("503 is not a 2xx or 4xx status"));
    let misplaced = CHARGE.replace(
        "content_type = \"form\"\nbody = { charge",
        "absent_status = [404]\ncontent_type = \"form\"\nbody = { charge",
    );
    assert!(
        refused(&misplaced).contains(
            "compensate.absent_status: absent_status applies only to [tool.status_check]"
        ),
        "{}",
        refused(&misplaced)
    );
    let pointer = CHARGE.replace("matches = \"/data\"", "matches = \"data\"");
    assert!(refused(&pointer).contains("status_check.matches"));
}

#[test]
fn a_missing_idempotency_header_name_sends_none_and_a_bad_one_is_refused() {
    let catalog = charge();
    assert_eq!(
        catalog.tools()[0]
            .dispatch()
            .endpoint
            .shape
            .idempotency_header
            .as_deref(),
        Some("Idempotency-Key")
    );
    let none = CHARGE.replace(
        "content_type = \"form\"\nbody = { amount",
        "idempotency_header = \"\"\ncontent_type = \"form\"\nbody = { amount",
    );
    let catalog = Catalog::from_toml_str(&none, "x.toml").expect("valid");
    assert_eq!(
        catalog.tools()[0]
            .dispatch()
            .endpoint
            .shape
            .idempotency_header,
        None
    );
    let bad = CHARGE.replace(
        "content_type = \"form\"\nbody = { amount",
        "idempotency_header = \"Idem Key\"\ncontent_type = \"form\"\nbody = { amount",
    );
    assert!(refused(&bad).contains("is not an HTTP header name"));
}

#[test]
fn secret_files_resolve_against_the_catalog_directory() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let text = CHARGE.replace(
        "token = { env = \"STRIPE_SECRET_KEY\" }",
        "token = { file = \"secrets/stripe\" }",
    );
    let path = dir.path().join("catalog.toml");
    std::fs::write(&path, text).expect("written");
    let catalog = Catalog::load(&path).expect("valid");
    let credential = catalog.credentials().next().expect("declared");
    assert_eq!(
        credential.kind,
        CredentialKind::Bearer {
            token: SecretRef::File(dir.path().join("secrets/stripe"))
        }
    );
}

#[test]
fn a_json_body_may_be_labelled_with_the_json_media_type_an_api_requires() {
    // AWS's JSON protocol (SQS, DynamoDB, …) takes only application/x-amz-json-1.0.
    let sqs = r#"
[[tool]]
name = "queue/send"
semantics = "IDEMPOTENT"
schema = { type = "object", required = ["body"], properties = { body = { type = "string" } } }
[tool.dispatch]
url = "http://sqs.test/"
headers = { "Content-Type" = "application/x-amz-json-1.0", "X-Amz-Target" = "AmazonSQS.SendMessage" }
body = { MessageBody = "{args.body}" }
"#;
    let catalog = Catalog::from_toml_str(sqs, "sqs.toml").expect("a JSON media type is accepted");
    let shape = &catalog.tools()[0].dispatch().endpoint.shape;
    assert_eq!(shape.content_type, ContentType::Json);
    assert!(
        shape
            .headers
            .iter()
            .any(|(name, value)| name == "Content-Type"
                && value == &Template::parse("application/x-amz-json-1.0").expect("valid")),
        "{:?}",
        shape.headers
    );
    for label in [
        "application/vnd.api+json",
        "application/json; charset=utf-8",
    ] {
        let text = sqs.replace("application/x-amz-json-1.0", label);
        assert!(
            Catalog::from_toml_str(&text, "sqs.toml").is_ok(),
            "{label} is a JSON media type"
        );
    }
    // Anything that would not describe the body the connector encodes is refused.
    for (label, content_type) in [
        ("text/plain", ""),
        ("application/x-amz-json-1.0", "content_type = \"form\"\n"),
        ("application/{args.body}+json", ""),
        ("json", ""),
    ] {
        let text = sqs
            .replace("application/x-amz-json-1.0", label)
            .replace("headers = {", &format!("{content_type}headers = {{"));
        let message = refused(&text);
        assert!(
            message.contains("dispatch.headers: Content-Type is set by content_type"),
            "{label} with {content_type:?}: {message}"
        );
    }
}

#[test]
fn a_status_check_that_cannot_fit_the_sweep_is_named_with_what_would_fit() {
    let text = CHARGE.replace(
        "matches = \"/data\"",
        "matches = \"/data\"\ntimeout_ms = 12000",
    );
    let catalog = Catalog::from_toml_str(&text, "slow.toml").expect("valid");
    let problems = sluice_core::sweep::looks_that_do_not_fit(&catalog, 10_000);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("tool payments/charge: status_check.timeout_ms (12000 ms)")
            && problems[0].contains("reconciler.sweep_item_timeout_ms (10000 ms)")
            && problems[0].contains("at least 13000 ms"),
        "{}",
        problems[0]
    );
    assert!(sluice_core::sweep::looks_that_do_not_fit(&catalog, 13_000).is_empty());
    // The default check timeout (10 s) fits the default item budget (15 s).
    let defaults = sluice_core::sweep::looks_that_do_not_fit(&charge(), 15_000);
    assert!(defaults.is_empty(), "{defaults:?}");
}

#[test]
fn a_variable_names_the_upstream_once_and_its_value_is_checked_like_any_url() {
    let text = CHARGE
        .replace(
            "[credentials.stripe]",
            "[variables]\nstripe = { default = \"https://api.stripe.test\", env = \"SLUICE_TEST_NEVER_SET_STRIPE\" }\n\n[credentials.stripe]",
        )
        .replace("http://stripe.test", "${stripe}");
    let catalog = Catalog::from_toml_str(&text, "vars.toml").expect("valid");
    for (section, endpoint) in catalog.tools()[0].endpoints() {
        assert!(
            endpoint
                .url
                .as_str()
                .starts_with("https://api.stripe.test/v1/"),
            "{section}: {}",
            endpoint.url
        );
    }
    let unknown = text.replace("${stripe}/v1/refunds", "${strip}/v1/refunds");
    let message = refused(&unknown);
    assert!(
        message.contains("compensate.url: ${strip} names no variable"),
        "{message}"
    );
    let userinfo = text.replace(
        "default = \"https://api.stripe.test\"",
        "default = \"https://sk_live_x:@api.stripe.test\"",
    );
    let message = refused(&userinfo);
    assert!(message.contains("user information"), "{message}");
    assert!(!message.contains("sk_live"), "{message}");
}

#[test]
fn variables_reach_bodies_headers_and_queries_and_keys_fit_short_ids() {
    let text = r#"
[variables]
queue = "http://sqs.test/123456789012/jobs.fifo"

[[tool]]
name = "orders/enqueue"
semantics = "IDEMPOTENT"
schema = { type = "object", required = ["body"], properties = { body = { type = "string" } } }
[tool.dispatch]
url = "http://sqs.test/"
headers = { "X-Queue" = "${queue}" }
query = { q = "${queue}" }
body = { QueueUrl = "${queue}", MessageBody = "{args.body}", MessageDeduplicationId = "{idempotency_key_sha256}" }
[tool.status_check]
url = "http://sqs.test/by/{idempotency_key}"
method = "HEAD"
absent_status = [404]
[tool.compensate]
url = "http://sqs.test/undo"
body = { key = "{compensation_key}", of = "{external_ref}" }
"#;
    let catalog = Catalog::from_toml_str(text, "q.toml").expect("valid");
    let tool = &catalog.tools()[0];
    let key = IdempotencyKey::parse("r-1/d-1/orders/enqueue/0").expect("valid");
    let keys = UrlKeys {
        idempotency_key: &key,
        business_key: None,
        external_ref: None,
        compensation_key: None,
        callback_url: None,
    };
    let body = tool
        .dispatch()
        .endpoint
        .shape
        .body
        .as_ref()
        .expect("declared");
    let rendered = body
        .render(&json!({"body": "hi"}), &keys)
        .expect("renders")
        .expect("a body");
    assert_eq!(
        rendered["QueueUrl"],
        json!("http://sqs.test/123456789012/jobs.fifo")
    );
    let dedup = rendered["MessageDeduplicationId"].as_str().expect("text");
    assert_eq!(dedup.len(), 64, "{dedup}");
    assert!(dedup.bytes().all(|b| b.is_ascii_hexdigit()), "{dedup}");
    assert_eq!(
        tool.dispatch().endpoint.shape.headers[0].1.as_str(),
        "http://sqs.test/123456789012/jobs.fifo"
    );
    assert_eq!(
        tool.status_check().expect("declared").method,
        sluice_core::catalog::HttpMethod::Head
    );
    // A compensation's own key is a compensation's alone.
    let early = text.replace(
        "MessageDeduplicationId = \"{idempotency_key_sha256}\"",
        "MessageDeduplicationId = \"{compensation_key}\"",
    );
    assert!(refused(&early).contains("only compensate may use it"));
}
