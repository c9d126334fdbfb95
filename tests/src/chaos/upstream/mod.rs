//! The runner's own upstream: a bank, ticket, mail, SMS and search service on loopback that
//! speaks Sluice's HTTP tool contract, misbehaves on seeded dice, and keeps the ground truth.
//!
//! Written for the runner, not shared with the demo upstream (`services/upstream`): the demo's
//! faults were chosen by the same hands as the pipeline's code, and the invariants here must be
//! read from a record nobody else writes. Every commit and reversal is in its [`Record`]; the
//! invariants compare Sluice's outcome of each command with it.
//!
//! * `faults` — the fault kinds and rates, drawn per request from the seed.
//! * `record` — the record itself and its lookups (pure).
//! * `server` — the routes and the acting out of each fault.

pub mod faults;
pub mod record;
pub mod server;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use faults::{DispatchFault, FaultRates, FaultTimes, Phase, ReverseFault};
pub use record::{Commit, EndpointSpec, KeyHandling, Record};

use server::Shared;

/// A running ground-truth upstream; stops when dropped.
#[derive(Debug)]
pub struct ChaosUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    server: Option<JoinHandle<()>>,
}

/// What the upstream knows of one idempotency key, for an operator's evidence.
#[derive(Debug, Clone)]
pub struct KeyView {
    pub commits: Vec<Commit>,
    /// Requests for the key whose work is still running (a held answer, a late commit).
    pub running: u32,
}

impl KeyView {
    pub fn live(&self) -> Vec<&Commit> {
        self.commits.iter().filter(|c| c.live()).collect()
    }
}

impl ChaosUpstream {
    /// Serves `endpoints` on a free loopback port with `rates`, drawing from `seed`.
    pub async fn start(
        endpoints: Vec<EndpointSpec>,
        rates: FaultRates,
        times: FaultTimes,
        seed: u64,
    ) -> std::io::Result<Self> {
        let (listener, addr) = server::bind().await?;
        let shared = Arc::new(Shared {
            seed,
            endpoints: endpoints
                .into_iter()
                .map(|e| (e.name.clone(), e))
                .collect::<HashMap<_, _>>(),
            rates: Mutex::new(rates),
            times,
            world: Mutex::default(),
            phase: Mutex::default(),
        });
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(server::accept_loop(
            listener,
            server::router(Arc::clone(&shared)),
            shutdown.clone(),
        ));
        Ok(Self {
            addr,
            shared,
            shutdown,
            server: Some(server),
        })
    }

    /// `http://127.0.0.1:<port>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets the phase (rate limited, an outage of some endpoints, or normal again) from the
    /// next request on.
    pub fn set_phase(&self, phase: Phase) {
        *self
            .shared
            .phase
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = phase;
    }

    /// Stops every fault from the next request on. Late commits already under way still land,
    /// and commits already lagging are still seen late: that is the world Sluice must settle.
    /// A slow lookup key stays slow ([`FaultRates::slow_lookup`]): its commands must end by
    /// counting their cut-short checks, not by waiting for the upstream to recover.
    pub fn calm(&self) {
        let mut rates = self
            .shared
            .rates
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *rates = rates.calmed();
        drop(rates);
        self.set_phase(Phase::Normal);
    }

    pub fn times(&self) -> &FaultTimes {
        &self.shared.times
    }

    /// The record so far.
    pub fn record(&self) -> Record {
        self.shared.world().snapshot()
    }

    /// One idempotency key's commits and running work.
    pub fn key_view(&self, idempotency_key: &str) -> KeyView {
        let (commits, running) = self.shared.world().key_view(idempotency_key);
        KeyView { commits, running }
    }

    /// Requests whose work is still running anywhere.
    pub fn running(&self) -> u32 {
        self.shared.world().running()
    }

    /// Stops accepting and drops open connections; running late commits are abandoned.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

impl Drop for ChaosUpstream {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

#[cfg(test)]
mod tests;
