//! Waiting for a command to settle: `GET …/effects/{key}?wait=30s` (a long poll) and
//! `Prefer: wait=<seconds>` on a submission (RFC 7240) both hold the answer until the command is
//! terminal, STUCK or BLOCKED, or the wait passes.
//!
//! Waiters are woken by the lifecycle events this producer reads from the bus
//! ([`watch_events`]). Each waiter registers the command it waits for in [`Waiters`]: an event
//! wakes only the waiters of its own command (a map lookup), so a thousand waiters cost nothing
//! per event but their own. A waiter arms its wake-up *before* it reads the ledger, so an event
//! between the read and the wait is not lost; it re-reads the ledger every second all the same,
//! for an event that never comes (the bus down, another producer's consumer group).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_bus::Topic;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_runtime::Shutdown;
use sluice_runtime::messages::header;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::Api;
use crate::auth::{Caller, Need, Principal};
use crate::http::{ApiError, Q};

/// How often a waiter re-reads the ledger when no event woke it.
const REREAD: Duration = Duration::from_secs(1);

/// The commands waited for, each with one [`Notify`] its waiters share.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    watched: Mutex<HashMap<String, Watched>>,
}

#[derive(Debug)]
struct Watched {
    notify: Arc<Notify>,
    watchers: usize,
}

/// One waiter's registration; dropping it unregisters.
pub(crate) struct Watch {
    waiters: Arc<Waiters>,
    subject: String,
    notify: Arc<Notify>,
}

impl Waiters {
    /// Registers a waiter for `subject` (`<run_id>/<command_key>`).
    pub(crate) fn watch(self: &Arc<Self>, subject: String) -> Watch {
        let mut watched = self.lock();
        let entry = watched.entry(subject.clone()).or_insert_with(|| Watched {
            notify: Arc::new(Notify::new()),
            watchers: 0,
        });
        entry.watchers += 1;
        let notify = Arc::clone(&entry.notify);
        Watch {
            waiters: Arc::clone(self),
            subject,
            notify,
        }
    }

    /// Wakes every waiter of `subject`; nobody waiting costs one map lookup.
    pub(crate) fn wake(&self, subject: &str) {
        if let Some(watched) = self.lock().get(subject) {
            watched.notify.notify_waiters();
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
    let status = command.status();
    let left = deadline.saturating_duration_since(Instant::now());
    if status.is_settled() || left.is_zero() {
        return true;
    }
    // Not due before the wait ends: nothing will happen meanwhile.
    status == CommandStatus::Scheduled
        && command.state.due_at.is_some_and(|due| {
            due.millis_since(now) > i64::try_from(left.as_millis()).unwrap_or(i64::MAX)
        })
}

/// The command `run_id`/`command_key` once it is terminal, STUCK or BLOCKED, or as it is at
/// `deadline`. `known` is the command as the caller just read or wrote it: when it
/// needs no wait, the ledger is not read again.
pub(crate) async fn until_settled(
    api: &Api,
    principal: &Principal,
    run_id: &RunId,
    command_key: &CommandKey,
    known: Option<Command>,
    deadline: Instant,
) -> Result<Command, ApiError> {
    if let Some(command) = known
        && done_waiting(&command, deadline, api.ctx.clock.now())
    {
        return Ok(command);
    }
    let subject = format!("{run_id}/{command_key}");
    let watch = api.waiters.watch(subject.clone());
    loop {
        let woken = watch.notify.notified();
        tokio::pin!(woken);
        // Armed before the read: an event that comes between the read and the wait wakes it.
        woken.as_mut().enable();
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
        if done_waiting(&command, deadline, api.ctx.clock.now()) {
            return Ok(command);
        }
        let _ = tokio::time::timeout_at(deadline.min(Instant::now() + REREAD), woken).await;
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GetQuery {
    wait: Option<String>,
}

/// Parses `30s`, `500ms`, `2m` or a plain number of milliseconds.
pub fn parse_wait(raw: &str) -> Option<Duration> {
    let raw = raw.trim();
    let (number, unit) = match raw.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => raw.split_at(at),
        None => (raw, "ms"),
    };
    let value: u64 = number.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(value)),
        "s" => Some(Duration::from_secs(value)),
        "m" => Some(Duration::from_secs(value.checked_mul(60)?)),
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
    let command = until_settled(
        &api,
        &principal,
        &run_id,
        &command_key,
        None,
        Instant::now() + wait,
    )
    .await?;
    Ok(Json(command).into_response())
}

/// Reads the lifecycle events as a group of this producer's own, waking the waiters of each
/// event's command.
pub(crate) async fn watch_events(api: Api, shutdown: Shutdown) {
    let group = format!("sluice-producer-{}", uuid::Uuid::new_v4().simple());
    let mut subscription = match api.ctx.bus.subscribe(Topic::Events, &group, &group).await {
        Ok(subscription) => subscription,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch lifecycle events; long polls re-read the ledger");
            return;
        }
    };
    loop {
        let delivery = tokio::select! {
            () = shutdown.cancelled() => return,
            delivery = subscription.next() => match delivery {
                Some(delivery) => delivery,
                None => return,
            },
        };
        if let Some(subject) = header(&delivery.message.headers, "ce_subject") {
            api.waiters.wake(subject);
        }
        let _ = delivery.ack().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_in_common_units() {
        assert_eq!(parse_wait("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_wait("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_wait("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_wait("250"), Some(Duration::from_millis(250)));
        assert_eq!(parse_wait("soon"), None);
        assert_eq!(parse_wait("5h"), None);
    }

    #[tokio::test]
    async fn a_wake_reaches_only_the_waiters_of_its_command_and_registrations_are_dropped() {
        let waiters = Arc::new(Waiters::default());
        let mine = waiters.watch("r/a".into());
        let also_mine = waiters.watch("r/a".into());
        let other = waiters.watch("r/b".into());
        assert_eq!(waiters.watched(), 2);
        {
            let woken = mine.notify.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let not_woken = other.notify.notified();
            tokio::pin!(not_woken);
            not_woken.as_mut().enable();
            waiters.wake("r/a");
            tokio::time::timeout(Duration::from_secs(1), woken)
                .await
                .expect("the waiter of r/a is woken");
            assert!(
                tokio::time::timeout(Duration::from_millis(50), not_woken)
                    .await
                    .is_err(),
                "the waiter of r/b is not"
            );
        }
        drop(mine);
        assert_eq!(waiters.watched(), 2, "r/a still has a waiter");
        drop(also_mine);
        drop(other);
        assert_eq!(waiters.watched(), 0);
    }
}
