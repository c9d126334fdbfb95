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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

/// How many of a lane's first requests are looked at for one whose run is free.
pub const SCAN: usize = 32;

/// One queued item, with the tenant whose lane it waits in and the run it belongs to.
pub trait Queued {
    fn tenant(&self) -> &str;
    fn run(&self) -> &str;
}

/// The lanes: each tenant's queued items in arrival order, the tenants with items in the order
/// of their next turn, and the runs a worker holds.
#[derive(Debug)]
pub struct Lanes<T> {
    lanes: HashMap<Arc<str>, VecDeque<T>>,
    /// Tenants with queued items, the next to be served first.
    turns: VecDeque<Arc<str>>,
    busy: HashSet<Arc<str>>,
    len: usize,
}

impl<T> Default for Lanes<T> {
    fn default() -> Self {
        Self {
            lanes: HashMap::new(),
            turns: VecDeque::new(),
            busy: HashSet::new(),
            len: 0,
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

    /// The next item to work on, its run now held until [`Lanes::done`]: the first item whose
    /// run is free in the lane whose turn it is; a lane with none in its first [`SCAN`] is
    /// passed over. `None` when every queued item waits for a busy run, or none is queued.
    pub fn take(&mut self) -> Option<T> {
        for _ in 0..self.turns.len() {
            let tenant = self.turns.pop_front()?;
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

    /// A worker is done with `run`'s item: the run's next one may go.
    pub fn done(&mut self, run: &str) {
        self.busy.remove(run);
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
        while let Some(item) = lanes.take() {
            lanes.done(&item.1);
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
        assert_eq!(lanes.take().map(|i| i.2), Some(0));
        assert_eq!(lanes.take().map(|i| (i.0, i.2)), Some(("b", 0)));
        lanes.push(item("c", "c-0", 0));
        lanes.push(item("b", "b-1", 1));
        let order: Vec<_> = std::iter::from_fn(|| lanes.take().map(|i| i.0)).collect();
        assert_eq!(order, ["a", "c", "b"]);
    }

    #[test]
    fn a_busy_run_waits_and_its_tenants_other_runs_go() {
        let mut lanes = Lanes::default();
        lanes.push(item("a", "run-1", 0));
        lanes.push(item("a", "run-1", 1));
        lanes.push(item("a", "run-2", 2));
        let first = lanes.take().expect("run-1's first");
        assert_eq!(first.2, 0);
        let second = lanes.take().expect("run-2's, past run-1's second");
        assert_eq!(second.2, 2);
        assert_eq!(lanes.take(), None, "run-1 is busy: its second waits");
        lanes.done("run-1");
        assert_eq!(
            lanes.take().map(|i| i.2),
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
        assert_eq!(lanes.take().map(|i| i.2), Some(0), "hot's first");
        // a's next free request is past the scan: b goes, and a waits for hot.
        assert_eq!(lanes.take().map(|i| i.0), Some("b"));
        assert_eq!(lanes.take(), None);
        lanes.done("hot");
        assert_eq!(lanes.take().map(|i| i.2), Some(1));
    }

    #[test]
    fn drain_empties_every_lane() {
        let mut lanes = Lanes::default();
        lanes.push(item("a", "a-0", 0));
        lanes.push(item("b", "b-0", 0));
        assert_eq!(lanes.drain().len(), 2);
        assert!(lanes.is_empty());
        assert_eq!(lanes.take(), None);
    }
}
