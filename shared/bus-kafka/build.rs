//! `SLUICE_SKIP_KAFKA=1` compiles the broker tests in `tests/kafka.rs` out (`cfg(sluice_skip_kafka)`).
//!
//! The shared contract macro generates plain `#[tokio::test]`s, which cannot be skipped at run
//! time; without a broker they must fail, not pass, so skipping is decided when they are built.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(sluice_skip_kafka)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=SLUICE_SKIP_KAFKA");
    if std::env::var("SLUICE_SKIP_KAFKA").is_ok_and(|value| value == "1") {
        println!("cargo::rustc-cfg=sluice_skip_kafka");
    }
}
