//! The embedded bus: the shared contract suite, then what only the in-process bus promises —
//! exact ownership hand-over on rebalances, the compaction rule, closing, limits, and delivery
//! under member churn and cancelled waits.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_bus::contract::{QUIET, fresh_prefix, keys_by_partition, next_within};
use sluice_bus::{Bus, BusError, Delivery, EmbeddedBus, EmbeddedConfig, Subscription, Topic};
use tokio::time::timeout;

async fn fresh(prefix: String) -> (Arc<dyn Bus>, ()) {
    let bus = EmbeddedBus::new(EmbeddedConfig {
        prefix,
        ..EmbeddedConfig::default()
    })
    .expect("valid configuration");
    (Arc::new(bus), ())
}

sluice_bus::bus_contract_tests!(fresh);

fn bus_with(partitions: u32) -> EmbeddedBus {
    EmbeddedBus::new(EmbeddedConfig {
        prefix: fresh_prefix(),
        partitions,
        ..EmbeddedConfig::default()
    })
    .expect("valid configuration")
}

fn text(delivery: &Delivery) -> String {
    String::from_utf8_lossy(delivery.payload()).into_owned()
}

async fn join(bus: &EmbeddedBus, topic: Topic, group: &str, member: &str) -> Subscription {
    bus.subscribe(topic, group, member)
        .await
        .expect("subscribe")
}

async fn publish(bus: &EmbeddedBus, topic: Topic, key: &str, payload: &str) {
    bus.publish(topic, key, payload.as_bytes().to_vec(), Vec::new())
        .await
        .expect("publish");
}

/// Asserts that nothing is handed to `sub` for a while.
async fn assert_quiet(sub: &mut Subscription) {
    if let Ok(got) = timeout(QUIET, sub.next()).await {
        panic!(
            "{} expected nothing, got {:?}",
            sub.member(),
            got.map(|d| text(&d))
        );
    }
}

#[tokio::test]
async fn defaults_follow_the_design() {
    let bus = EmbeddedBus::new(EmbeddedConfig::default()).expect("defaults are valid");
    assert_eq!(bus.prefix(), "sluice.");
    assert_eq!(bus.topic_name(Topic::Requested), "sluice.requested");
    assert_eq!(bus.topic_name(Topic::Dlq), "sluice.dlq");
    for topic in Topic::ALL {
        assert_eq!(bus.partitions(topic).await.expect("partitions"), 8);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_partition_goes_to_its_new_owner_and_fences_the_old_one() {
    let bus = bus_with(2);
    let topic = Topic::Requested;
    let keys = keys_by_partition("r-move", 2);
    let mut a = join(&bus, topic, "g", "a").await;
    publish(&bus, topic, &keys[1], "m").await;
    let at_a = next_within(&mut a, "m for a").await;
    assert_eq!(at_a.partition, 1);

    // b joins and takes partition 1 (round robin: 0 -> a, 1 -> b) with the message in flight.
    let mut b = join(&bus, topic, "g", "b").await;
    assert_eq!((a.assignment(), b.assignment()), (vec![0], vec![1]));
    let at_b = next_within(&mut b, "m redelivered to b").await;
    assert_eq!((at_b.partition, at_b.offset), (at_a.partition, at_a.offset));
    assert_eq!(at_b.message, at_a.message);

    let err = at_a.ack().await.expect_err("a no longer owns partition 1");
    match &err {
        BusError::Revoked {
            topic: name,
            partition: 1,
            offset,
            ..
        } => {
            assert_eq!(name, &bus.topic_name(topic));
            assert_eq!(*offset, at_a.offset);
        }
        other => panic!("expected revoked, got {other:?}"),
    }
    let shown = err.to_string();
    assert!(shown.starts_with("partition 1 of "), "{shown}");
    assert!(
        shown.contains(&format!("offset {}", at_a.offset)),
        "{shown}"
    );

    b.ack(&at_b).await.expect("b owns it");
    // Once committed, a late acknowledgement of the same offset is harmless.
    at_a.ack()
        .await
        .expect("already acknowledged by the new owner");
    at_b.ack().await.expect("acknowledging twice is harmless");
    assert_eq!(bus.lag(topic, "g"), Some(0));
    assert_quiet(&mut a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_that_keeps_its_owner_keeps_its_message_in_flight() {
    let bus = bus_with(2);
    let topic = Topic::Events;
    let keys = keys_by_partition("r-keep", 2);
    let mut a = join(&bus, topic, "g", "a").await;
    publish(&bus, topic, &keys[0], "first").await;
    publish(&bus, topic, &keys[0], "second").await;
    let first = next_within(&mut a, "first").await;
    assert_eq!(first.partition, 0);

    let mut b = join(&bus, topic, "g", "b").await;
    assert_eq!(a.assignment(), vec![0]);
    // No spurious redelivery of `first`, and `second` still waits for its acknowledgement.
    assert_quiet(&mut a).await;
    assert_quiet(&mut b).await;
    first.ack().await.expect("a still owns partition 0");
    assert_eq!(text(&next_within(&mut a, "second").await), "second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_leaves_alone_fences_its_acks_and_the_group_resumes() {
    let bus = bus_with(4);
    let topic = Topic::Unknown;
    let mut a = join(&bus, topic, "g", "a").await;
    publish(&bus, topic, "r-1", "m").await;
    let held = next_within(&mut a, "m").await;
    drop(a);
    assert!(matches!(held.ack().await, Err(BusError::Revoked { .. })));
    assert_eq!(bus.lag(topic, "g"), Some(1));
    let mut again = join(&bus, topic, "g", "a").await;
    let redelivered = next_within(&mut again, "m again").await;
    assert_eq!(redelivered.offset, held.offset);
    redelivered.ack().await.expect("owner");
    assert_eq!(bus.lag(topic, "g"), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_prefixes_are_dropped_once_every_group_is_past_them() {
    let bus = bus_with(4);
    let topic = Topic::Events;

    // No group yet: everything is kept for whoever subscribes first.
    for i in 0..10 {
        publish(&bus, topic, &format!("r-{i}"), &format!("early-{i}")).await;
    }
    assert_eq!(bus.retained(topic), 10);
    let mut first = join(&bus, topic, "first", "m").await;
    let mut second = join(&bus, topic, "second", "m").await;
    for i in 10..100 {
        publish(&bus, topic, &format!("r-{}", i % 10), &format!("m-{i}")).await;
    }
    assert_eq!(bus.retained(topic), 100);

    let mut got = BTreeSet::new();
    for _ in 0..100 {
        let delivery = next_within(&mut first, "first's messages").await;
        got.insert(text(&delivery));
        delivery.ack().await.expect("ack");
    }
    assert_eq!(
        got.len(),
        100,
        "the early messages reached the first group too"
    );
    assert_eq!(bus.lag(topic, "first"), Some(0));
    // The second group has acknowledged nothing: everything is still held for it.
    assert_eq!(bus.retained(topic), 100);

    // A group whose members all left still holds back compaction: it may come back.
    drop(second);
    assert_eq!(bus.retained(topic), 100);
    second = join(&bus, topic, "second", "m").await;
    for _ in 0..100 {
        let delivery = next_within(&mut second, "second's messages").await;
        delivery.ack().await.expect("ack");
    }
    assert_eq!(bus.retained(topic), 0, "both groups are past everything");
    assert_eq!(bus.lag(topic, "second"), Some(0));

    // A group that arrives after compaction starts at the oldest message still held.
    publish(&bus, topic, "r-1", "late").await;
    let mut third = join(&bus, topic, "third", "m").await;
    assert_eq!(text(&next_within(&mut third, "late").await), "late");
    assert_eq!(bus.lag(topic, "never-subscribed"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_ends_waiting_subscriptions_and_refuses_work() {
    let bus = bus_with(2);
    let topic = Topic::Compensate;
    let mut sub = join(&bus, topic, "g", "m").await;
    publish(&bus, topic, "r-1", "m").await;
    let held = next_within(&mut sub, "m").await;
    let waiting = tokio::spawn(async move { sub.next().await.map(|d| text(&d)) });
    tokio::task::yield_now().await;
    bus.close();
    let ended = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("close wakes a waiting subscription")
        .expect("join");
    assert_eq!(ended, None);
    assert!(matches!(
        bus.publish(topic, "r-1", vec![], vec![]).await,
        Err(BusError::Closed)
    ));
    assert!(matches!(
        bus.subscribe(topic, "g", "m").await,
        Err(BusError::Closed)
    ));
    assert!(matches!(held.ack().await, Err(BusError::Closed)));
}

#[tokio::test]
async fn oversized_messages_are_refused_and_not_stored() {
    let bus = EmbeddedBus::new(EmbeddedConfig {
        max_message_bytes: 16,
        ..EmbeddedConfig::default()
    })
    .expect("valid configuration");
    // key 4 + payload 8 + header 2 + 2 = 16: accepted
    bus.publish(
        Topic::Dlq,
        "r-ok",
        vec![0; 8],
        vec![("h1".into(), vec![0; 2])],
    )
    .await
    .expect("exactly at the limit");
    match bus
        .publish(Topic::Dlq, "r-big", vec![0; 12], Vec::new())
        .await
    {
        Err(BusError::MessageTooLarge {
            topic, bytes, max, ..
        }) => {
            assert_eq!(topic, "sluice.dlq");
            assert_eq!((bytes, max), (17, 16));
        }
        other => panic!("expected too large, got {other:?}"),
    }
    assert_eq!(bus.retained(Topic::Dlq), 1);
    assert!(matches!(
        bus.subscribe(Topic::Dlq, "", "m").await,
        Err(BusError::InvalidGroup { .. })
    ));
}

/// Members keep joining and leaving — each leaves after a few messages, the last of them
/// unacknowledged — while 2,000 messages over 40 keys are consumed: every message arrives, and
/// no key's message arrives before all its earlier ones did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn churning_members_lose_nothing_and_keep_key_order() {
    const KEYS: u32 = 40;
    const MESSAGES: u32 = 2_000;
    let bus = bus_with(8);
    let topic = Topic::Requested;

    #[derive(Default)]
    struct Seen {
        next: HashMap<String, u32>,
        firsts: u32,
        redeliveries: u32,
        gaps: Vec<String>,
    }
    let seen = Arc::new(Mutex::new(Seen::default()));

    for i in 0..MESSAGES {
        let key = format!("r-churn-{}", i % KEYS);
        publish(&bus, topic, &key, &format!("{key}#{}", i / KEYS)).await;
    }

    let mut workers = Vec::new();
    for worker in 0..3u32 {
        let bus = bus.clone();
        let seen = Arc::clone(&seen);
        workers.push(tokio::spawn(async move {
            let mut round = 0u32;
            loop {
                round += 1;
                let member = format!("w{worker}-{round}");
                let mut sub = join(&bus, topic, "churn", &member).await;
                // Handle a few messages, then leave with the last one unacknowledged.
                let budget = 5 + (worker * 7 + round * 13) % 40;
                for handled in 0..budget {
                    let Ok(Some(delivery)) = timeout(Duration::from_secs(3), sub.next()).await
                    else {
                        return;
                    };
                    let payload = text(&delivery);
                    let (key, seq) = payload.rsplit_once('#').expect("key#seq");
                    let seq: u32 = seq.parse().expect("seq");
                    {
                        let mut seen = seen.lock().expect("no panics while held");
                        let next = seen.next.entry(key.to_owned()).or_insert(0);
                        if seq == *next {
                            *next += 1;
                            seen.firsts += 1;
                        } else if seq < *next {
                            seen.redeliveries += 1;
                        } else {
                            let expected = *next;
                            seen.gaps.push(format!("{key}: #{seq} before #{expected}"));
                        }
                    }
                    if handled + 1 < budget {
                        match delivery.ack().await {
                            Ok(()) | Err(BusError::Revoked { .. }) => {}
                            Err(e) => panic!("ack: {e}"),
                        }
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker.await.expect("worker");
    }
    let seen = seen.lock().expect("no panics while held");
    assert!(seen.gaps.is_empty(), "order broken: {:?}", seen.gaps);
    assert_eq!(seen.firsts, MESSAGES, "every message arrived");
    assert!(seen.next.values().all(|&n| n == MESSAGES / KEYS));
    assert!(
        seen.redeliveries > 0,
        "members left with messages in flight, which must come back"
    );
}

/// `next` raced against a very short timeout over and over: the cancelled waits lose nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_lose_nothing() {
    const MESSAGES: usize = 300;
    let bus = bus_with(4);
    let topic = Topic::Events;
    let mut sub = join(&bus, topic, "g", "m").await;
    let publisher = {
        let bus = bus.clone();
        tokio::spawn(async move {
            for i in 0..MESSAGES {
                publish(&bus, topic, &format!("r-{}", i % 7), &format!("m{i}")).await;
                if i % 10 == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        })
    };
    let mut got = Vec::new();
    let mut cancelled = 0u32;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < MESSAGES {
        assert!(tokio::time::Instant::now() < deadline, "got {}", got.len());
        match timeout(Duration::from_micros(200), sub.next()).await {
            Ok(Some(delivery)) => {
                got.push(text(&delivery));
                delivery.ack().await.expect("ack");
            }
            Ok(None) => panic!("the bus stays open"),
            Err(_) => cancelled += 1,
        }
    }
    publisher.await.expect("publisher");
    assert!(cancelled > 0, "some waits were cancelled");
    let distinct: BTreeSet<_> = got.iter().collect();
    assert_eq!(distinct.len(), MESSAGES, "no duplicates, none lost");
    assert_eq!(bus.retained(topic), 0);
}
