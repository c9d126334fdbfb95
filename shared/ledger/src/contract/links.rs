//! The contract of approval links' uses: a link id is recorded once, whichever producer asks,
//! and of sixteen racing uses exactly one wins.

use std::sync::Arc;

use sluice_core::ids::CommandKey;

use super::{fresh_run, now};
use crate::Ledger;

fn key() -> CommandKey {
    CommandKey::parse("d-0/payments/pay/0").expect("key")
}

pub async fn an_approval_link_is_used_once(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("link-once");
    let link = format!("{run}-link");
    assert!(
        ledger
            .link_consume(&link, &run, &key(), now())
            .await
            .expect("first use")
    );
    assert!(
        !ledger
            .link_consume(&link, &run, &key(), now())
            .await
            .expect("second use"),
        "a used link was recorded again"
    );
    // Another link on the same command is its own.
    assert!(
        ledger
            .link_consume(&format!("{link}-2"), &run, &key(), now())
            .await
            .expect("another link")
    );
}

pub async fn sixteen_racing_uses_of_one_link_have_one_winner(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("link-race");
    let link = format!("{run}-link");
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (ledger, run, link) = (ledger.clone(), run.clone(), link.clone());
        tasks.push(tokio::spawn(async move {
            ledger.link_consume(&link, &run, &key(), now()).await
        }));
    }
    let mut winners = 0;
    for task in tasks {
        if task.await.expect("task").expect("use") {
            winners += 1;
        }
    }
    assert_eq!(winners, 1, "racing uses of one link");
}
