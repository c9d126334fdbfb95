//! The writer's webhook-delivery operations: an insert if absent, and a compare-and-set on the
//! delivery's version. Delivered and failed deliveries past the retention are deleted by the
//! next insert for their webhook. Also an approval link's use, an insert if absent.

use rusqlite::params;

use sluice_core::webhook::{Delivery, DeliveryStatus};

use super::Writer;
use crate::WEBHOOK_RETENTION_MS;

fn version(delivery: &Delivery) -> i64 {
    i64::try_from(delivery.version).unwrap_or(i64::MAX)
}

fn record(delivery: &Delivery) -> String {
    serde_json::to_string(delivery).unwrap_or_default()
}

impl Writer {
    /// Records an approval link's use unless it was; whether this call recorded it.
    pub(super) fn link_consume(
        &mut self,
        link_id: &str,
        run_id: &str,
        command_key: &str,
        at: i64,
    ) -> Result<bool, rusqlite::Error> {
        Ok(self
            .conn
            .prepare_cached(
                "INSERT INTO approval_link_uses (link_id, run_id, command_key, used_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT (link_id) DO NOTHING",
            )?
            .execute(params![link_id, run_id, command_key, at])?
            == 1)
    }

    pub(super) fn webhook_enqueue(&mut self, delivery: &Delivery) -> Result<bool, rusqlite::Error> {
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO webhook_deliveries \
                 (webhook, event_id, version, status, next_at, created_at, record) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (webhook, event_id) DO NOTHING",
            )?
            .execute(params![
                delivery.webhook,
                delivery.id(),
                version(delivery),
                delivery.status.as_str(),
                delivery.next_at.as_millis(),
                delivery.created_at.as_millis(),
                record(delivery),
            ])?;
        let horizon = delivery.created_at.as_millis() - WEBHOOK_RETENTION_MS;
        for done in [DeliveryStatus::Delivered, DeliveryStatus::Failed] {
            self.conn
                .prepare_cached(
                    "DELETE FROM webhook_deliveries \
                     WHERE webhook = ?1 AND status = ?2 AND next_at < ?3",
                )?
                .execute(params![delivery.webhook, done.as_str(), horizon])?;
        }
        Ok(inserted == 1)
    }

    pub(super) fn webhook_update(
        &mut self,
        next: &Delivery,
        expected: u64,
    ) -> Result<bool, rusqlite::Error> {
        let updated = self
            .conn
            .prepare_cached(
                "UPDATE webhook_deliveries SET version = ?3, status = ?4, next_at = ?5, \
                 record = ?6 WHERE webhook = ?1 AND event_id = ?2 AND version = ?7",
            )?
            .execute(params![
                next.webhook,
                next.id(),
                version(next),
                next.status.as_str(),
                next.next_at.as_millis(),
                record(next),
                i64::try_from(expected).unwrap_or(i64::MAX),
            ])?;
        Ok(updated == 1)
    }
}
