//! The observed latency of a ledger's writes: an exponentially weighted average (each write
//! counts an eighth) that halves for every second without a write, so a process that stopped
//! writing because the ledger was slow (a producer refusing work) sees it recover and probes
//! again instead of refusing for good. Lock-free: every write of the process updates it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct WriteLatency {
    /// The average, in microseconds.
    average_us: AtomicU64,
    /// When the last write ended, in milliseconds since `origin`.
    last_ms: AtomicI64,
    origin: Instant,
}

impl Default for WriteLatency {
    fn default() -> Self {
        Self {
            average_us: AtomicU64::new(0),
            last_ms: AtomicI64::new(0),
            origin: Instant::now(),
        }
    }
}

impl WriteLatency {
    fn since_origin_ms(&self) -> i64 {
        i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Counts one write that took `took`.
    pub fn observe(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let decayed = self.decayed_us();
        let _ = self
            .average_us
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |_| {
                let old = decayed;
                Some(if old == 0 {
                    sample
                } else if sample >= old {
                    old + (sample - old) / 8
                } else {
                    old - (old - sample) / 8
                })
            });
        self.last_ms
            .store(self.since_origin_ms(), Ordering::Relaxed);
    }

    fn decayed_us(&self) -> u64 {
        let average = self.average_us.load(Ordering::Relaxed);
        let idle_s = (self.since_origin_ms() - self.last_ms.load(Ordering::Relaxed)) / 1_000;
        average >> idle_s.clamp(0, 63)
    }

    /// The average write now, in milliseconds (rounded up: a write that took any time at all
    /// counts as at least one).
    pub fn millis(&self) -> i64 {
        i64::try_from(self.decayed_us().div_ceil(1_000)).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_average_follows_writes_and_halves_when_idle() {
        let latency = WriteLatency::default();
        assert_eq!(latency.millis(), 0);
        latency.observe(Duration::from_millis(80));
        assert_eq!(latency.millis(), 80, "the first write sets it");
        for _ in 0..64 {
            latency.observe(Duration::from_millis(8));
        }
        assert!(latency.millis() <= 9, "{}", latency.millis());
        latency.observe(Duration::from_millis(800));
        assert!(
            (100..=110).contains(&latency.millis()),
            "one slow write counts an eighth"
        );
        // Idle for two seconds: a quarter.
        latency
            .last_ms
            .store(latency.since_origin_ms() - 2_000, Ordering::Relaxed);
        assert!(
            (25..=28).contains(&latency.millis()),
            "{}",
            latency.millis()
        );
    }
}
