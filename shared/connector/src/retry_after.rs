//! `Retry-After` (RFC 9110, 10.2.3): when an upstream that answered "not now" asks to be
//! called again. Read here into a delay the core can wait on; what to do with it is the
//! core's (`sluice_core::machine::rate_limited_wait_ms`).
//!
//! Read only on the answers that mean "later" by it: 429 (too many requests), 503 (unavailable)
//! and 403 (GitHub answers its secondary rate limit with a 403 and `Retry-After`). A value is
//! either delay-seconds (digits only) or an HTTP-date; anything else (a negative number, a
//! fraction, garbage, an empty header) is no header at all, so the answer is read as it was
//! without one. A date in the past is a delay of 0; a delay beyond a day is read as a day (the
//! tool's `max_rate_limited_ms` caps it again).

use std::time::SystemTime;

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The longest delay read from a header: a day, the most a catalog may let a tool wait.
pub const MAX_RETRY_AFTER_MS: i64 = 86_400_000;

/// Whether an answer with `status` asks for a later call when it carries `Retry-After`.
pub fn asks_later(status: StatusCode) -> bool {
    matches!(status.as_u16(), 403 | 429 | 503)
}

/// The delay the first `Retry-After` header of `headers` asks for, in milliseconds from `now`;
/// `None` when there is none or it is not one.
pub fn retry_after_ms(headers: &HeaderMap, now: SystemTime) -> Option<i64> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|byte| byte.is_ascii_digit()) {
        // Digits only: a number too long for u64 is simply very large.
        let seconds: u64 = value.parse().unwrap_or(u64::MAX);
        let ms = i64::try_from(seconds.saturating_mul(1_000)).unwrap_or(i64::MAX);
        return Some(ms.min(MAX_RETRY_AFTER_MS));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let ms = date.duration_since(now).map_or(0, |ahead| {
        i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX)
    });
    Some(ms.min(MAX_RETRY_AFTER_MS))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use reqwest::header::HeaderValue;

    use super::*;

    fn read(value: &str, now: SystemTime) -> Option<i64> {
        let mut headers = HeaderMap::new();
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_str(value).expect("a header value"),
        );
        retry_after_ms(&headers, now)
    }

    #[test]
    fn seconds_and_dates_are_read_and_the_rest_is_no_header() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        assert_eq!(read("1", now), Some(1_000));
        assert_eq!(read(" 120 ", now), Some(120_000));
        assert_eq!(read("0", now), Some(0));
        // Huge: a day.
        assert_eq!(
            read("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER_MS)
        );
        assert_eq!(read("86401", now), Some(MAX_RETRY_AFTER_MS));
        // Wed, 21 Oct 2015 07:28:00 GMT is 1_445_412_480.
        assert_eq!(read("Wed, 21 Oct 2015 07:28:30 GMT", now), Some(30_000));
        assert_eq!(
            read("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(0),
            "already past"
        );
        for garbage in ["-5", "1.5", "soon", "", "1s", "+3"] {
            assert_eq!(read(garbage, now), None, "{garbage:?}");
        }
        assert_eq!(retry_after_ms(&HeaderMap::new(), now), None);
    }

    #[test]
    fn only_429_503_and_403_ask_for_a_later_call() {
        for (code, later) in [
            (429, true),
            (503, true),
            (403, true),
            (500, false),
            (408, false),
        ] {
            let status = StatusCode::from_u16(code).expect("valid");
            assert_eq!(asks_later(status), later, "HTTP {code}");
        }
    }
}
