//! The consume loop every service runs: take deliveries of one topic as a member of a group,
//! handle up to `concurrency` at once, acknowledge each only after its handler succeeded.
//!
//! Ordering: the bus hands out a partition's next message only after the previous one was
//! acknowledged, so a run's messages are handled one after another; different partitions
//! proceed concurrently.
//!
//! Failures: a message that cannot be decoded goes to the dead-letter topic with the reason and
//! is acknowledged (it would fail forever). A handler that fails (the ledger is locked, the bus
//! is down) is retried with backoff, holding its partition, until it succeeds or shutdown —
//! then the message stays unacknowledged and is delivered again after the restart.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{Bus, BusError, Delivery, Topic};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::messages::{DLQ_REASON_HEADER, DLQ_TOPIC_HEADER, MessageError};
use crate::metrics::Metrics;
use crate::pipeline::PipelineError;

/// What a handler says about a delivery.
#[derive(Debug)]
pub enum Handled {
    /// Done: acknowledge.
    Done,
    /// The message is unusable: dead-letter it, then acknowledge.
    Reject(MessageError),
}

/// Where a consumer reads and how much it does at once.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub topic: Topic,
    pub group: String,
    pub member: String,
    pub concurrency: usize,
}

/// Runs the loop until `shutdown`, then waits for the handlers in flight.
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
    let mut subscription = bus.subscribe(spec.topic, &spec.group, &spec.member).await?;
    let permits = Arc::new(Semaphore::new(spec.concurrency.max(1)));
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
        let (bus, metrics, shutdown) = (Arc::clone(&bus), Arc::clone(&metrics), shutdown.clone());
        let topic = spec.topic;
        tasks.spawn(async move {
            handle_one(bus, metrics, topic, delivery, shutdown, handler).await;
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

async fn handle_one<H, F>(
    bus: Arc<dyn Bus>,
    metrics: Arc<Metrics>,
    topic: Topic,
    delivery: Delivery,
    shutdown: CancellationToken,
    handler: H,
) where
    H: Fn(Delivery) -> F,
    F: Future<Output = Result<Handled, PipelineError>>,
{
    let mut backoff = Duration::from_millis(50);
    loop {
        // Boxed: a dispatch handler's future is several KiB, and the task spawned per delivery
        // would otherwise carry it inline, copied on every move of the task (spawn, stage
        // changes), which showed in profiles as memcpy.
        match Box::pin(handler(delivery.clone())).await {
            Ok(Handled::Done) => break,
            Ok(Handled::Reject(reason)) => {
                let mut headers = delivery.message.headers.clone();
                headers.push((DLQ_REASON_HEADER.into(), reason.to_string().into_bytes()));
                headers.push((DLQ_TOPIC_HEADER.into(), bus.topic_name(topic).into_bytes()));
                match bus
                    .publish(
                        Topic::Dlq,
                        delivery.key(),
                        delivery.payload().to_vec(),
                        headers,
                    )
                    .await
                {
                    Ok(_) => {
                        metrics
                            .dead_letters
                            .with_label_values(&[&bus.topic_name(topic)])
                            .inc();
                        tracing::warn!(
                            topic = %bus.topic_name(topic),
                            partition = delivery.partition,
                            offset = delivery.offset,
                            reason = %reason,
                            "message dead-lettered"
                        );
                        break;
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot dead-letter a message; retrying"),
                }
            }
            Err(e) => tracing::warn!(
                topic = %bus.topic_name(topic),
                partition = delivery.partition,
                offset = delivery.offset,
                error = %e,
                "handler failed; retrying"
            ),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
    if let Err(e) = delivery.ack().await {
        // The partition moved to another member, which gets the message again; its handler
        // finds our ledger write done.
        tracing::debug!(error = %e, "acknowledgement refused");
    }
}
