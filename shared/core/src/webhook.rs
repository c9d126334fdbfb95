//! Webhook deliveries: which events a subscription takes, and what becomes of a delivery after
//! each attempt (docs/decisions.md, "Webhooks").
//!
//! A delivery is one event for one subscription, kept in the ledger from the moment the event
//! was read off the `events` topic until a receiver answered 2xx or the attempts ran out. The
//! deliverer carries these decisions out: it claims a due delivery ([`Delivery::claim`]),
//! sends it, and stores [`Delivery::after_attempt`]; every write is a compare-and-set on
//! [`Delivery::version`], so of two deliverers that read the same row one sends it.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// The CloudEvents `type` of the event `sluice webhooks test` sends.
pub const TEST_EVENT_TYPE: &str = "dev.sluice.webhook.test";

/// Longest error text kept with a delivery (the receiver's answer, or why nothing came back).
pub const MAX_ERROR_CHARS: usize = 512;

/// A Standard Webhooks signing key's bytes, from its `whsec_<base64>` form (at least 24
/// bytes). The error never quotes the key.
pub fn decode_key(key: &str) -> Result<Vec<u8>, String> {
    let Some(encoded) = key.strip_prefix("whsec_") else {
        return Err("a signing key starts with whsec_ followed by its base64 bytes".into());
    };
    let bytes = BASE64
        .decode(encoded)
        .map_err(|_| "a signing key's part after whsec_ is not valid base64".to_owned())?;
    if bytes.len() < 24 {
        return Err(format!(
            "a signing key must hold at least 24 bytes, this one holds {}",
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// The CloudEvents `id` of the event of type `kind` about a command's transition: derived from
/// the command (run, key), the transition (its time and epoch) and the type, not drawn at
/// random, so the same event published twice, or rebuilt from the ledger by the deliverer's
/// catch-up at start, has the same id, and a webhook delivers it once. A UUID of version 8.
pub fn event_id(
    run_id: &str,
    command_key: &str,
    kind: &str,
    updated_at: Timestamp,
    epoch: u64,
) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for part in [run_id.as_bytes(), command_key.as_bytes(), kind.as_bytes()] {
        hash.update(part);
        hash.update([0]);
    }
    hash.update(updated_at.as_millis().to_be_bytes());
    hash.update(epoch.to_be_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&hash.finalize()[..16]);
    // A well-formed UUID of version 8 (RFC 9562: custom, here name-based on SHA-256).
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The horizon of a read of every pending delivery of a webhook, from `now`: far enough that
/// every delivery not yet sent falls before it, whenever it is due.
pub fn pending_horizon(now: Timestamp) -> Timestamp {
    now.plus_millis(100 * 365 * 86_400_000)
}

/// How long the oldest pending delivery (created at `oldest`) has waited at `now`, in
/// milliseconds; zero when none is pending (or its time is ahead of this clock).
pub fn oldest_pending_age_ms(oldest: Option<Timestamp>, now: Timestamp) -> i64 {
    oldest.map_or(0, |at| now.millis_since(at).max(0))
}

/// The statuses whose events a webhook deliverer's catch-up resends: commands waiting for a
/// person with no due time, whose event nothing else republishes.
pub const CATCH_UP_STATUSES: [crate::command::CommandStatus; 2] = [
    crate::command::CommandStatus::Stuck,
    crate::command::CommandStatus::Blocked,
];

/// From when a catch-up at `now` takes commands' events: `look_back_ms` before it.
pub fn catch_up_since(now: Timestamp, look_back_ms: i64) -> Timestamp {
    now.plus_millis(-look_back_ms)
}

/// Whether a catch-up from `since` resends the event of a command standing as `state`: it is
/// in one of the `wanted` statuses (those waiting for a person that some hook takes) and got
/// there since.
pub fn catch_up_takes(
    state: &crate::command::CommandState,
    wanted: &[crate::command::CommandStatus],
    since: Timestamp,
) -> bool {
    wanted.contains(&state.status) && state.updated_at >= since
}

/// Whether a subscription's `types` take the event type `kind`: a type matches itself, a type
/// ending in `*` matches every type that starts with what precedes it (`dev.sluice.effect.*`),
/// `*` alone matches everything, and a type named without a version
/// (`dev.sluice.effect.stuck`, as subscriptions were written before types had one) takes its
/// version 1 (`crate::events::type_matches`).
pub fn matches(types: &[String], kind: &str) -> bool {
    types
        .iter()
        .any(|pattern| crate::events::type_matches(pattern, kind))
}

/// Why a subscription's type pattern is unusable, or `None`: a pattern is non-empty printable
/// ASCII without spaces, with at most one `*`, at its end.
pub fn pattern_problem(pattern: &str) -> Option<&'static str> {
    if pattern.is_empty() {
        return Some("an event type may not be empty");
    }
    if !pattern.bytes().all(|b| b.is_ascii_graphic()) {
        return Some("an event type is printable ASCII without spaces");
    }
    match pattern.find('*') {
        Some(at) if at + 1 != pattern.len() => {
            Some("'*' may only end an event type (\"dev.sluice.effect.*\")")
        }
        _ => None,
    }
}

/// One CloudEvent as it will be sent: its context attributes (without the `ce_` prefix the bus
/// headers carry: `id`, `source`, `type`, `specversion`, `subject`, `time`, extensions), its
/// content type and its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEvent {
    pub attributes: BTreeMap<String, String>,
    pub content_type: Option<String>,
    /// The data, as text: the events Sluice publishes are JSON.
    pub data: String,
}

impl WebhookEvent {
    /// The event's `id`, the delivery's identity and its `webhook-id`.
    pub fn id(&self) -> &str {
        self.attributes.get("id").map_or("", String::as_str)
    }

    /// The event's `type`.
    pub fn kind(&self) -> &str {
        self.attributes.get("type").map_or("", String::as_str)
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeliveryStatus {
    /// Not yet answered 2xx; sent again at `next_at`.
    Pending,
    /// A receiver answered 2xx.
    Delivered,
    /// Given up: the attempts ran out, or the receiver answered 410 Gone.
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Delivered => "DELIVERED",
            Self::Failed => "FAILED",
        }
    }
}

/// How a subscription retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryRules {
    /// Attempts before a delivery is given up (at least 1).
    pub max_attempts: u32,
    /// The pause after the first failed attempt; it doubles after each, up to `max_backoff_ms`.
    pub first_backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl RetryRules {
    /// The pause after failed attempt `attempt` (1 for the first), before jitter.
    pub fn backoff_ms(&self, attempt: u32) -> u64 {
        let doubled = self
            .first_backoff_ms
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(30));
        doubled.min(self.max_backoff_ms).max(1)
    }
}

/// What one attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The receiver answered with this status; `detail` is the start of its body.
    Answered { status: u16, detail: String },
    /// No answer: the connection was refused or reset, or the timeout passed.
    NoAnswer { error: String },
}

/// One event for one subscription, as the ledger keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The subscription's name.
    pub webhook: String,
    pub event: WebhookEvent,
    pub status: DeliveryStatus,
    /// Attempts made so far.
    pub attempts: u32,
    pub created_at: Timestamp,
    /// When it is next sent (PENDING); while a deliverer holds it, when its hold ends.
    pub next_at: Timestamp,
    pub last_attempt_at: Option<Timestamp>,
    /// The last answer's HTTP status, if there was one.
    pub last_status: Option<u16>,
    /// Why the last attempt did not deliver: the answer's start, or the transport error.
    pub last_error: Option<String>,
    pub delivered_at: Option<Timestamp>,
    /// Bumped by every write; each write is guarded by the version it read.
    pub version: u64,
}

impl Delivery {
    /// A new delivery of `event` to `webhook`, due at once.
    pub fn new(webhook: &str, event: WebhookEvent, now: Timestamp) -> Self {
        Self {
            webhook: webhook.to_owned(),
            event,
            status: DeliveryStatus::Pending,
            attempts: 0,
            created_at: now,
            next_at: now,
            last_attempt_at: None,
            last_status: None,
            last_error: None,
            delivered_at: None,
            version: 0,
        }
    }

    /// The event's id: with the webhook's name, the delivery's key.
    pub fn id(&self) -> &str {
        self.event.id()
    }

    /// Whether it waits to be sent at `now`.
    pub fn is_due(&self, now: Timestamp) -> bool {
        self.status == DeliveryStatus::Pending && self.next_at <= now
    }

    /// Taken by a deliverer for `hold_ms` (longer than one attempt): the next version, not due
    /// again until the hold ends, so a deliverer that dies mid-attempt leaves it to be sent
    /// again. `None` when it is not due.
    pub fn claim(&self, now: Timestamp, hold_ms: u64) -> Option<Self> {
        if !self.is_due(now) {
            return None;
        }
        Some(Self {
            next_at: now.plus_millis(i64::try_from(hold_ms).unwrap_or(i64::MAX)),
            version: self.version + 1,
            ..self.clone()
        })
    }

    /// The delivery after `attempt`, made at `now`: DELIVERED on a 2xx; FAILED on a 410 Gone
    /// or once `rules.max_attempts` attempts were made; else PENDING again after the backoff,
    /// drawn between half of it and all of it by `jitter` (in `[0, 1)`), so deliveries that
    /// failed together (a receiver that was down) do not come back in step.
    pub fn after_attempt(
        &self,
        attempt: &Attempt,
        now: Timestamp,
        rules: &RetryRules,
        jitter: f64,
    ) -> Self {
        let mut next = self.clone();
        next.attempts = self.attempts.saturating_add(1);
        next.last_attempt_at = Some(now);
        next.version = self.version + 1;
        let gone = match attempt {
            Attempt::Answered { status, .. } if (200..300).contains(status) => {
                next.status = DeliveryStatus::Delivered;
                next.delivered_at = Some(now);
                next.last_status = Some(*status);
                next.last_error = None;
                next.next_at = now;
                return next;
            }
            Attempt::Answered { status, detail } => {
                next.last_status = Some(*status);
                next.last_error = Some(capped(&format!("HTTP {status}: {detail}")));
                *status == 410
            }
            Attempt::NoAnswer { error } => {
                next.last_status = None;
                next.last_error = Some(capped(error));
                false
            }
        };
        if gone || next.attempts >= rules.max_attempts.max(1) {
            next.status = DeliveryStatus::Failed;
            next.next_at = now;
            return next;
        }
        let backoff = rules.backoff_ms(next.attempts);
        let half = backoff / 2;
        let extra = ((backoff - half) as f64 * jitter.clamp(0.0, 1.0)) as u64;
        next.next_at = now.plus_millis(i64::try_from(half + extra).unwrap_or(i64::MAX));
        next
    }

    /// Sent again at `now` on an operator's word: a FAILED delivery is PENDING again with its
    /// attempts starting over; a PENDING one is due at once. `None` for a delivered one.
    pub fn retried(&self, now: Timestamp) -> Option<Self> {
        if self.status == DeliveryStatus::Delivered {
            return None;
        }
        Some(Self {
            status: DeliveryStatus::Pending,
            attempts: 0,
            next_at: now,
            version: self.version + 1,
            ..self.clone()
        })
    }
}

/// `text` cut to [`MAX_ERROR_CHARS`] characters.
fn capped(text: &str) -> String {
    match text.char_indices().nth(MAX_ERROR_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_catch_up_takes_a_wanted_status_reached_since_its_start_only() {
        use crate::command::{CommandState, CommandStatus};
        let now = Timestamp::from_millis(100_000);
        let since = catch_up_since(now, 40_000);
        assert_eq!(since, Timestamp::from_millis(60_000));
        let mut state = CommandState::reserved(Timestamp::from_millis(70_000), None, 10_000);
        state.status = CommandStatus::Stuck;
        assert!(catch_up_takes(&state, &CATCH_UP_STATUSES, since));
        // Reached before the look-back: its event is past the deliveries' retention.
        state.updated_at = Timestamp::from_millis(59_999);
        assert!(!catch_up_takes(&state, &CATCH_UP_STATUSES, since));
        // A status no hook wants, or one with a due time of its own.
        state.updated_at = Timestamp::from_millis(70_000);
        assert!(!catch_up_takes(&state, &[CommandStatus::Blocked], since));
        state.status = CommandStatus::Pending;
        assert!(!catch_up_takes(&state, &CATCH_UP_STATUSES, since));
    }

    #[test]
    fn the_oldest_pending_age_is_zero_without_one_and_never_negative() {
        let now = Timestamp::from_millis(10_000);
        assert_eq!(oldest_pending_age_ms(None, now), 0);
        assert_eq!(
            oldest_pending_age_ms(Some(Timestamp::from_millis(4_000)), now),
            6_000
        );
        assert_eq!(
            oldest_pending_age_ms(Some(Timestamp::from_millis(12_000)), now),
            0
        );
        assert!(pending_horizon(now) > Timestamp::from_millis(10_000 + 50 * 365 * 86_400_000));
    }

    fn event(id: &str) -> WebhookEvent {
        let mut attributes = BTreeMap::new();
        attributes.insert("id".into(), id.into());
        attributes.insert("type".into(), "dev.sluice.effect.stuck".into());
        WebhookEvent {
            attributes,
            content_type: Some("application/json".into()),
            data: "{}".into(),
        }
    }

    const RULES: RetryRules = RetryRules {
        max_attempts: 3,
        first_backoff_ms: 1_000,
        max_backoff_ms: 1_500,
    };

    #[test]
    fn types_match_exactly_or_by_a_trailing_star() {
        let types = vec![
            "dev.sluice.effect.stuck".to_owned(),
            "dev.sluice.tool.*".into(),
        ];
        assert!(matches(&types, "dev.sluice.effect.stuck"));
        assert!(
            matches(&types, "dev.sluice.effect.stuck.v1"),
            "unversioned: v1"
        );
        assert!(!matches(&types, "dev.sluice.effect.stuck.v2"));
        assert!(matches(&types, "dev.sluice.tool.breaker_opened"));
        assert!(!matches(&types, "dev.sluice.effect.stuck_again"));
        assert!(!matches(&types, "dev.sluice.effect.confirmed"));
        assert!(matches(&["*".to_owned()], "anything"));
        assert!(!matches(&[], "dev.sluice.effect.stuck"));
        assert_eq!(pattern_problem("dev.sluice.*"), None);
        assert!(pattern_problem("dev.*.stuck").is_some());
        assert!(pattern_problem("").is_some());
        assert!(pattern_problem("a b").is_some());
    }

    #[test]
    fn a_2xx_delivers_and_anything_else_backs_off_until_the_attempts_run_out() {
        let now = Timestamp::from_millis(10_000);
        let fresh = Delivery::new("ops", event("e1"), now);
        assert!(fresh.is_due(now));
        let claimed = fresh.claim(now, 30_000).expect("due");
        assert_eq!(claimed.version, 1);
        assert!(!claimed.is_due(now.plus_millis(29_999)), "held");
        assert!(claimed.claim(now, 30_000).is_none());

        let refused = Attempt::Answered {
            status: 503,
            detail: "down".into(),
        };
        let first = claimed.after_attempt(&refused, now, &RULES, 0.0);
        assert_eq!(first.status, DeliveryStatus::Pending);
        assert_eq!(first.attempts, 1);
        assert_eq!(
            first.next_at,
            now.plus_millis(500),
            "half of 1 s at jitter 0"
        );
        assert_eq!(first.last_error.as_deref(), Some("HTTP 503: down"));
        let no_answer = Attempt::NoAnswer {
            error: "connection refused".into(),
        };
        let second = first.after_attempt(&no_answer, now, &RULES, 0.999_999);
        assert_eq!(second.next_at, now.plus_millis(1_499), "capped at 1.5 s");
        assert_eq!(second.last_status, None);
        let third = second.after_attempt(&no_answer, now, &RULES, 0.5);
        assert_eq!(third.status, DeliveryStatus::Failed, "three attempts");
        assert!(!third.is_due(now.plus_millis(1_000_000)));

        let ok = Attempt::Answered {
            status: 204,
            detail: String::new(),
        };
        let delivered = first.after_attempt(&ok, now, &RULES, 0.5);
        assert_eq!(delivered.status, DeliveryStatus::Delivered);
        assert_eq!(delivered.delivered_at, Some(now));
        assert_eq!(delivered.last_error, None);
        assert!(delivered.retried(now).is_none());

        let gone = Attempt::Answered {
            status: 410,
            detail: String::new(),
        };
        assert_eq!(
            fresh.after_attempt(&gone, now, &RULES, 0.5).status,
            DeliveryStatus::Failed
        );
        let again = third.retried(now).expect("a failed one is sent again");
        assert_eq!((again.status, again.attempts), (DeliveryStatus::Pending, 0));
        assert!(again.is_due(now));
    }

    #[test]
    fn an_event_id_is_the_same_for_the_same_transition_and_type_only() {
        let at = Timestamp::from_millis(1_000);
        let id = event_id("r", "d-1/a/b/0", "dev.sluice.effect.stuck", at, 3);
        assert_eq!(id.len(), 36);
        assert_eq!(
            id,
            event_id("r", "d-1/a/b/0", "dev.sluice.effect.stuck", at, 3)
        );
        for other in [
            event_id("r2", "d-1/a/b/0", "dev.sluice.effect.stuck", at, 3),
            event_id("r", "d-1/a/b/1", "dev.sluice.effect.stuck", at, 3),
            event_id("r", "d-1/a/b/0", "dev.sluice.effect.escalated", at, 3),
            event_id(
                "r",
                "d-1/a/b/0",
                "dev.sluice.effect.stuck",
                at.plus_millis(1),
                3,
            ),
            event_id("r", "d-1/a/b/0", "dev.sluice.effect.stuck", at, 4),
        ] {
            assert_ne!(id, other);
        }
    }

    #[test]
    fn errors_are_capped() {
        let long = "x".repeat(2_000);
        let now = Timestamp::from_millis(0);
        let failed = Delivery::new("ops", event("e"), now).after_attempt(
            &Attempt::NoAnswer { error: long },
            now,
            &RULES,
            0.0,
        );
        assert_eq!(
            failed.last_error.expect("kept").chars().count(),
            MAX_ERROR_CHARS + 1
        );
    }
}
