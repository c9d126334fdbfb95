//! The embedded ledger's webhook deliveries (`crate::WebhookStore`) and approval links' uses
//! (`crate::LinkStore`, one insert-if-absent through the writer): reads on a pooled read
//! connection, writes through the writer (`writer/webhooks.rs`). A row that cannot be decoded
//! is skipped with a warning rather than stopping its webhook's other deliveries.

use async_trait::async_trait;
use rusqlite::params;

use sluice_core::time::Timestamp;
use sluice_core::webhook::{Delivery, DeliveryStatus};

use super::SqliteLedger;
use super::schema::map_err;
use super::writer::{Op, Reply};
use crate::{LedgerError, WebhookStore};

fn decoded(webhook: &str, record: &str) -> Option<Delivery> {
    match serde_json::from_str(record) {
        Ok(delivery) => Some(delivery),
        Err(e) => {
            tracing::warn!(webhook, error = %e, "a stored webhook delivery cannot be read; skipped");
            None
        }
    }
}

impl SqliteLedger {
    async fn webhook_rows(
        &self,
        op: &'static str,
        sql: &'static str,
        webhook: &str,
        bound: i64,
        limit: usize,
    ) -> Result<Vec<Delivery>, LedgerError> {
        let (path, config) = (self.inner.path.clone(), self.inner.config.clone());
        let webhook = webhook.to_owned();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(op, move |conn| {
            let failed = |e| map_err(e, op, &path, &config);
            let mut stmt = conn.prepare_cached(sql).map_err(failed)?;
            let records = stmt
                .query_map(params![webhook, bound, limit], |row| {
                    row.get::<_, String>(0)
                })
                .map_err(failed)?
                .collect::<Result<Vec<String>, _>>()
                .map_err(failed)?;
            Ok(records
                .iter()
                .filter_map(|record| decoded(&webhook, record))
                .collect())
        })
        .await
    }

    async fn webhook_write(&self, op: Op) -> Result<bool, LedgerError> {
        match self.submit(op).await?.result? {
            Reply::Webhook(applied) => Ok(applied),
            _ => Err(LedgerError::Closed),
        }
    }
}

#[async_trait]
impl crate::LinkStore for SqliteLedger {
    async fn link_consume(
        &self,
        link_id: &str,
        run_id: &sluice_core::ids::RunId,
        command_key: &sluice_core::ids::CommandKey,
        at: Timestamp,
    ) -> Result<bool, LedgerError> {
        self.webhook_write(Op::LinkConsume {
            link_id: link_id.to_owned(),
            run_id: run_id.to_string(),
            command_key: command_key.to_string(),
            at: at.as_millis(),
        })
        .await
    }
}

#[async_trait]
impl WebhookStore for SqliteLedger {
    async fn webhook_enqueue(&self, delivery: &Delivery) -> Result<bool, LedgerError> {
        self.webhook_write(Op::WebhookEnqueue(Box::new(delivery.clone())))
            .await
    }

    async fn webhook_due(
        &self,
        webhook: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Delivery>, LedgerError> {
        const DUE: &str = "SELECT record FROM webhook_deliveries \
             WHERE webhook = ?1 AND status = 'PENDING' AND next_at <= ?2 \
             ORDER BY next_at LIMIT ?3";
        debug_assert_eq!(DeliveryStatus::Pending.as_str(), "PENDING");
        self.webhook_rows("webhook_due", DUE, webhook, now.as_millis(), limit)
            .await
    }

    async fn webhook_update(&self, next: &Delivery, expected: u64) -> Result<bool, LedgerError> {
        self.webhook_write(Op::WebhookUpdate {
            next: Box::new(next.clone()),
            expected,
        })
        .await
    }

    async fn webhook_list(
        &self,
        webhook: &str,
        limit: usize,
    ) -> Result<Vec<Delivery>, LedgerError> {
        const LIST: &str = "SELECT record FROM webhook_deliveries \
             WHERE webhook = ?1 AND created_at >= ?2 ORDER BY created_at DESC LIMIT ?3";
        self.webhook_rows("webhook_list", LIST, webhook, i64::MIN, limit)
            .await
    }
}
