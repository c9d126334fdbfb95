//! A duplicate commit's clean-up whose first compensate call fails transiently, against a real
//! SQLite file and a real HTTP upstream: the failure is kept in the ledger (the attempt, a due
//! time after the backoff, the extra commit still owed), not slept on in memory, so a process
//! that dies after it loses neither the count nor the clean-up; the next job, from a process
//! opened afresh on the same file, undoes the extra commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::json;
use sluice_bus::{Bus, EmbeddedBus, EmbeddedConfig};
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::RunId;
use sluice_core::machine::{self, Action, DispatchOutcome, Event};
use sluice_core::time::{Clock, SystemClock};
use sluice_ledger::contract::{command, fresh_run};
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{Ledger, Transition};
use sluice_runtime::{Context, Metrics};
use tokio::net::TcpListener;

const CATALOG: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
business_key = "{account}"
schema = { type = "object", required = ["account"], properties = { account = { type = "string" } } }
[tool.dispatch]
url = "BASE/wires"
[tool.compensate]
url = "BASE/wires/{external_ref}/reverse"
timeout_ms = 2000
"#;

/// A bank whose reversals fail with a 500 `failures` times, then succeed.
async fn flaky_bank(calls: Arc<AtomicUsize>, failures: usize) -> String {
    let app = Router::new().route(
        "/wires/{id}/reverse",
        post(move || {
            let calls = Arc::clone(&calls);
            async move {
                if calls.fetch_add(1, Ordering::SeqCst) < failures {
                    (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({})))
                } else {
                    (StatusCode::OK, axum::Json(json!({"id": "rev"})))
                }
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
    let base = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

fn context(ledger: Arc<dyn Ledger>, catalog: &Catalog) -> Context {
    let bus: Arc<dyn Bus> =
        Arc::new(EmbeddedBus::new(EmbeddedConfig::default()).expect("embedded bus"));
    Context {
        ledger,
        bus,
        catalog: Arc::new(catalog.clone()),
        connector: Arc::new(sluice_connector::HttpConnector::new().expect("connector")),
        clock: Arc::new(SystemClock),
        metrics: Arc::new(Metrics::new()),
        flow: sluice_runtime::flow::Flow::new(),
        copies: None,
        local_events: Default::default(),
    }
}

/// A CONFIRMED wire owing the clean-up of one extra commit, `w-2`.
async fn confirmed_with_extra(ledger: &dyn Ledger, catalog: &Catalog) -> (RunId, Command) {
    let rules = catalog.tools()[0].rules();
    let run = fresh_run("duplicate-retry");
    let now = SystemClock.now();
    let mut wire = command(&run, 1, "payments/wire", 0, json!({"account": "a"}));
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
    confirmed.state.owed_duplicates = vec!["w-2".into()];
    confirmed.state.due_at = Some(now);
    let confirmed = ledger
        .finalize(Transition::from_step(&leased, &confirmed, "test"))
        .await
        .expect("finalize")
        .applied()
        .cloned()
        .expect("uncontended");
    (run, confirmed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_clean_up_is_kept_in_the_ledger_and_taken_up_after_a_restart() {
    let calls = Arc::new(AtomicUsize::new(0));
    let base = flaky_bank(Arc::clone(&calls), 1).await;
    let catalog =
        Catalog::from_toml_str(&CATALOG.replace("BASE", &base), "bank.toml").expect("valid");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("ledger"));
    let (run, wire) = confirmed_with_extra(&*ledger, &catalog).await;
    let ctx = context(Arc::clone(&ledger), &catalog);

    let before = SystemClock.now();
    sluice_compensator::settle_duplicate(&ctx, &run, &wire.command_key, &["w-2".into()])
        .await
        .expect("first clean-up");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one call per job: a transient failure is not retried in memory"
    );
    let failed = ledger
        .get(&run, &wire.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(failed.status(), CommandStatus::Confirmed);
    assert_eq!(
        failed.state.owed_duplicates,
        vec!["w-2".to_owned()],
        "still owed"
    );
    assert!(!failed.state.escalated, "one failure is not a person's yet");
    let stored = serde_json::to_value(&failed.state).expect("encodes");
    assert_eq!(
        stored["duplicate_attempts"], 1,
        "the attempt is counted in the ledger"
    );
    let due = failed.state.due_at.expect("a due time for the retry");
    let rules = catalog.tools()[0].rules();
    assert!(
        due.millis_since(before) >= rules.backoff_ms(0),
        "due after the backoff: {due} from {before}"
    );
    // What the sweep does with it once due: the clean-up's request, sent again.
    assert_eq!(
        machine::plan_sweep(&failed.state, 5_000, due),
        machine::SweepPlan::Republish(Event::Republish { grace_ms: 5_000 })
    );
    assert_eq!(
        machine::awaited(&failed.state),
        Some(Action::CompensateDuplicate)
    );
    drop(ctx);
    drop(ledger);

    // A process opened afresh on the same file takes the clean-up up from the ledger.
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("reopened"));
    let ctx = context(Arc::clone(&ledger), &catalog);
    sluice_compensator::settle_duplicate(&ctx, &run, &wire.command_key, &["w-2".into()])
        .await
        .expect("second clean-up");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    let settled = ledger
        .get(&run, &wire.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(settled.status(), CommandStatus::Confirmed);
    assert!(settled.state.owed_duplicates.is_empty(), "{settled:?}");
    assert!(!settled.state.escalated);
    let stored = serde_json::to_value(&settled.state).expect("encodes");
    assert!(
        stored.get("duplicate_attempts").is_none(),
        "reset: {stored}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_up_that_keeps_failing_goes_to_a_person_after_its_attempts() {
    let calls = Arc::new(AtomicUsize::new(0));
    let base = flaky_bank(Arc::clone(&calls), usize::MAX).await;
    let catalog =
        Catalog::from_toml_str(&CATALOG.replace("BASE", &base), "bank.toml").expect("valid");
    let max_attempts = catalog.tools()[0].rules().max_attempts;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ledger: Arc<dyn Ledger> =
        Arc::new(SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("ledger"));
    let (run, wire) = confirmed_with_extra(&*ledger, &catalog).await;
    let ctx = context(Arc::clone(&ledger), &catalog);

    // Each job one call, as the sweep would send them; the last attempt escalates.
    for job in 1..=max_attempts {
        sluice_compensator::settle_duplicate(&ctx, &run, &wire.command_key, &["w-2".into()])
            .await
            .expect("clean-up");
        let now = ledger
            .get(&run, &wire.command_key)
            .await
            .expect("get")
            .expect("stored");
        assert_eq!(
            now.state.escalated,
            job == max_attempts,
            "job {job}: {now:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), max_attempts as usize);
    let escalated = ledger
        .get(&run, &wire.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(escalated.status(), CommandStatus::Confirmed);
    assert!(escalated.state.owed_duplicates.is_empty());
    assert_eq!(machine::awaited(&escalated.state), None);
}
