//! `schemas/openapi.yaml` against the real server: every route the document names is called
//! (and every route the server has is in the document), each answer's status is documented for
//! its operation, and each JSON body — successes and errors alike — matches the documented
//! schema. Request bodies sent here are checked against the documented request schemas too.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use sluice_tests::tokens::{ADMIN, AGENT_A, OPERATOR};
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

const DOCUMENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../schemas/openapi.yaml");

/// Every route the producer's router serves, as (method, OpenAPI path).
const SERVED: &[(&str, &str)] = &[
    ("GET", "/v1/whoami"),
    ("POST", "/v1/effects"),
    ("GET", "/v1/effects"),
    ("POST", "/v1/effects/batch"),
    ("GET", "/v1/tools"),
    ("GET", "/v1/tools/{tool}"),
    ("GET", "/v1/runs"),
    ("GET", "/v1/runs/{run_id}/effects"),
    ("GET", "/v1/runs/{run_id}/scheduled"),
    ("GET", "/v1/runs/{run_id}/effects/{command_key}"),
    ("DELETE", "/v1/runs/{run_id}/effects/{command_key}"),
    ("POST", "/v1/runs/{run_id}/effects/{command_key}:approve"),
    ("POST", "/v1/runs/{run_id}/effects/{command_key}:reject"),
    (
        "POST",
        "/v1/runs/{run_id}/effects/{command_key}:approval-link",
    ),
    ("POST", "/v1/runs/{run_id}/effects/{command_key}:cancel"),
    ("POST", "/v1/runs/{run_id}/effects/{command_key}:replay"),
    ("POST", "/v1/runs/{run_id}/effects/{command_key}:resolve"),
    ("POST", "/v1/runs/{run_id}/rollback"),
    ("GET", "/v1/runs/{run_id}/rollback"),
    ("GET", "/v1/runs/{run_id}/audit"),
    ("GET", "/v1/runs/{run_id}/audit/verify"),
    ("POST", "/v1/audit/purge"),
    ("GET", "/v1/events/stream"),
    ("GET", "/v1/overview"),
    ("GET", "/v1/flow"),
    ("GET", "/v1/budgets"),
    ("POST", "/v1/evidence/{source}"),
    ("GET", "/v1/evidence"),
    ("POST", "/v1/callbacks/{token}"),
    ("POST", "/v1/flow/{name}:pause"),
    ("POST", "/v1/flow/{name}:resume"),
    ("GET", "/ui"),
    ("GET", "/ui/"),
    ("GET", "/ui/{path}"),
    ("GET", "/approve/{token}"),
    ("POST", "/approve/{token}"),
    ("GET", "/approve/assets/{name}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
];

struct Spec {
    doc: Value,
    called: BTreeSet<(String, String)>,
    checked: usize,
}

impl Spec {
    fn load() -> Self {
        let text = std::fs::read_to_string(DOCUMENT).expect("schemas/openapi.yaml is readable");
        let doc: Value = serde_saphyr::from_str(&text).expect("the OpenAPI document is YAML");
        assert_eq!(doc["openapi"], json!("3.1.0"));
        Self {
            doc,
            called: BTreeSet::new(),
            checked: 0,
        }
    }

    fn operation(&self, method: &str, template: &str) -> &Value {
        let op = &self.doc["paths"][template][method.to_ascii_lowercase()];
        assert!(op.is_object(), "{method} {template} is not in the document");
        op
    }

    /// Validates `instance` against `schema`, resolving `#/components/...` in the document.
    fn check(&self, schema: &Value, instance: &Value, what: &str) {
        let mut root = schema.clone();
        if let Value::Object(map) = &mut root {
            map.insert("components".into(), self.doc["components"].clone());
        }
        let validator = jsonschema::draft202012::options()
            .should_validate_formats(true)
            .build(&root)
            .unwrap_or_else(|e| panic!("{what}: the documented schema compiles: {e}"));
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match the document: {errors:#?}\n{instance:#}"
        );
    }

    /// Calls `path` (an instance of `template`) and checks the request and the answer.
    async fn call(
        &mut self,
        client: &Agent,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        expect: u16,
    ) -> Answer {
        let op = self.operation(method, template).clone();
        if let Some(body) = &body {
            let schema = &op["requestBody"]["content"]["application/json"]["schema"];
            let schema = if schema.is_null() {
                // A shared request body.
                let name = op["requestBody"]["$ref"]
                    .as_str()
                    .and_then(|r| r.rsplit('/').next())
                    .unwrap_or_else(|| panic!("{method} {template} documents no request body"));
                self.doc["components"]["requestBodies"][name]["content"]["application/json"]
                    ["schema"]
                    .clone()
            } else {
                schema.clone()
            };
            // Requests that are meant to be refused need not match.
            if expect < 400 {
                self.check(
                    &schema,
                    body,
                    &format!("the request of {method} {template}"),
                );
            }
        }
        let answer = client.call(method, path, body.as_ref()).await;
        assert_eq!(
            answer.status.as_u16(),
            expect,
            "{method} {path}: {}",
            answer.text
        );
        let status = answer.status.as_u16().to_string();
        let mut response = op["responses"][&status].clone();
        assert!(
            !response.is_null(),
            "{method} {template} answered {status}, which the document does not list"
        );
        if let Some(name) = response["$ref"].as_str().and_then(|r| r.rsplit('/').next()) {
            response = self.doc["components"]["responses"][name].clone();
        }
        let content = &response["content"];
        // An answer documented as JSON or a page (`/approve/{token}`) is checked as what it is.
        let is_json = answer
            .headers
            .get("content-type")
            .and_then(|t| t.to_str().ok())
            .is_none_or(|t| t.starts_with("application/json"));
        if let Some(schema) = content
            .get("application/json")
            .filter(|_| is_json)
            .map(|c| &c["schema"])
        {
            self.check(
                schema,
                &answer.body,
                &format!("the {status} answer of {method} {template}"),
            );
        } else {
            // Text, HTML, a script: the document names the type, the body is not JSON.
            assert!(
                content.as_object().is_some_and(|types| !types.is_empty()),
                "{method} {template} {status} documents no content"
            );
        }
        self.called.insert((method.to_owned(), template.to_owned()));
        self.checked += 1;
        answer
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_as_the_openapi_document_says() {
    let mut spec = Spec::load();
    let documented: BTreeSet<(String, String)> = spec.doc["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .expect("a path item")
                .keys()
                .map(move |m| (m.to_ascii_uppercase(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = SERVED
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented, served,
        "the document and the router name the same routes"
    );

    // The bank refuses every wire (5xx, then absent): approved wires end FAILED, to be replayed.
    let bank = Faults::none().with_rates(Family::Bank, FaultRates::only(FaultKind::Error5xx, 1.0));
    let h = Harness::start_with(
        bank,
        |c| {
            c.dispatch("payments/wire", "timeout_ms", 400)
                .policy("payments/wire", "lease_ttl_ms", 2_000)
                .policy("payments/wire", "settle_ms", 300)
                .policy("payments/wire", "on_absent", "fail")
                .budget(
                    "all_wires",
                    "tools = [\"payments/wire\"]\nscope = \"tenant\"\nwindow = \"day\"\n\
                     limits = { EUR = 1000000000000 }\non_exceed = \"deny\"\n",
                )
        },
        |config| {
            tokens::install(config);
            config.producer.console = Some(true);
            config.approval_links.secret = Some("an approval-link key of 32 bytes or more".into());
        },
    )
    .await;
    let agent = h.agent.with_token(AGENT_A);
    let operator = h.agent.with_token(OPERATOR);
    let admin = h.agent.with_token(ADMIN);
    let nobody = h.agent.clone();
    let run = "r-openapi";
    let key_path = |key: &str| format!("/v1/runs/{run}/effects/{}", encode_key(key));
    const ONE: &str = "/v1/runs/{run_id}/effects/{command_key}";

    spec.call(&admin, "GET", "/v1/whoami", "/v1/whoami", None, 200)
        .await;
    spec.call(&nobody, "GET", "/v1/whoami", "/v1/whoami", None, 401)
        .await;

    // Tool discovery.
    let tools = spec
        .call(&agent, "GET", "/v1/tools", "/v1/tools", None, 200)
        .await;
    let names: Vec<&str> = tools.body["tools"]
        .as_array()
        .expect("a list of tools")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"payments/wire"), "{}", tools.text);
    spec.call(&nobody, "GET", "/v1/tools", "/v1/tools", None, 401)
        .await;
    let wire = spec
        .call(
            &operator,
            "GET",
            "/v1/tools/{tool}",
            "/v1/tools/payments/wire",
            None,
            200,
        )
        .await;
    assert_eq!(
        wire.body["semantics"],
        json!("NON_IDEMPOTENT"),
        "{}",
        wire.text
    );
    assert!(wire.body["business_key"].is_string(), "{}", wire.text);
    spec.call(
        &agent,
        "GET",
        "/v1/tools/{tool}",
        "/v1/tools/payments%2Fwire",
        None,
        200,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        "/v1/tools/{tool}",
        "/v1/tools/payments/nothing",
        None,
        404,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        "/v1/tools/{tool}",
        "/v1/tools/Bad%20Name",
        None,
        422,
    )
    .await;

    // Submissions.
    let email = effect(run, 1, "email/send", 0, email_args("openapi"));
    spec.call(
        &agent,
        "POST",
        "/v1/effects",
        "/v1/effects",
        Some(email.clone()),
        201,
    )
    .await;
    spec.call(
        &agent,
        "POST",
        "/v1/effects",
        "/v1/effects",
        Some(email.clone()),
        200,
    )
    .await;
    let mut drift = email.clone();
    drift["args"]["subject"] = json!("other");
    spec.call(
        &agent,
        "POST",
        "/v1/effects",
        "/v1/effects",
        Some(drift),
        409,
    )
    .await;
    spec.call(
        &agent,
        "POST",
        "/v1/effects",
        "/v1/effects",
        Some(effect(run, 9, "nope/tool", 0, json!({}))),
        404,
    )
    .await;
    spec.call(
        &agent,
        "POST",
        "/v1/effects",
        "/v1/effects",
        Some(effect(run, 9, "email/send", 0, json!({"to": 5}))),
        422,
    )
    .await;
    spec.call(
        &operator,
        "POST",
        "/v1/effects",
        "/v1/effects",
        Some(email.clone()),
        403,
    )
    .await;
    let raw = agent.submit_raw(b"{not json".to_vec()).await;
    assert_eq!(raw.status.as_u16(), 400);
    spec.check(
        &json!({"$ref": "#/components/schemas/Error"}),
        &raw.body,
        "a 400 answer",
    );
    let huge = agent.submit_raw(vec![b' '; 1536 * 1024]).await;
    assert_eq!(huge.status.as_u16(), 413, "{}", huge.text);
    spec.check(
        &json!({"$ref": "#/components/schemas/Error"}),
        &huge.body,
        "a 413 answer",
    );
    let wrong_method = agent.call("PUT", "/v1/effects", None).await;
    assert_eq!(wrong_method.status.as_u16(), 405, "{}", wrong_method.text);
    spec.check(
        &json!({"$ref": "#/components/schemas/Error"}),
        &wrong_method.body,
        "a 405 answer",
    );
    let nowhere = agent.call("PUT", "/v1/nowhere", None).await;
    assert_eq!(nowhere.status.as_u16(), 404, "{}", nowhere.text);
    spec.check(
        &json!({"$ref": "#/components/schemas/Error"}),
        &nowhere.body,
        "an unknown route",
    );
    let mut later = effect(run, 2, "tickets/create", 0, ticket_args("later"));
    later["delay_ms"] = json!(3_600_000);
    let mut later_too = effect(run, 3, "tickets/create", 0, ticket_args("later too"));
    later_too["not_before"] = json!(h.ctx().clock.now().plus_millis(2 * 86_400_000).to_string());
    let big = |decision: u32| {
        effect(
            run,
            decision,
            "payments/wire",
            0,
            wire_args(&format!("acc-oa-{decision}"), 2_000_000),
        )
    };
    spec.call(
        &agent,
        "POST",
        "/v1/effects/batch",
        "/v1/effects/batch",
        Some(json!({"effects": [later, later_too, big(4), big(5), effect(run, 6, "nope/tool", 0, json!({}))]})),
        200,
    )
    .await;
    assert_eq!(
        agent
            .wait_settled(run, "d-1/email/send/0")
            .await
            .status()
            .as_str(),
        "CONFIRMED"
    );
    assert_eq!(
        agent
            .wait_settled(run, "d-4/payments/wire/0")
            .await
            .status()
            .as_str(),
        "BLOCKED"
    );
    assert_eq!(
        agent
            .wait_settled(run, "d-5/payments/wire/0")
            .await
            .status()
            .as_str(),
        "BLOCKED"
    );

    // Reads.
    spec.call(
        &operator,
        "GET",
        "/v1/effects",
        "/v1/effects?status=BLOCKED&tool=payments/wire&limit=10",
        None,
        200,
    )
    .await;
    spec.call(
        &operator,
        "GET",
        "/v1/effects",
        "/v1/effects?status=DONE",
        None,
        422,
    )
    .await;
    spec.call(&agent, "GET", "/v1/effects", "/v1/effects", None, 200)
        .await;
    spec.call(&operator, "GET", "/v1/runs", "/v1/runs?limit=5", None, 200)
        .await;
    spec.call(&operator, "GET", "/v1/runs", "/v1/runs?limit=0", None, 422)
        .await;
    spec.call(
        &agent,
        "GET",
        "/v1/runs/{run_id}/effects",
        &format!("/v1/runs/{run}/effects?status=SCHEDULED"),
        None,
        200,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        "/v1/runs/{run_id}/effects",
        &format!("/v1/runs/{run}/effects?colour=red"),
        None,
        422,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        "/v1/runs/{run_id}/scheduled",
        &format!("/v1/runs/{run}/scheduled?tool=tickets/create"),
        None,
        200,
    )
    .await;
    spec.call(&agent, "GET", ONE, &key_path("d-1/email/send/0"), None, 200)
        .await;
    spec.call(
        &agent,
        "GET",
        ONE,
        &format!("{}?wait=1s", key_path("d-1/email/send/0")),
        None,
        200,
    )
    .await;
    spec.call(&agent, "GET", ONE, &key_path("d-9/email/send/0"), None, 404)
        .await;
    spec.call(
        &agent,
        "GET",
        ONE,
        &format!("/v1/runs/{run}/effects/nonsense"),
        None,
        422,
    )
    .await;

    // Removing a scheduled effect, then again.
    spec.call(
        &agent,
        "DELETE",
        ONE,
        &key_path("d-2/tickets/create/0"),
        None,
        200,
    )
    .await;
    spec.call(
        &agent,
        "DELETE",
        ONE,
        &key_path("d-2/tickets/create/0"),
        None,
        409,
    )
    .await;

    // Command actions.
    const APPROVE: &str = "/v1/runs/{run_id}/effects/{command_key}:approve";
    const REJECT: &str = "/v1/runs/{run_id}/effects/{command_key}:reject";
    const CANCEL: &str = "/v1/runs/{run_id}/effects/{command_key}:cancel";
    const REPLAY: &str = "/v1/runs/{run_id}/effects/{command_key}:replay";
    const RESOLVE: &str = "/v1/runs/{run_id}/effects/{command_key}:resolve";
    let act = |key: &str, action: &str| format!("{}:{action}", key_path(key));
    let wire = "d-4/payments/wire/0";
    const LINK: &str = "/v1/runs/{run_id}/effects/{command_key}:approval-link";
    const LINK_PAGE: &str = "/approve/{token}";
    spec.call(
        &operator,
        "POST",
        LINK,
        &act(wire, "approval-link"),
        Some(json!({})),
        403,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        LINK,
        &act(wire, "approval-link"),
        Some(json!({"expires_in_s": 1})),
        422,
    )
    .await;
    let issued = spec
        .call(
            &admin,
            "POST",
            LINK,
            &act(wire, "approval-link"),
            Some(json!({"expires_in_s": 3600, "for": "oncall@example.com"})),
            201,
        )
        .await;
    let url = issued.body["url"].as_str().expect("a url");
    let page = &url[url.find("/approve/").expect("an /approve/ path")..];
    spec.call(&nobody, "GET", LINK_PAGE, page, None, 200).await;
    spec.call(
        &nobody,
        "POST",
        LINK_PAGE,
        page,
        Some(json!({"decision": "maybe", "reason": "x"})),
        422,
    )
    .await;
    for (path, expect) in [
        ("/approve/assets/approve.js", 200),
        ("/approve/assets/nothing.js", 404),
    ] {
        spec.call(&nobody, "GET", "/approve/assets/{name}", path, None, expect)
            .await;
    }
    spec.call(
        &admin,
        "POST",
        APPROVE,
        &act(wire, "approve"),
        Some(json!({"reason": ""})),
        422,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        APPROVE,
        &act(wire, "approve"),
        Some(json!({"reason": "checked"})),
        200,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        APPROVE,
        &act(wire, "approve"),
        Some(json!({"reason": "again"})),
        409,
    )
    .await;
    // Approved another way: the link decides nothing now, and no new one is given.
    spec.call(&nobody, "GET", LINK_PAGE, page, None, 410).await;
    spec.call(
        &nobody,
        "POST",
        LINK_PAGE,
        page,
        Some(json!({"decision": "approve", "reason": "late"})),
        410,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        LINK,
        &act(wire, "approval-link"),
        Some(json!({})),
        409,
    )
    .await;
    spec.call(
        &operator,
        "POST",
        APPROVE,
        &act(wire, "approve"),
        Some(json!({"reason": "x"})),
        403,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        REJECT,
        &act("d-5/payments/wire/0", "reject"),
        Some(json!({"reason": "no"})),
        200,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        CANCEL,
        &act("d-3/tickets/create/0", "cancel"),
        Some(json!({"reason": "not needed"})),
        200,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        CANCEL,
        &act("d-1/email/send/0", "cancel"),
        Some(json!({"reason": "too late"})),
        409,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        CANCEL,
        &act("d-8/email/send/0", "cancel"),
        Some(json!({"reason": "none"})),
        404,
    )
    .await;

    let failed = agent.wait_settled(run, wire).await;
    assert_eq!(failed.status().as_str(), "FAILED", "{failed:?}");
    h.upstream.set_faults(Faults::none()).expect("valid faults");
    spec.call(
        &admin,
        "POST",
        REPLAY,
        &act(wire, "replay"),
        Some(json!({"reason": "bank fixed", "dry_run": true})),
        200,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        REPLAY,
        &act(wire, "replay"),
        Some(json!({"reason": "bank fixed"})),
        200,
    )
    .await;
    assert_eq!(
        agent.wait_settled(run, wire).await.status().as_str(),
        "CONFIRMED"
    );
    spec.call(
        &admin,
        "POST",
        REPLAY,
        &act(wire, "replay"),
        Some(json!({"reason": "again"})),
        409,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        REPLAY,
        &act(wire, "replay"),
        Some(json!({"dry_run": true})),
        422,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        RESOLVE,
        &act(wire, "resolve"),
        Some(json!({"outcome": "FAILED", "evidence": "ticket 1", "reason": "not stuck"})),
        409,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        RESOLVE,
        &act(wire, "resolve"),
        Some(json!({"outcome": "MAYBE", "evidence": "e", "reason": "r"})),
        422,
    )
    .await;

    // Audit, with a tampered run beside it.
    spec.call(
        &agent,
        "GET",
        "/v1/runs/{run_id}/audit",
        &format!("/v1/runs/{run}/audit"),
        None,
        200,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        "/v1/runs/{run_id}/audit/verify",
        &format!("/v1/runs/{run}/audit/verify"),
        None,
        200,
    )
    .await;
    spec.call(
        &operator,
        "GET",
        "/v1/runs/{run_id}/audit",
        "/v1/runs/r-never/audit",
        None,
        404,
    )
    .await;
    let tampered = "r-openapi-tampered";
    agent
        .submit_created(&effect(tampered, 1, "email/send", 0, email_args("t")))
        .await;
    agent.wait_settled(tampered, "d-1/email/send/0").await;
    let db = rusqlite::Connection::open(
        sluice_ledger::sqlite::SqliteConfig::in_dir(h.data.path()).path(),
    )
    .expect("the ledger file opens");
    db.busy_timeout(std::time::Duration::from_secs(5))
        .expect("busy timeout");
    let changed = db
        .execute(
            "UPDATE audit SET hash = ?1 WHERE seq = 0 AND run_seq = (SELECT run_seq FROM runs WHERE run_id = ?2)",
            rusqlite::params!["0".repeat(64), tampered],
        )
        .expect("the update applies");
    assert_eq!(changed, 1);
    let broken = spec
        .call(
            &operator,
            "GET",
            "/v1/runs/{run_id}/audit/verify",
            &format!("/v1/runs/{tampered}/audit/verify"),
            None,
            200,
        )
        .await;
    assert_eq!(broken.body["valid"], json!(false), "{}", broken.text);
    assert_eq!(broken.body["broken"]["seq"], json!(0));

    // Rollback, then purge.
    spec.call(
        &admin,
        "POST",
        "/v1/runs/{run_id}/rollback",
        &format!("/v1/runs/{run}/rollback"),
        Some(json!({"reason": "undo"})),
        202,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        "/v1/runs/{run_id}/rollback",
        "/v1/runs/r-none/rollback",
        Some(json!({"reason": "undo"})),
        404,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        "/v1/runs/{run_id}/rollback",
        &format!("/v1/runs/{run}/rollback"),
        Some(json!({"why": "undo"})),
        422,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        "/v1/runs/{run_id}/rollback",
        &format!("/v1/runs/{run}/rollback"),
        None,
        200,
    )
    .await;
    // The listing marks the rolled-back run.
    let runs = spec
        .call(&operator, "GET", "/v1/runs", "/v1/runs", None, 200)
        .await;
    let listed = runs.body["runs"].as_array().expect("runs").iter();
    let rolled_back: Vec<&Value> = listed.filter(|r| r["run_id"] == run).collect();
    assert!(
        rolled_back.len() == 1 && rolled_back[0]["rolled_back_at"].is_string(),
        "{}",
        runs.text
    );
    // The overview: an operator's, not an agent's.
    const OVERVIEW: &str = "/v1/overview";
    let overview = spec
        .call(&operator, "GET", OVERVIEW, OVERVIEW, None, 200)
        .await;
    assert!(
        overview.body["minutes"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{}",
        overview.text
    );
    spec.call(&agent, "GET", OVERVIEW, OVERVIEW, None, 403)
        .await;
    // Evidence by webhook: signed by its source, never a token; this catalog declares none.
    spec.call(
        &nobody,
        "POST",
        "/v1/evidence/{source}",
        "/v1/evidence/stripe",
        Some(json!({"id": "evt_1", "type": "charge.succeeded"})),
        404,
    )
    .await;
    // An asynchronous tool's callback: its token is the credential, never a bearer token.
    spec.call(
        &nobody,
        "POST",
        "/v1/callbacks/{token}",
        "/v1/callbacks/eyJyIjoiciJ9.AAAA",
        Some(json!({"status": "succeeded"})),
        401,
    )
    .await;
    const EVIDENCE: &str = "/v1/evidence";
    spec.call(
        &nobody,
        "GET",
        EVIDENCE,
        "/v1/evidence?source=stripe",
        None,
        401,
    )
    .await;
    spec.call(
        &agent,
        "GET",
        EVIDENCE,
        "/v1/evidence?source=stripe",
        None,
        403,
    )
    .await;
    spec.call(
        &admin,
        "GET",
        EVIDENCE,
        "/v1/evidence?source=stripe",
        None,
        404,
    )
    .await;
    // Spend budgets: an operator's (the counters name tenants), not an agent's.
    const BUDGETS: &str = "/v1/budgets";
    let budgets = spec
        .call(&operator, "GET", BUDGETS, BUDGETS, None, 200)
        .await;
    assert_eq!(
        budgets.body["budgets"][0]["name"],
        json!("all_wires"),
        "{}",
        budgets.text
    );
    spec.call(
        &operator,
        "GET",
        BUDGETS,
        "/v1/budgets?at=2026-12-07T10:00:00Z",
        None,
        200,
    )
    .await;
    spec.call(
        &operator,
        "GET",
        BUDGETS,
        "/v1/budgets?at=yesterday",
        None,
        422,
    )
    .await;
    spec.call(&agent, "GET", BUDGETS, BUDGETS, None, 403).await;
    // Flow control: the listing is an operator's, a pause and a resume an admin's.
    const FLOW: &str = "/v1/flow";
    const PAUSE: &str = "/v1/flow/{name}:pause";
    const RESUME: &str = "/v1/flow/{name}:resume";
    let listed = spec.call(&operator, "GET", FLOW, FLOW, None, 200).await;
    assert!(listed.text.contains("payments/wire"), "{}", listed.text);
    spec.call(&agent, "GET", FLOW, FLOW, None, 403).await;
    let reason = Some(json!({"reason": "the bank's maintenance window"}));
    let wire = "/v1/flow/payments%2Fwire";
    spec.call(
        &operator,
        "POST",
        PAUSE,
        &format!("{wire}:pause"),
        reason.clone(),
        403,
    )
    .await;
    let paused = spec
        .call(
            &admin,
            "POST",
            PAUSE,
            &format!("{wire}:pause"),
            reason.clone(),
            200,
        )
        .await;
    assert_eq!(paused.body["outcome"], json!("paused"), "{}", paused.text);
    spec.call(
        &admin,
        "POST",
        PAUSE,
        "/v1/flow/nope:pause",
        reason.clone(),
        404,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        PAUSE,
        &format!("{wire}:pause"),
        Some(json!({"reason": " "})),
        422,
    )
    .await;
    let resumed = spec
        .call(
            &admin,
            "POST",
            RESUME,
            &format!("{wire}:resume"),
            reason.clone(),
            200,
        )
        .await;
    assert_eq!(
        resumed.body["outcome"],
        json!("resumed"),
        "{}",
        resumed.text
    );
    let again = spec
        .call(
            &admin,
            "POST",
            RESUME,
            &format!("{wire}:resume"),
            reason,
            200,
        )
        .await;
    assert_eq!(again.body["outcome"], json!("not_paused"), "{}", again.text);
    spec.call(&nobody, "GET", OVERVIEW, OVERVIEW, None, 401)
        .await;
    spec.call(
        &admin,
        "POST",
        "/v1/audit/purge",
        "/v1/audit/purge",
        Some(json!({"older_than": "2000-01-01T00:00:00Z", "reason": "retention"})),
        200,
    )
    .await;
    spec.call(
        &admin,
        "POST",
        "/v1/audit/purge",
        "/v1/audit/purge",
        Some(json!({"older_than": "yesterday", "reason": "retention"})),
        422,
    )
    .await;
    spec.call(
        &operator,
        "GET",
        "/v1/runs/{run_id}/audit",
        "/v1/runs/sluice.system/audit",
        None,
        200,
    )
    .await;

    // The event stream's refusals (a stream that opens never ends: tests/tests/console.rs
    // reads those).
    const STREAM: &str = "/v1/events/stream";
    spec.call(&nobody, "GET", STREAM, STREAM, None, 401).await;
    spec.call(
        &agent,
        "GET",
        STREAM,
        "/v1/events/stream?run_id=r-none",
        None,
        403,
    )
    .await;
    spec.call(
        &operator,
        "GET",
        STREAM,
        "/v1/events/stream?run_id=no%20such",
        None,
        422,
    )
    .await;
    for (template, path, expect) in [
        ("/ui", "/ui", 200),
        ("/ui/", "/ui/", 200),
        ("/ui/{path}", "/ui/js/main.js", 200),
        ("/ui/{path}", "/ui/js/nothing.js", 404),
    ] {
        spec.call(&nobody, "GET", template, path, None, expect)
            .await;
    }

    for path in ["/healthz", "/readyz", "/metrics"] {
        spec.call(&nobody, "GET", path, path, None, 200).await;
    }

    let missed: Vec<_> = served.difference(&spec.called).collect();
    assert!(missed.is_empty(), "routes never called: {missed:?}");
    assert!(spec.checked >= 50, "{} answers checked", spec.checked);
    h.stop().await;
}
