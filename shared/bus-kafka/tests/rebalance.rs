//! Rebalances on a real broker (`SLUICE_TEST_KAFKA_BROKERS`, default `127.0.0.1:19092`): what
//! a member keeps across a join (cooperative rebalancing, on the classic protocol and on
//! KIP-848's), a static member's restart (`instance_id`), which moves nothing, and a roll from
//! eager to cooperative members.
//!
//! A rebalance that takes a partition away, even for a moment, gives it a new generation in
//! the member (`src/consumer.rs`), so a delivery handed out before it can no longer be
//! acknowledged. Each test holds one unacknowledged delivery per partition across the
//! rebalance and then acknowledges them all: an acknowledgement taken proves the partition was
//! never revoked; `Revoked` proves it was. That is behaviour, not timing: nothing here asserts
//! how long a rebalance takes.

#![cfg(not(sluice_skip_kafka))]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_bus::contract::{WAIT, fresh_group, fresh_prefix, keys_by_partition, next_within};
use sluice_bus::{Bus, BusError, Delivery, Subscription, Topic};
use sluice_bus_kafka::{GroupProtocol, KafkaBus, KafkaConfig};
use tokio::time::{Instant, sleep};

mod common;
use common::{Topics, config, connect};

/// The test configuration with `protocol`; KIP-848 takes the session timeout and heartbeat
/// interval from the broker, so the classic-only properties go.
fn with_protocol(prefix: String, partitions: u32, protocol: GroupProtocol) -> KafkaConfig {
    let mut config = config(prefix, partitions);
    config.group_protocol = protocol;
    if protocol == GroupProtocol::Consumer {
        config.extra.remove("session.timeout.ms");
        config.extra.remove("heartbeat.interval.ms");
    }
    config
}

fn owned(member: &Subscription) -> BTreeSet<u32> {
    member.assignment().into_iter().collect()
}

/// Waits until `members` own disjoint, non-empty sets of partitions that cover the topic;
/// returns each one's.
async fn settle(members: &[&Subscription], partitions: u32) -> Vec<BTreeSet<u32>> {
    let all: BTreeSet<u32> = (0..partitions).collect();
    let deadline = Instant::now() + WAIT;
    loop {
        let sets: Vec<BTreeSet<u32>> = members.iter().map(|m| owned(m)).collect();
        let total: usize = sets.iter().map(BTreeSet::len).sum();
        let union: BTreeSet<u32> = sets.iter().flatten().copied().collect();
        if sets.iter().all(|s| !s.is_empty()) && total == all.len() && union == all {
            return sets;
        }
        assert!(
            Instant::now() < deadline,
            "the group did not settle: {sets:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes one message to each partition of the topic.
async fn one_per_partition(bus: &KafkaBus, topic: Topic, partitions: u32, label: &str) {
    let label = format!("r-{label}-{}", uuid::Uuid::new_v4().simple());
    for key in keys_by_partition(&label, partitions) {
        bus.publish(topic, &key, label.clone().into_bytes(), Vec::new())
            .await
            .expect("publish");
    }
}

/// Takes one delivery of each partition `member` owns, acknowledging none of them.
async fn hold_one_each(member: &mut Subscription, partitions: &BTreeSet<u32>) -> Vec<Delivery> {
    let mut held = Vec::new();
    while held.len() < partitions.len() {
        let delivery = next_within(member, "a message of each owned partition").await;
        assert!(partitions.contains(&delivery.partition));
        held.push(delivery);
    }
    held
}

/// Acknowledges `held`; returns the partitions whose acknowledgement was refused as revoked.
async fn revoked(held: Vec<Delivery>) -> BTreeSet<u32> {
    let mut revoked = BTreeSet::new();
    for delivery in held {
        match delivery.ack().await {
            Ok(()) => {}
            Err(BusError::Revoked { partition, .. }) => {
                revoked.insert(partition);
            }
            Err(other) => panic!("acknowledging partition {}: {other}", delivery.partition),
        }
    }
    revoked
}

/// Two members share six partitions, each holding a message of every partition it owns; a
/// third joins. Returns, for the first two: what each owned before and after, and which of its
/// partitions were revoked.
async fn third_member_joins(
    protocol: GroupProtocol,
) -> [(BTreeSet<u32>, BTreeSet<u32>, BTreeSet<u32>); 2] {
    const PARTITIONS: u32 = 6;
    let bus = connect(with_protocol(fresh_prefix(), PARTITIONS, protocol)).await;
    let _topics = Topics(bus.clone());
    let group = fresh_group("join");
    let mut a = bus
        .subscribe(Topic::Requested, &group, "m-a")
        .await
        .expect("subscribe");
    let mut b = bus
        .subscribe(Topic::Requested, &group, "m-b")
        .await
        .expect("subscribe");
    let before = settle(&[&a, &b], PARTITIONS).await;
    one_per_partition(&bus, Topic::Requested, PARTITIONS, "join").await;
    let held_a = hold_one_each(&mut a, &before[0]).await;
    let held_b = hold_one_each(&mut b, &before[1]).await;

    let mut c = bus
        .subscribe(Topic::Requested, &group, "m-c")
        .await
        .expect("subscribe");
    let after = settle(&[&a, &b, &c], PARTITIONS).await;
    let revoked_a = revoked(held_a).await;
    let revoked_b = revoked(held_b).await;

    // What moved is delivered again to its new owner, which can acknowledge it.
    for _ in 0..after[2].len() {
        let again = next_within(&mut c, "a moved partition's message, again").await;
        again.ack().await.expect("the new owner acknowledges");
    }
    [
        (before[0].clone(), after[0].clone(), revoked_a),
        (before[1].clone(), after[1].clone(), revoked_b),
    ]
}

/// Cooperative rebalancing: a joining member takes partitions from the others, and only the
/// partitions it takes are revoked; the ones they keep go on without a pause (a message held
/// across the rebalance is still acknowledged).
async fn only_moved_partitions_are_revoked(protocol: GroupProtocol) {
    for (member, (before, after, revoked)) in ["a", "b"]
        .into_iter()
        .zip(third_member_joins(protocol).await)
    {
        let kept: BTreeSet<u32> = before.intersection(&after).copied().collect();
        let moved: BTreeSet<u32> = before.difference(&after).copied().collect();
        assert!(
            after.is_subset(&before),
            "{member} gained partitions when a member joined: {before:?} -> {after:?}"
        );
        assert!(
            !kept.is_empty(),
            "{member} kept none of {before:?} (it has {after:?})"
        );
        assert_eq!(
            revoked, moved,
            "{member} owned {before:?}, owns {after:?}: only the partitions that moved may be revoked"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cooperative_a_joining_member_revokes_only_what_moves() {
    only_moved_partitions_are_revoked(GroupProtocol::Cooperative).await;
}

/// The same with KIP-848's `consumer` protocol (Kafka 4.0 or later: the test broker is 4.1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kip848_a_joining_member_revokes_only_what_moves() {
    only_moved_partitions_are_revoked(GroupProtocol::Consumer).await;
}

/// What cooperative rebalancing replaced, for contrast: with eager assignment the same join
/// revokes every partition of both members, those they keep included.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eager_a_joining_member_revokes_everything() {
    for (member, (before, _, revoked)) in ["a", "b"]
        .into_iter()
        .zip(third_member_joins(GroupProtocol::Eager).await)
    {
        assert_eq!(revoked, before, "{member} lost every partition it owned");
    }
}

/// Records whether `member` ever owned a partition outside `own` until `stop` is set.
fn watch_assignment(
    member: Arc<Subscription>,
    own: BTreeSet<u32>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<BTreeSet<u32>> {
    tokio::spawn(async move {
        let mut foreign = BTreeSet::new();
        while !stop.load(Ordering::Acquire) {
            let now = owned(&member);
            foreign.extend(now.difference(&own).copied());
            sleep(Duration::from_millis(5)).await;
        }
        foreign
    })
}

/// A restart of one member of two, each holding a message of every partition it owns.
/// Returns the partitions the other member was given for a while, the partitions it had
/// revoked, and whether the restarted member got exactly its partitions back.
async fn member_restarts(
    protocol: GroupProtocol,
    static_ids: bool,
) -> (BTreeSet<u32>, BTreeSet<u32>, bool) {
    const PARTITIONS: u32 = 4;
    let prefix = fresh_prefix();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let member_config = |name: &str| {
        let mut config = with_protocol(prefix.clone(), PARTITIONS, protocol);
        if protocol != GroupProtocol::Consumer {
            // Long enough for the restart below on a busy machine; short for the other test
            // members' rebalances, which do not wait for it.
            config
                .extra
                .insert("session.timeout.ms".to_owned(), "30000".to_owned());
        }
        config.instance_id = static_ids.then(|| format!("{name}-{run}"));
        config
    };
    let bus_a = connect(member_config("a")).await;
    let _topics = Topics(bus_a.clone());
    let bus_b = connect(member_config("b")).await;
    let group = fresh_group("restart");
    let mut a = bus_a
        .subscribe(Topic::Requested, &group, "m-a")
        .await
        .expect("subscribe");
    let mut b = bus_b
        .subscribe(Topic::Requested, &group, "m-b")
        .await
        .expect("subscribe");
    let before = settle(&[&a, &b], PARTITIONS).await;
    one_per_partition(&bus_a, Topic::Requested, PARTITIONS, "restart").await;
    let held_a = hold_one_each(&mut a, &before[0]).await;
    let held_b = hold_one_each(&mut b, &before[1]).await;

    let b = Arc::new(b);
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_assignment(Arc::clone(&b), before[1].clone(), Arc::clone(&stop));

    // The restart: the process closes its bus (a static member sends no LeaveGroup) and a new
    // one with the same configuration subscribes again.
    drop(held_a);
    drop(a);
    bus_a.close().await;
    // A restart that takes a few seconds: several heartbeats, in which a dynamic member's
    // leaving is noticed and its partitions given to the other member.
    sleep(Duration::from_secs(3)).await;
    let bus_a2 = connect(member_config("a")).await;
    let a2 = bus_a2
        .subscribe(Topic::Requested, &group, "m-a")
        .await
        .expect("subscribe again");
    let after = settle(&[&a2, &b], PARTITIONS).await;
    stop.store(true, Ordering::Release);
    let foreign = watcher.await.expect("the watcher ran");
    let revoked_b = revoked(held_b).await;
    let same = after[0] == before[0];
    drop(a2);
    bus_a2.close().await;
    (foreign, revoked_b, same)
}

/// Static membership: a member that restarts within the session timeout takes its own
/// partitions back, and the other member is neither given them in between nor revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_static_member_restarts_without_moving_anything() {
    let (foreign, revoked, same) = member_restarts(GroupProtocol::Cooperative, true).await;
    assert!(
        foreign.is_empty(),
        "b was given {foreign:?} during a's restart"
    );
    assert!(
        revoked.is_empty(),
        "b had {revoked:?} revoked during a's restart"
    );
    assert!(same, "a got other partitions back");
}

/// The same on KIP-848's protocol, where static membership is the broker's too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kip848_a_static_member_restarts_without_moving_anything() {
    let (foreign, revoked, same) = member_restarts(GroupProtocol::Consumer, true).await;
    assert!(
        foreign.is_empty(),
        "b was given {foreign:?} during a's restart"
    );
    assert!(
        revoked.is_empty(),
        "b had {revoked:?} revoked during a's restart"
    );
    assert!(same, "a got other partitions back");
}

/// Without an instance id the same restart is a leave and a join: the other member is given
/// the leaving member's partitions in between (what static membership avoids).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dynamic_member_restarting_moves_its_partitions() {
    let (foreign, _, _) = member_restarts(GroupProtocol::Cooperative, false).await;
    assert!(
        !foreign.is_empty(),
        "b was never given a's partitions while a restarted"
    );
}

/// Two consumers of one group in one process (one bus handle) get distinct instance ids — a
/// shared id would fence one of them — and share the partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_consumers_of_a_process_get_distinct_instance_ids() {
    let mut config = config(fresh_prefix(), 2);
    config.instance_id = Some(format!("pod-{}", uuid::Uuid::new_v4().simple()));
    let bus = connect(config).await;
    let _topics = Topics(bus.clone());
    let group = fresh_group("twins");
    let mut a = bus
        .subscribe(Topic::Events, &group, "m-a")
        .await
        .expect("subscribe");
    let mut b = bus
        .subscribe(Topic::Events, &group, "m-b")
        .await
        .expect("subscribe");
    let owned = settle(&[&a, &b], 2).await;
    one_per_partition(&bus, Topic::Events, 2, "twins").await;
    let mut got = BTreeMap::new();
    for (name, member, own) in [("a", &mut a, &owned[0]), ("b", &mut b, &owned[1])] {
        for delivery in hold_one_each(member, own).await {
            delivery.ack().await.expect("neither member was fenced");
            got.insert(delivery.partition, name);
        }
    }
    assert_eq!(got.len(), 2, "both partitions were consumed: {got:?}");
}

/// A roll from eager to cooperative members (the upgrade to this build): the two share no
/// assignor, so while an eager member is in the group the cooperative one gets nothing and the
/// eager one keeps everything; once the eager one is gone the cooperative one takes over. Slow,
/// not lossy: what docs/operations.md, "Rebalances", tells an operator to expect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eager_and_cooperative_members_take_turns_during_a_roll() {
    const PARTITIONS: u32 = 2;
    let prefix = fresh_prefix();
    let old = connect(with_protocol(
        prefix.clone(),
        PARTITIONS,
        GroupProtocol::Eager,
    ))
    .await;
    let _topics = Topics(old.clone());
    let new = connect(with_protocol(
        prefix,
        PARTITIONS,
        GroupProtocol::Cooperative,
    ))
    .await;
    let group = fresh_group("roll");
    let mut a = old
        .subscribe(Topic::Compensate, &group, "m-old")
        .await
        .expect("subscribe");
    let owned_a = settle(&[&a], PARTITIONS).await.swap_remove(0);
    one_per_partition(&old, Topic::Compensate, PARTITIONS, "roll").await;
    let held = hold_one_each(&mut a, &owned_a).await;

    let b = new
        .subscribe(Topic::Compensate, &group, "m-new")
        .await
        .expect("subscribing is local; joining is what the broker may refuse");
    // Several heartbeats: time for the broker to take the new member in, were it able to.
    sleep(Duration::from_secs(3)).await;
    assert!(
        owned(&b).is_empty(),
        "the cooperative member got {:?} beside an eager one",
        owned(&b)
    );
    assert_eq!(owned(&a), owned_a, "the eager member keeps everything");
    assert!(
        revoked(held).await.is_empty(),
        "the eager member's work was not disturbed"
    );

    drop(a);
    old.close().await;
    let mut b = b;
    settle(&[&b], PARTITIONS).await;
    one_per_partition(&new, Topic::Compensate, PARTITIONS, "rolled").await;
    for _ in 0..PARTITIONS {
        let next = next_within(&mut b, "a message after the roll").await;
        assert!(
            String::from_utf8_lossy(next.payload()).starts_with("r-rolled-"),
            "what the eager member acknowledged came back"
        );
        next.ack()
            .await
            .expect("the cooperative member owns it now");
    }
}
