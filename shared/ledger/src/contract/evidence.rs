//! The contract of evidence records: an event is stored once per (source, event id) however
//! often, or however many at once, it is put — the put that stored it is told so and every
//! other gets the stored record back — unmatched events are kept like any other, and a source's
//! records are listed newest first. The reference index holds the first command to index a
//! (tool, reference), whoever else puts it, and tells every later put whose it is.

use std::sync::Arc;

use serde_json::json;

use sluice_core::evidence::{Disposition, EvidenceOutcome, EvidenceRecord};
use sluice_core::ids::{CommandKey, IdempotencyKey, ToolName};
use sluice_core::time::Timestamp;

use super::{fresh_run, now};
use crate::Ledger;

fn record(source: &str, event_id: &str, at: Timestamp, disposition: Disposition) -> EvidenceRecord {
    EvidenceRecord {
        source: source.to_owned(),
        event_id: event_id.to_owned(),
        received_at: at,
        disposition,
        idempotency_key: None,
        outcome: None,
        note: "received".into(),
        event: json!({"id": event_id, "note": "ü"}),
    }
}

pub async fn evidence_is_stored_once_per_source_and_event_and_listed_newest_first(
    ledger: Arc<dyn Ledger>,
) {
    let source = fresh_run("ev-src").to_string();
    let other = fresh_run("ev-other").to_string();
    let at = now();
    let first = record(&source, "evt_1", at, Disposition::Received);
    assert_eq!(ledger.evidence_put(&first).await.expect("put"), None);
    let again = record(&source, "evt_1", at.plus_millis(5), Disposition::Received);
    assert_eq!(
        ledger.evidence_put(&again).await.expect("put again"),
        Some(first.clone()),
        "the same event of the same source is stored once; the replay reads the first"
    );
    assert_eq!(
        ledger
            .evidence_put(&record(&other, "evt_1", at, Disposition::Received))
            .await
            .expect("another source"),
        None,
        "another source's event of the same id is another event"
    );
    // Carried out: the record says what was done, and a replay reads that.
    let mut applied = first.clone();
    applied.disposition = Disposition::Applied;
    applied.outcome = Some(EvidenceOutcome::Present);
    applied.idempotency_key = Some("r-1/d-0/payments/charge/0".into());
    applied.note = "UNKNOWN -> CONFIRMED".into();
    ledger.evidence_settle(&applied).await.expect("settle");
    assert_eq!(
        ledger.evidence_put(&again).await.expect("replay"),
        Some(applied.clone())
    );
    // An unmatched event is recorded like any other, and listed.
    let unmatched = record(&source, "evt_2", at.plus_millis(10), Disposition::Unmatched);
    assert_eq!(ledger.evidence_put(&unmatched).await.expect("put"), None);
    let listed = ledger.evidence_list(&source, 10).await.expect("list");
    assert_eq!(listed, vec![unmatched.clone(), applied.clone()]);
    assert_eq!(
        ledger.evidence_list(&source, 1).await.expect("list"),
        vec![unmatched]
    );
}

pub async fn sixteen_racing_puts_of_one_event_store_it_once(ledger: Arc<dyn Ledger>) {
    let source = fresh_run("ev-race").to_string();
    let at = now();
    let mut racers = Vec::new();
    for i in 0..16 {
        let ledger = ledger.clone();
        let mut mine = record(&source, "evt_race", at, Disposition::Received);
        mine.note = format!("racer {i}");
        racers.push(tokio::spawn(async move {
            (ledger.evidence_put(&mine).await.expect("put"), mine)
        }));
    }
    let mut stored = Vec::new();
    let mut seen = Vec::new();
    for racer in racers {
        let (answer, mine) = racer.await.expect("racer");
        match answer {
            None => stored.push(mine),
            Some(found) => seen.push(found),
        }
    }
    assert_eq!(stored.len(), 1, "exactly one put stores the event");
    assert!(
        seen.iter().all(|found| *found == stored[0]),
        "every other put reads the one stored"
    );
}

pub async fn evidence_kept_for_a_command_is_found_by_its_key_until_applied(
    ledger: Arc<dyn Ledger>,
) {
    let source = fresh_run("ev-held").to_string();
    let key = format!("{}/d-1/payments/charge/0", fresh_run("ev-held-cmd"));
    let at = now();
    assert_eq!(ledger.evidence_held(&key).await.expect("held"), vec![]);
    let mut early = record(&source, "evt_early", at, Disposition::Received);
    assert_eq!(ledger.evidence_put(&early).await.expect("put"), None);
    early.disposition = Disposition::Recorded;
    early.idempotency_key = Some(key.clone());
    early.outcome = Some(EvidenceOutcome::Present);
    ledger.evidence_settle(&early).await.expect("settle");
    let mut later = record(
        &source,
        "evt_later",
        at.plus_millis(5),
        Disposition::Received,
    );
    assert_eq!(ledger.evidence_put(&later).await.expect("put"), None);
    later.disposition = Disposition::Recorded;
    later.idempotency_key = Some(key.clone());
    later.outcome = Some(EvidenceOutcome::Failed);
    ledger.evidence_settle(&later).await.expect("settle");
    // An unmatched one names no command; another command's is its own.
    let other = format!("{}/d-1/payments/charge/0", fresh_run("ev-held-other"));
    let mut elsewhere = record(&source, "evt_other", at, Disposition::Received);
    assert_eq!(ledger.evidence_put(&elsewhere).await.expect("put"), None);
    elsewhere.disposition = Disposition::Recorded;
    elsewhere.idempotency_key = Some(other.clone());
    ledger.evidence_settle(&elsewhere).await.expect("settle");

    assert_eq!(
        ledger.evidence_held(&key).await.expect("held"),
        vec![early.clone(), later.clone()],
        "oldest first, only this command's"
    );
    // Applied: no longer held.
    later.disposition = Disposition::Applied;
    ledger.evidence_settle(&later).await.expect("settle");
    assert_eq!(ledger.evidence_held(&key).await.expect("held"), vec![early]);
    assert_eq!(
        ledger.evidence_held(&other).await.expect("held"),
        vec![elsewhere]
    );
}

fn indexed_key(run: &sluice_core::ids::RunId) -> IdempotencyKey {
    IdempotencyKey::new(
        run.clone(),
        CommandKey::parse("d-1/payouts/send/0").expect("a command key"),
    )
}

pub async fn a_reference_is_indexed_to_its_first_command_and_read_back(ledger: Arc<dyn Ledger>) {
    let tool = ToolName::parse("payouts/send").expect("a tool");
    let other_tool = ToolName::parse("payouts/cancel").expect("a tool");
    let reference = format!("job_{}", fresh_run("ref"));
    let first = indexed_key(&fresh_run("ref-first"));
    let second = indexed_key(&fresh_run("ref-second"));
    assert_eq!(
        ledger.reference_get(&tool, &reference).await.expect("get"),
        None,
        "nothing indexed yet"
    );
    assert_eq!(
        ledger
            .reference_put(&tool, &reference, &first)
            .await
            .expect("put"),
        first
    );
    assert_eq!(
        ledger
            .reference_put(&tool, &reference, &first)
            .await
            .expect("put again"),
        first,
        "idempotent for the holder"
    );
    // Another command of the same tool naming the same reference (an upstream that reused an
    // id): the first writer keeps it, and the second is told whose it is.
    assert_eq!(
        ledger
            .reference_put(&tool, &reference, &second)
            .await
            .expect("a second command's put"),
        first,
        "the first writer wins"
    );
    assert_eq!(
        ledger.reference_get(&tool, &reference).await.expect("get"),
        Some(first.clone())
    );
    // The same reference of another tool is another entry.
    assert_eq!(
        ledger
            .reference_put(&other_tool, &reference, &second)
            .await
            .expect("another tool"),
        second
    );
    assert_eq!(
        ledger
            .reference_get(&other_tool, &reference)
            .await
            .expect("get"),
        Some(second)
    );
    assert_eq!(
        ledger
            .reference_get(&tool, &format!("{reference}-other"))
            .await
            .expect("get"),
        None
    );
}

pub async fn sixteen_racing_puts_of_one_reference_index_one_command(ledger: Arc<dyn Ledger>) {
    let tool = ToolName::parse("payouts/send").expect("a tool");
    let reference = format!("job_{}", fresh_run("ref-race"));
    let mut racers = Vec::new();
    for i in 0..16 {
        let (ledger, tool, reference) = (ledger.clone(), tool.clone(), reference.clone());
        let mine = indexed_key(&fresh_run(&format!("ref-racer-{i}")));
        racers.push(tokio::spawn(async move {
            let held = ledger
                .reference_put(&tool, &reference, &mine)
                .await
                .expect("put");
            (held, mine)
        }));
    }
    let mut answers = Vec::new();
    let mut winners = 0;
    for racer in racers {
        let (held, mine) = racer.await.expect("racer");
        if held == mine {
            winners += 1;
        }
        answers.push(held);
    }
    assert_eq!(winners, 1, "exactly one put indexes the reference");
    assert!(
        answers.iter().all(|held| *held == answers[0]),
        "every put is told the one indexed: {answers:?}"
    );
    assert_eq!(
        ledger.reference_get(&tool, &reference).await.expect("get"),
        Some(answers[0].clone())
    );
}
