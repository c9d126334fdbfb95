//! A dispatcher's lease keeps the earlier due time its command had (the reservation's), so a
//! ledger that indexes due times writes no entry for the lease. Against a real SQLite file and
//! the real sweep: a command due under a lease that still holds is only moved to the lease's
//! end (its dispatcher may still be calling), and one whose lease has ended is taken over.

use std::sync::Arc;

mod common;

use serde_json::json;
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, CommandState, CommandStatus};
use sluice_core::ids::RunId;
use sluice_core::time::{Clock, SystemClock, Timestamp};
use sluice_ledger::contract::{command, fresh_run};
use sluice_reconciler::sweep_once;
use sluice_runtime::Context;
use sluice_runtime::config::ReconcilerConfig;

/// A wire whose lease lasts a minute; the bank is never called (nothing is due to it).
const CATALOG: &str = r#"
[[tool]]
name = "payments/wire"
semantics = "NON_IDEMPOTENT"
schema = { type = "object" }
[tool.policy]
lease_ttl_ms = 60000
[tool.dispatch]
url = "http://127.0.0.1:9/wires"
[tool.status_check]
url = "http://127.0.0.1:9/wires/by-key/{run_id}"
absent_status = [404]
"#;

/// A wire reserved at `reserved_at` and leased by a dispatcher one second later.
async fn leased_wire(ctx: &Context, run: &RunId, reserved_at: Timestamp) -> Command {
    let rules = ctx.catalog.tools()[0].rules();
    let wanted = command(run, 1, "payments/wire", 0, json!({"amount_minor": 5}));
    let wanted = Command {
        state: CommandState::reserved(reserved_at, None, rules.pending_stale_ms),
        ..wanted
    };
    common::reserve_and_lease(ctx, wanted, &rules, reserved_at.plus_millis(1_000)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_command_under_a_live_lease_waits_for_its_end_and_one_past_it_is_taken_over() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let catalog = Catalog::from_toml_str(CATALOG, "wire.toml").expect("valid");
    let ctx = common::context(dir.path(), catalog);
    let ledger = Arc::clone(&ctx.ledger);
    let now = SystemClock.now();
    let pending_stale_ms = ctx.catalog.tools()[0].rules().pending_stale_ms;

    // Reserved 20 s ago, leased a second later for a minute: the lease holds 41 s more, and
    // the command kept the reservation's due time, 10 s ago.
    let running = fresh_run("lease-live");
    let live = leased_wire(&ctx, &running, now.plus_millis(-20_000)).await;
    let lease_end = live.state.lease.expires_at.expect("a lease");
    assert_eq!(
        live.state.due_at,
        Some(now.plus_millis(-20_000 + pending_stale_ms)),
        "the lease kept the reservation's due time"
    );
    // Reserved two minutes ago: its lease ended 59 s ago.
    let dead = fresh_run("lease-ended");
    let lapsed = leased_wire(&ctx, &dead, now.plus_millis(-120_000)).await;
    let records_before = ledger
        .audit_read(&running)
        .await
        .expect("audit")
        .entries
        .len();

    sweep_once(&ctx, &ReconcilerConfig::default())
        .await
        .expect("sweep");

    let after = ledger
        .get(&running, &live.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(after.status(), CommandStatus::Leased, "{after:?}");
    assert_eq!(
        after.state.lease, live.state.lease,
        "the lease is untouched"
    );
    assert_eq!(after.state.attempts, live.state.attempts);
    assert_eq!(
        after.state.due_at,
        Some(lease_end),
        "due at the lease's end"
    );
    assert_eq!(
        ledger
            .audit_read(&running)
            .await
            .expect("audit")
            .entries
            .len(),
        records_before,
        "moving a due time writes no audit record"
    );
    // The next sweep leaves it alone: it is not due before the lease's end.
    sweep_once(&ctx, &ReconcilerConfig::default())
        .await
        .expect("sweep");
    let again = ledger
        .get(&running, &live.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(again.state, after.state);

    let taken = ledger
        .get(&dead, &lapsed.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(taken.status(), CommandStatus::Unknown, "{taken:?}");
}
