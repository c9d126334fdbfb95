//! Consumer lag as a metric: `sluice_consumer_lag{group, topic, partition}`, the messages of
//! each partition a consumer group has published to it and not yet committed, read from the
//! bus itself (`Bus::lag_by_partition`: Kafka's committed offsets against the partitions' high
//! watermarks, or the embedded bus's own offsets).
//!
//! Every consume loop keeps the figure of its own group and topic fresh ([`Watch::spawn`],
//! from `crate::consumer`), reading it every [`INTERVAL`] on a task of its own: the loop's
//! deliveries never wait for it. On Kafka a reading is one offset fetch and one watermark
//! query per partition, by a client that never joins the group (`sluice-bus-kafka`, `lag.rs`);
//! every replica of a service reads and exports the same group's figure, so dashboards and
//! alerts take the `max` over the replicas. A reading that fails (a broker away) keeps the last
//! figures and is logged once until one succeeds again.

use std::sync::Arc;
use std::time::Duration;

use sluice_bus::{Bus, Topic};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Metrics;

/// How often a consume loop reads its group's lag.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// The reading task of one consume loop; stopped when dropped (the loop ended) or at shutdown.
#[derive(Debug)]
pub struct Watch(JoinHandle<()>);

impl Watch {
    /// Reads `group`'s lag on `topic` now and every [`INTERVAL`] into `metrics`, until
    /// `shutdown` or until the returned handle is dropped.
    pub fn spawn(
        bus: &Arc<dyn Bus>,
        metrics: &Arc<Metrics>,
        topic: Topic,
        group: &str,
        shutdown: &CancellationToken,
    ) -> Self {
        let (bus, metrics, group, shutdown) = (
            Arc::clone(bus),
            Arc::clone(metrics),
            group.to_owned(),
            shutdown.clone(),
        );
        Self(tokio::spawn(async move {
            let name = bus.topic_name(topic);
            let mut ticks = tokio::time::interval(INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                match bus.lag_by_partition(topic, &group).await {
                    Ok(Some(lags)) => {
                        failing = false;
                        export(&metrics, &group, &name, &lags);
                    }
                    // A bus without the figure: nothing to export, ever.
                    Ok(None) => return,
                    Err(error) => {
                        if !failing {
                            tracing::warn!(
                                topic = %name,
                                group = %group,
                                %error,
                                "cannot read the consumer lag; sluice_consumer_lag keeps its last figures"
                            );
                        }
                        failing = true;
                    }
                }
            }
        }))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sets `sluice_consumer_lag` of each partition of `topic` for `group`.
pub fn export(metrics: &Metrics, group: &str, topic: &str, lags: &[u64]) {
    for (partition, lag) in lags.iter().enumerate() {
        metrics
            .consumer_lag
            .with_label_values(&[group, topic, &partition.to_string()])
            .set(i64::try_from(*lag).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partition_is_a_series_of_its_own() {
        let metrics = Metrics::new();
        export(
            &metrics,
            "sluice-dispatcher",
            "sluice.requested",
            &[3, 0, 7],
        );
        let text = metrics.render();
        for (partition, lag) in [(0, 3), (1, 0), (2, 7)] {
            let series = format!(
                "sluice_consumer_lag{{group=\"sluice-dispatcher\",partition=\"{partition}\",topic=\"sluice.requested\"}} {lag}"
            );
            assert!(text.contains(&series), "{series} in:\n{text}");
        }
        export(
            &metrics,
            "sluice-dispatcher",
            "sluice.requested",
            &[0, 0, 0],
        );
        assert!(
            metrics.render().contains(
                "sluice_consumer_lag{group=\"sluice-dispatcher\",partition=\"2\",topic=\"sluice.requested\"} 0"
            ),
            "a later reading replaces the figure"
        );
    }
}
