//! What the pipeline says on its bus, seen from outside (docs/architecture.md, "Services and
//! topics"): lifecycle events are CloudEvents that also wake the producer's long polls, and a
//! message no service can use is dead-lettered with its reason instead of being dropped or wedging
//! its run's partition.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_bus::Topic;
use sluice_core::command::CommandStatus;
use sluice_runtime::messages::{DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, header};
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

fn now_millis() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    i64::try_from(since.as_millis()).expect("milliseconds fit in i64")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_events_are_cloudevents_and_wake_long_polls_at_once() {
    // The bank answers every wire after 100 ms: long enough to be waiting on it, well inside
    // the wire's timeout, so the dispatch commits normally.
    let slow_bank = Faults::none()
        .with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThenTimeout, 1.0),
        )
        .with_timeout_sleep(Duration::from_millis(100));
    let h = Harness::start(slow_bank, |c| c).await;
    let mut events = h
        .ctx()
        .bus
        .subscribe(Topic::Events, "e2e-events", "e2e-events-1")
        .await
        .expect("an outside consumer subscribes to the events");
    let (run, key) = ("r-events", "d-1/payments/wire/0");
    h.agent
        .submit_created(&effect(
            run,
            1,
            "payments/wire",
            0,
            wire_args("acc-ev", 5_000),
        ))
        .await;

    // One long poll, started while the wire is in flight. Without the wake-up it would return
    // at its one-second ledger re-read, about 900 ms after the confirmation.
    let issued_at = now_millis();
    let answer = h.agent.get_path(run, &encode_key(key), Some("10s")).await;
    let returned_at = now_millis();
    let wire = answer.command();
    assert_eq!(wire.status(), CommandStatus::Confirmed, "{}", answer.text);
    let trail = h.audit(run).await;
    let confirmed_at = trail
        .find(key, CommandStatus::Leased, CommandStatus::Confirmed)
        .record
        .at
        .as_millis();
    assert!(
        issued_at < confirmed_at,
        "the long poll was waiting when the wire was confirmed"
    );
    let late = returned_at - confirmed_at;
    assert!(
        late < 600,
        "the long poll returned {late} ms after the confirmation: not woken by the event"
    );

    // The event an outside consumer reads: CloudEvents 1.0 in binary mode, the public
    // projection of the command as data (docs/events.md).
    let delivery = tokio::time::timeout(DEADLINE, events.next())
        .await
        .expect("a lifecycle event within the deadline")
        .expect("the bus is open");
    let headers = &delivery.message.headers;
    assert_eq!(delivery.key(), run, "keyed by run id");
    assert_eq!(header(headers, "ce_specversion"), Some("1.0"));
    assert_eq!(
        header(headers, "ce_type"),
        Some("dev.sluice.effect.confirmed.v1")
    );
    assert_eq!(
        header(headers, "ce_dataschema"),
        Some("https://sluice.dev/schemas/events/dev.sluice.effect.confirmed.v1.json")
    );
    assert_eq!(
        header(headers, "ce_subject"),
        Some("r-events/d-1/payments/wire/0")
    );
    assert_eq!(header(headers, "ce_source"), Some("/sluice/dispatcher"));
    assert!(header(headers, "ce_id").is_some_and(|id| !id.is_empty()));
    assert!(header(headers, "ce_time").is_some());
    assert_eq!(header(headers, "content-type"), Some("application/json"));
    let data: serde_json::Value =
        serde_json::from_slice(delivery.payload()).expect("the projection as data");
    assert_eq!(data["external_ref"], "w-1");
    assert_eq!(data["status"], "CONFIRMED");
    assert_eq!(data["outcome"]["decided_by"], "call");
    for internal in ["lease", "args", "args_hash", "result", "policy_version"] {
        assert!(
            data.get(internal).is_none(),
            "{internal} is not published: {data}"
        );
    }
    delivery.ack().await.expect("acknowledged");
    h.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_messages_are_dead_lettered_with_a_reason_and_do_not_wedge_the_run() {
    let h = Harness::start(Faults::none(), |c| c).await;
    let run = "r-poison";
    let bus = &h.ctx().bus;
    let poison: [(Topic, &[u8]); 3] = [
        (Topic::Requested, b"not json"),
        // Malformed, not merely newer: a field or a job kind a newer build adds is read past
        // or skipped (tests/tests/upgrades.rs), a key that is no command key is not.
        (
            Topic::Unknown,
            br#"{"run_id":"r-poison","command_key":"wire","extra":1}"#,
        ),
        (Topic::Compensate, br#"{"run_id":"r-poison","job":{}}"#),
    ];
    for (topic, payload) in poison {
        bus.publish(topic, run, payload.to_vec(), vec![])
            .await
            .expect("the bus takes the message");
    }
    // The run's partitions are not wedged: an effect of the same run goes through.
    h.agent
        .submit_created(&effect(
            run,
            1,
            "tickets/create",
            0,
            ticket_args("after poison"),
        ))
        .await;
    let ticket = h.agent.wait_settled(run, "d-1/tickets/create/0").await;
    assert_eq!(ticket.status(), CommandStatus::Confirmed, "{ticket:?}");

    let mut dlq = bus
        .subscribe(Topic::Dlq, "e2e-dlq", "e2e-dlq-1")
        .await
        .expect("an operator subscribes to the dead letters");
    let mut seen = Vec::new();
    for _ in 0..3 {
        let delivery = tokio::time::timeout(DEADLINE, dlq.next())
            .await
            .expect("a dead letter within the deadline")
            .expect("the bus is open");
        let headers = &delivery.message.headers;
        let from = header(headers, DLQ_TOPIC_HEADER).expect("the topic it came from");
        let reason = header(headers, DLQ_REASON_HEADER).expect("the reason");
        assert!(!reason.is_empty());
        seen.push((from.to_owned(), delivery.payload().to_vec()));
        delivery.ack().await.expect("acknowledged");
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("sluice.compensate".to_owned(), poison[2].1.to_vec()),
            ("sluice.requested".to_owned(), poison[0].1.to_vec()),
            ("sluice.unknown".to_owned(), poison[1].1.to_vec()),
        ],
        "each message kept as it was, with where it came from"
    );
    let metrics = reqwest::get(format!("{}/metrics", h.agent.base()))
        .await
        .expect("the producer serves metrics")
        .text()
        .await
        .expect("text");
    for topic in ["sluice.requested", "sluice.unknown", "sluice.compensate"] {
        assert!(
            metrics.contains(&format!("sluice_dead_letters_total{{topic=\"{topic}\"}} 1")),
            "{topic} dead letter counted: {metrics}"
        );
    }
    h.stop().await;
}
