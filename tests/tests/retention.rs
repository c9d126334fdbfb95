//! Retention end to end (issue 39): the pipeline as `sluice dev` runs it purges a finished run
//! by the reconciler's own schedule — nobody calls purge — and leaves its audit checkpoint,
//! from which the run's chain still verifies. The retention is compressed to seconds with the
//! test-only knob `reconciler.retention_ms`; the schedule and the lease are the production
//! ones (`services/reconciler/tests/retention.rs` covers the lease, a young and an unfinished
//! run, and `retention_days = 0`, on SQLite and Cassandra).

use sluice_core::audit::verify;
use sluice_core::command::CommandStatus;
use sluice_core::ids::RunId;
use sluice_tests::*;
use sluice_upstream::Faults;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_purges_a_finished_run_on_its_schedule_and_keeps_its_checkpoint() {
    let h = Harness::start_with(
        Faults::none(),
        |c| c,
        |config| {
            config.reconciler.retention_ms = Some(1_000);
            config.reconciler.purge_every_ms = 1_000;
        },
    )
    .await;
    let run = "r-retention-1";
    let key = "d-1/email/send/0";
    h.agent
        .submit_created(&effect(
            run,
            1,
            "email/send",
            0,
            email_args("kept a second"),
        ))
        .await;
    let done = h.agent.wait_settled(run, key).await;
    assert_eq!(done.status(), CommandStatus::Confirmed);
    let run_id = RunId::parse(run).expect("valid");
    let head = h
        .ctx()
        .ledger
        .audit_read(&run_id)
        .await
        .expect("chain")
        .entries
        .last()
        .expect("records")
        .hash
        .clone();

    // Gone, by the schedule alone, once a second past its last change.
    eventually("the finished run purged", RECOVERY, || async {
        h.ctx()
            .ledger
            .list_run(&run_id, None)
            .await
            .expect("list")
            .is_empty()
            .then_some(())
    })
    .await;
    let trail = h.ctx().ledger.audit_read(&run_id).await.expect("chain");
    let checkpoint = trail.checkpoint.clone().expect("its checkpoint is kept");
    assert_eq!(checkpoint.last_hash, head);
    verify(&run_id, trail.checkpoint.as_ref(), &trail.entries).expect("verifies after purge");
    // Counted once the purge has reported, a moment after its rows are gone.
    eventually("the purge counted", RECOVERY, || async {
        (h.ctx().metrics.purge.runs.get() >= 1).then_some(())
    })
    .await;
    let text = h.ctx().metrics.render();
    assert!(text.contains("sluice_purged_runs_total"), "{text}");
    h.stop().await;
}
