//! The CQL ledger against a real Cassandra node: the shared contract suite, then what only this
//! implementation has to show — LWTs per effect, unknown LWT outcomes settled by SERIAL reads,
//! the repair of an audit record whose writer died, the sweep cursors, the idempotent schema.
//!
//! The node is `SLUICE_TEST_CQL_NODES` (default `127.0.0.1:19042`, what
//! `scripts/engines/start.sh cassandra` starts). A missing node fails every test with a message
//! saying how to start one; `SLUICE_SKIP_CQL=1` skips this file instead (for a workspace test
//! run on a machine without engines; CI starts Cassandra).
//!
//! Keyspaces: creating one costs 2–3 s and about 7 tables of heap on the node (a 1 GiB test
//! node ran out of memory after ~100 of them), so the checks share one keyspace per run of
//! this binary and work in run ids of their own, as the contract allows. Three need a keyspace
//! of their own: the two purge checks (a purge removes every finished run it finds) and the
//! sweep-cursor test (it counts whole buckets). Keyspaces left by earlier runs are dropped first.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sluice_core::audit::verify;
use sluice_core::command::Command;
use sluice_core::command::CommandStatus;
use sluice_core::ids::RunId;
use sluice_core::machine::{self, DispatchOutcome, Event};
use sluice_core::time::{Clock, ManualClock, SystemClock};
use sluice_ledger::contract::{command, command_with_key, fresh_run, wire_rules};
use sluice_ledger::{AuditStore, CommandStore, ShardStore};
use sluice_ledger::{Cas, Ledger, Reserved, Transition};
use sluice_ledger_cql::{CqlConfig, CqlLedger, Op, Replication, StatsSnapshot};
use tokio::sync::OnceCell;

const NODES_VAR: &str = "SLUICE_TEST_CQL_NODES";
const SKIP_VAR: &str = "SLUICE_SKIP_CQL";
const DEFAULT_NODES: &str = "127.0.0.1:19042";
/// Test keyspaces are named `sluice_t_<unix seconds>_<random>`; leftovers older than this are
/// dropped by the next test binary (a run of this binary takes about a minute).
const KEYSPACE_PREFIX: &str = "sluice_t_";
const LEFTOVER_AGE_S: u64 = 10 * 60;
/// The contract checks that need a keyspace of their own: each purges every finished run it
/// finds, which would take the runs of the checks beside it.
const PURGE_CHECKS: [&str; 2] = [
    "purge_removes_finished_runs_and_leaves_checkpoints",
    "purge_keeps_runs_that_still_owe_work",
];

fn nodes() -> Vec<String> {
    std::env::var(NODES_VAR)
        .unwrap_or_else(|_| DEFAULT_NODES.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

/// Ends the whole test binary successfully when the CQL tests are to be skipped: libtest has no
/// runtime skip, and every test here needs the node.
fn skip_if_asked() {
    if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        // Past libtest's output capture, which would swallow the line at exit.
        let _ = writeln!(
            std::io::stderr(),
            "{SKIP_VAR}=1: the CQL ledger tests are skipped (no Cassandra node)"
        );
        std::process::exit(0);
    }
}

fn config(keyspace: String) -> CqlConfig {
    CqlConfig {
        nodes: nodes(),
        keyspace,
        replication: Replication::Simple {
            replication_factor: 1,
        },
        ..CqlConfig::default()
    }
}

/// A fresh keyspace name.
fn keyspace() -> String {
    let secs = SystemClock.now().as_millis() / 1_000;
    let unique = uuid::Uuid::new_v4().simple().to_string();
    format!("{KEYSPACE_PREFIX}{secs}_{}", &unique[..10])
}

async fn connect(config: CqlConfig) -> CqlLedger {
    skip_if_asked();
    let nodes = nodes().join(",");
    let started = std::time::Instant::now();
    let ledger = CqlLedger::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "no CQL node answers at {nodes} ({e}); start one with \
             `scripts/engines/install.sh cassandra && scripts/engines/start.sh cassandra`, \
             point {NODES_VAR} at another, or set {SKIP_VAR}=1 to skip these tests"
        )
    });
    eprintln!(
        "keyspace {} ready in {} ms",
        ledger.config().keyspace,
        started.elapsed().as_millis()
    );
    ledger
}

/// Drops the test keyspaces older runs left behind.
async fn drop_leftovers(ledger: &CqlLedger) {
    let session = ledger.session();
    let Ok(result) = session
        .query_unpaged("SELECT keyspace_name FROM system_schema.keyspaces", ())
        .await
    else {
        return;
    };
    let Ok(rows) = result.into_rows_result() else {
        return;
    };
    let now = u64::try_from(SystemClock.now().as_millis() / 1_000).unwrap_or(0);
    let names: Vec<String> = rows
        .rows::<(String,)>()
        .map(|rows| rows.filter_map(Result::ok).map(|(name,)| name).collect())
        .unwrap_or_default();
    for name in names {
        let Some(secs) = name
            .strip_prefix(KEYSPACE_PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|secs| secs.parse::<u64>().ok())
        else {
            continue;
        };
        if now.saturating_sub(secs) > LEFTOVER_AGE_S {
            let _ = session
                .query_unpaged(format!("DROP KEYSPACE IF EXISTS {name}"), ())
                .await;
        }
    }
}

/// The keyspace the checks of this run share, created (and old ones dropped) by the first.
async fn shared_keyspace() -> String {
    static SHARED: OnceCell<String> = OnceCell::const_new();
    SHARED
        .get_or_init(|| async {
            let ledger = connect(config(keyspace())).await;
            drop_leftovers(&ledger).await;
            ledger.config().keyspace.clone()
        })
        .await
        .clone()
}

/// A ledger on the shared keyspace, with settings of the test's.
async fn connect_shared_with(adjust: impl FnOnce(&mut CqlConfig)) -> CqlLedger {
    let mut config = config(shared_keyspace().await);
    adjust(&mut config);
    connect(config).await
}

async fn connect_shared() -> CqlLedger {
    connect_shared_with(|_| {}).await
}

/// A ledger on a keyspace of its own.
async fn connect_own() -> CqlLedger {
    shared_keyspace().await;
    connect(config(keyspace())).await
}

/// The contract's maker. libtest runs each test on a thread named after it, which is how the
/// purge checks are told apart: the macro gives every check the same maker.
async fn fresh() -> (Arc<dyn Ledger>, ()) {
    let own = std::thread::current()
        .name()
        .is_some_and(|name| PURGE_CHECKS.iter().any(|check| name.ends_with(check)));
    let ledger = if own {
        connect_own().await
    } else {
        connect_shared().await
    };
    (Arc::new(ledger), ())
}

sluice_ledger::ledger_contract_tests!(fresh);

/// Makes the keyspace's record of its migrations that of a build whose last file came before
/// `first_forgotten` (a file-name prefix such as `"007"`), and its schema version with it: so
/// the next migration applies the files from there again, as it would on such a keyspace.
async fn forget_migrations_from(ledger: &CqlLedger, first_forgotten: &str) {
    let keyspace = &ledger.config().keyspace;
    let files = sluice_ledger_cql::schema_files();
    let kept = files
        .iter()
        .filter(|(file, _)| *file < first_forgotten)
        .count();
    for (file, _) in files.iter().filter(|(file, _)| *file >= first_forgotten) {
        ledger
            .session()
            .query_unpaged(
                format!("DELETE FROM {keyspace}.schema_migrations WHERE file = ?"),
                (*file,),
            )
            .await
            .expect("forget a migration");
    }
    ledger
        .session()
        .query_unpaged(
            format!("UPDATE {keyspace}.meta SET value = ? WHERE name = 'schema_version'"),
            (i64::try_from(kept).expect("few files"),),
        )
        .await
        .expect("the older version");
}

/// The contract's check of a row a newer build wrote, the row written with an LWT of the
/// test's (as every write to `commands` is). On a keyspace of its own: the check counts what
/// its sweeps meet, and the shared keyspace holds other checks' rows of newer builds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_of_a_newer_status_is_left_to_a_newer_build() {
    let ledger = Arc::new(connect_own().await);
    let cql = Arc::clone(&ledger);
    let writer: sluice_ledger::contract::NewerWriter = Box::new(move |run, key, status| {
        let cql = Arc::clone(&cql);
        Box::pin(async move {
            let keyspace = cql.config().keyspace.clone();
            let (was, state): (String, String) = cql
                .session()
                .query_unpaged(
                    format!(
                        "SELECT status, state FROM {keyspace}.commands WHERE run_id = ? AND command_key = ?"
                    ),
                    (run.as_str(), key.as_str()),
                )
                .await
                .expect("read")
                .into_rows_result()
                .expect("rows")
                .single_row::<(String, String)>()
                .expect("the row");
            let mut state: serde_json::Value = serde_json::from_str(&state).expect("json");
            state["status"] = json!(status);
            state["hibernating_until"] = json!(99);
            cql.session()
                .query_unpaged(
                    format!(
                        "UPDATE {keyspace}.commands SET status = ?, state = ? WHERE run_id = ? AND command_key = ? IF status = ?"
                    ),
                    (status, state.to_string(), run.as_str(), key.as_str(), was),
                )
                .await
                .expect("a newer build's write");
        })
    });
    let keyspace = ledger.config().keyspace.clone();
    sluice_ledger::contract::a_command_of_a_newer_status_is_left_to_a_newer_build(
        ledger.clone(),
        writer,
    )
    .await;
    sluice_ledger_cql::drop_keyspace(ledger.session(), &keyspace)
        .await
        .expect("drop the keyspace");
}

fn now() -> sluice_core::time::Timestamp {
    SystemClock.now()
}

/// Reserve, lease and finalize one command; the round trips it took.
async fn one_effect(
    ledger: &CqlLedger,
    run: &sluice_core::ids::RunId,
    decision: u32,
    tool: &str,
    business_key: Option<&str>,
) -> StatsSnapshot {
    let before = ledger.stats();
    // As the producer reserves it: an IDEMPOTENT or OBSERVE_ONLY command is leased by its
    // reservation, and the dispatcher calls under that lease without a write of its own.
    let wanted = command_with_key(run, decision, tool, 0, json!({"n": decision}), business_key);
    let rules = machine::Rules::defaults(wanted.semantics);
    let wanted =
        wanted.leased_at_reservation(&rules, &sluice_core::policy::PolicyDecision::Allow, now());
    let audit = wanted.reservation_audit("test");
    let Reserved::Created(reserved) = ledger.reserve(wanted, audit).await.expect("reserve") else {
        panic!("expected a new command");
    };
    let leased = match reserved.status() {
        CommandStatus::Leased => reserved,
        _ => lease(ledger, &reserved).await.expect("lease applied"),
    };
    let confirmed = finalize(ledger, &leased).await;
    assert_eq!(
        confirmed.applied().map(|c| c.status()),
        Some(CommandStatus::Confirmed)
    );
    ledger.stats().since(&before)
}

/// Leases a PENDING command (the one it is given, as the caller read it).
async fn lease(ledger: &CqlLedger, pending: &Command) -> Option<Command> {
    let step = machine::apply(
        &pending.state,
        &wire_rules(),
        &Event::Lease { owner: "d".into() },
        now(),
    )
    .expect("lease");
    ledger
        .acquire_lease(Transition::from_step(pending, &step, "d"))
        .await
        .expect("lease write")
        .applied()
        .cloned()
}

/// Finalizes a LEASED command as committed.
async fn finalize(ledger: &CqlLedger, leased: &Command) -> Cas {
    let done = machine::apply(
        &leased.state,
        &wire_rules(),
        &Event::Dispatched {
            epoch: leased.epoch(),
            sent_at: now(),
            outcome: DispatchOutcome::Committed {
                external_ref: Some("x-1".into()),
                result: None,
            },
        },
        now(),
    )
    .expect("committed");
    ledger
        .finalize(Transition::from_step(leased, &done, "d"))
        .await
        .expect("finalize write")
}

/// A dispatcher handed the producer's copy of a command with the producer's basis (the row's
/// version and the run's head it wrote) writes its lease and outcome from them without reading
/// the command; a basis that went stale (the run's head moved since) costs one LWT that does
/// not apply, then a read, never a wrong write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_adopted_with_its_basis_is_written_from_without_a_read() {
    let producer = connect_shared().await;
    let dispatcher = CqlLedger::connect(config(producer.config().keyspace.clone()))
        .await
        .expect("second instance");
    let run = fresh_run("adopted");
    let reserve = |decision: u32, tool: &'static str| {
        let wanted = command(&run, decision, tool, 0, json!({"n": decision}));
        let rules = machine::Rules::defaults(wanted.semantics);
        let wanted = wanted.leased_at_reservation(
            &rules,
            &sluice_core::policy::PolicyDecision::Allow,
            now(),
        );
        let audit = wanted.reservation_audit("test");
        let producer = &producer;
        async move {
            let reserved = producer
                .reserve(wanted, audit)
                .await
                .expect("reserve")
                .into_command();
            let basis = producer
                .basis(&reserved.run_id, &reserved.command_key)
                .expect("the producer knows what it wrote");
            (reserved, basis)
        }
    };

    // IDEMPOTENT (leased by its reservation): the outcome's LWT straight away.
    let (copy, basis) = reserve(0, "email/send").await;
    assert!(dispatcher.adopt(&copy, &basis));
    let before = dispatcher.stats();
    assert!(finalize(&dispatcher, &copy).await.is_applied());
    let spent = dispatcher.stats().since(&before);
    assert_eq!(
        (spent.total_lwt(), spent.total_plain()),
        (1, 1),
        "{spent:?}"
    );
    assert_eq!(spent.op(Op::Get).calls, 0);

    // NON_IDEMPOTENT: the lease and the outcome, still no read.
    let (copy, basis) = reserve(1, "payments/wire").await;
    assert!(dispatcher.adopt(&copy, &basis));
    let before = dispatcher.stats();
    let leased = lease(&dispatcher, &copy)
        .await
        .expect("leased from the copy");
    assert!(finalize(&dispatcher, &leased).await.is_applied());
    let spent = dispatcher.stats().since(&before);
    assert_eq!(spent.total_lwt(), 2, "{spent:?}");
    assert_eq!(
        [Op::Get, Op::Lease, Op::Finalize].map(|op| spent.op(op).plain),
        [0, 0, 1],
        "the lease keeps the reservation's due time (no entry to file or delete); the outcome deletes its entry"
    );

    // A stale basis: the producer moved the run's head after handing it out.
    let (copy, basis) = reserve(2, "email/send").await;
    reserve(3, "email/send").await;
    assert!(dispatcher.adopt(&copy, &basis));
    let before = dispatcher.stats();
    assert!(finalize(&dispatcher, &copy).await.is_applied());
    let spent = dispatcher.stats().since(&before);
    assert_eq!(
        spent.op(Op::Finalize).lwt,
        2,
        "one LWT lost to the stale head: {spent:?}"
    );
    let trail = producer.audit_read(&run).await.expect("audit");
    verify(&run, None, &trail.entries).expect("one chain");
    assert_eq!(trail.entries.len(), 4 + 3 + 1);

    // What is not a basis is refused.
    assert!(!dispatcher.adopt(&copy, "{\"w\": 1}"));
}

/// Reserves a new command of `tool` as decision `decision` of `run`; returns it PENDING.
async fn reserved(
    ledger: &CqlLedger,
    run: &sluice_core::ids::RunId,
    decision: u32,
    tool: &str,
) -> Command {
    let wanted = command(run, decision, tool, 0, json!({}));
    let audit = wanted.reservation_audit("test");
    ledger
        .reserve(wanted, audit)
        .await
        .expect("reserve")
        .into_command()
}

/// A reservation that takes its run to be new (the run's first decision) and finds it is not
/// — another producer opened it — costs one failed LWT and then writes on the run's head as
/// read: the chain stays whole, the run is listed once, and a replay of a command already
/// there is answered as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_taken_for_new_that_is_not_is_read_and_written_whole() {
    let first = connect_shared().await;
    let run = fresh_run("guess");
    reserved(&first, &run, 2, "email/send").await;
    // Another producer (a handle of its own: it has not seen the run) reserves the run's
    // first decision.
    let second = connect_shared().await;
    let before = second.stats();
    let wanted = command(&run, 1, "email/send", 0, json!({}));
    let audit = wanted.reservation_audit("test");
    let created = second
        .reserve(wanted.clone(), audit)
        .await
        .expect("reserve");
    assert!(created.is_created(), "{created:?}");
    let spent = second.stats().since(&before);
    assert_eq!(spent.op(Op::Reserve).guesses_missed, 1, "{spent:?}");
    assert_eq!(
        spent.op(Op::Reserve).lwt,
        2,
        "the guess and the write: {spent:?}"
    );
    let trail = second.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len(), 2, "{trail:?}");
    verify(&run, None, &trail.entries).expect("one chain");
    let listed = second
        .list_runs(
            sluice_core::time::Timestamp::from_millis(0),
            None,
            usize::MAX,
        )
        .await
        .expect("runs");
    assert_eq!(
        listed
            .iter()
            .filter(|summary| summary.run_id == run)
            .count(),
        1,
        "the guess's runs entry is not listed"
    );
    // A third producer replays the same command: answered as already there.
    let third = connect_shared().await;
    let audit = wanted.reservation_audit("test");
    let replayed = third.reserve(wanted, audit).await.expect("replay");
    assert!(
        matches!(replayed, sluice_ledger::Reserved::Existing(_)),
        "{replayed:?}"
    );
}

/// Plain round trips of reserve, lease and finalize.
fn plain_by_op(spent: &StatsSnapshot) -> [u64; 3] {
    [Op::Reserve, Op::Lease, Op::Finalize].map(|op| spent.op(op).plain)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lwts_per_effect_are_the_same_for_one_effect_and_for_many() {
    let ledger = connect_shared().await;
    // One effect of each semantics in a run of its own.
    // Plain round trips: the first reservation of a run files the due entry and the run (one
    // batch), its head taken to be a new run's without a read (it is the run's first
    // decision); the lease keeps the reservation's due time, so it touches no due entry; the
    // finalize deletes the reservation's. Every record is written by its own LWT. Later reservations in the
    // run write from the head this process left (no read).
    let single = fresh_run("lwt-one");
    let spent = one_effect(&ledger, &single, 0, "payments/wire", None).await;
    assert_eq!((spent.total_lwt(), plain_by_op(&spent)), (3, [1, 0, 1]));
    assert_eq!(spent.op(Op::Reserve).guesses_missed, 0);
    // IDEMPOTENT and OBSERVE_ONLY: the lease rides in the reservation's LWT.
    let spent = one_effect(&ledger, &single, 1, "email/send", None).await;
    assert_eq!((spent.total_lwt(), plain_by_op(&spent)), (2, [1, 0, 1]));
    let spent = one_effect(&ledger, &single, 3, "search/lookup", None).await;
    assert_eq!((spent.total_lwt(), plain_by_op(&spent)), (2, [1, 0, 1]));
    // A business key costs its claim (an LWT, no plain round trip).
    let keyed = format!("bk-{single}");
    let spent = one_effect(&ledger, &single, 2, "payments/wire", Some(&keyed)).await;
    assert_eq!((spent.total_lwt(), plain_by_op(&spent)), (4, [1, 0, 1]));
    // Many effects in one run, one after the other: still 3 each.
    let many = fresh_run("lwt-many");
    let before = ledger.stats();
    let effects = 40;
    let started = std::time::Instant::now();
    for decision in 0..effects {
        one_effect(&ledger, &many, decision, "payments/wire", None).await;
    }
    let wall_us = u64::try_from(started.elapsed().as_micros()).expect("micros");
    let spent = ledger.stats().since(&before);
    // Each round trip's wait is counted once: every op waited, and, the effects made one
    // round trip at a time, all the waits together fit in the loop's own time.
    let waited: u64 = spent.ops.values().map(|c| c.lwt_us + c.plain_us).sum();
    for op in [Op::Reserve, Op::Lease, Op::Finalize] {
        assert!(spent.op(op).lwt_us > 0, "{op:?}: {spent:?}");
    }
    assert!(spent.op(Op::Reserve).plain_us > 0, "{spent:?}");
    assert!(
        waited <= wall_us,
        "{waited} µs waited in a loop of {wall_us} µs"
    );
    assert_eq!(spent.total_lwt(), 3 * u64::from(effects), "{spent:?}");
    let n = u64::from(effects);
    assert_eq!(plain_by_op(&spent), [n, 0, n], "{spent:?}");
    for op in [Op::Reserve, Op::Lease, Op::Finalize] {
        let counts = spent.op(op);
        assert_eq!(
            (counts.calls, counts.lwt, counts.retries),
            (u64::from(effects), u64::from(effects), 0),
            "{op:?}"
        );
    }
    eprintln!(
        "round trips for {effects} NON_IDEMPOTENT effects: {} LWT, {} plain; per op: {:?}",
        spent.total_lwt(),
        spent.total_plain(),
        spent
            .ops
            .iter()
            .filter(|(_, c)| c.calls > 0)
            .collect::<Vec<_>>()
    );
    let trail = ledger.audit_read(&many).await.expect("audit");
    assert_eq!(trail.entries.len(), 3 * effects as usize);
    verify(&many, None, &trail.entries).expect("verifies");

    // And many IDEMPOTENT effects in one run: still 2 each, no lease round trip at all.
    let many = fresh_run("lwt-many-idempotent");
    let before = ledger.stats();
    for decision in 0..effects {
        one_effect(&ledger, &many, decision, "email/send", None).await;
    }
    let spent = ledger.stats().since(&before);
    assert_eq!(spent.total_lwt(), 2 * n, "{spent:?}");
    assert_eq!(plain_by_op(&spent), [n, 0, n], "{spent:?}");
    assert_eq!(spent.op(Op::Lease).calls, 0, "{spent:?}");
    let trail = ledger.audit_read(&many).await.expect("audit");
    assert_eq!(trail.entries.len(), 2 * effects as usize);
    verify(&many, None, &trail.entries).expect("verifies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_effects_of_one_run_keep_one_chain() {
    let ledger = Arc::new(connect_shared().await);
    let run = fresh_run("contended");
    let tasks: Vec<_> = (0..8)
        .map(|decision| {
            let ledger = Arc::clone(&ledger);
            let run = run.clone();
            tokio::spawn(
                async move { one_effect(&ledger, &run, decision, "email/send", None).await },
            )
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let trail = ledger.audit_read(&run).await.expect("audit");
    assert_eq!(
        trail.entries.len(),
        16,
        "reserved and leased, then confirmed: 2 each"
    );
    verify(&run, None, &trail.entries).expect("one unbroken chain");
    let spent = ledger.stats();
    eprintln!(
        "8 concurrent effects in one run: {} LWT ({} retries on the moving head)",
        spent.total_lwt(),
        Op::ALL.iter().map(|op| spent.op(*op).retries).sum::<u64>()
    );
}

/// The API reserves in one process while the dispatcher reads, leases and finalizes in another,
/// one effect after the other in one run, so each process's knowledge of the run's head is
/// stale whenever the other wrote last. A stale head costs one LWT that does not apply, once
/// per run and process (the run is read before each write from then on), never a wrong write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_written_by_two_processes_loses_at_most_one_lwt_to_the_cache() {
    let api = connect_shared().await;
    let dispatcher = CqlLedger::connect(config(api.config().keyspace.clone()))
        .await
        .expect("second instance");
    let run = fresh_run("two-processes");
    let effects = 6u32;
    for decision in 0..effects {
        let wanted = command(&run, decision, "payments/wire", 0, json!({"n": decision}));
        let audit = wanted.reservation_audit("test");
        let key = wanted.command_key.clone();
        assert!(
            api.reserve(wanted, audit)
                .await
                .expect("reserve")
                .is_created()
        );
        // As `Context::drive` does: read the command, then lease it.
        let pending = dispatcher
            .get(&run, &key)
            .await
            .expect("get")
            .expect("found");
        let leased = lease(&dispatcher, &pending).await.expect("lease applied");
        assert!(finalize(&dispatcher, &leased).await.is_applied());
    }
    let (api_spent, dispatcher_spent) = (api.stats(), dispatcher.stats());
    let n = u64::from(effects);
    eprintln!(
        "api: {} LWT, {} plain; dispatcher: {} LWT, {} plain (per op: {:?})",
        api_spent.total_lwt(),
        api_spent.total_plain(),
        dispatcher_spent.total_lwt(),
        dispatcher_spent.total_plain(),
        dispatcher_spent
            .ops
            .iter()
            .filter(|(_, c)| c.calls > 0)
            .collect::<Vec<_>>()
    );
    // The second reservation found the head moved by the dispatcher: one LWT lost, once.
    assert_eq!(api_spent.op(Op::Reserve).lwt, n + 1, "{api_spent:?}");
    // The dispatcher's get made its lease and finalize reads unnecessary, and nothing else
    // wrote the run while it held a lease.
    assert_eq!(dispatcher_spent.total_lwt(), 2 * n, "{dispatcher_spent:?}");
    assert_eq!(
        [Op::Get, Op::Lease, Op::Finalize].map(|op| dispatcher_spent.op(op).plain),
        [n, 0, n]
    );
    let trail = api.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len(), 3 * effects as usize);
    verify(&run, None, &trail.entries).expect("one unbroken chain");
}

/// A process that knows a command as LEASED under epoch 1 writes its outcome without reading
/// it; if another process changed the row meanwhile, the LWT does not apply and the answer is
/// read: a conflict if the guard no longer holds, the write if only the row's version moved
/// (a lease extension).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_cached_row_costs_an_lwt_never_a_wrong_write() {
    let ledger = connect_shared().await;
    let other = CqlLedger::connect(config(ledger.config().keyspace.clone()))
        .await
        .expect("second instance");
    let run = fresh_run("stale-row");

    // The other process finalizes first: this one's finalize, from the same lease, conflicts.
    let pending = reserved(&ledger, &run, 0, "payments/wire").await;
    let leased = lease(&ledger, &pending).await.expect("lease");
    assert!(finalize(&other, &leased).await.is_applied());
    let before = ledger.stats();
    let late = finalize(&ledger, &leased).await;
    assert_eq!(
        late.current().map(|c| c.status()),
        Some(CommandStatus::Confirmed)
    );
    assert!(!late.is_applied());
    let spent = ledger.stats().since(&before);
    assert_eq!(
        (spent.op(Op::Finalize).lwt, spent.op(Op::Finalize).plain),
        (1, 1)
    );

    let trail = ledger.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len(), 3, "one record per applied write");
    verify(&run, None, &trail.entries).expect("verifies");

    // The other process extends the lease (same status and epoch, a new row version): the
    // finalize from the cached row does not apply, reads, and applies on the fresh row. (A
    // run of its own: the conflict above made this process read `run` before every write.)
    let run = fresh_run("stale-row");
    let pending = reserved(&ledger, &run, 0, "payments/wire").await;
    let leased = lease(&ledger, &pending).await.expect("lease");
    let extend = machine::apply(
        &leased.state,
        &wire_rules(),
        &Event::ExtendLease {
            epoch: leased.epoch(),
            to: now().plus_millis(60_000),
        },
        now(),
    )
    .expect("the holder extends");
    let extended = other
        .transition(Transition::from_step(&leased, &extend, "test"))
        .await
        .expect("extend");
    assert!(extended.is_applied());
    let before = ledger.stats();
    let done = finalize(&ledger, &leased).await;
    assert_eq!(
        done.applied().map(|c| c.status()),
        Some(CommandStatus::Confirmed)
    );
    let spent = ledger.stats().since(&before).op(Op::Finalize);
    assert_eq!((spent.lwt, spent.retries), (2, 1), "{spent:?}");
    let trail = ledger.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len(), 3, "one record per applied write");
    verify(&run, None, &trail.entries).expect("verifies");
}

/// With a 1 ms client timeout on every LWT, nearly every LWT's outcome is unknown to the
/// client while the node goes on and decides it. Each is settled by a SERIAL read: the results
/// are exactly those of a ledger that never timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lwts_that_time_out_are_settled_by_a_serial_read() {
    let ledger = Arc::new(connect_shared_with(|config| config.lwt_timeout_ms = 1).await);
    // A 1 ms client timeout hits some LWTs, not all: on a quiet node a round may see none, so
    // rounds go on (each checked in full) until one did.
    let unknown = || {
        let stats = ledger.stats();
        Op::ALL.iter().map(|op| stats.op(*op).unknown).sum::<u64>()
    };
    for round in 0..ROUNDS_FOR_A_TIMEOUT {
        let run = fresh_run(&format!("unknown-{round}"));
        one_effect(&ledger, &run, 0, "payments/wire", None).await;
        let wanted = command(&run, 1, "payments/wire", 0, json!({}));
        let audit = wanted.reservation_audit("test");
        let pending = ledger
            .reserve(wanted.clone(), audit.clone())
            .await
            .expect("reserve")
            .into_command();
        // A replay after an unknown outcome is the stored command, not a second one.
        assert!(matches!(
            ledger.reserve(wanted, audit).await.expect("replay"),
            Reserved::Existing(_)
        ));
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let ledger = Arc::clone(&ledger);
                let pending = pending.clone();
                tokio::spawn(async move {
                    let lease = machine::apply(
                        &pending.state,
                        &wire_rules(),
                        &Event::Lease {
                            owner: format!("d-{i}").into(),
                        },
                        now(),
                    )
                    .expect("lease");
                    ledger
                        .acquire_lease(Transition::from_step(&pending, &lease, "d"))
                        .await
                        .expect("settled, not an error")
                        .is_applied()
                })
            })
            .collect();
        let mut winners = 0;
        for task in tasks {
            winners += usize::from(task.await.expect("task"));
        }
        assert_eq!(winners, 1, "exactly one lease, timeouts or not");
        let trail = ledger.audit_read(&run).await.expect("audit");
        assert_eq!(trail.entries.len(), 5, "one record per applied write");
        verify(&run, None, &trail.entries).expect("verifies");
        if unknown() > 0 {
            break;
        }
    }
    let stats = ledger.stats();
    let serial: u64 = Op::ALL.iter().map(|op| stats.op(*op).serial).sum();
    eprintln!(
        "{} LWT outcomes were unknown; {serial} SERIAL reads settled them",
        unknown()
    );
    assert!(
        unknown() > 0,
        "the 1 ms timeout never hit in {ROUNDS_FOR_A_TIMEOUT} rounds: {stats:?}"
    );
}

/// Rounds of `lwts_that_time_out_are_settled_by_a_serial_read` before it gives up waiting for
/// a timeout (one round sees one in most runs).
const ROUNDS_FOR_A_TIMEOUT: usize = 20;

/// The seqs of a run's records in the `audit` table (where builds before schema 007 put them).
async fn legacy_seqs(ledger: &CqlLedger, run: &RunId) -> Vec<i64> {
    let keyspace = &ledger.config().keyspace;
    let rows = ledger
        .session()
        .query_unpaged(
            format!("SELECT seq FROM {keyspace}.audit WHERE run_id = ?"),
            (run.as_str(),),
        )
        .await
        .expect("read")
        .into_rows_result()
        .expect("rows");
    rows.rows::<(i64,)>()
        .expect("typed")
        .map(|r| r.expect("row").0)
        .collect()
}

/// A run's audit records as rows of its partition: (seq's key, record, prev, hash, write id).
type LinkRow = (String, String, String, String, uuid::Uuid);

async fn link_rows(ledger: &CqlLedger, run: &RunId) -> Vec<LinkRow> {
    let keyspace = &ledger.config().keyspace;
    let rows = ledger
        .session()
        .query_unpaged(
            format!(
                "SELECT command_key, link_record, link_prev, link_hash, write_id \
                 FROM {keyspace}.commands WHERE run_id = ? AND command_key >= 'a-' \
                 AND command_key < 'a.'"
            ),
            (run.as_str(),),
        )
        .await
        .expect("read")
        .into_rows_result()
        .expect("rows");
    rows.rows::<LinkRow>()
        .expect("typed")
        .map(|r| r.expect("row"))
        .collect()
}

/// Each audit record is a row of its run's partition, written by the LWT that fixed it:
/// nothing goes to `audit` any more, so there is no window in which the record exists only
/// in the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_record_is_written_by_its_own_lwt() {
    let ledger = connect_shared().await;
    let run = fresh_run("linked");
    one_effect(&ledger, &run, 0, "payments/wire", None).await;
    let rows = link_rows(&ledger, &run).await;
    let keys: Vec<&str> = rows.iter().map(|row| row.0.as_str()).collect();
    assert_eq!(
        keys,
        [
            "a-00000000000000000000",
            "a-00000000000000000001",
            "a-00000000000000000002"
        ]
    );
    assert!(legacy_seqs(&ledger, &run).await.is_empty());
    let trail = ledger.audit_read(&run).await.expect("audit");
    for (entry, row) in trail.entries.iter().zip(&rows) {
        assert_eq!((&entry.prev_hash, &entry.hash), (&row.2, &row.3));
    }
    verify(&run, None, &trail.entries).expect("verifies");
    // The run's commands are listed without them.
    assert_eq!(ledger.list_run(&run, None).await.expect("list").len(), 1);
}

/// A keyspace and a run written by a build before schema 007 (the records in `audit`, the
/// last one kept in the head's `audit_pending` until the next writer makes sure of it, and no
/// record columns in `commands`): migrated live when a ledger connects, the run is read whole
/// and goes on. A reader and a writer each insert the pending record when `audit` lacks it
/// (its writer died before inserting it), and the next record is a row of the partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_written_before_schema_007_is_read_whole_and_goes_on() {
    let ledger = connect_own().await;
    let keyspace = ledger.config().keyspace.clone();
    let session = ledger.session();
    let run = fresh_run("legacy");
    for decision in 0..2 {
        let wanted = command(&run, decision, "email/send", 0, json!({}));
        let audit = wanted.reservation_audit("test");
        ledger.reserve(wanted, audit).await.expect("reserve");
    }
    // Rewrite the run as the old build left it: records in `audit`, the last one pending in
    // the head, and its insert never made (the writer died).
    let rows = link_rows(&ledger, &run).await;
    assert_eq!(rows.len(), 2);
    for (key, record, prev, hash, write_id) in &rows {
        let seq: i64 = key.trim_start_matches("a-").parse().expect("seq");
        session
            .query_unpaged(
                format!(
                    "INSERT INTO {keyspace}.audit (run_id, seq, record, prev_hash, hash, write_id) \
                     VALUES (?, ?, ?, ?, ?, ?)"
                ),
                (run.as_str(), seq, record, prev, hash, write_id),
            )
            .await
            .expect("insert");
        session
            .query_unpaged(
                format!("DELETE FROM {keyspace}.commands WHERE run_id = ? AND command_key = ?"),
                (run.as_str(), key),
            )
            .await
            .expect("delete");
    }
    let (_, last, last_prev, _, last_write) = &rows[1];
    let lose_the_pending_insert = || async {
        session
            .query_unpaged(
                format!("DELETE FROM {keyspace}.audit WHERE run_id = ? AND seq = 1"),
                (run.as_str(),),
            )
            .await
            .expect("delete");
    };
    session
        .query_unpaged(
            format!(
                "UPDATE {keyspace}.commands SET audit_pending = ?, audit_pending_prev = ?, \
                 audit_write_id = ? WHERE run_id = ?"
            ),
            (last, last_prev, last_write, run.as_str()),
        )
        .await
        .expect("pending");
    lose_the_pending_insert().await;
    session
        .query_unpaged(
            format!("ALTER TABLE {keyspace}.commands DROP (link_record, link_prev, link_hash)"),
            (),
        )
        .await
        .expect("make it a keyspace before 007");
    forget_migrations_from(&ledger, "007").await;

    // A reader on a ledger with no memory of the run (whose connect migrates the keyspace)
    // sees the whole chain and writes the pending record back.
    let reader = CqlLedger::connect(config(keyspace.clone()))
        .await
        .expect("second instance");
    let trail = reader.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len(), 2);
    verify(&run, None, &trail.entries).expect("verifies");
    assert_eq!(legacy_seqs(&reader, &run).await, [0, 1]);

    // Lost again; a writer with no memory of the run makes sure of it before moving the head,
    // and its own record is a row of the partition.
    lose_the_pending_insert().await;
    let writer = CqlLedger::connect(config(keyspace.clone()))
        .await
        .expect("third instance");
    let third = command(&run, 2, "email/send", 0, json!({}));
    let audit = third.reservation_audit("test");
    writer.reserve(third, audit).await.expect("reserve");
    assert_eq!(legacy_seqs(&writer, &run).await, [0, 1]);
    let keys: Vec<String> = link_rows(&writer, &run)
        .await
        .into_iter()
        .map(|row| row.0)
        .collect();
    assert_eq!(keys, ["a-00000000000000000002"]);
    let trail = writer.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.len(), 3);
    verify(&run, None, &trail.entries).expect("one chain across the two layouts");
    // The head no longer holds a pending record: a later reader does not write it again.
    let pending: Option<String> = session
        .query_unpaged(
            format!("SELECT audit_pending FROM {keyspace}.commands WHERE run_id = ? LIMIT 1"),
            (run.as_str(),),
        )
        .await
        .expect("read")
        .into_rows_result()
        .expect("rows")
        .first_row::<(Option<String>,)>()
        .expect("row")
        .0;
    assert_eq!(pending, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_keeps_data() {
    let ledger = connect_shared().await;
    let keyspace = ledger.config().keyspace.clone();
    let run = fresh_run("migrate");
    let c = command(&run, 0, "email/send", 0, json!({}));
    let audit = c.reservation_audit("test");
    ledger.reserve(c, audit).await.expect("reserve");
    sluice_ledger_cql::migrate(ledger.session(), &keyspace, &Replication::default())
        .await
        .expect("second migrate");
    assert_eq!(ledger.list_run(&run, None).await.expect("list").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_node_is_a_clear_error() {
    skip_if_asked();
    let config = CqlConfig {
        nodes: vec!["127.0.0.1:1".into()],
        connect_timeout_ms: 500,
        ..CqlConfig::default()
    };
    let err = tokio::time::timeout(Duration::from_secs(20), CqlLedger::connect(config))
        .await
        .expect("gives up in time")
        .expect_err("nothing listens on port 1");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

/// Entries left in buckets older than the sweep lag are carried into the current minute (live
/// ones) or deleted (stale ones), and the cursors move past the emptied buckets: a sweep does
/// not walk from the keyspace's first minute forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn old_due_buckets_are_emptied_and_cursors_move_on() {
    let (ledger, clock, keyspace) = swept_alone().await;
    let run = fresh_run("carry");
    let waiting = reserved(&ledger, &run, 0, "email/send").await;
    let pending = reserved(&ledger, &run, 1, "email/send").await;
    let lease = machine::apply(
        &pending.state,
        &wire_rules(),
        &Event::Lease { owner: "d".into() },
        clock.now(),
    )
    .expect("lease");
    let leased = ledger
        .acquire_lease(Transition::from_step(&pending, &lease, "d"))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("leased");
    let first_bucket = waiting.state.due_at.expect("due").as_millis() / 60_000;

    clock.advance(Duration::from_secs(20 * 60));
    let due = |ledger: CqlLedger, at| async move {
        let mut keys: Vec<(String, CommandStatus)> = ledger
            .due(at, 1_000)
            .await
            .expect("due")
            .into_iter()
            .map(|item| (item.command_key.to_string(), item.status))
            .collect();
        keys.sort();
        keys
    };
    let expected = vec![
        ("d-0/email/send/0".to_owned(), CommandStatus::Pending),
        ("d-1/email/send/0".to_owned(), CommandStatus::Leased),
    ];
    assert_eq!(due(ledger.clone(), clock.now()).await, expected);
    // The stale entry of the leased command (its PENDING due time) is gone, the live ones
    // moved to the current minute, and every cursor is past the old buckets.
    let count_in = |minute: i64| {
        let ledger = ledger.clone();
        let keyspace = keyspace.clone();
        async move {
            let mut total = 0;
            for shard in 0..4 {
                let rows = ledger
                    .session()
                    .query_unpaged(
                        format!(
                            "SELECT COUNT(*) FROM {keyspace}.due WHERE minute = ? AND shard = ?"
                        ),
                        (minute, shard),
                    )
                    .await
                    .expect("count")
                    .into_rows_result()
                    .expect("rows");
                total += rows.first_row::<(i64,)>().expect("row").0;
            }
            total
        }
    };
    assert_eq!(count_in(first_bucket).await, 0);
    let expiry_bucket = leased.state.lease.expires_at.expect("expiry").as_millis() / 60_000;
    assert_eq!(count_in(expiry_bucket).await, 0);
    let now_bucket = clock.now().as_millis() / 60_000;
    assert_eq!(count_in(now_bucket).await, 2);
    let cursors = ledger
        .session()
        .query_unpaged(format!("SELECT minute FROM {keyspace}.sweep_cursor"), ())
        .await
        .expect("cursors")
        .into_rows_result()
        .expect("rows");
    let cursors: Vec<i64> = cursors
        .rows::<(i64,)>()
        .expect("typed")
        .map(|row| row.expect("row").0)
        .collect();
    assert_eq!(cursors.len(), 4, "every shard swept");
    assert!(
        cursors.iter().all(|&minute| minute == now_bucket - 5),
        "cursors stop at the sweep lag: {cursors:?} (now {now_bucket})"
    );
    // Swept again: the same items, from the current bucket.
    assert_eq!(due(ledger.clone(), clock.now()).await, expected);
}

/// A ledger on a keyspace of its own (the sweep tests count what its due index holds), on a
/// clock the test moves.
async fn swept_alone() -> (CqlLedger, Arc<ManualClock>, String) {
    skip_if_asked();
    shared_keyspace().await;
    let clock = Arc::new(ManualClock::starting_at(SystemClock.now()));
    let keyspace = keyspace();
    let ledger = CqlLedger::connect_with_clock(config(keyspace.clone()), clock.clone())
        .await
        .expect("connect");
    (ledger, clock, keyspace)
}

/// The largest number of tombstones one read of the keyspace's `due` table scanned lately, as
/// the node itself counts them (`system_views.tombstones_per_read`).
async fn due_tombstones_per_read(ledger: &CqlLedger, keyspace: &str) -> f64 {
    let rows = ledger
        .session()
        .query_unpaged(
            "SELECT max FROM system_views.tombstones_per_read \
             WHERE keyspace_name = ? AND table_name = 'due'",
            (keyspace,),
        )
        .await
        .expect("tombstones per read")
        .into_rows_result()
        .expect("rows");
    rows.maybe_first_row::<(Option<f64>,)>()
        .expect("typed")
        .and_then(|row| row.0)
        .unwrap_or(0.0)
}

/// Files a due entry as a writer would, straight into the table: a stand-in for an entry that
/// lands late (written here, not through the ledger, because the ledger writes its entries
/// before the transition that sets their due time).
async fn file_due_entry(
    ledger: &CqlLedger,
    keyspace: &str,
    command: &Command,
    due_at: sluice_core::time::Timestamp,
    writer_now: sluice_core::time::Timestamp,
) {
    let minute = (due_at.as_millis() / 60_000).max(writer_now.as_millis() / 60_000);
    for shard in 0..4 {
        ledger
            .session()
            .query_unpaged(
                format!(
                    "INSERT INTO {keyspace}.due (minute, shard, due_at, run_id, command_key, \
                     status) VALUES (?, ?, ?, ?, ?, ?)"
                ),
                (
                    minute,
                    shard,
                    due_at.as_millis(),
                    command.run_id.as_str(),
                    command.command_key.to_string(),
                    command.state.status.as_str(),
                ),
            )
            .await
            .expect("file the entry");
    }
}

/// Removes every entry of `command` from the due index, as if its write had not landed yet.
async fn unfile_due_entry(ledger: &CqlLedger, keyspace: &str, command: &Command) {
    let due_at = command.state.due_at.expect("due");
    let minute = due_at.as_millis() / 60_000;
    for shard in 0..4 {
        ledger
            .session()
            .query_unpaged(
                format!(
                    "DELETE FROM {keyspace}.due WHERE minute = ? AND shard = ? AND due_at = ? \
                     AND run_id = ? AND command_key = ?"
                ),
                (
                    minute,
                    shard,
                    due_at.as_millis(),
                    command.run_id.as_str(),
                    command.command_key.to_string(),
                ),
            )
            .await
            .expect("unfile the entry");
    }
}

/// A sweep reads a shard from where its last sweep left off, not from the cursor: the entries
/// it found stale and deleted are not read again (as tombstones) every second for the sweep
/// lag's five minutes. Counted by the node: before the floors, each of these sweeps scanned
/// all 400 tombstones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweep_does_not_read_again_the_tombstones_the_last_one_left() {
    let (ledger, clock, keyspace) = swept_alone().await;
    // 400 entries of commands that do not exist, due 10 s ago and written 10 minutes ago (no
    // transition of theirs can still land): stale, deleted by the first sweep, which leaves
    // 400 tombstones in their bucket.
    const STALE: usize = 400;
    let run = fresh_run("tombstones");
    let due_at = clock.now().plus_millis(-10_000);
    let minute = due_at.as_millis() / 60_000;
    let written_us = clock.now().plus_millis(-600_000).as_millis() * 1_000;
    for i in 0..STALE {
        ledger
            .session()
            .query_unpaged(
                format!(
                    "INSERT INTO {keyspace}.due (minute, shard, due_at, run_id, command_key, \
                     status) VALUES (?, 0, ?, ?, ?, 'PENDING') USING TIMESTAMP ?"
                ),
                (
                    minute,
                    due_at.as_millis(),
                    run.as_str(),
                    format!("gone-{i}"),
                    written_us,
                ),
            )
            .await
            .expect("file");
    }
    let found = ledger.due(clock.now(), 1_000).await.expect("first sweep");
    assert!(found.is_empty(), "nothing is due: {found:?}");
    let after_first = due_tombstones_per_read(&ledger, &keyspace).await;

    // The sweeps of the next five seconds.
    for _ in 0..5 {
        clock.advance(Duration::from_secs(1));
        let found = ledger.due(clock.now(), 1_000).await.expect("sweep");
        assert!(found.is_empty(), "nothing is due: {found:?}");
    }
    let most = due_tombstones_per_read(&ledger, &keyspace).await;
    assert!(
        most < (STALE / 10) as f64,
        "a sweep read {most} tombstones of the {STALE} the first one left (before it: {after_first})"
    );
    let left: i64 = ledger
        .session()
        .query_unpaged(
            format!("SELECT COUNT(*) FROM {keyspace}.due WHERE minute = ? AND shard = 0"),
            (minute,),
        )
        .await
        .expect("count")
        .into_rows_result()
        .expect("rows")
        .first_row::<(i64,)>()
        .expect("row")
        .0;
    // Counted last: this read scans the tombstones too.
    assert_eq!(left, 0, "the first sweep deleted every stale entry");
}

/// An entry that lands after the sweeps have passed its due time (a writer that stalled, a
/// clock behind) is found by the next whole read of its shard, at most 30 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_that_lands_late_is_found_by_the_next_whole_read() {
    let (ledger, clock, keyspace) = swept_alone().await;
    let run = fresh_run("late");
    let late = reserved(&ledger, &run, 0, "email/send").await;
    let due_at = late.state.due_at.expect("due");
    unfile_due_entry(&ledger, &keyspace, &late).await;

    clock.advance(Duration::from_millis(
        u64::try_from(due_at.as_millis() - clock.now().as_millis()).unwrap_or(0) + 20_000,
    ));
    assert!(
        ledger
            .due(clock.now(), 1_000)
            .await
            .expect("sweep")
            .is_empty(),
        "the entry has not landed"
    );
    clock.advance(Duration::from_secs(1));
    let landed = clock.now();
    file_due_entry(&ledger, &keyspace, &late, due_at, landed).await;
    let found_at = swept_within_32_s(&ledger, &clock, &late).await;
    let found_at = found_at.expect("the late entry is found within 32 s of sweeps");
    let waited = found_at.as_millis() - landed.as_millis();
    assert!(waited <= 31_000, "found {waited} ms after it landed");
}

/// A transition's due entry is written before its LWT, so a sweep can read the entry while the
/// LWT is still undecided — an LWT whose outcome was unknown (a node died mid-Paxos) and is
/// settled seconds later — and find the command at its old due time. Deleted as stale then, the
/// entry was gone when the LWT landed: the command waited, due, with nothing in the index to
/// find it (the cluster test's seed 6341616281808031570: a PENDING command due for seven
/// minutes, never swept). A young entry that looks stale is kept, and the next whole read of
/// its shard finds it once the row has its due time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_read_before_its_transition_landed_is_kept_for_it() {
    let (ledger, clock, keyspace) = swept_alone().await;
    let run = fresh_run("undecided");
    let waiting = reserved(&ledger, &run, 0, "email/send").await;
    // The transition's entry, due a second ago, filed before its LWT; the row still holds the
    // reservation's due time.
    let due_at = clock.now().plus_millis(-1_000);
    file_due_entry(&ledger, &keyspace, &waiting, due_at, clock.now()).await;
    let found = ledger.due(clock.now(), 1_000).await.expect("sweep");
    assert!(
        found
            .iter()
            .all(|item| item.command_key != waiting.command_key),
        "not due yet at its old time: {found:?}"
    );
    // The LWT lands.
    ledger
        .session()
        .query_unpaged(
            format!(
                "UPDATE {keyspace}.commands SET due_at = ? WHERE run_id = ? AND command_key = ?"
            ),
            (
                due_at.as_millis(),
                waiting.run_id.as_str(),
                waiting.command_key.to_string(),
            ),
        )
        .await
        .expect("the transition lands");
    let found_at = swept_within_32_s(&ledger, &clock, &waiting).await;
    assert!(
        found_at.is_some(),
        "the command, due since its transition landed, was never swept: its entry was deleted"
    );
}

/// When a sweep, one every second of the clock for 32 seconds, first returns `command`.
async fn swept_within_32_s(
    ledger: &CqlLedger,
    clock: &ManualClock,
    command: &Command,
) -> Option<sluice_core::time::Timestamp> {
    for _ in 0..=31 {
        clock.advance(Duration::from_secs(1));
        let found = ledger.due(clock.now(), 1_000).await.expect("sweep");
        if found
            .iter()
            .any(|item| item.command_key == command.command_key)
        {
            return Some(clock.now());
        }
    }
    None
}

/// A command that stays due (a sweep that cannot act on it) is returned by every sweep, not
/// only by the whole reads: its entry holds the shard's floor back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_still_due_is_returned_by_every_sweep() {
    let (ledger, clock, _) = swept_alone().await;
    let run = fresh_run("stays");
    let waiting = reserved(&ledger, &run, 0, "email/send").await;
    let due_at = waiting.state.due_at.expect("due");
    clock.advance(Duration::from_millis(
        u64::try_from(due_at.as_millis() - clock.now().as_millis()).unwrap_or(0) + 10_000,
    ));
    for sweep in 0..8 {
        let found = ledger.due(clock.now(), 1_000).await.expect("sweep");
        assert_eq!(
            found
                .iter()
                .map(|item| item.command_key.clone())
                .collect::<Vec<_>>(),
            vec![waiting.command_key.clone()],
            "sweep {sweep}"
        );
        clock.advance(Duration::from_secs(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_schema_the_error_says_to_migrate() {
    skip_if_asked();
    shared_keyspace().await;
    let config = CqlConfig {
        migrate_on_start: false,
        ..config(keyspace())
    };
    let err = CqlLedger::connect(config)
        .await
        .expect_err("the keyspace does not exist");
    assert!(err.to_string().contains("sluice migrate"), "{err}");
}

/// Many runs at once, each run's effects one after the other (as the dispatcher handles a
/// run's messages in order): no contention on a run's head, so still 3 LWTs per effect. Prints
/// the rate this machine reached (debug build, one Cassandra node on the same 2 cores).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn effects_across_runs_cost_three_lwts_each() {
    let ledger = Arc::new(connect_shared().await);
    let (runs, per_run) = (32u32, 5u32);
    let before = ledger.stats();
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..runs)
        .map(|_| {
            let ledger = Arc::clone(&ledger);
            tokio::spawn(async move {
                let run = fresh_run("rate");
                for decision in 0..per_run {
                    one_effect(&ledger, &run, decision, "payments/wire", None).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();
    // Per run: 1 + 0 + 1 for every effect (the first one's run taken to be new, no head
    // read; each record written by its LWT; the lease keeps the reservation's due time).
    let plain = u64::from(runs * 2 * per_run);
    let effects = runs * per_run;
    let spent = ledger.stats().since(&before);
    assert_eq!(spent.total_lwt(), u64::from(3 * effects), "{spent:?}");
    assert_eq!(spent.total_plain(), plain, "{spent:?}");
    eprintln!(
        "{effects} effects in {runs} concurrent runs: {:.0} effects/s, {} LWT and {} plain round trips",
        f64::from(effects) / elapsed.as_secs_f64(),
        spent.total_lwt(),
        spent.total_plain()
    );
}

/// A claim whose reservation never landed (its reserver died in between) holds the key only
/// until `orphan_claim_grace_ms`: then the next claimant takes it over, and its command is
/// recorded. Before that, a holder that does exist keeps the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_business_key_is_taken_over_after_the_grace() {
    let ledger = connect_shared_with(|config| config.orphan_claim_grace_ms = 300).await;
    let run = fresh_run("orphan");
    let key = format!("orphan-{run}");
    let tool = sluice_core::ids::ToolName::parse("payments/wire").expect("valid");
    let ghost = sluice_core::ids::CommandKey::parse("d-1/payments/wire/0").expect("valid");
    let claim = ledger
        .claim_business_key(
            &tool,
            &sluice_core::ids::BusinessKey::new(key.clone()),
            &run,
            &ghost,
        )
        .await
        .expect("claim");
    assert_eq!(claim, sluice_ledger::Claim::Claimed);
    let started = std::time::Instant::now();
    let wanted = command_with_key(&run, 2, "payments/wire", 0, json!({}), Some(&key));
    let audit = wanted.reservation_audit("test");
    let created = ledger.reserve(wanted, audit).await.expect("reserve");
    assert!(created.is_created(), "{created:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "waited for the grace"
    );
    // Now the key is held by a command that exists: a third claimant gets it back.
    let third = command_with_key(&run, 3, "payments/wire", 0, json!({}), Some(&key));
    let audit = third.reservation_audit("test");
    match ledger.reserve(third, audit).await.expect("reserve") {
        Reserved::BusinessKeyHeld(holder) => {
            assert_eq!(holder.command_key.to_string(), "d-2/payments/wire/0");
        }
        other => panic!("expected the holder, got {other:?}"),
    }
}

/// A transition that moves a command's due time deletes the old due entry in the batch that
/// inserts its audit record, so the sweep does not meet it stale later (a read and a delete
/// each): an effect that went PENDING → LEASED → CONFIRMED leaves no due entry behind, whether
/// its lease kept the reservation's due time or, leased after it, moved it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_due_time_leaves_no_stale_due_entry() {
    // A keyspace of its own: the contract's due-index check reads the shared one an hour ahead,
    // and carries entries it finds due forward, which this scan would count.
    let ledger = connect_own().await;
    let keyspace = ledger.config().keyspace.clone();
    let run = fresh_run("due-moved");
    let spent = one_effect(&ledger, &run, 0, "payments/wire", None).await;
    assert_eq!(
        plain_by_op(&spent)[1..],
        [0, 1],
        "leased before the reservation's due time, the lease keeps it"
    );
    // Leased after its reservation's due time (a dispatcher 11 s late): the lease moves it.
    // (The times are the machine's; a reservation already due when it was filed would go in
    // another bucket than its due time names, which the writer does not chase: docs/cql.md.)
    let late = command(&run, 1, "payments/wire", 0, json!({}));
    let audit = late.reservation_audit("test");
    let before = ledger.stats();
    let Reserved::Created(reserved) = ledger.reserve(late, audit).await.expect("reserve") else {
        panic!("expected a new command");
    };
    let at = |ms: i64| now().plus_millis(ms);
    let lease = machine::apply(
        &reserved.state,
        &wire_rules(),
        &Event::Lease { owner: "d".into() },
        at(11_000),
    )
    .expect("lease");
    let leased = ledger
        .acquire_lease(Transition::from_step(&reserved, &lease, "d"))
        .await
        .expect("lease write")
        .applied()
        .cloned()
        .expect("lease applied");
    assert_eq!(leased.state.due_at, leased.state.lease.expires_at);
    let done = machine::apply(
        &leased.state,
        &wire_rules(),
        &Event::Dispatched {
            epoch: leased.epoch(),
            sent_at: at(11_000),
            outcome: DispatchOutcome::Committed {
                external_ref: Some("x-2".into()),
                result: None,
            },
        },
        at(12_000),
    )
    .expect("committed");
    assert!(
        ledger
            .finalize(Transition::from_step(&leased, &done, "d"))
            .await
            .expect("finalize")
            .is_applied()
    );
    assert_eq!(
        plain_by_op(&ledger.stats().since(&before))[1..],
        [2, 1],
        "a moved due time: the lease files its entry and deletes the reservation's"
    );
    // Test-only: a scan of the due table for this run.
    let left = ledger
        .session()
        .query_unpaged(
            format!("SELECT due_at FROM {keyspace}.due WHERE run_id = ? ALLOW FILTERING"),
            (run.as_str(),),
        )
        .await
        .expect("due entries")
        .into_rows_result()
        .expect("rows")
        .rows_num();
    assert_eq!(
        left, 0,
        "the reservation's and the lease's due entries are gone"
    );
}

/// A keyspace made before runs could be closed (no `run_closed_at`) gets the column from the
/// migration, keeps its runs, and can then close them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspace_without_run_closed_at_is_migrated_and_keeps_its_runs() {
    let ledger = connect_own().await;
    let keyspace = ledger.config().keyspace.clone();
    let run = fresh_run("migrate-close");
    let c = command(&run, 0, "email/send", 0, json!({}));
    let audit = c.reservation_audit("test");
    ledger.reserve(c, audit).await.expect("reserve");
    ledger
        .session()
        .query_unpaged(
            format!("ALTER TABLE {keyspace}.commands DROP run_closed_at"),
            (),
        )
        .await
        .expect("make it an older keyspace");
    // Migrated by a build of schema 1, which recorded only its one file.
    forget_migrations_from(&ledger, "002").await;
    drop(ledger);

    let ledger = connect(config(keyspace)).await;
    assert_eq!(ledger.list_run(&run, None).await.expect("list").len(), 1);
    let draft = sluice_core::audit::AuditDraft {
        command_key: None,
        from: None,
        to: None,
        actor: "alice".into(),
        reason: "run rollback".into(),
        evidence: json!({}),
    };
    ledger.close_run(&run, draft, now()).await.expect("close");
    let late = command(&run, 1, "email/send", 0, json!({}));
    let audit = late.reservation_audit("test");
    assert!(matches!(
        ledger.reserve(late, audit).await,
        Err(sluice_ledger::LedgerError::RunClosed { .. })
    ));
}

/// A command row that cannot be decoded (damaged JSON, a status this build does not know) is
/// an error naming it for whoever reads it, and is quarantined: the sweep's `due` skips it
/// and still returns the other commands, instead of failing whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_command_is_quarantined_and_skipped_by_the_sweep() {
    let ledger = connect_shared().await;
    let keyspace = ledger.config().keyspace.clone();
    let run = fresh_run("undecodable");
    let mut reserved = Vec::new();
    for decision in 0..3 {
        let c = command(&run, decision, "email/send", 0, json!({}));
        let audit = c.reservation_audit("test");
        reserved.push(
            ledger
                .reserve(c, audit)
                .await
                .expect("reserve")
                .command()
                .clone(),
        );
    }
    let (damaged, unknown, good) = (&reserved[0], &reserved[1], &reserved[2]);
    // Test-only: rows as a bad hand or a newer build might leave them (an LWT, like every
    // write to `commands`).
    for (column, value, c) in [
        ("state", "{\"status\":", damaged),
        ("status", "HIBERNATING", unknown),
    ] {
        ledger
            .session()
            .query_unpaged(
                format!(
                    "UPDATE {keyspace}.commands SET {column} = ? WHERE run_id = ? AND command_key = ? IF status = ?"
                ),
                (value, run.as_str(), c.command_key.as_str(), c.status().as_str()),
            )
            .await
            .expect("damage");
    }
    let fresh = connect_shared().await;
    let later = now().plus_millis(3_600_000);
    let ours = |items: &[sluice_ledger::DueItem]| -> Vec<String> {
        items
            .iter()
            .filter(|item| item.run_id == run)
            .map(|item| item.command_key.to_string())
            .collect()
    };
    let due = fresh.due(later, 100_000).await.expect("due does not fail");
    assert_eq!(
        ours(&due),
        [
            damaged.command_key.to_string(),
            good.command_key.to_string()
        ]
    );
    match fresh.get(&run, &damaged.command_key).await {
        Err(sluice_ledger::LedgerError::UndecodableCommand {
            run_id,
            command_key,
            ..
        }) => assert_eq!(
            (run_id.as_str(), command_key.as_str()),
            (run.as_str(), damaged.command_key.as_str())
        ),
        other => panic!("expected an undecodable command, got {other:?}"),
    }
    let due = fresh.due(later, 100_000).await.expect("due");
    assert_eq!(ours(&due), [good.command_key.to_string()]);
    // The damaged row is quarantined; the row of a status only a newer build knows is left to
    // it, counted apart (not quarantined).
    assert_eq!(fresh.quarantined(), 1, "counted once");
    assert!(fresh.left_for_newer() >= 1);
}
