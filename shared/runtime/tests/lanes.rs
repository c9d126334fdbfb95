//! Fair dispatch (`sluice_runtime::lanes`) on a real embedded bus: a tenant whose requests
//! were published after another tenant's flood is served within its first turns, a run's
//! requests never run at once, and a request waiting in a lane keeps its room in the bus's
//! admission bound until it is handled.
//!
//! Before the lanes, the first test failed: each partition's requests were handled in the
//! order published, so the late tenant's were the last handled.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_bus::{Bus, Delivery, EmbeddedBus, EmbeddedConfig, Topic};
use sluice_runtime::Metrics;
use sluice_runtime::consumer::{ConsumerSpec, Handled, RetryPolicy, consume_with};
use sluice_runtime::messages::TENANT_HEADER;
use sluice_runtime::pipeline::PipelineError;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn spec(lanes: Option<usize>, concurrency: usize) -> ConsumerSpec {
    ConsumerSpec {
        topic: Topic::Requested,
        group: "test-dispatcher".into(),
        member: "test".into(),
        concurrency,
        lanes,
    }
}

async fn publish(bus: &dyn Bus, tenant: &str, run: &str, n: usize) {
    bus.publish(
        Topic::Requested,
        run,
        format!("{tenant}/{run}/{n}").into_bytes(),
        vec![(TENANT_HEADER.into(), tenant.as_bytes().to_vec())],
    )
    .await
    .expect("publish");
}

/// What a handler saw: each payload in the order handled, and how many of a run's requests
/// were ever in a handler at once.
#[derive(Debug, Default)]
struct Seen {
    order: Vec<String>,
    running: HashMap<String, usize>,
    most_at_once: usize,
}

type Handler = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Handled, PipelineError>> + Send + 'static>,
>;

fn handler(
    seen: Arc<Mutex<Seen>>,
    pause: Duration,
) -> impl Fn(Delivery) -> Handler + Clone + Send + Sync + 'static {
    move |delivery: Delivery| {
        let seen = Arc::clone(&seen);
        Box::pin(async move {
            let run = delivery.key().to_owned();
            {
                let mut seen = seen.lock().expect("lock");
                let running = seen.running.entry(run.clone()).or_default();
                *running += 1;
                let now = *running;
                seen.most_at_once = seen.most_at_once.max(now);
            }
            tokio::time::sleep(pause).await;
            let mut seen = seen.lock().expect("lock");
            *seen.running.entry(run).or_default() -= 1;
            seen.order
                .push(String::from_utf8_lossy(delivery.payload()).into_owned());
            Ok(Handled::Done)
        })
    }
}

/// Runs a consume loop until `handled` payloads were seen; returns what it saw.
async fn consume_until(
    bus: Arc<EmbeddedBus>,
    spec: ConsumerSpec,
    pause: Duration,
    handled: usize,
) -> Seen {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus,
        Arc::new(Metrics::new()),
        spec,
        RetryPolicy::default(),
        shutdown.clone(),
        handler(Arc::clone(&seen), pause),
    ));
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.lock().expect("lock").order.len() < handled {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {handled} handled",
            seen.lock().expect("lock").order.len()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    consumer.await.expect("joined").expect("consumed");
    Arc::try_unwrap(seen)
        .expect("the handlers are done")
        .into_inner()
        .expect("lock")
}

/// The position of each of `tenant`'s requests in the order handled.
fn positions(seen: &Seen, tenant: &str) -> Vec<usize> {
    seen.order
        .iter()
        .enumerate()
        .filter(|(_, payload)| payload.starts_with(&format!("{tenant}/")))
        .map(|(at, _)| at)
        .collect()
}

fn bus(partitions: u32, admission: Option<u32>) -> Arc<EmbeddedBus> {
    Arc::new(
        EmbeddedBus::new(EmbeddedConfig {
            partitions,
            admission,
            ..EmbeddedConfig::default()
        })
        .expect("valid bus"),
    )
}

/// A bus whose dispatcher group has joined (so nothing is compacted away unread) before
/// anything is published.
async fn joined_bus(partitions: u32) -> Arc<EmbeddedBus> {
    let bus = bus(partitions, None);
    drop(
        bus.subscribe(Topic::Requested, "test-dispatcher", "test")
            .await
            .expect("join"),
    );
    bus
}

/// 400 requests of tenant `flood`, then 5 of tenant `trickle`, each a run of its own.
async fn flood_then_trickle(bus: &EmbeddedBus) {
    for n in 0..400 {
        publish(bus, "flood", &format!("flood-{n}"), n).await;
    }
    for n in 0..5 {
        publish(bus, "trickle", &format!("trickle-{n}"), n).await;
    }
}

#[tokio::test]
async fn a_tenant_behind_a_flood_is_served_in_its_first_turns() {
    let bus = joined_bus(4).await;
    flood_then_trickle(&bus).await;
    let seen = consume_until(
        Arc::clone(&bus),
        spec(Some(1_024), 4),
        Duration::from_millis(2),
        405,
    )
    .await;
    let trickle = positions(&seen, "trickle");
    assert_eq!(trickle.len(), 5);
    // Read ahead at once, the trickle takes every other turn: its five are handled among the
    // first few dozen, while the 4 workers finish what they hold. Before, in publish order,
    // they came last (positions 400 to 404).
    assert!(
        trickle.iter().all(|&at| at < 40),
        "the trickle's requests were handled at {trickle:?} of 405"
    );

    // The same with the lanes off: each partition in publish order, the trickle last.
    let bus = joined_bus(4).await;
    flood_then_trickle(&bus).await;
    let unfair = consume_until(bus, spec(None, 4), Duration::ZERO, 405).await;
    assert!(
        positions(&unfair, "trickle").iter().all(|&at| at >= 300),
        "without lanes the trickle waits behind the flood: {:?}",
        positions(&unfair, "trickle")
    );
}

#[tokio::test]
async fn a_runs_requests_are_handled_one_at_a_time() {
    let bus = joined_bus(2).await;
    for n in 0..30 {
        publish(&*bus, "a", &format!("run-{}", n % 3), n).await;
    }
    let seen = consume_until(bus, spec(Some(64), 8), Duration::from_millis(5), 30).await;
    assert_eq!(seen.most_at_once, 1, "two requests of one run ran at once");
    // Within a run, in the order published.
    for run in 0..3 {
        let mine: Vec<usize> = seen
            .order
            .iter()
            .filter(|payload| payload.starts_with(&format!("a/run-{run}/")))
            .filter_map(|payload| payload.rsplit('/').next()?.parse().ok())
            .collect();
        let mut sorted = mine.clone();
        sorted.sort_unstable();
        assert_eq!(mine, sorted, "run-{run}'s requests out of order");
    }
}

#[tokio::test]
async fn a_queued_request_keeps_its_admission_room_until_handled() {
    let bus = bus(1, Some(2));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shutdown = CancellationToken::new();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let gate = Arc::clone(&release);
    let consumer = tokio::spawn(consume_with(
        Arc::clone(&bus) as Arc<dyn Bus>,
        Arc::new(Metrics::new()),
        spec(Some(16), 1),
        RetryPolicy::default(),
        shutdown.clone(),
        {
            let seen = Arc::clone(&seen);
            move |delivery: Delivery| {
                let (seen, gate) = (Arc::clone(&seen), Arc::clone(&gate));
                Box::pin(async move {
                    gate.acquire().await.expect("open").forget();
                    seen.lock()
                        .expect("lock")
                        .order
                        .push(String::from_utf8_lossy(delivery.payload()).into_owned());
                    Ok(Handled::Done)
                }) as Handler
            }
        },
    ));
    for n in 0..2 {
        let room = bus.admit(Topic::Requested).await.expect("room");
        bus.publish_admitted(
            room,
            Topic::Requested,
            &format!("r-{n}"),
            vec![b'x'],
            vec![],
        )
        .await
        .expect("publish");
    }
    // Both are read off the bus (acknowledged) at once, but neither is handled: no room.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), bus.admit(Topic::Requested))
            .await
            .is_err(),
        "two admitted requests wait in the lanes: the bound of two is full"
    );
    release.add_permits(1);
    let room = tokio::time::timeout(WAIT, bus.admit(Topic::Requested))
        .await
        .expect("one handled: its room came back");
    drop(room);
    release.add_permits(1);
    let deadline = tokio::time::Instant::now() + WAIT;
    while seen.lock().expect("lock").order.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "not handled");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    consumer.await.expect("joined").expect("consumed");
}

/// On shutdown the reader stops, and the workers go on with what the lanes hold (for up to
/// `lanes::DRAIN`): requests already acknowledged are handled, not left to the sweeps.
#[tokio::test]
async fn a_shutdown_handles_what_the_lanes_hold_first() {
    let bus = joined_bus(2).await;
    for n in 0..20 {
        publish(&*bus, "a", &format!("run-{n}"), n).await;
    }
    let handled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        Arc::clone(&bus) as Arc<dyn Bus>,
        Arc::clone(&metrics),
        spec(Some(64), 2),
        RetryPolicy::default(),
        shutdown.clone(),
        {
            let (handled, gate) = (Arc::clone(&handled), Arc::clone(&gate));
            move |_delivery: Delivery| {
                let (handled, gate) = (Arc::clone(&handled), Arc::clone(&gate));
                Box::pin(async move {
                    gate.acquire().await.expect("open").forget();
                    // Each takes a while: the lanes are far from empty when the stop lands.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    handled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(Handled::Done)
                }) as Handler
            }
        },
    ));
    // The two workers hold one each; the other 18 wait in the lane. Then the stop.
    let queued = || metrics.dispatch_queued.with_label_values(&["a"]).get();
    let deadline = tokio::time::Instant::now() + WAIT;
    while queued() < 18 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} queued",
            queued()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shutdown.cancel();
    gate.add_permits(20);
    tokio::time::timeout(WAIT, consumer)
        .await
        .expect("the loop ends within the drain")
        .expect("joined")
        .expect("consumed");
    assert_eq!(
        handled.load(std::sync::atomic::Ordering::Relaxed),
        20,
        "every queued request handled before the loop ended"
    );
    assert_eq!(queued(), 0);
}
