//! The contract of a command row a newer build wrote (`crate::stored`): what it added is read
//! past, and a status this build does not know leaves the command to a newer build — neither
//! quarantined nor returned by the sweep, still in the due index.
//!
//! The check needs to write a row as a newer build would, which the [`Ledger`] port cannot:
//! each implementation's test passes a [`NewerWriter`] that writes its own store directly.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::json;

use super::{command, fresh_run, now, reserve_new};
use crate::{Ledger, LedgerError};
use sluice_core::ids::{CommandKey, RunId};

/// Sets a stored command's status (its column and its state JSON) to `status` and adds the
/// field `hibernating_until` to its state, as a newer build writing a status of its own would.
pub type NewerWriter = Box<
    dyn Fn(RunId, CommandKey, &'static str) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

pub async fn a_command_of_a_newer_status_is_left_to_a_newer_build(
    ledger: Arc<dyn Ledger>,
    write_as_newer: NewerWriter,
) {
    let run = fresh_run("newer");
    let newer = reserve_new(&*ledger, command(&run, 0, "email/send", 0, json!({}))).await;
    let good = reserve_new(&*ledger, command(&run, 1, "email/send", 0, json!({}))).await;
    let added = reserve_new(&*ledger, command(&run, 2, "email/send", 0, json!({}))).await;
    write_as_newer(run.clone(), newer.command_key.clone(), "HIBERNATING").await;
    // Only a field added, the status one this build knows.
    write_as_newer(run.clone(), added.command_key.clone(), "PENDING").await;

    match ledger.get(&run, &newer.command_key).await {
        Err(LedgerError::NewerCommand {
            run_id,
            command_key,
            status,
        }) => assert_eq!(
            (run_id.as_str(), command_key.as_str(), status.as_str()),
            (run.as_str(), newer.command_key.as_str(), "HIBERNATING")
        ),
        other => panic!("expected a newer build's command, got {other:?}"),
    }
    let read = ledger
        .get(&run, &added.command_key)
        .await
        .expect("a field a newer build added is read past")
        .expect("the command");
    assert_eq!(read.state.status, added.state.status);
    assert_eq!(read.args_hash, added.args_hash);

    let later = now().plus_millis(3_600_000);
    for _ in 0..2 {
        let due: Vec<CommandKey> = ledger
            .due(later, 100_000)
            .await
            .expect("a newer build's command does not fail the sweep")
            .into_iter()
            .filter(|item| item.run_id == run)
            .map(|item| item.command_key)
            .collect();
        assert!(due.contains(&good.command_key), "{due:?}");
        assert!(!due.contains(&newer.command_key), "{due:?}");
    }
    assert_eq!(ledger.quarantined(), 0, "nothing quarantined");
    assert_eq!(ledger.left_for_newer(), 1, "counted once however often met");
}
