//! The contract of webhook deliveries: an event is stored once per webhook however often it is
//! enqueued, only due PENDING deliveries come back, and every later write is a compare-and-set
//! on the version (one winner of any race, a stale version never writes).

use std::collections::BTreeMap;
use std::sync::Arc;

use sluice_core::webhook::{Attempt, Delivery, DeliveryStatus, RetryRules, WebhookEvent};

use super::{fresh_run, now};
use crate::Ledger;

/// A webhook name no other check (or concurrent test process) uses.
fn fresh_webhook(label: &str) -> String {
    fresh_run(label).to_string()
}

fn event(id: &str) -> WebhookEvent {
    let mut attributes = BTreeMap::new();
    attributes.insert("id".to_owned(), id.to_owned());
    attributes.insert("type".to_owned(), "dev.sluice.effect.stuck".to_owned());
    attributes.insert("specversion".to_owned(), "1.0".to_owned());
    WebhookEvent {
        attributes,
        content_type: Some("application/json".into()),
        data: r#"{"run_id":"r","note":"ü"}"#.into(),
    }
}

const RULES: RetryRules = RetryRules {
    max_attempts: 2,
    first_backoff_ms: 60_000,
    max_backoff_ms: 60_000,
};

pub async fn webhook_deliveries_are_stored_once_and_come_back_when_due(ledger: Arc<dyn Ledger>) {
    let hook = fresh_webhook("wh-due");
    let other = fresh_webhook("wh-other");
    let at = now();
    let first = Delivery::new(&hook, event("e-1"), at);
    assert!(ledger.webhook_enqueue(&first).await.expect("enqueue"));
    let again = Delivery::new(&hook, event("e-1"), at.plus_millis(5));
    assert!(
        !ledger.webhook_enqueue(&again).await.expect("enqueue again"),
        "the same event for the same webhook is stored once"
    );
    assert!(
        ledger
            .webhook_enqueue(&Delivery::new(&other, event("e-1"), at))
            .await
            .expect("another webhook"),
        "another webhook takes the same event"
    );
    let later = Delivery::new(&hook, event("e-2"), at.plus_millis(10));
    assert!(ledger.webhook_enqueue(&later).await.expect("enqueue"));

    let due = ledger.webhook_due(&hook, at, 10).await.expect("due");
    assert_eq!(due, vec![first.clone()], "only what is due, as stored");
    let due = ledger
        .webhook_due(&hook, at.plus_millis(10), 10)
        .await
        .expect("due");
    let ids: Vec<&str> = due.iter().map(Delivery::id).collect();
    assert_eq!(ids, ["e-1", "e-2"], "earliest first");
    assert_eq!(
        ledger
            .webhook_due(&hook, at.plus_millis(10), 1)
            .await
            .expect("due")
            .len(),
        1,
        "the limit holds"
    );

    // Claimed: held, not due again until the hold ends.
    let claimed = first.claim(at, 30_000).expect("due");
    assert!(ledger.webhook_update(&claimed, 0).await.expect("claim"));
    assert!(
        !ledger
            .webhook_update(&claimed, 0)
            .await
            .expect("claim again"),
        "a stale version never writes"
    );
    let due = ledger
        .webhook_due(&hook, at.plus_millis(10), 10)
        .await
        .expect("due");
    assert_eq!(due.iter().map(Delivery::id).collect::<Vec<_>>(), ["e-2"]);

    // Delivered: never due again, and listed with its answer.
    let delivered = claimed.after_attempt(
        &Attempt::Answered {
            status: 200,
            detail: String::new(),
        },
        at.plus_millis(20),
        &RULES,
        0.5,
    );
    assert!(
        ledger
            .webhook_update(&delivered, 1)
            .await
            .expect("delivered")
    );
    assert!(
        ledger
            .webhook_due(&hook, at.plus_millis(1_000_000), 10)
            .await
            .expect("due")
            .iter()
            .all(|d| d.id() != "e-1")
    );
    let listed = ledger.webhook_list(&hook, 10).await.expect("list");
    assert_eq!(listed.len(), 2);
    let kept = listed.iter().find(|d| d.id() == "e-1").expect("e-1 listed");
    assert_eq!(kept, &delivered, "the delivery as stored, event and all");
    assert_eq!(kept.status, DeliveryStatus::Delivered);
    assert_eq!(
        ledger.webhook_list(&other, 10).await.expect("list").len(),
        1
    );
}

pub async fn sixteen_racing_webhook_claims_have_one_winner(ledger: Arc<dyn Ledger>) {
    let hook = fresh_webhook("wh-race");
    let at = now();
    let delivery = Delivery::new(&hook, event("e-race"), at);
    assert!(ledger.webhook_enqueue(&delivery).await.expect("enqueue"));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (ledger, delivery) = (Arc::clone(&ledger), delivery.clone());
        tasks.push(tokio::spawn(async move {
            let claimed = delivery.claim(at, 30_000).expect("due");
            ledger.webhook_update(&claimed, delivery.version).await
        }));
    }
    let mut winners = 0;
    for task in tasks {
        if task.await.expect("joined").expect("written or refused") {
            winners += 1;
        }
    }
    assert_eq!(winners, 1, "one deliverer sends it");
}
