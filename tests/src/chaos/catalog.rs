//! The runner's tools, one per shape, and the files `sluice dev` is started with.
//!
//! Each tool is a shape the guarantees treat differently: the three semantics, a business key
//! or not, a status check or not, a compensate or not, approval, a tight lease. The catalog and
//! the configuration are written into the run's directory (the catalog pointing at the
//! runner's upstream) and validated here with the same parser the services use, so a mistake
//! is the runner's and is reported before anything starts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sluice_core::catalog::Catalog;
use sluice_core::command::EffectSemantics;
use toml::{Table, Value};

use super::upstream::record::LookupBy;
use super::upstream::{EndpointSpec, FaultTimes, KeyHandling};

/// The tools the runner declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// NON_IDEMPOTENT wire: business key, status check by it, compensate, approval above an
    /// amount, verify after commit.
    Wire,
    /// NON_IDEMPOTENT transfer: no business key, status check by idempotency key, compensate,
    /// a lease just longer than the call.
    Transfer,
    /// NON_IDEMPOTENT payout: business key and compensate, no status check (an ambiguous
    /// outcome goes to a person).
    Payout,
    /// NON_IDEMPOTENT refund: business key, status check, no compensate, `on_absent = "fail"`.
    Refund,
    /// IDEMPOTENT ticket at an honest upstream: no status check (retried with its key),
    /// compensate, in-progress 409, a tight lease.
    Ticket,
    /// IDEMPOTENT case at an honest upstream: status check, compensate, always approved first.
    Case,
    /// IDEMPOTENT email at an honest upstream: nothing to look up or undo.
    Email,
    /// IDEMPOTENT SMS at an upstream that ignores idempotency keys: status check, compensate,
    /// verify after commit.
    Sms,
    /// OBSERVE_ONLY search.
    Search,
}

impl ToolKind {
    pub const ALL: [Self; 9] = [
        Self::Wire,
        Self::Transfer,
        Self::Payout,
        Self::Refund,
        Self::Ticket,
        Self::Case,
        Self::Email,
        Self::Sms,
        Self::Search,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Wire => "bank/wire",
            Self::Transfer => "bank/transfer",
            Self::Payout => "bank/payout",
            Self::Refund => "bank/refund",
            Self::Ticket => "tickets/open",
            Self::Case => "crm/case",
            Self::Email => "email/send",
            Self::Sms => "sms/send",
            Self::Search => "search/query",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The upstream endpoint behind the tool.
    /// The `[upstream.<name>]` the tool's calls count against: the bank's four share a
    /// circuit breaker, the mail and SMS tools a rate.
    pub fn upstream(self) -> Option<&'static str> {
        match self {
            Self::Wire | Self::Transfer | Self::Payout | Self::Refund => Some("bank"),
            Self::Email | Self::Sms => Some("messaging"),
            Self::Ticket | Self::Case | Self::Search => None,
        }
    }

    pub fn endpoint(self) -> &'static str {
        match self {
            Self::Wire => "wires",
            Self::Transfer => "transfers",
            Self::Payout => "payouts",
            Self::Refund => "refunds",
            Self::Ticket => "tickets",
            Self::Case => "cases",
            Self::Email => "emails",
            Self::Sms => "sms",
            Self::Search => "search",
        }
    }

    pub fn semantics(self) -> EffectSemantics {
        match self {
            Self::Wire | Self::Transfer | Self::Payout | Self::Refund => {
                EffectSemantics::NonIdempotent
            }
            Self::Ticket | Self::Case | Self::Email | Self::Sms => EffectSemantics::Idempotent,
            Self::Search => EffectSemantics::ObserveOnly,
        }
    }

    pub fn keys(self) -> KeyHandling {
        match self {
            Self::Wire | Self::Transfer | Self::Payout | Self::Refund => KeyHandling::Commit,
            Self::Ticket | Self::Case | Self::Email | Self::Search => KeyHandling::Deduplicate,
            Self::Sms => KeyHandling::Ignore,
        }
    }

    /// An IDEMPOTENT tool whose upstream honours its key: ExactlyOnce is asserted for it.
    pub fn honest_idempotent(self) -> bool {
        self.semantics() == EffectSemantics::Idempotent && self.keys() == KeyHandling::Deduplicate
    }

    pub fn has_business_key(self) -> bool {
        matches!(self, Self::Wire | Self::Payout | Self::Refund)
    }

    pub fn status_check(self) -> Option<LookupBy> {
        match self {
            Self::Wire | Self::Refund => Some(LookupBy::BusinessKey),
            Self::Transfer | Self::Case | Self::Sms => Some(LookupBy::IdempotencyKey),
            Self::Payout | Self::Ticket | Self::Email | Self::Search => None,
        }
    }

    pub fn has_compensate(self) -> bool {
        matches!(
            self,
            Self::Wire | Self::Transfer | Self::Payout | Self::Ticket | Self::Case | Self::Sms
        )
    }

    /// Declares `verify_after_commit`: its commits are looked up once more, so a double
    /// commit behind one 2xx can be seen (and is injected only here).
    pub fn verifies_commits(self) -> bool {
        matches!(self, Self::Wire | Self::Sms)
    }

    /// How often the workload picks the tool, relative to the others.
    pub fn weight(self) -> u32 {
        match self {
            Self::Wire => 22,
            Self::Transfer => 14,
            Self::Payout => 7,
            Self::Refund => 8,
            Self::Ticket => 13,
            Self::Case => 6,
            Self::Email => 10,
            Self::Sms => 10,
            Self::Search => 10,
        }
    }
}

/// Amounts above this need an approval on `bank/wire`.
pub const APPROVE_ABOVE: i64 = 900_000;

/// Amounts above this need an approval on `bank/wire` once the policy is tightened.
pub const APPROVE_ABOVE_TIGHTENED: i64 = 250_000;

/// The catalog's policy: as the run starts, or tightened at one restart mid-run (a rolling
/// deploy of a stricter catalog), with a new `policy_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    #[default]
    Admitted,
    /// `tickets/open`, `email/send` and `sms/send` require approval, and `bank/wire` needs one
    /// above [`APPROVE_ABOVE_TIGHTENED`]. The three are leased at their reservation (IDEMPOTENT),
    /// so a command admitted under the old policy may have been called already when the new one
    /// meets it; an approval given under the old version no longer counts.
    Tightened,
}

impl Policy {
    pub fn version(self) -> &'static str {
        match self {
            Self::Admitted => "chaos-1",
            Self::Tightened => "chaos-2",
        }
    }

    /// Whether `kind`'s policy is stricter under [`Policy::Tightened`].
    pub fn tightens(kind: ToolKind) -> bool {
        matches!(
            kind,
            ToolKind::Ticket | ToolKind::Email | ToolKind::Sms | ToolKind::Wire
        )
    }
}

/// The timings every tool is declared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// The dispatch timeout of the bank tools; the others use `fast_timeout_ms`.
    pub bank_timeout_ms: u64,
    pub fast_timeout_ms: u64,
    pub check_timeout_ms: u64,
    pub compensate_timeout_ms: u64,
    /// The declared settle window (shorter than the lookups' lag: the tool author's mistake
    /// the issue describes).
    pub settle_ms: u64,
    /// A tight lease is the call's timeout plus this.
    pub tight_lease_margin_ms: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            bank_timeout_ms: 400,
            fast_timeout_ms: 300,
            check_timeout_ms: 1_000,
            compensate_timeout_ms: 400,
            settle_ms: 300,
            tight_lease_margin_ms: 60,
        }
    }
}

impl Timing {
    pub fn dispatch_timeout_ms(&self, kind: ToolKind) -> u64 {
        match kind.semantics() {
            EffectSemantics::NonIdempotent => self.bank_timeout_ms,
            EffectSemantics::Idempotent | EffectSemantics::ObserveOnly => self.fast_timeout_ms,
        }
    }

    fn lease_ttl_ms(&self, kind: ToolKind) -> Option<u64> {
        matches!(kind, ToolKind::Transfer | ToolKind::Ticket)
            .then(|| self.dispatch_timeout_ms(kind) + self.tight_lease_margin_ms)
    }

    /// The reconciler's `sweep_item_timeout_ms` the runner configures: the least that fits a
    /// status check and the writes of what it found, so a slow lookup outlasts it.
    pub fn sweep_item_timeout_ms(&self) -> u64 {
        self.check_timeout_ms + sluice_core::sweep::LOOK_WRITE_MARGIN_MS
    }

    /// How long a status check for a slow lookup key takes to answer: past the check's timeout
    /// and past the sweep's item budget.
    pub fn slow_lookup_ms(&self) -> u64 {
        self.sweep_item_timeout_ms() + 500
    }
}

/// The catalog's horizons of late commits: declared by default, so the tools' windows match
/// this upstream's late commits and lagging lookups (a tool author's job).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Horizons {
    /// Declare `[tool.policy] late_commit_ms` (the upstream's late-commit horizon) and
    /// `verify_after_ms` (past the lookups' lag), and the top-level `max_clock_skew_ms`.
    pub declare: bool,
    pub max_clock_skew_ms: u64,
}

impl Default for Horizons {
    fn default() -> Self {
        Self {
            declare: true,
            max_clock_skew_ms: 0,
        }
    }
}

/// The upstream's endpoints for the tools.
pub fn endpoints(timing: &Timing) -> Vec<EndpointSpec> {
    ToolKind::ALL
        .into_iter()
        .map(|kind| EndpointSpec {
            name: kind.endpoint().to_owned(),
            keys: kind.keys(),
            read_only: kind.semantics() == EffectSemantics::ObserveOnly,
            double_commits: kind.verifies_commits(),
            timeout_ms: timing.dispatch_timeout_ms(kind),
            reverse_timeout_ms: timing.compensate_timeout_ms,
            slow_lookup_ms: timing.slow_lookup_ms(),
        })
        .collect()
}

/// The catalog text for tools at `base_url`, under the policy the run starts with.
pub fn catalog_toml(
    base_url: &str,
    timing: &Timing,
    times: &FaultTimes,
    horizons: &Horizons,
) -> String {
    catalog_toml_under(base_url, timing, times, horizons, Policy::Admitted)
}

/// The catalog text for tools at `base_url` under `policy`.
pub fn catalog_toml_under(
    base_url: &str,
    timing: &Timing,
    times: &FaultTimes,
    horizons: &Horizons,
    policy: Policy,
) -> String {
    let mut root = Table::new();
    root.insert("policy_version".into(), policy.version().into());
    if horizons.declare {
        root.insert("max_clock_skew_ms".into(), int(horizons.max_clock_skew_ms));
    }
    root.insert("upstream".into(), Value::Table(upstreams(timing)));
    let tools = ToolKind::ALL
        .into_iter()
        .map(|kind| {
            let mut tool = tool(kind, base_url, timing, times, horizons, policy);
            if let Some(upstream) = kind.upstream() {
                tool.insert("upstream".into(), upstream.into());
            }
            Value::Table(tool)
        })
        .collect();
    root.insert("tool".into(), Value::Array(tools));
    toml::to_string(&root).expect("a TOML table serializes")
}

/// The upstreams: the bank with a circuit breaker that opens after 5 failing answers in a row
/// (the standard faults make that happen now and then, and the outage phase for certain), and
/// messaging at a rate near the load the workload sends it, so calls are held for their slots.
fn upstreams(timing: &Timing) -> Table {
    let mut breaker = Table::new();
    breaker.insert("failures".into(), int(5));
    breaker.insert("open_ms".into(), int(1_000));
    breaker.insert("max_open_ms".into(), int(4_000));
    breaker.insert(
        "probe_ms".into(),
        int(2 * timing.dispatch_timeout_ms(ToolKind::Wire) + 1_000),
    );
    let mut bank = Table::new();
    bank.insert("breaker".into(), Value::Table(breaker));
    let mut messaging = Table::new();
    messaging.insert("rate".into(), "25/s".into());
    messaging.insert("burst".into(), int(10));
    let mut all = Table::new();
    all.insert("bank".into(), Value::Table(bank));
    all.insert("messaging".into(), Value::Table(messaging));
    all
}

fn int(n: u64) -> Value {
    Value::Integer(i64::try_from(n).unwrap_or(i64::MAX))
}

fn tool(
    kind: ToolKind,
    base: &str,
    timing: &Timing,
    times: &FaultTimes,
    horizons: &Horizons,
    era: Policy,
) -> Table {
    let tightened = era == Policy::Tightened && Policy::tightens(kind);
    let endpoint = format!("{base}/e/{}", kind.endpoint());
    let mut tool = Table::new();
    tool.insert("name".into(), kind.name().into());
    tool.insert(
        "semantics".into(),
        match kind.semantics() {
            EffectSemantics::Idempotent => "IDEMPOTENT",
            EffectSemantics::NonIdempotent => "NON_IDEMPOTENT",
            EffectSemantics::ObserveOnly => "OBSERVE_ONLY",
        }
        .into(),
    );
    if kind.has_business_key() {
        tool.insert("business_key".into(), "{ref}:{amount_minor}".into());
    }
    tool.insert("schema".into(), Value::Table(schema()));

    let mut policy = Table::new();
    policy.insert(
        "max_attempts".into(),
        int(match kind.semantics() {
            EffectSemantics::NonIdempotent | EffectSemantics::ObserveOnly => 3,
            EffectSemantics::Idempotent => 4,
        }),
    );
    policy.insert("max_checks".into(), int(5));
    policy.insert("max_replays".into(), int(2));
    policy.insert("settle_ms".into(), int(timing.settle_ms));
    if let Some(ttl) = timing
        .lease_ttl_ms(kind)
        .map(|ttl| ttl + horizons.max_clock_skew_ms)
    {
        policy.insert("lease_ttl_ms".into(), int(ttl));
    }
    match kind {
        ToolKind::Wire => {
            let mut above = Table::new();
            above.insert("field".into(), "amount_minor".into());
            let threshold = if tightened {
                APPROVE_ABOVE_TIGHTENED
            } else {
                APPROVE_ABOVE
            };
            above.insert("value".into(), Value::Integer(threshold));
            policy.insert("approve_above".into(), Value::Table(above));
        }
        ToolKind::Case => {
            policy.insert("requires_approval".into(), true.into());
        }
        ToolKind::Refund => {
            policy.insert("on_absent".into(), "fail".into());
        }
        ToolKind::Ticket | ToolKind::Email | ToolKind::Sms if tightened => {
            policy.insert("requires_approval".into(), true.into());
        }
        ToolKind::Transfer
        | ToolKind::Payout
        | ToolKind::Ticket
        | ToolKind::Email
        | ToolKind::Sms
        | ToolKind::Search => {}
    }
    if horizons.declare && kind.semantics() != EffectSemantics::ObserveOnly {
        policy.insert("late_commit_ms".into(), int(times.late_commit_horizon_ms()));
        if kind.status_check().is_some() {
            policy.insert(
                "verify_after_ms".into(),
                int(times.lag_ms.1 + timing.settle_ms),
            );
        }
    }
    if kind.verifies_commits() {
        policy.insert("verify_after_commit".into(), true.into());
    }
    tool.insert("policy".into(), Value::Table(policy));

    let mut dispatch = Table::new();
    dispatch.insert("url".into(), endpoint.clone().into());
    dispatch.insert("timeout_ms".into(), int(timing.dispatch_timeout_ms(kind)));
    if kind.keys() == KeyHandling::Deduplicate {
        dispatch.insert(
            "in_progress_status".into(),
            Value::Array(vec![Value::Integer(409)]),
        );
    }
    tool.insert("dispatch".into(), Value::Table(dispatch));

    if let Some(by) = kind.status_check() {
        let mut check = Table::new();
        let url = match by {
            LookupBy::BusinessKey => format!("{endpoint}/by-key/{{business_key}}"),
            LookupBy::IdempotencyKey => format!("{endpoint}/by-idem/{{idempotency_key}}"),
        };
        check.insert("url".into(), url.into());
        check.insert("timeout_ms".into(), int(timing.check_timeout_ms));
        // The chaos upstream's by-key contract: 404 absent, 409 duplicate with `refs`.
        check.insert(
            "absent_status".into(),
            Value::Array(vec![Value::Integer(404)]),
        );
        check.insert(
            "duplicate_status".into(),
            Value::Array(vec![Value::Integer(409)]),
        );
        tool.insert("status_check".into(), Value::Table(check));
    }
    if kind.has_compensate() {
        let mut compensate = Table::new();
        compensate.insert(
            "url".into(),
            format!("{endpoint}/{{external_ref}}/reverse").into(),
        );
        compensate.insert("timeout_ms".into(), int(timing.compensate_timeout_ms));
        tool.insert("compensate".into(), Value::Table(compensate));
    }
    tool
}

/// Every tool takes `{ref, amount_minor, note?}`; `ref` is unique per effect.
fn schema() -> Table {
    let text = r#"
        type = "object"
        additionalProperties = false
        required = ["ref", "amount_minor"]
        [properties.ref]
        type = "string"
        minLength = 1
        maxLength = 120
        [properties.amount_minor]
        type = "integer"
        minimum = 1
        [properties.note]
        type = "string"
        maxLength = 200
    "#;
    toml::from_str(text).expect("the schema is valid TOML")
}

/// The tokens the runner gives `sluice dev` and uses.
#[derive(Debug, Clone)]
pub struct Tokens {
    pub agent: String,
    pub admin: String,
}

impl Tokens {
    /// Fresh tokens for one run.
    pub fn generate() -> Self {
        Self {
            agent: format!("chaos-agent-{}", uuid::Uuid::new_v4().simple()),
            admin: format!("chaos-admin-{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

/// The actor names of the tokens, as the audit chain records them.
pub const AGENT_NAME: &str = "chaos-agent";
pub const ADMIN_NAME: &str = "chaos-admin";

/// The `sluice dev` configuration: the ledger in `dir`, the producer on `listen`, the catalog
/// file, a quick sweep whose item budget just fits a status check (so a slow lookup outlasts
/// it), and the runner's tokens.
pub fn config_toml(
    dir: &Path,
    catalog: &Path,
    listen: SocketAddr,
    tokens: &Tokens,
    timing: &Timing,
    log_level: &str,
) -> String {
    let mut root = Table::new();
    let section = |pairs: Vec<(&str, Value)>| {
        Value::Table(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    };
    let path = |p: PathBuf| Value::String(p.display().to_string());
    root.insert(
        "ledger".into(),
        section(vec![("data_dir", path(dir.join("ledger")))]),
    );
    root.insert(
        "catalog".into(),
        section(vec![("path", path(catalog.to_owned()))]),
    );
    root.insert(
        "producer".into(),
        section(vec![("listen", listen.to_string().into())]),
    );
    root.insert(
        "reconciler".into(),
        section(vec![
            ("sweep_interval_ms", int(200)),
            ("sweep_item_timeout_ms", int(timing.sweep_item_timeout_ms())),
        ]),
    );
    root.insert(
        "telemetry".into(),
        section(vec![("log_level", log_level.into())]),
    );
    let token = |name: &str, role: &str, token: &str| {
        section(vec![
            ("name", name.into()),
            ("role", role.into()),
            ("token", token.into()),
        ])
    };
    root.insert(
        "auth".into(),
        section(vec![(
            "tokens",
            Value::Array(vec![
                token(AGENT_NAME, "agent", &tokens.agent),
                token(ADMIN_NAME, "admin", &tokens.admin),
            ]),
        )]),
    );
    toml::to_string(&root).expect("a TOML table serializes")
}

/// Parses the catalog as the services will, so a mistake stops the runner first.
pub fn validate(text: &str) -> Result<Catalog, String> {
    Catalog::from_toml_str(text, "chaos catalog").map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times() -> FaultTimes {
        FaultTimes {
            hold_past_timeout_ms: 250,
            late_commit_ms: (100, 700),
            lag_ms: (700, 1_500),
        }
    }

    #[test]
    fn the_catalog_declares_every_shape_and_validates() {
        let text = catalog_toml(
            "http://127.0.0.1:1",
            &Timing::default(),
            &times(),
            &Horizons::default(),
        );
        let catalog = validate(&text).expect("valid");
        assert_eq!(catalog.len(), ToolKind::ALL.len());
        for kind in ToolKind::ALL {
            let tool = catalog
                .tools()
                .iter()
                .find(|t| t.name().to_string() == kind.name())
                .unwrap_or_else(|| panic!("{} is declared", kind.name()));
            assert_eq!(tool.semantics(), kind.semantics(), "{}", kind.name());
            assert_eq!(tool.status_check().is_some(), kind.status_check().is_some());
            assert_eq!(tool.compensate().is_some(), kind.has_compensate());
            assert_eq!(
                tool.business_key_template().is_some(),
                kind.has_business_key()
            );
        }
        let rules = |kind: ToolKind| {
            catalog
                .tools()
                .iter()
                .find(|t| t.name().to_string() == kind.name())
                .map(|t| t.rules())
                .expect("declared")
        };
        assert_eq!(rules(ToolKind::Transfer).lease_ttl_ms, 460);
        assert!(rules(ToolKind::Wire).verify_after_commit);
    }

    #[test]
    fn the_configuration_loads() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let text = config_toml(
            dir.path(),
            &dir.path().join("catalog.toml"),
            "127.0.0.1:9".parse().expect("an address"),
            &Tokens::generate(),
            &Timing::default(),
            "warn",
        );
        let path = dir.path().join("sluice.toml");
        std::fs::write(&path, text).expect("written");
        let config =
            sluice_runtime::Config::load(Some(&path), std::iter::empty::<(String, String)>())
                .expect("the configuration loads");
        assert_eq!(config.auth.tokens.len(), 2);
        assert_eq!(config.producer.listen.port(), 9);
        // The sweep's item budget fits the runner's status checks, and no more.
        let catalog = validate(&catalog_toml(
            "http://127.0.0.1:1",
            &Timing::default(),
            &times(),
            &Horizons::default(),
        ))
        .expect("valid");
        let budget = config.reconciler.sweep_item_timeout_ms;
        assert!(sluice_core::sweep::looks_that_do_not_fit(&catalog, budget).is_empty());
        assert!(!sluice_core::sweep::looks_that_do_not_fit(&catalog, budget - 1).is_empty());
        assert!(Timing::default().slow_lookup_ms() > budget);
    }

    #[test]
    fn the_tightened_catalog_asks_for_approval_where_the_first_did_not() {
        let under = |policy| {
            validate(&catalog_toml_under(
                "http://127.0.0.1:1",
                &Timing::default(),
                &times(),
                &Horizons::default(),
                policy,
            ))
            .expect("valid")
        };
        let (admitted, tightened) = (under(Policy::Admitted), under(Policy::Tightened));
        assert_ne!(admitted.policy_version(), tightened.policy_version());
        for kind in ToolKind::ALL {
            let policy = |catalog: &Catalog| {
                catalog
                    .tools()
                    .iter()
                    .find(|t| t.name().to_string() == kind.name())
                    .map(|t| t.policy().clone())
                    .expect("declared")
            };
            let (before, after) = (policy(&admitted), policy(&tightened));
            assert_eq!(
                before != after,
                Policy::tightens(kind),
                "{}: {before:?} / {after:?}",
                kind.name()
            );
        }
    }
}
