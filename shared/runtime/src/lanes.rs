//! Fair dispatch: the consume loop that reads requests ahead into one lane per tenant and
//! hands them to a pool of workers in turn (`sluice_core::tenant::lanes` decides the order).
//!
//! The plain loop ([`crate::consumer`]) handles a partition's messages one after another, in
//! the order they were published: a tenant that submitted 20,000 effects fills every
//! partition, and another tenant's effect waits behind all of them. Here a reader takes each
//! delivery off the bus as soon as it is handed out, acknowledges it at once and queues it in
//! its tenant's lane (the [`TENANT_HEADER`]); `concurrency` workers take from the lanes in
//! turn and handle each with the plain loop's retries, dead letters and panic handling. While
//! another tenant is active no tenant holds more workers than a cap set by how late this
//! runtime runs its tasks (`sluice_core::tenant::hold`, timed here every
//! [`hold::TICK_MS`]), so a flood does not keep everything the bus admits in flight at once,
//! queued for the CPU in front of every other tenant's steps.
//!
//! **What acknowledging before handling costs.** A queued request is no longer the bus's: if
//! the process dies, it is gone. Nothing accepted is lost with it — a request is a fast path,
//! the command is in the ledger with a due time, and the sweeps republish it when that passes
//! (the reasoning in [`crate::consumer`], "Why acknowledging a message that was not handled
//! loses nothing accepted") — but those effects wait for their due time instead of going at
//! once. The lanes are bounded (`queue`), so at most that many wait so after a crash. On a
//! shutdown the workers keep taking from the lanes for [`DRAIN`], then leave the rest to the
//! sweeps.
//!
//! **The embedded bus's admission bound still holds.** Submissions wait for room in the bus
//! (`bus.admission`) that comes back when a request is handled. Acknowledged here, a request
//! would give its room back while it still waits in a lane; so the reader takes the room over
//! ([`Delivery::ack_keeping_room`]) and drops it when the worker is done.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use sluice_bus::{Bus, BusError, Delivery, Room, Subscription};
use sluice_core::tenant::ANONYMOUS;
use sluice_core::tenant::hold;
use sluice_core::tenant::lanes::{self, Lanes};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::consumer::{ConsumerSpec, Handled, One, RetryPolicy, task_ended};
use crate::messages::TENANT_HEADER;
use crate::metrics::Metrics;
use crate::pipeline::PipelineError;

/// How long, after a shutdown, workers keep taking queued requests before leaving the rest to
/// the sweeps.
pub const DRAIN: Duration = Duration::from_secs(5);

/// A request waiting in a lane: its delivery (acknowledged), the bus room it holds, its
/// tenant.
struct Queued {
    delivery: Delivery,
    tenant: String,
    _room: Room,
}

impl lanes::Queued for Queued {
    fn tenant(&self) -> &str {
        &self.tenant
    }

    fn run(&self) -> &str {
        self.delivery.key()
    }
}

/// The lanes, shared by the reader and the workers.
struct Shared {
    lanes: Mutex<Lanes<Queued>>,
    /// The lanes' clock: tenants' paces are timed from it (monotonic, in milliseconds).
    began: Instant,
    capacity: usize,
    /// Woken when an item is queued or a run is done (a worker may find one it can take).
    ready: Notify,
    /// Woken when an item is taken (the reader may read again).
    room: Notify,
    metrics: Arc<Metrics>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lanes<Queued>> {
        self.lanes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, queued: Queued) {
        self.metrics
            .dispatch_queued
            .with_label_values(&[&queued.tenant])
            .inc();
        self.lock().push(queued);
        // One idle worker looks (a busy worker looks again on its own when it is done). One
        // that finds only busy runs waits again: `done` wakes the next when a run frees up.
        self.ready.notify_one();
    }

    /// Milliseconds since the lanes began.
    fn now_ms(&self) -> i64 {
        i64::try_from(self.began.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    fn take(&self) -> Option<Queued> {
        let now = self.now_ms();
        let taken = self.lock().take(now);
        if let Some(queued) = &taken {
            self.metrics
                .dispatch_queued
                .with_label_values(&[&queued.tenant])
                .dec();
            self.room.notify_one();
        }
        taken
    }

    /// A worker is done with `queued`.
    fn done(&self, queued: &Queued) {
        let now = self.now_ms();
        let waiting = {
            let mut lanes = self.lock();
            lanes.done(queued, now);
            !lanes.is_empty()
        };
        // A request of the same run, or of a tenant at its share, may have waited for this
        // one: one idle worker looks. Never every worker, which with hundreds idle cost each
        // request hundreds of wake-ups.
        if waiting {
            self.ready.notify_one();
        }
    }

    fn full(&self) -> bool {
        self.lock().len() >= self.capacity
    }
}

/// The consume loop with lanes: `spec.concurrency` workers, at most `capacity` requests read
/// ahead. Returns once shut down and drained (or the bus closed).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn consume<H, F>(
    bus: Arc<dyn Bus>,
    metrics: Arc<Metrics>,
    spec: ConsumerSpec,
    policy: RetryPolicy,
    subscription: Subscription,
    shutdown: CancellationToken,
    handler: H,
    capacity: usize,
) -> Result<(), BusError>
where
    H: Fn(Delivery) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Handled, PipelineError>> + Send + 'static,
{
    let shared = Arc::new(Shared {
        lanes: Mutex::new(Lanes::default()),
        began: Instant::now(),
        capacity: capacity.max(1),
        ready: Notify::new(),
        room: Notify::new(),
        metrics: Arc::clone(&metrics),
    });
    let budget = One::new_budget();
    let destination = crate::spans::Destination::of(&*bus, &spec);
    // The workers stop at `stop`: the reader's end plus the drain.
    let stop = CancellationToken::new();
    let reading_done = CancellationToken::new();
    let mut workers = JoinSet::new();
    for _ in 0..spec.concurrency.max(1) {
        let one = One::new(&bus, &metrics, &destination, policy, &shutdown, &budget);
        let (shared, handler, stop, reading_done) = (
            Arc::clone(&shared),
            handler.clone(),
            stop.clone(),
            reading_done.clone(),
        );
        workers.spawn(async move {
            loop {
                let queued = loop {
                    // Past the drain after a shutdown: the rest is left to the sweeps.
                    if stop.is_cancelled() {
                        break None;
                    }
                    // Registered before looking, so a push between the look and the wait is
                    // not missed.
                    let ready = shared.ready.notified();
                    if let Some(queued) = shared.take() {
                        break Some(queued);
                    }
                    if reading_done.is_cancelled() && shared.lock().is_empty() {
                        break None;
                    }
                    tokio::select! {
                        () = ready => {}
                        () = stop.cancelled() => break None,
                        // Once: to look whether the lanes emptied after the reader stopped.
                        () = reading_done.cancelled(), if !reading_done.is_cancelled() => {}
                    }
                };
                let Some(queued) = queued else { break };
                one.clone()
                    .handle_spanned(queued.delivery.clone(), handler.clone())
                    .await;
                shared.done(&queued);
                drop(queued);
            }
        });
    }
    // The runtime's lateness, timed on a sleep of its own: the cap's one input.
    tokio::spawn(time_lateness(Arc::clone(&shared), stop.clone()));
    let read = read(&shared, subscription, &shutdown).await;
    reading_done.cancel();
    // Shut down (or the bus closed): the workers go on with what is queued for a while.
    let deadline = Instant::now() + DRAIN;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                Some(joined) => task_ended(joined, &metrics, &bus.topic_name(spec.topic)),
                None => break,
            },
            () = tokio::time::sleep_until(deadline.into()) => {
                stop.cancel();
                while let Some(joined) = workers.join_next().await {
                    task_ended(joined, &metrics, &bus.topic_name(spec.topic));
                }
                break;
            }
        }
    }
    // The workers are done: the lateness timer with them.
    stop.cancel();
    let left = shared.lock().drain();
    if !left.is_empty() {
        for queued in &left {
            metrics
                .dispatch_queued
                .with_label_values(&[&queued.tenant])
                .dec();
        }
        tracing::info!(
            left = left.len(),
            "stopped with requests still queued; the sweeps republish their commands when due"
        );
    }
    read
}

/// Sleeps [`hold::TICK_MS`] over and over until `stop`, and after each sets the lanes' cap from
/// how late it woke.
async fn time_lateness(shared: Arc<Shared>, stop: CancellationToken) {
    let tick = Duration::from_millis(hold::TICK_MS);
    loop {
        let slept = Instant::now();
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = stop.cancelled() => return,
        }
        let late_ms = slept.elapsed().saturating_sub(tick).as_secs_f64() * 1e3;
        shared.lock().hold(late_ms);
    }
}

/// Reads deliveries into the lanes while they have room, until shutdown or the bus closes.
async fn read(
    shared: &Shared,
    mut subscription: Subscription,
    shutdown: &CancellationToken,
) -> Result<(), BusError> {
    loop {
        while shared.full() {
            let room = shared.room.notified();
            if !shared.full() {
                break;
            }
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                () = room => {}
            }
        }
        let delivery = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            delivery = subscription.next() => match delivery {
                Some(delivery) => delivery,
                None => return Ok(()),
            },
        };
        let room = match delivery.ack_keeping_room().await {
            Ok(room) => room,
            Err(BusError::Closed) => return Ok(()),
            Err(e) => {
                // The partition moved to another member, which is handed the request again.
                tracing::debug!(error = %e, "acknowledgement refused; the request is not queued");
                continue;
            }
        };
        let tenant = delivery
            .message
            .header(TENANT_HEADER)
            .and_then(|value| std::str::from_utf8(value).ok())
            .filter(|tenant| !tenant.is_empty() && tenant.len() <= 64)
            .unwrap_or(ANONYMOUS)
            .to_owned();
        shared.push(Queued {
            delivery,
            tenant,
            _room: room,
        });
    }
}
