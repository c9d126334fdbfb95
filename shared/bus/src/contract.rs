//! The bus contract suite: written once, run against every [`Bus`] implementation.
//!
//! Each check is a public async function taking a fresh bus; [`bus_contract_tests!`] turns the
//! whole list into one `#[tokio::test]` per check for an implementation:
//!
//! ```text
//! sluice_bus::bus_contract_tests!(|prefix: String| async move { my_bus(prefix).await });
//! ```
//!
//! The maker is given a topic prefix no other check uses (`sluice-test-<uuid>.`) and returns
//! `(Arc<dyn Bus>, keep_alive)`; `keep_alive` (topics to delete, a container) is dropped when
//! the test ends. Checks use their own group names too, so implementations backed by a shared
//! broker can run them side by side.
//!
//! The checks assume only what the contract promises: the partition count is what
//! [`Bus::partitions`] says (some checks need at least two), a broker may take seconds to
//! rebalance or deliver, and a message may be delivered twice around a rebalance. Waits are
//! bounded by [`WAIT`]; a check never sleeps to assert that something happened — the only
//! fixed wait, [`QUIET`], asserts that something did *not*.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep, timeout};
use uuid::Uuid;

use crate::partitioner::partition_for;
use crate::{Bus, BusError, Delivery, Header, Message, Published, Subscription, Topic};

/// Longest wait for something a check expects to happen.
pub const WAIT: Duration = Duration::from_secs(30);

/// How long a check watches for something that must not happen.
pub const QUIET: Duration = Duration::from_millis(750);

/// Generates one test per contract check for the bus made by `$make`.
#[macro_export]
macro_rules! bus_contract_tests {
    ($make:expr) => {
        $crate::bus_contract_tests!(@each $make;
            publish_then_consume_keeps_key_payload_and_headers,
            per_key_order_holds_across_two_members,
            a_slow_partition_does_not_hold_up_the_others,
            every_group_gets_every_message,
            an_unacked_message_is_redelivered_to_a_new_subscription,
            an_unacked_message_moves_to_the_remaining_member,
            acked_messages_are_not_redelivered_after_a_restart,
            keys_are_partitioned_with_murmur2,
            two_members_split_the_partitions
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (bus, _keep_alive) = ($make)($crate::contract::fresh_prefix()).await;
                $crate::contract::$name(bus).await;
            }
        )*
    };
}

/// A topic prefix no other check (or concurrent test process) uses.
pub fn fresh_prefix() -> String {
    format!("sluice-test-{}.", Uuid::new_v4().simple())
}

/// A consumer group name no other check uses.
pub fn fresh_group(label: &str) -> String {
    format!("{label}-{}", Uuid::new_v4().simple())
}

/// For each partition of `partitions`, a key (`<label>-<n>`) that lands on it.
pub fn keys_by_partition(label: &str, partitions: u32) -> Vec<String> {
    let mut keys: Vec<Option<String>> = vec![None; partitions as usize];
    let mut missing = keys.len();
    let mut n = 0u64;
    while missing > 0 {
        let key = format!("{label}-{n}");
        let slot = &mut keys[partition_for(key.as_bytes(), partitions) as usize];
        if slot.is_none() {
            *slot = Some(key);
            missing -= 1;
        }
        n += 1;
    }
    keys.into_iter().flatten().collect()
}

/// Waits up to [`WAIT`] for the next delivery of `subscription`.
pub async fn next_within(subscription: &mut Subscription, what: &str) -> Delivery {
    match timeout(WAIT, subscription.next()).await {
        Ok(Some(delivery)) => delivery,
        Ok(None) => panic!("the bus closed while waiting for {what}"),
        Err(_) => panic!("no delivery within {WAIT:?} while waiting for {what}"),
    }
}

async fn subscribe(bus: &dyn Bus, topic: Topic, group: &str, member: &str) -> Subscription {
    bus.subscribe(topic, group, member)
        .await
        .unwrap_or_else(|e| panic!("subscribe {member} to {group}: {e}"))
}

async fn publish(bus: &dyn Bus, topic: Topic, key: &str, payload: impl Into<Vec<u8>>) -> Published {
    bus.publish(topic, key, payload.into(), Vec::new())
        .await
        .unwrap_or_else(|e| panic!("publish {key}: {e}"))
}

async fn ack(delivery: &Delivery) {
    delivery
        .ack()
        .await
        .unwrap_or_else(|e| panic!("ack {}@{}: {e}", delivery.partition, delivery.offset));
}

async fn partitions(bus: &dyn Bus, topic: Topic) -> u32 {
    let n = bus.partitions(topic).await.expect("partitions");
    assert!(n >= 1, "a topic has at least one partition");
    n
}

fn text(delivery: &Delivery) -> String {
    String::from_utf8_lossy(delivery.payload()).into_owned()
}

/// A message comes back exactly as it was published: topic, key, binary payload (NUL and
/// non-UTF-8 bytes included), headers in order with repeated names and empty values, and
/// where it was stored.
pub async fn publish_then_consume_keeps_key_payload_and_headers(bus: Arc<dyn Bus>) {
    let topic = Topic::Requested;
    let group = fresh_group("intact");
    let mut sub = subscribe(&*bus, topic, &group, "m-1").await;

    let payload = vec![0u8, 159, 146, 150, 255, b'{', 0];
    let headers: Vec<Header> = vec![
        ("ce_type".into(), b"dev.sluice.effect.confirmed".to_vec()),
        ("ce_id".into(), vec![0, 255, 1]),
        ("dup".into(), b"1".to_vec()),
        ("dup".into(), b"2".to_vec()),
        ("empty".into(), Vec::new()),
    ];
    let key = "r-intact.1:x_y";
    let published = bus
        .publish(topic, key, payload.clone(), headers.clone())
        .await
        .expect("publish");
    let n = partitions(&*bus, topic).await;
    assert_eq!(published.partition, partition_for(key.as_bytes(), n));

    let first = next_within(&mut sub, "the published message").await;
    assert_eq!(
        *first.message,
        Message {
            topic,
            key: key.into(),
            payload,
            headers,
        }
    );
    assert_eq!(
        (first.partition, first.offset),
        (published.partition, published.offset)
    );
    assert_eq!(first.message.header("dup"), Some(&b"2"[..]));
    ack(&first).await;

    // An empty payload without headers stays empty, after the first on the same partition.
    let second_at = bus
        .publish(topic, key, Vec::new(), Vec::new())
        .await
        .expect("publish");
    let second = next_within(&mut sub, "the empty message").await;
    assert_eq!(second.key(), key);
    assert!(second.payload().is_empty());
    assert!(second.message.headers.is_empty());
    assert_eq!(second.partition, first.partition);
    assert_eq!(second.offset, second_at.offset);
    assert!(second.offset > first.offset);
    ack(&second).await;
}

/// 1,000 messages over 50 keys, consumed by two members of one group whose handlers run
/// concurrently and take varying time: no message of a key is handed out before every earlier
/// message of that key was, a member is not handed a key's next message while it still handles
/// the previous one, and nothing is lost. A redelivery (a message seen again after a rebalance)
/// is allowed; a gap or an overtaking is not.
pub async fn per_key_order_holds_across_two_members(bus: Arc<dyn Bus>) {
    const KEYS: u32 = 50;
    const MESSAGES: u32 = 1_000;
    let topic = Topic::Events;
    let group = fresh_group("order");
    let label = format!("r-order-{}", &Uuid::new_v4().simple().to_string()[..8]);

    #[derive(Default)]
    struct Seen {
        /// Per key, the next sequence number not seen yet.
        next: HashMap<String, u32>,
        /// Per key, the member handling one of its messages and which.
        busy: HashMap<String, (&'static str, u32)>,
        firsts: u32,
        redeliveries: u32,
        violations: Vec<String>,
    }
    let seen = Arc::new(Mutex::new(Seen::default()));

    let mut consumers = Vec::new();
    for member in ["m-a", "m-b"] {
        let mut sub = subscribe(&*bus, topic, &group, member).await;
        let seen = Arc::clone(&seen);
        consumers.push(tokio::spawn(async move {
            while let Some(delivery) = sub.next().await {
                let payload = text(&delivery);
                let Some((key, seq)) = payload
                    .rsplit_once('#')
                    .and_then(|(k, s)| Some((k.to_owned(), s.parse::<u32>().ok()?)))
                else {
                    let mut seen = seen.lock().expect("no panics while held");
                    seen.violations
                        .push(format!("unexpected payload {payload:?}"));
                    continue;
                };
                {
                    let mut seen = seen.lock().expect("no panics while held");
                    if let Some(&(holder, held)) = seen.busy.get(&key)
                        && holder == member
                        && seq > held
                    {
                        seen.violations.push(format!(
                            "{member} was handed {key}#{seq} while handling #{held}"
                        ));
                    }
                    seen.busy.insert(key.clone(), (member, seq));
                    let next = seen.next.entry(key.clone()).or_insert(0);
                    if seq == *next {
                        *next += 1;
                        seen.firsts += 1;
                    } else if seq < *next {
                        seen.redeliveries += 1;
                    } else {
                        let expected = *next;
                        seen.violations
                            .push(format!("{key}: got #{seq} before #{expected} ({member})"));
                    }
                }
                // The handler runs on its own, so the member asks for more at once: only the
                // bus's per-partition hand-out keeps this key's next message back.
                let seen = Arc::clone(&seen);
                tokio::spawn(async move {
                    sleep(Duration::from_micros(u64::from(seq * 797 % 3_000))).await;
                    {
                        // Done handling: cleared before the ack, which may release the next.
                        let mut seen = seen.lock().expect("no panics while held");
                        if seen.busy.get(&key) == Some(&(member, seq)) {
                            seen.busy.remove(&key);
                        }
                    }
                    match delivery.ack().await {
                        Ok(()) | Err(BusError::Revoked { .. }) => {}
                        Err(e) => {
                            let mut seen = seen.lock().expect("no panics while held");
                            seen.violations.push(format!("ack {key}#{seq}: {e}"));
                        }
                    }
                });
            }
        }));
    }

    for i in 0..MESSAGES {
        let key = format!("{label}-{}", i % KEYS);
        publish(&*bus, topic, &key, format!("{key}#{}", i / KEYS)).await;
    }

    let deadline = Instant::now() + WAIT * 2;
    loop {
        {
            let seen = seen.lock().expect("no panics while held");
            assert!(
                seen.violations.is_empty(),
                "per-key order broken: {:?}",
                seen.violations
            );
            if seen.firsts == MESSAGES {
                assert_eq!(seen.next.len(), KEYS as usize);
                assert!(seen.next.values().all(|&n| n == MESSAGES / KEYS));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "only {} of {MESSAGES} messages arrived (redeliveries {})",
                seen.firsts,
                seen.redeliveries
            );
        }
        sleep(Duration::from_millis(20)).await;
    }
    for consumer in consumers {
        consumer.abort();
    }
}

/// A partition whose message is not acknowledged yet (a slow handler) does not hold up another
/// partition, while its own next message waits for the acknowledgement.
pub async fn a_slow_partition_does_not_hold_up_the_others(bus: Arc<dyn Bus>) {
    let topic = Topic::Requested;
    let n = partitions(&*bus, topic).await;
    assert!(
        n >= 2,
        "this check needs a topic with at least two partitions"
    );
    let keys = keys_by_partition(&format!("r-slow-{}", Uuid::new_v4().simple()), n);
    let (slow, fast) = (&keys[0], &keys[1]);
    let group = fresh_group("slow");
    let mut sub = subscribe(&*bus, topic, &group, "m-1").await;

    publish(&*bus, topic, slow, "slow#0").await;
    publish(&*bus, topic, slow, "slow#1").await;
    publish(&*bus, topic, fast, "fast#0").await;

    // Nothing is acknowledged: both partitions' first messages must still come.
    let mut held: HashMap<String, Delivery> = HashMap::new();
    while held.len() < 2 {
        let delivery = next_within(&mut sub, "the first message of each partition").await;
        let payload = text(&delivery);
        assert_ne!(
            payload, "slow#1",
            "slow#1 was handed out before slow#0 was acknowledged"
        );
        held.insert(payload, delivery);
    }
    assert!(held.contains_key("slow#0") && held.contains_key("fast#0"));

    // The slow partition's next message waits for its acknowledgement.
    if let Ok(extra) = timeout(QUIET, sub.next()).await {
        panic!(
            "{:?} was handed out while slow#0 was in flight",
            extra.map(|d| text(&d))
        );
    }
    ack(&held["fast#0"]).await;
    ack(&held["slow#0"]).await;
    let next = next_within(&mut sub, "slow#1 after slow#0 was acknowledged").await;
    assert_eq!(text(&next), "slow#1");
    ack(&next).await;
}

/// Two groups on one topic each get every message, whatever the other acknowledged.
pub async fn every_group_gets_every_message(bus: Arc<dyn Bus>) {
    const MESSAGES: usize = 100;
    let topic = Topic::Events;
    let label = format!("r-groups-{}", &Uuid::new_v4().simple().to_string()[..8]);
    let mut first = subscribe(&*bus, topic, &fresh_group("first"), "m-1").await;
    let mut second = subscribe(&*bus, topic, &fresh_group("second"), "m-1").await;

    let mut published = BTreeSet::new();
    for i in 0..MESSAGES {
        let at = publish(
            &*bus,
            topic,
            &format!("{label}-{}", i % 20),
            format!("m{i}"),
        )
        .await;
        published.insert((at.partition, at.offset, format!("m{i}")));
    }

    // One group consumes everything before the other starts: what the first acknowledged must
    // still reach the second.
    for sub in [&mut first, &mut second] {
        let mut got = BTreeSet::new();
        while got.len() < MESSAGES {
            let delivery = next_within(sub, "every message in each group").await;
            got.insert((delivery.partition, delivery.offset, text(&delivery)));
            ack(&delivery).await;
        }
        assert_eq!(
            got,
            published,
            "group {} missed or altered messages",
            sub.group()
        );
    }
}

/// A message handed out but not acknowledged when its subscription is dropped is delivered to
/// the next subscription of the same group.
pub async fn an_unacked_message_is_redelivered_to_a_new_subscription(bus: Arc<dyn Bus>) {
    let topic = Topic::Unknown;
    let group = fresh_group("redeliver");
    let key = format!("r-redeliver-{}", Uuid::new_v4().simple());
    let mut first = subscribe(&*bus, topic, &group, "m-1").await;
    publish(&*bus, topic, &key, "handle me").await;
    let unacked = next_within(&mut first, "the message").await;
    assert_eq!(text(&unacked), "handle me");
    drop(first);

    let mut second = subscribe(&*bus, topic, &group, "m-2").await;
    let again = next_within(&mut second, "the redelivery").await;
    assert_eq!(again.message, unacked.message);
    assert_eq!(
        (again.partition, again.offset),
        (unacked.partition, unacked.offset)
    );
    ack(&again).await;
}

/// A member that leaves with a message in flight: the member that remains gets it.
pub async fn an_unacked_message_moves_to_the_remaining_member(bus: Arc<dyn Bus>) {
    let topic = Topic::Compensate;
    let group = fresh_group("remaining");
    let n = partitions(&*bus, topic).await;
    let mut leaving = subscribe(&*bus, topic, &group, "m-leaving").await;
    let mut staying = subscribe(&*bus, topic, &group, "m-staying").await;
    let keys = keys_by_partition(&format!("r-remaining-{}", Uuid::new_v4().simple()), n);
    for key in &keys {
        publish(&*bus, topic, key, key.clone()).await;
    }

    let unacked = next_within(&mut leaving, "a message for the leaving member").await;
    drop(leaving);

    // Every message, the unacknowledged one included, ends up with the remaining member.
    let mut got = BTreeSet::new();
    while got.len() < keys.len() {
        let delivery = next_within(&mut staying, "every message after the other left").await;
        got.insert(text(&delivery));
        ack(&delivery).await;
    }
    assert!(got.contains(&text(&unacked)));
    assert_eq!(got, keys.iter().cloned().collect::<BTreeSet<_>>());
}

/// A restarted member resumes after the last acknowledged message: the acknowledged ones are
/// not delivered again, the unacknowledged one is.
pub async fn acked_messages_are_not_redelivered_after_a_restart(bus: Arc<dyn Bus>) {
    let topic = Topic::Requested;
    let group = fresh_group("restart");
    let key = format!("r-restart-{}", Uuid::new_v4().simple());

    let mut first = subscribe(&*bus, topic, &group, "m-1").await;
    publish(&*bus, topic, &key, "m0").await;
    publish(&*bus, topic, &key, "m1").await;
    let m0 = next_within(&mut first, "m0").await;
    assert_eq!(text(&m0), "m0");
    ack(&m0).await;
    let m1 = next_within(&mut first, "m1").await;
    assert_eq!(text(&m1), "m1");
    drop(first); // m1 is not acknowledged

    publish(&*bus, topic, &key, "m2").await;
    let mut second = subscribe(&*bus, topic, &group, "m-1").await;
    let resumed = next_within(&mut second, "the first message after the restart").await;
    assert_eq!(
        text(&resumed),
        "m1",
        "m0 was acknowledged and must not come back"
    );
    ack(&resumed).await;
    let m2 = next_within(&mut second, "m2").await;
    assert_eq!(text(&m2), "m2");
    ack(&m2).await;
    drop(second);

    // Everything was acknowledged: the next restart sees only what is new.
    publish(&*bus, topic, &key, "m3").await;
    let mut third = subscribe(&*bus, topic, &group, "m-1").await;
    let m3 = next_within(&mut third, "m3").await;
    assert_eq!(text(&m3), "m3");
    ack(&m3).await;
}

/// Messages land on Kafka's murmur2 partition of their key (`r-abc` included), as published
/// and as delivered.
pub async fn keys_are_partitioned_with_murmur2(bus: Arc<dyn Bus>) {
    let topic = Topic::Events;
    let n = partitions(&*bus, topic).await;
    let group = fresh_group("murmur2");
    let mut sub = subscribe(&*bus, topic, &group, "m-1").await;

    let mut keys = vec!["r-abc".to_owned(), "r-1".to_owned(), "21".to_owned()];
    keys.extend((0..40).map(|i| format!("r-{}-{i}", &Uuid::new_v4().simple().to_string()[..6])));
    for key in &keys {
        let at = publish(&*bus, topic, key, key.clone()).await;
        assert_eq!(
            at.partition,
            partition_for(key.as_bytes(), n),
            "published {key}"
        );
    }
    let mut seen = BTreeSet::new();
    while seen.len() < keys.len() {
        let delivery = next_within(&mut sub, "every keyed message").await;
        assert_eq!(text(&delivery), delivery.key());
        assert_eq!(
            delivery.partition,
            partition_for(delivery.key().as_bytes(), n),
            "delivered {}",
            delivery.key()
        );
        seen.insert(delivery.key().to_owned());
        ack(&delivery).await;
    }
}

/// Two members of one group own disjoint sets of partitions that together cover the topic,
/// and each message is delivered to exactly one of them — the owner of its partition.
pub async fn two_members_split_the_partitions(bus: Arc<dyn Bus>) {
    const MESSAGES: usize = 200;
    let topic = Topic::Requested;
    let n = partitions(&*bus, topic).await;
    assert!(
        n >= 2,
        "this check needs a topic with at least two partitions"
    );
    let group = fresh_group("split");
    let mut a = subscribe(&*bus, topic, &group, "m-a").await;
    let mut b = subscribe(&*bus, topic, &group, "m-b").await;

    // Let the group settle: a broker rebalances while its members poll.
    let all: BTreeSet<u32> = (0..n).collect();
    let deadline = Instant::now() + WAIT;
    let (owned_a, owned_b) = loop {
        let (owned_a, owned_b): (BTreeSet<u32>, BTreeSet<u32>) = (
            a.assignment().into_iter().collect(),
            b.assignment().into_iter().collect(),
        );
        if !owned_a.is_empty()
            && !owned_b.is_empty()
            && owned_a.is_disjoint(&owned_b)
            && owned_a.union(&owned_b).copied().collect::<BTreeSet<_>>() == all
        {
            break (owned_a, owned_b);
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle: {owned_a:?} and {owned_b:?} of {n}"
        );
        tokio::select! {
            d = a.next() => panic!("nothing was published, m-a got {:?}", d.map(|d| text(&d))),
            d = b.next() => panic!("nothing was published, m-b got {:?}", d.map(|d| text(&d))),
            () = sleep(Duration::from_millis(50)) => {}
        }
    };

    let keys = keys_by_partition(&format!("r-split-{}", Uuid::new_v4().simple()), n);
    let mut published = HashMap::new();
    for i in 0..MESSAGES {
        let key = &keys[i % keys.len()];
        let at = publish(&*bus, topic, key, format!("m{i}")).await;
        published.insert((at.partition, at.offset), format!("m{i}"));
    }

    // (partition, offset) -> the members it was delivered to
    let mut delivered: HashMap<(u32, u64), Vec<&str>> = HashMap::new();
    let deadline = Instant::now() + WAIT;
    while delivered.len() < MESSAGES {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let (member, delivery) = tokio::select! {
            d = a.next() => ("m-a", d),
            d = b.next() => ("m-b", d),
            () = sleep(remaining) => panic!(
                "only {} of {MESSAGES} messages arrived within {WAIT:?}", delivered.len()
            ),
        };
        let delivery = delivery.expect("the bus stays open");
        let owned = if member == "m-a" { &owned_a } else { &owned_b };
        assert!(
            owned.contains(&delivery.partition),
            "{member} got partition {} it does not own",
            delivery.partition
        );
        let at = (delivery.partition, delivery.offset);
        assert_eq!(published.get(&at), Some(&text(&delivery)));
        delivered.entry(at).or_default().push(member);
        ack(&delivery).await;
    }
    let twice: Vec<_> = delivered.iter().filter(|(_, m)| m.len() > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    for member in ["m-a", "m-b"] {
        assert!(
            delivered.values().any(|m| m[0] == member),
            "{member} got nothing"
        );
    }
    // Nothing more is pending for either member.
    tokio::select! {
        d = a.next() => panic!("m-a got an extra {:?}", d.map(|d| text(&d))),
        d = b.next() => panic!("m-b got an extra {:?}", d.map(|d| text(&d))),
        () = sleep(QUIET) => {}
    }
}
