//! The contract of flow controls: a compare-and-set on the version (one winner of any race, a
//! stale version never writes), and every control read back whole.

use std::sync::Arc;

use sluice_core::flow::{Breaker, FlowControl, Pause};

use super::{fresh_run, now};
use crate::{FlowCas, Ledger};

pub async fn flow_controls_are_written_under_their_version_and_read_back_whole(
    ledger: Arc<dyn Ledger>,
) {
    // A name no other check (or concurrent test process) uses.
    let name = fresh_run("flow").to_string().to_ascii_lowercase();
    let paused = FlowControl {
        paused: Some(Pause {
            actor: "ops@example.com".into(),
            reason: "the bank's maintenance window".into(),
            at: now(),
        }),
        ..FlowControl::new(&name)
    };
    let FlowCas::Applied(written) = ledger
        .write_flow_control(0, paused.clone())
        .await
        .expect("write")
    else {
        panic!("a first write with guard 0 applies");
    };
    assert_eq!(written.version, 1);
    // Guard 0 again: it exists now, so the write conflicts and shows what is stored.
    let FlowCas::Conflict(Some(stored)) = ledger
        .write_flow_control(0, FlowControl::new(&name))
        .await
        .expect("write")
    else {
        panic!("a second create conflicts");
    };
    assert_eq!(stored, written);
    let open = FlowControl {
        breaker: Breaker::Open {
            since: now(),
            probe_at: now().plus_millis(30_000),
            opened: 1,
            reason: "5 failures in a row".into(),
        },
        ..written.clone()
    };
    let FlowCas::Applied(opened) = ledger.write_flow_control(1, open).await.expect("write") else {
        panic!("the current version writes");
    };
    assert_eq!(opened.version, 2);
    assert!(matches!(
        ledger.write_flow_control(1, FlowControl::new(&name)).await.expect("write"),
        FlowCas::Conflict(Some(current)) if current == opened
    ));
    let all = ledger.flow_controls().await.expect("read");
    let found = all.iter().find(|c| c.name == name).expect("listed");
    assert_eq!(found, &opened, "read back whole, pause and breaker");
}

pub async fn sixteen_racing_breaker_writers_have_one_winner(ledger: Arc<dyn Ledger>) {
    let name = fresh_run("flow-race").to_string().to_ascii_lowercase();
    let writes = (0..16).map(|i| {
        let ledger = ledger.clone();
        let next = FlowControl {
            breaker: Breaker::HalfOpen {
                since: now(),
                probe_by: format!("dispatcher-{i}"),
                until: now().plus_millis(5_000),
                opened: 1,
            },
            ..FlowControl::new(&name)
        };
        tokio::spawn(async move { ledger.write_flow_control(0, next).await })
    });
    let mut applied = 0;
    for write in writes {
        if matches!(
            write.await.expect("joined").expect("write"),
            FlowCas::Applied(_)
        ) {
            applied += 1;
        }
    }
    assert_eq!(applied, 1, "exactly one probe claim applies");
}
