//! The metrics a platform team reads, scraped from the real producer's `/metrics`: the state
//! gauges (how many commands are in each unresolved status now, and for how long the oldest),
//! kept right across a restart; the build, the process, the API's answer times by route; the
//! tools' UNKNOWN horizons the alerts compare with.

use reqwest::StatusCode;
use serde_json::json;
use sluice_core::command::CommandStatus;
use sluice_tests::{DEADLINE, Harness, effect, email_args, eventually, start_pipeline, wire_args};
use sluice_upstream::Faults;

/// Scrapes `base`/metrics.
async fn scrape(base: &str) -> String {
    let response = reqwest::get(format!("{base}/metrics"))
        .await
        .expect("the producer answers /metrics");
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.expect("a text body")
}

/// The value of the sample `name{labels}` exactly as written (labels in the exporter's order:
/// alphabetical), if scraped.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until `base` reports `series` at `value`.
async fn until_reported(base: &str, series: &str, value: f64) -> String {
    eventually(&format!("{series} {value}"), DEADLINE, || async {
        let text = scrape(base).await;
        (sample(&text, series) == Some(value)).then_some(text)
    })
    .await
}

const BLOCKED_WIRES: &str = r#"sluice_commands{status="BLOCKED",tool="payments/wire"}"#;
const OLDEST_BLOCKED: &str =
    r#"sluice_oldest_command_age_seconds{status="BLOCKED",tool="payments/wire"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_gauges_count_what_is_unresolved_now_and_survive_a_restart() {
    let harness = Harness::start(Faults::none(), |edit| edit).await;
    let base = harness.agent.base().to_owned();
    // Two wires above the approval threshold wait for a person; an email goes through.
    for call in 0..2 {
        let wire = effect(
            "r-gauge",
            1,
            "payments/wire",
            call,
            wire_args(&format!("acc-{call}"), 5_000_000),
        );
        let created = harness.agent.submit(&wire).await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
        let key = format!("d-1/payments/wire/{call}");
        let blocked = harness.agent.wait_settled("r-gauge", &key).await;
        assert_eq!(blocked.status(), CommandStatus::Blocked);
    }
    let email = harness
        .agent
        .submit_created(&effect("r-gauge", 2, "email/send", 0, email_args("hi")))
        .await;
    let settled = harness
        .agent
        .wait_settled("r-gauge", email.command_key.as_str())
        .await;
    assert_eq!(settled.status(), CommandStatus::Confirmed);

    let text = until_reported(&base, BLOCKED_WIRES, 2.0).await;
    assert_eq!(sample(&text, "sluice_command_gauges_seeded"), Some(1.0));
    // A terminal command is history, not state: the email is held in no status now.
    for status in ["PENDING", "LEASED"] {
        let series = format!(r#"sluice_commands{{status="{status}",tool="email/send"}}"#);
        assert_eq!(
            sample(&text, &series).unwrap_or(0.0),
            0.0,
            "{series}\n{text}"
        );
    }
    assert!(
        !text.contains(r#"sluice_commands{status="CONFIRMED""#),
        "terminal statuses are not held:\n{text}"
    );
    // The oldest BLOCKED wire ages while it waits.
    eventually("the oldest BLOCKED wire ages", DEADLINE, || async {
        let text = scrape(&base).await;
        sample(&text, OLDEST_BLOCKED).filter(|age| *age >= 1.0)
    })
    .await;

    // A restart on the same ledger: the new process reads the figures back at start.
    let config = harness.config.clone();
    let catalog = sluice_tests::example_catalog(&harness.upstream.base_url());
    harness
        .pipeline
        .stop()
        .await
        .expect("the pipeline stops cleanly");
    let restarted = start_pipeline(&config, catalog).await;
    let base = restarted.url();
    let text = until_reported(&base, BLOCKED_WIRES, 2.0).await;
    assert_eq!(sample(&text, "sluice_command_gauges_seeded"), Some(1.0));
    let age = sample(&text, OLDEST_BLOCKED).expect("the oldest BLOCKED wire's age");
    assert!(
        age >= 1.0,
        "its age is kept from the ledger, not reset: {age}"
    );

    // An approval moves one out of BLOCKED at once: maintained at the write, not re-read.
    let agent = sluice_tests::Agent::new(&base);
    let approved = agent
        .act(
            "r-gauge",
            "d-1/payments/wire/0",
            "approve",
            &json!({"reason": "checked"}),
        )
        .await;
    assert_eq!(approved.status, StatusCode::OK, "{}", approved.text);
    let text = scrape(&base).await;
    assert_eq!(sample(&text, BLOCKED_WIRES), Some(1.0), "{text}");
    let wire = agent.wait_settled("r-gauge", "d-1/payments/wire/0").await;
    assert_eq!(wire.status(), CommandStatus::Confirmed);
    let text = until_reported(&base, BLOCKED_WIRES, 1.0).await;
    for status in ["APPROVED", "LEASED", "PENDING"] {
        let series = format!(r#"sluice_commands{{status="{status}",tool="payments/wire"}}"#);
        assert_eq!(
            sample(&text, &series).unwrap_or(0.0),
            0.0,
            "{series}\n{text}"
        );
    }
    restarted.stop().await.expect("a clean stop");
    harness.upstream.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_process_answer_times_and_horizons_are_exported() {
    let harness = Harness::start(Faults::none(), |edit| edit).await;
    let base = harness.agent.base().to_owned();
    harness
        .agent
        .submit_created(&effect("r-http", 1, "email/send", 0, email_args("hi")))
        .await;
    let missing = harness.agent.call("GET", "/v1/nowhere/at/all", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    let text = scrape(&base).await;

    let build = format!(
        r#"sluice_build_info{{revision="{}",version="{}"}}"#,
        sluice_runtime::build_info::REVISION,
        sluice_runtime::build_info::VERSION
    );
    assert_eq!(sample(&text, &build), Some(1.0), "{build}\n{text}");
    // Whole seconds of CPU: a young test process may well show 0.
    let cpu = sample(&text, "process_cpu_seconds_total").expect("the process collector's CPU");
    assert!(cpu >= 0.0, "{cpu}");
    assert!(
        sample(&text, "process_start_time_seconds").is_some_and(|at| at > 1.7e9),
        "{text}"
    );
    assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
    // By route template and status, never a concrete path.
    let submitted = r#"sluice_http_request_duration_seconds_count{method="POST",route="/v1/effects",status="201"}"#;
    assert_eq!(sample(&text, submitted), Some(1.0), "{text}");
    let unmatched = r#"sluice_http_request_duration_seconds_count{method="GET",route="unmatched",status="404"}"#;
    assert_eq!(sample(&text, unmatched), Some(1.0), "{text}");
    assert!(!text.contains("r-http"), "no run id in a label:\n{text}");
    // The tools' horizons, which the UNKNOWN alert compares the oldest UNKNOWN command with.
    let horizon = sample(
        &text,
        r#"sluice_tool_unknown_horizon_seconds{tool="payments/wire"}"#,
    )
    .expect("the wire's horizon");
    assert!(horizon > 10.0, "at least its late-commit window: {horizon}");
    // Waiting requests now: none.
    assert_eq!(sample(&text, "sluice_http_waiting_requests"), Some(0.0));
    harness.stop().await;
}
