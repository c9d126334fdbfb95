//! The submission contract (docs/architecture.md, "HTTP API") over real HTTP: the status codes an
//! agent relies on (201/200/409/404/422/413/400), bare tool names, batches, reads by key and by
//! status, and business-key deduplication — each checked against the ledger and the bank, not just
//! the answer.

use reqwest::StatusCode;
use serde_json::json;
use sluice_core::command::{Command, CommandStatus};
use sluice_tests::*;
use sluice_upstream::Faults;
use std::time::Duration;

/// The producer refuses bodies over this.
const MAX_BODY: usize = 4_096;
/// Most effects in one batch.
const MAX_BATCH: usize = 8;

async fn harness() -> Harness {
    Harness::start_with(
        Faults::none(),
        // Bare names resolve in `payments`, so `wire` is `payments/wire` and `send` is unknown.
        |c| c.top("default_namespace", "payments"),
        |config| {
            config.producer.max_body_bytes = MAX_BODY;
            config.producer.max_batch = MAX_BATCH;
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_is_reserved_once_and_other_arguments_under_it_are_refused() {
    let h = harness().await;
    let run = "r-contract";
    let first = h
        .agent
        .submit_created(&effect(
            run,
            3,
            "payments/wire",
            0,
            wire_args("acc-1", 125_000),
        ))
        .await;

    // The same submission again, and once more with the arguments' keys in another order (sent
    // as raw text, so no JSON library can normalise the order on the way).
    let again = h
        .agent
        .submit(&effect(
            run,
            3,
            "payments/wire",
            0,
            wire_args("acc-1", 125_000),
        ))
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    let reordered = h
        .agent
        .submit_raw(
            br#"{"call_idx": 0, "args": {"reference": "invoice 42", "date": "2026-11-22",
                 "beneficiary": "b-9", "amount_minor": 125000, "account": "acc-1"},
                 "tool": "payments/wire", "decision": 3, "run_id": "r-contract"}"#
                .to_vec(),
        )
        .await;
    assert_eq!(reordered.status, StatusCode::OK, "{}", reordered.text);
    for answer in [&again, &reordered] {
        let command = answer.command();
        assert_eq!(command.command_key, first.command_key);
        assert_eq!(command.idempotency_key, first.idempotency_key);
        assert_eq!(command.args_hash, first.args_hash);
        assert_eq!(
            command.created_at, first.created_at,
            "the stored command, not a new one"
        );
    }

    // Other arguments under the same key: refused, never merged.
    let mut drifted = wire_args("acc-1", 125_000);
    drifted["beneficiary"] = json!("someone-else");
    let conflict = h
        .agent
        .submit(&effect(run, 3, "payments/wire", 0, drifted))
        .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT, "{}", conflict.text);
    assert_eq!(conflict.error_code(), "argument_drift");

    let settled = h.agent.wait_settled(run, "d-3/payments/wire/0").await;
    assert_eq!(settled.status(), CommandStatus::Confirmed);
    assert_eq!(
        settled.args["beneficiary"], "b-9",
        "the first arguments stand"
    );
    let stats = h.upstream.stats();
    assert_eq!(
        stats.wires, 1,
        "three submissions of one key, one wire: {stats:?}"
    );

    // Read by key: percent-encoded and raw paths name the same command; bad keys are told apart.
    let encoded = h
        .agent
        .get_path(run, "d-3%2Fpayments%2Fwire%2F0", None)
        .await;
    let raw = h.agent.get_path(run, "d-3/payments/wire/0", None).await;
    for answer in [&encoded, &raw] {
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
        assert_eq!(answer.command().command_key, first.command_key);
        assert_eq!(answer.command().status(), CommandStatus::Confirmed);
    }
    let missing = h.agent.get_path(run, "d-9/payments/wire/0", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.text);
    let malformed = h.agent.get_path(run, "wire", None).await;
    assert_eq!(
        malformed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        malformed.text
    );
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_submissions_are_refused_with_the_status_and_pointer_that_say_why() {
    let h = harness().await;
    let run = "r-invalid";

    let unknown = h
        .agent
        .submit(&effect(run, 1, "payments/teleport", 0, json!({})))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text);
    assert_eq!(unknown.error_code(), "unknown_tool");

    let bad_args = h
        .agent
        .submit(&effect(run, 1, "payments/wire", 0, wire_args("acc-1", 0)))
        .await;
    assert_eq!(
        bad_args.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bad_args.text
    );
    assert_eq!(bad_args.error_code(), "invalid_arguments");
    let pointers: Vec<&str> = bad_args.body["error"]["details"]["violations"]
        .as_array()
        .expect("violations are listed")
        .iter()
        .filter_map(|v| v["pointer"].as_str())
        .collect();
    assert_eq!(pointers, ["/args/amount_minor"], "{}", bad_args.text);

    let bad_run = h
        .agent
        .submit(&effect(
            "bad run!",
            1,
            "payments/wire",
            0,
            wire_args("acc-1", 5),
        ))
        .await;
    assert_eq!(
        bad_run.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bad_run.text
    );
    assert_eq!(bad_run.body["error"]["details"]["pointer"], "/run_id");

    let unknown_field = h
        .agent
        .submit(
            &json!({"run_id": run, "decision": 1, "tool": "payments/wire",
                        "call_idx": 0, "args": wire_args("acc-1", 5), "priority": "now"}),
        )
        .await;
    assert_eq!(
        unknown_field.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        unknown_field.text
    );

    let both_times = h
        .agent
        .submit(
            &json!({"run_id": run, "decision": 1, "tool": "payments/wire", "call_idx": 0,
                        "args": wire_args("acc-1", 5), "delay_ms": 10,
                        "not_before": "2030-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(
        both_times.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        both_times.text
    );

    let malformed = h
        .agent
        .submit_raw(br#"{"run_id": "r-invalid", "#.to_vec())
        .await;
    assert_eq!(
        malformed.status,
        StatusCode::BAD_REQUEST,
        "{}",
        malformed.text
    );
    assert_eq!(malformed.error_code(), "malformed_json");

    // Valid JSON, valid arguments, but over the body limit.
    let oversized = effect(
        run,
        1,
        "email/send",
        0,
        json!({"to": "a@example.com", "subject": "big", "body": "x".repeat(2 * MAX_BODY)}),
    );
    let too_large = h
        .agent
        .submit_raw(serde_json::to_vec(&oversized).expect("json"))
        .await;
    assert_eq!(
        too_large.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        too_large.text
    );
    assert_eq!(too_large.error_code(), "body_too_large", "a JSON error");

    let too_many = h
        .agent
        .batch(
            (0..=MAX_BATCH as u32)
                .map(|i| {
                    effect(
                        run,
                        100 + i,
                        "tickets/create",
                        0,
                        ticket_args("one too many"),
                    )
                })
                .collect(),
        )
        .await;
    assert_eq!(
        too_many.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        too_many.text
    );
    assert_eq!(too_many.error_code(), "batch_too_large");
    let bad_wait = h
        .agent
        .get_path(run, &encode_key("d-1/payments/wire/0"), Some("soon"))
        .await;
    assert_eq!(
        bad_wait.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bad_wait.text
    );

    // Nothing of the above was recorded or sent.
    let listed = h.agent.list(run, None).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert_eq!(listed.body["effects"], json!([]), "{}", listed.text);
    let stats = h.upstream.stats();
    assert_eq!((stats.wires, stats.emails), (0, 0));
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_names_batches_status_filters_and_business_keys() {
    let h = harness().await;
    let run = "r-batch";

    // A bare name resolves in the catalog's default namespace (`payments` here).
    let bare = h
        .agent
        .submit_created(&effect(run, 1, "wire", 0, wire_args("acc-bare", 700)))
        .await;
    assert_eq!(bare.tool.to_string(), "payments/wire");
    assert_eq!(bare.command_key.to_string(), "d-1/payments/wire/0");
    let not_there = h
        .agent
        .submit(&effect(run, 1, "send", 0, email_args("hi")))
        .await;
    assert_eq!(
        not_there.status,
        StatusCode::NOT_FOUND,
        "{}",
        not_there.text
    );
    assert!(
        not_there.text.contains("payments/send"),
        "the error names the resolved tool: {}",
        not_there.text
    );

    // A batch answers per item, in order.
    let mut drifted = wire_args("acc-bare", 700);
    drifted["reference"] = json!("other");
    let batch = h
        .agent
        .batch(vec![
            effect(run, 2, "email/send", 0, email_args("batch")),
            effect(run, 1, "payments/wire", 0, wire_args("acc-bare", 700)),
            effect(run, 1, "payments/wire", 0, drifted),
            effect(run, 3, "payments/teleport", 0, json!({})),
            effect(run, 4, "tickets/create", 0, json!({"title": ""})),
            effect(run, 5, "tickets/create", 0, ticket_args("later")),
        ])
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
    let statuses: Vec<u64> = batch.body["results"]
        .as_array()
        .expect("results per item")
        .iter()
        .map(|r| r["status"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(statuses, [201, 200, 409, 404, 422, 201], "{}", batch.text);
    assert_eq!(
        batch.body["results"][0]["command"]["command_key"],
        "d-2/email/send/0"
    );
    assert_eq!(
        batch.body["results"][4]["error"]["details"]["violations"][0]["pointer"], "/args/title",
        "{}",
        batch.text
    );

    // A malformed item refuses the batch whole, naming it: nothing of the batch is recorded.
    let before = h.agent.commands(run, None).await.len();
    let malformed = h
        .agent
        .batch(vec![
            effect(run, 6, "tickets/create", 0, ticket_args("never")),
            json!({"run_id": run, "decision": 7, "tool": "Tickets/create", "call_idx": 0, "args": {}}),
        ])
        .await;
    assert_eq!(
        malformed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        malformed.text
    );
    assert_eq!(
        malformed.body["error"]["details"]["pointer"],
        "/effects/1/tool"
    );
    assert_eq!(
        h.agent.commands(run, None).await.len(),
        before,
        "nothing recorded"
    );

    // Interleaved runs: each run's effects are reserved in batch order, the answers come back
    // in the batch's order.
    let interleaved = h
        .agent
        .batch(vec![
            effect("r-batch-a", 1, "email/send", 0, email_args("a1")),
            effect("r-batch-b", 1, "email/send", 0, email_args("b1")),
            effect("r-batch-a", 2, "email/send", 0, email_args("a2")),
            effect("r-batch-b", 2, "email/send", 0, email_args("b2")),
        ])
        .await;
    let order: Vec<(String, u64)> = interleaved.body["results"]
        .as_array()
        .expect("results per item")
        .iter()
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r["command"]["run_id"].as_str().unwrap_or("?"),
                    r["command"]["command_key"].as_str().unwrap_or("?")
                ),
                r["status"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            ("r-batch-a/d-1/email/send/0".to_owned(), 201),
            ("r-batch-b/d-1/email/send/0".to_owned(), 201),
            ("r-batch-a/d-2/email/send/0".to_owned(), 201),
            ("r-batch-b/d-2/email/send/0".to_owned(), 201),
        ],
        "{}",
        interleaved.text
    );

    // A scheduled effect is listed under its status too.
    let later = h
        .agent
        .submit(
            &json!({"run_id": run, "decision": 6, "tool": "email/send", "call_idx": 0,
                        "args": email_args("tomorrow"), "delay_ms": 3_600_000}),
        )
        .await;
    assert_eq!(later.status, StatusCode::CREATED, "{}", later.text);
    assert_eq!(later.command().status(), CommandStatus::Scheduled);

    // The same business key under a fresh call index (and from another run) is the same wire:
    // the existing command answers 200 and no second intent is recorded.
    let wire = h
        .agent
        .submit_created(&effect(
            run,
            7,
            "payments/wire",
            0,
            wire_args("acc-7", 1_234),
        ))
        .await;
    let same_wire = h
        .agent
        .submit(&effect(
            run,
            7,
            "payments/wire",
            1,
            wire_args("acc-7", 1_234),
        ))
        .await;
    assert_eq!(same_wire.status, StatusCode::OK, "{}", same_wire.text);
    assert_eq!(same_wire.command().command_key, wire.command_key);
    let other_run = h
        .agent
        .submit(&effect(
            "r-batch-other",
            1,
            "payments/wire",
            0,
            wire_args("acc-7", 1_234),
        ))
        .await;
    assert_eq!(other_run.status, StatusCode::OK, "{}", other_run.text);
    assert_eq!(other_run.command().run_id.to_string(), run);
    assert_eq!(other_run.command().command_key, wire.command_key);
    let never_reserved = h
        .agent
        .get_path(run, &encode_key("d-7/payments/wire/1"), None)
        .await;
    assert_eq!(
        never_reserved.status,
        StatusCode::NOT_FOUND,
        "{}",
        never_reserved.text
    );

    for key in [
        "d-1/payments/wire/0",
        "d-2/email/send/0",
        "d-5/tickets/create/0",
        "d-7/payments/wire/0",
    ] {
        let settled = h.agent.wait_settled(run, key).await;
        assert_eq!(
            settled.status(),
            CommandStatus::Confirmed,
            "{key}: {settled:?}"
        );
    }
    let stats = h.upstream.stats();
    assert_eq!(stats.standing_wires(&wire_business_key("acc-7", 1_234)), 1);
    assert_eq!(stats.wires, 2, "one wire per business key: {stats:?}");
    assert!(
        h.agent.commands("r-batch-other", None).await.is_empty(),
        "the other run recorded nothing"
    );

    // Filters by status, journal order kept.
    let keys = |commands: Vec<sluice_core::command::Command>| -> Vec<String> {
        commands.iter().map(|c| c.command_key.to_string()).collect()
    };
    assert_eq!(
        keys(h.agent.commands(run, Some("CONFIRMED")).await),
        [
            "d-1/payments/wire/0",
            "d-2/email/send/0",
            "d-5/tickets/create/0",
            "d-7/payments/wire/0"
        ]
    );
    assert_eq!(
        keys(h.agent.commands(run, Some("SCHEDULED")).await),
        ["d-6/email/send/0"]
    );
    assert!(h.agent.commands(run, Some("PENDING")).await.is_empty());
    assert_eq!(h.agent.commands(run, None).await.len(), 5);
    let bogus = h.agent.list(run, Some("DONE")).await;
    assert_eq!(
        bogus.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bogus.text
    );
    h.stop().await;
}

/// Eight runs submitting the same wire (one business key) at the same instant: one command is
/// reserved, the other seven are answered with it, and the bank books the wire once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_business_key_from_eight_runs_at_once_books_one_wire() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let submissions = (0..8).map(|i| {
        let agent = &h.agent;
        async move {
            agent
                .submit(&effect(
                    &format!("r-bk-race-{i}"),
                    1,
                    "payments/wire",
                    0,
                    wire_args("acc-bk-race", 31_415),
                ))
                .await
        }
    });
    let answers = futures::future::join_all(submissions).await;
    let created: Vec<_> = answers
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .collect();
    assert_eq!(created.len(), 1, "{answers:#?}");
    let wire = created[0].command();
    for answer in &answers {
        assert!(
            answer.status == StatusCode::CREATED || answer.status == StatusCode::OK,
            "{}",
            answer.text
        );
        let command = answer.command();
        assert_eq!(
            (command.run_id.to_string(), command.command_key.to_string()),
            (wire.run_id.to_string(), wire.command_key.to_string()),
            "every answer is the one reserved wire"
        );
    }
    let key = wire.command_key.to_string();
    let settled = h.agent.wait_settled(wire.run_id.as_str(), &key).await;
    assert_eq!(settled.status(), CommandStatus::Confirmed);
    assert_eq!(
        h.upstream
            .stats()
            .standing_wires(&wire_business_key("acc-bk-race", 31_415)),
        1
    );
    h.stop().await;
}

/// With the dispatch backlog full (`bus.admission = 1`, the one admitted email held by an
/// upstream that does not answer), a new submission waits `producer.admission_wait_ms` and is
/// refused with 503 `dispatch_backlog_full`, nothing recorded. Once the dispatcher has handled
/// the held request (its call timed out), the same submission goes in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_dispatch_backlog_refuses_new_submissions_with_nothing_recorded() {
    let mut faults = Faults::none();
    faults.email.commit_then_timeout = 1.0;
    faults.timeout_sleep_ms = 10_000;
    let h = Harness::start_with(
        faults,
        |c| c.dispatch("email/send", "timeout_ms", 1_500),
        |config| {
            config.bus.admission = 1;
            config.producer.admission_wait_ms = 300;
        },
    )
    .await;
    h.agent
        .submit_created(&effect("r-held", 0, "email/send", 0, email_args("held")))
        .await;

    let waiting = effect("r-waiting", 0, "email/send", 0, email_args("waiting"));
    let started = std::time::Instant::now();
    let refused = h.agent.submit(&waiting).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text
    );
    assert_eq!(
        refused.error_code(),
        "dispatch_backlog_full",
        "{}",
        refused.text
    );
    assert!(started.elapsed() >= std::time::Duration::from_millis(300));
    // Said to clients as a pause to take, not a failure to give up on.
    let again = reqwest::Client::new()
        .post(format!("{}/v1/effects", h.agent.base()))
        .json(&waiting)
        .send()
        .await
        .expect("the producer answers");
    assert_eq!(again.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        again
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let run = sluice_core::ids::RunId::parse("r-waiting").expect("valid");
    let recorded = h.ctx().ledger.list_run(&run, None).await.expect("list");
    assert!(recorded.is_empty(), "nothing recorded: {recorded:?}");

    // The held call times out after 1.5 s; its request is handled and gives its room back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let answer = h.agent.submit(&waiting).await;
        if answer.status == StatusCode::CREATED {
            break;
        }
        assert_eq!(
            answer.error_code(),
            "dispatch_backlog_full",
            "{}",
            answer.text
        );
        assert!(std::time::Instant::now() < deadline, "no room came back");
    }
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_return_minimal_answers_with_keys_and_status_only() {
    let h = harness().await;
    let run = "r-minimal";
    let first = effect(run, 1, "email/send", 0, email_args("minimal"));

    // One effect: the keys and the status, marked as the preference applied.
    let (one, applied) = h
        .agent
        .post_preferring("/v1/effects", &first, "return=minimal")
        .await;
    assert_eq!(one.status, StatusCode::CREATED, "{}", one.text);
    assert_eq!(applied.as_deref(), Some("return=minimal"));
    let fields: Vec<&str> = one
        .body
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        ["command_key", "command_status", "run_id"],
        "{}",
        one.text
    );
    assert_eq!(one.body["run_id"], run);
    assert_eq!(one.body["command_key"], "d-1/email/send/0");
    // The status when it was answered; the command may have moved on since.
    let answered: CommandStatus =
        serde_json::from_value(one.body["command_status"].clone()).expect("a status");
    assert!(
        matches!(
            answered,
            CommandStatus::Pending | CommandStatus::Leased | CommandStatus::Confirmed
        ),
        "{}",
        one.text
    );

    // A batch: minimal answers for what was submitted, the full error for what was not; the
    // preference is found among others, whatever its case and quoting.
    let body = json!({"effects": [
        first,
        effect(run, 2, "email/send", 0, email_args("second")),
        effect(run, 3, "payments/teleport", 0, json!({})),
    ]});
    let (batch, applied) = h
        .agent
        .post_preferring(
            "/v1/effects/batch",
            &body,
            "respond-async, Return=\"Minimal\"; x=1",
        )
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
    assert_eq!(applied.as_deref(), Some("return=minimal"));
    let results = batch.body["results"].as_array().expect("results");
    assert_eq!(results[0]["status"], 200, "a replay: {}", batch.text);
    assert_eq!(results[1]["status"], 201);
    assert_eq!(results[1]["command"]["command_key"], "d-2/email/send/0");
    assert_eq!(results[1]["command"]["run_id"], run);
    assert!(
        results[1]["command"].get("args").is_none(),
        "{}",
        batch.text
    );
    assert_eq!(results[2]["status"], 404);
    assert!(results[2]["error"].is_object(), "{}", batch.text);

    // Without the preference (or with another), the whole command, and no header.
    let (full, applied) = h
        .agent
        .post_preferring("/v1/effects", &body["effects"][1], "return=representation")
        .await;
    assert_eq!(full.status, StatusCode::OK, "{}", full.text);
    assert_eq!(applied, None);
    assert_eq!(full.command().args["subject"], "second");
}

/// `Prefer: wait=<seconds>` (RFC 7240): a submission answered once its command is terminal,
/// 201 or 200 as without the wait; BLOCKED (a person's to decide) and a SCHEDULED effect not
/// due within the wait answered at once with 202 and where to poll; a wait that is not a number
/// of seconds refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_wait_answers_with_the_settled_command_or_202_and_where_to_poll() {
    let h = harness().await;
    let run = "r-wait";
    let email = effect(run, 1, "email/send", 0, email_args("waited"));
    let (sent, applied) = h
        .agent
        .post_preferring("/v1/effects", &email, "wait=20")
        .await;
    assert_eq!(sent.status, StatusCode::CREATED, "{}", sent.text);
    assert_eq!(applied.as_deref(), Some("wait=20"));
    let sent = sent.command();
    assert_eq!(sent.status(), CommandStatus::Confirmed, "{sent:?}");
    assert!(
        sent.state.external_ref.is_some(),
        "the upstream's answer is in it"
    );

    // The same effect again: the stored, settled command, 200.
    let (again, _) = h
        .agent
        .post_preferring("/v1/effects", &email, "return=minimal, wait=20")
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.body["command_status"], "CONFIRMED");

    // A wire over the approval threshold waits for a person: answered as soon as it is BLOCKED.
    let started = std::time::Instant::now();
    let big = effect(run, 2, "wire", 0, wire_args("acc-big", 2_000_000));
    let response = reqwest::Client::new()
        .post(format!("{}/v1/effects", h.agent.base()))
        .header("prefer", "wait=30")
        .json(&big)
        .send()
        .await
        .expect("the producer answers");
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some("/v1/runs/r-wait/effects/d-2%2Fpayments%2Fwire%2F0"),
        "the key as one percent-encoded segment"
    );
    let blocked: Command = response.json().await.expect("a command");
    assert_eq!(blocked.status(), CommandStatus::Blocked);
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "answered when BLOCKED, not at the end of the wait"
    );

    // Scheduled an hour ahead: nothing happens within the wait, so it is answered at once.
    let mut later = effect(run, 3, "email/send", 0, email_args("later"));
    later["delay_ms"] = json!(3_600_000);
    let (scheduled, _) = h
        .agent
        .post_preferring("/v1/effects", &later, "wait=30")
        .await;
    assert_eq!(scheduled.status, StatusCode::ACCEPTED, "{}", scheduled.text);
    assert_eq!(scheduled.command().status(), CommandStatus::Scheduled);

    // A batch waits for all of its effects.
    let body = json!({"effects": [
        effect(run, 4, "email/send", 0, email_args("four")),
        effect("r-wait-2", 1, "email/send", 0, email_args("other run")),
    ]});
    let (batch, applied) = h
        .agent
        .post_preferring("/v1/effects/batch", &body, "wait=20")
        .await;
    assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
    assert_eq!(applied.as_deref(), Some("wait=20"));
    for result in batch.body["results"].as_array().expect("results") {
        assert_eq!(result["status"], 201, "{}", batch.text);
        assert_eq!(result["command"]["status"], "CONFIRMED", "{}", batch.text);
    }

    // Bad input is named.
    let (bad, _) = h
        .agent
        .post_preferring(
            "/v1/effects",
            &effect(run, 5, "email/send", 0, email_args("x")),
            "wait=5s",
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.text);
    assert!(bad.text.contains("wait"), "{}", bad.text);
    h.stop().await;
}

/// A wire from another run to another beneficiary is another wire: recorded anew (201), even
/// with the same account, amount and date. The same wire from another run is the existing
/// command, and the answer says so — `existing: "business_key"` in the body and
/// `Sluice-Existing: business_key` — whether answered alone, minimal, in a batch or after a
/// wait; a repeat of the same journal position says `command_key`. The bank books one wire
/// per business key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_business_key_answered_from_another_run_says_so() {
    let h = harness().await;
    let wire = |beneficiary: &str| {
        json!({"account": "acc-1", "amount_minor": 125_000, "beneficiary": beneficiary,
               "date": "2026-11-22"})
    };
    let first = h
        .agent
        .submit_created(&effect("r-abc", 3, "payments/wire", 0, wire("b-9")))
        .await;

    // Another beneficiary: another wire, in its own run.
    let other = h
        .agent
        .submit(&effect("r-other", 1, "payments/wire", 0, wire("b-7")))
        .await;
    assert_eq!(
        other.status,
        StatusCode::CREATED,
        "a wire to another beneficiary is another wire: {}",
        other.text
    );
    assert_eq!(other.command().run_id.as_str(), "r-other");

    // The same wire from another run: r-abc's command, found by business key, and said so.
    let post = |body: serde_json::Value, prefer: Option<&'static str>, path: &'static str| {
        let base = h.agent.base().to_owned();
        async move {
            let mut request = reqwest::Client::new()
                .post(format!("{base}{path}"))
                .json(&body);
            if let Some(prefer) = prefer {
                request = request.header("prefer", prefer);
            }
            let response = request.send().await.expect("an answer");
            let status = response.status();
            let header = response
                .headers()
                .get("sluice-existing")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let body: serde_json::Value = response.json().await.expect("JSON");
            (status, header, body)
        }
    };
    let same = effect("r-same", 1, "payments/wire", 0, wire("b-9"));
    for prefer in [None, Some("return=minimal"), Some("wait=5")] {
        let (status, header, body) = post(same.clone(), prefer, "/v1/effects").await;
        assert_eq!(status, StatusCode::OK, "{prefer:?}: {body}");
        assert_eq!(body["run_id"], json!("r-abc"), "{prefer:?}: {body}");
        assert_eq!(
            body["command_key"],
            json!(first.command_key.as_str()),
            "{body}"
        );
        assert_eq!(
            body["existing"],
            json!("business_key"),
            "{prefer:?}: the answer says it is another run's command: {body}"
        );
        assert_eq!(header.as_deref(), Some("business_key"), "{prefer:?}");
    }
    let (status, _, body) = post(
        json!({"effects": [same.clone(), effect("r-abc", 3, "payments/wire", 0, wire("b-9"))]}),
        None,
        "/v1/effects/batch",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["results"][0]["status"], json!(200), "{body}");
    assert_eq!(
        body["results"][0]["command"]["existing"],
        json!("business_key"),
        "{body}"
    );
    assert_eq!(
        body["results"][1]["command"]["existing"],
        json!("command_key"),
        "the same position again: {body}"
    );
    let (status, header, body) = post(
        effect("r-abc", 3, "payments/wire", 0, wire("b-9")),
        None,
        "/v1/effects",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["existing"], json!("command_key"), "{body}");
    assert_eq!(header.as_deref(), Some("command_key"));
    assert!(
        h.agent.commands("r-same", None).await.is_empty(),
        "nothing recorded in r-same"
    );

    // A new command says nothing of the kind.
    let (status, header, body) = post(
        effect("r-new", 1, "email/send", 0, email_args("new")),
        None,
        "/v1/effects",
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(body.get("existing").is_none(), "{body}");
    assert_eq!(header, None);

    for (run, key) in [
        ("r-abc", first.command_key.as_str()),
        ("r-other", "d-1/payments/wire/0"),
    ] {
        let settled = h.agent.wait_settled(run, key).await;
        assert_eq!(settled.status(), CommandStatus::Confirmed, "{run}");
    }
    assert_eq!(h.upstream.stats().wires, 2, "one wire per beneficiary");
    h.stop().await;
}
