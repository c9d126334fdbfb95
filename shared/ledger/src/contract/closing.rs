//! The contract of closing a run (a rollback's record): a run is closed once, whoever asks
//! and however many ask at once; asking again writes nothing.

use std::sync::Arc;

use serde_json::json;

use sluice_core::audit::{AuditDraft, verify};

use super::{command, fresh_run, now, reserve_new};
use crate::{Closing, Ledger};

fn rollback(actor: &str) -> AuditDraft {
    AuditDraft {
        command_key: None,
        from: None,
        to: None,
        actor: actor.into(),
        reason: "run rollback: went off the rails".into(),
        evidence: json!({}),
    }
}

/// Eight operators roll one run back at once (a double click, two consoles, a retried
/// request): the run's chain holds one rollback record, not eight.
pub async fn eight_rollbacks_at_once_close_a_run_once(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("close-race");
    reserve_new(&*ledger, command(&run, 1, "email/send", 0, json!({}))).await;
    let closers: Vec<_> = (0..8)
        .map(|i| {
            let (ledger, run) = (Arc::clone(&ledger), run.clone());
            tokio::spawn(async move {
                ledger
                    .close_run(&run, rollback(&format!("operator-{i}")), now())
                    .await
                    .expect("close")
            })
        })
        .collect();
    let mut closed = 0;
    for closer in closers {
        if let Closing::Closed(_) = closer.await.expect("the closer ran") {
            closed += 1;
        }
    }
    assert_eq!(
        closed, 1,
        "one close closed the run; the others found it closed"
    );
    let trail = ledger.audit_read(&run).await.expect("audit");
    verify(&run, None, &trail.entries).expect("verifies");
    let closing: Vec<_> = trail
        .entries
        .iter()
        .filter(|e| e.record.command_key.is_none())
        .collect();
    assert_eq!(
        closing.len(),
        1,
        "one rollback record, whoever won: {:?}",
        trail.entries
    );
}
