//! `sluice bench --mode agents` end to end: the real binary starts the pipeline and the demo
//! upstream as processes of their own, drives agents through synchronous submissions, and
//! reports one row per concurrency with the pipeline process's own CPU and peak RSS.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_agents_bench_reports_a_row_per_concurrency_from_processes_of_their_own() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args([
            "bench",
            "--mode",
            "agents",
            "--effects",
            "60",
            "--concurrency",
            "1,4",
            "--json",
        ])
        .output()
        .expect("sluice bench runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: Vec<Value> = serde_json::from_str(&stdout).expect("JSON rows");
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, concurrency) in rows.iter().zip([1, 4]) {
        assert_eq!(row["concurrency"], concurrency, "{stdout}");
        let effects = row["effects"].as_u64().expect("effects");
        assert!((40..=60).contains(&effects), "warm-up excluded: {stdout}");
        assert!(row["effects_per_sec"].as_f64().is_some_and(|r| r > 0.0));
        assert!(row["p50_ms"].as_f64().is_some_and(|p| p > 0.0));
        assert!(row["p99_ms"].as_f64() >= row["p50_ms"].as_f64());
        // The pipeline's own figures, read from its /proc entries.
        assert!(
            row["peak_rss_mib"].as_f64().is_some_and(|rss| rss > 1.0),
            "{stdout}"
        );
        assert!(row["cpu_us_per_effect"].as_f64().is_some(), "{stdout}");
    }
}

#[test]
fn a_list_of_concurrencies_is_refused_outside_the_agents_mode() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["bench", "--mode", "single", "--concurrency", "1,4"])
        .output()
        .expect("sluice bench runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--concurrency"), "{stderr}");
}
