//! Time as the ledger sees it: milliseconds since the Unix epoch, UTC, and a `Clock` port.
//!
//! Milliseconds match CQL's `timestamp` type, so a value stored in either ledger reads back
//! unchanged. On the wire a `Timestamp` is RFC 3339 with millisecond precision.

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::error::TimeError;

/// An instant in UTC with millisecond precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Timestamp(i64);

impl Timestamp {
    pub const EPOCH: Self = Self(0);

    pub fn from_millis(millis: i64) -> Self {
        Self(millis)
    }

    pub fn as_millis(self) -> i64 {
        self.0
    }

    /// Parses RFC 3339 (`2026-11-22T10:00:00Z`, any offset); sub-millisecond digits are dropped.
    pub fn parse_rfc3339(raw: &str) -> Result<Self, TimeError> {
        let parsed = OffsetDateTime::parse(raw, &Rfc3339).map_err(|_| TimeError::NotRfc3339 {
            value: raw.chars().take(64).collect(),
        })?;
        let millis = parsed.unix_timestamp_nanos() / 1_000_000;
        i64::try_from(millis)
            .map(Self)
            .map_err(|_| TimeError::OutOfRange)
    }

    #[must_use]
    pub fn plus(self, duration: Duration) -> Self {
        let millis = i64::try_from(duration.as_millis()).unwrap_or(i64::MAX);
        Self(self.0.saturating_add(millis))
    }

    #[must_use]
    pub fn plus_millis(self, millis: i64) -> Self {
        Self(self.0.saturating_add(millis))
    }

    /// Milliseconds from `earlier` to `self`; negative when `earlier` is later.
    pub fn millis_since(self, earlier: Timestamp) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = i128::from(self.0) * 1_000_000;
        match OffsetDateTime::from_unix_timestamp_nanos(nanos) {
            Ok(at) => {
                let (year, month, day) = (at.year(), u8::from(at.month()), at.day());
                write!(
                    f,
                    "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
                    at.hour(),
                    at.minute(),
                    at.second(),
                    at.millisecond()
                )
            }
            // Outside ±9999 years: still print something that round-trips through the number.
            Err(_) => write!(f, "@{}ms", self.0),
        }
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        if let Some(millis) = raw.strip_prefix('@').and_then(|r| r.strip_suffix("ms")) {
            return millis.parse().map(Self).map_err(serde::de::Error::custom);
        }
        Self::parse_rfc3339(&raw).map_err(serde::de::Error::custom)
    }
}

/// The source of "now". Services take it as a port so tests can drive time by hand.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now(&self) -> Timestamp;
}

/// The machine's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to: for tests and simulations of lease expiry.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn starting_at(at: Timestamp) -> Self {
        Self(AtomicI64::new(at.0))
    }

    pub fn advance(&self, by: Duration) {
        let millis = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.0.fetch_add(millis, Ordering::SeqCst);
    }

    pub fn set(&self, at: Timestamp) {
        self.0.store(at.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip_with_millis() {
        let at = Timestamp::parse_rfc3339("2026-11-22T10:00:01.250+01:00").expect("valid");
        assert_eq!(at.to_string(), "2026-11-22T09:00:01.250Z");
        let json = serde_json::to_string(&at).expect("serializes");
        let back: Timestamp = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, at);
        assert!(Timestamp::parse_rfc3339("yesterday").is_err());
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::starting_at(Timestamp::from_millis(1_000));
        assert_eq!(clock.now().as_millis(), 1_000);
        clock.advance(Duration::from_millis(500));
        assert_eq!(clock.now().as_millis(), 1_500);
    }
}
