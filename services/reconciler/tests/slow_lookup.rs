//! A status endpoint slower than the sweep's budgets, against a real SQLite file and a real
//! HTTP upstream: the look runs to its own timeout and counts as inconclusive, so the checks
//! add up and the command ends STUCK for a person, instead of every sweep cutting the look off
//! before anything is recorded and starting over for ever.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use axum::Router;
use axum::routing::get;
use serde_json::json;
use sluice_core::catalog::Catalog;
use sluice_core::command::CommandStatus;
use sluice_core::machine::{self, DispatchOutcome, Event};
use sluice_core::policy::PolicyDecision;
use sluice_core::time::{Clock, SystemClock};
use sluice_ledger::Transition;
use sluice_ledger::contract::{command, fresh_run};
use sluice_reconciler::sweep_once;
use sluice_runtime::config::ReconcilerConfig;
use tokio::net::TcpListener;

/// The wire's status check takes 1.5 s at most and is asked twice before a person is called.
const CATALOG: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
schema = { type = "object", required = ["account", "amount_minor", "date"], properties = { account = { type = "string" }, amount_minor = { type = "integer" }, date = { type = "string" } } }
[tool.policy]
max_checks = 2
timeout_ms = 1000
lease_ttl_ms = 5000
[tool.dispatch]
url = "BASE/wires"
[tool.status_check]
url = "BASE/wires/by-key/{run_id}"
timeout_ms = 1500
absent_status = [404]
"#;

/// A bank whose lookups answer after 30 s.
async fn slow_bank() -> String {
    let app = Router::new().route(
        "/wires/by-key/{key}",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "{}"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let base = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_slower_than_the_sweep_counts_as_inconclusive_and_ends_stuck() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let base = slow_bank().await;
    let catalog =
        Catalog::from_toml_str(&CATALOG.replace("BASE", &base), "slow.toml").expect("valid");
    let rules = catalog.tools()[0].rules();
    let ctx = common::context(dir.path(), catalog);
    let ledger = Arc::clone(&ctx.ledger);

    // An UNKNOWN wire whose attempt went out a minute ago: its horizon has passed, so its
    // look is due now.
    let run = fresh_run("slow-lookup");
    let then = SystemClock.now().plus_millis(-60_000);
    let pending = command(
        &run,
        1,
        "payments/wire",
        0,
        json!({"account": "a", "amount_minor": 5, "date": "2026-11-27"}),
    )
    .leased_at_reservation(&rules, &PolicyDecision::Allow, then);
    let leased = common::reserve_and_lease(&ctx, pending, &rules, then).await;
    let ambiguous = machine::apply(
        &leased.state,
        &rules,
        &Event::Dispatched {
            epoch: leased.epoch(),
            sent_at: then,
            outcome: DispatchOutcome::Ambiguous {
                reason: "timeout".into(),
            },
        },
        then,
    )
    .expect("ambiguous");
    let mut unknown_step = ambiguous;
    unknown_step.state.due_at = Some(SystemClock.now());
    ledger
        .finalize(Transition::from_step(&leased, &unknown_step, "test"))
        .await
        .expect("finalize");

    // Each sweep gives an item half a second, less than the look's 1.5 s.
    let config = ReconcilerConfig {
        sweep_item_timeout_ms: 500,
        ..ReconcilerConfig::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let key = leased.command_key.clone();
    loop {
        sweep_once(&ctx, &config).await.expect("sweep");
        let now = ledger.get(&run, &key).await.expect("get").expect("stored");
        if now.status() == CommandStatus::Stuck {
            assert!(now.state.escalated, "a person is called");
            assert_eq!(now.state.checks, 2, "both looks were counted");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {} with {} check(s) recorded after 30 s: the looks were cut off uncounted",
            now.status(),
            now.state.checks
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
