//! Reports the Kafka broker tests as ignored, with the reason, when `SLUICE_SKIP_KAFKA=1`
//! compiled them out of `tests/kafka.rs` (see `build.rs`); empty otherwise.

#[cfg(sluice_skip_kafka)]
#[test]
#[ignore = "SLUICE_SKIP_KAFKA=1 compiled the Kafka broker tests (tests/kafka.rs) out"]
fn kafka_broker_tests() {}
