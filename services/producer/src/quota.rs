//! Tenants' quotas of effects in flight, at admission: a submission whose tenant already holds
//! its whole quota (recorded, not yet in a final status) is refused with 429 and `Retry-After`
//! before anything is recorded. The decision is `sluice_core::tenant::admit`; what is in flight
//! is counted by the command gauges (`sluice_runtime::gauges`), which this process's writes move
//! at once, the lifecycle events it watches lower as effects reach a final status, and the
//! ledger is read again every `metrics.command_gauges_refresh_ms` (docs/decisions.md,
//! "Tenants").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::StatusCode;
use serde_json::json;
use sluice_core::command::Command;
use sluice_core::tenant;
use sluice_runtime::config::TenantsConfig;

use crate::{Api, ApiError};

/// The quotas, and the admissions under way: taken before a reservation, counted until the
/// reservation's write is in the gauges, so concurrent submissions of one tenant cannot all
/// pass on the same count.
#[derive(Debug, Default)]
pub(crate) struct Quotas {
    config: TenantsConfig,
    admitting: Mutex<HashMap<Arc<str>, u64>>,
}

/// One admission under way, counted against its tenant until dropped (after the reservation).
#[derive(Debug)]
pub(crate) struct Slot {
    quotas: Arc<Quotas>,
    tenant: Arc<str>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut admitting = self
            .quotas
            .admitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = admitting.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                admitting.remove(&self.tenant);
            }
        }
    }
}

impl Quotas {
    pub(crate) fn new(config: TenantsConfig) -> Self {
        Self {
            config,
            admitting: Mutex::default(),
        }
    }
}

impl Api {
    /// Takes room for `command` in its tenant's quota: `None` when the tenant has none, a
    /// [`Slot`] to hold until the reservation is written, or 429 `tenant_over_quota` naming the
    /// tenant, its quota and what it has in flight. A submission of a command already recorded
    /// (an agent replaying its journal) records nothing new, so it is let through to be
    /// answered as before.
    pub(crate) async fn take_quota(&self, command: &Command) -> Result<Option<Slot>, ApiError> {
        let quotas = &self.quotas;
        let name = command.tenant();
        let Some(quota) = quotas.config.quota_of(name) else {
            return Ok(None);
        };
        let tenant: Arc<str> = command.tenant.clone().unwrap_or_else(|| Arc::from(name));
        let refused = {
            let mut admitting = quotas
                .admitting
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let under_way = admitting.get(&tenant).copied().unwrap_or(0);
            let in_flight = self.ctx.metrics.commands.in_flight(&tenant) + under_way;
            match tenant::admit(
                &tenant,
                in_flight,
                Some(quota),
                quotas.config.retry_after_ms(),
            ) {
                Ok(()) => {
                    *admitting.entry(Arc::clone(&tenant)).or_default() += 1;
                    return Ok(Some(Slot {
                        quotas: Arc::clone(quotas),
                        tenant,
                    }));
                }
                Err(refused) => refused,
            }
        };
        let recorded = self
            .ctx
            .ledger
            .get(&command.run_id, &command.command_key)
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
        if recorded.is_some() {
            return Ok(None);
        }
        self.ctx
            .metrics
            .tenant_refused
            .with_label_values(&[&*tenant])
            .inc();
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "tenant_over_quota",
            refused.to_string(),
        )
        .with_details(json!({
            "tenant": &*refused.tenant,
            "quota": refused.quota,
            "in_flight": refused.in_flight,
            "retry_after_s": refused.retry_after_s,
        })))
    }
}
