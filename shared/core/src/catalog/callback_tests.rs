//! `{callback_url}` in the catalog: where it may be named, how it renders, and how a
//! callback's body is read (`crate::callback::read`).

use serde_json::json;

use super::*;
use crate::evidence::EvidenceOutcome;
use crate::ids::IdempotencyKey;

/// An asynchronous payout whose dispatch gives the provider its callback URL in the body, a
/// header and the query.
const PAYOUT: &str = r#"
    [[tool]]
    name = "payouts/send"
    semantics = "IDEMPOTENT"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://psp/payouts"
    body = { amount = 5, notify = { url = "{callback_url}" } }
    headers = { "X-Callback" = "{callback_url}" }
    query = { cb = "{callback_url}" }
    [tool.async]
    accepted_status = [202]
    deadline_ms = 600000
    then = "escalate"
    outcome_pointer = "/status"
    present = ["succeeded"]
    failed = ["failed"]
    reference_pointer = "/id"
"#;

fn payout() -> Tool {
    Catalog::from_toml_str(PAYOUT, "psp.toml")
        .expect("valid")
        .tools()[0]
        .clone()
}

fn refused(text: &str) -> String {
    Catalog::from_toml_str(text, "psp.toml")
        .expect_err("refused")
        .to_string()
}

#[test]
fn an_asynchronous_tools_dispatch_may_name_its_callback_url_and_says_so_at_load() {
    let tool = payout();
    assert!(tool.uses_callback_url());
    assert_eq!(
        tool.asynchronous()
            .and_then(|declared| declared.reference_pointer.as_deref()),
        Some("/id")
    );
    // In the URL too (a path segment, percent-encoded).
    let in_url = Catalog::from_toml_str(
        &PAYOUT.replace(
            "url = \"http://psp/payouts\"",
            "url = \"http://psp/payouts/{callback_url}\"",
        ),
        "psp.toml",
    )
    .expect("valid");
    assert!(in_url.tools()[0].uses_callback_url());
    // A tool that does not name it costs nothing at dispatch.
    let without = PAYOUT
        .replace("notify = { url = \"{callback_url}\" }", "notify = false")
        .replace("headers = { \"X-Callback\" = \"{callback_url}\" }", "")
        .replace("query = { cb = \"{callback_url}\" }", "");
    let catalog = Catalog::from_toml_str(&without, "psp.toml").expect("valid");
    assert!(!catalog.tools()[0].uses_callback_url());
}

#[test]
fn callback_url_anywhere_else_is_refused_naming_file_tool_and_section() {
    // A tool that is not asynchronous.
    let plain = PAYOUT.replace(
        "[tool.async]\n    accepted_status = [202]\n    deadline_ms = 600000\n    then = \"escalate\"\n    outcome_pointer = \"/status\"\n    present = [\"succeeded\"]\n    failed = [\"failed\"]\n    reference_pointer = \"/id\"",
        "",
    );
    let why = refused(&plain);
    assert!(
        why.contains("psp.toml")
            && why.contains("payouts/send")
            && why.contains("dispatch.body")
            && why.contains("callback_url")
            && why.contains("[tool.async]"),
        "{why}"
    );
    // A status check or a compensation of an asynchronous one.
    for (section, key) in [
        (
            "[tool.status_check]\n    url = \"http://psp/payouts/{callback_url}\"",
            "status_check.url",
        ),
        (
            "[tool.status_check]\n    url = \"http://psp/payouts\"\n    headers = { \"X-Cb\" = \"{callback_url}\" }",
            "status_check.headers",
        ),
        (
            "[tool.compensate]\n    url = \"http://psp/payouts/cancel\"\n    body = { cb = \"{callback_url}\" }",
            "compensate.body",
        ),
        (
            "[tool.compensate]\n    url = \"http://psp/payouts/cancel\"\n    query = { cb = \"{callback_url}\" }",
            "compensate.query",
        ),
    ] {
        let text = format!("{PAYOUT}\n    {section}\n");
        let why = refused(&text);
        assert!(
            why.contains("psp.toml")
                && why.contains("payouts/send")
                && why.contains(key)
                && why.contains("only dispatch may use it"),
            "{section}: {why}"
        );
    }
    let bad_pointer = PAYOUT.replace("reference_pointer = \"/id\"", "reference_pointer = \"id\"");
    assert!(
        refused(&bad_pointer).contains("async.reference_pointer \"id\" is not a JSON pointer"),
        "{}",
        refused(&bad_pointer)
    );
}

#[test]
fn the_callback_url_renders_where_given_and_is_never_shown_in_a_url() {
    let tool = payout();
    let key = IdempotencyKey::parse("r-1/d-1/payouts/send/0").expect("valid");
    let url = "https://sluice.example.com/v1/callbacks/abc.def";
    let keys = UrlKeys {
        idempotency_key: &key,
        business_key: None,
        external_ref: None,
        compensation_key: None,
        callback_url: Some(url),
    };
    let body = tool
        .dispatch()
        .endpoint
        .shape
        .body
        .as_ref()
        .expect("a body");
    assert_eq!(
        body.render(&json!({}), &keys).expect("renders"),
        Some(json!({"amount": 5, "notify": {"url": url}}))
    );
    let without = UrlKeys {
        callback_url: None,
        ..keys
    };
    assert_eq!(
        body.render(&json!({}), &without),
        Err(RenderError::MissingKey {
            key: "callback_url"
        })
    );
    let template = Template::parse("http://psp/payouts/{callback_url}/x").expect("valid");
    let shown = render_url_redacted(&template, &keys).expect("redacted");
    assert_eq!(shown, format!("http://psp/payouts/{REDACTED}/x"));
    assert!(!shown.contains("abc.def"));
}

#[test]
fn a_callbacks_body_is_read_by_the_tools_own_pointers_or_its_evidences() {
    let tool = payout();
    let key = "r-1/d-1/payouts/send/0".to_owned();
    let read = |body| crate::callback::read(&tool, key.clone(), &body).expect("asynchronous");
    let done = read(json!({"status": "succeeded", "id": "po_1"}));
    assert_eq!(done.key.as_deref(), Some(key.as_str()));
    assert_eq!(done.outcome, Some(EvidenceOutcome::Present));
    assert_eq!(done.external_ref.as_deref(), Some("po_1"));
    assert_eq!(
        read(json!({"status": "failed"})).outcome,
        Some(EvidenceOutcome::Failed)
    );
    let progress = read(json!({"status": "processing"}));
    assert_eq!(progress.outcome, None);
    assert_eq!(progress.outcome_value, "processing");
    assert_eq!(read(json!([1, 2])).outcome, None);

    // Borrowed from [tool.evidence]: its outcome and reference pointers.
    let borrowing = r#"
    [evidence_sources.psp]
    scheme = "stripe"
    secret = { env = "PSP_WEBHOOK_SECRET" }
    [[tool]]
    name = "payouts/send"
    semantics = "IDEMPOTENT"
    schema = { type = "object" }
    [tool.dispatch]
    url = "http://psp/payouts"
    body = { callback = "{callback_url}" }
    [tool.evidence]
    source = "psp"
    key_pointer = "/data/key"
    reference_pointer = "/data/id"
    outcome_pointer = "/type"
    present = ["payout.paid"]
    absent = ["payout.canceled"]
    [tool.async]
    accepted_status = [202]
    deadline_ms = 60000
    then = "escalate"
"#;
    let catalog = Catalog::from_toml_str(borrowing, "psp.toml").expect("valid");
    let tool = &catalog.tools()[0];
    assert!(tool.uses_callback_url());
    let reading = crate::callback::read(
        tool,
        key.clone(),
        &json!({"type": "payout.paid", "data": {"id": "po_2"}}),
    )
    .expect("asynchronous");
    assert_eq!(reading.outcome, Some(EvidenceOutcome::Present));
    assert_eq!(reading.external_ref.as_deref(), Some("po_2"));
    let canceled = crate::callback::read(tool, key.clone(), &json!({"type": "payout.canceled"}))
        .expect("asynchronous");
    assert_eq!(canceled.outcome, Some(EvidenceOutcome::Absent));
    // A tool that is not asynchronous takes no callbacks.
    let wire = Catalog::from_toml_str(
        "[[tool]]\nname = \"w\"\nsemantics = \"IDEMPOTENT\"\nschema = { type = \"object\" }\n[tool.dispatch]\nurl = \"http://bank/w\"\n",
        "w.toml",
    )
    .expect("valid");
    assert!(crate::callback::read(&wire.tools()[0], key, &json!({})).is_none());
}
