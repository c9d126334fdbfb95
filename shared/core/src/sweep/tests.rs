//! Tests of the sweep-shard plan: examples, and properties over simulated reconcilers that
//! join, die and act in random orders against a compare-and-set store.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

const TIMES: ShardTimes = ShardTimes {
    ttl_ms: 10_000,
    renew_below_ms: 5_000,
    skew_ms: 500,
    min_sweep_ms: 1_000,
};

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(ms)
}

fn lease(shard: u32, holder: &str, epoch: u64, expires: i64) -> ShardLease {
    ShardLease {
        shard,
        holder: holder.into(),
        epoch,
        expires_at: at(expires),
    }
}

fn member(name: &str, expires: i64) -> Member {
    Member {
        name: name.into(),
        expires_at: at(expires),
    }
}

#[test]
fn shard_of_is_fnv1a_and_in_range() {
    // FNV-1a of "" is the offset basis; of "a" the published 0xe40c292c.
    assert_eq!(shard_of("", u32::MAX), 0x811c_9dc5);
    assert_eq!(shard_of("a", u32::MAX), 0xe40c_292c);
    for run in ["r-1", "r-2", "sluice.system"] {
        assert!(shard_of(run, 16) < 16);
    }
    assert_eq!(shard_of("anything", 0), 0, "no shards counts as one");
}

#[test]
fn fair_shares_add_up_to_every_shard() {
    for shards in 0..40 {
        for live in 1..9 {
            let total: usize = (0..live).map(|i| fair_share(shards, live, i)).sum();
            assert_eq!(total, shards as usize, "{shards} shards over {live}");
        }
    }
}

#[test]
fn a_lone_reconciler_takes_every_shard() {
    let plan = plan(4, "a", at(0), &[], &[], &TIMES);
    assert_eq!(plan.target, 4);
    let taken: Vec<u32> = plan.moves.iter().map(ShardMove::shard).collect();
    assert_eq!(taken, vec![0, 1, 2, 3]);
    assert!(
        plan.moves
            .iter()
            .all(|m| matches!(m, ShardMove::Take { guard: None, .. }))
    );
}

#[test]
fn a_member_that_joins_makes_the_holder_give_back_its_excess() {
    let leases: Vec<ShardLease> = (0..4).map(|s| lease(s, "a", 3, 9_000)).collect();
    let members = [member("a", 9_000), member("b", 9_000)];
    let a = plan(4, "a", at(1_000), &leases, &members, &TIMES);
    assert_eq!(a.target, 2);
    assert_eq!(
        a.moves,
        vec![
            ShardMove::Release { shard: 2, epoch: 3 },
            ShardMove::Release { shard: 3, epoch: 3 }
        ]
    );
    // Before the release, b has nothing to take: a's leases are live.
    let b = plan(4, "b", at(1_000), &leases, &members, &TIMES);
    assert!(b.moves.is_empty(), "{b:?}");
}

#[test]
fn a_dead_members_shards_are_taken_once_its_leases_lapse() {
    let leases = vec![
        lease(0, "a", 1, 20_000),
        lease(1, "a", 1, 20_000),
        lease(2, "dead", 4, 10_000),
        lease(3, "dead", 4, 10_000),
    ];
    let members = [member("a", 20_000), member("dead", 10_000)];
    let before = plan(4, "a", at(9_999), &leases, &members, &TIMES);
    assert!(before.moves.is_empty(), "{before:?}");
    let after = plan(4, "a", at(10_000), &leases, &members, &TIMES);
    assert_eq!(after.target, 4);
    assert_eq!(
        after.moves,
        vec![
            ShardMove::Take {
                shard: 2,
                guard: Some(4)
            },
            ShardMove::Take {
                shard: 3,
                guard: Some(4)
            }
        ]
    );
}

#[test]
fn held_leases_are_renewed_once_half_is_gone() {
    let leases = vec![lease(0, "a", 2, 6_000), lease(1, "a", 2, 4_000)];
    let plan = plan(2, "a", at(0), &leases, &[], &TIMES);
    assert_eq!(plan.moves, vec![ShardMove::Renew { shard: 1, epoch: 2 }]);
    let (guard, next) = plan.moves[0].write("a", at(0), &TIMES);
    assert_eq!(
        (guard, next.epoch, next.expires_at),
        (Some(2), 2, at(10_000))
    );
}

#[test]
fn moves_write_the_next_epoch_for_a_take_and_the_same_for_the_rest() {
    let take = ShardMove::Take {
        shard: 1,
        guard: Some(7),
    };
    assert_eq!(take.write("a", at(5), &TIMES).1.epoch, 8);
    let first = ShardMove::Take {
        shard: 1,
        guard: None,
    };
    assert_eq!(first.write("a", at(5), &TIMES).1.epoch, 1);
    let release = ShardMove::Release { shard: 1, epoch: 7 };
    let (guard, next) = release.write("a", at(5), &TIMES);
    assert_eq!((guard, next.epoch, next.expires_at), (Some(7), 7, at(5)));
    assert!(!next.live(at(5)), "a lease given back is free at once");
}

#[test]
fn only_leases_with_more_than_the_margin_left_are_swept() {
    let held = vec![
        lease(0, "a", 1, 10_000),
        lease(1, "a", 1, 1_500),
        lease(2, "b", 1, 10_000),
    ];
    assert_eq!(sweepable("a", at(0), &held, &TIMES), vec![0]);
    assert_eq!(TIMES.sweep_budget_ms(at(0), &held[..1]), Some(9_500));
    assert_eq!(TIMES.sweep_budget_ms(at(0), &held[..2]), None);
    assert_eq!(TIMES.sweep_budget_ms(at(0), &[]), None);
}

/// A compare-and-set store of shard leases, as both ledgers implement it.
#[derive(Default)]
struct Store {
    leases: BTreeMap<u32, ShardLease>,
    members: BTreeMap<String, Member>,
}

impl Store {
    fn write(&mut self, guard: Option<u64>, next: ShardLease) -> bool {
        let stored = self.leases.get(&next.shard).map(|l| l.epoch);
        if stored != guard {
            return false;
        }
        self.leases.insert(next.shard, next);
        true
    }

    fn round(&mut self, me: &str, now: Timestamp, shards: u32) {
        self.members.insert(
            me.into(),
            member(me, now.plus_millis(TIMES.ttl_ms).as_millis()),
        );
        let leases: Vec<ShardLease> = self.leases.values().cloned().collect();
        let members: Vec<Member> = self.members.values().cloned().collect();
        let plan = plan(shards, me, now, &leases, &members, &TIMES);
        for step in plan.moves {
            if let ShardMove::Take { shard, .. } = step {
                let held = self.leases.get(&shard);
                assert!(
                    held.is_none_or(|l| !l.live(now)),
                    "{me} tried to take shard {shard} while {held:?} is live"
                );
            }
            let (guard, next) = step.write(me, now, &TIMES);
            self.write(guard, next);
        }
    }

    fn held_by(&self, me: &str, now: Timestamp) -> usize {
        self.leases
            .values()
            .filter(|l| l.holder == me && l.live(now))
            .count()
    }
}

proptest! {
    /// Whatever the order members act in, and whoever dies or joins, no member takes a live
    /// lease, and once membership holds still for two lease lifetimes every shard is held
    /// and each live member holds its fair share.
    #[test]
    fn members_split_every_shard_fairly_and_never_take_a_live_lease(
        shards in 1u32..40,
        first in 1usize..5,
        joined in 0usize..3,
        killed in 0usize..3,
        orders in proptest::collection::vec(any::<u64>(), 60),
    ) {
        let mut store = Store::default();
        let mut alive: Vec<String> = (0..first).map(|i| format!("m{i}")).collect();
        let mut now = at(1_000_000);
        let mut next_name = first;
        for (round, seed) in orders.iter().enumerate() {
            if round == 10 {
                for _ in 0..joined {
                    alive.push(format!("m{next_name}"));
                    next_name += 1;
                }
            }
            if round == 15 {
                let keep = alive.len().saturating_sub(killed).max(1);
                alive.truncate(keep);
            }
            // A random order of the live members this round.
            let mut order = alive.clone();
            let len = order.len();
            for i in 0..len {
                let j = (seed.rotate_left(i as u32 * 7) as usize) % len;
                order.swap(i, j);
            }
            for me in &order {
                store.round(me, now, shards);
            }
            now = now.plus_millis(1_000);
        }
        // 45 rounds of 1 s after the last change: the split has settled.
        let total: usize = alive.iter().map(|m| store.held_by(m, now)).sum();
        prop_assert_eq!(total, shards as usize);
        let mut sorted = alive.clone();
        sorted.sort();
        for (i, m) in sorted.iter().enumerate() {
            prop_assert_eq!(store.held_by(m, now), fair_share(shards, sorted.len(), i), "{}", m);
        }
    }
}
