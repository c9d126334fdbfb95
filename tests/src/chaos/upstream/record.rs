//! The ground truth: every dispatch, commit, lookup and reversal the upstream saw, in its own
//! record, independent of anything Sluice stores.
//!
//! Pure and synchronous: the HTTP layer holds the lock, calls one method, and acts out the
//! fault around it. A commit is recorded with the Sluice headers of the request that made it
//! (idempotency key, business key, run id, command key), the time it landed and the time
//! lookups first see it; a reversal with the compensation's own key and the dispatch key it
//! names. The invariants are read from a [`Record`] snapshot of this.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::faults::{DispatchFault, ReverseFault};

/// Milliseconds since the Unix epoch, the time base of the record (and of Sluice's audit).
pub fn now_ms() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// What one endpoint is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointSpec {
    /// The path segment: `/e/<name>`.
    pub name: String,
    /// What it does with an Idempotency-Key it has seen.
    pub keys: KeyHandling,
    /// A read (OBSERVE_ONLY): it commits nothing.
    pub read_only: bool,
    /// It may commit twice behind one 2xx. Only where the tool asks for its commits to be
    /// looked up again (`verify_after_commit`): elsewhere nothing could ever see the second
    /// commit, and no platform could be held to undoing it.
    pub double_commits: bool,
    /// The client's timeout for a dispatch (the tool's), which held answers outlast.
    pub timeout_ms: u64,
    /// The client's timeout for a reversal (the tool's compensate).
    pub reverse_timeout_ms: u64,
    /// How long a status check for a slow lookup key takes to answer: longer than the tool's
    /// check timeout and the reconciler's sweep item budget (see `FaultRates::slow_lookup`).
    pub slow_lookup_ms: u64,
}

/// How an endpoint treats the Idempotency-Key header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyHandling {
    /// A key seen before answers its first commit again; a key whose commit is still being
    /// processed is answered 409 (in progress). An honest IDEMPOTENT upstream.
    Deduplicate,
    /// Every request is a new commit (a bank: NON_IDEMPOTENT by nature).
    Commit,
    /// Every request is a new commit although the tool is declared IDEMPOTENT: a dishonest
    /// upstream that ignores the key.
    Ignore,
}

/// The Sluice headers of a request, as far as the upstream records them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CallMeta {
    pub idempotency_key: Option<String>,
    pub business_key: Option<String>,
    pub run_id: Option<String>,
    pub command_key: Option<String>,
    /// On a reversal: the dispatch's idempotency key it undoes.
    pub dispatch_key: Option<String>,
    /// On a dispatch: the `ref` argument of its body, unique per effect the runner plans, so
    /// the record says under which keys one effect reached the upstream.
    pub effect_ref: Option<String>,
}

/// One commit, live or reversed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Commit {
    pub id: String,
    pub endpoint: String,
    pub meta: CallMeta,
    /// The dispatch request that made it.
    pub request: u64,
    /// The fault of that request (`late_commit`, `double_commit`, …).
    pub how: DispatchFault,
    pub committed_at: i64,
    /// When lookups first see it (later than `committed_at` for a lagged commit).
    pub visible_at: i64,
    pub reversal: Option<Reversal>,
}

impl Commit {
    pub fn live(&self) -> bool {
        self.reversal.is_none()
    }
}

/// How a commit was undone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reversal {
    pub id: String,
    pub at: i64,
    /// The compensation's Idempotency-Key.
    pub key: Option<String>,
    /// The dispatch key the compensation named.
    pub dispatch_key: Option<String>,
}

/// One dispatch request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DispatchRequest {
    pub seq: u64,
    pub endpoint: String,
    pub meta: CallMeta,
    pub arrived_at: i64,
    pub fault: DispatchFault,
    /// When its work ended (its commit landed, or it gave up); `None` while in progress.
    pub finished_at: Option<i64>,
    /// Answered 409 because an earlier request with the key was still in progress.
    pub in_progress: bool,
}

/// What a reversal request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReverseOutcome {
    Reversed,
    /// Reversed before under the same compensation key: answered as then.
    Replayed,
    /// No such commit: a reversal of something that never committed.
    UnknownCommit,
    /// Reversed before under another key: a second undo of one commit.
    AlreadyReversed,
    /// Held past the client's timeout without reversing.
    NotDone,
}

/// One reversal request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReverseRequest {
    pub endpoint: String,
    pub target: String,
    pub meta: CallMeta,
    pub at: i64,
    pub fault: ReverseFault,
    pub outcome: ReverseOutcome,
    /// The target commit's idempotency key differs from the dispatch key the reversal named:
    /// it undoes another command's commit.
    pub foreign: bool,
}

/// What a lookup sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Absent,
    Present(String),
    /// Several live commits, oldest first.
    Duplicate(Vec<String>),
}

/// Which key a lookup goes by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupBy {
    BusinessKey,
    IdempotencyKey,
}

/// A status check for a slow lookup key: answered only after every client of it gave up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlowLookup {
    pub endpoint: String,
    /// The key looked up by: a business key or an idempotency key.
    pub key: String,
    pub at: i64,
}

/// Counters that are not records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counters {
    /// Status checks answered from the record (slow ones are counted in `slow_lookups`).
    pub status_checks: u64,
    pub inconclusive_checks: u64,
    /// Status checks for a slow lookup key (see `FaultRates::slow_lookup`).
    pub slow_lookups: u64,
    /// Lookups that missed a commit which had landed but was not yet visible.
    pub lagged_misses: u64,
    pub lagged_commits: u64,
    pub reads: u64,
    pub read_faults: u64,
}

/// A copy of everything recorded, for the invariants and the figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Record {
    pub commits: Vec<Commit>,
    pub dispatches: Vec<DispatchRequest>,
    pub reversals: Vec<ReverseRequest>,
    pub slow_lookups: Vec<SlowLookup>,
    pub counters: Counters,
}

impl Record {
    /// The commits made under `idempotency_key`, oldest first.
    pub fn commits_of(&self, idempotency_key: &str) -> Vec<&Commit> {
        self.commits
            .iter()
            .filter(|c| c.meta.idempotency_key.as_deref() == Some(idempotency_key))
            .collect()
    }

    /// The dispatch requests that carried `idempotency_key`, in arrival order.
    pub fn dispatches_of(&self, idempotency_key: &str) -> Vec<&DispatchRequest> {
        self.dispatches
            .iter()
            .filter(|d| d.meta.idempotency_key.as_deref() == Some(idempotency_key))
            .collect()
    }

    /// Faults drawn for dispatch requests, by kind (`none` included).
    pub fn dispatch_faults(&self) -> BTreeMap<DispatchFault, u64> {
        let mut counts = BTreeMap::new();
        for request in &self.dispatches {
            *counts.entry(request.fault).or_default() += 1;
        }
        counts
    }
}

/// The upstream's state.
#[derive(Debug, Default)]
pub struct World {
    record: Record,
    /// Commit indices by (endpoint, idempotency key) and by (endpoint, business key).
    by_idem: HashMap<(String, String), Vec<usize>>,
    by_business: HashMap<(String, String), Vec<usize>>,
    by_id: HashMap<String, usize>,
    /// Requests per (endpoint, key) so far: the ordinal that picks a request's fault.
    ordinals: HashMap<(String, String, &'static str), u64>,
    /// Work still running per idempotency key: handlers and scheduled late commits.
    in_flight: HashMap<String, u32>,
    /// Late commits scheduled per (endpoint, idempotency key) and not yet landed.
    scheduled: HashMap<(String, String), u32>,
    next_id: u64,
}

impl World {
    /// The how-many-th request of `kind` this is for `key` at `endpoint` (from 0).
    pub fn ordinal(&mut self, endpoint: &str, kind: &'static str, key: &str) -> u64 {
        let slot = self
            .ordinals
            .entry((endpoint.to_owned(), key.to_owned(), kind))
            .or_default();
        let ordinal = *slot;
        *slot += 1;
        ordinal
    }

    /// Records a dispatch request's arrival; returns its sequence number.
    pub fn arrive(&mut self, endpoint: &str, meta: &CallMeta, fault: DispatchFault) -> u64 {
        let seq = self.record.dispatches.len() as u64;
        self.record.dispatches.push(DispatchRequest {
            seq,
            endpoint: endpoint.to_owned(),
            meta: meta.clone(),
            arrived_at: now_ms(),
            fault,
            finished_at: None,
            in_progress: false,
        });
        if let Some(key) = &meta.idempotency_key {
            *self.in_flight.entry(key.clone()).or_default() += 1;
        }
        seq
    }

    /// The request's work is over (answered, or its late commit landed or was given up).
    pub fn finish(&mut self, seq: u64) {
        let Some(request) = self.record.dispatches.get_mut(seq as usize) else {
            return;
        };
        if request.finished_at.is_some() {
            return;
        }
        request.finished_at = Some(now_ms());
        if let Some(key) = &request.meta.idempotency_key
            && let Some(count) = self.in_flight.get_mut(key)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.in_flight.remove(key);
            }
        }
    }

    /// Marks the request as answered "in progress" (409).
    pub fn mark_in_progress(&mut self, seq: u64) {
        if let Some(request) = self.record.dispatches.get_mut(seq as usize) {
            request.in_progress = true;
        }
    }

    /// The live commit of `key` at a deduplicating endpoint, if any.
    pub fn deduplicated(&self, endpoint: &str, key: &str) -> Option<String> {
        self.by_idem
            .get(&(endpoint.to_owned(), key.to_owned()))
            .and_then(|indices| indices.first())
            .map(|&i| self.record.commits[i].id.clone())
    }

    /// Whether a late commit for `key` at `endpoint` is scheduled and has not landed.
    pub fn commit_scheduled(&self, endpoint: &str, key: &str) -> bool {
        self.scheduled
            .get(&(endpoint.to_owned(), key.to_owned()))
            .is_some_and(|n| *n > 0)
    }

    pub fn schedule(&mut self, endpoint: &str, key: &str) {
        *self
            .scheduled
            .entry((endpoint.to_owned(), key.to_owned()))
            .or_default() += 1;
    }

    pub fn unschedule(&mut self, endpoint: &str, key: &str) {
        let slot = (endpoint.to_owned(), key.to_owned());
        if let Some(n) = self.scheduled.get_mut(&slot) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.scheduled.remove(&slot);
            }
        }
    }

    /// Records a new commit made by request `seq`; lookups see it after `lag_ms`.
    pub fn commit(&mut self, endpoint: &str, seq: u64, how: DispatchFault, lag_ms: u64) -> String {
        self.next_id += 1;
        let id = format!("{endpoint}-{}", self.next_id);
        let meta = self
            .record
            .dispatches
            .get(seq as usize)
            .map(|r| r.meta.clone())
            .unwrap_or_default();
        let now = now_ms();
        let index = self.record.commits.len();
        if let Some(key) = &meta.idempotency_key {
            self.by_idem
                .entry((endpoint.to_owned(), key.clone()))
                .or_default()
                .push(index);
        }
        if let Some(key) = &meta.business_key {
            self.by_business
                .entry((endpoint.to_owned(), key.clone()))
                .or_default()
                .push(index);
        }
        if lag_ms > 0 {
            self.record.counters.lagged_commits += 1;
        }
        self.by_id.insert(id.clone(), index);
        self.record.commits.push(Commit {
            id: id.clone(),
            endpoint: endpoint.to_owned(),
            meta,
            request: seq,
            how,
            committed_at: now,
            visible_at: now + i64::try_from(lag_ms).unwrap_or(i64::MAX / 2),
            reversal: None,
        });
        id
    }

    /// What a lookup by `by` = `key` at `endpoint` sees now: live commits already visible.
    pub fn lookup(&mut self, endpoint: &str, by: LookupBy, key: &str) -> Lookup {
        let now = now_ms();
        let slot = (endpoint.to_owned(), key.to_owned());
        let indices = match by {
            LookupBy::BusinessKey => self.by_business.get(&slot),
            LookupBy::IdempotencyKey => self.by_idem.get(&slot),
        };
        let mut visible = Vec::new();
        let mut missed = false;
        for &i in indices.map(Vec::as_slice).unwrap_or_default() {
            let commit = &self.record.commits[i];
            if !commit.live() {
                continue;
            }
            if commit.visible_at <= now {
                visible.push(commit.id.clone());
            } else {
                missed = true;
            }
        }
        self.record.counters.status_checks += 1;
        if missed {
            self.record.counters.lagged_misses += 1;
        }
        match visible.len() {
            0 => Lookup::Absent,
            1 => Lookup::Present(visible.remove(0)),
            _ => Lookup::Duplicate(visible),
        }
    }

    /// Records a status check for a slow lookup key as it arrives.
    pub fn slow_lookup(&mut self, endpoint: &str, key: &str) {
        self.record.counters.slow_lookups += 1;
        self.record.slow_lookups.push(SlowLookup {
            endpoint: endpoint.to_owned(),
            key: key.to_owned(),
            at: now_ms(),
        });
    }

    pub fn count_inconclusive(&mut self) {
        self.record.counters.status_checks += 1;
        self.record.counters.inconclusive_checks += 1;
    }

    pub fn count_read(&mut self, faulted: bool) {
        self.record.counters.reads += 1;
        if faulted {
            self.record.counters.read_faults += 1;
        }
    }

    /// Reverses commit `target` (unless `fault` holds the request without doing anything) and
    /// records the request.
    pub fn reverse(
        &mut self,
        endpoint: &str,
        target: &str,
        meta: &CallMeta,
        fault: ReverseFault,
    ) -> (ReverseOutcome, Option<String>) {
        let now = now_ms();
        let index = self
            .by_id
            .get(target)
            .copied()
            .filter(|&i| self.record.commits[i].endpoint == endpoint);
        let foreign =
            index.is_some_and(|i| self.record.commits[i].meta.idempotency_key != meta.dispatch_key);
        let (outcome, reference) = match index {
            None => (ReverseOutcome::UnknownCommit, None),
            Some(i) => match &self.record.commits[i].reversal {
                Some(done) if done.key == meta.idempotency_key => {
                    (ReverseOutcome::Replayed, Some(done.id.clone()))
                }
                Some(_) => (ReverseOutcome::AlreadyReversed, None),
                None if fault == ReverseFault::TimeoutNoReverse => (ReverseOutcome::NotDone, None),
                None => {
                    self.next_id += 1;
                    let id = format!("rev-{}", self.next_id);
                    self.record.commits[i].reversal = Some(Reversal {
                        id: id.clone(),
                        at: now,
                        key: meta.idempotency_key.clone(),
                        dispatch_key: meta.dispatch_key.clone(),
                    });
                    (ReverseOutcome::Reversed, Some(id))
                }
            },
        };
        self.record.reversals.push(ReverseRequest {
            endpoint: endpoint.to_owned(),
            target: target.to_owned(),
            meta: meta.clone(),
            at: now,
            fault,
            outcome,
            foreign,
        });
        (outcome, reference)
    }

    /// The commits of `idempotency_key` and how much work for it is still running.
    pub fn key_view(&self, idempotency_key: &str) -> (Vec<Commit>, u32) {
        let commits = self
            .record
            .commits
            .iter()
            .filter(|c| c.meta.idempotency_key.as_deref() == Some(idempotency_key))
            .cloned()
            .collect();
        let running = self.in_flight.get(idempotency_key).copied().unwrap_or(0);
        (commits, running)
    }

    /// Requests whose work is still running (held answers, scheduled late commits).
    pub fn running(&self) -> u32 {
        self.in_flight.values().sum()
    }

    pub fn snapshot(&self) -> Record {
        self.record.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(idem: &str, business: &str) -> CallMeta {
        CallMeta {
            idempotency_key: Some(idem.into()),
            business_key: Some(business.into()),
            ..CallMeta::default()
        }
    }

    #[test]
    fn lookups_see_live_visible_commits_only() {
        let mut world = World::default();
        let first = world.arrive("wires", &meta("k1", "b1"), DispatchFault::None);
        let a = world.commit("wires", first, DispatchFault::None, 0);
        assert_eq!(
            world.lookup("wires", LookupBy::BusinessKey, "b1"),
            Lookup::Present(a.clone())
        );
        let second = world.arrive("wires", &meta("k1", "b1"), DispatchFault::LateCommit);
        let b = world.commit("wires", second, DispatchFault::LateCommit, 0);
        assert_eq!(
            world.lookup("wires", LookupBy::IdempotencyKey, "k1"),
            Lookup::Duplicate(vec![a.clone(), b.clone()])
        );
        // A lagged commit is there but not yet seen.
        let third = world.arrive("wires", &meta("k2", "b2"), DispatchFault::None);
        world.commit("wires", third, DispatchFault::None, 60_000);
        assert_eq!(
            world.lookup("wires", LookupBy::BusinessKey, "b2"),
            Lookup::Absent
        );
        assert_eq!(world.snapshot().counters.lagged_misses, 1);
        // A reversed commit no longer counts.
        let undo = CallMeta {
            idempotency_key: Some("k1/compensate".into()),
            dispatch_key: Some("k1".into()),
            ..CallMeta::default()
        };
        let (outcome, _) = world.reverse("wires", &b, &undo, ReverseFault::None);
        assert_eq!(outcome, ReverseOutcome::Reversed);
        assert_eq!(
            world.lookup("wires", LookupBy::BusinessKey, "b1"),
            Lookup::Present(a)
        );
    }

    #[test]
    fn reversals_are_recorded_with_what_they_found() {
        let mut world = World::default();
        let seq = world.arrive("wires", &meta("k1", "b1"), DispatchFault::None);
        let id = world.commit("wires", seq, DispatchFault::None, 0);
        let undo = |key: &str, dispatch: &str| CallMeta {
            idempotency_key: Some(key.into()),
            dispatch_key: Some(dispatch.into()),
            ..CallMeta::default()
        };
        let held = world.reverse(
            "wires",
            &id,
            &undo("c1", "k1"),
            ReverseFault::TimeoutNoReverse,
        );
        assert_eq!(held.0, ReverseOutcome::NotDone);
        assert_eq!(
            world
                .reverse("wires", &id, &undo("c1", "k1"), ReverseFault::None)
                .0,
            ReverseOutcome::Reversed
        );
        assert_eq!(
            world
                .reverse("wires", &id, &undo("c1", "k1"), ReverseFault::None)
                .0,
            ReverseOutcome::Replayed
        );
        assert_eq!(
            world
                .reverse("wires", &id, &undo("c2", "k1"), ReverseFault::None)
                .0,
            ReverseOutcome::AlreadyReversed
        );
        assert_eq!(
            world
                .reverse("wires", "wires-99", &undo("c3", "k1"), ReverseFault::None)
                .0,
            ReverseOutcome::UnknownCommit
        );
        let foreign = world.reverse("wires", &id, &undo("c4", "k9"), ReverseFault::None);
        assert_eq!(foreign.0, ReverseOutcome::AlreadyReversed);
        assert!(world.snapshot().reversals.last().is_some_and(|r| r.foreign));
    }

    #[test]
    fn in_flight_work_is_counted_per_key_until_finished() {
        let mut world = World::default();
        let a = world.arrive("t", &meta("k1", "b"), DispatchFault::LateCommit);
        let b = world.arrive("t", &meta("k1", "b"), DispatchFault::None);
        assert_eq!(world.key_view("k1").1, 2);
        world.finish(a);
        world.finish(a);
        assert_eq!(world.key_view("k1").1, 1);
        world.finish(b);
        assert_eq!(world.running(), 0);
        assert_eq!(world.ordinal("t", "dispatch", "k1"), 0);
        assert_eq!(world.ordinal("t", "dispatch", "k1"), 1);
        assert_eq!(world.ordinal("t", "check", "k1"), 0);
    }
}
