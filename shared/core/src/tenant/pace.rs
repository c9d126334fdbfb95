//! How many requests one tenant may have in the dispatcher's workers while another tenant has
//! work: as many as keep its calls going at the pace it is served, not so many that the rest of
//! the machine queues behind them.
//!
//! The lanes decide who is served next, but a flooding tenant served as fast as the workers
//! free up keeps every request the bus admits in flight at once. On a machine whose CPU, not
//! the upstream, sets the pace, those requests do not go faster for being in flight together:
//! they wait for the CPU, and every step of another tenant's effect (its reservation, its call,
//! its outcome's write, its answer) waits in the same queue behind them. Little's law gives
//! what the flood needs instead: its rate times the time one request takes when nothing waits.
//! A tenant holds at most that, with [`HEADROOM`] and [`SLACK`], while another tenant is
//! active; alone it takes every worker, as before.
//!
//! The figure corrects itself. If the CPU is the bottleneck the rate does not fall when the
//! flood holds fewer, so the share settles at the rate times the fastest request with
//! headroom: the queue in front of the CPU is about a quarter of a request's time. If the
//! upstream is the bottleneck, requests take their fastest time and the share grows by the
//! headroom each window until it no longer binds. Pure: the caller passes the times.

use std::collections::VecDeque;

/// A window over which a tenant's requests done are counted, in milliseconds.
pub const WINDOW_MS: i64 = 1_000;
/// How many windows the fastest request is remembered over: long enough to keep a request
/// timed when nothing waited, short enough to follow an upstream that slowed down.
pub const WINDOWS: usize = 8;
/// The share's margin over rate × fastest time: the queue a tenant keeps in front of the CPU,
/// as a fraction of its fastest request, and how fast its share grows back when the upstream,
/// not the CPU, sets the pace.
pub const HEADROOM: f64 = 1.25;
/// Requests a tenant may always have in workers, whatever its pace.
pub const SLACK: usize = 4;
/// How long after its last request was done a tenant still counts as active: another tenant's
/// effects come one after another with gaps between them, and the share must not lapse in each.
pub const ACTIVE_MS: i64 = 1_000;

/// One window: when it began, requests done in it and the fastest of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    began_ms: i64,
    done: u64,
    fastest_ms: i64,
}

/// One tenant's pace: its requests done per window and the fastest, over the last [`WINDOWS`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pace {
    /// The newest last; the last is the one being counted.
    windows: VecDeque<Window>,
    /// When the last request was done.
    last_ms: Option<i64>,
}

impl Pace {
    /// A request that took `took_ms` in a worker was done at `now_ms`.
    pub fn record(&mut self, took_ms: i64, now_ms: i64) {
        let took_ms = took_ms.max(0);
        self.last_ms = Some(now_ms);
        match self.windows.back_mut() {
            Some(window) if now_ms - window.began_ms < WINDOW_MS => {
                window.done += 1;
                window.fastest_ms = window.fastest_ms.min(took_ms);
            }
            _ => {
                self.windows.push_back(Window {
                    began_ms: now_ms,
                    done: 1,
                    fastest_ms: took_ms,
                });
                while self.windows.len() > WINDOWS {
                    self.windows.pop_front();
                }
            }
        }
    }

    /// When the last request was done, if any was.
    pub fn last_ms(&self) -> Option<i64> {
        self.last_ms
    }

    /// The most requests the tenant may have in workers at `now_ms` while another tenant is
    /// active: `HEADROOM × rate × fastest + SLACK`, the rate that of the last whole window.
    /// `None` (no limit) until a whole window was counted, or when the last one is older than
    /// the window before now: a tenant that paused is measured again first.
    pub fn share(&self, now_ms: i64) -> Option<usize> {
        let current = self.windows.back()?;
        let whole = if now_ms - current.began_ms >= WINDOW_MS {
            current
        } else {
            self.windows.iter().rev().nth(1)?
        };
        if now_ms - whole.began_ms >= 2 * WINDOW_MS {
            return None;
        }
        let fastest_ms = self.windows.iter().map(|w| w.fastest_ms).min()?;
        let rate_per_ms = whole.done as f64 / WINDOW_MS as f64;
        let needed = (HEADROOM * rate_per_ms * fastest_ms as f64).ceil();
        // Saturating: a float past usize's range converts to its maximum.
        Some((needed as usize).saturating_add(SLACK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `per_window` requests each taking `took_ms`, spread over `windows` windows from 0.
    fn paced(per_window: u64, took_ms: i64, windows: i64) -> Pace {
        let mut pace = Pace::default();
        for w in 0..windows {
            for n in 0..per_window {
                let at = w * WINDOW_MS + (n as i64 * WINDOW_MS) / per_window as i64;
                pace.record(took_ms, at);
            }
        }
        pace
    }

    #[test]
    fn the_share_is_the_rate_times_the_fastest_request_with_headroom() {
        // 800 a second, 50 ms each: 40 in flight keep that pace; with headroom 50, slack 4.
        let pace = paced(800, 50, 2);
        assert_eq!(pace.share(2 * WINDOW_MS - 1), Some(50 + SLACK));
    }

    #[test]
    fn the_fastest_request_is_remembered_past_a_slow_window() {
        let mut pace = paced(100, 50, 1);
        for n in 0..100 {
            pace.record(400, WINDOW_MS + n * 10);
        }
        // The second window's requests queued (400 ms each); the rate counts, the queue not.
        assert_eq!(pace.share(2 * WINDOW_MS), Some(7 + SLACK));
    }

    #[test]
    fn no_share_before_a_whole_window_or_after_a_pause() {
        let pace = paced(100, 50, 1);
        assert_eq!(pace.share(WINDOW_MS / 2), None, "still counting the first");
        assert_eq!(pace.share(WINDOW_MS), Some(7 + SLACK), "the first is whole");
        assert_eq!(
            pace.share(3 * WINDOW_MS),
            None,
            "nothing done since: measured again"
        );
    }

    #[test]
    fn a_tenant_that_does_little_keeps_the_slack() {
        let pace = paced(1, 50, 2);
        assert_eq!(pace.share(2 * WINDOW_MS - 1), Some(1 + SLACK));
    }

    #[test]
    fn old_windows_are_forgotten() {
        let mut pace = paced(10, 5, 1);
        for w in 1..=WINDOWS as i64 {
            pace.record(500, w * WINDOW_MS);
        }
        assert_eq!(pace.windows.len(), WINDOWS);
        assert!(pace.windows.iter().all(|w| w.fastest_ms == 500));
    }
}
