//! Live lifecycle events as server-sent events: `GET /v1/events/stream[?run_id=…]`, what the
//! console watches so a person sees a run move without reloading.
//!
//! The stream is fed by the lifecycle events this producer already reads to wake its long polls
//! ([`crate::wait::watch_events`]): each is handed to every open stream through one broadcast
//! channel, and a stream passes on only what its caller may read. An operator or admin sees
//! every run (or one, with `run_id`); an agent sees only commands it submitted, and asking for a
//! run that is not its own is refused (403) before the stream opens. The number of open streams
//! is bounded (`producer.max_event_streams`, past it 503 `too_many_streams`), and every stream
//! ends when the producer stops reading events (shutdown), so graceful shutdown is not held up.
//!
//! Each event is `event: effect` with the lifecycle event's payload: the public projection of
//! the command (docs/events.md: run, key, tool, status, outcome, times — not the arguments or
//! the result, which `GET …/effects/{key}` gives a caller that may read them); the stream opens with `event: ready` and says `event: lagged` when it
//! fell behind and missed events (the client then re-reads what it shows). With `summary=true`
//! it sends instead at most one `event: changed` a second (how many changes, in which runs):
//! what a view of many runs needs to re-read, without every command of a busy system crossing
//! the network. A comment every 15 seconds keeps idle connections open through proxies.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sluice_runtime::config::Role;
use sluice_runtime::messages::decode;
use tokio::sync::{broadcast, watch};

use crate::auth::{Caller, Need};
use crate::{Api, ApiError, Q, parse_run};

/// Events buffered per stream before a slow reader is told it lagged.
const BUFFER: usize = 1_024;
/// How often an idle stream sends a comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One lifecycle event: its subject (`<run_id>/<command_key>`) and payload (the projection).
#[derive(Debug, Clone)]
struct Item {
    subject: Arc<str>,
    payload: Arc<[u8]>,
}

/// The open streams' shared feed, their count, and the signal that ends them.
#[derive(Debug)]
pub(crate) struct Streams {
    feed: broadcast::Sender<Item>,
    open: Arc<AtomicUsize>,
    closed: watch::Sender<bool>,
}

impl Default for Streams {
    fn default() -> Self {
        Self {
            feed: broadcast::Sender::new(BUFFER),
            open: Arc::default(),
            closed: watch::Sender::new(false),
        }
    }
}

impl Streams {
    /// Hands one lifecycle event to the open streams; with none open it costs a counter read.
    pub(crate) fn publish(&self, subject: &str, payload: &[u8]) {
        if self.feed.receiver_count() == 0 {
            return;
        }
        let _ = self.feed.send(Item {
            subject: Arc::from(subject),
            payload: Arc::from(payload),
        });
    }

    /// Ends every open stream and refuses new ones: no more events will come.
    pub(crate) fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Takes one of `max` stream slots, or `None` when all are taken.
    fn take_slot(&self, max: usize) -> Option<Slot> {
        let taken = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            });
        taken.ok().map(|_| Slot(Arc::clone(&self.open)))
    }
}

/// One open stream's place in the count; dropped with the stream.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamQuery {
    run_id: Option<String>,
    /// `true`: at most one `changed` event per [`SUMMARY_WINDOW`] instead of every command.
    #[serde(default)]
    summary: bool,
}

/// How long a summary stream gathers changes before it says so.
const SUMMARY_WINDOW: Duration = Duration::from_secs(1);
/// Most run ids one `changed` event names.
const SUMMARY_RUNS: usize = 50;

/// What one stream passes on.
struct Filter {
    /// `<run_id>/`: only this run's commands.
    prefix: Option<String>,
    /// Only commands submitted by this agent.
    submitter: Option<String>,
}

impl Filter {
    /// Whether this stream may pass `item` on.
    fn passes(&self, item: &Item) -> bool {
        if let Some(prefix) = &self.prefix
            && !item.subject.starts_with(prefix.as_str())
        {
            return false;
        }
        match &self.submitter {
            None => true,
            // `submitted_by` has its name in the projection and in the stored command a build
            // before it published.
            Some(agent) => decode::<Submitter>("lifecycle event", &item.payload)
                .is_ok_and(|c| c.submitted_by.as_deref() == Some(agent.as_str())),
        }
    }

    /// The SSE event for `item`, if this stream passes it on.
    fn event(&self, item: &Item) -> Option<Event> {
        if !self.passes(item) {
            return None;
        }
        // The projection as published: the payload is compact JSON (no line breaks), passed on
        // without decoding and encoding it again per stream.
        let text = std::str::from_utf8(&item.payload).ok()?;
        Some(Event::default().event("effect").data(text))
    }
}

/// Who submitted an event's command: all an agent's stream reads of the payload.
#[derive(Deserialize)]
struct Submitter {
    #[serde(default)]
    submitted_by: Option<String>,
}

/// What the feed gave a stream.
enum Received {
    Item(Item),
    Lagged(u64),
}

/// `GET /v1/events/stream`: the lifecycle events the caller may read, as they happen.
pub(crate) async fn stream(
    State(api): State<Api>,
    Caller(principal): Caller,
    Q(query): Q<StreamQuery>,
) -> Result<Response, ApiError> {
    principal.require(Need::ReadRun)?;
    let run_id = query.run_id.as_deref().map(parse_run).transpose()?;
    if let Some(run_id) = &run_id {
        // An agent's own runs only; the run must exist for it (as for every run read).
        api.run_for(&principal, run_id).await?;
    }
    let streams = &api.waiters.streams;
    if *streams.closed.borrow() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "events_unavailable",
            "this producer is not reading lifecycle events (stopping, or the bus is down); poll the run instead",
        ));
    }
    let max = api.config.max_event_streams;
    let slot = streams.take_slot(max).ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            format!(
                "{max} event streams are open on this producer (producer.max_event_streams); \
                 close one or poll the run instead"
            ),
        )
    })?;
    let filter = Filter {
        prefix: run_id.as_ref().map(|r| format!("{r}/")),
        submitter: (principal.role == Role::Agent && principal.authenticated)
            .then(|| principal.name.clone()),
    };
    let ready = Event::default().event("ready").data(
        json!({ "run_id": run_id, "as": principal.name, "role": principal.role }).to_string(),
    );
    let state = Open {
        feed: streams.feed.subscribe(),
        closed: streams.closed.subscribe(),
        filter,
        _slot: slot,
        ready: Some(ready),
        summary: query.summary,
    };
    let events = futures::stream::unfold(state, |mut state| async move {
        let event = state.next().await?;
        Some((Ok::<_, Infallible>(event), state))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

/// One open stream.
struct Open {
    feed: broadcast::Receiver<Item>,
    closed: watch::Receiver<bool>,
    filter: Filter,
    _slot: Slot,
    ready: Option<Event>,
    summary: bool,
}

impl Open {
    /// The next event to send, or `None` when the stream ends.
    async fn next(&mut self) -> Option<Event> {
        if let Some(ready) = self.ready.take() {
            return Some(ready);
        }
        if self.summary {
            return self.next_summary().await;
        }
        loop {
            match self.receive().await? {
                Received::Item(item) => {
                    if let Some(event) = self.filter.event(&item) {
                        return Some(event);
                    }
                }
                Received::Lagged(missed) => return Some(lagged(missed)),
            }
        }
    }

    /// Waits for a change this stream may see, gathers what follows for [`SUMMARY_WINDOW`],
    /// and says how many there were and in which runs: a view of many runs re-reads once.
    async fn next_summary(&mut self) -> Option<Event> {
        let mut events = 0_u64;
        let mut missed = 0_u64;
        let mut runs = BTreeSet::new();
        while events == 0 && missed == 0 {
            match self.receive().await? {
                Received::Item(item) if self.filter.passes(&item) => {
                    note(&item, &mut events, &mut runs);
                }
                Received::Item(_) => {}
                Received::Lagged(n) => missed += n,
            }
        }
        let window = tokio::time::sleep(SUMMARY_WINDOW);
        tokio::pin!(window);
        loop {
            let received = tokio::select! {
                () = &mut window => break,
                received = self.receive() => received,
            };
            match received {
                Some(Received::Item(item)) if self.filter.passes(&item) => {
                    note(&item, &mut events, &mut runs);
                }
                Some(Received::Item(_)) => {}
                Some(Received::Lagged(n)) => missed += n,
                None => break,
            }
        }
        Some(
            Event::default()
                .event("changed")
                .data(json!({ "events": events, "missed": missed, "runs": runs }).to_string()),
        )
    }

    /// The next item of the feed, or `None` once the streams are closed.
    async fn receive(&mut self) -> Option<Received> {
        loop {
            if *self.closed.borrow() {
                return None;
            }
            tokio::select! {
                changed = self.closed.changed() => {
                    if changed.is_err() { return None; }
                }
                received = self.feed.recv() => return match received {
                    Ok(item) => Some(Received::Item(item)),
                    Err(broadcast::error::RecvError::Lagged(missed)) => Some(Received::Lagged(missed)),
                    Err(broadcast::error::RecvError::Closed) => None,
                },
            }
        }
    }
}

/// Counts one change and remembers its run (up to [`SUMMARY_RUNS`] of them).
fn note(item: &Item, events: &mut u64, runs: &mut BTreeSet<String>) {
    *events += 1;
    if runs.len() < SUMMARY_RUNS
        && let Some((run, _)) = item.subject.split_once('/')
    {
        runs.insert(run.to_owned());
    }
}

fn lagged(missed: u64) -> Event {
    Event::default()
        .event("lagged")
        .data(json!({ "missed": missed }).to_string())
}
