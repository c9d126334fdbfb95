//! The catalog's TOML as written, before validation: serde shapes with unknown keys refused.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::endpoint::HttpMethod;
use super::shape::ContentType;
use super::tool::ApprovalThreshold;
use crate::command::EffectSemantics;
use crate::machine::OnAbsent;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCatalog {
    pub(super) default_namespace: Option<String>,
    pub(super) policy_version: Option<String>,
    pub(super) max_replays_per_run: Option<u32>,
    pub(super) max_clock_skew_ms: Option<u64>,
    #[serde(default)]
    pub(super) credentials: BTreeMap<String, toml::Table>,
    #[serde(default)]
    pub(super) variables: BTreeMap<String, super::variables::RawVariable>,
    /// `[upstream.<name>]`, each read on its own so its errors name it.
    #[serde(default)]
    pub(super) upstream: BTreeMap<String, toml::Table>,
    /// Kept as tables so each entry is deserialized on its own and its errors name the tool.
    #[serde(default)]
    pub(super) tool: Vec<toml::Table>,
    /// `[mcp_servers.<name>]`, each read on its own so its errors name it.
    #[serde(default)]
    pub(super) mcp_servers: BTreeMap<String, toml::Table>,
    /// `[[rule]]`: catalog-wide policy rules, each read on its own so its errors name it.
    #[serde(default)]
    pub(super) rule: Vec<toml::Table>,
    /// `[budgets.<name>]`: spend budgets, each read on its own so its errors name it.
    #[serde(default)]
    pub(super) budgets: BTreeMap<String, toml::Table>,
    /// `[evidence_sources.<name>]`: signed webhooks' sources, each read on its own so its
    /// errors name it.
    #[serde(default)]
    pub(super) evidence_sources: BTreeMap<String, toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTool {
    pub(super) name: String,
    #[serde(default)]
    pub(super) description: String,
    pub(super) semantics: EffectSemantics,
    pub(super) business_key: Option<String>,
    /// The `[upstream.<name>]` whose limits and breaker the tool's calls count against.
    pub(super) upstream: Option<String>,
    /// `false`: the tool (naming no upstream) is its own, with no circuit breaker.
    pub(super) breaker: Option<bool>,
    #[serde(default)]
    pub(super) allow_unsafe: bool,
    pub(super) schema: Option<toml::Table>,
    pub(super) schema_file: Option<String>,
    #[serde(default)]
    pub(super) policy: RawPolicy,
    pub(super) dispatch: Option<RawEndpoint>,
    pub(super) status_check: Option<RawEndpoint>,
    pub(super) compensate: Option<RawEndpoint>,
    pub(super) credential: Option<OneOrMany>,
    /// `[tool.money.<field>]`: how a money argument is shown to people.
    #[serde(default)]
    pub(super) money: BTreeMap<String, super::money::Money>,
    /// `[tool.events]`: what its lifecycle events publish beyond the fixed projection.
    #[serde(default)]
    pub(super) events: super::events::RawEvents,
    /// `[[tool.rule]]`: the tool's own policy rules.
    #[serde(default)]
    pub(super) rule: Vec<toml::Table>,
    /// `[tool.evidence]`: the signed webhooks that say what became of its effects.
    pub(super) evidence: Option<super::evidence::RawToolEvidence>,
    /// `[tool.async]`: an upstream that accepts now and tells the outcome later.
    #[serde(rename = "async")]
    pub(super) asynchronous: Option<super::asynchronous::RawAsync>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    #[serde(default)]
    pub(super) requires_approval: bool,
    pub(super) approve_above: Option<ApprovalThreshold>,
    pub(super) max_attempts: Option<u32>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) max_checks: Option<u32>,
    pub(super) max_replays: Option<u32>,
    pub(super) settle_ms: Option<u64>,
    pub(super) on_absent: Option<OnAbsent>,
    pub(super) lease_ttl_ms: Option<u64>,
    #[serde(default)]
    pub(super) verify_after_commit: bool,
    #[serde(default)]
    pub(super) verify_after_refusal: bool,
    pub(super) late_commit_ms: Option<u64>,
    pub(super) verify_after_ms: Option<u64>,
    pub(super) approval_timeout_ms: Option<u64>,
    pub(super) idempotency_key_ttl_ms: Option<u64>,
    pub(super) max_rate_limited_ms: Option<u64>,
    #[serde(default)]
    pub(super) rate_limited_commits_nothing: bool,
}

/// One endpoint section as written. The keys of every section are read here; those that apply
/// to one section only (the dispatch's reference and in-progress statuses, the status check's
/// answer reading) are refused elsewhere by `build_tool`, with an error naming the section.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEndpoint {
    pub(super) url: String,
    pub(super) method: Option<HttpMethod>,
    pub(super) timeout_ms: Option<u64>,
    pub(super) content_type: Option<ContentType>,
    pub(super) body: Option<toml::Value>,
    #[serde(default)]
    pub(super) headers: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) query: BTreeMap<String, String>,
    pub(super) idempotency_header: Option<String>,
    pub(super) credential: Option<OneOrMany>,
    // dispatch (reference_pointer also on status_check)
    pub(super) reference_pointer: Option<String>,
    pub(super) reference_header: Option<String>,
    pub(super) in_progress_status: Option<Vec<u16>>,
    pub(super) require_reference: Option<bool>,
    // status_check
    pub(super) absent_status: Option<Vec<u16>>,
    pub(super) duplicate_status: Option<Vec<u16>>,
    pub(super) matches: Option<String>,
    pub(super) match_reference_pointer: Option<String>,
    pub(super) count: Option<String>,
    pub(super) match_where: Option<BTreeMap<String, String>>,
    // compensate
    pub(super) done_status: Option<Vec<u16>>,
}

/// A credential name, or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub(super) fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(name) => vec![name],
            Self::Many(names) => names,
        }
    }
}

/// A deserialization error as `path: message`; the toml crate keeps the path only in Display.
pub(super) fn describe(error: &toml::de::Error) -> String {
    let shown = error.to_string();
    let path = shown
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("in `")?.strip_suffix('`'));
    let message = error.message().trim_end();
    match path {
        Some(path) => format!("{path}: {message}"),
        None => message.to_owned(),
    }
}
