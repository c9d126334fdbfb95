//! A compensation job that makes several calls, each slow, against a real SQLite file and a real
//! HTTP upstream: its claim must cover the whole job, so a second compensator (a rebalance, a
//! sweep) that finds the command while the first is still calling does not repeat the calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use serde_json::json;
use sluice_bus::{Bus, EmbeddedBus, EmbeddedConfig};
use sluice_core::catalog::Catalog;
use sluice_core::command::CommandStatus;
use sluice_core::machine::{self, DispatchOutcome, Event, Operator};
use sluice_core::time::{Clock, SystemClock};
use sluice_ledger::contract::{command, fresh_run};
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{Ledger, Transition};
use sluice_runtime::{Context, Metrics};
use tokio::net::TcpListener;

/// A wire whose reversal takes up to a second; a call takes 700 ms.
const CATALOG: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
business_key = "{account}"
schema = { type = "object", required = ["account", "amount_minor", "date"], properties = { account = { type = "string" }, amount_minor = { type = "integer" }, date = { type = "string" } } }
[tool.dispatch]
url = "BASE/wires"
[tool.compensate]
url = "BASE/wires/{external_ref}/reverse"
timeout_ms = 1000
"#;

async fn slow_bank(calls: Arc<AtomicUsize>) -> String {
    let app = Router::new().route(
        "/wires/{id}/reverse",
        post(move || {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(700)).await;
                axum::Json(json!({"id": "rev"}))
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let base = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_compensator_does_not_repeat_a_job_still_calling() {
    let calls = Arc::new(AtomicUsize::new(0));
    let base = slow_bank(Arc::clone(&calls)).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("ledger"));
    let catalog =
        Catalog::from_toml_str(&CATALOG.replace("BASE", &base), "bank.toml").expect("valid");
    let rules = catalog.tools()[0].rules();
    let bus: Arc<dyn Bus> =
        Arc::new(EmbeddedBus::new(EmbeddedConfig::default()).expect("embedded bus"));
    let ctx = Context {
        ledger: Arc::clone(&ledger),
        bus,
        catalog: Arc::new(catalog),
        connector: Arc::new(sluice_connector::HttpConnector::new().expect("connector")),
        clock: Arc::new(SystemClock),
        metrics: Arc::new(Metrics::new()),
        flow: sluice_runtime::flow::Flow::new(),
        copies: None,
        local_events: Default::default(),
    };

    // A CONFIRMED wire with three extra commits still owed, then rolled back: its job is four
    // reversals, 2.8 s, while one call's claim (twice the call's timeout) is 2 s.
    let run = fresh_run("long-job");
    let now = SystemClock.now();
    let mut wire = command(
        &run,
        1,
        "payments/wire",
        0,
        json!({"account": "a", "amount_minor": 5, "date": "2026-11-27"}),
    );
    wire.business_key = None;
    let audit = wire.reservation_audit("test");
    let wire = ledger
        .reserve(wire, audit)
        .await
        .expect("reserve")
        .into_command();
    let step = |state, event| machine::apply(state, &rules, &event, now).expect("applies");
    let leased = step(
        &wire.state,
        Event::Lease {
            owner: "d-1".into(),
        },
    );
    let leased = ledger
        .acquire_lease(Transition::from_step(&wire, &leased, "test"))
        .await
        .expect("lease")
        .applied()
        .cloned()
        .expect("uncontended");
    let mut confirmed = step(
        &leased.state,
        Event::Dispatched {
            epoch: leased.epoch(),
            sent_at: now,
            outcome: DispatchOutcome::Committed {
                external_ref: Some("w-1".into()),
                result: None,
            },
        },
    );
    confirmed.state.owed_duplicates = vec!["w-2".into(), "w-3".into(), "w-4".into()];
    confirmed.state.due_at = None;
    let confirmed = ledger
        .finalize(Transition::from_step(&leased, &confirmed, "test"))
        .await
        .expect("finalize")
        .applied()
        .cloned()
        .expect("uncontended");
    let operator = Operator {
        actor: "alice".into(),
        reason: "undo".into(),
    };
    let rollback = step(&confirmed.state, Event::Rollback { operator });
    assert_eq!(rollback.state.status, CommandStatus::Compensating);
    ledger
        .transition(Transition::from_step(&confirmed, &rollback, "test"))
        .await
        .expect("rolled back");

    // The first compensator starts the job; a second finds the command once the first's
    // claim would have lapsed, with the first still calling.
    let first = {
        let ctx = ctx.clone();
        let run = run.clone();
        tokio::spawn(async move { sluice_compensator::compensate_run(&ctx, &run).await })
    };
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    sluice_compensator::compensate_run(&ctx, &run)
        .await
        .expect("second");
    first.await.expect("joins").expect("first");
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    assert_eq!(
        calls.load(Ordering::SeqCst),
        4,
        "each commit reversed once: the second compensator repeated the first's calls"
    );
    let done = ledger
        .get(&run, &wire.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(done.status(), CommandStatus::Compensated, "{done:?}");
}
