//! Webhook deliveries on CQL (`sluice_ledger::WebhookStore`), and approval links' uses
//! (`sluice_ledger::LinkStore`, one LWT `IF NOT EXISTS` per use): one partition per webhook, every
//! write an LWT (`IF version = null` for the first, `IF version = ?` after), an unknown outcome
//! settled by a SERIAL read of the LWT's `write_id`; a delivered or failed row rewritten whole
//! with a TTL (docs/cql.md, "Webhook deliveries").

use uuid::Uuid;

use sluice_core::time::Timestamp;
use sluice_core::webhook::{Delivery, DeliveryStatus};
use sluice_ledger::{LedgerError, WEBHOOK_RETENTION_MS};

use super::{CqlLedger, Lwt};
use crate::codec::Fields;
use crate::stats::{Kind, Op};

fn as_bigint(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn decoded(webhook: &str, row: &Fields) -> Option<Delivery> {
    let record = row.text("record")?;
    match serde_json::from_str(record) {
        Ok(delivery) => Some(delivery),
        Err(e) => {
            tracing::warn!(webhook, error = %e, "a stored webhook delivery cannot be read; skipped");
            None
        }
    }
}

impl CqlLedger {
    /// Whether the write `write_id` is the one stored, read at SERIAL (after an LWT whose
    /// outcome is unknown).
    async fn webhook_written(
        &self,
        delivery: &Delivery,
        write_id: Uuid,
    ) -> Result<bool, LedgerError> {
        let rows = self
            .paged(
                Op::Webhook,
                "read webhook delivery",
                &self.inner.st.read_webhook_serial,
                (delivery.webhook.as_str(), delivery.id()),
                Kind::Serial,
            )
            .await?;
        Ok(rows
            .first()
            .is_some_and(|row| row.uuid("write_id") == Some(write_id)))
    }

    /// Settles an LWT's answer: applied, or not, reading the row back when unknown.
    async fn webhook_settled(
        &self,
        answer: Lwt,
        delivery: &Delivery,
        write_id: Uuid,
    ) -> Result<bool, LedgerError> {
        match answer {
            Lwt::Applied => Ok(true),
            Lwt::NotApplied(_) => Ok(false),
            Lwt::Unknown => self.webhook_written(delivery, write_id).await,
        }
    }

    pub(super) async fn put_webhook(&self, delivery: &Delivery) -> Result<bool, LedgerError> {
        let op = Op::Webhook;
        self.inner.stats.call(op);
        let write_id = Uuid::new_v4();
        let record = serde_json::to_string(delivery).unwrap_or_default();
        let answer = self
            .lwt(
                op,
                "enqueue webhook delivery",
                &self.inner.st.enqueue_webhook,
                (
                    as_bigint(delivery.version),
                    delivery.status.as_str(),
                    delivery.next_at.as_millis(),
                    delivery.created_at.as_millis(),
                    record,
                    write_id,
                    delivery.webhook.as_str(),
                    delivery.id(),
                ),
            )
            .await?;
        self.webhook_settled(answer, delivery, write_id).await
    }

    pub(super) async fn cas_webhook(
        &self,
        next: &Delivery,
        expected: u64,
    ) -> Result<bool, LedgerError> {
        let op = Op::Webhook;
        self.inner.stats.call(op);
        let write_id = Uuid::new_v4();
        let record = serde_json::to_string(next).unwrap_or_default();
        // A pending delivery is kept as long as it waits; a settled one for the retention.
        let ttl_s = match next.status {
            DeliveryStatus::Pending => 0,
            DeliveryStatus::Delivered | DeliveryStatus::Failed => {
                i32::try_from(WEBHOOK_RETENTION_MS / 1_000).unwrap_or(i32::MAX)
            }
        };
        let answer = self
            .lwt(
                op,
                "update webhook delivery",
                &self.inner.st.update_webhook,
                (
                    ttl_s,
                    as_bigint(next.version),
                    next.status.as_str(),
                    next.next_at.as_millis(),
                    next.created_at.as_millis(),
                    record,
                    write_id,
                    next.webhook.as_str(),
                    next.id(),
                    as_bigint(expected),
                ),
            )
            .await?;
        self.webhook_settled(answer, next, write_id).await
    }

    pub(super) async fn read_webhook_due(
        &self,
        webhook: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Delivery>, LedgerError> {
        let op = Op::Webhook;
        self.inner.stats.call(op);
        let rows = self
            .paged(
                op,
                "read due webhook deliveries",
                &self.inner.st.due_webhooks,
                (webhook, DeliveryStatus::Pending.as_str(), now.as_millis()),
                Kind::Plain,
            )
            .await?;
        let mut due: Vec<Delivery> = rows.iter().filter_map(|r| decoded(webhook, r)).collect();
        due.sort_by_key(|d| (d.next_at, d.created_at));
        due.truncate(limit);
        Ok(due)
    }

    pub(super) async fn read_webhook_list(
        &self,
        webhook: &str,
        limit: usize,
    ) -> Result<Vec<Delivery>, LedgerError> {
        let op = Op::Webhook;
        self.inner.stats.call(op);
        let rows = self
            .paged(
                op,
                "list webhook deliveries",
                &self.inner.st.list_webhooks,
                (webhook,),
                Kind::Plain,
            )
            .await?;
        let mut listed: Vec<Delivery> = rows.iter().filter_map(|r| decoded(webhook, r)).collect();
        listed.sort_by_key(|d| std::cmp::Reverse(d.created_at));
        listed.truncate(limit);
        Ok(listed)
    }
}

impl CqlLedger {
    /// An approval link's use, by an LWT `IF NOT EXISTS` (`sluice_ledger::LinkStore`); an
    /// unknown outcome is settled by a SERIAL read of the row's `write_id`.
    pub(super) async fn put_link_use(
        &self,
        link_id: &str,
        run_id: &str,
        command_key: &str,
        at: Timestamp,
    ) -> Result<bool, LedgerError> {
        let op = Op::Link;
        self.inner.stats.call(op);
        let write_id = Uuid::new_v4();
        let answer = self
            .lwt(
                op,
                "consume approval link",
                &self.inner.st.consume_link,
                (link_id, run_id, command_key, at.as_millis(), write_id),
            )
            .await?;
        match answer {
            Lwt::Applied => Ok(true),
            Lwt::NotApplied(_) => Ok(false),
            Lwt::Unknown => {
                let rows = self
                    .paged(
                        op,
                        "read approval link use",
                        &self.inner.st.read_link_use_serial,
                        (link_id,),
                        Kind::Serial,
                    )
                    .await?;
                Ok(rows
                    .first()
                    .is_some_and(|row| row.uuid("write_id") == Some(write_id)))
            }
        }
    }
}
