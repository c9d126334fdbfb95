//! What every broker test file shares: the broker's address, a test configuration, a connect
//! that says how to start a broker, and the deletion of a test's topics.

#![allow(dead_code)] // Each test file uses its own part of this.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_bus::Bus;
use sluice_bus_kafka::{KafkaBus, KafkaConfig};
use tokio::time::timeout;

pub const BROKERS_VAR: &str = "SLUICE_TEST_KAFKA_BROKERS";
pub const SKIP_VAR: &str = "SLUICE_SKIP_KAFKA";
pub const DEFAULT_BROKERS: &str = "127.0.0.1:19092";

pub fn brokers() -> String {
    std::env::var(BROKERS_VAR).unwrap_or_else(|_| DEFAULT_BROKERS.to_owned())
}

/// A single-broker test configuration under `prefix`.
pub fn config(prefix: String, partitions: u32) -> KafkaConfig {
    KafkaConfig {
        brokers: brokers(),
        prefix,
        partitions,
        replication_factor: Some(1),
        client_id: "sluice-test".to_owned(),
        start_timeout: Duration::from_secs(20),
        extra: BTreeMap::from(
            [
                // The broker's minimum session; heartbeats often, so that a member learns of a
                // rebalance within half a second.
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "500"),
                ("auto.commit.interval.ms", "1000"),
                ("fetch.wait.max.ms", "100"),
                ("linger.ms", "1"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
        ),
        ..KafkaConfig::default()
    }
}

pub async fn connect(config: KafkaConfig) -> KafkaBus {
    let brokers = config.brokers.clone();
    KafkaBus::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "no Kafka broker answers at {brokers} ({:#}); start one with \
             `scripts/engines/install.sh kafka && scripts/engines/start.sh kafka`, \
             point {BROKERS_VAR} at another, or set {SKIP_VAR}=1 to skip these tests",
            anyhow::Error::from(e)
        )
    })
}

/// Deletes a test's topics when the test ends, passed or failed.
pub struct Topics(pub KafkaBus);

impl Drop for Topics {
    fn drop(&mut self) {
        let bus = self.0.clone();
        // Drop cannot await, and the test's runtime may be the one blocked here: delete from a
        // runtime of its own. Best effort: a leftover topic costs only disk on the test broker.
        let deleted = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                match timeout(Duration::from_secs(10), bus.delete_topics()).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(format!("{:#}", anyhow::Error::from(e))),
                    Err(_) => Err("timed out".to_owned()),
                }
            })
        })
        .join();
        if let Ok(Err(e)) = deleted {
            eprintln!(
                "could not delete the test topics of {}: {e}",
                self.0.prefix()
            );
        }
    }
}
