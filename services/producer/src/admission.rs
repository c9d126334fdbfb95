//! Admission: whether a producer takes on a new effect. Refused with 503 and `Retry-After`,
//! before anything is recorded, when the pipeline is already behind: the ledger's writes are
//! slow, the bus client's queue is long, or the dispatchers' queue holds more than they take on
//! in `producer.max_dispatch_queue_ms` (the decisions are `sluice_core::load`'s; the reasons in
//! docs/decisions.md, "No work amplification under a slow ledger"). Work accepted then would
//! wait past its reservation lease, and every lapse costs the ledger more writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::StatusCode;
use sluice_bus::{Admission, Group, QueueDepth, Topic};
use sluice_core::load::{self, DrainRate};
use sluice_core::time::Timestamp;
use sluice_runtime::Shutdown;

use crate::{Api, ApiError};

/// How often the dispatchers' queue is read from the bus.
const QUEUE_READ_EVERY: Duration = Duration::from_secs(1);
/// How long readings may fail before the last one is given up (see [`DispatchQueue::give_up`]).
const READ_GRACE: Duration = Duration::from_secs(10);

/// The dispatchers' queue as last read — requests waiting, and the rate they are taken on —
/// and what this producer admitted since. A reading is a second old and only sees requests
/// already published, while a burst is admitted in milliseconds and a reservation on a slow
/// ledger takes seconds before its request is published: admitting on the reading alone let
/// a burst of 5,000 through on a cold node whose dispatchers took 44 a second. So each
/// admission is counted here until its request is published (or the submission ends without
/// one), and the queue is taken to hold the reading plus every admission that had not ended
/// when the reading began.
#[derive(Debug, Default)]
pub(crate) struct DispatchQueue {
    reading: Mutex<Reading>,
    /// Admissions ended (published, or given up without a request) in all, for the reading's
    /// baseline.
    ended: AtomicU64,
}

#[derive(Debug, Default)]
struct Reading {
    /// Requests waiting as last read; `None` after a reading failed: a producer that cannot
    /// read the queue admits on its other signals rather than on a figure it can no longer
    /// update. `None` until [`watch_dispatch_queue`] starts, then 0 until its first reading, so
    /// a burst at start is held to the floor too.
    waiting: Option<u64>,
    rate: DrainRate,
    /// Admissions in all, and `ended` as it was when the last good reading began.
    admitted: u64,
    ended_before: u64,
    /// Each tenant's admissions not yet ended: its share counts them, since its in-flight
    /// figure only grows once a reservation is written.
    unended: HashMap<Arc<str>, u64>,
}

impl Reading {
    /// The queue as this producer knows it: the reading, plus the admissions that had not
    /// ended when it began (they may have been published after it) and those since.
    fn estimate(&self) -> Option<u64> {
        self.waiting
            .map(|waiting| waiting.saturating_add(self.admitted.saturating_sub(self.ended_before)))
    }
}

/// One admission counted in the queue's estimate until it is dropped: after its request's
/// publish, or when its submission ends without one.
#[derive(Debug)]
pub(crate) struct Ticket {
    queue: Arc<DispatchQueue>,
    tenant: Arc<str>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut reading = self
            .queue
            .reading
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = reading.unended.get_mut(&*self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                reading.unended.remove(&*self.tenant);
            }
        }
        self.queue.ended.fetch_add(1, Ordering::Relaxed);
    }
}

impl DispatchQueue {
    /// Takes a reading that began when `ended_before` admissions had ended.
    fn read(&self, now: Timestamp, depth: QueueDepth, ended_before: u64) {
        let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        reading.rate.observe(now, depth.taken);
        reading.waiting = Some(depth.waiting);
        reading.ended_before = ended_before;
        tracing::debug!(
            waiting = depth.waiting,
            taken = depth.taken,
            per_s = reading.rate.per_s(),
            estimate = reading.estimate(),
            "the dispatchers' queue read"
        );
    }

    /// Stops deciding on the queue until the next reading: readings have failed for
    /// [`READ_GRACE`], or the bus has no such figure. A reading that fails for less keeps the
    /// last one and the count of admissions since (dropping it at once let 4,500 effects
    /// through at a pipeline's start, while the new topics' leaders were not yet known); one
    /// that keeps failing (say the offset fetch is not allowed) must not leave this producer
    /// refusing everything once its own count passed the limit. Whether it was deciding.
    fn give_up(&self) -> bool {
        self.reading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting
            .take()
            .is_some()
    }

    /// Counts the queue as empty until the first reading: called as the reader starts, before
    /// any submission is served.
    fn arm(&self) {
        self.reading
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .waiting = Some(0);
    }

    /// Decides on one more request of `tenant`, whose recorded part is `share`, and when
    /// admitted counts it (under the same lock, so concurrent submissions cannot all pass on
    /// one figure).
    fn admit(
        self: &Arc<Self>,
        max_queue_ms: u64,
        tenant: &str,
        share: impl FnOnce() -> load::TenantShare,
    ) -> Result<Ticket, load::Admission> {
        let mut reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(waiting) = reading.estimate() {
            let unended = reading.unended.get(tenant).copied().unwrap_or(0);
            let verdict = load::admit_queue_for(
                waiting,
                &reading.rate,
                i64::try_from(max_queue_ms).unwrap_or(i64::MAX),
                || {
                    let recorded = share();
                    load::TenantShare {
                        in_flight: recorded.in_flight.saturating_add(unended),
                        ..recorded
                    }
                },
            );
            if verdict != load::Admission::Admit {
                return Err(verdict);
            }
        }
        reading.admitted += 1;
        let tenant: Arc<str> = match reading.unended.get_key_value(tenant) {
            Some((name, _)) => Arc::clone(name),
            None => Arc::from(tenant),
        };
        *reading.unended.entry(Arc::clone(&tenant)).or_insert(0) += 1;
        Ok(Ticket {
            queue: Arc::clone(self),
            tenant,
        })
    }
}

/// Room for one dispatch request: the bus's, given to the publish, and the count in the
/// queue's estimate, held until the publish is done.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) room: Admission,
    pub(crate) ticket: Option<Ticket>,
}

/// One turn per tenant at the bus's admission: a tenant's submissions wait for room one at a
/// time, so the bus's queue of waiters (first come, first served) holds at most one of each
/// tenant and room that comes back goes to the tenants in turn. Without it a tenant's burst of
/// submissions queued ahead of everyone else's. Tenants are the configuration's tokens and
/// the tenants they may name, so the map stays as small as the configuration.
#[derive(Debug, Default)]
pub(crate) struct TenantTurns(Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>>);

impl TenantTurns {
    fn of(&self, tenant: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(turn) = turns.get(tenant) {
            return Arc::clone(turn);
        }
        let turn = Arc::new(tokio::sync::Mutex::new(()));
        turns.insert(Arc::from(tenant), Arc::clone(&turn));
        turn
    }
}

impl Api {
    /// Waits for room for one more dispatch request of `tenant` (see
    /// [`sluice_bus::Bus::admit`]), at most `admission_wait_ms`, unless the pipeline is behind
    /// already (a tenant under its share of the dispatchers' queue is admitted past it:
    /// `sluice_core::load::admit_queue_for`).
    pub(crate) async fn admit(&self, tenant: &str) -> Result<Admitted, ApiError> {
        // Behind already (the ledger's writes, the bus client's queue, the dispatchers' queue):
        // refused before the reservation, so work that could not start in time is never taken
        // on.
        let limits = load::LoadLimits {
            max_write_ms: i64::try_from(self.config.max_write_latency_ms).unwrap_or(i64::MAX),
            max_backlog: self.config.max_bus_backlog,
        };
        let verdict = match load::admit(
            self.ctx.ledger.write_latency_ms(),
            self.ctx.bus.backlog(),
            &limits,
        ) {
            load::Admission::Admit if self.config.max_dispatch_queue_ms == 0 => Ok(None),
            load::Admission::Admit => self
                .dispatch_queue
                .admit(self.config.max_dispatch_queue_ms, tenant, || {
                    self.share_of(tenant)
                })
                .map(Some),
            refused => Err(refused),
        };
        let ticket = match verdict {
            Ok(ticket) => ticket,
            Err(load::Admission::Refuse {
                code,
                why,
                retry_after_s,
            }) => {
                return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, why)
                    .with_details(serde_json::json!({ "retry_after_s": retry_after_s })));
            }
            Err(load::Admission::Admit) => None,
        };
        let wait = Duration::from_millis(self.config.admission_wait_ms);
        let turn = self.tenant_turns.of(tenant);
        let room = async {
            let _turn = turn.lock().await;
            self.ctx.bus.admit(Topic::Requested).await
        };
        match tokio::time::timeout(wait, room).await {
            Ok(Ok(room)) => Ok(Admitted { room, ticket }),
            Ok(Err(e)) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "bus_unavailable",
                e.to_string(),
            )),
            Err(_) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "dispatch_backlog_full",
                format!(
                    "the dispatcher has not taken on new work for {} ms (bus.admission \
                     requests wait for it); nothing was recorded, submit again later",
                    wait.as_millis()
                ),
            )),
        }
    }

    /// `tenant`'s effects in flight, and how many tenants have some (this one included), as
    /// the command gauges count them. A process that does not keep them (neither
    /// `metrics.command_gauges` nor `[tenants]` quotas), or has not read the ledger into them
    /// yet, knows no tenant's count: every tenant is then held to the queue's bound.
    fn share_of(&self, tenant: &str) -> load::TenantShare {
        if !self.ctx.metrics.commands.is_seeded() {
            return load::TenantShare {
                in_flight: u64::MAX,
                tenants: 1,
            };
        }
        let figures = self.ctx.metrics.commands.tenant_figures();
        let others = figures
            .iter()
            .filter(|(name, count)| *count > 0 && &**name != tenant)
            .count();
        load::TenantShare {
            in_flight: self.ctx.metrics.commands.in_flight(tenant),
            tenants: u64::try_from(others).unwrap_or(u64::MAX).saturating_add(1),
        }
    }
}

/// Reads the dispatchers' queue from the bus every second until `shutdown`; returns at once on
/// a bus that does not measure it (the embedded bus) or when the limit is off. Arms the
/// estimate when called, so submissions served from then on are counted.
pub(crate) fn watch_dispatch_queue(
    api: Api,
    shutdown: Shutdown,
) -> impl Future<Output = ()> + Send + 'static {
    if api.config.max_dispatch_queue_ms > 0 {
        api.dispatch_queue.arm();
    }
    read_dispatch_queue(api, shutdown)
}

async fn read_dispatch_queue(api: Api, shutdown: Shutdown) {
    if api.config.max_dispatch_queue_ms == 0 {
        return;
    }
    let queue = Arc::clone(&api.dispatch_queue);
    let dispatchers = api.ctx.bus.group_id(Group::Dispatchers);
    // Since when readings have failed, if the last one did.
    let mut failing: Option<std::time::Instant> = None;
    loop {
        // Admissions that end from here on may or may not be in the reading: counted as not.
        let ended_before = queue.ended.load(Ordering::Relaxed);
        // A reading of a broker that is down can take seconds: shutdown does not wait for it.
        let reading = tokio::select! {
            () = shutdown.cancelled() => return,
            reading = api.ctx.bus.queue_depth(Topic::Requested, &dispatchers) => reading,
        };
        match reading {
            Ok(None) => {
                // This bus bounds its queue at publish instead (`Bus::admit`): no estimate.
                queue.give_up();
                return;
            }
            Ok(Some(depth)) => {
                queue.read(api.ctx.clock.now(), depth, ended_before);
                if failing.take().is_some() {
                    tracing::info!(
                        waiting = depth.waiting,
                        "the dispatchers' queue can be read again"
                    );
                }
            }
            Err(e) => {
                let since = *failing.get_or_insert_with(|| {
                    tracing::info!(error = %e, "cannot read the dispatchers' queue; keeping the last reading for up to {} s", READ_GRACE.as_secs());
                    std::time::Instant::now()
                });
                if since.elapsed() >= READ_GRACE && queue.give_up() {
                    tracing::warn!(error = %e, "cannot read the dispatchers' queue for {} s; admitting on the other signals until it can be read", READ_GRACE.as_secs());
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(QUEUE_READ_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tenant with its whole even share in flight: the queue's bound binds it.
    const ANY: load::TenantShare = load::TenantShare {
        in_flight: u64::MAX,
        tenants: 1,
    };
    use sluice_core::load::QUEUE_FLOOR;

    fn refused(queue: &Arc<DispatchQueue>) -> bool {
        queue.admit(5_000, "t", || ANY).is_err()
    }

    #[test]
    fn a_burst_before_any_reading_is_held_to_the_floor() {
        let queue = Arc::new(DispatchQueue::default());
        queue.arm();
        let tickets: Vec<Ticket> = (0..=QUEUE_FLOOR)
            .map(|n| {
                queue
                    .admit(5_000, "t", || ANY)
                    .unwrap_or_else(|_| panic!("admission {n}"))
            })
            .collect();
        assert!(
            refused(&queue),
            "the floor's worth and one are admitted, no more"
        );
        // Published: still waiting for the dispatchers until a reading says otherwise.
        drop(tickets);
        assert!(refused(&queue));
    }

    #[test]
    fn a_reading_replaces_what_ended_before_it_began_and_keeps_the_rest() {
        let queue = Arc::new(DispatchQueue::default());
        queue.arm();
        let mut tickets: Vec<Ticket> = (0..=QUEUE_FLOOR)
            .map(|_| queue.admit(5_000, "t", || ANY).expect("admitted"))
            .collect();
        // Half were published before a reading began; it found the dispatchers had taken
        // every one of those.
        let half = tickets.split_off(tickets.len() / 2);
        drop(tickets);
        let ended_before = queue.ended.load(Ordering::Relaxed);
        let empty = QueueDepth {
            waiting: 0,
            taken: 250,
        };
        queue.read(Timestamp::from_millis(1_000), empty, ended_before);
        assert_eq!(
            queue.reading.lock().expect("lock").estimate(),
            Some(half.len() as u64)
        );
        assert!(!refused(&queue), "room again for what the dispatchers took");
        // The rest, published after the reading began, stay counted until the next one.
        drop(half);
        let reading = queue.reading.lock().expect("lock");
        assert_eq!(reading.estimate(), Some(QUEUE_FLOOR / 2 + 2));
    }

    #[test]
    fn a_tenants_admissions_not_yet_recorded_count_in_its_share() {
        // Two tenants, and a ledger whose figures have not caught up with any admission yet
        // (each reservation is still being written): the queue's bound is passed, and the
        // tenant that filled it is still held to its half of the floor by what it was admitted.
        let queue = Arc::new(DispatchQueue::default());
        queue.arm();
        let unrecorded = load::TenantShare {
            in_flight: 0,
            tenants: 2,
        };
        let held: Vec<Ticket> = (0..=QUEUE_FLOOR)
            .map(|_| queue.admit(5_000, "a", || unrecorded).expect("admitted"))
            .collect();
        assert!(
            queue.admit(5_000, "a", || unrecorded).is_err(),
            "the tenant that filled the queue"
        );
        let other: Vec<Ticket> = (0..QUEUE_FLOOR / 2)
            .map(|_| {
                queue
                    .admit(5_000, "b", || unrecorded)
                    .expect("b under its share")
            })
            .collect();
        assert!(
            queue.admit(5_000, "b", || unrecorded).is_err(),
            "b at its share"
        );
        drop(other);
        drop(held);
    }

    #[test]
    fn a_producer_that_cannot_read_the_queue_admits_on_its_other_signals() {
        let queue = Arc::new(DispatchQueue::default());
        queue.arm();
        let held: Vec<Ticket> = (0..=QUEUE_FLOOR)
            .map(|_| queue.admit(5_000, "t", || ANY).expect("admitted"))
            .collect();
        assert!(refused(&queue));
        assert!(queue.give_up(), "it was deciding");
        assert!(!queue.give_up(), "and is no longer");
        drop(held);
        for _ in 0..=2 * QUEUE_FLOOR {
            assert!(!refused(&queue));
        }
    }
}
