//! The consume loop every service runs: take deliveries of one topic as a member of a group,
//! handle up to `concurrency` at once, acknowledge each once it is handled or set aside — and
//! never hold a partition forever for one message.
//!
//! Ordering: the bus hands out a partition's next message only after the previous one was
//! acknowledged, so a run's messages are handled one after another; different partitions
//! proceed concurrently. The price of that order is that a message the loop keeps retrying
//! stops every run that hashes to its partition, so every retry here is bounded.
//!
//! # Failures
//!
//! * **A message that cannot be used** (it does not decode: [`Handled::Reject`]) goes to the
//!   dead-letter topic with the reason and is acknowledged: it would fail forever.
//! * **A message of a newer build** is skipped: acknowledged, neither handled nor
//!   dead-lettered, counted (`sluice_messages_skipped_total{topic, reason}`); below, "Messages
//!   of a newer build".
//! * **A command the ledger cannot decode** ([`LedgerError::UndecodableCommand`]: a damaged
//!   row) fails the same way every time, so its message is dead-lettered at once, counted (`sluice_quarantined_messages_total`) and
//!   escalated. The ledger itself has set the command aside: its sweeps skip it (see
//!   `sluice_ledger::quarantine`), so it is not republished every sweep either.
//! * **A handler that fails** (the ledger is locked or unreachable, the command kept changing,
//!   a publish failed) is retried with jittered exponential backoff, holding its partition,
//!   up to [`RetryPolicy::attempts`]; then the message is dead-lettered with the last error
//!   and acknowledged. Retries come out of a budget the loop's successes refill (a tenth of a
//!   retry each, `sluice_core::load::RetryBudget`): past it a retry waits the longest backoff,
//!   so a ledger that is behind is not handed more work by the retries than by the successes.
//! * **A handler that panics** (a bug) is caught where it is awaited, logged at error level
//!   with the message's identity (topic, partition, offset, run id, command key) and the
//!   panic's message, counted (`sluice_handler_panics_total`, and as a failed attempt), and
//!   retried like a failure — but at most [`RetryPolicy::panics`] times, fewer than a failure's
//!   attempts, as a bug tends to panic again on the same command. Then the message is
//!   dead-lettered with the panic's message and acknowledged, and its command is left to the
//!   sweeps (below). A retry after a panic is what a redelivery after a crash already is, which
//!   every handler survives: it re-reads the command and acts through compare-and-set. Left
//!   uncaught, a panic would end the delivery's task with the message unacknowledged, and the
//!   bus hands a partition's next message out only after an acknowledgement: every run of the
//!   partition would stop until a rebalance.
//! * **A dead letter the bus refuses**: one too large for the bus is sent again with its
//!   payload cut to fit (marked with [`DLQ_TRUNCATED_HEADER`]); any other refusal is retried
//!   with backoff for [`RetryPolicy::dead_letter_budget_ms`]. If the dead-letter topic still
//!   refuses, the message is acknowledged without a dead letter, logged at error level with
//!   its payload (the first [`LOGGED_PAYLOAD_BYTES`]) and counted
//!   (`sluice_dead_letters_unpublished_total`).
//!
//! On shutdown a message in retry is left unacknowledged and is delivered again after the
//! restart.
//!
//! # Messages of a newer build
//!
//! During a rolling upgrade, pods of two builds share the topics. What an older reader does
//! with what a newer writer adds:
//!
//! * **A field it does not know** is ignored (`crate::messages`: no `deny_unknown_fields`).
//! * **A cause it does not know** reads as `Cause::Other`: the cause is for logs only, and a
//!   dispatch request is handled the same whatever its cause.
//! * **A newer format** ([`crate::messages::FORMAT_HEADER`] above this build's
//!   [`crate::messages::FORMAT_VERSION`]), **a compensation job of a kind it does not know**
//!   (`CompensateJob::NewerKind`) and **a command of a status it does not know**
//!   ([`LedgerError::NewerCommand`]) cannot be acted on. They are skipped: acknowledged
//!   without a dead letter, counted by reason (`newer_format`, `unknown_kind`,
//!   `newer_command`) and logged at debug level.
//!
//! Why skipped, not left uncommitted for a newer reader: a message this loop does not
//! acknowledge holds its whole partition (the next message is handed out only after it), so
//! leaving one for a newer reader would stop every run of the partition on every older pod
//! until the roll moved the partition to a newer one — and for good if the roll is paused or
//! rolled back. Skipping costs only the message's fast path, as dropping any message does
//! (below, "Why acknowledging a message that was not handled loses nothing accepted"): its
//! command is in the ledger with a due time, and the sweep republishes its request when that
//! passes. A sweep of an older reconciler passes over a command of a newer status (it cannot
//! read it; `sluice_ledger::stored`), and a newer reconciler's sweep acts on it. A real
//! malformation — not JSON, a bad run id or key, a format header that is not a number — is
//! still dead-lettered.
//!
//! # Why acknowledging a message that was not handled loses nothing accepted
//!
//! A submission is accepted when its command is a row in the ledger (the API answers `201`
//! only then), never when a message is published. Messages carry only identities and every
//! handler re-reads the command; they are a fast path. The slow path is the reconciler's sweep
//! (`services/reconciler`, `sweep_once`), which reads the ledger's due index and acts on every
//! command whose due time has passed: it steps SCHEDULED and expired LEASED commands and
//! republishes the request that every other waiting state is owed. What the state machine
//! (`sluice_core::machine`) stores for each message kind, so that a dropped message is
//! replaced once its due time passes:
//!
//! * `requested` (a dispatch request) asks work of a PENDING or APPROVED command — due
//!   `pending_stale_ms` after its reservation (`CommandState::reserved`), approval or
//!   redispatch, and republished by the sweep then — or of one leased at reservation
//!   (`machine::lease_at_reservation`), due when its lease expires: the sweep marks it UNKNOWN
//!   and the reconciler retries it with the same key or looks it up. A SCHEDULED command is
//!   due at its time and stepped to PENDING by the sweep.
//! * `unknown` (a reconcile request) asks a look at an UNKNOWN command (`enter_unknown`: due at
//!   once, then at each backoff or settle interval) or at a CONFIRMED one still to be verified
//!   (`verify_pending`, due at its settle interval); the sweep republishes both.
//! * `compensate`: a command job asks for a COMPENSATING command (due at its compensation
//!   timeout or backoff); a duplicate job for a CONFIRMED command that owes the clean-up of
//!   extra commits (`owed_duplicates`, due at once; the core's property test asserts that owed
//!   work always has a due time); a rollback job only orders calls the rollback already made
//!   durable (`Context::begin_rollback` closes the run and moves each command to COMPENSATING
//!   with a due time). The sweep republishes each command's own job.
//! * `events` and `dlq` are for the outside world; no service consumes them with this loop.
//!
//! BLOCKED waits for a person, not for a message, and has no due time on purpose. So a message
//! dropped after its retries costs the command its fast path — it runs again when its due time
//! passes — and a dead letter records why.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use serde::{Deserialize, Serialize};
use sluice_bus::{Bus, BusError, Delivery, Header, Topic};
use sluice_core::load::RetryBudget;
use sluice_ledger::LedgerError;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::messages::{
    DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, FORMAT_VERSION, MessageError, format_of,
};
use crate::metrics::Metrics;
use crate::pipeline::PipelineError;

/// The header a dead letter carries when its payload was cut to fit the bus: the size of the
/// whole payload, in bytes.
pub const DLQ_TRUNCATED_HEADER: &str = "sluice-dlq-truncated-from";
/// How much of a payload is logged when a message is acknowledged without a dead letter.
pub const LOGGED_PAYLOAD_BYTES: usize = 4 * 1024;

/// What a handler says about a delivery.
#[derive(Debug)]
pub enum Handled {
    /// Done: acknowledge.
    Done,
    /// The message is unusable: dead-letter it, then acknowledge.
    Reject(MessageError),
    /// The message is a newer build's and cannot be acted on here: acknowledge it without a
    /// dead letter and count it (module doc, "Messages of a newer build").
    Skip(Skipped),
}

/// Why a message of a newer build was skipped: the `reason` of
/// `sluice_messages_skipped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skipped {
    /// Its format header is above this build's.
    NewerFormat,
    /// It asks for a kind of work this build does not know (a compensation job's kind).
    UnknownKind,
    /// Its command has a status this build does not know.
    NewerCommand,
}

impl Skipped {
    pub fn reason(self) -> &'static str {
        match self {
            Self::NewerFormat => "newer_format",
            Self::UnknownKind => "unknown_kind",
            Self::NewerCommand => "newer_command",
        }
    }
}

/// Where a consumer reads and how much it does at once.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub topic: Topic,
    pub group: String,
    pub member: String,
    pub concurrency: usize,
    /// Read requests ahead, up to this many, into one lane per tenant served in turn by
    /// `concurrency` workers ([`crate::lanes`]); `None`: a partition's messages one after
    /// another.
    pub lanes: Option<usize>,
}

/// How long a message may hold its partition: handler retries, then dead-letter retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Handler attempts before the message is dead-lettered (at least 1).
    pub attempts: u32,
    /// The backoff after the first failed attempt; it doubles after each, up to
    /// `max_backoff_ms`, and each pause is drawn between half of it and all of it.
    pub first_backoff_ms: u64,
    pub max_backoff_ms: u64,
    /// How long a dead letter the bus refuses is retried before the message is acknowledged
    /// without one (and logged).
    pub dead_letter_budget_ms: u64,
    /// Handler panics of one message before it is dead-lettered (at least 1; each also counts
    /// as one of `attempts`).
    pub panics: u32,
}

impl Default for RetryPolicy {
    /// Six attempts over about 1.5–3 s: long enough for a ledger or bus blip (a leader
    /// election, a busy SQLite file), short enough that one bad command stalls its partition
    /// for seconds, not for good. A dead letter gets 30 s. Three panics, over about 0.15–0.3 s:
    /// a panic that came of a race gets another go, one that a command causes every time
    /// holds its partition no longer than that.
    fn default() -> Self {
        Self {
            attempts: 6,
            first_backoff_ms: 100,
            max_backoff_ms: 5_000,
            dead_letter_budget_ms: 30_000,
            panics: 3,
        }
    }
}

impl RetryPolicy {
    /// The pause after failed attempt `attempt` (1 for the first): exponential, jittered.
    fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self
            .first_backoff_ms
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
        jittered(doubled.min(self.max_backoff_ms).max(1))
    }
}

/// A pause between `ms / 2` and `ms`: retries of many messages that failed together (a ledger
/// that was away) do not come back in step.
fn jittered(ms: u64) -> Duration {
    let half = ms / 2;
    let spread = u128::from(ms - half + 1);
    let extra = u64::try_from(uuid::Uuid::new_v4().as_u128() % spread).unwrap_or(0);
    Duration::from_millis(half + extra)
}

/// Runs the loop until `shutdown`, then waits for the handlers in flight, with the default
/// [`RetryPolicy`].
pub async fn consume<H, F>(
    bus: Arc<dyn Bus>,
    metrics: Arc<Metrics>,
    spec: ConsumerSpec,
    shutdown: CancellationToken,
    handler: H,
) -> Result<(), BusError>
where
    H: Fn(Delivery) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Handled, PipelineError>> + Send + 'static,
{
    consume_with(
        bus,
        metrics,
        spec,
        RetryPolicy::default(),
        shutdown,
        handler,
    )
    .await
}

/// [`consume`] with a retry policy of the caller's.
pub async fn consume_with<H, F>(
    bus: Arc<dyn Bus>,
    metrics: Arc<Metrics>,
    spec: ConsumerSpec,
    policy: RetryPolicy,
    shutdown: CancellationToken,
    handler: H,
) -> Result<(), BusError>
where
    H: Fn(Delivery) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Handled, PipelineError>> + Send + 'static,
{
    let subscription = bus.subscribe(spec.topic, &spec.group, &spec.member).await?;
    consume_subscribed(bus, metrics, spec, policy, subscription, shutdown, handler).await
}

/// [`consume_with`] on a subscription the caller already made: a consumer that must be in its
/// group before the first message it needs is published (on the embedded bus, a message every
/// group then in the topic acknowledged is dropped) subscribes first, then consumes.
pub async fn consume_subscribed<H, F>(
    bus: Arc<dyn Bus>,
    metrics: Arc<Metrics>,
    spec: ConsumerSpec,
    policy: RetryPolicy,
    mut subscription: sluice_bus::Subscription,
    shutdown: CancellationToken,
    handler: H,
) -> Result<(), BusError>
where
    H: Fn(Delivery) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Handled, PipelineError>> + Send + 'static,
{
    // The group's lag on the topic as a metric, read beside the loop until it ends.
    let _lag = crate::lag::Watch::spawn(&bus, &metrics, spec.topic, &spec.group, &shutdown);
    if let Some(capacity) = spec.lanes {
        return crate::lanes::consume(
            bus,
            metrics,
            spec,
            policy,
            subscription,
            shutdown,
            handler,
            capacity,
        )
        .await;
    }
    let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
    let budget = One::new_budget();
    let destination = crate::spans::Destination::of(&*bus, &spec);
    let mut tasks = JoinSet::new();
    loop {
        let permit = tokio::select! {
            () = shutdown.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let delivery = tokio::select! {
            () = shutdown.cancelled() => break,
            delivery = subscription.next() => match delivery {
                Some(delivery) => delivery,
                None => break,
            },
        };
        let handler = handler.clone();
        let one = One::new(&bus, &metrics, &destination, policy, &shutdown, &budget);
        tasks.spawn(async move {
            one.handle_spanned(delivery, handler).await;
            drop(permit);
        });
        while let Some(joined) = tasks.try_join_next() {
            task_ended(joined, &metrics, &bus.topic_name(spec.topic));
        }
    }
    while let Some(joined) = tasks.join_next().await {
        task_ended(joined, &metrics, &bus.topic_name(spec.topic));
    }
    Ok(())
}

/// A delivery's task that ended. The handler's own panics are caught in [`One::attempt`]; one
/// here is a panic of the loop's own code around it (acknowledging, dead-lettering), which
/// left its delivery unacknowledged: its partition waits for a rebalance or a restart. Said at
/// error level and counted, never dropped unseen.
pub(crate) fn task_ended(
    joined: Result<(), tokio::task::JoinError>,
    metrics: &Metrics,
    topic: &str,
) {
    if let Err(error) = joined
        && error.is_panic()
    {
        metrics.handler_panics.with_label_values(&[topic]).inc();
        tracing::error!(
            topic,
            panic = %panic_message(error.into_panic().as_ref()),
            "a delivery's task panicked outside its handler; its message stays unacknowledged until a rebalance or a restart"
        );
    }
}

tokio::task_local! {
    /// The span of the delivery being handled ([`crate::spans::delivery`]), for `Context::drive` to
    /// record the command key, tool and outcome on, however deep in the handler's own spans
    /// it writes.
    pub(crate) static WORK_SPAN: tracing::Span;
}

/// What handling one delivery needs.
#[derive(Clone)]
pub(crate) struct One {
    bus: Arc<dyn Bus>,
    metrics: Arc<Metrics>,
    topic: Topic,
    destination: Arc<crate::spans::Destination>,
    policy: RetryPolicy,
    shutdown: CancellationToken,
    /// The loop's retries, shared by its handlers (`sluice_core::load::RetryBudget`).
    budget: Arc<std::sync::Mutex<RetryBudget>>,
}

/// Retries a consume loop keeps in hand, and the thousandths of a retry each handled message
/// earns: under a ledger that fails most writes, retries stay about a tenth of the work that
/// succeeds instead of multiplying the load.
const RETRY_BUDGET_SAVED: u32 = 20;
const RETRY_BUDGET_PER_SUCCESS: u32 = 100;

impl One {
    pub(crate) fn new(
        bus: &Arc<dyn Bus>,
        metrics: &Arc<Metrics>,
        destination: &Arc<crate::spans::Destination>,
        policy: RetryPolicy,
        shutdown: &CancellationToken,
        budget: &Arc<std::sync::Mutex<RetryBudget>>,
    ) -> Self {
        Self {
            bus: Arc::clone(bus),
            metrics: Arc::clone(metrics),
            topic: destination.topic,
            destination: Arc::clone(destination),
            policy,
            shutdown: shutdown.clone(),
            budget: Arc::clone(budget),
        }
    }

    /// A loop's retry budget, shared by its handlers.
    pub(crate) fn new_budget() -> Arc<std::sync::Mutex<RetryBudget>> {
        Arc::new(std::sync::Mutex::new(RetryBudget::new(
            RETRY_BUDGET_SAVED,
            RETRY_BUDGET_PER_SUCCESS,
        )))
    }

    /// [`One::handle`] in the delivery's span ([`crate::spans::delivery`], also [`WORK_SPAN`]).
    pub(crate) async fn handle_spanned<H, F>(self, delivery: Delivery, handler: H)
    where
        H: Fn(Delivery) -> F,
        F: Future<Output = Result<Handled, PipelineError>>,
    {
        let span = crate::spans::delivery(&self.destination, &delivery);
        WORK_SPAN
            .scope(
                span.clone(),
                self.handle(delivery, handler).instrument(span),
            )
            .await;
    }

    /// Whether a retry is in the budget now; one that is not waits the longest backoff.
    fn retry_in_budget(&self) -> bool {
        self.budget
            .lock()
            .map(|mut budget| budget.try_retry())
            .unwrap_or(true)
    }

    fn succeeded(&self) {
        if let Ok(mut budget) = self.budget.lock() {
            budget.succeeded();
        }
    }

    async fn handle<H, F>(self, delivery: Delivery, handler: H)
    where
        H: Fn(Delivery) -> F,
        F: Future<Output = Result<Handled, PipelineError>>,
    {
        let topic = self.bus.topic_name(self.topic);
        let held = self
            .metrics
            .handle_seconds
            .with_label_values(&[self.topic.suffix()])
            .start_timer();
        let set_aside = match format_of(&delivery.message.headers) {
            Err(malformed) => Some(malformed.to_string()),
            Ok(format) if format > FORMAT_VERSION => {
                self.skipped(&topic, &delivery, Skipped::NewerFormat);
                None
            }
            Ok(_) => match self.attempts(&topic, &handler, &delivery).await {
                Some(set_aside) => set_aside,
                None => {
                    // Shutdown: not acknowledged, so not a hold to count.
                    held.stop_and_discard();
                    return;
                }
            },
        };
        if let Some(reason) = set_aside
            && !self.dead_letter(&topic, &delivery, &reason).await
        {
            held.stop_and_discard();
            return;
        }
        if let Err(e) = delivery.ack().await {
            // The partition moved to another member, which gets the message again; its
            // handler finds our ledger write done.
            tracing::debug!(error = %e, "acknowledgement refused");
        }
        held.observe_duration();
    }

    /// Calls the handler until it is done or the message is set aside, retrying failures and
    /// panics within the policy. `Some(None)`: acknowledge; `Some(Some(reason))`: dead-letter
    /// with `reason`, then acknowledge; `None`: shutdown came first, leave it unacknowledged.
    async fn attempts<H, F>(
        &self,
        topic: &str,
        handler: &H,
        delivery: &Delivery,
    ) -> Option<Option<String>>
    where
        H: Fn(Delivery) -> F,
        F: Future<Output = Result<Handled, PipelineError>>,
    {
        let attempts = self.policy.attempts.max(1);
        let most_panics = self.policy.panics.max(1);
        let mut attempt = 0;
        let mut panics = 0;
        loop {
            attempt += 1;
            match self.attempt(handler, delivery).await {
                Err(panicked) => {
                    panics += 1;
                    self.metrics
                        .handler_panics
                        .with_label_values(&[topic])
                        .inc();
                    self.metrics
                        .handler_errors
                        .with_label_values(&[topic])
                        .inc();
                    let given_up = panics >= most_panics || attempt >= attempts;
                    tracing::error!(
                        topic = %topic,
                        partition = delivery.partition,
                        offset = delivery.offset,
                        run_id = delivery.key(),
                        command_key = command_key_of(delivery.payload()).as_deref().unwrap_or(""),
                        attempt,
                        panics,
                        panic = %panicked,
                        "handler panicked; {}",
                        if given_up {
                            "dead-lettering the message (the sweep takes its command up again when due)"
                        } else {
                            "retrying"
                        }
                    );
                    if given_up {
                        return Some(Some(format!(
                            "handler panicked {panics} times; last: {panicked}"
                        )));
                    }
                    if !self.pause(self.policy.backoff(attempt)).await {
                        // Shutdown: not acknowledged, so not a hold to count.
                        return None;
                    }
                }
                Ok(Ok(Handled::Done)) => {
                    self.succeeded();
                    return Some(None);
                }
                Ok(Ok(Handled::Reject(reason))) => return Some(Some(reason.to_string())),
                Ok(Ok(Handled::Skip(why))) => {
                    self.skipped(topic, delivery, why);
                    return Some(None);
                }
                Ok(Err(PipelineError::Ledger(LedgerError::NewerCommand { .. }))) => {
                    self.skipped(topic, delivery, Skipped::NewerCommand);
                    return Some(None);
                }
                Ok(Err(PipelineError::Ledger(e @ LedgerError::UndecodableCommand { .. }))) => {
                    self.metrics
                        .quarantined_messages
                        .with_label_values(&[topic])
                        .inc();
                    self.metrics.escalations.inc();
                    tracing::error!(
                        topic = %topic,
                        partition = delivery.partition,
                        offset = delivery.offset,
                        error = %e,
                        "escalated to a person: the message's command cannot be decoded; dead-lettering the message instead of retrying it"
                    );
                    return Some(Some(e.to_string()));
                }
                Ok(Err(e)) => {
                    self.metrics
                        .handler_errors
                        .with_label_values(&[topic])
                        .inc();
                    if attempt >= attempts {
                        tracing::warn!(
                            topic = %topic,
                            partition = delivery.partition,
                            offset = delivery.offset,
                            attempts,
                            error = %e,
                            "handler kept failing; dead-lettering the message (the sweep takes its command up again when due)"
                        );
                        return Some(Some(format!("handler failed {attempts} times; last: {e}")));
                    }
                    tracing::warn!(
                        topic = %topic,
                        partition = delivery.partition,
                        offset = delivery.offset,
                        attempt,
                        error = %e,
                        "handler failed; retrying"
                    );
                    // Past the budget, the retry waits the longest backoff: retries stay a
                    // share of what succeeds instead of adding to a ledger that is behind.
                    let pause = if self.retry_in_budget() {
                        self.policy.backoff(attempt)
                    } else {
                        Duration::from_millis(self.policy.max_backoff_ms)
                    };
                    if !self.pause(pause).await {
                        // Shutdown: not acknowledged, so not a hold to count.
                        return None;
                    }
                }
            }
        }
    }

    /// Counts and logs a message of a newer build that is acknowledged unhandled.
    fn skipped(&self, topic: &str, delivery: &Delivery, why: Skipped) {
        self.metrics
            .messages_skipped
            .with_label_values(&[topic, why.reason()])
            .inc();
        tracing::debug!(
            topic,
            partition = delivery.partition,
            offset = delivery.offset,
            run_id = delivery.key(),
            reason = why.reason(),
            "message of a newer build skipped; its command's due time brings it back to a build that can act on it"
        );
    }

    /// One call of the handler, with a panic in it caught: `Err` carries the panic's message.
    /// Caught here, in the delivery's own task, so the handler keeps its span and task-locals
    /// and nothing is spawned per attempt. Unwind safety: after a panic the handler is only
    /// called afresh with the delivery, and what it shares with other deliveries (the ledger,
    /// the bus) is behind compare-and-set writes that a panic leaves half done at worst, as a
    /// crash would.
    async fn attempt<H, F>(
        &self,
        handler: &H,
        delivery: &Delivery,
    ) -> Result<Result<Handled, PipelineError>, String>
    where
        H: Fn(Delivery) -> F,
        F: Future<Output = Result<Handled, PipelineError>>,
    {
        // Boxed: a dispatch handler's future is several KiB, and the task spawned per
        // delivery would otherwise carry it inline, copied on every move of the task (spawn,
        // stage changes), which showed in profiles as memcpy.
        let call = Box::pin(async {
            sluice_faults::point!("consumer.handle.pre");
            let handled = handler(delivery.clone()).await;
            sluice_faults::point!("consumer.handle.post");
            handled
        });
        AssertUnwindSafe(call)
            .catch_unwind()
            .await
            .map_err(|payload| panic_message(payload.as_ref()))
    }

    /// Sleeps `pause`; `false` if shutdown came first.
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            () = self.shutdown.cancelled() => false,
            () = tokio::time::sleep(pause) => true,
        }
    }

    /// Publishes `delivery` to the dead-letter topic with `reason`, within the policy's budget.
    /// `true`: acknowledge it now (dead-lettered, or given up on and logged); `false`: shutdown
    /// or a closed bus came first, leave it unacknowledged.
    async fn dead_letter(&self, topic: &str, delivery: &Delivery, reason: &str) -> bool {
        let mut payload = delivery.payload().to_vec();
        let mut headers: Vec<Header> = delivery.message.headers.clone();
        headers.push((DLQ_REASON_HEADER.into(), reason.as_bytes().to_vec()));
        headers.push((DLQ_TOPIC_HEADER.into(), topic.as_bytes().to_vec()));
        let deadline = Instant::now() + Duration::from_millis(self.policy.dead_letter_budget_ms);
        let mut attempt = 0;
        let mut truncated = false;
        let last_error = loop {
            attempt += 1;
            let error = match self
                .bus
                .publish(Topic::Dlq, delivery.key(), payload.clone(), headers.clone())
                .await
            {
                Ok(_) => {
                    self.metrics.dead_letters.with_label_values(&[topic]).inc();
                    tracing::warn!(
                        topic,
                        partition = delivery.partition,
                        offset = delivery.offset,
                        reason,
                        truncated,
                        "message dead-lettered"
                    );
                    return true;
                }
                Err(e) => e,
            };
            match error {
                BusError::MessageTooLarge { bytes, max, .. } if !truncated => {
                    // The reason and topic headers pushed it over: keep what fits, and say so.
                    let whole = payload.len();
                    let marker = (DLQ_TRUNCATED_HEADER.len() + 20).saturating_add(bytes - max);
                    payload.truncate(whole.saturating_sub(marker));
                    headers.push((DLQ_TRUNCATED_HEADER.into(), whole.to_string().into_bytes()));
                    truncated = true;
                    continue;
                }
                BusError::Closed => return false,
                error if !error.is_transient() => break error,
                error => {
                    let pause = self.policy.backoff(attempt);
                    if Instant::now() + pause > deadline {
                        break error;
                    }
                    tracing::warn!(topic, error = %error, "cannot dead-letter a message; retrying");
                    if !self.pause(pause).await {
                        return false;
                    }
                }
            }
        };
        self.metrics
            .dead_letters_unpublished
            .with_label_values(&[topic])
            .inc();
        let shown = &delivery.payload()[..delivery.payload().len().min(LOGGED_PAYLOAD_BYTES)];
        tracing::error!(
            topic,
            partition = delivery.partition,
            offset = delivery.offset,
            key = delivery.key(),
            reason,
            error = %last_error,
            payload_bytes = delivery.payload().len(),
            payload = %String::from_utf8_lossy(shown),
            "the dead-letter topic refused the message; acknowledging it without a dead letter (its command stays in the ledger, and the sweep takes it up again when due)"
        );
        true
    }
}

/// What a panic said (`panic!`'s message), for the log and the dead letter.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}

/// The command key a request names (`command_key`, or its compensate job's), for the log of a
/// handler that panicked on it; `None` for a rollback job or a payload that does not decode.
fn command_key_of(payload: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value
        .get("command_key")
        .or_else(|| value.get("job")?.get("command_key"))
        .and_then(serde_json::Value::as_str)
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_its_jitter_and_stops_at_the_cap() {
        let policy = RetryPolicy {
            attempts: 10,
            first_backoff_ms: 100,
            max_backoff_ms: 1_000,
            dead_letter_budget_ms: 0,
            ..RetryPolicy::default()
        };
        for _ in 0..200 {
            let first = policy.backoff(1).as_millis();
            assert!((50..=100).contains(&first), "{first}");
            let third = policy.backoff(3).as_millis();
            assert!((200..=400).contains(&third), "{third}");
            let late = policy.backoff(40).as_millis();
            assert!((500..=1_000).contains(&late), "{late}");
        }
    }

    #[test]
    fn the_policy_reads_from_configuration_with_defaults() {
        let policy: RetryPolicy = toml::from_str("attempts = 3").expect("valid");
        assert_eq!(
            policy,
            RetryPolicy {
                attempts: 3,
                ..RetryPolicy::default()
            }
        );
        assert!(toml::from_str::<RetryPolicy>("attempt = 3").is_err());
    }

    #[test]
    fn a_panicking_message_is_named_by_its_command() {
        assert_eq!(
            command_key_of(
                br#"{"run_id":"r-1","command_key":"d-1/payments/wire/0","cause":"reserved"}"#
            )
            .as_deref(),
            Some("d-1/payments/wire/0")
        );
        assert_eq!(
            command_key_of(
                br#"{"run_id":"r-1","job":{"kind":"command","command_key":"d-2/email/send/1"}}"#
            )
            .as_deref(),
            Some("d-2/email/send/1")
        );
        assert_eq!(
            command_key_of(
                br#"{"run_id":"r-1","job":{"kind":"rollback","actor":"a","reason":"b"}}"#
            ),
            None
        );
        assert_eq!(command_key_of(b"not json"), None);
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("formatted 7")), "formatted 7");
        assert_eq!(panic_message(&7u8), "a panic without a message");
    }
}
