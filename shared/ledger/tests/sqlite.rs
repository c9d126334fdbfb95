//! The embedded SQLite ledger: the shared contract suite, then what only a file can show —
//! several processes on one file, foreign and damaged files, a full disk, a held lock.

use sluice_ledger::{AuditStore, CommandStore};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sluice_core::audit::AuditDraft;
use sluice_core::command::{CommandState, CommandStatus};
use sluice_ledger::contract::{command, fresh_run};
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_ledger::{Cas, Guard, Ledger, LedgerError, Reserved, Transition};

async fn fresh() -> (Arc<dyn Ledger>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
    (Arc::new(ledger), dir)
}

sluice_ledger::ledger_contract_tests!(fresh);

/// The contract's check of a row a newer build wrote, the row written in the file directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_a_newer_status_is_left_to_a_newer_build() {
    let (ledger, dir) = fresh().await;
    let path = SqliteConfig::in_dir(dir.path()).path();
    let writer: sluice_ledger::contract::NewerWriter = Box::new(move |run, key, status| {
        let path = path.clone();
        Box::pin(async move {
            let conn = rusqlite::Connection::open(&path).expect("the ledger file");
            let changed = conn
                .execute(
                    "UPDATE commands SET status = ?3, \
                     state = json_set(state, '$.status', ?3, '$.hibernating_until', 99) \
                     WHERE run_id = ?1 AND command_key = ?2",
                    rusqlite::params![run.as_str(), key.as_str(), status],
                )
                .expect("a newer build's write");
            assert_eq!(changed, 1);
        })
    });
    sluice_ledger::contract::a_command_of_a_newer_status_is_left_to_a_newer_build(ledger, writer)
        .await;
}

/// Set by the parent test when it re-runs this binary as a second process.
const CHILD_DIR: &str = "SLUICE_TEST_CHILD_LEDGER_DIR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_ledger_file() {
    if let Ok(dir) = std::env::var(CHILD_DIR) {
        // Child side: write 200 commands of its own run.
        let ledger = SqliteLedger::open(SqliteConfig::in_dir(&dir)).expect("child opens");
        let run = sluice_core::ids::RunId::parse("r-child").expect("valid");
        for i in 0..200 {
            let c = command(&run, i, "email/send", 0, json!({"i": i}));
            let audit = c.reservation_audit("child");
            ledger.reserve(c, audit).await.expect("child writes");
        }
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
    let exe = std::env::current_exe().expect("test binary path");
    let child = std::process::Command::new(exe)
        .args([
            "two_processes_share_one_ledger_file",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_DIR, dir.path())
        // The child's own test report would be counted twice in the suite's summary.
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the second process");
    let run = fresh_run("parent");
    for i in 0..200 {
        let c = command(&run, i, "email/send", 0, json!({"i": i}));
        let audit = c.reservation_audit("parent");
        ledger.reserve(c, audit).await.expect("parent writes");
    }
    let status = tokio::task::spawn_blocking(move || {
        let mut child = child;
        child.wait()
    })
    .await
    .expect("join")
    .expect("wait");
    assert!(status.success(), "the second process failed");
    let child_run = sluice_core::ids::RunId::parse("r-child").expect("valid");
    assert_eq!(
        ledger.list_run(&child_run, None).await.expect("list").len(),
        200
    );
    assert_eq!(ledger.list_run(&run, None).await.expect("list").len(), 200);
    // Both chains are intact although two writers interleaved on the file.
    for run in [&run, &child_run] {
        let trail = ledger.audit_read(run).await.expect("audit");
        sluice_core::audit::verify(run, None, &trail.entries).expect("chain verifies");
        assert_eq!(trail.entries.len(), 200);
    }
}

#[test]
fn a_foreign_sqlite_file_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("ledger.db");
    let other = rusqlite::Connection::open(&path).expect("create");
    other
        .execute_batch("CREATE TABLE invoices (id INTEGER PRIMARY KEY);")
        .expect("foreign schema");
    drop(other);
    let err = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect_err("refused");
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("ledger.db") && text.contains("another application"),
        "{text}"
    );
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("ledger.db"), vec![0x5a_u8; 8192]).expect("garbage");
    let err = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect_err("refused");
    assert!(matches!(err, LedgerError::Corrupt { .. }), "{err:?}");
    assert!(err.to_string().contains("not an SQLite database"), "{err}");
}

#[tokio::test]
async fn reopening_keeps_everything() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = fresh_run("reopen");
    {
        let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
        let c = command(&run, 0, "payments/wire", 0, json!({"amount": 1}));
        let audit = c.reservation_audit("test");
        ledger.reserve(c, audit).await.expect("reserve");
    }
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("reopen");
    let commands = ledger.list_run(&run, None).await.expect("list");
    assert_eq!(commands.len(), 1);
    assert_eq!(commands[0].status(), CommandStatus::Pending);
}

#[tokio::test]
async fn a_full_ledger_refuses_whole_operations_and_keeps_the_rest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = SqliteConfig {
        max_pages: Some(64),
        ..SqliteConfig::in_dir(dir.path())
    };
    let ledger = SqliteLedger::open(config).expect("open");
    let run = fresh_run("full");
    let mut written = 0u32;
    let err = loop {
        let c = command(
            &run,
            written,
            "email/send",
            0,
            json!({"pad": "p".repeat(2_000)}),
        );
        let audit = c.reservation_audit("test");
        match ledger.reserve(c, audit).await {
            Ok(Reserved::Created(_)) => written += 1,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => break e,
        }
        assert!(written < 10_000, "the size limit never hit");
    };
    assert!(matches!(err, LedgerError::Full { .. }), "{err:?}");
    assert!(err.to_string().contains("nothing was written"));
    // Whatever was confirmed is there, with a chain that verifies: no half-written command.
    let commands = ledger.list_run(&run, None).await.expect("list");
    assert_eq!(commands.len() as u32, written);
    let trail = ledger.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len() as u32, written);
    sluice_core::audit::verify(&run, None, &trail.entries).expect("verifies");
}

#[tokio::test]
async fn a_lock_held_too_long_is_a_clear_error_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = SqliteConfig {
        busy_timeout_ms: 200,
        ..SqliteConfig::in_dir(dir.path())
    };
    let ledger = SqliteLedger::open(config.clone()).expect("open");
    let blocker = rusqlite::Connection::open(config.path()).expect("second connection");
    blocker
        .execute_batch("BEGIN IMMEDIATE")
        .expect("hold the write lock");
    let run = fresh_run("locked");
    let c = command(&run, 0, "email/send", 0, json!({}));
    let audit = c.reservation_audit("test");
    let err = ledger
        .reserve(c.clone(), audit.clone())
        .await
        .expect_err("locked");
    assert!(
        matches!(
            err,
            LedgerError::Locked {
                timeout_ms: 200,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    blocker.execute_batch("ROLLBACK").expect("release");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(ledger.list_run(&run, None).await.expect("list").is_empty());
    // Once the lock is gone the same request goes through.
    assert!(
        ledger
            .reserve(c, audit)
            .await
            .expect("reserve")
            .is_created()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_writes_keep_the_wal_bounded_and_lose_nothing() {
    // Checkpoints run beside the writer; under writes that never pause, the log must still be
    // copied into the database and restart, and every confirmed write must survive a reopen.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = SqliteConfig {
        durability: sluice_ledger::sqlite::Durability::Normal,
        ..SqliteConfig::in_dir(dir.path())
    };
    let ledger = Arc::new(SqliteLedger::open(config.clone()).expect("open"));
    // ~4 KiB of arguments per command: well over 8,192 WAL pages in all.
    const TASKS: u32 = 32;
    const PER_TASK: u32 = 400;
    let runs: Vec<_> = (0..TASKS).map(|_| fresh_run("wal")).collect();
    let writers: Vec<_> = runs
        .iter()
        .map(|run| {
            let (ledger, run) = (Arc::clone(&ledger), run.clone());
            tokio::spawn(async move {
                for i in 0..PER_TASK {
                    let c = command(&run, i, "email/send", 0, json!({"pad": "p".repeat(4_000)}));
                    let audit = c.reservation_audit("test");
                    ledger.reserve(c, audit).await.expect("reserve");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.expect("writer task");
    }
    let wal = std::fs::metadata(dir.path().join("ledger.db-wal")).map_or(0, |m| m.len());
    // The log restarts near 8,192 frames of 4 KiB (plus a 24-byte header each); one batch may
    // overshoot it.
    assert!(wal < 2 * 8_192 * 4_120, "the WAL grew to {wal} bytes");
    drop(ledger);
    let ledger = SqliteLedger::open(config).expect("reopen");
    for run in &runs {
        assert_eq!(
            ledger.list_run(run, None).await.expect("list").len() as u32,
            PER_TASK
        );
        let trail = ledger.audit_read(run).await.expect("audit");
        sluice_core::audit::verify(run, None, &trail.entries).expect("verifies");
    }
}

#[tokio::test]
async fn the_dispatch_hint_holds_what_this_process_left_waiting_for_dispatch() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
    let other = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("second process");
    let run = fresh_run("hint");
    let c = command(&run, 0, "email/send", 0, json!({"to": "a@example.com"}));
    let key = c.command_key.clone();
    let audit = c.reservation_audit("test");
    ledger.reserve(c, audit).await.expect("reserve");

    let hint = ledger
        .cached(&run, &key)
        .expect("a reserved command is kept");
    let stored = ledger.get(&run, &key).await.expect("get").expect("stored");
    assert_eq!(hint.status(), CommandStatus::Pending);
    assert_eq!(hint.state, stored.state);
    assert!(
        other.cached(&run, &key).is_none(),
        "another ledger handle did not write it"
    );

    // Another process moves the command on: the hint is stale, and a write from it conflicts
    // with the command as it now stands, which replaces the hint.
    let mut cancelled = stored.state.clone();
    cancelled.status = CommandStatus::Cancelled;
    let write = |next: CommandState| Transition {
        run_id: run.clone(),
        command_key: key.clone(),
        guard: Guard::of(&stored),
        audit: Some(AuditDraft::transition(
            &key,
            Some(CommandStatus::Pending),
            next.status,
            "test",
            "moved",
        )),
        next,
    };
    assert!(matches!(
        other.transition(write(cancelled)).await.expect("cancel"),
        Cas::Applied(_)
    ));
    assert_eq!(
        ledger.cached(&run, &key).map(|c| c.status()),
        Some(CommandStatus::Pending),
        "a hint is not a read: it can be stale"
    );
    let mut leased = stored.state.clone();
    leased.status = CommandStatus::Leased;
    match ledger.transition(write(leased)).await.expect("write") {
        Cas::Conflict(Some(now)) => assert_eq!(now.status(), CommandStatus::Cancelled),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(
        ledger.cached(&run, &key).is_none(),
        "a command no longer waiting for dispatch is forgotten"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_reads_at_once_share_the_pooled_connections_and_all_answer() {
    let (ledger, _dir) = fresh().await;
    let runs: Vec<_> = (0..40).map(|i| fresh_run(&format!("reads-{i}"))).collect();
    for (i, run) in runs.iter().enumerate() {
        for decision in 0..=(i % 3) as u32 {
            let c = command(run, decision, "email/send", 0, json!({"to": "a@b.c"}));
            let audit = c.reservation_audit("test");
            ledger.reserve(c, audit).await.expect("reserve");
        }
    }
    // Five times as many reads as there are read connections, all at once, twice over: a
    // read that kept its connection slot would leave the later ones waiting for ever.
    for _ in 0..2 {
        let reads = runs.iter().enumerate().map(|(i, run)| {
            let ledger = Arc::clone(&ledger);
            async move { (i, ledger.list_run(run, None).await) }
        });
        let answers =
            tokio::time::timeout(Duration::from_secs(20), futures::future::join_all(reads))
                .await
                .expect("every read answers");
        for (i, listed) in answers {
            let listed = listed.expect("list");
            assert_eq!(listed.len(), i % 3 + 1, "run {i}");
            assert!(listed.iter().all(|c| c.run_id == runs[i]), "run {i}");
        }
    }
}

#[tokio::test]
async fn a_version_1_ledger_is_upgraded_in_place_and_keeps_its_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = fresh_run("upgrade");
    {
        let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
        let c = command(&run, 0, "email/send", 0, json!({}));
        let audit = c.reservation_audit("test");
        ledger.reserve(c, audit).await.expect("reserve");
    }
    // What a version 1 file looked like: no closed_at on runs.
    {
        let conn = rusqlite::Connection::open(SqliteConfig::in_dir(dir.path()).path())
            .expect("open the file");
        conn.execute_batch("ALTER TABLE runs DROP COLUMN closed_at; PRAGMA user_version = 1;")
            .expect("make it a version 1 file");
    }
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("upgrade");
    assert_eq!(ledger.list_run(&run, None).await.expect("list").len(), 1);
    let draft = AuditDraft {
        command_key: None,
        from: None,
        to: None,
        actor: "alice".into(),
        reason: "run rollback".into(),
        evidence: json!({}),
    };
    ledger
        .close_run(
            &run,
            draft,
            sluice_core::time::Clock::now(&sluice_core::time::SystemClock),
        )
        .await
        .expect("close");
    let late = command(&run, 1, "email/send", 0, json!({}));
    let audit = late.reservation_audit("test");
    assert!(matches!(
        ledger.reserve(late, audit).await,
        Err(LedgerError::RunClosed { .. })
    ));
    let version: i64 = rusqlite::Connection::open(SqliteConfig::in_dir(dir.path()).path())
        .expect("open the file")
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .expect("user_version");
    assert_eq!(version, 2);
}

/// The reference index is created on every open (a file written before it existed gets it),
/// and a purge takes a run's entries with the run, leaving other runs' alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purged_run_takes_its_reference_index_entries_with_it() {
    use sluice_core::ids::{IdempotencyKey, ToolName};
    use sluice_core::time::{Clock, SystemClock};
    use sluice_ledger::EvidenceStore;
    let dir = tempfile::tempdir().expect("temp dir");
    {
        SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("open");
        let conn = rusqlite::Connection::open(SqliteConfig::in_dir(dir.path()).path())
            .expect("open the file");
        conn.execute_batch("DROP TABLE evidence_references")
            .expect("a file from before the index");
    }
    let ledger = SqliteLedger::open(SqliteConfig::in_dir(dir.path())).expect("reopen");
    let tool = ToolName::parse("email/send").expect("a tool");
    let (done, open) = (fresh_run("ref-purged"), fresh_run("ref-open"));
    let mut keys = Vec::new();
    for run in [&done, &open] {
        let c = command(run, 0, "email/send", 0, json!({}));
        let audit = c.reservation_audit("test");
        ledger.reserve(c.clone(), audit).await.expect("reserve");
        let key = IdempotencyKey::new(run.clone(), c.command_key.clone());
        ledger
            .reference_put(&tool, &format!("ref-{run}"), &key)
            .await
            .expect("indexed");
        keys.push((c, key));
    }
    // The first run ends (cancelled) and is purged; the second stays open.
    let (finished, _) = &keys[0];
    let mut next = finished.state.clone();
    next.status = CommandStatus::Cancelled;
    next.due_at = None;
    let cancel = Transition {
        run_id: finished.run_id.clone(),
        command_key: finished.command_key.clone(),
        guard: Guard::of(finished),
        audit: Some(AuditDraft::transition(
            &finished.command_key,
            Some(finished.status()),
            next.status,
            "test",
            "cancelled",
        )),
        next,
    };
    assert!(
        ledger
            .transition(cancel)
            .await
            .expect("cancel")
            .is_applied()
    );
    let now = SystemClock.now();
    let report = ledger
        .purge(now.plus_millis(1_000), 100, "retention", now, false)
        .await
        .expect("purge");
    assert!(
        report.checkpoints.iter().any(|c| c.run_id == done),
        "{report:?}"
    );
    assert_eq!(
        ledger
            .reference_get(&tool, &format!("ref-{done}"))
            .await
            .expect("get"),
        None,
        "the purged run's entry went with it"
    );
    assert_eq!(
        ledger
            .reference_get(&tool, &format!("ref-{open}"))
            .await
            .expect("get"),
        Some(keys[1].1.clone()),
        "the open run's entry stays"
    );
}

/// Nice values of this process's threads named `name` (as `/proc` shortens it).
fn nice_of_threads(name: &str) -> Vec<i64> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task") {
        let path = task.expect("a task").path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        if comm.trim_end() != name {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else {
            continue;
        };
        // Fields after the command name start at field 3; nice is field 19.
        if let Some(nice) = stat
            .rsplit_once(')')
            .and_then(|(_, fields)| fields.split_whitespace().nth(16))
            .and_then(|nice| nice.parse().ok())
        {
            found.push(nice);
        }
    }
    found
}

#[tokio::test]
async fn the_writer_thread_alone_takes_the_configured_nice_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Raising a nice value needs no privilege, so this holds for any user; 7 is used by no
    // other test.
    let config = SqliteConfig {
        writer_nice: Some(7),
        ..SqliteConfig::in_dir(dir.path())
    };
    let before = rustix::process::getpriority_process(None).expect("this thread's nice");
    let ledger = SqliteLedger::open(config).expect("open");
    let run = fresh_run("nice");
    let c = command(&run, 0, "email/send", 0, json!({}));
    let audit = c.reservation_audit("test");
    // Once a write is answered, the writer has started and set its priority.
    ledger.reserve(c, audit).await.expect("reserve");
    let writers = nice_of_threads("sluice-ledger-w");
    assert!(
        writers.contains(&7),
        "writer threads' nice values: {writers:?}"
    );
    assert_eq!(
        rustix::process::getpriority_process(None).expect("this thread's nice"),
        before,
        "the caller's thread keeps its priority"
    );
}
