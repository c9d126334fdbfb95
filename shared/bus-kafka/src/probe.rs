//! The first contact with the brokers, made by a short-lived client that remembers what
//! librdkafka reported on the way: a wrong password or an untrusted certificate otherwise shows
//! only as "Broker transport failure" (or a timeout), which says nothing of the cause.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rdkafka::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use sluice_bus::BusError;

use crate::config::KafkaConfig;

/// Keeps librdkafka's first few warnings and errors (authentication, TLS handshake, all brokers
/// down).
/// Its text names the mechanism or the certificate problem, never a password.
#[derive(Default)]
struct Remember(Mutex<Vec<String>>);

/// The distinct warnings kept: the cause comes first, "all brokers are down" after it.
const KEPT: usize = 4;

impl Remember {
    fn keep(&self, what: &str) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < KEPT && !kept.iter().any(|k| k == what) {
            kept.push(what.to_owned());
        }
    }
}

impl ClientContext for Remember {
    /// librdkafka logs a failed authentication or handshake (`FAIL`); rdkafka queues the line
    /// for a poll, which the probe makes once the metadata request failed.
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                tracing::error!(target: "librdkafka", "librdkafka: {fac} {log_message}");
                self.keep(log_message);
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {fac} {log_message}");
                self.keep(log_message);
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {fac} {log_message}");
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::error!("librdkafka: {error}: {reason}");
        self.keep(reason);
    }
}

impl ConsumerContext for Remember {}

/// The probe's failure: what the metadata request said, and what librdkafka saw before it.
#[derive(Debug)]
struct Unreachable {
    error: KafkaError,
    seen: Option<String>,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)?;
        if let Some(seen) = &self.seen {
            write!(f, "; librdkafka reported: {seen}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unreachable {}

/// Asks the brokers for metadata within `timeout`, with the bus's security settings. A failure
/// names the brokers and, when librdkafka saw one, the authentication or TLS error behind it.
pub(crate) async fn brokers_answer(
    config: &KafkaConfig,
    timeout: Duration,
) -> Result<(), BusError> {
    let unreachable = |error: KafkaError, seen: Option<String>| BusError::Backend {
        op: "connect",
        topic: format!("brokers {}", config.brokers),
        source: Box::new(Unreachable { error, seen }),
    };
    let probe: BaseConsumer<Remember> = config
        .admin()
        .create_with_context(Remember::default())
        .map_err(|e| unreachable(e, None))?;
    let answered = tokio::task::spawn_blocking(move || {
        let answered = probe.fetch_metadata(None, timeout).map(drop);
        if answered.is_err() {
            // rdkafka queues librdkafka's logs and errors on the main queue: serve what is
            // there (a bounded number, briefly) so `Remember` sees them.
            for _ in 0..1_000 {
                if probe.poll(Duration::from_millis(20)).is_none() {
                    break;
                }
            }
        }
        let seen = probe
            .context()
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join(" | ");
        let seen = (!seen.is_empty()).then_some(seen);
        (answered, seen)
    })
    .await;
    match answered {
        Ok((Ok(()), _)) => Ok(()),
        Ok((Err(error), seen)) => Err(unreachable(error, seen)),
        Err(_) => Err(unreachable(KafkaError::Canceled, None)),
    }
}
