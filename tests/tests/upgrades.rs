//! A rolling upgrade, played from the side of the build still running: this build's services
//! consume what a next build writes — a request with a field it does not know, a dispatch cause
//! it does not know, a message of a higher format, a compensation job of a kind it does not
//! know, a command row of a status it does not know — and dead-letter, quarantine and escalate
//! nothing (docs/operations.md, "Upgrading Sluice"; `sluice_runtime::consumer`, "Messages of a
//! newer build"). The effects still end CONFIRMED: by the handler when the request can be
//! read, by the sweep when it was skipped.
//!
//! On the embedded bus, and on a real Kafka (`SLUICE_TEST_KAFKA_BROKERS`, default
//! `127.0.0.1:19092`, topics of a random prefix; `SLUICE_SKIP_KAFKA=1` skips that one).

use serde_json::json;
use sluice_bus::Topic;
use sluice_core::command::{Command, CommandStatus, EffectSemantics, Intent};
use sluice_core::ids::{CommandKey, RunId, ToolName};
use sluice_core::time::{Clock, SystemClock};
use sluice_runtime::config::BusKind;
use sluice_runtime::messages::FORMAT_HEADER;
use sluice_tests::*;
use sluice_upstream::Faults;

/// How long a wait here may take before the test fails: the consumer groups' first join on
/// Kafka takes seconds, and more on a machine busy with other suites (one run of it took over
/// `DEADLINE`). A bound on waiting, not a figure asserted.
const PATIENCE: std::time::Duration = RECOVERY;

/// Reserves an email in the ledger as a producer of the next build would, without a message:
/// PENDING, due for the sweep `due_in_ms` from now.
async fn reserve_email(h: &Harness, run: &RunId, decision: u32, due_in_ms: i64) -> Command {
    let tool = ToolName::parse("email/send").expect("valid");
    let command = Command::from_intent(
        Intent {
            run_id: run.clone(),
            command_key: CommandKey::new(decision, tool, 0),
            semantics: EffectSemantics::Idempotent,
            args: email_args(&format!("upgrade {decision}")),
            business_key: None,
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        SystemClock.now(),
        due_in_ms,
    );
    let audit = command.reservation_audit("producer");
    h.ctx()
        .ledger
        .reserve(command, audit)
        .await
        .expect("reserve")
        .into_command()
}

async fn publish(h: &Harness, topic: Topic, run: &RunId, payload: serde_json::Value, format: &str) {
    h.ctx()
        .bus
        .publish(
            topic,
            run.as_str(),
            serde_json::to_vec(&payload).expect("json"),
            vec![(FORMAT_HEADER.to_owned(), format.as_bytes().to_vec())],
        )
        .await
        .expect("the bus takes the message");
}

/// The command as the ledger holds it, once it is CONFIRMED.
async fn confirmed(h: &Harness, command: &Command) -> Command {
    let ledger = h.ctx().ledger.clone();
    let (run, key) = (command.run_id.clone(), command.command_key.clone());
    eventually(&format!("{key} CONFIRMED"), PATIENCE, || {
        let (ledger, run, key) = (ledger.clone(), run.clone(), key.clone());
        async move {
            ledger
                .get(&run, &key)
                .await
                .ok()
                .flatten()
                .filter(|c| c.status() == CommandStatus::Confirmed)
        }
    })
    .await
}

/// Plays the upgrade on `h`'s pipeline.
async fn the_current_build_reads_the_next_builds_messages(h: Harness, label: &str) {
    let run = RunId::parse(&format!("r-upgrade-{label}")).expect("valid");
    let metrics = h.ctx().metrics.clone();

    // Read by the handler: a field and a cause this build does not know.
    let handled = reserve_email(&h, &run, 1, 60_000).await;
    publish(
        &h,
        Topic::Requested,
        &run,
        json!({
            "run_id": run.as_str(),
            "command_key": handled.command_key.as_str(),
            "cause": "autoscaled",
            "priority": "high",
        }),
        "1",
    )
    .await;
    // Left to the sweep: a request of a higher format (its payload of a shape this build
    // cannot know), and a compensation job of a new kind about the same command.
    let swept = reserve_email(&h, &run, 2, 1_000).await;
    publish(
        &h,
        Topic::Requested,
        &run,
        json!({ "v2": { "command": swept.command_key.as_str() } }),
        "2",
    )
    .await;
    publish(
        &h,
        Topic::Compensate,
        &run,
        json!({
            "run_id": run.as_str(),
            "job": { "kind": "partial_refund", "command_key": swept.command_key.as_str(), "amount_minor": 5 },
        }),
        "1",
    )
    .await;
    // A reconcile request with an added field: read, nothing to look at.
    publish(
        &h,
        Topic::Unknown,
        &run,
        json!({
            "run_id": run.as_str(),
            "command_key": handled.command_key.as_str(),
            "evidence_hint": "ledger",
        }),
        "1",
    )
    .await;
    // A command the next build moved to a status of its own, and a request about it.
    let newer = reserve_email(&h, &run, 3, 1_000).await;
    let conn = rusqlite::Connection::open(ledger_file_of(&h)).expect("the ledger file");
    let changed = conn
        .execute(
            "UPDATE commands SET status = 'HIBERNATING', \
             state = json_set(state, '$.status', 'HIBERNATING', '$.hibernating_until', 99) \
             WHERE run_id = ?1 AND command_key = ?2",
            rusqlite::params![run.as_str(), newer.command_key.as_str()],
        )
        .expect("the next build's write");
    assert_eq!(changed, 1);
    drop(conn);
    publish(
        &h,
        Topic::Requested,
        &run,
        json!({
            "run_id": run.as_str(),
            "command_key": newer.command_key.as_str(),
            "cause": "hibernation_over",
        }),
        "1",
    )
    .await;

    let done = confirmed(&h, &handled).await;
    assert_eq!(done.state.attempts, 1, "{done:?}");
    let done = confirmed(&h, &swept).await;
    assert_eq!(done.state.attempts, 1, "{done:?}");
    let skipped = |topic: &str, reason: &str| {
        metrics
            .messages_skipped
            .with_label_values(&[topic, reason])
            .get()
    };
    let prefix = h.config.bus.topic_prefix.clone();
    let (requested, compensate) = (format!("{prefix}requested"), format!("{prefix}compensate"));
    eventually("the three skips counted", PATIENCE, || {
        let done = skipped(&requested, "newer_format") >= 1
            && skipped(&compensate, "unknown_kind") >= 1
            && skipped(&requested, "newer_command") >= 1;
        async move { done.then_some(()) }
    })
    .await;

    // Nothing dead-lettered, quarantined or escalated.
    for topic in ["requested", "unknown", "compensate"] {
        let topic = format!("{prefix}{topic}");
        assert_eq!(
            metrics.dead_letters.with_label_values(&[&topic]).get(),
            0,
            "{topic}"
        );
        assert_eq!(
            metrics
                .quarantined_messages
                .with_label_values(&[&topic])
                .get(),
            0,
            "{topic}"
        );
    }
    assert_eq!(metrics.escalations.get(), 0);
    assert_eq!(h.ctx().ledger.quarantined(), 0);
    assert!(h.ctx().ledger.left_for_newer() >= 1);
    // The next build's row is as it left it, still due, for a service of that build.
    let conn = rusqlite::Connection::open(ledger_file_of(&h)).expect("the ledger file");
    let (status, due): (String, Option<i64>) = conn
        .query_row(
            "SELECT status, due_at FROM commands WHERE run_id = ?1 AND command_key = ?2",
            rusqlite::params![run.as_str(), newer.command_key.as_str()],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .expect("the row");
    assert_eq!(status, "HIBERNATING");
    assert!(due.is_some(), "still in the due index");
    let scraped = metrics.render();
    assert!(
        scraped.contains("sluice_messages_skipped_total{reason=\"newer_format\""),
        "{scraped}"
    );
    h.stop().await;
}

fn ledger_file_of(h: &Harness) -> std::path::PathBuf {
    sluice_ledger::sqlite::SqliteConfig::in_dir(h.data.path()).path()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_embedded_bus_the_next_builds_messages_dead_letter_nothing() {
    let h = Harness::start(Faults::none(), |c| c).await;
    the_current_build_reads_the_next_builds_messages(h, "embedded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kafka_the_next_builds_messages_dead_letter_nothing() {
    if std::env::var("SLUICE_SKIP_KAFKA").is_ok_and(|v| v == "1") {
        eprintln!("SLUICE_SKIP_KAFKA=1: the Kafka upgrade test is skipped (no Kafka)");
        return;
    }
    let h = Harness::start_with(
        Faults::none(),
        |c| c,
        |config| {
            config.bus.kind = BusKind::Kafka;
            config.bus.partitions = 2;
            config.bus.topic_prefix = format!(
                "sluice-upgrade-{}.",
                &uuid::Uuid::new_v4().simple().to_string()[..8]
            );
            config.bus.kafka.brokers = std::env::var("SLUICE_TEST_KAFKA_BROKERS")
                .unwrap_or_else(|_| "127.0.0.1:19092".to_owned());
        },
    )
    .await;
    the_current_build_reads_the_next_builds_messages(h, "kafka").await;
}
