//! The command gauges' refreshes on a real SQLite ledger written by "another process" (writes
//! made straight to the ledger, which the gauges do not see): a refresh reads the runs created
//! since the last read began and the runs that held unresolved commands, not every run kept;
//! what that leaves out (an old settled run reopened elsewhere) a whole read finds.

use sluice_core::command::{Command, CommandStatus};
use sluice_core::time::Timestamp;
use sluice_ledger::CommandStore;
use sluice_ledger::contract::{command, fresh_run};
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{Cas, Guard, Reserved, Transition};
use sluice_runtime::gauges::CommandGauges;

/// A wire reserved PENDING as if created at `at` (ms), written straight to `ledger`.
async fn reserve_at(ledger: &SqliteLedger, label: &str, at: i64) -> Command {
    let mut wire = command(
        &fresh_run(label),
        1,
        "payments/wire",
        0,
        serde_json::json!({"to": "acc"}),
    );
    wire.created_at = Timestamp::from_millis(at);
    wire.state.updated_at = Timestamp::from_millis(at);
    let audit = wire.reservation_audit("another-process");
    match ledger.reserve(wire, audit).await.expect("reserve") {
        Reserved::Created(created) => created,
        other => panic!("not created: {other:?}"),
    }
}

/// Moves `command` to `status` straight on `ledger`.
async fn move_to(ledger: &SqliteLedger, command: &Command, status: CommandStatus) -> Command {
    let mut next = command.state.clone();
    next.status = status;
    next.due_at = None;
    let write = Transition {
        run_id: command.run_id.clone(),
        command_key: command.command_key.clone(),
        guard: Guard::of(command),
        next,
        audit: Some(sluice_core::audit::AuditDraft::transition(
            &command.command_key,
            Some(command.status()),
            status,
            "another-process",
            "moved by a process the gauges do not see",
        )),
    };
    match ledger.transition(write).await.expect("transition") {
        Cas::Applied(moved) => moved,
        Cas::Conflict(_) => panic!("the write lost its compare-and-set"),
    }
}

fn held(gauges: &CommandGauges, status: CommandStatus) -> u64 {
    gauges
        .figures(Timestamp::from_millis(i64::MAX / 2))
        .into_iter()
        .filter(|figure| figure.status == status)
        .map(|figure| figure.count)
        .sum()
}

#[tokio::test]
async fn a_refresh_reads_new_and_open_runs_and_a_whole_read_finds_the_rest() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open the ledger");
    let gauges = CommandGauges::default();

    // An old run, settled before the gauges first read the ledger.
    let old = reserve_at(&ledger, "old", 1_000_000).await;
    let old = move_to(&ledger, &old, CommandStatus::Cancelled).await;
    gauges.seed(&ledger).await.expect("the first, whole read");
    assert_eq!(held(&gauges, CommandStatus::Pending), 0);

    // Elsewhere: a new run waits, and the old one is reopened.
    let new = reserve_at(&ledger, "new", 2_000_000).await;
    move_to(&ledger, &old, CommandStatus::Compensating).await;
    gauges
        .seed_from(&ledger, Timestamp::from_millis(1_500_000))
        .await
        .expect("a refresh");
    assert_eq!(
        held(&gauges, CommandStatus::Pending),
        1,
        "the new run is read"
    );
    assert_eq!(
        held(&gauges, CommandStatus::Compensating),
        0,
        "an old run that held nothing is not read by a refresh"
    );

    // The new run settles elsewhere: a refresh after its creation still reads it, since it held
    // a command.
    move_to(&ledger, &new, CommandStatus::Confirmed).await;
    gauges
        .seed_from(&ledger, Timestamp::from_millis(3_000_000))
        .await
        .expect("a refresh");
    assert_eq!(held(&gauges, CommandStatus::Pending), 0, "it left PENDING");

    // The whole read finds the reopened run.
    gauges.seed(&ledger).await.expect("a whole read");
    assert_eq!(held(&gauges, CommandStatus::Compensating), 1);
}
