//! Admission: whether a producer takes on a new effect. Refused with 503 and `Retry-After`,
//! before anything is recorded, when the pipeline is already behind: the ledger's writes are
//! slow, the bus client's queue is long, or the dispatchers' queue holds more than they take on
//! in `producer.max_dispatch_queue_ms` (the decisions are `sluice_core::load`'s; the reasons in
//! docs/decisions.md, "No work amplification under a slow ledger"). Work accepted then would
//! wait past its reservation lease, and every lapse costs the ledger more writes.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::StatusCode;
use sluice_bus::{Admission, DISPATCHERS, Topic};
use sluice_core::load::{self, DrainRate};
use sluice_runtime::Shutdown;

use crate::{Api, ApiError};

/// How often the dispatchers' queue is read from the bus.
const QUEUE_READ_EVERY: Duration = Duration::from_secs(1);

/// The dispatchers' queue as last read: requests waiting, and the rate they are taken on.
/// `None` until a reading succeeds, and again after one fails: a producer that cannot read the
/// queue admits on its other signals rather than on a figure it can no longer update.
#[derive(Debug, Default)]
pub(crate) struct DispatchQueue {
    reading: Mutex<(Option<u64>, DrainRate)>,
}

impl DispatchQueue {
    fn admission(&self, max_queue_ms: u64) -> load::Admission {
        let reading = self.reading.lock().unwrap_or_else(PoisonError::into_inner);
        match reading.0 {
            Some(waiting) => load::admit_queue(
                waiting,
                &reading.1,
                i64::try_from(max_queue_ms).unwrap_or(i64::MAX),
            ),
            None => load::Admission::Admit,
        }
    }
}

impl Api {
    /// Waits for room for one more dispatch request (see [`sluice_bus::Bus::admit`]), at most
    /// `admission_wait_ms`, unless the pipeline is behind already.
    pub(crate) async fn admit(&self) -> Result<Admission, ApiError> {
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
            load::Admission::Admit => self
                .dispatch_queue
                .admission(self.config.max_dispatch_queue_ms),
            refused => refused,
        };
        if let load::Admission::Refuse {
            code,
            why,
            retry_after_s,
        } = verdict
        {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, why)
                .with_details(serde_json::json!({ "retry_after_s": retry_after_s })));
        }
        let wait = Duration::from_millis(self.config.admission_wait_ms);
        match tokio::time::timeout(wait, self.ctx.bus.admit(Topic::Requested)).await {
            Ok(Ok(admission)) => Ok(admission),
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
}

/// Reads the dispatchers' queue from the bus every second until `shutdown`; returns at once on
/// a bus that does not measure it (the embedded bus) or when the limit is off.
pub(crate) async fn watch_dispatch_queue(api: Api, shutdown: Shutdown) {
    if api.config.max_dispatch_queue_ms == 0 {
        return;
    }
    let queue = Arc::clone(&api.dispatch_queue);
    let mut failing = false;
    loop {
        // A reading of a broker that is down can take seconds: shutdown does not wait for it.
        let reading = tokio::select! {
            () = shutdown.cancelled() => return,
            reading = api.ctx.bus.queue_depth(Topic::Requested, DISPATCHERS) => reading,
        };
        match reading {
            Ok(None) => return,
            Ok(Some(depth)) => {
                let now = api.ctx.clock.now();
                let mut reading = queue.reading.lock().unwrap_or_else(PoisonError::into_inner);
                reading.1.observe(now, depth.taken);
                reading.0 = Some(depth.waiting);
                failing = false;
            }
            Err(e) => {
                queue
                    .reading
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .0 = None;
                if !failing {
                    tracing::warn!(error = %e, "cannot read the dispatchers' queue; admitting on the other signals until it can be read");
                }
                failing = true;
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(QUEUE_READ_EVERY) => {}
        }
    }
}
