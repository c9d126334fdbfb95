//! The stores a [`GaugedLedger`] passes through untouched: only `CommandStore`'s writes move a
//! command's status, so every other store of the ledger is the inner ledger's, call for call.

use async_trait::async_trait;
use sluice_core::audit::{AuditDraft, AuditEntry};
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_ledger::{
    AuditStore, AuditTrail, DueItem, LedgerError, Member, ShardCas, ShardLease, ShardStore,
    SweepView,
};

use super::GaugedLedger;

#[async_trait]
impl AuditStore for GaugedLedger {
    async fn audit_append(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<AuditEntry, LedgerError> {
        self.inner.audit_append(run_id, draft, at).await
    }

    async fn audit_read(&self, run_id: &RunId) -> Result<AuditTrail, LedgerError> {
        self.inner.audit_read(run_id).await
    }
}

#[async_trait]
impl ShardStore for GaugedLedger {
    async fn due(&self, now: Timestamp, limit: usize) -> Result<Vec<DueItem>, LedgerError> {
        self.inner.due(now, limit).await
    }

    fn due_shards(&self) -> u32 {
        self.inner.due_shards()
    }

    async fn due_in(
        &self,
        now: Timestamp,
        limit: usize,
        shards: &[u32],
    ) -> Result<Vec<DueItem>, LedgerError> {
        self.inner.due_in(now, limit, shards).await
    }

    async fn sweep_view(&self, group: &str, shards: u32) -> Result<SweepView, LedgerError> {
        self.inner.sweep_view(group, shards).await
    }

    async fn write_shard_lease(
        &self,
        group: &str,
        guard: Option<u64>,
        next: ShardLease,
    ) -> Result<ShardCas, LedgerError> {
        self.inner.write_shard_lease(group, guard, next).await
    }

    async fn announce(&self, group: &str, member: Member) -> Result<(), LedgerError> {
        self.inner.announce(group, member).await
    }
}

#[async_trait]
impl sluice_ledger::FlowStore for GaugedLedger {
    async fn flow_controls(&self) -> Result<Vec<sluice_core::flow::FlowControl>, LedgerError> {
        self.inner.flow_controls().await
    }

    async fn write_flow_control(
        &self,
        guard: u64,
        next: sluice_core::flow::FlowControl,
    ) -> Result<sluice_ledger::FlowCas, LedgerError> {
        self.inner.write_flow_control(guard, next).await
    }
}

#[async_trait]
impl sluice_ledger::LinkStore for GaugedLedger {
    async fn link_consume(
        &self,
        link_id: &str,
        run_id: &RunId,
        command_key: &CommandKey,
        at: Timestamp,
    ) -> Result<bool, LedgerError> {
        self.inner
            .link_consume(link_id, run_id, command_key, at)
            .await
    }
}

#[async_trait]
impl sluice_ledger::WebhookStore for GaugedLedger {
    async fn webhook_enqueue(
        &self,
        delivery: &sluice_core::webhook::Delivery,
    ) -> Result<bool, LedgerError> {
        self.inner.webhook_enqueue(delivery).await
    }

    async fn webhook_due(
        &self,
        webhook: &str,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<sluice_core::webhook::Delivery>, LedgerError> {
        self.inner.webhook_due(webhook, now, limit).await
    }

    async fn webhook_update(
        &self,
        next: &sluice_core::webhook::Delivery,
        expected: u64,
    ) -> Result<bool, LedgerError> {
        self.inner.webhook_update(next, expected).await
    }

    async fn webhook_list(
        &self,
        webhook: &str,
        limit: usize,
    ) -> Result<Vec<sluice_core::webhook::Delivery>, LedgerError> {
        self.inner.webhook_list(webhook, limit).await
    }
}

#[async_trait]
impl sluice_ledger::EvidenceStore for GaugedLedger {
    async fn evidence_put(
        &self,
        record: &sluice_core::evidence::EvidenceRecord,
    ) -> Result<Option<sluice_core::evidence::EvidenceRecord>, LedgerError> {
        self.inner.evidence_put(record).await
    }

    async fn evidence_settle(
        &self,
        record: &sluice_core::evidence::EvidenceRecord,
    ) -> Result<(), LedgerError> {
        self.inner.evidence_settle(record).await
    }

    async fn evidence_held(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<sluice_core::evidence::EvidenceRecord>, LedgerError> {
        self.inner.evidence_held(idempotency_key).await
    }

    async fn evidence_list(
        &self,
        source: &str,
        limit: usize,
    ) -> Result<Vec<sluice_core::evidence::EvidenceRecord>, LedgerError> {
        self.inner.evidence_list(source, limit).await
    }

    async fn reference_put(
        &self,
        tool: &sluice_core::ids::ToolName,
        reference: &str,
        key: &sluice_core::ids::IdempotencyKey,
    ) -> Result<sluice_core::ids::IdempotencyKey, LedgerError> {
        self.inner.reference_put(tool, reference, key).await
    }

    async fn reference_get(
        &self,
        tool: &sluice_core::ids::ToolName,
        reference: &str,
    ) -> Result<Option<sluice_core::ids::IdempotencyKey>, LedgerError> {
        self.inner.reference_get(tool, reference).await
    }
}

#[async_trait]
impl sluice_ledger::BudgetStore for GaugedLedger {
    async fn budget_hold(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Held, LedgerError> {
        self.inner
            .budget_hold(run_id, command_key, tag, lines, mode)
            .await
    }

    async fn budget_rehold(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Held, LedgerError> {
        self.inner
            .budget_rehold(run_id, command_key, tag, lines, mode)
            .await
    }

    async fn budget_supersede(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        keep: &str,
    ) -> Result<(), LedgerError> {
        self.inner.budget_supersede(run_id, command_key, keep).await
    }

    async fn budget_unhold(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        tag: &str,
    ) -> Result<(), LedgerError> {
        self.inner.budget_unhold(run_id, command_key, tag).await
    }

    async fn reserve_held(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Budgeted, LedgerError> {
        let budgeted = self
            .inner
            .reserve_held(command, audit, confined, tag, lines, mode)
            .await?;
        if let sluice_ledger::Budgeted::Recorded { reserved, .. } = &budgeted {
            self.reserved(reserved);
        }
        Ok(budgeted)
    }

    async fn budget_counters(
        &self,
        budget: &str,
        window_start: i64,
    ) -> Result<Vec<sluice_core::budget::BudgetCounter>, LedgerError> {
        self.inner.budget_counters(budget, window_start).await
    }

    async fn budget_used_by_others(
        &self,
        run_id: &RunId,
        command_key: &sluice_core::ids::CommandKey,
        counters: &[String],
    ) -> Result<Vec<i64>, LedgerError> {
        self.inner
            .budget_used_by_others(run_id, command_key, counters)
            .await
    }
}
