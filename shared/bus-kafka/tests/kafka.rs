//! The Kafka bus against a real broker: the shared bus contract suite, unchanged, then what only
//! this implementation has to show — librdkafka's partitioner agreeing with `partition_for`,
//! idempotent topic creation, the size limit, a stale acknowledgement after a rebalance, close.
//!
//! The broker is `SLUICE_TEST_KAFKA_BROKERS` (default `127.0.0.1:19092`, what
//! `scripts/engines/start.sh kafka` starts). A missing broker fails every test with a message
//! saying how to start one; `SLUICE_SKIP_KAFKA=1` compiles these tests out instead (see
//! `build.rs`), for a workspace test run on a machine without engines. Each test works under a
//! topic prefix of its own (`sluice-test-<uuid>.`) and deletes its topics at the end.
//!
//! Consumer groups use short session and heartbeat intervals so that rebalances take about a
//! second; the broker from `scripts/engines` has `group.initial.rebalance.delay.ms=0`.

#![cfg(not(sluice_skip_kafka))]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::contract::{WAIT, fresh_group, fresh_prefix, keys_by_partition, next_within};
use sluice_bus::{Bus, BusError, Delivery, QueueDepth, Subscription, Topic, partition_for};
use sluice_bus_kafka::{CreateTopics, KafkaBus, KafkaConfig};
use tokio::time::{Instant, sleep, timeout};

mod common;
use common::{Topics, brokers, config, connect};

/// The maker for the contract suite: 4 partitions (some checks need at least two).
async fn kafka_bus(prefix: String) -> (Arc<dyn Bus>, Topics) {
    let bus = connect(config(prefix, 4)).await;
    (Arc::new(bus.clone()), Topics(bus))
}

sluice_bus::bus_contract_tests!(kafka_bus);

fn text(delivery: &Delivery) -> String {
    String::from_utf8_lossy(delivery.payload()).into_owned()
}

/// librdkafka's `murmur2_random` puts every key where `partition_for` (the Java client's
/// partitioner) says, for partition counts that are not powers of two as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_partitions_like_the_java_client() {
    let bus = connect(config(fresh_prefix(), 7)).await;
    let _topics = Topics(bus.clone());
    assert_eq!(bus.partitions(Topic::Events).await.expect("partitions"), 7);

    let mut keys: Vec<String> = ["r-abc", "r-1", "21", "a", "run-ünïcödé-✓", ""]
        .map(str::to_owned)
        .to_vec();
    keys.push("k".repeat(1_000));
    keys.extend((0..120).map(|i| format!("r-{}-{i}", uuid::Uuid::new_v4().simple())));
    let mut used = BTreeSet::new();
    for key in &keys {
        let at = bus
            .publish(Topic::Events, key, b"x".to_vec(), Vec::new())
            .await
            .expect("publish");
        assert_eq!(
            at.partition,
            partition_for(key.as_bytes(), 7),
            "key {key:?} went to partition {} where partition_for says {}",
            at.partition,
            partition_for(key.as_bytes(), 7)
        );
        used.insert(at.partition);
    }
    assert_eq!(used.len(), 7, "the keys spread over every partition");
}

/// Topics are created once: a second bus (another service starting) finds them, keeps their
/// partition count even when configured otherwise, and sees what the first published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_are_created_once_and_reused() {
    let prefix = fresh_prefix();
    let first = connect(config(prefix.clone(), 3)).await;
    let _topics = Topics(first.clone());
    let second = connect(config(prefix.clone(), 5)).await;
    for topic in Topic::ALL {
        assert_eq!(second.partitions(topic).await.expect("partitions"), 3);
        assert_eq!(
            second.topic_name(topic),
            format!("{prefix}{}", topic.suffix())
        );
    }
    let at = first
        .publish(Topic::Dlq, "r-1", b"dead".to_vec(), Vec::new())
        .await
        .expect("publish");
    let mut sub = second
        .subscribe(Topic::Dlq, &fresh_group("reuse"), "m-1")
        .await
        .expect("subscribe");
    let got = next_within(&mut sub, "the message published by the first bus").await;
    assert_eq!((got.partition, got.offset), (at.partition, at.offset));
    assert_eq!(got.payload(), b"dead");
    got.ack().await.expect("ack");
}

/// A message over `max_message_bytes` (key, payload and headers counted) is refused before
/// sending; one at the limit goes through, and nothing of the refused one is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_refused_before_sending() {
    let bus = connect(KafkaConfig {
        max_message_bytes: 1_000,
        ..config(fresh_prefix(), 2)
    })
    .await;
    let _topics = Topics(bus.clone());
    let headers = vec![("h".to_owned(), vec![7u8; 10])];
    // key 5 + header 11 + payload 984 = 1,000 bytes
    let fits = vec![1u8; 984];
    let over = vec![2u8; 985];

    match bus
        .publish(Topic::Requested, "r-big", over, headers.clone())
        .await
    {
        Err(BusError::MessageTooLarge {
            bytes, max, topic, ..
        }) => {
            assert_eq!((bytes, max), (1_001, 1_000));
            assert_eq!(topic, bus.topic_name(Topic::Requested));
        }
        other => panic!("expected MessageTooLarge, got {other:?}"),
    }
    bus.publish(Topic::Requested, "r-big", fits.clone(), headers)
        .await
        .expect("a message at the limit is accepted");

    let mut sub = bus
        .subscribe(Topic::Requested, &fresh_group("size"), "m-1")
        .await
        .expect("subscribe");
    let got = next_within(&mut sub, "the message at the limit").await;
    assert_eq!(got.payload(), fits.as_slice());
    got.ack().await.expect("ack");
    if let Ok(extra) = timeout(Duration::from_millis(750), sub.next()).await {
        panic!(
            "the refused message was delivered: {:?}",
            extra.map(|d| d.payload().len())
        );
    }
}

/// A replication factor the cluster cannot meet is a configuration error naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_impossible_replication_factor_names_the_key() {
    let result = KafkaBus::connect(KafkaConfig {
        replication_factor: Some(3),
        ..config(fresh_prefix(), 1)
    })
    .await;
    match result {
        Err(BusError::InvalidConfig {
            key: "replication_factor",
            ..
        }) => {}
        other => panic!("expected an invalid replication_factor, got {other:?}"),
    }
}

/// `create_topics = "never"`: a missing topic, and one with another partition count, stop the
/// start with an error naming the topic and the setting; `if_missing` creates them once and
/// then finds them; topics as configured start fine. The broker of `scripts/engines` creates
/// topics on metadata requests (`auto.create.topics.enable=true`): none appears here unasked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_refuses_missing_or_different_topics_and_if_missing_creates_once() {
    let prefix = fresh_prefix();
    let never = |partitions| KafkaConfig {
        create_topics: CreateTopics::Never,
        ..config(prefix.clone(), partitions)
    };
    match KafkaBus::connect(never(2)).await {
        Err(BusError::InvalidConfig {
            key: "create_topics",
            why,
        }) => assert!(
            why.contains(&format!("topic {prefix}requested does not exist"))
                && why.contains("sluice migrate")
                && why.contains("2 partitions"),
            "{why}"
        ),
        other => panic!("expected a missing topic to stop the start, got {other:?}"),
    }
    // Still missing: the look at the metadata did not have it created.
    match KafkaBus::connect(never(2)).await {
        Err(BusError::InvalidConfig {
            key: "create_topics",
            ..
        }) => {}
        other => panic!("the topic appeared without being created: {other:?}"),
    }
    let created = connect(KafkaConfig {
        create_topics: CreateTopics::IfMissing,
        ..config(prefix.clone(), 2)
    })
    .await;
    let _topics = Topics(created.clone());
    assert_eq!(
        created.partitions(Topic::Requested).await.expect("count"),
        2
    );
    match KafkaBus::connect(never(3)).await {
        Err(BusError::InvalidConfig {
            key: "create_topics",
            why,
        }) => assert!(
            why.contains(&format!("topic {prefix}requested has 2 partitions"))
                && why.contains("bus.partitions"),
            "{why}"
        ),
        other => panic!("expected another partition count to stop the start, got {other:?}"),
    }
    let found = connect(never(2)).await;
    assert_eq!(found.partitions(Topic::Dlq).await.expect("count"), 2);
    found.close().await;
}

/// Consumer groups follow the group prefix: derived from the topic prefix unless configured.
#[test]
fn group_ids_follow_the_group_prefix() {
    let derived = config("staging.".to_owned(), 1);
    assert_eq!(derived.group_prefix(), "staging-");
    let set = KafkaConfig {
        group_prefix: Some("team-a.".to_owned()),
        ..derived
    };
    assert_eq!(set.group_prefix(), "team-a.");
    assert_eq!(
        sluice_bus::Group::Dispatchers.id(&set.group_prefix()),
        "team-a.dispatcher"
    );
}

/// Nothing listening at the brokers: `connect` fails within its timeout, naming the brokers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_broker_is_a_clear_error() {
    let started = Instant::now();
    let result = KafkaBus::connect(KafkaConfig {
        brokers: "127.0.0.1:1".to_owned(),
        start_timeout: Duration::from_secs(2),
        ..config(fresh_prefix(), 1)
    })
    .await;
    match result {
        Err(BusError::Backend { op, topic, .. }) => {
            assert_eq!(op, "connect");
            assert!(topic.contains("127.0.0.1:1"), "{topic:?} names the brokers");
        }
        other => panic!("expected a connect error, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// Waits until `a` and `b` own disjoint, non-empty sets of partitions that cover the topic.
async fn settle(a: &Subscription, b: &Subscription, partitions: u32) {
    let all: BTreeSet<u32> = (0..partitions).collect();
    let deadline = Instant::now() + WAIT;
    loop {
        let (owned_a, owned_b): (BTreeSet<u32>, BTreeSet<u32>) = (
            a.assignment().into_iter().collect(),
            b.assignment().into_iter().collect(),
        );
        if !owned_a.is_empty()
            && !owned_b.is_empty()
            && owned_a.is_disjoint(&owned_b)
            && owned_a.union(&owned_b).copied().collect::<BTreeSet<_>>() == all
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle: {owned_a:?} and {owned_b:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// A message handed out before a rebalance and acknowledged after it is refused with
/// `Revoked` when its partition moved — and delivered again to the partition's new owner, where
/// the acknowledgement is taken — while a message of a partition the member kept (cooperative
/// rebalancing moves only what changes owner) is acknowledged as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ack_after_a_rebalance_is_refused_and_the_message_redelivered() {
    let bus = connect(config(fresh_prefix(), 2)).await;
    let _topics = Topics(bus.clone());
    let group = fresh_group("stale");
    let mut a = bus
        .subscribe(Topic::Unknown, &group, "m-a")
        .await
        .expect("subscribe");
    for key in keys_by_partition(&format!("r-stale-{}", uuid::Uuid::new_v4().simple()), 2) {
        bus.publish(Topic::Unknown, &key, b"held".to_vec(), Vec::new())
            .await
            .expect("publish");
    }
    let held = [
        next_within(&mut a, "the messages before the rebalance").await,
        next_within(&mut a, "the messages before the rebalance").await,
    ];

    let mut b = bus
        .subscribe(Topic::Unknown, &group, "m-b")
        .await
        .expect("subscribe");
    settle(&a, &b, 2).await;
    let moved = b.assignment();
    assert_eq!(moved.len(), 1, "one of the two partitions moves to b");
    let mut revoked = None;
    for delivery in held {
        if moved.contains(&delivery.partition) {
            match delivery.ack().await {
                Err(BusError::Revoked {
                    partition, offset, ..
                }) => assert_eq!((partition, offset), (delivery.partition, delivery.offset)),
                other => panic!("expected Revoked, got {other:?}"),
            }
            revoked = Some(delivery);
        } else {
            delivery
                .ack()
                .await
                .expect("a partition a keeps is not revoked (cooperative rebalancing)");
        }
    }
    let held = revoked.expect("the moved partition's message was held");

    let deadline = Instant::now() + WAIT;
    let again = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let delivery = tokio::select! {
            d = a.next() => d,
            d = b.next() => d,
            () = sleep(remaining) => panic!("the revoked message was not delivered again"),
        }
        .expect("the bus stays open");
        if (delivery.partition, delivery.offset) == (held.partition, held.offset) {
            break delivery;
        }
    };
    assert_eq!(text(&again), "held");
    again
        .ack()
        .await
        .expect("the new owner's acknowledgement is taken");
    again.ack().await.expect("acknowledging twice is harmless");
}

/// Keys spread over partitions, nothing acknowledged: one message per partition is handed out,
/// and acknowledging one releases exactly that partition's next message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_in_flight_per_partition() {
    let bus = connect(config(fresh_prefix(), 3)).await;
    let _topics = Topics(bus.clone());
    let keys = keys_by_partition("r-inflight", 3);
    for round in 0..2 {
        for key in &keys {
            bus.publish(
                Topic::Compensate,
                key,
                format!("{key}#{round}").into_bytes(),
                Vec::new(),
            )
            .await
            .expect("publish");
        }
    }
    let mut sub = bus
        .subscribe(Topic::Compensate, &fresh_group("inflight"), "m-1")
        .await
        .expect("subscribe");
    let mut first = Vec::new();
    for _ in 0..3 {
        first.push(next_within(&mut sub, "each partition's first message").await);
    }
    let partitions: BTreeSet<u32> = first.iter().map(|d| d.partition).collect();
    assert_eq!(partitions.len(), 3, "one message from each partition");
    assert!(first.iter().all(|d| text(d).ends_with("#0")));
    if let Ok(extra) = timeout(Duration::from_millis(750), sub.next()).await {
        panic!(
            "{:?} was handed out with its partition busy",
            extra.map(|d| text(&d))
        );
    }
    first[1].ack().await.expect("ack");
    let next = next_within(&mut sub, "the released partition's next message").await;
    assert_eq!(next.partition, first[1].partition);
    assert!(text(&next).ends_with("#1"));
    first[1]
        .ack()
        .await
        .expect("acknowledging twice is harmless");
}

/// `close` ends every subscription (`next` returns `None`), refuses later acknowledgements,
/// publishes and subscriptions, and keeps what was acknowledged: a new bus resumes after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_commits_and_ends_subscriptions() {
    let prefix = fresh_prefix();
    let bus = connect(config(prefix.clone(), 1)).await;
    let _topics = Topics(bus.clone());
    let group = fresh_group("close");
    for payload in ["m0", "m1", "m2"] {
        bus.publish(Topic::Events, "r-close", payload.into(), Vec::new())
            .await
            .expect("publish");
    }
    let mut sub = bus
        .subscribe(Topic::Events, &group, "m-1")
        .await
        .expect("subscribe");
    let m0 = next_within(&mut sub, "m0").await;
    m0.ack().await.expect("ack");
    let m1 = next_within(&mut sub, "m1").await;

    timeout(WAIT, bus.close()).await.expect("close finishes");
    assert!(
        timeout(WAIT, sub.next())
            .await
            .expect("next ends")
            .is_none()
    );
    assert!(matches!(m1.ack().await, Err(BusError::Revoked { .. })));
    assert!(matches!(
        bus.publish(Topic::Events, "r-close", b"late".to_vec(), Vec::new())
            .await,
        Err(BusError::Closed)
    ));
    assert!(matches!(
        bus.subscribe(Topic::Events, &group, "m-2").await,
        Err(BusError::Closed)
    ));

    let reopened = connect(config(prefix, 1)).await;
    let mut again = reopened
        .subscribe(Topic::Events, &group, "m-2")
        .await
        .expect("subscribe");
    let resumed = next_within(&mut again, "the first unacknowledged message").await;
    assert_eq!(text(&resumed), "m1");
    resumed.ack().await.expect("ack");
}

/// Publishes `count` messages `m<i>` with `key`, many at a time; returns their offsets in
/// publishing order.
async fn publish_backlog(bus: &KafkaBus, topic: Topic, key: &str, count: usize) -> Vec<u64> {
    let mut offsets = Vec::with_capacity(count);
    for chunk in (0..count).collect::<Vec<_>>().chunks(200) {
        let mut tasks = tokio::task::JoinSet::new();
        for &i in chunk {
            let (bus, key) = (bus.clone(), key.to_owned());
            tasks.spawn(async move {
                let at = bus
                    .publish(topic, &key, format!("m{i}").into_bytes(), Vec::new())
                    .await
                    .expect("publish");
                (i, at.offset)
            });
        }
        let mut done: Vec<(usize, u64)> = tasks.join_all().await;
        done.sort_unstable();
        offsets.extend(done.into_iter().map(|(_, offset)| offset));
    }
    offsets
}

/// A backlog far larger than a partition's queue: the partition is paused and resumed many
/// times, and every message is still handed out once, in offset order, without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_pauses_and_resumes_without_gaps_or_repeats() {
    const MESSAGES: usize = 3_000;
    let bus = connect(config(fresh_prefix(), 1)).await;
    let _topics = Topics(bus.clone());
    publish_backlog(&bus, Topic::Requested, "r-backlog", MESSAGES).await;

    let mut sub = bus
        .subscribe(Topic::Requested, &fresh_group("backlog"), "m-1")
        .await
        .expect("subscribe");
    let mut offsets = Vec::with_capacity(MESSAGES);
    while offsets.len() < MESSAGES {
        let delivery = next_within(&mut sub, "the rest of the backlog").await;
        offsets.push(delivery.offset);
        delivery.ack().await.expect("ack");
    }
    let expected: Vec<u64> = (offsets[0]..offsets[0] + MESSAGES as u64).collect();
    assert_eq!(offsets, expected, "handed out in order, each once");
    if let Ok(extra) = timeout(Duration::from_millis(750), sub.next()).await {
        panic!("an extra delivery: {:?}", extra.map(|d| d.offset));
    }
}

/// A partition paused (its queue full behind an unacknowledged message) when a rebalance takes
/// it away is fetched again by whoever gets it — librdkafka keeps an application pause across
/// a reassignment, so the bus resumes what it is assigned. Both partitions have a backlog, so
/// whichever moves was paused; the one that stays keeps its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_paused_at_a_rebalance_is_fetched_after_it() {
    const MESSAGES: usize = 2_000;
    let bus = connect(config(fresh_prefix(), 2)).await;
    let _topics = Topics(bus.clone());
    let mut published = BTreeSet::new();
    for key in keys_by_partition("r-paused", 2) {
        let partition = partition_for(key.as_bytes(), 2);
        for offset in publish_backlog(&bus, Topic::Events, &key, MESSAGES).await {
            published.insert((partition, offset));
        }
    }

    let group = fresh_group("paused");
    let mut a = bus
        .subscribe(Topic::Events, &group, "m-a")
        .await
        .expect("subscribe");
    let held = [
        next_within(&mut a, "the first messages").await,
        next_within(&mut a, "the first messages").await,
    ];
    // Nothing else of either partition may come while they are in flight; meanwhile the
    // member fetches past its queue limit and pauses both.
    if let Ok(extra) = timeout(Duration::from_millis(750), a.next()).await {
        panic!(
            "{:?} was handed out with its partition busy",
            extra.map(|d| (d.partition, d.offset))
        );
    }
    let mut b = bus
        .subscribe(Topic::Events, &group, "m-b")
        .await
        .expect("subscribe");
    settle(&a, &b, 2).await;
    let moved = b.assignment();
    let mut seen = BTreeSet::new();
    for delivery in held {
        if moved.contains(&delivery.partition) {
            assert!(matches!(
                delivery.ack().await,
                Err(BusError::Revoked { .. })
            ));
        } else {
            delivery.ack().await.expect("the partition a kept");
            seen.insert((delivery.partition, delivery.offset));
        }
    }

    let deadline = Instant::now() + WAIT;
    while seen.len() < published.len() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let delivery = tokio::select! {
            d = a.next() => d,
            d = b.next() => d,
            () = sleep(remaining) => panic!(
                "only {} of {} messages after the rebalance", seen.len(), published.len()
            ),
        }
        .expect("the bus stays open");
        seen.insert((delivery.partition, delivery.offset));
        delivery.ack().await.expect("ack");
    }
    assert_eq!(seen, published);
}

/// What a member acknowledged before a rebalance is committed by the time the partition has a
/// new owner, periodic commits aside (their interval is ten minutes here): nothing acknowledged
/// is delivered again, whoever owns the partition afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_offsets_are_committed_on_revoke() {
    let mut config = config(fresh_prefix(), 2);
    config
        .extra
        .insert("auto.commit.interval.ms".to_owned(), "600000".to_owned());
    let bus = connect(config).await;
    let _topics = Topics(bus.clone());
    // A key on each partition: whichever partition moves was acknowledged up to m4.
    let keys = keys_by_partition("r-revoke", 2);
    let group = fresh_group("revoke");
    let mut a = bus
        .subscribe(Topic::Requested, &group, "m-a")
        .await
        .expect("subscribe");
    for i in 0..5 {
        for key in &keys {
            bus.publish(
                Topic::Requested,
                key,
                format!("m{i}").into_bytes(),
                Vec::new(),
            )
            .await
            .expect("publish");
        }
    }
    for _ in 0..10 {
        let delivery = next_within(&mut a, "the messages before the rebalance").await;
        delivery.ack().await.expect("ack");
    }
    let mut b = bus
        .subscribe(Topic::Requested, &group, "m-b")
        .await
        .expect("subscribe");
    settle(&a, &b, 2).await;
    for key in &keys {
        bus.publish(Topic::Requested, key, b"m5".to_vec(), Vec::new())
            .await
            .expect("publish");
    }
    for _ in &keys {
        let next = tokio::select! {
            d = a.next() => d,
            d = b.next() => d,
            () = sleep(WAIT) => panic!("m5 did not arrive"),
        }
        .expect("the bus stays open");
        assert_eq!(
            text(&next),
            "m5",
            "an acknowledged message of partition {} came back",
            next.partition
        );
        next.ack().await.expect("ack");
    }
}

/// The consumer groups the broker knows.
fn groups() -> BTreeSet<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let admin: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("a client");
    admin
        .fetch_group_list(None, Duration::from_secs(10))
        .expect("the group list")
        .groups()
        .iter()
        .map(|g| g.name().to_owned())
        .collect()
}

/// What a watch hands out within `quiet` of its last message.
async fn drain(watch: &mut Subscription, quiet: Duration) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(Some(delivery)) = timeout(quiet, watch.next()).await {
        delivery.ack().await.expect("a watch's ack is a no-op");
        seen.push(text(&delivery));
    }
    seen
}

/// A producer watching `events` (issue 15): every start used to join a new group reading from
/// the earliest offset, replaying the whole topic and leaving the group behind. A watch reads
/// from the end, in no group: a restart replays nothing, and the broker lists no new group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reads_from_the_end_and_leaves_no_group_behind() {
    let bus = connect(config(fresh_prefix(), 4)).await;
    let _topics = Topics(bus.clone());
    for i in 0..20 {
        bus.publish(
            Topic::Events,
            &format!("r-{i}"),
            format!("old-{i}").into_bytes(),
            vec![],
        )
        .await
        .expect("publish");
    }
    // What a producer start did before: a group of its own from the earliest offset.
    let old_way = fresh_group("sluice-producer");
    let mut joined = bus
        .subscribe(Topic::Events, &old_way, "producer-0")
        .await
        .expect("subscribe");
    let replayed = drain(&mut joined, Duration::from_secs(8)).await;
    assert_eq!(replayed.len(), 20, "a new group replays the whole topic");
    drop(joined);
    assert!(
        groups().contains(&old_way),
        "and stays behind on the broker"
    );

    let before = groups();
    for start in 0..2 {
        let mut watch = bus.watch(Topic::Events, "producer-1").await.expect("watch");
        assert_eq!(watch.assignment().len(), 4, "every partition");
        // The assignment takes effect on the first fetch: give it a moment, then publish.
        assert!(
            drain(&mut watch, Duration::from_secs(2)).await.is_empty(),
            "start {start}: nothing published before the watch is replayed"
        );
        let fresh: BTreeSet<String> = (0..5).map(|i| format!("new-{start}-{i}")).collect();
        for (i, payload) in fresh.iter().enumerate() {
            bus.publish(
                Topic::Events,
                &format!("r-{i}"),
                payload.clone().into_bytes(),
                vec![],
            )
            .await
            .expect("publish");
        }
        let seen: BTreeSet<String> = drain(&mut watch, Duration::from_secs(3))
            .await
            .into_iter()
            .collect();
        assert_eq!(
            seen, fresh,
            "start {start}: exactly what came after the watch"
        );
        drop(watch);
    }
    let after = groups();
    // Other tests of this binary make groups of their own meanwhile; a watch's would name it.
    let new: Vec<&String> = after
        .difference(&before)
        .filter(|g| g.contains("watch") || g.contains("producer-1"))
        .collect();
    assert!(new.is_empty(), "watches left groups behind: {new:?}");
}

/// `group`'s depth on `requested` once `done` holds for it, or the last reading after 10 s.
/// A reading may fail while fresh topics elect their leaders; the producer reads again a
/// second later, and so does this.
async fn depth_when(bus: &KafkaBus, group: &str, done: impl Fn(&QueueDepth) -> bool) -> QueueDepth {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match bus.queue_depth(Topic::Requested, group).await {
            Ok(Some(depth)) if done(&depth) || Instant::now() > deadline => return depth,
            Ok(None) => panic!("Kafka measures a group's queue"),
            Err(e) if Instant::now() > deadline => panic!("no reading in 10 s: {e}"),
            _ => sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A group's queue, as a producer's admission reads it: everything published is waiting until
/// the group commits; what it acknowledges is committed within about a second and counted as
/// taken; reading never joins the group (its one member keeps every partition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_depth_counts_what_the_group_has_not_committed() {
    let bus = connect(config(fresh_prefix(), 4)).await;
    let _topics = Topics(bus.clone());
    let group = fresh_group("lag");
    let none = depth_when(&bus, &group, |_| true).await;
    assert_eq!((none.waiting, none.taken), (0, 0), "an empty topic");
    for i in 0..30 {
        bus.publish(Topic::Requested, &format!("r-{i}"), b"m".to_vec(), vec![])
            .await
            .expect("publish");
    }
    let all = depth_when(&bus, &group, |_| true).await;
    assert_eq!(
        (all.waiting, all.taken),
        (30, 0),
        "no commit yet: all waiting"
    );

    let mut sub = bus
        .subscribe(Topic::Requested, &group, "m-1")
        .await
        .expect("subscribe");
    for _ in 0..10 {
        next_within(&mut sub, "a request")
            .await
            .ack()
            .await
            .expect("ack");
    }
    // Committed within the auto-commit interval (1 s).
    let depth = depth_when(&bus, &group, |d| d.taken >= 10).await;
    assert_eq!(depth.taken, 10, "the ten acknowledged are taken");
    assert_eq!(depth.waiting, 20, "the rest wait");
    assert_eq!(
        sub.assignment().len(),
        4,
        "reading the offsets did not join the group"
    );
    assert!(matches!(
        bus.queue_depth(Topic::Requested, "").await,
        Err(BusError::InvalidGroup { .. })
    ));
}
