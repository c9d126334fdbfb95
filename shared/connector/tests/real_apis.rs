//! The HTTP connector calling APIs written for other clients, against a real HTTP upstream on
//! 127.0.0.1 that records each request as it arrived: credentials (bearer, basic, a header, AWS
//! SigV4, Standard Webhooks) read from the environment and from files that rotate, request
//! shapes (form bodies, nested templates, query parameters, a DELETE with a body), lookups
//! that answer lists, and what no answer may be read as. Secrets never reach evidence, errors or
//! the dry run.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};
use sluice_connector::credentials::{decode_webhook_key, webhook_signature};
use sluice_connector::preview;
use sluice_connector::{CompensationTarget, Connector, HttpConnector};
use sluice_core::catalog::{Catalog, Tool};
use sluice_core::command::{Command, Intent, Observation};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};
use sluice_core::time::Timestamp;
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

type Answer = (u16, String);
/// What the upstream shares with its handler: the requests seen and the answers left.
type Shared = (Arc<Mutex<Vec<Seen>>>, Arc<Mutex<Vec<Answer>>>);

/// An upstream that records every request and answers from a script (the last answer repeats).
struct Upstream {
    base: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    answers: Arc<Mutex<Vec<Answer>>>,
}

impl Upstream {
    async fn start(answers: Vec<Answer>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(answers));
        let state = (Arc::clone(&seen), Arc::clone(&script));
        let app = Router::new().fallback(record).with_state(state);
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free loopback port");
        let base = format!("http://{}", listener.local_addr().expect("bound"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            base,
            seen,
            answers: script,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("not poisoned").clone()
    }

    fn answer(&self, answers: Vec<Answer>) {
        *self.answers.lock().expect("not poisoned") = answers;
    }
}

async fn record(State((seen, script)): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = to_bytes(body, usize::MAX).await.expect("the body arrives");
    seen.lock().expect("not poisoned").push(Seen {
        method: parts.method.to_string(),
        target: parts
            .uri
            .path_and_query()
            .map_or_else(String::new, ToString::to_string),
        headers: parts.headers,
        body: body.to_vec(),
    });
    let (status, text) = {
        let mut script = script.lock().expect("not poisoned");
        if script.len() > 1 {
            script.remove(0)
        } else {
            script.first().cloned().unwrap_or((200, "{}".into()))
        }
    };
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(text))
        .expect("a valid response")
}

/// Secrets in files of a temporary directory (the tests may not change the environment: the
/// workspace forbids `unsafe`, which `set_var` needs).
struct Secret {
    _dir: tempfile::TempDir,
    paths: Vec<String>,
}

impl Secret {
    fn files(values: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let paths = values
            .iter()
            .enumerate()
            .map(|(index, value)| {
                let path = dir.path().join(format!("secret-{index}"));
                std::fs::write(&path, format!("{value}\n")).expect("written");
                path.display().to_string()
            })
            .collect();
        Self { _dir: dir, paths }
    }

    /// `text` with SECRET_FILE (then SECRET_FILE_2, …) naming the files.
    fn fill(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for (index, path) in self.paths.iter().enumerate().rev() {
            let name = if index == 0 {
                "SECRET_FILE".to_owned()
            } else {
                format!("SECRET_FILE_{}", index + 1)
            };
            text = text.replace(&name, path);
        }
        text
    }
}

fn tool(text: &str, base: &str) -> Tool {
    let catalog = Catalog::from_toml_str(&text.replace("BASE", base), "api.toml")
        .expect("the test catalog is valid");
    catalog.tools()[0].clone()
}

fn command(tool: &Tool, args: Value) -> Command {
    tool.validate_args(&args).expect("the arguments fit");
    let intent = Intent {
        run_id: RunId::parse("r-abc").expect("valid"),
        command_key: CommandKey::new(1, tool.name().clone(), 0),
        semantics: tool.semantics(),
        business_key: tool.business_key(&args).expect("renders"),
        args,
        policy_version: "1".into(),
        max_attempts: 3,
        not_before: None,
    };
    Command::from_intent(intent, Timestamp::from_millis(1_700_000_000_000), 10_000)
}

fn connector() -> HttpConnector {
    HttpConnector::new().expect("the HTTP client builds")
}

/// A Stripe-shaped charge: bearer token from a variable this test alone sets, a form body with
/// nested metadata, a version header, a search lookup that reads a list, a form refund.
const CHARGE: &str = r#"
[credentials.stripe]
kind = "bearer"
token = { file = "SECRET_FILE" }

[[tool]]
name = "payments/charge"
semantics = "NON_IDEMPOTENT"
credential = "stripe"
schema = { type = "object", required = ["amount", "order"], properties = { amount = { type = "integer" }, order = { type = "object", required = ["id"], properties = { id = { type = "string" } } } } }
[tool.dispatch]
url = "BASE/v1/charges"
content_type = "form"
body = { amount = "{args.amount}", currency = "usd", metadata = { order_id = "{args.order.id}", sluice_key = "{idempotency_key}" } }
headers = { "Stripe-Version" = "2024-06-20" }
[tool.status_check]
url = "BASE/v1/charges/search"
query = { query = "metadata['sluice_key']:'{idempotency_key}'", limit = "10" }
matches = "/data"
[tool.compensate]
url = "BASE/v1/refunds"
content_type = "form"
body = { charge = "{external_ref}" }
"#;

const SECRET_A: &str = "sk_test_51AAAAaaaaBBBBbbbbCCCC";

#[tokio::test]
async fn a_charge_goes_out_as_a_form_with_its_bearer_token_and_declared_headers() {
    let secrets = Secret::files(&[SECRET_A]);
    let upstream =
        Upstream::start(vec![(200, r#"{"id": "ch_1", "object": "charge"}"#.into())]).await;
    let tool = tool(&secrets.fill(CHARGE), &upstream.base);
    let command = command(&tool, json!({"amount": 1999, "order": {"id": "o-7"}}));

    let outcome = connector().dispatch(&tool, &command).await;

    assert!(
        matches!(&outcome, DispatchOutcome::Committed { external_ref: Some(r), .. } if r == "ch_1"),
        "{outcome:?}"
    );
    let seen = upstream.seen();
    let call = &seen[0];
    assert_eq!(call.method, "POST");
    assert_eq!(call.target, "/v1/charges");
    assert_eq!(
        call.header("authorization").as_deref(),
        Some(&*format!("Bearer {SECRET_A}"))
    );
    assert_eq!(call.header("stripe-version").as_deref(), Some("2024-06-20"));
    assert_eq!(
        call.header("content-type").as_deref(),
        Some("application/x-www-form-urlencoded")
    );
    assert_eq!(
        call.header("idempotency-key").as_deref(),
        Some("r-abc/d-1/payments/charge/0")
    );
    let form: Vec<(String, String)> = form_urlencoded::parse(&call.body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    assert_eq!(
        form,
        [
            ("amount".to_owned(), "1999".to_owned()),
            ("currency".to_owned(), "usd".to_owned()),
            ("metadata[order_id]".to_owned(), "o-7".to_owned()),
            (
                "metadata[sluice_key]".to_owned(),
                "r-abc/d-1/payments/charge/0".to_owned()
            ),
        ]
    );
}

#[tokio::test]
async fn a_list_lookup_reads_zero_one_or_more_matches_and_nothing_else() {
    let secrets = Secret::files(&[SECRET_A]);
    let upstream = Upstream::start(vec![(200, r#"{"data": []}"#.into())]).await;
    let tool = tool(&secrets.fill(CHARGE), &upstream.base);
    let command = command(&tool, json!({"amount": 5, "order": {"id": "o"}}));
    let connector = connector();

    let absent = connector.status_check(&tool, &command).await;
    assert_eq!(absent.observation, Observation::Absent, "{absent:?}");
    let seen = upstream.seen();
    assert_eq!(
        seen[0].target,
        "/v1/charges/search?limit=10&query=metadata%5B%27sluice_key%27%5D%3A%27r-abc%2Fd-1%2Fpayments%2Fcharge%2F0%27"
    );

    upstream.answer(vec![(200, r#"{"data": [{"id": "ch_9"}]}"#.into())]);
    let present = connector.status_check(&tool, &command).await;
    assert_eq!(present.observation, Observation::Present);
    assert_eq!(present.external_ref.as_deref(), Some("ch_9"));

    upstream.answer(vec![(
        200,
        r#"{"data": [{"id": "ch_9"}, {"id": "ch_10"}]}"#.into(),
    )]);
    let duplicate = connector.status_check(&tool, &command).await;
    assert_eq!(duplicate.observation, Observation::Duplicate);
    assert_eq!(duplicate.external_ref.as_deref(), Some("ch_9"));
    assert_eq!(duplicate.extra_commits(), ["ch_10"]);

    // What the tool does not declare proves nothing: a missing route's 404, a refused key, a
    // 2xx of another shape, a server error.
    for (status, body) in [
        (404, "404: Not Found"),
        (401, r#"{"error": {"message": "Unauthorized"}}"#),
        (200, r#"{"object": "charge", "id": "ch_9"}"#),
        (200, "not json"),
        (503, ""),
    ] {
        upstream.answer(vec![(status, body.into())]);
        let report = connector.status_check(&tool, &command).await;
        assert_eq!(
            report.observation,
            Observation::Inconclusive,
            "HTTP {status} {body}: {report:?}"
        );
        assert!(
            !report.evidence.to_string().contains(SECRET_A),
            "the token is in the evidence"
        );
    }
}

/// json-server answers every record when the query names a field no record has: `match_where`
/// keeps only the items that really carry the key.
#[tokio::test]
async fn match_where_keeps_only_the_items_that_carry_the_key() {
    let text = r#"
[[tool]]
name = "records/create"
semantics = "NON_IDEMPOTENT"
schema = { type = "object", required = ["title"], properties = { title = { type = "string" } } }
[tool.dispatch]
url = "BASE/records"
body = { title = "{args.title}", sluice_key = "{idempotency_key}" }
[tool.status_check]
url = "BASE/records"
query = { sluice_key = "{idempotency_key}" }
matches = ""
match_where = { "/sluice_key" = "{idempotency_key}" }
[tool.compensate]
url = "BASE/records/{external_ref}"
method = "DELETE"
done_status = [404]
"#;
    let upstream = Upstream::start(vec![(
        200,
        r#"[{"id": 1, "title": "mine? no"}, {"id": 2, "title": "other", "sluice_key": "r-x/d-1/records/create/0"}]"#
            .into(),
    )])
    .await;
    let tool = tool(text, &upstream.base);
    let command = command(&tool, json!({"title": "t"}));
    let connector = connector();
    let report = connector.status_check(&tool, &command).await;
    assert_eq!(report.observation, Observation::Absent, "{report:?}");
    assert_eq!(report.evidence["listed"], json!(2));

    upstream.answer(vec![(
        200,
        r#"[{"id": 1}, {"id": 7, "sluice_key": "r-abc/d-1/records/create/0"}]"#.into(),
    )]);
    let report = connector.status_check(&tool, &command).await;
    assert_eq!(report.observation, Observation::Present);
    assert_eq!(report.external_ref.as_deref(), Some("7"));

    // A DELETE retried after it had already run answers 404: declared as already undone.
    upstream.answer(vec![(404, "{}".into())]);
    let mut committed = command.clone();
    committed.state.external_ref = Some("7".into());
    let outcome = connector
        .compensate(&tool, &committed, CompensationTarget::OwnCommit)
        .await;
    assert_eq!(outcome, CompensationOutcome::Done { reference: None });
    assert_eq!(
        upstream.seen().last().map(|s| s.target.clone()).as_deref(),
        Some("/records/7")
    );
}

#[tokio::test]
async fn a_commit_without_the_reference_a_compensation_needs_is_looked_up_not_confirmed() {
    let secrets = Secret::files(&[SECRET_A]);
    let upstream = Upstream::start(vec![(200, r#"{"object": "charge"}"#.into())]).await;
    let tool = tool(&secrets.fill(CHARGE), &upstream.base);
    let command = command(&tool, json!({"amount": 5, "order": {"id": "o"}}));
    let outcome = connector().dispatch(&tool, &command).await;
    let DispatchOutcome::Ambiguous { reason } = outcome else {
        panic!("expected ambiguous, got {outcome:?}");
    };
    assert!(
        reason.contains("names no reference and the tool requires one"),
        "{reason}"
    );
}

#[tokio::test]
async fn an_unset_secret_sends_nothing_and_says_which_reference() {
    let text = CHARGE.replace(
        "{ file = \"SECRET_FILE\" }",
        "{ env = \"SLUICE_TEST_NEVER_SET\" }",
    );
    let upstream = Upstream::start(vec![(200, r#"{"id": "ch_1"}"#.into())]).await;
    let tool = tool(&text, &upstream.base);
    let command = command(&tool, json!({"amount": 5, "order": {"id": "o"}}));
    let outcome = connector().dispatch(&tool, &command).await;
    let DispatchOutcome::NotSent { reason } = outcome else {
        panic!("expected not sent, got {outcome:?}");
    };
    assert!(
        reason.contains("credential stripe: env SLUICE_TEST_NEVER_SET is not set"),
        "{reason}"
    );
    assert!(upstream.seen().is_empty(), "nothing may reach the upstream");
}

/// Mail: basic auth from a file that is rotated while Sluice runs, a JSON body with a
/// Message-ID made from the key, and a DELETE whose body names the one message to remove.
#[tokio::test]
async fn a_rotated_password_file_is_read_again_and_a_delete_carries_its_body() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let password = dir.path().join("mail-password");
    std::fs::write(&password, "first-password\n").expect("written");
    let text = format!(
        r#"
[credentials.mail]
kind = "basic"
username = "sluice"
password = {{ file = "{}" }}

[[tool]]
name = "email/send"
semantics = "NON_IDEMPOTENT"
credential = "mail"
schema = {{ type = "object", required = ["to"], properties = {{ to = {{ type = "string" }} }} }}
[tool.dispatch]
url = "BASE/api/v1/send"
reference_pointer = "/ID"
body = {{ To = [{{ Email = "{{args.to}}" }}], Subject = "hi", Headers = {{ "Message-ID" = "<sluice.{{idempotency_key}}@sluice.test>" }} }}
[tool.status_check]
url = "BASE/api/v1/search"
query = {{ query = "message-id:<sluice.{{idempotency_key}}@sluice.test>" }}
matches = "/messages"
match_reference_pointer = "/ID"
[tool.compensate]
url = "BASE/api/v1/messages"
method = "DELETE"
body = {{ IDs = ["{{external_ref}}"] }}
"#,
        password.display()
    );
    let upstream = Upstream::start(vec![(200, r#"{"ID": "m-1"}"#.into())]).await;
    let tool = tool(&text, &upstream.base);
    let command = command(&tool, json!({"to": "a@example.com"}));
    let connector = connector();
    connector.dispatch(&tool, &command).await;
    std::fs::write(&password, "second-and-longer-password\n").expect("rotated");
    upstream.answer(vec![(200, "\"ok\"".into())]);
    let mut committed = command.clone();
    committed.state.external_ref = Some("m-1".into());
    let outcome = connector
        .compensate(&tool, &committed, CompensationTarget::OwnCommit)
        .await;
    assert!(
        matches!(outcome, CompensationOutcome::Done { .. }),
        "{outcome:?}"
    );

    let seen = upstream.seen();
    let basic = |secret: &str| {
        use base64::Engine;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("sluice:{secret}"))
        )
    };
    assert_eq!(
        seen[0].header("authorization"),
        Some(basic("first-password"))
    );
    let sent: Value = serde_json::from_slice(&seen[0].body).expect("JSON");
    assert_eq!(
        sent["Headers"]["Message-ID"],
        json!("<sluice.r-abc/d-1/email/send/0@sluice.test>")
    );
    assert_eq!(sent["To"], json!([{"Email": "a@example.com"}]));
    assert_eq!(seen[1].method, "DELETE");
    assert_eq!(
        seen[1].header("authorization"),
        Some(basic("second-and-longer-password"))
    );
    assert_eq!(seen[1].text(), r#"{"IDs":["m-1"]}"#);
}

const SIGNED: &str = r#"
[credentials.tool_services]
kind = "standard_webhooks"
keys = [{ file = "SECRET_FILE" }]

[[tool]]
name = "tickets/create"
semantics = "IDEMPOTENT"
credential = "tool_services"
schema = { type = "object", required = ["title"], properties = { title = { type = "string" } } }
[tool.dispatch]
url = "BASE/tickets/create"
[tool.status_check]
url = "BASE/tickets/create/by-idempotency-key/{idempotency_key}"
absent_status = [404]
"#;

#[tokio::test]
async fn every_call_to_a_tool_service_is_signed_with_every_key_of_a_rotation() {
    let keys =
        "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8= whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let secrets = Secret::files(&[keys]);
    let upstream = Upstream::start(vec![(201, r#"{"id": "t-1"}"#.into())]).await;
    let tool = tool(&secrets.fill(SIGNED), &upstream.base);
    let command = command(&tool, json!({"title": "printer"}));
    let connector = connector();
    connector.dispatch(&tool, &command).await;
    upstream.answer(vec![(404, "{}".into())]);
    connector.status_check(&tool, &command).await;

    let decoded: Vec<Vec<u8>> = keys
        .split_whitespace()
        .map(|key| decode_webhook_key(key).expect("a valid key"))
        .collect();
    let seen = upstream.seen();
    let mut ids = Vec::new();
    for call in &seen {
        let id = call.header("webhook-id").expect("an id");
        let timestamp: u64 = call
            .header("webhook-timestamp")
            .expect("a timestamp")
            .parse()
            .expect("seconds");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        assert!(now.abs_diff(timestamp) < 60, "{timestamp} is not now");
        // Recomputed here from the bytes that arrived: both keys sign, in order.
        assert_eq!(
            call.header("webhook-signature"),
            Some(webhook_signature(&decoded, &id, timestamp, &call.body)),
            "{} {}",
            call.method,
            call.target
        );
        ids.push(id);
    }
    assert_eq!(seen.len(), 2);
    assert_ne!(ids[0], ids[1], "every request has an id of its own");
}

#[test]
fn the_signer_agrees_with_the_shared_vectors() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../sdk/test-vectors/standard-webhooks.json"
    ))
    .expect("the shared vectors");
    let vectors: Value = serde_json::from_str(&text).expect("JSON");
    let cases = vectors["signatures"].as_array().expect("signature cases");
    assert!(cases.len() >= 3);
    for case in cases {
        let keys: Vec<Vec<u8>> = case["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|key| decode_webhook_key(key.as_str().expect("text")).expect("valid"))
            .collect();
        let signature = webhook_signature(
            &keys,
            case["webhook_id"].as_str().expect("id"),
            case["webhook_timestamp"].as_u64().expect("seconds"),
            case["body"].as_str().expect("body").as_bytes(),
        );
        assert_eq!(
            signature,
            case["webhook_signature"].as_str().expect("expected"),
            "{}",
            case["name"]
        );
    }
    for case in vectors["invalid_keys"].as_array().expect("invalid keys") {
        let key = case["key"].as_str().expect("text");
        let error = decode_webhook_key(key).expect_err(case["why"].as_str().unwrap_or("invalid"));
        assert!(
            key.len() < 8 || !error.contains(&key[6..]),
            "the key is echoed: {error}"
        );
    }
}

#[tokio::test]
async fn an_aws_call_is_signed_with_sigv4_over_its_headers_and_body() {
    let secrets = Secret::files(&["wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "AKIDEXAMPLE"]);
    let text = r#"
[credentials.aws]
kind = "aws_sigv4"
service = "sqs"
region = "eu-west-1"
access_key_id = { file = "SECRET_FILE_2" }
secret_access_key = { file = "SECRET_FILE" }

[[tool]]
name = "queue/send"
semantics = "IDEMPOTENT"
credential = "aws"
schema = { type = "object", required = ["body"], properties = { body = { type = "string" } } }
[tool.dispatch]
url = "BASE/"
reference_pointer = "/MessageId"
idempotency_header = ""
headers = { "Content-Type" = "application/x-amz-json-1.0", "X-Amz-Target" = "AmazonSQS.SendMessage" }
body = { QueueUrl = "BASE/123456789012/jobs.fifo", MessageBody = "{args.body}", MessageGroupId = "{run_id}", MessageDeduplicationId = "{command_key}" }
"#;
    let upstream = Upstream::start(vec![(200, r#"{"MessageId": "m-1"}"#.into())]).await;
    let tool = tool(&secrets.fill(text), &upstream.base);
    let command = command(&tool, json!({"body": "hello"}));
    let outcome = connector().dispatch(&tool, &command).await;
    assert!(
        matches!(outcome, DispatchOutcome::Committed { .. }),
        "{outcome:?}"
    );
    let call = &upstream.seen()[0];
    let authorization = call.header("authorization").expect("signed");
    assert!(
        authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
            && authorization.contains("/eu-west-1/sqs/aws4_request"),
        "{authorization}"
    );
    let signed = authorization
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("signed headers");
    for header in ["host", "x-amz-date", "x-amz-target", "x-amz-content-sha256"] {
        assert!(
            signed.split(';').any(|h| h == header),
            "{header} not in {signed}"
        );
    }
    assert!(
        call.header("idempotency-key").is_none(),
        "idempotency_header = \"\" sends none"
    );
    // The JSON protocol's media type replaces application/json, once, and is signed.
    let types: Vec<_> = call.headers.get_all("content-type").iter().collect();
    assert_eq!(types, ["application/x-amz-json-1.0"], "{types:?}");
    assert!(
        signed.split(';').any(|h| h == "content-type"),
        "content-type not in {signed}"
    );
    let sent: Value = serde_json::from_slice(&call.body).expect("a JSON body");
    assert_eq!(sent["MessageBody"], json!("hello"));
    let sha = call.header("x-amz-content-sha256").expect("payload hash");
    use sha2::Digest;
    assert_eq!(sha, hex_of(&sha2::Sha256::digest(&call.body)));
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_dry_run_shows_each_request_with_its_secrets_masked() {
    let secrets = Secret::files(&[SECRET_A]);
    let tool = tool(&secrets.fill(CHARGE), "https://api.stripe.test");
    let command = command(&tool, json!({"amount": 1999, "order": {"id": "o-7"}}));
    let requests = preview::requests(&tool, &command, Some("ch_1"));
    assert_eq!(requests.len(), 3);
    let shown: Vec<String> = requests
        .iter()
        .map(|(_, request)| request.as_ref().expect("renders").to_http())
        .collect();
    assert!(
        shown[0].starts_with("POST https://api.stripe.test/v1/charges\n"),
        "{}",
        shown[0]
    );
    assert!(
        shown[0].contains(&format!(
            "authorization: Bearer <secret: file {}>",
            secrets.paths[0]
        )),
        "{}",
        shown[0]
    );
    assert!(
        shown[0].contains("amount=1999&currency=usd&metadata%5Border_id%5D=o-7"),
        "{}",
        shown[0]
    );
    assert!(shown[2].contains("charge=ch_1"), "{}", shown[2]);
    for text in &shown {
        assert!(!text.contains(SECRET_A), "a secret is shown: {text}");
    }
}

/// A header credential read from the environment: `HOME`, which every test process has (the
/// tests cannot set a variable of their own).
#[tokio::test]
async fn a_header_credential_reads_its_variable_at_the_call() {
    let home = std::env::var("HOME").expect("HOME is set for tests");
    let text = SIGNED.replace(
        "kind = \"standard_webhooks\"\nkeys = [{ file = \"SECRET_FILE\" }]",
        "kind = \"header\"\nheader = \"X-Api-Key\"\nprefix = \"key \"\nvalue = { env = \"HOME\" }",
    );
    let upstream = Upstream::start(vec![(201, r#"{"id": "t-1"}"#.into())]).await;
    let tool = tool(&text, &upstream.base);
    let command = command(&tool, json!({"title": "printer"}));
    connector().dispatch(&tool, &command).await;
    assert_eq!(
        upstream.seen()[0].header("x-api-key"),
        Some(format!("key {home}"))
    );
}

/// SigV4 computed here by hand (the AWS documentation's four steps) over the request as it
/// arrived, for a service that signs the path as sent (S3).
fn sigv4_by_hand(call: &Seen, secret: &str, region: &str, service: &str) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    use sha2::{Digest, Sha256};

    let hmac = |key: &[u8], data: &str| {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("any key length");
        mac.update(data.as_bytes());
        mac.finalize().into_bytes().to_vec()
    };
    let authorization = call.header("authorization").expect("signed");
    let signed = authorization
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("signed headers");
    let (path, query) = call
        .target
        .split_once('?')
        .unwrap_or((call.target.as_str(), ""));
    let mut canonical = format!("{}\n{path}\n{query}\n", call.method);
    for name in signed.split(';') {
        let value = call.header(name).expect("a signed header is sent");
        canonical += &format!("{name}:{}\n", value.trim());
    }
    canonical += &format!(
        "\n{signed}\n{}",
        call.header("x-amz-content-sha256").expect("payload hash")
    );
    let when = call.header("x-amz-date").expect("x-amz-date");
    let date = &when[..8];
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{when}\n{scope}\n{}",
        hex_of(&Sha256::digest(canonical.as_bytes()))
    );
    let mut key = hmac(format!("AWS4{secret}").as_bytes(), date);
    for part in [region, service, "aws4_request"] {
        key = hmac(&key, part);
    }
    hex_of(&hmac(&key, &to_sign))
}

/// S3 signs the path as sent, encoded once: an object named by Sluice's key holds `%2F`, which
/// the signer must not encode again (moto, like S3, answered SignatureDoesNotMatch before).
#[tokio::test]
async fn an_s3_object_named_by_the_key_is_signed_over_its_path_as_sent() {
    let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    let secrets = Secret::files(&[secret, "AKIDEXAMPLE"]);
    let text = r#"
[credentials.aws_s3]
kind = "aws_sigv4"
service = "s3"
region = "us-east-1"
access_key_id = { file = "SECRET_FILE_2" }
secret_access_key = { file = "SECRET_FILE" }

[[tool]]
name = "reports/put"
semantics = "IDEMPOTENT"
credential = "aws_s3"
schema = { type = "object", required = ["total"], properties = { total = { type = "integer" } } }
[tool.dispatch]
url = "BASE/sluice-reports/reports/{idempotency_key}.json"
method = "PUT"
idempotency_header = ""
reference_header = "ETag"
body = { total = "{args.total}" }
"#;
    let upstream = Upstream::start(vec![(200, String::new())]).await;
    let tool = tool(&secrets.fill(text), &upstream.base);
    let command = command(&tool, json!({"total": 42}));
    connector().dispatch(&tool, &command).await;
    let call = &upstream.seen()[0];
    assert_eq!(
        call.target,
        "/sluice-reports/reports/r-abc%2Fd-1%2Freports%2Fput%2F0.json"
    );
    let authorization = call.header("authorization").expect("signed");
    let signature = authorization
        .rsplit("Signature=")
        .next()
        .expect("a signature");
    assert_eq!(
        signature,
        sigv4_by_hand(call, secret, "us-east-1", "s3"),
        "{authorization}"
    );
}
