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
//! done within [`hold::ACTIVE_MS`]), no tenant holds more than the cap the runtime's lateness
//! sets ([`hold::next_cap`], [`Lanes::hold`]). A lane at the cap is passed over; its requests
//! wait in the lane (their bus room held, so admission still bounds memory) until one of its
//! own is done.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use super::hold;

/// How many of a lane's first requests are looked at for one whose run is free.
pub const SCAN: usize = 32;

/// One queued item, with the tenant whose lane it waits in and the run it belongs to.
pub trait Queued {
    fn tenant(&self) -> &str;
    fn run(&self) -> &str;
}

/// The lanes: each tenant's queued items in arrival order, the tenants with items in the order
/// of their next turn, the runs a worker holds, each tenant's items in workers, and the cap.
#[derive(Debug)]
pub struct Lanes<T> {
    lanes: HashMap<Arc<str>, VecDeque<T>>,
    /// Tenants with queued items, the next to be served first.
    turns: VecDeque<Arc<str>>,
    busy: HashSet<Arc<str>>,
    len: usize,
    /// Items in workers, per tenant with any.
    working: HashMap<Arc<str>, usize>,
    /// When each tenant's last item was done, kept for [`hold::ACTIVE_MS`].
    last_done: HashMap<Arc<str>, i64>,
    /// The most items one tenant may have in workers while another is active.
    cap: Option<usize>,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            turns: VecDeque::new(),
            busy: HashSet::new(),
            len: 0,
            working: HashMap::new(),
            last_done: HashMap::new(),
            cap: None,
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

    /// A worker is done with `item` at `now_ms`: the run's next one may go.
    pub fn done(&mut self, item: &T, now_ms: i64) {
        self.busy.remove(item.run());
        if let Some(working) = self.working.get_mut(item.tenant()) {
            *working -= 1;
            if *working == 0 {
                self.working.remove(item.tenant());
            }
        }
        match self.last_done.get_mut(item.tenant()) {
            Some(last) => *last = now_ms,
            None => {
                self.last_done.insert(Arc::from(item.tenant()), now_ms);
            }
        }
        // A tenant quiet for longer than counts is forgotten: the map stays as small as the
        // tenants at work.
        if self.last_done.len() > 1 {
            self.last_done
                .retain(|_, last| now_ms - *last < hold::ACTIVE_MS);
        }
    }

    /// Sets the cap after a tick of the runtime that ran `late_ms` late ([`hold::next_cap`]).
    pub fn hold(&mut self, late_ms: f64) {
        let top = self.working.values().copied().max().unwrap_or(0);
        self.cap = hold::next_cap(self.cap, late_ms, top);
    }

    /// The cap on one tenant's items in workers, if there is one.
    pub fn cap(&self) -> Option<usize> {
        self.cap
    }

    /// Whether `tenant` holds the cap while another tenant is active.
    fn at_share(&self, tenant: &str, now_ms: i64) -> bool {
        let Some(cap) = self.cap else {
            return false;
        };
        if self.working.get(tenant).copied().unwrap_or(0) < cap {
            return false;
        }
        let other = |name: &Arc<str>| &**name != tenant;
        self.lanes.keys().any(other)
            || self.working.keys().any(other)
            || self
                .last_done
                .iter()
                .any(|(name, last)| other(name) && now_ms - *last < hold::ACTIVE_MS)
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
            lanes.done(&item, 0);
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
        lanes.done(&first, 0);
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
        lanes.done(&hot, 0);
        assert_eq!(lanes.take(0).map(|i| i.2), Some(1));
    }

    /// Lanes whose cap is `cap` (a late runtime's, from `cap` held).
    fn capped(cap: usize) -> Lanes<Item> {
        let mut lanes = Lanes::default();
        for n in 0..cap as u32 {
            lanes.push(item("a", &format!("held-{n}"), n));
        }
        let held: Vec<_> = std::iter::from_fn(|| lanes.take(0)).collect();
        lanes.hold(hold::LATE_MS + 1.0);
        for item in &held {
            lanes.done(item, 0);
        }
        lanes
    }

    #[test]
    fn a_flood_holds_the_cap_while_another_tenant_is_active() {
        let mut lanes = capped(40);
        let cap = lanes.cap().expect("a late runtime sets a cap");
        assert_eq!(cap, 36);
        for n in 0..100 {
            lanes.push(item("a", &format!("a-{n}"), n));
        }
        lanes.push(item("b", "b-0", 0));
        let now = 10;
        let mut a_taken = Vec::new();
        while let Some(taken) = lanes.take(now) {
            if taken.0 == "a" {
                a_taken.push(taken);
            }
        }
        assert_eq!(a_taken.len(), cap, "a stops at the cap while b is active");
        lanes.done(&item("b", "b-0", 0), now + 1);
        assert_eq!(
            lanes.take(now + 2),
            None,
            "b was done just now: a still holds the cap"
        );
        let first = a_taken.remove(0);
        lanes.done(&first, now + 3);
        assert_eq!(lanes.take(now + 4).map(|i| i.0), Some("a"));
        assert_eq!(lanes.take(now + 5), None);
        // b quiet for ACTIVE_MS: a alone takes every worker again.
        let later = now + 1 + hold::ACTIVE_MS;
        assert_eq!(lanes.take(later).map(|i| i.0), Some("a"));
        assert_eq!(lanes.take(later).map(|i| i.0), Some("a"));
    }

    #[test]
    fn a_tenant_alone_is_never_held() {
        let mut lanes = capped(40);
        for n in 0..100 {
            lanes.push(item("a", &format!("a-{n}"), n));
        }
        let taken = std::iter::from_fn(|| lanes.take(10)).count();
        assert_eq!(taken, 100);
    }

    #[test]
    fn an_idle_runtime_lifts_the_cap() {
        let mut lanes = capped(40);
        while lanes.cap().is_some() {
            lanes.hold(0.0);
        }
        lanes.push(item("b", "b-0", 0));
        for n in 0..100 {
            lanes.push(item("a", &format!("a-{n}"), n));
        }
        assert_eq!(std::iter::from_fn(|| lanes.take(10)).count(), 101);
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
