//! The consume loop under messages that fail: none of them may hold its partition forever.
//! Each test puts a failing message ahead of a good one on a one-partition embedded bus (so
//! the good one waits behind it, as every run hashing to that partition would), against a
//! real SQLite ledger file, and checks that the good one is handled, and what became of the
//! failing one.
//!
//! Before bounded retries each of these failed the same way: the good message was never
//! handled (`the message behind … was not handled within …`), because the loop retried the
//! failing one forever while holding the partition. `a_damaged_command_row_…` also failed on
//! the ledger's `due`, which returned an error for the whole sweep.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use sluice_bus::{
    Admission, Bus, BusError, Delivery, EmbeddedBus, EmbeddedConfig, Header, Published,
    Subscription, Topic,
};
use sluice_core::command::Command;
use sluice_core::ids::RunId;
use sluice_core::time::{Clock, SystemClock};
use sluice_ledger::contract::{command, fresh_run};
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{CommandStore, ShardStore};
use sluice_ledger::{Ledger, LedgerError};
use sluice_runtime::Metrics;
use sluice_runtime::consumer::{
    ConsumerSpec, DLQ_TRUNCATED_HEADER, Handled, RetryPolicy, consume_with,
};
use sluice_runtime::messages::{
    Cause, DLQ_REASON_HEADER, DispatchRequest, EventOrigin, FORMAT_HEADER, LifecycleEvent, decode,
    encode,
};
use sluice_runtime::pipeline::PipelineError;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long a good message may wait behind a failing one before the test calls it wedged.
const WEDGED_AFTER: Duration = Duration::from_secs(10);

fn bus(max_message_bytes: usize) -> EmbeddedBus {
    EmbeddedBus::new(EmbeddedConfig {
        partitions: 1,
        max_message_bytes,
        ..EmbeddedConfig::default()
    })
    .expect("valid bus")
}

fn quick_policy() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        first_backoff_ms: 10,
        max_backoff_ms: 50,
        dead_letter_budget_ms: 300,
        panics: 2,
    }
}

fn spec() -> ConsumerSpec {
    ConsumerSpec {
        topic: Topic::Requested,
        group: "test-dispatcher".into(),
        member: "test".into(),
        concurrency: 4,
        lanes: None,
    }
}

async fn reserve(ledger: &dyn Ledger, command: Command) -> Command {
    let audit = command.reservation_audit("test");
    let reserved = ledger.reserve(command, audit).await.expect("reserve");
    assert!(reserved.is_created(), "{reserved:?}");
    reserved.command().clone()
}

async fn request(bus: &dyn Bus, command: &Command) {
    let request = DispatchRequest {
        run_id: command.run_id.clone(),
        command_key: command.command_key.clone(),
        cause: Cause::Reserved,
    };
    bus.publish(
        Topic::Requested,
        command.run_id.as_str(),
        encode(&request),
        vec![],
    )
    .await
    .expect("publish");
}

/// What the services' handlers do first: decode the request, read its command from the
/// ledger (the source of truth); then `after` does the rest. Reports each run handled.
fn reading_handler<A, Fut>(
    ledger: Arc<dyn Ledger>,
    handled: mpsc::UnboundedSender<RunId>,
    after: A,
) -> impl Fn(
    Delivery,
) -> std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Handled, PipelineError>> + Send>,
> + Clone
+ Send
+ Sync
+ 'static
where
    A: Fn(Command) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), PipelineError>> + Send + 'static,
{
    move |delivery: Delivery| {
        let (ledger, handled, after) = (Arc::clone(&ledger), handled.clone(), after.clone());
        Box::pin(async move {
            let request: DispatchRequest = match decode("dispatch request", delivery.payload()) {
                Ok(request) => request,
                Err(e) => return Ok(Handled::Reject(e)),
            };
            if let Some(command) = ledger.get(&request.run_id, &request.command_key).await? {
                after(command).await?;
            }
            let _ = handled.send(request.run_id);
            Ok(Handled::Done)
        })
    }
}

async fn expect_handled(handled: &mut mpsc::UnboundedReceiver<RunId>, run: &RunId) {
    let waited = tokio::time::timeout(WEDGED_AFTER, async {
        while let Some(done) = handled.recv().await {
            if &done == run {
                return;
            }
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "the message behind the failing one ({run}) was not handled within {WEDGED_AFTER:?}: its partition is wedged"
    );
}

async fn next_dead_letter(dlq: &mut Subscription) -> Delivery {
    let delivery = tokio::time::timeout(WEDGED_AFTER, dlq.next())
        .await
        .expect("a dead letter within the wait")
        .expect("bus open");
    delivery.ack().await.expect("ack");
    delivery
}

fn header(delivery: &Delivery, name: &str) -> String {
    String::from_utf8_lossy(delivery.message.header(name).unwrap_or_default()).into_owned()
}

fn open_ledger(dir: &std::path::Path) -> Arc<SqliteLedger> {
    Arc::new(SqliteLedger::open(SqliteConfig::in_dir(dir)).expect("open ledger"))
}

/// A handler that fails on one command every time — here the lifecycle event it publishes
/// is larger than the bus takes, as a tool that publishes a large argument with its events
/// (`[tool.events] include_args`) makes it — is retried a
/// bounded number of times, then its message is dead-lettered with the last error and
/// acknowledged; the message behind it on the partition is handled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_keeps_failing_gives_its_partition_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open_ledger(dir.path());
    let bus = Arc::new(bus(4 * 1024));
    let metrics = Arc::new(Metrics::new());
    let heavy_run = fresh_run("heavy");
    let heavy = reserve(
        &*ledger,
        command(
            &heavy_run,
            0,
            "email/send",
            0,
            json!({"body": "x".repeat(6 * 1024)}),
        ),
    )
    .await;
    let light = reserve(
        &*ledger,
        command(
            &fresh_run("light"),
            0,
            "email/send",
            0,
            json!({"body": "hi"}),
        ),
    )
    .await;
    let mut dlq = bus
        .subscribe(Topic::Dlq, "test-dlq", "test")
        .await
        .expect("dlq");
    request(&*bus, &heavy).await;
    request(&*bus, &light).await;

    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let events_bus: Arc<dyn Bus> = bus.clone();
    let handler = reading_handler(ledger.clone(), handled_tx, move |command: Command| {
        let bus = Arc::clone(&events_bus);
        async move {
            let published = ["body".to_owned()];
            let origin = EventOrigin {
                from: None,
                include_args: &published,
            };
            let event = LifecycleEvent::new("test", &command, origin, SystemClock.now());
            bus.publish(
                Topic::Events,
                command.run_id.as_str(),
                event.payload,
                event.headers,
            )
            .await?;
            Ok(())
        }
    });
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus.clone(),
        Arc::clone(&metrics),
        spec(),
        quick_policy(),
        shutdown.clone(),
        handler,
    ));

    expect_handled(&mut handled, &light.run_id).await;
    let dead = next_dead_letter(&mut dlq).await;
    let request: DispatchRequest = decode("dispatch request", dead.payload()).expect("request");
    assert_eq!(request.run_id, heavy_run);
    let reason = header(&dead, DLQ_REASON_HEADER);
    assert!(
        reason.contains("handler failed 3 times") && reason.contains("bytes"),
        "{reason}"
    );
    assert_eq!(
        metrics
            .handler_errors
            .with_label_values(&["sluice.requested"])
            .get(),
        3
    );
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
    assert_eq!(bus.lag(Topic::Requested, "test-dispatcher"), Some(0));
    // Each message held its partition until it was acknowledged: the failing one through its
    // two pauses between attempts (at least 5 and 10 ms under the quick policy's jitter).
    let held = metrics.handle_seconds.with_label_values(&["requested"]);
    assert_eq!(held.get_sample_count(), 2);
    assert!(
        held.get_sample_sum() >= 0.015,
        "held {} s in all",
        held.get_sample_sum()
    );
}

/// A command row that cannot be decoded (damaged JSON) fails every read of it the same way.
/// Its message is dead-lettered at once (no retries, even under a policy that would retry for
/// minutes), counted and escalated, with a reason naming the command; the ledger's `due` skips
/// it and still returns the others. A row of a status this build does not know (a newer build
/// wrote it) is skipped by `due` too, but not quarantined: it is counted as left for a newer
/// build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_command_row_is_quarantined_not_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (damaged, good, unknown_status) = {
        let ledger = open_ledger(dir.path());
        let damaged = reserve(
            &*ledger,
            command(&fresh_run("damaged"), 0, "email/send", 0, json!({})),
        )
        .await;
        let good = reserve(
            &*ledger,
            command(&fresh_run("good"), 0, "email/send", 0, json!({})),
        )
        .await;
        let unknown_status = reserve(
            &*ledger,
            command(&fresh_run("status"), 0, "email/send", 0, json!({})),
        )
        .await;
        (damaged, good, unknown_status)
    };
    // The rows as a bad disk, a bad hand or a newer build might leave them.
    let conn = rusqlite::Connection::open(SqliteConfig::in_dir(dir.path()).path()).expect("db");
    let damage = |sql: &str, command: &Command| {
        let changed = conn
            .execute(
                sql,
                rusqlite::params![command.run_id.as_str(), command.command_key.as_str()],
            )
            .expect("damage");
        assert_eq!(changed, 1);
    };
    damage(
        "UPDATE commands SET state = '{\"status\":' WHERE run_id = ?1 AND command_key = ?2",
        &damaged,
    );
    damage(
        "UPDATE commands SET status = 'HIBERNATING' WHERE run_id = ?1 AND command_key = ?2",
        &unknown_status,
    );
    drop(conn);

    // A process started afterwards.
    let ledger = open_ledger(dir.path());
    let later = SystemClock.now().plus_millis(3_600_000);
    let due = ledger
        .due(later, 100)
        .await
        .expect("one damaged row does not fail the sweep");
    let due_runs: Vec<&RunId> = due.iter().map(|item| &item.run_id).collect();
    assert!(due_runs.contains(&&good.run_id), "{due_runs:?}");
    assert!(!due_runs.contains(&&unknown_status.run_id), "{due_runs:?}");

    let bus = Arc::new(bus(EmbeddedConfig::default().max_message_bytes));
    let metrics = Arc::new(Metrics::new());
    metrics.observe_ledger(ledger.clone());
    let mut dlq = bus
        .subscribe(Topic::Dlq, "test-dlq", "test")
        .await
        .expect("dlq");
    request(&*bus, &damaged).await;
    request(&*bus, &good).await;
    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let handler = reading_handler(ledger.clone(), handled_tx, |_| async { Ok(()) });
    let patient = RetryPolicy {
        attempts: 100,
        first_backoff_ms: 2_000,
        max_backoff_ms: 5_000,
        dead_letter_budget_ms: 1_000,
        panics: 100,
    };
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus.clone(),
        Arc::clone(&metrics),
        spec(),
        patient,
        shutdown.clone(),
        handler,
    ));
    let started = std::time::Instant::now();
    expect_handled(&mut handled, &good.run_id).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the damaged command's message was not retried ({:?})",
        started.elapsed()
    );
    let dead = next_dead_letter(&mut dlq).await;
    let reason = header(&dead, DLQ_REASON_HEADER);
    assert!(
        reason.contains(damaged.run_id.as_str())
            && reason.contains(damaged.command_key.as_str())
            && reason.contains("cannot be decoded"),
        "{reason}"
    );
    let topic = ["sluice.requested"];
    assert_eq!(
        metrics.quarantined_messages.with_label_values(&topic).get(),
        1
    );
    assert_eq!(metrics.handler_errors.with_label_values(&topic).get(), 0);
    assert_eq!(metrics.escalations.get(), 1);
    let scraped = metrics.render();
    assert!(
        scraped.contains("sluice_ledger_quarantined_commands_total 1"),
        "the damaged command is counted once: {scraped}"
    );
    assert!(
        scraped.contains("sluice_ledger_newer_commands_total 1"),
        "the newer build's command is counted once, apart: {scraped}"
    );

    // From now on the sweep skips the damaged command too, and still finds the good one.
    let due = ledger.due(later, 100).await.expect("due");
    let due_runs: Vec<&RunId> = due.iter().map(|item| &item.run_id).collect();
    assert!(due_runs.contains(&&good.run_id), "{due_runs:?}");
    assert!(!due_runs.contains(&&damaged.run_id), "{due_runs:?}");
    assert!(matches!(
        ledger.get(&damaged.run_id, &damaged.command_key).await,
        Err(LedgerError::UndecodableCommand { .. })
    ));
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
}

/// Messages of a newer build (docs/operations.md, "Upgrading Sluice") are acknowledged
/// without a dead letter and counted by reason, and hold nothing behind them: a request of a
/// higher format never reaches the handler; one about a command of a status this build does not
/// know is skipped (not quarantined, not escalated). A format header that is not a number is
/// malformed and still dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_of_a_newer_build_are_skipped_not_dead_lettered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open_ledger(dir.path());
    let later = reserve(
        &*ledger,
        command(&fresh_run("format"), 0, "email/send", 0, json!({})),
    )
    .await;
    let newer = reserve(
        &*ledger,
        command(&fresh_run("newer"), 0, "email/send", 0, json!({})),
    )
    .await;
    let good = reserve(
        &*ledger,
        command(&fresh_run("good"), 0, "email/send", 0, json!({})),
    )
    .await;
    let conn = rusqlite::Connection::open(SqliteConfig::in_dir(dir.path()).path()).expect("db");
    let changed = conn
        .execute(
            "UPDATE commands SET status = 'HIBERNATING', \
             state = json_set(state, '$.status', 'HIBERNATING') \
             WHERE run_id = ?1 AND command_key = ?2",
            rusqlite::params![newer.run_id.as_str(), newer.command_key.as_str()],
        )
        .expect("a newer build's write");
    assert_eq!(changed, 1);
    drop(conn);
    let ledger: Arc<dyn Ledger> = ledger;

    let bus = Arc::new(bus(EmbeddedConfig::default().max_message_bytes));
    let metrics = Arc::new(Metrics::new());
    let mut dlq = bus
        .subscribe(Topic::Dlq, "test-dlq", "test")
        .await
        .expect("dlq");
    let request_of = |command: &Command| {
        encode(&DispatchRequest {
            run_id: command.run_id.clone(),
            command_key: command.command_key.clone(),
            cause: Cause::Reserved,
        })
    };
    let format = |value: &str| vec![(FORMAT_HEADER.to_owned(), value.as_bytes().to_vec())];
    for (command, headers) in [
        (&later, format("2")),
        (&newer, format("1")),
        (&good, format("one")),
        (&good, format("1")),
    ] {
        bus.publish(
            Topic::Requested,
            command.run_id.as_str(),
            request_of(command),
            headers,
        )
        .await
        .expect("publish");
    }
    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let handler = reading_handler(Arc::clone(&ledger), handled_tx, |_| async { Ok(()) });
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus.clone(),
        Arc::clone(&metrics),
        spec(),
        quick_policy(),
        shutdown.clone(),
        handler,
    ));
    expect_handled(&mut handled, &good.run_id).await;
    let dead = next_dead_letter(&mut dlq).await;
    assert!(
        header(&dead, DLQ_REASON_HEADER).contains(FORMAT_HEADER),
        "{}",
        header(&dead, DLQ_REASON_HEADER)
    );
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
    // The handler saw only the good run: the newer format never reached it, and the newer
    // command's read failed before it reported.
    while let Ok(run) = handled.try_recv() {
        assert_eq!(run, good.run_id);
    }
    let topic = "sluice.requested";
    let skipped = |reason: &str| {
        metrics
            .messages_skipped
            .with_label_values(&[topic, reason])
            .get()
    };
    assert_eq!((skipped("newer_format"), skipped("newer_command")), (1, 1));
    assert_eq!(metrics.dead_letters.with_label_values(&[topic]).get(), 1);
    assert_eq!(
        metrics
            .quarantined_messages
            .with_label_values(&[topic])
            .get(),
        0
    );
    assert_eq!(metrics.handler_errors.with_label_values(&[topic]).get(), 0);
    assert_eq!(metrics.escalations.get(), 0);
    assert_eq!((ledger.quarantined(), ledger.left_for_newer()), (0, 1));
    assert!(matches!(
        ledger.get(&newer.run_id, &newer.command_key).await,
        Err(LedgerError::NewerCommand { status, .. }) if status == "HIBERNATING"
    ));
}

/// A message that fits the bus but whose dead letter does not (the reason and topic headers
/// push it over) is dead-lettered with its payload cut to fit, marked with the whole size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_too_large_for_the_bus_is_cut_to_fit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open_ledger(dir.path());
    let max = 2 * 1024;
    let bus = Arc::new(bus(max));
    let metrics = Arc::new(Metrics::new());
    let good = reserve(
        &*ledger,
        command(&fresh_run("good"), 0, "email/send", 0, json!({})),
    )
    .await;
    let mut dlq = bus
        .subscribe(Topic::Dlq, "test-dlq", "test")
        .await
        .expect("dlq");
    let key = "r-garbled";
    let garbled = vec![b'#'; max - key.len()];
    bus.publish(Topic::Requested, key, garbled.clone(), vec![])
        .await
        .expect("the message itself fits");
    request(&*bus, &good).await;
    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let handler = reading_handler(ledger.clone(), handled_tx, |_| async { Ok(()) });
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus.clone(),
        Arc::clone(&metrics),
        spec(),
        quick_policy(),
        shutdown.clone(),
        handler,
    ));
    expect_handled(&mut handled, &good.run_id).await;
    let dead = next_dead_letter(&mut dlq).await;
    assert_eq!(
        header(&dead, DLQ_TRUNCATED_HEADER),
        garbled.len().to_string()
    );
    assert!(!dead.payload().is_empty() && dead.payload().len() < garbled.len());
    assert!(garbled.starts_with(dead.payload()));
    assert!(header(&dead, DLQ_REASON_HEADER).contains("not a valid dispatch request"));
    assert_eq!(
        metrics
            .dead_letters
            .with_label_values(&["sluice.requested"])
            .get(),
        1
    );
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
}

/// The embedded bus with a dead-letter topic that refuses every message, as a broker whose
/// DLQ partition has no leader would.
#[derive(Debug)]
struct DlqDown(EmbeddedBus);

#[async_trait]
impl Bus for DlqDown {
    fn prefix(&self) -> &str {
        self.0.prefix()
    }

    async fn partitions(&self, topic: Topic) -> Result<u32, BusError> {
        self.0.partitions(topic).await
    }

    async fn publish(
        &self,
        topic: Topic,
        key: &str,
        payload: Vec<u8>,
        headers: Vec<Header>,
    ) -> Result<Published, BusError> {
        if topic == Topic::Dlq {
            return Err(BusError::Backend {
                op: "publish",
                topic: self.0.topic_name(topic),
                source: "the partition has no leader".into(),
            });
        }
        self.0.publish(topic, key, payload, headers).await
    }

    async fn admit(&self, topic: Topic) -> Result<Admission, BusError> {
        self.0.admit(topic).await
    }

    async fn subscribe(
        &self,
        topic: Topic,
        group: &str,
        member: &str,
    ) -> Result<Subscription, BusError> {
        self.0.subscribe(topic, group, member).await
    }
}

/// A dead letter the bus keeps refusing is retried for the policy's budget; then the message
/// is acknowledged, logged with its payload and counted, and the partition moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_topic_that_keeps_refusing_does_not_hold_the_partition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open_ledger(dir.path());
    let embedded = bus(EmbeddedConfig::default().max_message_bytes);
    let bus: Arc<dyn Bus> = Arc::new(DlqDown(embedded.clone()));
    let metrics = Arc::new(Metrics::new());
    let good = reserve(
        &*ledger,
        command(&fresh_run("good"), 0, "email/send", 0, json!({})),
    )
    .await;
    bus.publish(Topic::Requested, "r-garbled", b"{not json".to_vec(), vec![])
        .await
        .expect("publish");
    request(&*bus, &good).await;
    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let handler = reading_handler(ledger.clone(), handled_tx, |_| async { Ok(()) });
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        Arc::clone(&bus),
        Arc::clone(&metrics),
        spec(),
        quick_policy(),
        shutdown.clone(),
        handler,
    ));
    expect_handled(&mut handled, &good.run_id).await;
    let topic = ["sluice.requested"];
    assert_eq!(
        metrics
            .dead_letters_unpublished
            .with_label_values(&topic)
            .get(),
        1
    );
    assert_eq!(metrics.dead_letters.with_label_values(&topic).get(), 0);
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
    assert_eq!(embedded.lag(Topic::Requested, "test-dispatcher"), Some(0));
}

/// A handler that panics on one command, every time it is handed it — a bug, here a panic in
/// the handler's own code — must not stop its partition: the panic is caught, the message is
/// retried a bounded number of times (`RetryPolicy::panics`, fewer than a failure's attempts),
/// then dead-lettered with the panic's message and acknowledged, and the message behind it is
/// handled. Each panic is counted. Before the fix the panic ended the delivery's task with the
/// message unacknowledged, and the message behind it waited for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_gives_its_partition_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open_ledger(dir.path());
    let bus = Arc::new(bus(EmbeddedConfig::default().max_message_bytes));
    let metrics = Arc::new(Metrics::new());
    let poison = reserve(
        &*ledger,
        command(&fresh_run("panics"), 0, "email/send", 0, json!({})),
    )
    .await;
    let good = reserve(
        &*ledger,
        command(&fresh_run("behind"), 0, "email/send", 0, json!({})),
    )
    .await;
    let mut dlq = bus
        .subscribe(Topic::Dlq, "test-dlq", "test")
        .await
        .expect("dlq");
    request(&*bus, &poison).await;
    request(&*bus, &good).await;

    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let poison_run = poison.run_id.clone();
    let handler = reading_handler(ledger.clone(), handled_tx, move |command: Command| {
        let poison_run = poison_run.clone();
        async move {
            assert_ne!(command.run_id, poison_run, "a bug in the handler");
            Ok(())
        }
    });
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus.clone(),
        Arc::clone(&metrics),
        spec(),
        quick_policy(),
        shutdown.clone(),
        handler,
    ));

    expect_handled(&mut handled, &good.run_id).await;
    let dead = next_dead_letter(&mut dlq).await;
    let request: DispatchRequest = decode("dispatch request", dead.payload()).expect("request");
    assert_eq!(request.run_id, poison.run_id);
    let reason = header(&dead, DLQ_REASON_HEADER);
    assert!(
        reason.contains("handler panicked 2 times") && reason.contains("a bug in the handler"),
        "{reason}"
    );
    let topic = ["sluice.requested"];
    assert_eq!(metrics.handler_panics.with_label_values(&topic).get(), 2);
    assert_eq!(metrics.handler_errors.with_label_values(&topic).get(), 2);
    assert!(
        metrics
            .render()
            .contains("sluice_handler_panics_total{topic=\"sluice.requested\"} 2"),
        "exported under its name"
    );
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
    assert_eq!(bus.lag(Topic::Requested, "test-dispatcher"), Some(0));
}

/// A panic that does not come back — a race the retry does not meet again — costs one retry:
/// the same delivery is handed to the handler again after a pause, handled, acknowledged, and
/// nothing is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_once_has_its_message_retried() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ledger = open_ledger(dir.path());
    let bus = Arc::new(bus(EmbeddedConfig::default().max_message_bytes));
    let metrics = Arc::new(Metrics::new());
    let once = reserve(
        &*ledger,
        command(&fresh_run("once"), 0, "email/send", 0, json!({})),
    )
    .await;
    request(&*bus, &once).await;
    let calls = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let (handled_tx, mut handled) = mpsc::unbounded_channel();
    let counted = Arc::clone(&calls);
    let handler = reading_handler(ledger.clone(), handled_tx, move |_| {
        let first = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            assert!(!first, "the first call panics");
            Ok(())
        }
    });
    let shutdown = CancellationToken::new();
    let consumer = tokio::spawn(consume_with(
        bus.clone(),
        Arc::clone(&metrics),
        spec(),
        quick_policy(),
        shutdown.clone(),
        handler,
    ));
    expect_handled(&mut handled, &once.run_id).await;
    shutdown.cancel();
    consumer.await.expect("join").expect("consumer");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
    let topic = ["sluice.requested"];
    assert_eq!(metrics.handler_panics.with_label_values(&topic).get(), 1);
    assert_eq!(metrics.dead_letters.with_label_values(&topic).get(), 0);
    assert_eq!(bus.lag(Topic::Requested, "test-dispatcher"), Some(0));
}
