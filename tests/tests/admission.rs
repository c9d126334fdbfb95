//! Admission on the dispatchers' queue, end to end on a real Kafka: a producer whose
//! dispatchers take nothing on refuses new work with 503 `dispatch_behind` and `Retry-After`
//! once their queue passes its floor, records nothing of what it refuses, and takes work again
//! as soon as the dispatchers' group commits (docs/architecture.md, "Under a slow ledger").
//! `SLUICE_SKIP_KAFKA=1` skips it (a machine without the engines); CI runs it.

use std::time::Duration;

use reqwest::StatusCode;
use sluice_assemble::assemble;
use sluice_bus::{Group, Topic};
use sluice_core::load::QUEUE_FLOOR;
use sluice_runtime::Shutdown;
use sluice_runtime::config::BusKind;
use sluice_tests::*;
use tokio::time::{Instant, sleep};

/// A producer alone on a Kafka bus of fresh topics (no dispatcher takes anything on), serving
/// on a port of its own: its URL, bus, shutdown and task.
async fn lone_producer(
    data: &std::path::Path,
) -> (
    String,
    std::sync::Arc<dyn sluice_bus::Bus>,
    Shutdown,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let mut config = test_config(data);
    config.bus.kind = BusKind::Kafka;
    config.bus.partitions = 4;
    config.bus.topic_prefix = format!(
        "sluice-admission-{}.",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    config.bus.kafka.brokers =
        std::env::var("SLUICE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".to_owned());
    config.validate().expect("a valid configuration");
    let catalog = CatalogEdit::example("http://127.0.0.1:9").build();
    let ctx = assemble(&config, catalog).await.expect("the context");
    let bus = ctx.bus.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    let shutdown = Shutdown::new();
    let served = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { sluice_producer::serve(ctx, &config, listener, shutdown).await }
    });
    (url, bus, shutdown, served)
}

fn skipped() -> bool {
    if std::env::var("SLUICE_SKIP_KAFKA").is_ok_and(|v| v == "1") {
        eprintln!("SLUICE_SKIP_KAFKA=1: the admission test is skipped (no Kafka)");
        return true;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_refuses_work_its_dispatchers_cannot_reach_and_takes_it_again_when_they_do() {
    if skipped() {
        return;
    }
    init_tracing();
    let data = tempfile::tempdir().expect("a temporary directory");
    let (url, bus, shutdown, served) = lone_producer(data.path()).await;
    let agent = Agent::new(&url);

    // Past the floor, in batches, as fast as the producer takes them (items past it may be
    // refused already, if a reading came in between).
    let mut created = 0;
    let mut chunk = 0;
    while created <= QUEUE_FLOOR {
        let effects = (0..100)
            .map(|i| {
                effect(
                    &format!("r-adm-{chunk}-{i}"),
                    1,
                    "email/send",
                    0,
                    email_args("x"),
                )
            })
            .collect();
        let batch = agent.batch(effects).await;
        assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
        for result in batch.body["results"].as_array().expect("results") {
            match result["status"].as_u64() {
                Some(201) => created += 1,
                Some(503) => assert_eq!(result["error"]["code"], "dispatch_behind", "{result}"),
                _ => panic!("unexpected answer: {result}"),
            }
        }
        chunk += 1;
    }

    // Within a reading or two the queue is seen, and the next submission is refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut attempt = 0;
    let (refused, refused_run) = loop {
        attempt += 1;
        let run = format!("r-refused-{attempt}");
        let answer = agent
            .call(
                "POST",
                "/v1/effects",
                Some(&effect(&run, 1, "email/send", 0, email_args("y"))),
            )
            .await;
        if answer.status == StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            break (answer, run);
        }
        assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.text);
        // Admitted while the reading lagged: a run of its own each time, to keep counting.
        sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text
    );
    assert_eq!(
        refused.body["error"]["code"], "dispatch_behind",
        "{}",
        refused.text
    );
    let retry_after = refused.body["error"]["details"]["retry_after_s"]
        .as_u64()
        .expect("a Retry-After");
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let missing = agent
        .call("GET", &format!("/v1/runs/{refused_run}/effects"), None)
        .await;
    assert!(
        missing.body["effects"].as_array().is_none_or(Vec::is_empty),
        "nothing of a refused submission is recorded: {}",
        missing.text
    );

    // A dispatcher of the group takes the queue on: admission opens again.
    let mut dispatcher = bus
        .subscribe(
            Topic::Requested,
            &bus.group_id(Group::Dispatchers),
            "test-dispatcher",
        )
        .await
        .expect("subscribe");
    let drained = tokio::spawn(async move {
        while let Some(delivery) = dispatcher.next().await {
            delivery.ack().await.expect("ack");
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = agent
            .call(
                "POST",
                "/v1/effects",
                Some(&effect("r-again", 1, "email/send", 0, email_args("z"))),
            )
            .await;
        if answer.status == StatusCode::CREATED {
            break;
        }
        assert_eq!(
            answer.body["error"]["code"], "dispatch_behind",
            "{}",
            answer.text
        );
        assert!(
            Instant::now() < deadline,
            "still refused after 30 s: {}",
            answer.text
        );
        sleep(Duration::from_millis(500)).await;
    }
    shutdown.cancel();
    let _ = served.await;
    drained.abort();
}

/// A burst admitted faster than the queue is read: before this, every effect of concurrent
/// batches that came within the reading's second was admitted (on a cold Cassandra, 5,000 in
/// 20 s against dispatchers that took 44 a second). Each admission now counts until a reading
/// includes it, so the queue's floor holds whatever the readings' pace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_held_to_the_queue_floor_before_any_reading_sees_it() {
    if skipped() {
        return;
    }
    init_tracing();
    let data = tempfile::tempdir().expect("a temporary directory");
    let (url, _bus, shutdown, served) = lone_producer(data.path()).await;
    let batches: Vec<_> = (0..10)
        .map(|chunk| {
            let agent = Agent::new(&url);
            tokio::spawn(async move {
                let effects = (0..100)
                    .map(|i| {
                        effect(
                            &format!("r-burst-{chunk}-{i}"),
                            1,
                            "email/send",
                            0,
                            email_args("x"),
                        )
                    })
                    .collect();
                agent.batch(effects).await
            })
        })
        .collect();
    let (mut created, mut refused) = (0u64, 0u64);
    for batch in batches {
        let batch = batch.await.expect("the batch's task");
        assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
        for result in batch.body["results"].as_array().expect("results") {
            match result["status"].as_u64() {
                Some(201) => created += 1,
                Some(503) => {
                    assert_eq!(result["error"]["code"], "dispatch_behind", "{result}");
                    refused += 1;
                }
                _ => panic!("unexpected answer: {result}"),
            }
        }
    }
    assert_eq!(created + refused, 1_000);
    assert!(
        created <= QUEUE_FLOOR + 1,
        "{created} admitted at once to dispatchers that took none on (floor {QUEUE_FLOOR})"
    );
    // Fewer may be admitted, never more: a request published while a reading is taken can be
    // counted both in the reading and as an admission not yet ended (the estimate errs high).
    assert!(
        created >= QUEUE_FLOOR / 2,
        "about the floor's worth is admitted: {created}"
    );
    shutdown.cancel();
    let _ = served.await;
}
