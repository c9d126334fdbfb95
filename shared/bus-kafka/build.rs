//! `SLUICE_SKIP_KAFKA=1` compiles the broker tests in `tests/kafka.rs` and
//! `tests/kafka_tls.rs` out (`cfg(sluice_skip_kafka)`); `SLUICE_ENGINES_TLS=0` (engines
//! started without their SASL_SSL listener) compiles out only the latter
//! (`cfg(sluice_skip_kafka_tls)`).
//!
//! The shared contract macro generates plain `#[tokio::test]`s, which cannot be skipped at run
//! time; without a broker they must fail, not pass, so skipping is decided when they are built.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(sluice_skip_kafka)");
    println!("cargo::rustc-check-cfg=cfg(sluice_skip_kafka_tls)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=SLUICE_SKIP_KAFKA");
    println!("cargo::rerun-if-env-changed=SLUICE_ENGINES_TLS");
    if std::env::var("SLUICE_SKIP_KAFKA").is_ok_and(|value| value == "1") {
        println!("cargo::rustc-cfg=sluice_skip_kafka");
    }
    if std::env::var("SLUICE_ENGINES_TLS").is_ok_and(|value| value == "0") {
        println!("cargo::rustc-cfg=sluice_skip_kafka_tls");
    }
}
