//! Fair dispatch between tenants: which queued request a free worker takes next.
//!
//! A dispatcher reads its requests off the bus into one lane per tenant and its workers take
//! from the lanes in turn, one request per lane per round (round robin over the tenants with
//! work queued). A tenant that queued 20,000 requests and one that queued 10 then each get every
//! other free worker: the second waits behind at most one request of the first per worker, not
//! behind all 20,000. Within a lane requests keep their arrival order, except that a request
//! whose run already has one in a worker waits for it and the lane's next one goes instead: a
//! run's writes stay one at a time (they share the run's audit head), and a run with many
//! requests queued does not hold back its tenant's other runs.
//!
//! How far a lane is searched for a run that is free is bounded ([`SCAN`]), so taking costs
//! the same however deep a lane is; a lane whose first [`SCAN`] requests all wait for busy
//! runs is passed over this round. The structure is the decision only: the dispatcher's
//! runtime (`sluice_runtime::lanes`) keeps it behind a lock, reads into it and runs the
//! workers (docs/decisions.md, "Tenants").
//!
//! Turns alone do not keep a flood from filling every worker: when the other tenants have
//! nothing queued, the flood's next request goes, until everything the bus admits is in
//! flight. While another tenant is active (it has requests queued or in workers, or had one
//! done within [`pace::ACTIVE_MS`]), a tenant holds at most its share of the workers
//! ([`pace::Pace::share`]): what keeps it at the pace it is served, not the CPU's whole queue.
//! A lane at its share is passed over; its requests wait in the lane (their bus room held, so
//! admission still bounds memory) until one of its own is done.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::pace::{self, Pace};

/// How many of a lane's first requests are looked at for one whose run is free.
pub const SCAN: usize = 32;

/// One queued item, with the tenant whose lane it waits in and the run it belongs to.
pub trait Queued {
    fn tenant(&self) -> &str;
    fn run(&self) -> &str;
}

/// The lanes: each tenant's queued items in arrival order, the tenants with items in the order
/// of their next turn, the runs a worker holds, and each tenant's items in workers and pace.
#[derive(Debug)]
pub struct Lanes<T> {
    lanes: HashMap<Arc<str>, VecDeque<T>>,
    /// Tenants with queued items, the next to be served first.
    turns: VecDeque<Arc<str>>,
    busy: HashSet<Arc<str>>,
    len: usize,
    /// Items in workers, per tenant with any.
    working: HashMap<Arc<str>, usize>,
    /// Each tenant's pace, kept while it was active within [`pace::WINDOWS`] windows.
    paces: HashMap<Arc<str>, Pace>,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            turns: VecDeque::new(),
            busy: HashSet::new(),
            len: 0,
            working: HashMap::new(),
            paces: HashMap::new(),
        }
    }
}

impl<T: Queued> Lanes<T> {
    /// Items queued, in every lane.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items queued per tenant, for the metrics.
    pub fn depths(&self) -> impl Iterator<Item = (&str, usize)> {
        self.lanes
            .iter()
            .map(|(tenant, lane)| (&**tenant, lane.len()))
    }

    /// Queues `item` at the end of its tenant's lane; a tenant with nothing queued before gets
    /// the last turn of the round.
    pub fn push(&mut self, item: T) {
        // A lane exists while it holds items, and has a turn while it exists.
        if !self.lanes.contains_key(item.tenant()) {
            let tenant: Arc<str> = Arc::from(item.tenant());
            self.turns.push_back(Arc::clone(&tenant));
            self.lanes.insert(tenant, VecDeque::new());
        }
        if let Some(lane) = self.lanes.get_mut(item.tenant()) {
            lane.push_back(item);
            self.len += 1;
        }
    }

    /// The next item to work on at `now_ms`, its run now held until [`Lanes::done`]: the first
    /// item whose run is free in the lane whose turn it is; a lane with none in its first
    /// [`SCAN`], or whose tenant holds its share while another is active, is passed over.
    /// `None` when every queued item waits for a busy run or a share, or none is queued.
    pub fn take(&mut self, now_ms: i64) -> Option<T> {
        for _ in 0..self.turns.len() {
            let tenant = self.turns.pop_front()?;
            if self.at_share(&tenant, now_ms) {
                self.turns.push_back(tenant);
                continue;
            }
            let Some(lane) = self.lanes.get_mut(&tenant) else {
                continue;
            };
            let free = lane
                .iter()
                .take(SCAN)
                .position(|item| !self.busy.contains(item.run()));
            let Some(at) = free else {
                // Every request looked at waits for its run: the next tenant's turn.
                self.turns.push_back(tenant);
                continue;
            };
            let Some(item) = lane.remove(at) else {
                self.turns.push_back(tenant);
                continue;
            };
            self.len -= 1;
            *self.working.entry(Arc::clone(&tenant)).or_default() += 1;
            if lane.is_empty() {
                self.lanes.remove(&tenant);
            } else {
                self.turns.push_back(tenant);
            }
            self.busy.insert(Arc::from(item.run()));
            return Some(item);
        }
        None
    }

    /// A worker is done with `item`, which it held for `took_ms`: the run's next one may go,
    /// and the time counts in its tenant's pace.
    pub fn done(&mut self, item: &T, took_ms: i64, now_ms: i64) {
        self.busy.remove(item.run());
        if let Some(working) = self.working.get_mut(item.tenant()) {
            *working -= 1;
            if *working == 0 {
                self.working.remove(item.tenant());
            }
        }
        match self.paces.get_mut(item.tenant()) {
            Some(pace) => pace.record(took_ms, now_ms),
            None => {
                let mut pace = Pace::default();
                pace.record(took_ms, now_ms);
                self.paces.insert(Arc::from(item.tenant()), pace);
            }
        }
        // A tenant gone quiet for every remembered window is forgotten: the map stays as
        // small as the tenants at work.
        let forget_before = now_ms - pace::WINDOW_MS * pace::WINDOWS as i64;
        if self.paces.len() > 1 {
            self.paces
                .retain(|_, pace| pace.last_ms().is_some_and(|last| last >= forget_before));
        }
    }

    /// Whether `tenant` holds its share of the workers while another tenant is active.
    fn at_share(&self, tenant: &str, now_ms: i64) -> bool {
        let Some(share) = self.paces.get(tenant).and_then(|pace| pace.share(now_ms)) else {
            return false;
        };
        if self.working.get(tenant).copied().unwrap_or(0) < share {
            return false;
        }
        let other = |name: &Arc<str>| &**name != tenant;
        self.lanes.keys().any(other)
            || self.working.keys().any(other)
            || self.paces.iter().any(|(name, pace)| {
                other(name)
                    && pace
                        .last_ms()
                        .is_some_and(|last| now_ms - last < pace::ACTIVE_MS)
            })
    }

    /// Takes every queued item out (a stop that leaves them to the sweeps).
    pub fn drain(&mut self) -> Vec<T> {
        self.turns.clear();
        self.len = 0;
        self.lanes.drain().flat_map(|(_, lane)| lane).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Item(&'static str, String, u32);

    impl Queued for Item {
        fn tenant(&self) -> &str {
            self.0
        }
        fn run(&self) -> &str {
            &self.1
        }
    }

    fn item(tenant: &'static str, run: &str, n: u32) -> Item {
        Item(tenant, run.to_owned(), n)
    }

    fn take_all(lanes: &mut Lanes<Item>) -> Vec<(&'static str, u32)> {
        let mut taken = Vec::new();
        while let Some(item) = lanes.take(0) {
            lanes.done(&item, 0, 0);
            taken.push((item.0, item.2));
        }
        taken
    }

    #[test]
    fn a_flood_and_a_trickle_take_turns() {
        let mut lanes = Lanes::default();
        for n in 0..1_000 {
            lanes.push(item("a", &format!("a-{n}"), n));
        }
        for n in 0..3 {
            lanes.push(item("b", &format!("b-{n}"), n));
        }
        assert_eq!(lanes.len(), 1_003);
        let taken = take_all(&mut lanes);
        assert_eq!(
            &taken[..7],
            &[
                ("a", 0),
                ("b", 0),
                ("a", 1),
                ("b", 1),
                ("a", 2),
                ("b", 2),
                ("a", 3)
            ],
            "b's three requests go within its first three turns, not after a's thousand"
        );
        assert_eq!(taken.len(), 1_003);
        assert!(lanes.is_empty());
        assert_eq!(lanes.depths().count(), 0, "an empty lane is dropped");
    }

    #[test]
    fn a_tenant_that_comes_back_gets_the_last_turn_of_the_round() {
        let mut lanes = Lanes::default();
        lanes.push(item("a", "a-0", 0));
        lanes.push(item("b", "b-0", 0));
        lanes.push(item("a", "a-1", 1));
        assert_eq!(lanes.take(0).map(|i| i.2), Some(0));
        assert_eq!(lanes.take(0).map(|i| (i.0, i.2)), Some(("b", 0)));
        lanes.push(item("c", "c-0", 0));
        lanes.push(item("b", "b-1", 1));
        let order: Vec<_> = std::iter::from_fn(|| lanes.take(0).map(|i| i.0)).collect();
        assert_eq!(order, ["a", "c", "b"]);
    }

    #[test]
    fn a_busy_run_waits_and_its_tenants_other_runs_go() {
        let mut lanes = Lanes::default();
        lanes.push(item("a", "run-1", 0));
        lanes.push(item("a", "run-1", 1));
        lanes.push(item("a", "run-2", 2));
        let first = lanes.take(0).expect("run-1's first");
        assert_eq!(first.2, 0);
        let second = lanes.take(0).expect("run-2's, past run-1's second");
        assert_eq!(second.2, 2);
        assert_eq!(lanes.take(0), None, "run-1 is busy: its second waits");
        lanes.done(&first, 0, 0);
        assert_eq!(
            lanes.take(0).map(|i| i.2),
            Some(1),
            "in arrival order once free"
        );
    }

    #[test]
    fn a_lane_blocked_past_its_scan_is_passed_over() {
        let mut lanes = Lanes::default();
        for n in 0..=SCAN as u32 {
            lanes.push(item("a", "hot", n));
        }
        lanes.push(item("a", "cold", 99));
        lanes.push(item("b", "b-0", 0));
        let hot = lanes.take(0).expect("hot's first");
        assert_eq!(hot.2, 0);
        // a's next free request is past the scan: b goes, and a waits for hot.
        assert_eq!(lanes.take(0).map(|i| i.0), Some("b"));
        assert_eq!(lanes.take(0), None);
        lanes.done(&hot, 0, 0);
        assert_eq!(lanes.take(0).map(|i| i.2), Some(1));
    }

    /// `a` runs a second of 50 ms requests, 100 of them, each done as the next is taken.
    fn paced_a(lanes: &mut Lanes<Item>) {
        for n in 0..100 {
            lanes.push(item("a", &format!("paced-{n}"), n));
            let taken = lanes.take(n as i64 * 10).expect("a alone is never held");
            lanes.done(&taken, 50, n as i64 * 10 + 10);
        }
    }

    #[test]
    fn a_flood_holds_its_share_of_the_workers_while_another_tenant_is_active() {
        let mut lanes = Lanes::default();
        paced_a(&mut lanes);
        // 100 a second at 50 ms each: 5 in flight keep the pace; with headroom 7, slack 4.
        let share = 7 + pace::SLACK;
        let now = pace::WINDOW_MS + 10;
        for n in 0..100 {
            lanes.push(item("a", &format!("a-{n}"), n));
        }
        lanes.push(item("b", "b-0", 0));
        let mut a_taken = Vec::new();
        while let Some(taken) = lanes.take(now) {
            if taken.0 == "a" {
                a_taken.push(taken);
            }
        }
        assert_eq!(
            a_taken.len(),
            share,
            "a stops at its share while b is active"
        );
        // b's request is in a worker; done, b stays active for a while.
        let b = item("b", "b-0", 0);
        lanes.done(&b, 50, now + 1);
        assert_eq!(
            lanes.take(now + 2),
            None,
            "b was done just now: a still holds its share"
        );
        // One of a's done: one more of a's goes.
        let first = a_taken.remove(0);
        lanes.done(&first, 50, now + 3);
        assert_eq!(lanes.take(now + 4).map(|i| i.0), Some("a"));
        assert_eq!(lanes.take(now + 5), None);
        // b quiet for ACTIVE_MS: a alone takes every worker again.
        let later = now + 1 + pace::ACTIVE_MS;
        assert_eq!(lanes.take(later).map(|i| i.0), Some("a"));
        assert_eq!(lanes.take(later).map(|i| i.0), Some("a"));
    }

    #[test]
    fn a_tenant_alone_is_never_held_to_a_share() {
        let mut lanes = Lanes::default();
        paced_a(&mut lanes);
        for n in 0..100 {
            lanes.push(item("a", &format!("a-{n}"), n));
        }
        let now = pace::WINDOW_MS + 10;
        let taken = std::iter::from_fn(|| lanes.take(now)).count();
        assert_eq!(taken, 100);
    }

    #[test]
    fn drain_empties_every_lane() {
        let mut lanes = Lanes::default();
        lanes.push(item("a", "a-0", 0));
        lanes.push(item("b", "b-0", 0));
        assert_eq!(lanes.drain().len(), 2);
        assert!(lanes.is_empty());
        assert_eq!(lanes.take(0), None);
    }
}
