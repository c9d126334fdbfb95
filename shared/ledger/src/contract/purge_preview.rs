//! The contract of a purge's dry run: the runs, counts and checkpoints a purge would remove
//! and leave, with nothing written — not the runs' removal, not the purge's own record.

use std::sync::Arc;

use serde_json::json;

use super::{command_with_key, committed, fresh_run, lease, now, reserve_new, step};
use crate::{Ledger, SYSTEM_RUN};
use sluice_core::ids::RunId;

pub async fn a_dry_run_purge_reports_what_a_purge_would_remove_and_removes_nothing(
    ledger: Arc<dyn Ledger>,
) {
    let done = fresh_run("preview-done");
    let key = format!("preview-{done}");
    let finished = reserve_new(
        &*ledger,
        command_with_key(&done, 0, "payments/wire", 0, json!({}), Some(&key)),
    )
    .await;
    let leased = lease(&*ledger, &finished, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    ledger
        .finalize(step(&leased, committed(leased.epoch(), json!({}))))
        .await
        .expect("write");
    let before = ledger.audit_read(&done).await.expect("audit");
    let system = RunId::parse(SYSTEM_RUN).expect("valid");
    let system_before = ledger.audit_read(&system).await.expect("audit");

    let cutoff = now().plus_millis(1_000);
    let preview = ledger
        .purge(cutoff, 10_000, "retention", now(), true)
        .await
        .expect("dry run");
    assert!(preview.dry_run, "{preview:?}");
    let predicted = preview
        .checkpoints
        .iter()
        .find(|c| c.run_id == done)
        .expect("the finished run would be purged")
        .clone();
    assert_eq!(
        (predicted.last_hash.as_str(), predicted.count),
        (
            before.entries.last().expect("records").hash.as_str(),
            before.entries.len() as u64
        )
    );
    assert!(preview.runs >= 1 && preview.commands >= 1 && preview.business_keys >= 1);

    // Nothing moved: the command, its chain, and no purge recorded in the ledger's chain.
    assert!(
        ledger
            .get(&done, &finished.command_key)
            .await
            .expect("get")
            .is_some()
    );
    assert_eq!(ledger.audit_read(&done).await.expect("audit"), before);
    let system_after = ledger.audit_read(&system).await.expect("audit");
    assert!(
        !system_after
            .entries
            .iter()
            .any(|e| e.record.evidence.to_string().contains(done.as_str())),
        "a dry run records nothing"
    );
    assert!(system_after.entries.len() >= system_before.entries.len());

    // The purge then leaves the checkpoint the dry run predicted.
    for _ in 0..100 {
        let report = ledger
            .purge(cutoff, 10_000, "retention", now(), false)
            .await
            .expect("purge");
        assert!(!report.dry_run);
        if let Some(left) = report.checkpoints.iter().find(|c| c.run_id == done) {
            assert_eq!(
                (left.last_hash.as_str(), left.count),
                (predicted.last_hash.as_str(), predicted.count)
            );
            return;
        }
        assert!(report.runs > 0, "our finished run was not purged");
    }
    panic!("the finished run was never purged");
}
