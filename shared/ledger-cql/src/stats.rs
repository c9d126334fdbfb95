//! Round trips to the cluster per ledger operation, split into lightweight transactions (a
//! Paxos round each), SERIAL reads (the same Paxos read, used to settle unknown outcomes) and
//! plain reads and writes (a batch of plain writes is one round trip), and the time each kind
//! waited for its answer. Counted with atomics on every call; [`CqlStats::snapshot`] is what a
//! metrics exporter reads (`sluice_ledger_round_trips_total{op, kind}` and
//! `sluice_ledger_round_trip_seconds_total{op, kind}`: their ratio is an operation's mean
//! latency, which tells a slow store from a pipeline that waits elsewhere).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use serde::Serialize;

/// A ledger operation, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    Reserve,
    ClaimBusinessKey,
    /// `acquire_lease`: PENDING/APPROVED → LEASED with the next epoch.
    Lease,
    /// `finalize`: LEASED → outcome under the same epoch.
    Finalize,
    /// Any other audited transition (observe, approve, cancel, compensate, …).
    Transition,
    /// A write that is not a transition: a lease extension, a sweep moving a due time.
    QuietWrite,
    Get,
    ListRun,
    ListRuns,
    Due,
    AuditAppend,
    AuditRead,
    Purge,
    /// Sweep-shard leases and member announcements.
    Sweep,
    /// Flow controls: pauses and circuit breakers.
    Flow,
    /// Webhook deliveries.
    Webhook,
    /// Spend budgets' counters and holds.
    Budget,
    /// Evidence received by webhook.
    Evidence,
    /// Approval links' uses.
    Link,
    /// The reference index of evidence matched by the upstream's reference.
    Reference,
}

impl Op {
    pub const ALL: [Self; 20] = [
        Self::Reserve,
        Self::ClaimBusinessKey,
        Self::Lease,
        Self::Finalize,
        Self::Transition,
        Self::QuietWrite,
        Self::Get,
        Self::ListRun,
        Self::ListRuns,
        Self::Due,
        Self::AuditAppend,
        Self::AuditRead,
        Self::Purge,
        Self::Sweep,
        Self::Flow,
        Self::Webhook,
        Self::Budget,
        Self::Evidence,
        Self::Link,
        Self::Reference,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reserve => "reserve",
            Self::ClaimBusinessKey => "claim_business_key",
            Self::Lease => "lease",
            Self::Finalize => "finalize",
            Self::Transition => "transition",
            Self::QuietWrite => "quiet_write",
            Self::Get => "get",
            Self::ListRun => "list_run",
            Self::ListRuns => "list_runs",
            Self::Due => "due",
            Self::AuditAppend => "audit_append",
            Self::AuditRead => "audit_read",
            Self::Purge => "purge",
            Self::Sweep => "sweep_shards",
            Self::Flow => "flow_controls",
            Self::Webhook => "webhooks",
            Self::Budget => "budgets",
            Self::Evidence => "evidence",
            Self::Link => "approval_links",
            Self::Reference => "evidence_references",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What a round trip was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lwt,
    Serial,
    Plain,
}

#[derive(Debug, Default)]
struct Counters {
    calls: AtomicU64,
    lwt: AtomicU64,
    serial: AtomicU64,
    plain: AtomicU64,
    /// Microseconds waited for the answers of each kind.
    lwt_us: AtomicU64,
    serial_us: AtomicU64,
    plain_us: AtomicU64,
    /// LWTs that did not apply because the run's audit head or the row's version moved (the
    /// guard still holding), and were tried again.
    retries: AtomicU64,
    /// LWTs whose outcome was unknown (a timeout) and was settled by a SERIAL read.
    unknown: AtomicU64,
    /// Reservations that took their run to be new and found it was not (a failed LWT).
    guesses_missed: AtomicU64,
}

/// Round-trip counters of one ledger; shared by its clones.
#[derive(Debug, Default)]
pub struct CqlStats {
    ops: [Counters; Op::ALL.len()],
}

/// The counts of one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct OpCounts {
    pub calls: u64,
    pub lwt: u64,
    pub serial: u64,
    pub plain: u64,
    /// Microseconds waited for the answers of each kind.
    pub lwt_us: u64,
    pub serial_us: u64,
    pub plain_us: u64,
    pub retries: u64,
    pub unknown: u64,
    pub guesses_missed: u64,
}

impl std::ops::Sub for OpCounts {
    type Output = Self;
    fn sub(self, earlier: Self) -> Self {
        Self {
            calls: self.calls - earlier.calls,
            lwt: self.lwt - earlier.lwt,
            serial: self.serial - earlier.serial,
            plain: self.plain - earlier.plain,
            lwt_us: self.lwt_us - earlier.lwt_us,
            serial_us: self.serial_us - earlier.serial_us,
            plain_us: self.plain_us - earlier.plain_us,
            retries: self.retries - earlier.retries,
            unknown: self.unknown - earlier.unknown,
            guesses_missed: self.guesses_missed - earlier.guesses_missed,
        }
    }
}

/// All counts at one moment, by operation name.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct StatsSnapshot {
    pub ops: BTreeMap<&'static str, OpCounts>,
}

impl StatsSnapshot {
    pub fn op(&self, op: Op) -> OpCounts {
        self.ops.get(op.as_str()).copied().unwrap_or_default()
    }

    /// Lightweight transactions of all operations.
    pub fn total_lwt(&self) -> u64 {
        self.ops.values().map(|c| c.lwt).sum()
    }

    /// Plain round trips of all operations.
    pub fn total_plain(&self) -> u64 {
        self.ops.values().map(|c| c.plain).sum()
    }

    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &StatsSnapshot) -> StatsSnapshot {
        StatsSnapshot {
            ops: self
                .ops
                .iter()
                .map(|(name, counts)| {
                    let before = earlier.ops.get(name).copied().unwrap_or_default();
                    (*name, *counts - before)
                })
                .collect(),
        }
    }
}

impl CqlStats {
    pub(crate) fn call(&self, op: Op) {
        self.ops[op.index()].calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one round trip of `op` now, and the time until the returned [`Trip`] is dropped
    /// as its wait: hold it across the call's `.await`, error paths included.
    #[must_use = "the round trip's wait is counted when the trip is dropped"]
    pub(crate) fn round_trip(&self, op: Op, kind: Kind) -> Trip<'_> {
        let counters = &self.ops[op.index()];
        let (count, waited) = match kind {
            Kind::Lwt => (&counters.lwt, &counters.lwt_us),
            Kind::Serial => (&counters.serial, &counters.serial_us),
            Kind::Plain => (&counters.plain, &counters.plain_us),
        };
        count.fetch_add(1, Ordering::Relaxed);
        Trip {
            waited,
            started: Instant::now(),
        }
    }

    pub(crate) fn retry(&self, op: Op) {
        self.ops[op.index()].retries.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn guess_missed(&self, op: Op) {
        self.ops[op.index()]
            .guesses_missed
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn unknown(&self, op: Op) {
        self.ops[op.index()].unknown.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            ops: Op::ALL
                .iter()
                .map(|op| {
                    let c = &self.ops[op.index()];
                    let counts = OpCounts {
                        calls: c.calls.load(Ordering::Relaxed),
                        lwt: c.lwt.load(Ordering::Relaxed),
                        serial: c.serial.load(Ordering::Relaxed),
                        plain: c.plain.load(Ordering::Relaxed),
                        lwt_us: c.lwt_us.load(Ordering::Relaxed),
                        serial_us: c.serial_us.load(Ordering::Relaxed),
                        plain_us: c.plain_us.load(Ordering::Relaxed),
                        retries: c.retries.load(Ordering::Relaxed),
                        unknown: c.unknown.load(Ordering::Relaxed),
                        guesses_missed: c.guesses_missed.load(Ordering::Relaxed),
                    };
                    (op.as_str(), counts)
                })
                .collect(),
        }
    }
}

/// One round trip under way: adds its wait to its counter when dropped.
#[derive(Debug)]
pub(crate) struct Trip<'a> {
    waited: &'a AtomicU64,
    started: Instant,
}

impl Drop for Trip<'_> {
    fn drop(&mut self) {
        let us = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.waited.fetch_add(us, Ordering::Relaxed);
    }
}
