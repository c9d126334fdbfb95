//! The `[tenants]` section: how many effects each tenant may hold in flight (docs/decisions.md,
//! "Tenants"; docs/operations.md). Which tenants a token may submit for is its own
//! `auth.tokens[].tenants`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::ConfigError;

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    /// Effects a tenant without a quota of its own may hold in flight (recorded and not yet in
    /// a final status); unset: no limit.
    pub default_quota: Option<u64>,
    /// Quotas of named tenants, overriding `default_quota` (0 refuses every new effect of the
    /// tenant).
    pub quotas: BTreeMap<String, u64>,
    /// The `Retry-After` of a submission refused over quota, in milliseconds (rounded up to
    /// whole seconds, at least 1 s). Unset: 1 s.
    pub retry_after_ms: Option<u64>,
}

/// `tenants.retry_after_ms` unless configured.
pub const DEFAULT_QUOTA_RETRY_AFTER_MS: u64 = 1_000;

impl TenantsConfig {
    /// The quota of `tenant`: its own, else the default; `None`: no limit.
    pub fn quota_of(&self, tenant: &str) -> Option<u64> {
        self.quotas.get(tenant).copied().or(self.default_quota)
    }

    /// Whether any tenant has a quota: the producer then counts every tenant's effects in
    /// flight.
    pub fn has_quotas(&self) -> bool {
        self.default_quota.is_some() || !self.quotas.is_empty()
    }

    pub fn retry_after_ms(&self) -> u64 {
        self.retry_after_ms.unwrap_or(DEFAULT_QUOTA_RETRY_AFTER_MS)
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for tenant in self.quotas.keys() {
            sluice_core::tenant::parse(tenant).map_err(|e| ConfigError::Invalid {
                key: format!("tenants.quotas.{tenant}"),
                message: e.to_string(),
            })?;
        }
        if self
            .retry_after_ms
            .is_some_and(|ms| ms > sluice_core::tenant::MAX_RETRY_AFTER_S * 1_000)
        {
            return Err(ConfigError::Invalid {
                key: "tenants.retry_after_ms".into(),
                message: format!(
                    "must be at most {} (an hour)",
                    sluice_core::tenant::MAX_RETRY_AFTER_S * 1_000
                ),
            });
        }
        Ok(())
    }
}
