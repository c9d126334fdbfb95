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

impl Timestamp {
    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`, for years 0 to 9999.
    fn rfc3339(self) -> Option<[u8; 24]> {
        let nanos = i128::from(self.0) * 1_000_000;
        let at = OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()?;
        let year = u16::try_from(at.year()).ok().filter(|y| *y <= 9999)?;
        let mut text = *b"0000-00-00T00:00:00.000Z";
        let mut put = |at: usize, width: usize, mut value: u16| {
            for slot in text[at..at + width].iter_mut().rev() {
                *slot = b'0' + (value % 10) as u8;
                value /= 10;
            }
        };
        put(0, 4, year);
        put(5, 2, u16::from(u8::from(at.month())));
        put(8, 2, u16::from(at.day()));
        put(11, 2, u16::from(at.hour()));
        put(14, 2, u16::from(at.minute()));
        put(17, 2, u16::from(at.second()));
        put(20, 3, at.millisecond());
        Some(text)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.rfc3339() {
            Some(text) => f.pad(std::str::from_utf8(&text).unwrap_or_default()),
            // Outside years 0 to 9999: still print something that round-trips through the
            // number.
            None => write!(f, "@{}ms", self.0),
        }
    }
}

impl Serialize for Timestamp {
    // One string for the serializer; `collect_str` would escape each formatted fragment.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.rfc3339() {
            Some(text) => serializer.serialize_str(std::str::from_utf8(&text).unwrap_or_default()),
            None => serializer.collect_str(self),
        }
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

    /// The spelling before the hand-written formatter, kept as the reference.
    fn written_by_the_formatter(at: Timestamp) -> String {
        let nanos = i128::from(at.0) * 1_000_000;
        let t = OffsetDateTime::from_unix_timestamp_nanos(nanos).expect("in range");
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        )
    }

    proptest::proptest! {
        #[test]
        fn display_and_json_spell_every_instant_of_years_0_to_9999_alike(
            millis in -62_167_219_200_000_i64..253_402_300_800_000_i64
        ) {
            let at = Timestamp::from_millis(millis);
            let text = written_by_the_formatter(at);
            proptest::prop_assert_eq!(at.to_string(), text.clone());
            let json = serde_json::to_string(&at).expect("serializes");
            proptest::prop_assert_eq!(json, format!("\"{text}\""));
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&text).expect("parses"), at);
        }
    }

    #[test]
    fn instants_outside_years_0_to_9999_keep_their_number() {
        for millis in [
            -62_167_219_200_001_i64,
            253_402_300_800_000,
            i64::MIN,
            i64::MAX,
        ] {
            let at = Timestamp::from_millis(millis);
            assert_eq!(at.to_string(), format!("@{millis}ms"));
            let back: Timestamp =
                serde_json::from_str(&serde_json::to_string(&at).expect("serializes"))
                    .expect("deserializes");
            assert_eq!(back, at);
        }
        assert_eq!(Timestamp::EPOCH.to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format!("{:>26}", Timestamp::EPOCH),
            "  1970-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::starting_at(Timestamp::from_millis(1_000));
        assert_eq!(clock.now().as_millis(), 1_000);
        clock.advance(Duration::from_millis(500));
        assert_eq!(clock.now().as_millis(), 1_500);
    }
}
