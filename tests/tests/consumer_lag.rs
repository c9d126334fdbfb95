//! Consumer lag as a Prometheus metric, end to end on a real Kafka: a service's consume loop
//! exports `sluice_consumer_lag{group, topic, partition}` on its `/metrics` endpoint, read
//! from the broker's committed offsets and high watermarks; above 0 while its handlers hold
//! their messages, back to 0 once they let them go (docs/operations.md, "Telemetry").
//! `SLUICE_SKIP_KAFKA=1` skips it (a machine without the engines); CI runs it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sluice_assemble::{assemble, delete_topics};
use sluice_bus::{Delivery, Group, Topic};
use sluice_runtime::Shutdown;
use sluice_runtime::config::BusKind;
use sluice_runtime::consumer::{ConsumerSpec, Handled, consume};
use sluice_tests::processes::free_port;
use sluice_tests::*;
use tokio::sync::Semaphore;
use tokio::time::{Instant, sleep};

/// Messages published, spread over the partitions by their keys.
const MESSAGES: u64 = 12;

fn skipped() -> bool {
    if std::env::var("SLUICE_SKIP_KAFKA").is_ok_and(|v| v == "1") {
        eprintln!("SLUICE_SKIP_KAFKA=1: the consumer lag test is skipped (no Kafka)");
        return true;
    }
    false
}

/// The `sluice_consumer_lag` samples of `group` on `topic` scraped from `url`, by partition.
async fn lag_of(url: &str, group: &str, topic: &str) -> BTreeMap<u32, u64> {
    let text = reqwest::get(url)
        .await
        .expect("the service answers /metrics")
        .text()
        .await
        .expect("a text body");
    let prefix = format!("sluice_consumer_lag{{group=\"{group}\",partition=\"");
    let suffix_topic = format!("\",topic=\"{topic}\"}} ");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (partition, rest) = rest.split_once(&suffix_topic)?;
            Some((partition.parse().ok()?, rest.parse().ok()?))
        })
        .collect()
}

/// Scrapes until `done` holds for the lag (20 s at most: a reading every 5 s, and an
/// acknowledgement is committed within a second).
async fn lag_when(
    url: &str,
    group: &str,
    topic: &str,
    what: &str,
    done: impl Fn(&BTreeMap<u32, u64>) -> bool,
) -> BTreeMap<u32, u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lag = lag_of(url, group, topic).await;
        if done(&lag) {
            return lag;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: sluice_consumer_lag of {group} on {topic} is {lag:?}"
        );
        sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_of_each_partition_is_on_the_metrics_endpoint_and_falls_back_to_zero() {
    if skipped() {
        return;
    }
    init_tracing();
    let data = tempfile::tempdir().expect("a temporary directory");
    let mut config = test_config(data.path());
    config.bus.kind = BusKind::Kafka;
    config.bus.partitions = 3;
    config.bus.topic_prefix = format!(
        "sluice-lag-{}.",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    config.bus.kafka.brokers =
        std::env::var("SLUICE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".to_owned());
    config.validate().expect("a valid configuration");
    let ctx = assemble(&config, CatalogEdit::example("http://127.0.0.1:9").build())
        .await
        .expect("the context");
    let shutdown = Shutdown::new();
    // The service's operations endpoint, as a dispatcher serves it on `telemetry.listen`.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    tokio::spawn(sluice_runtime::ops::serve(
        ctx.clone(),
        addr,
        shutdown.clone(),
    ));
    let metrics = format!("http://{addr}/metrics");

    // A consume loop of the dispatchers' group whose handlers hold every message until the
    // gate opens: nothing is acknowledged, so nothing is committed.
    let group = ctx.bus.group_id(Group::Dispatchers);
    let topic = ctx.bus.topic_name(Topic::Requested);
    let gate = Arc::new(Semaphore::new(0));
    let consuming = tokio::spawn({
        let (bus, metrics, gate, shutdown) = (
            ctx.bus.clone(),
            ctx.metrics.clone(),
            Arc::clone(&gate),
            shutdown.clone(),
        );
        let spec = ConsumerSpec {
            topic: Topic::Requested,
            group: group.clone(),
            member: "lag-test".into(),
            concurrency: 8,
            lanes: None,
        };
        consume(bus, metrics, spec, shutdown, move |_delivery: Delivery| {
            let gate = Arc::clone(&gate);
            async move {
                let _pass = gate.acquire().await;
                Ok(Handled::Done)
            }
        })
    });

    let before = lag_when(&metrics, &group, &topic, "a first reading", |lag| {
        lag.len() == 3
    })
    .await;
    assert!(before.values().all(|lag| *lag == 0), "{before:?}");
    for i in 0..MESSAGES {
        ctx.bus
            .publish(
                Topic::Requested,
                &format!("r-lag-{i}"),
                b"{}".to_vec(),
                vec![],
            )
            .await
            .expect("publish");
    }
    // Behind by every message, on the partitions their keys chose.
    let behind = lag_when(
        &metrics,
        &group,
        &topic,
        "the lag of the held messages",
        |lag| lag.values().sum::<u64>() == MESSAGES,
    )
    .await;
    assert_eq!(
        behind.keys().copied().collect::<Vec<_>>(),
        vec![0, 1, 2],
        "one series per partition"
    );
    assert!(
        behind.values().filter(|lag| **lag > 0).count() > 1,
        "the keys spread over the partitions: {behind:?}"
    );

    // The handlers let go: every message acknowledged, committed, and the lag back to 0.
    gate.add_permits(usize::try_from(MESSAGES).expect("small"));
    lag_when(
        &metrics,
        &group,
        &topic,
        "the lag once all is handled",
        |lag| lag.len() == 3 && lag.values().all(|lag| *lag == 0),
    )
    .await;

    shutdown.cancel();
    let _ = consuming.await;
    delete_topics(&config)
        .await
        .expect("the topics are deleted");
}
