//! A declared, validated tool: its schema, policy and endpoints, and the state machine's rules
//! derived from them.

use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Number, Value};

use super::args::{ArgsError, Violation, bounded, field_pointer};
use super::endpoint::{DispatchConnector, HttpEndpoint, StatusAnswers};
use super::template::{Template, scalar_text};
use crate::command::EffectSemantics;
use crate::ids::{BusinessKey, ToolName};
use crate::machine::{OnAbsent, Rules};

/// `approve_above`: the command needs approval when this numeric argument exceeds `value`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalThreshold {
    pub field: String,
    pub value: Number,
}

/// A tool's `[tool.policy]`, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    pub requires_approval: bool,
    pub approve_above: Option<ApprovalThreshold>,
    pub max_attempts: u32,
    pub timeout_ms: u64,
    pub max_checks: u32,
    pub max_replays: u32,
    pub settle_ms: u64,
    pub on_absent: OnAbsent,
    pub lease_ttl_ms: u64,
    pub verify_after_commit: bool,
    /// Look a refused dispatch up once more (an upstream that can refuse after booking).
    pub verify_after_refusal: bool,
    /// `None`: the dispatch timeout (known once the dispatch section is read).
    pub late_commit_ms: Option<u64>,
    pub verify_after_ms: u64,
    pub approval_timeout_ms: u64,
    /// How long the upstream remembers an idempotency key (Stripe: about 24 hours). Past it, a
    /// resend of the same key could commit again, so the effect is looked up first, or goes to
    /// a person. `None`: the upstream remembers keys for good.
    pub idempotency_key_ttl_ms: Option<u64>,
    /// The most a command waits in all, per cycle, on answers asking for a later call
    /// (`Retry-After` on a 429 or 503, or a 403) without spending attempts or checks; 0 turns
    /// the waiting off.
    pub max_rate_limited_ms: u64,
    /// Such an answer proves nothing committed: a NON_IDEMPOTENT command is sent again after
    /// the wait without a look first.
    pub rate_limited_commits_nothing: bool,
}

/// A declared tool, validated. Cheap to clone: the compiled schema is shared.
#[derive(Clone)]
pub struct Tool {
    pub(super) name: ToolName,
    pub(super) description: String,
    pub(super) semantics: EffectSemantics,
    pub(super) schema: Value,
    pub(super) validator: Arc<jsonschema::Validator>,
    pub(super) business_key: Option<Template>,
    pub(super) policy: ToolPolicy,
    pub(super) dispatch: DispatchConnector,
    pub(super) status_check: Option<HttpEndpoint>,
    pub(super) status_answers: StatusAnswers,
    pub(super) compensate: Option<HttpEndpoint>,
    /// 4xx answers to a compensation that mean the commit is already undone.
    pub(super) compensate_done_status: Vec<u16>,
    pub(super) allow_unsafe: bool,
    /// The catalog's `max_clock_skew_ms`.
    pub(super) clock_skew_ms: u64,
    /// The upstream whose limits, breaker and pause its calls count against: the one it names,
    /// its dispatch URL's host, or its own name.
    pub(super) upstream: String,
    /// How it came to that upstream.
    pub(super) joins: Joins,
    /// `[tool.money.<field>]`: the money arguments, for display.
    pub(super) money: std::collections::BTreeMap<String, super::money::Money>,
    /// `[tool.events] include_args`: the top-level arguments its events publish.
    pub(super) event_args: Arc<[String]>,
    /// An upstream MCP server's tool: how its calls are made. `None` for an HTTP tool.
    pub(super) mcp: Option<Arc<super::mcp::McpBinding>>,
    /// Its policy rules: its own `[[tool.rule]]`s, then the `[[rule]]`s that cover it.
    pub(super) rules: Arc<[Arc<super::rules::Rule>]>,
    /// `[tool.evidence]`: how a source's signed events settle its effects.
    pub(super) evidence: Option<Arc<crate::evidence::ToolEvidence>>,
    /// `[tool.async]`: accepted now, the outcome by callback or webhook later.
    pub(super) asynchronous: Option<Arc<super::asynchronous::ToolAsync>>,
    /// Its dispatch request names `{callback_url}` (only an asynchronous tool's may).
    pub(super) uses_callback_url: bool,
}

/// How a tool came to its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Joins {
    /// It names a declared `[upstream.<name>]`.
    Named,
    /// It names none: its dispatch URL's host (or its own name when the host is a
    /// placeholder), with the default breaker unless the catalog declares that upstream.
    ByDefault,
    /// It names none and says `breaker = false`: its own, with no limit and no breaker.
    Alone,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The compiled validator is derived from `schema`; printing it adds only noise.
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("description", &self.description)
            .field("semantics", &self.semantics)
            .field("schema", &self.schema)
            .field("business_key", &self.business_key)
            .field("policy", &self.policy)
            .field("dispatch", &self.dispatch)
            .field("status_check", &self.status_check)
            .field("status_answers", &self.status_answers)
            .field("compensate", &self.compensate)
            .field("allow_unsafe", &self.allow_unsafe)
            .field("mcp", &self.mcp)
            .finish_non_exhaustive()
    }
}

impl Tool {
    pub fn name(&self) -> &ToolName {
        &self.name
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn semantics(&self) -> EffectSemantics {
        self.semantics
    }

    /// Where its semantics came from: the catalog, or an MCP server's annotations.
    pub fn semantics_source(&self) -> super::mcp::SemanticsSource {
        self.mcp
            .as_ref()
            .map_or(super::mcp::SemanticsSource::Catalog, |binding| {
                binding.semantics_source
            })
    }

    /// How an upstream MCP server's tool is called; `None` for an HTTP tool. An MCP tool's
    /// endpoints ([`Tool::dispatch`], [`Tool::status_check`], [`Tool::compensate`]) carry its
    /// timeouts and show an `mcp://<server>/<tool>` address; nothing is sent to them.
    pub fn mcp(&self) -> Option<&super::mcp::McpBinding> {
        self.mcp.as_deref()
    }

    /// The JSON Schema of the arguments, as declared.
    pub fn schema(&self) -> &Value {
        &self.schema
    }

    /// Its policy rules, its own first (`crate::policy` combines them).
    pub fn policy_rules(&self) -> &[Arc<super::rules::Rule>] {
        &self.rules
    }

    /// Whether one of the tool's rules reads `budgets`: its evaluation then needs the counters
    /// of the budgets covering the command (`sluice_core::budget::BudgetView`).
    pub fn rules_use_budgets(&self) -> bool {
        self.rules.iter().any(|rule| rule.uses_budgets())
    }

    pub fn business_key_template(&self) -> Option<&Template> {
        self.business_key.as_ref()
    }

    /// The name its calls are limited, broken and paused under (`crate::flow`): a declared
    /// `[upstream.<name>]`, or the tool's own name.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// The top-level arguments its lifecycle events publish (`[tool.events] include_args`,
    /// checked at load: declared in the schema, not marked secret); empty by default.
    pub fn event_args(&self) -> &[String] {
        &self.event_args
    }

    /// The money arguments by field name (`[tool.money.<field>]`), for showing amounts.
    pub fn money(&self) -> &std::collections::BTreeMap<String, super::money::Money> {
        &self.money
    }

    pub fn dispatch(&self) -> &DispatchConnector {
        &self.dispatch
    }

    /// `[tool.evidence]`, if the tool declares one.
    pub fn evidence(&self) -> Option<&crate::evidence::ToolEvidence> {
        self.evidence.as_deref()
    }

    /// Whether its evidence may name its effects by the upstream's reference
    /// (`[tool.evidence] reference_pointer`): then every reference one of its commands stores
    /// is written to the ledger's reference index first. Known at load, so no other tool's
    /// write pays for the index.
    pub fn evidence_by_reference(&self) -> bool {
        self.evidence
            .as_ref()
            .is_some_and(|declared| declared.by_reference())
    }

    /// `[tool.async]`, if the tool declares one.
    pub fn asynchronous(&self) -> Option<&super::asynchronous::ToolAsync> {
        self.asynchronous.as_deref()
    }

    /// Whether its dispatch request names `{callback_url}`: known at load, so only such a
    /// tool's dispatch is given a signed callback URL (`crate::callback`).
    pub fn uses_callback_url(&self) -> bool {
        self.uses_callback_url
    }

    pub fn status_check(&self) -> Option<&HttpEndpoint> {
        self.status_check.as_ref()
    }

    /// How the status check's answers are read (empty when the tool has no status check).
    pub fn status_answers(&self) -> &StatusAnswers {
        &self.status_answers
    }

    /// Every endpoint the tool declares, with its section name.
    pub fn endpoints(&self) -> impl Iterator<Item = (&'static str, &HttpEndpoint)> {
        [
            Some(("dispatch", &self.dispatch.endpoint)),
            self.status_check
                .as_ref()
                .map(|endpoint| ("status_check", endpoint)),
            self.compensate
                .as_ref()
                .map(|endpoint| ("compensate", endpoint)),
        ]
        .into_iter()
        .flatten()
    }

    /// The 4xx statuses a compensation answers when the commit is already undone (a DELETE's
    /// 404): read as done, not as impossible.
    pub fn compensate_done_status(&self) -> &[u16] {
        &self.compensate_done_status
    }

    pub fn compensate(&self) -> Option<&HttpEndpoint> {
        self.compensate.as_ref()
    }

    pub fn allow_unsafe(&self) -> bool {
        self.allow_unsafe
    }

    /// The state machine's rules for this tool: the defaults of its semantics, overridden by
    /// its policy and by which connectors it declares.
    pub fn rules(&self) -> Rules {
        let defaults = Rules::defaults(self.semantics);
        let millis = |ms: u64| i64::try_from(ms).unwrap_or(i64::MAX);
        // The sweep redoes a compensation that outlives this: twice the call's own timeout
        // leaves room for one whole call, and no more, so a crash delays it only that long.
        let compensation_timeout_ms = self
            .compensate
            .as_ref()
            .map_or(defaults.compensation_timeout_ms, |endpoint| {
                millis(endpoint.timeout_ms).saturating_mul(2).max(1_000)
            });
        Rules {
            max_attempts: self.policy.max_attempts,
            max_checks: self.policy.max_checks,
            max_replays: self.policy.max_replays,
            has_status_check: self.status_check.is_some(),
            has_compensate: self.compensate.is_some(),
            on_absent: self.policy.on_absent,
            settle_ms: millis(self.policy.settle_ms),
            lease_ttl_ms: millis(self.policy.lease_ttl_ms),
            dispatch_timeout_ms: millis(self.dispatch.endpoint.timeout_ms),
            compensation_timeout_ms,
            verify_after_commit: self.policy.verify_after_commit && self.status_check.is_some(),
            verify_after_refusal: self.policy.verify_after_refusal && self.status_check.is_some(),
            late_commit_ms: millis(
                self.policy
                    .late_commit_ms
                    .unwrap_or(self.dispatch.endpoint.timeout_ms),
            ),
            verify_after_ms: millis(self.policy.verify_after_ms),
            clock_skew_ms: millis(self.clock_skew_ms),
            approval_timeout_ms: millis(self.policy.approval_timeout_ms),
            idempotency_key_ttl_ms: self.policy.idempotency_key_ttl_ms.map(millis),
            max_rate_limited_ms: millis(self.policy.max_rate_limited_ms),
            rate_limited_commits_nothing: self.policy.rate_limited_commits_nothing,
            async_deadline_ms: self
                .asynchronous
                .as_ref()
                .map(|declared| millis(declared.deadline_ms)),
            async_escalate: self
                .asynchronous
                .as_ref()
                .is_some_and(|declared| declared.then == super::asynchronous::AtDeadline::Escalate),
            ..defaults
        }
    }

    /// Checks `args` against the tool's schema, listing every violation.
    pub fn validate_args(&self, args: &Value) -> Result<(), ArgsError> {
        let violations: Vec<Violation> = self
            .validator
            .iter_errors(args)
            .map(|error| Violation {
                pointer: error.instance_path().to_string(),
                message: bounded(error.to_string()),
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ArgsError { violations })
        }
    }

    /// Renders the business key from `args`, or `None` when the tool declares no template.
    pub fn business_key(&self, args: &Value) -> Result<Option<BusinessKey>, ArgsError> {
        let Some(template) = &self.business_key else {
            return Ok(None);
        };
        let key = template.render(|field, out| {
            let value = args.get(field).ok_or_else(|| {
                ArgsError::one(
                    field_pointer(field),
                    format!("business_key needs field {field}, which is missing"),
                )
            })?;
            let text = scalar_text(value).map_err(|kind| {
                ArgsError::one(
                    field_pointer(field),
                    format!("business_key needs field {field} as a string, number or boolean, not {kind}"),
                )
            })?;
            out.push_str(&text);
            Ok(())
        })?;
        Ok(Some(BusinessKey::new(key)))
    }
}
