//! Waiting for a command to settle: `GET …/effects/{key}?wait=30s` (a long poll) and
//! `Prefer: wait=<seconds>` on a submission (RFC 7240) both hold the answer until the command is
//! terminal, STUCK or BLOCKED, or the wait passes.
//!
//! Waiters are woken by the lifecycle events this producer reads from the bus
//! ([`watch_events`]). Each waiter registers the command it waits for in [`Waiters`]: an event
//! wakes only the waiters of its own command (a map lookup), so a thousand waiters cost nothing
//! per event but their own. The event's payload is the public projection of the command
//! (docs/events.md), not the stored record: a woken waiter reads the status and time from it,
//! and reads the command from the ledger (one read by primary key) only when that status ends
//! its wait. An event of a build before the projection (the stored command) has the same two
//! fields and is read the same way. A waiter registers *before* it reads the ledger, so an
//! event after the read is not lost; it re-reads the ledger every second all the same, for an
//! event that never comes (the bus down).
//!
//! A held request costs a connection and a task, so they are bounded ([`WaitSlots`]): at most
//! `producer.max_waits` at once and `producer.max_waits_per_principal` per caller; past either
//! a request that would wait is refused with 503 `too_many_waits` (and `Retry-After`) before it
//! reads or records anything.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_bus::Topic;
use sluice_core::command::Command;
use sluice_core::events::{EFFECT_PREFIX, EventState, status_of_type};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_runtime::Shutdown;
use sluice_runtime::messages::{decode, header};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::Api;
use crate::auth::{Caller, Need, Principal};
use crate::http::{ApiError, Q};

/// How often a waiter re-reads the ledger when no event woke it.
const REREAD: Duration = Duration::from_secs(1);

/// The commands waited for, each with one channel its waiters share, holding the latest
/// lifecycle event's payload.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    watched: Mutex<HashMap<String, Watched>>,
    /// The console's event streams, fed from the same events ([`crate::events`]).
    pub(crate) streams: crate::events::Streams,
    /// Requests holding their answer now.
    pub(crate) slots: Arc<WaitSlots>,
}

/// Requests holding their answer now: in all, and per principal.
#[derive(Debug, Default)]
pub(crate) struct WaitSlots {
    held: Mutex<(usize, HashMap<String, usize>)>,
}

/// One held request's place; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct WaitSlot {
    slots: Arc<WaitSlots>,
    principal: String,
    /// `sluice_http_waiting_requests`, when counted.
    gauge: Option<prometheus::IntGauge>,
}

impl WaitSlots {
    /// A place for a request of `principal` that will wait, within `max` in all and
    /// `per_principal` for it; else 503 `too_many_waits`.
    pub(crate) fn take(
        self: &Arc<Self>,
        principal: &Principal,
        max: usize,
        per_principal: usize,
    ) -> Result<WaitSlot, ApiError> {
        // Open mode's anonymous admin and a token named the same are different callers.
        let name = format!("{}:{}", principal.authenticated, principal.name);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let (total, by_principal) = &mut *held;
        let mine = by_principal.get(&name).copied().unwrap_or(0);
        let refused = if *total >= max {
            Some(format!(
                "{total} requests are waiting already (producer.max_waits)"
            ))
        } else if mine >= per_principal {
            Some(format!(
                "{mine} requests of {} are waiting already (producer.max_waits_per_principal)",
                principal.name
            ))
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_waits",
                format!("{why}; nothing was read or recorded: ask again later, or without a wait"),
            ));
        }
        *total += 1;
        by_principal.insert(name.clone(), mine + 1);
        Ok(WaitSlot {
            slots: Arc::clone(self),
            principal: name,
            gauge: None,
        })
    }

    /// Requests waiting now, in all.
    #[cfg(test)]
    fn total(&self) -> usize {
        self.held.lock().unwrap_or_else(PoisonError::into_inner).0
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        if let Some(gauge) = &self.gauge {
            gauge.dec();
        }
        let mut held = self
            .slots
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (total, by_principal) = &mut *held;
        *total = total.saturating_sub(1);
        if let Some(mine) = by_principal.get_mut(&self.principal) {
            *mine = mine.saturating_sub(1);
            if *mine == 0 {
                by_principal.remove(&self.principal);
            }
        }
    }
}

impl Api {
    /// A place for a request of `principal` that will hold its answer (see [`WaitSlots`]).
    pub(crate) fn wait_slot(&self, principal: &Principal) -> Result<WaitSlot, ApiError> {
        let mut slot = self.waiters.slots.take(
            principal,
            self.config.max_waits,
            self.config.max_waits_per_principal,
        )?;
        let gauge = self.ctx.metrics.waiting_requests.clone();
        gauge.inc();
        slot.gauge = Some(gauge);
        Ok(slot)
    }
}

/// What was last seen of a watched command: nothing trusted (`None`: read the ledger), or
/// what [`Seen`] holds.
type Payload = Option<Seen>;

/// A lifecycle event's payload (the projection of the command as it was written: its status
/// only is read), or the whole command as this process's pipeline stored it
/// (`sluice_runtime::local_events`: no ledger read needed).
#[derive(Debug, Clone)]
enum Seen {
    Event(Arc<[u8]>),
    Command(Arc<Command>),
}

/// What a waiter reads of [`Seen`].
#[derive(Debug, PartialEq)]
enum Latest {
    /// Where an event says the command stands.
    Event(EventState),
    /// The command as stored.
    Command(Arc<Command>),
}

#[derive(Debug)]
struct Watched {
    latest: watch::Sender<Payload>,
    watchers: usize,
}

/// One waiter's registration; dropping it unregisters.
pub(crate) struct Watch {
    waiters: Arc<Waiters>,
    subject: String,
    events: watch::Receiver<Payload>,
}

impl Watch {
    /// The command it watches, as [`subject`] names it.
    pub(crate) fn subject(&self) -> &str {
        &self.subject
    }

    /// Waits for the next event of the command (`false`: none can come any more).
    async fn changed(&mut self) -> bool {
        self.events.changed().await.is_ok()
    }

    /// What was last seen of the command: the command itself when this process stored it,
    /// else where its latest event says it stands, if that decodes (`EventState`: only its
    /// status and when it got there are decoded, not the payload).
    fn latest(&mut self) -> Option<Latest> {
        match self.events.borrow_and_update().clone()? {
            Seen::Command(command) => Some(Latest::Command(command)),
            Seen::Event(payload) => decode::<EventState>("lifecycle event", &payload)
                .ok()
                .map(Latest::Event),
        }
    }
}

impl Waiters {
    /// Registers a waiter for `subject` (`<run_id>/<command_key>`).
    pub(crate) fn watch(self: &Arc<Self>, subject: String) -> Watch {
        let mut watched = self.lock();
        let entry = watched.entry(subject.clone()).or_insert_with(|| Watched {
            latest: watch::Sender::new(None),
            watchers: 0,
        });
        entry.watchers += 1;
        let events = entry.latest.subscribe();
        Watch {
            waiters: Arc::clone(self),
            subject,
            events,
        }
    }

    /// Hands `payload` (the event's command) to every waiter of `subject`; nobody waiting costs
    /// one map lookup.
    pub(crate) fn wake(&self, subject: &str, payload: &[u8]) {
        self.streams.publish(subject, payload);
        if let Some(watched) = self.lock().get(subject) {
            // The command this process stored, handed over just before its event
            // (`settled`), is kept when the event is of it or older: the waiter may not have
            // taken it yet, and the event alone would make it read the ledger.
            watched.latest.send_if_modified(|seen| {
                if let Some(Seen::Command(held)) = seen
                    && decode::<EventState>("lifecycle event", payload).is_ok_and(|event| {
                        sluice_core::machine::news_adds_nothing(event.updated_at, &held.state)
                    })
                {
                    return false;
                }
                *seen = Some(Seen::Event(Arc::from(payload)));
                true
            });
        }
    }

    /// Hands `command`, as this process's pipeline stored it while publishing its event, to
    /// its waiters (`sluice_runtime::local_events`); nobody waiting costs one map lookup.
    pub(crate) fn settled(&self, command: &Command) {
        let subject = subject(&command.run_id, &command.command_key);
        if let Some(watched) = self.lock().get(&subject) {
            watched
                .latest
                .send_replace(Some(Seen::Command(Arc::new(command.clone()))));
        }
    }

    /// Wakes every waiter to re-read its command from the ledger: the events of a moment
    /// were not read (a watch began), so none is trusted to have come.
    pub(crate) fn reread(&self) {
        for watched in self.lock().values() {
            watched.latest.send_replace(None);
        }
    }

    /// How many commands are waited for now.
    #[cfg(test)]
    fn watched(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        // The map stays consistent whatever panicked while it was held: every update is one
        // insert, increment or removal.
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut watched = self.waiters.lock();
        if let Some(entry) = watched.get_mut(&self.subject) {
            entry.watchers -= 1;
            if entry.watchers == 0 {
                watched.remove(&self.subject);
            }
        }
    }
}

/// Whether a waiter answers now with `command` as it is (`now` the ledger's clock).
fn done_waiting(command: &Command, deadline: Instant, now: Timestamp) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    left.is_zero()
        || sluice_core::machine::wait_ends(
            &command.state,
            now,
            i64::try_from(left.as_millis()).unwrap_or(i64::MAX),
        )
}

/// The waiters' name for a command.
pub(crate) fn subject(run_id: &RunId, command_key: &CommandKey) -> String {
    format!("{run_id}/{command_key}")
}

/// The command `run_id`/`command_key` once it is terminal, STUCK or BLOCKED, or as it is at
/// `deadline`. `known` is the command as the caller just read or wrote it: when it
/// needs no wait, the ledger is not read again. `registered` is a watch the caller took
/// before it wrote or read `known` (a submission registers before it reserves): then no event
/// after `known` can be missed, and `known` is not read again either.
pub(crate) async fn until_settled(
    api: &Api,
    principal: &Principal,
    run_id: &RunId,
    command_key: &CommandKey,
    known: Option<Command>,
    registered: Option<Watch>,
    deadline: Instant,
) -> Result<Command, ApiError> {
    let known = match known {
        Some(command) if done_waiting(&command, deadline, api.ctx.clock.now()) => {
            return Ok(command);
        }
        other => other,
    };
    let subject = subject(run_id, command_key);
    let fresh = registered.is_some();
    // Registered before the read: an event that comes after the read is not missed.
    let mut watch = registered.unwrap_or_else(|| api.waiters.watch(subject.clone()));
    let read = || async {
        let command = api
            .ctx
            .ledger
            .get(run_id, command_key)
            .await
            .map_err(|e| ApiError::unavailable(&e))?
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_FOUND,
                    "unknown_command",
                    format!("no command {subject}"),
                )
            })?;
        principal.require_owner(run_id, std::slice::from_ref(&command))?;
        Ok::<_, ApiError>(command)
    };
    let mut command = match known {
        Some(command) if fresh => command,
        _ => read().await?,
    };
    loop {
        let now = api.ctx.clock.now();
        if done_waiting(&command, deadline, now) {
            return Ok(command);
        }
        let woken = tokio::time::timeout_at(deadline.min(Instant::now() + REREAD), watch.changed())
            .await
            .unwrap_or(false);
        // The event says where the command stands, not all of it: the ledger is read (one read
        // by primary key, its owner checked again) when the event's status ends the wait, and
        // not for an event older than what this waiter already saw (events of a command arrive
        // in order, but one published before the read may arrive after it) or one that ends
        // nothing. No event (the re-read tick) or one that does not decode: read.
        // The command as this process stored it is taken as read when it is the same command
        // (not one made again after a purge) and not older than the one held.
        match watch.latest().filter(|_| woken) {
            Some(Latest::Command(stored))
                if stored.created_at == command.created_at
                    && stored.submitted_by == command.submitted_by
                    && sluice_core::machine::news_is_current(
                        stored.state.updated_at,
                        &command.state,
                    ) =>
            {
                command = Arc::unwrap_or_clone(stored);
            }
            Some(Latest::Command(_)) => command = read().await?,
            Some(Latest::Event(latest))
                if latest.status.is_settled()
                    && sluice_core::machine::news_is_current(latest.updated_at, &command.state) =>
            {
                command = read().await?;
            }
            Some(Latest::Event(_)) => {}
            None => command = read().await?,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GetQuery {
    wait: Option<String>,
}

/// Parses `30s`, `500ms`, `2m` or a plain number of milliseconds.
pub fn parse_wait(raw: &str) -> Option<Duration> {
    let (number, unit) = match raw.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => raw.split_at(at),
        None => (raw, "ms"),
    };
    // 1 to 18 digits always fit a u64; a longer wait is refused rather than wrapped (and the
    // wait is capped at `producer.max_wait_ms` anyway).
    if number.is_empty() || number.len() > 18 {
        return None;
    }
    let value: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(value)),
        "s" => Some(Duration::from_secs(value)),
        "m" => Some(Duration::from_secs(value.saturating_mul(60))),
        _ => None,
    }
}

/// `GET /v1/runs/{run_id}/effects/{key}`, with `?wait=` a long poll.
pub(crate) async fn get_effect(
    State(api): State<Api>,
    Caller(principal): Caller,
    Path((run_id, command_key)): Path<(String, String)>,
    Q(query): Q<GetQuery>,
) -> Result<Response, ApiError> {
    crate::http::not_on_action(&command_key)?;
    principal.require(Need::ReadRun)?;
    let run_id = RunId::parse(&run_id).map_err(|e| ApiError::invalid(e.to_string()))?;
    let command_key =
        CommandKey::parse(&command_key).map_err(|e| ApiError::invalid(e.to_string()))?;
    let wait = match query.wait.as_deref() {
        None => Duration::ZERO,
        Some(raw) => parse_wait(raw)
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "wait {raw:?} is not a duration such as 30s or 500ms"
                ))
            })?
            .min(Duration::from_millis(api.config.max_wait_ms)),
    };
    // Held while this request waits; a plain read takes none.
    let _slot = if wait.is_zero() {
        None
    } else {
        Some(api.wait_slot(&principal)?)
    };
    let command = until_settled(
        &api,
        &principal,
        &run_id,
        &command_key,
        None,
        None,
        Instant::now() + wait,
    )
    .await?;
    Ok(Json(command).into_response())
}

/// Watches the lifecycle events (from now on, in no consumer group: `Bus::watch`), waking
/// the waiters of each event's command; the event streams end when it stops (the bus closed).
/// A watch that cannot begin is tried again after a backoff. A watch misses what was published
/// before it began, so it first tells every waiter to re-read the ledger.
pub(crate) async fn watch_events(api: Api, shutdown: Shutdown) {
    read_events(&api, shutdown).await;
    api.waiters.streams.close();
}

async fn read_events(api: &Api, shutdown: Shutdown) {
    let member = format!("sluice-producer-{}", uuid::Uuid::new_v4().simple());
    let mut backoff = WATCH_BACKOFF;
    loop {
        let mut subscription = match api.ctx.bus.watch(Topic::Events, &member).await {
            Ok(subscription) => subscription,
            Err(sluice_bus::BusError::Closed) => return,
            Err(e) => {
                tracing::warn!(error = %e, ?backoff, "cannot watch lifecycle events; long polls re-read the ledger meanwhile");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(WATCH_BACKOFF_MAX);
                continue;
            }
        };
        api.waiters.reread();
        loop {
            let delivery = tokio::select! {
                () = shutdown.cancelled() => return,
                delivery = subscription.next() => match delivery {
                    Some(delivery) => delivery,
                    // The bus closed.
                    None => return,
                },
            };
            // A command's events only: flow control's (`dev.sluice.flow.*`) carry no command.
            let effect = header(&delivery.message.headers, "ce_type")
                .is_some_and(|kind| kind.starts_with(EFFECT_PREFIX));
            if let Some(subject) = header(&delivery.message.headers, "ce_subject")
                && effect
            {
                api.waiters.wake(subject, &delivery.message.payload);
                // An effect that reached a final status leaves its tenant's count in flight at
                // once, whichever process wrote it (the tenants' quotas, `quota.rs`).
                if let Some(at) = final_at(&delivery.message.headers) {
                    api.ctx.metrics.commands.forget(subject, at);
                }
            }
            let _ = delivery.ack().await;
        }
    }
}

/// When a lifecycle event's command reached a final status (its `ce_time`), if its type
/// (`dev.sluice.effect.<status>.v1`, or without the version from a build before versions) is
/// one.
fn final_at(headers: &[(String, Vec<u8>)]) -> Option<Timestamp> {
    let status = status_of_type(header(headers, "ce_type")?)?;
    if !status.is_terminal() {
        return None;
    }
    Timestamp::parse_rfc3339(header(headers, "ce_time")?).ok()
}

/// The first wait before watching the events again after a failure; doubled up to
/// [`WATCH_BACKOFF_MAX`].
const WATCH_BACKOFF: Duration = Duration::from_millis(200);
const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::command::CommandStatus;

    /// Only a final status's event, with its time, lowers a tenant's count in flight.
    #[test]
    fn a_final_status_event_is_read_with_its_time() {
        let event = |kind: &str| {
            vec![
                ("ce_type".to_owned(), kind.as_bytes().to_vec()),
                ("ce_time".to_owned(), b"2026-11-27T10:00:00.250Z".to_vec()),
            ]
        };
        assert_eq!(
            final_at(&event("dev.sluice.effect.confirmed.v1")),
            Timestamp::parse_rfc3339("2026-11-27T10:00:00.250Z").ok()
        );
        assert!(final_at(&event("dev.sluice.effect.compensation_failed.v1")).is_some());
        assert!(
            final_at(&event("dev.sluice.effect.confirmed")).is_some(),
            "a build before versioned types"
        );
        for kind in [
            "dev.sluice.effect.stuck.v1",
            "dev.sluice.effect.stuck",
            "dev.sluice.effect.pending.v1",
            "dev.sluice.effect.done.v1",
            "dev.sluice.effect.escalated.v1",
            "other.confirmed",
        ] {
            assert_eq!(final_at(&event(kind)), None, "{kind}");
        }
        assert_eq!(
            final_at(&event("dev.sluice.effect.failed.v1")[..1]),
            None,
            "no time"
        );
    }

    #[test]
    fn waits_parse_in_common_units() {
        assert_eq!(parse_wait("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_wait("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_wait("250"), Some(Duration::from_millis(250)));
        assert_eq!(parse_wait("soon"), None);
        assert_eq!(parse_wait("5h"), None);
        assert_eq!(parse_wait(" 5s"), None, "exactly as documented: no spaces");
        assert_eq!(parse_wait("1234567890123456789"), None, "at most 18 digits");
        assert!(
            parse_wait("999999999999999999m").is_some(),
            "saturates, not refused"
        );
    }

    #[test]
    fn wait_slots_bound_each_principal_and_all() {
        let slots = Arc::new(WaitSlots::default());
        let who = |name: &str| Principal {
            name: name.into(),
            role: sluice_runtime::config::Role::Agent,
            authenticated: true,
            tenants: Vec::new(),
        };
        let a1 = slots.take(&who("a"), 3, 2).expect("a's first");
        let _a2 = slots.take(&who("a"), 3, 2).expect("a's second");
        let refused = slots
            .take(&who("a"), 3, 2)
            .expect_err("a's third is past its bound");
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.code(), "too_many_waits");
        let _b1 = slots.take(&who("b"), 3, 2).expect("b has its own bound");
        let all = slots
            .take(&who("c"), 3, 2)
            .expect_err("past the bound in all");
        assert!(
            all.message().contains("producer.max_waits"),
            "{}",
            all.message()
        );
        drop(a1);
        assert_eq!(slots.total(), 2, "a dropped slot is freed");
        slots.take(&who("a"), 3, 2).expect("a's place is back");
    }

    #[tokio::test]
    async fn a_reread_wakes_every_waiter_to_read_the_ledger() {
        let waiters = Arc::new(Waiters::default());
        let mut first = waiters.watch("r/a".into());
        let mut second = waiters.watch("r/b".into());
        waiters.reread();
        for waiter in [&mut first, &mut second] {
            assert!(
                tokio::time::timeout(Duration::from_secs(1), waiter.changed())
                    .await
                    .expect("woken by the reread")
            );
            assert!(
                waiter.latest().is_none(),
                "no command: the waiter reads the ledger"
            );
        }
    }

    /// A CONFIRMED email of run `r`, made at 1 s (`d-1/email/send/0`).
    fn confirmed_email() -> Command {
        let intent = sluice_core::command::Intent {
            run_id: RunId::parse("r").expect("a run id"),
            command_key: CommandKey::parse("d-1/email/send/0").expect("a command key"),
            semantics: sluice_core::command::EffectSemantics::Idempotent,
            args: serde_json::json!({"to": "ops@example.com"}),
            business_key: None,
            policy_version: "p-1".into(),
            max_attempts: 3,
            not_before: None,
        };
        let mut command = Command::from_intent(intent, Timestamp::from_millis(1_000), 5_000);
        command.state.status = CommandStatus::Confirmed;
        command
    }

    /// A command this process's pipeline stored reaches its waiters whole: their answer
    /// needs no ledger read.
    #[tokio::test]
    async fn a_command_settled_here_reaches_its_waiters_whole() {
        let waiters = Arc::new(Waiters::default());
        let mut mine = waiters.watch("r/d-1/email/send/0".into());
        let mut other = waiters.watch("r/d-2/email/send/0".into());
        let mut command = confirmed_email();
        command.state.result = Some(Arc::new(serde_json::json!({"id": "m-1"})));
        waiters.settled(&command);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), mine.changed())
                .await
                .expect("the waiter of the command is woken")
        );
        assert_eq!(
            mine.latest(),
            Some(Latest::Command(Arc::new(command.clone()))),
            "the whole command, its result included"
        );
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.changed())
                .await
                .is_err(),
            "another command's waiter is not woken"
        );
        // Its event, delivered by the bus after the hand-over and before the waiter looked,
        // leaves the whole command in place; a later event replaces it.
        let mut late = waiters.watch("r/d-1/email/send/0".into());
        let mut stored = command.clone();
        stored.state.updated_at = Timestamp::from_millis(3_000);
        waiters.settled(&stored);
        let event = |at: i64| {
            let mut moved = stored.clone();
            moved.state.updated_at = Timestamp::from_millis(at);
            sluice_runtime::messages::LifecycleEvent::new(
                "test",
                &moved,
                sluice_runtime::messages::EventOrigin::default(),
                Timestamp::from_millis(at),
            )
            .payload
        };
        waiters.wake("r/d-1/email/send/0", &event(3_000));
        assert!(late.changed().await, "woken once, by the hand-over");
        assert_eq!(
            late.latest(),
            Some(Latest::Command(Arc::new(stored.clone())))
        );
        waiters.wake("r/d-1/email/send/0", &event(4_000));
        assert!(late.changed().await);
        assert!(matches!(
            late.latest(),
            Some(Latest::Event(EventState { updated_at, .. })) if updated_at == Timestamp::from_millis(4_000)
        ));
    }

    #[tokio::test]
    async fn a_wake_hands_the_event_to_the_waiters_of_its_command_only() {
        let waiters = Arc::new(Waiters::default());
        let mut mine = waiters.watch("r/a".into());
        let mut also_mine = waiters.watch("r/a".into());
        let mut other = waiters.watch("r/b".into());
        assert_eq!(waiters.watched(), 2);
        let mut command = confirmed_email();
        command.state.updated_at = Timestamp::from_millis(2_000);
        let event = sluice_runtime::messages::LifecycleEvent::new(
            "test",
            &command,
            sluice_runtime::messages::EventOrigin::default(),
            Timestamp::from_millis(2_000),
        );
        // The payload of a build before the projection: the stored command.
        let stored = serde_json::to_vec(&command).expect("a command serializes");
        for payload in [&event.payload, &stored] {
            // Sent before the waiters wait: a registered waiter still sees it.
            waiters.wake("r/a", payload);
            for waiter in [&mut mine, &mut also_mine] {
                assert!(
                    tokio::time::timeout(Duration::from_secs(1), waiter.changed())
                        .await
                        .expect("the waiter of r/a is woken")
                );
                let latest = waiter.latest().expect("the event's status");
                assert_eq!(
                    latest,
                    Latest::Event(EventState {
                        status: CommandStatus::Confirmed,
                        updated_at: Timestamp::from_millis(2_000),
                    })
                );
            }
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(50), other.changed())
                .await
                .is_err(),
            "the waiter of r/b is not woken"
        );
        drop(mine);
        assert_eq!(waiters.watched(), 2, "r/a still has a waiter");
        drop(also_mine);
        drop(other);
        assert_eq!(waiters.watched(), 0);
    }
}
