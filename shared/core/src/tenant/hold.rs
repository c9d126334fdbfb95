//! How many requests one tenant may have in the dispatcher's workers while another tenant has
//! work, decided from how late the dispatcher's runtime runs its tasks.
//!
//! The lanes decide who is served next, but a flood served as fast as the workers free up keeps
//! everything the bus admits in flight at once. Where the CPU, not the upstream, sets the pace,
//! those requests do not go faster together: they queue for the runtime, and every step of
//! another tenant's effect queues with them. The symptom is the runtime's lateness (how long
//! after its time a sleeping task runs), and it is the one signal blind to how an upstream's
//! answers vary: a hold sized on request times would, on an upstream whose answers range from
//! 20 to 200 ms, hold a flood below what its calls need however idle the CPU.
//!
//! So the dispatcher times a [`TICK_MS`] sleep over and over and asks [`next_cap`] after each:
//! late by more than [`LATE_MS`], the cap on one tenant's requests in workers drops by a tenth
//! (from the most any tenant holds, the first time); on time within [`QUIET_MS`], it grows by a
//! twentieth, and is lifted past [`MAX_CAP`]. The cap binds only while another tenant is active
//! (`super::lanes`); a tenant alone takes every worker, as before. Pure: the caller measures.

/// How often the dispatcher measures its runtime's lateness, in milliseconds.
pub const TICK_MS: u64 = 10;
/// Lateness past which the cap drops, in milliseconds.
pub const LATE_MS: f64 = 5.0;
/// Lateness under which the cap grows, in milliseconds.
pub const QUIET_MS: f64 = 2.0;
/// The cap never drops below this many requests.
pub const MIN_CAP: usize = 4;
/// A cap grown past this is lifted.
pub const MAX_CAP: usize = 512;
/// How long after its last request was done a tenant still counts as active: another tenant's
/// effects come one after another with gaps between them, and the cap must not lapse in each.
pub const ACTIVE_MS: i64 = 1_000;

/// The cap after a tick that ran `late_ms` late, from `cap` (`None`: none) and `top`, the most
/// requests one tenant has in workers now.
pub fn next_cap(cap: Option<usize>, late_ms: f64, top: usize) -> Option<usize> {
    if late_ms > LATE_MS {
        let from = cap.unwrap_or(top).min(top.max(MIN_CAP));
        // A tenth less, at least one: a small cap still moves.
        return Some(from.saturating_sub((from / 10).max(1)).max(MIN_CAP));
    }
    if late_ms < QUIET_MS {
        return cap.and_then(|cap| {
            let next = cap + (cap / 20).max(1);
            (next <= MAX_CAP).then_some(next)
        });
    }
    cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_runtime_lowers_the_cap_from_the_most_held() {
        assert_eq!(next_cap(None, 20.0, 128), Some(116));
        assert_eq!(next_cap(Some(116), 20.0, 128), Some(105));
        // The cap follows what is held when that is lower.
        assert_eq!(next_cap(Some(100), 20.0, 40), Some(36));
        assert_eq!(next_cap(Some(5), 20.0, 5), Some(MIN_CAP));
        assert_eq!(next_cap(Some(MIN_CAP), 20.0, 2), Some(MIN_CAP));
    }

    #[test]
    fn an_idle_runtime_raises_the_cap_until_it_is_lifted() {
        assert_eq!(next_cap(Some(40), 0.5, 40), Some(42));
        assert_eq!(next_cap(Some(MIN_CAP), 0.5, 0), Some(MIN_CAP + 1));
        assert_eq!(next_cap(Some(MAX_CAP), 0.5, 0), None);
        assert_eq!(next_cap(None, 0.5, 100), None);
    }

    #[test]
    fn between_the_thresholds_the_cap_stays() {
        assert_eq!(next_cap(Some(40), 3.0, 100), Some(40));
        assert_eq!(next_cap(None, 3.0, 100), None);
    }
}
