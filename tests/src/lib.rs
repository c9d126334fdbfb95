//! The end-to-end harness: the demo upstream and the embedded pipeline on loopback, a real
//! SQLite ledger in a temporary directory, and an HTTP agent — written once, used by every suite
//! in `tests/`.
//!
//! * [`start_upstream`] — the demo bank, mail, ticket and search service on a free port.
//! * [`CatalogEdit`] — the example catalog pointed at that upstream, with per-test policy
//!   overrides (short timeouts, settle intervals, leases) applied to its TOML before it is
//!   parsed and validated like any catalog.
//! * [`test_config`], [`Harness`] — the four services in one process (`sluice_embedded::dev::start`)
//!   with a fast sweep, and [`Detached`]: a pipeline on a runtime of its own, so a test can
//!   kill it mid-flight the way a crash would (nothing finishes, nothing is drained).
//! * [`Agent`] — what an agent does over HTTP: submit, read, long-poll, roll back (`agent.rs`).
//! * [`verified_audit`] and [`Trail`] — a run's audit chain, verified, and read back as steps.
//!
//! * [`chaos`] — the seeded fault runner behind `sluice-chaos` (`src/bin/sluice-chaos.rs`).
//!
//! Every wait here has a deadline and fails the test with what it was waiting for; nothing
//! sleeps to let time pass as a substitute for an observation.

mod agent;
pub mod chaos;
pub mod processes;
pub mod proxy;

pub use agent::{Agent, Answer};

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_assemble::{EXAMPLE_CATALOG, EXAMPLE_UPSTREAM};
use sluice_core::audit::{AuditEntry, verify};
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_embedded::dev::Pipeline;
use sluice_ledger::Ledger;
use sluice_ledger::sqlite::{SqliteConfig, SqliteLedger};
use sluice_runtime::{Config, Context, Shutdown};
use sluice_upstream::{Faults, Upstream};
use tempfile::TempDir;

/// The longest any single wait in a suite may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// How long a new pipeline may take to bring back what an old one left in flight or queued in
/// its embedded bus: a lapsed lease is found when it expires (for a lease taken at reservation,
/// the stale-PENDING wait plus the call's timeout, 20 s for `tickets/create`), then reconciled
/// and retried after a backoff.
pub const RECOVERY: Duration = Duration::from_secs(60);

/// How often a poll looks again.
const POLL: Duration = Duration::from_millis(20);

/// The sweep interval of every test pipeline: short, so that recovery is quick.
pub const SWEEP_INTERVAL_MS: u64 = 100;

/// A free loopback port.
pub const ANY_PORT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// The upstream's fault dice seed: faults at rate 0 or 1 do not depend on it.
const SEED: u64 = 7;

/// Logs to the test output when `SLUICE_TEST_LOG` holds a filter (e.g. `info`).
pub fn init_tracing() {
    if let Ok(filter) = std::env::var("SLUICE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// Starts the demo upstream on a free loopback port.
pub async fn start_upstream(faults: Faults) -> Upstream {
    Upstream::start(ANY_PORT, faults, SEED)
        .await
        .expect("the demo upstream binds a free loopback port")
}

/// The example catalog (deploy/catalog.toml) pointed at a test upstream, with edits.
///
/// Unedited, it builds as [`example_catalog`]; edits are made on the parsed TOML
/// document (not by text substitution, which a reformatted catalog would silently defeat) and
/// the result goes through the same parser and validation as any catalog.
#[derive(Debug, Clone)]
pub struct CatalogEdit {
    base_url: String,
    table: toml::Table,
    edited: bool,
    /// Keep the breaker every upstream has by default ([`CatalogEdit::default_breakers`]).
    default_breakers: bool,
}

impl CatalogEdit {
    /// The example catalog with its URLs at `base_url`, as `example_catalog_at` builds it.
    pub fn example(base_url: &str) -> Self {
        let base_url = base_url.trim_end_matches('/').to_owned();
        let text = EXAMPLE_CATALOG.replace(EXAMPLE_UPSTREAM, &base_url);
        assert!(
            base_url == EXAMPLE_UPSTREAM || !text.contains(EXAMPLE_UPSTREAM),
            "every upstream URL of the example catalog points at the test upstream"
        );
        let mut table: toml::Table =
            toml::from_str(&text).expect("the example catalog is valid TOML");
        // The tests' short leases (a second or two over the call's timeout) are meant for one
        // machine, one clock: the skew bound of an edited catalog is 100 ms unless a test sets
        // it (`top`). An unedited catalog is the example's, bound included.
        table.insert("max_clock_skew_ms".into(), toml::Value::Integer(100));
        Self {
            base_url,
            table,
            edited: false,
            default_breakers: false,
        }
    }

    /// Keeps the circuit breaker each upstream has by default. Without this, every tool naming
    /// no upstream says `breaker = false`: the suites drive one demo upstream (every tool on one
    /// host, so one breaker) failing on purpose to prove what the pipeline does with each
    /// failing answer, and a breaker opening after five would hold the calls they watch.
    /// `tests/default_breaker.rs` proves the default itself.
    pub fn default_breakers(mut self) -> Self {
        self.default_breakers = true;
        self.edited = true;
        self
    }

    /// Sets a top-level key, such as `default_namespace`.
    pub fn top(mut self, key: &str, value: impl Into<toml::Value>) -> Self {
        self.table.insert(key.to_owned(), value.into());
        self.edited = true;
        self
    }

    /// Sets the tool's own `key = value` (such as `upstream`).
    pub fn tool_key(mut self, tool: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        let entry = self
            .table
            .get_mut("tool")
            .and_then(toml::Value::as_array_mut)
            .expect("the example catalog has [[tool]] entries")
            .iter_mut()
            .filter_map(toml::Value::as_table_mut)
            .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(tool))
            .unwrap_or_else(|| panic!("the example catalog has no tool {tool}"));
        if key == "upstream" {
            // The breaker is the named upstream's to turn off.
            entry.remove("breaker");
        }
        entry.insert(key.to_owned(), value.into());
        self.edited = true;
        self
    }

    /// Declares `[upstream.<name>]` from TOML text (its keys and `[breaker]`).
    pub fn upstream(mut self, name: &str, toml_text: &str) -> Self {
        let table: toml::Table = toml::from_str(toml_text).expect("the upstream's TOML parses");
        self.table
            .entry("upstream".to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("upstream is a table")
            .insert(name.to_owned(), toml::Value::Table(table));
        self.edited = true;
        self
    }

    /// Declares `[budgets.<name>]` from TOML text (`tools`, `scope`, `window`, `limits`, …).
    pub fn budget(mut self, name: &str, toml_text: &str) -> Self {
        let table: toml::Table = toml::from_str(toml_text).expect("the budget's TOML parses");
        self.table
            .entry("budgets".to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .expect("budgets is a table")
            .insert(name.to_owned(), toml::Value::Table(table));
        self.edited = true;
        self
    }

    /// Adds a policy rule from TOML text (`name`, `when`, `then`, …): the tool's own
    /// `[[tool.rule]]` when `tool` names one, else a catalog-wide `[[rule]]`.
    pub fn rule(mut self, tool: Option<&str>, toml_text: &str) -> Self {
        let rule: toml::Table = toml::from_str(toml_text).expect("the rule's TOML parses");
        let owner = match tool {
            None => &mut self.table,
            Some(tool) => self
                .table
                .get_mut("tool")
                .and_then(toml::Value::as_array_mut)
                .expect("the example catalog has [[tool]] entries")
                .iter_mut()
                .filter_map(toml::Value::as_table_mut)
                .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(tool))
                .unwrap_or_else(|| panic!("the example catalog has no tool {tool}")),
        };
        owner
            .entry("rule".to_owned())
            .or_insert_with(|| toml::Value::Array(Vec::new()))
            .as_array_mut()
            .expect("rule is an array of tables")
            .push(toml::Value::Table(rule));
        self.edited = true;
        self
    }

    /// Sets `[tool.policy] key = value` of the tool named `tool`.
    pub fn policy(self, tool: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        self.section(tool, "policy", key, value.into())
    }

    /// Sets `[tool.dispatch] key = value` of the tool named `tool`.
    pub fn dispatch(self, tool: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        self.section(tool, "dispatch", key, value.into())
    }

    /// Sets `[tool.status_check] key = value` of the tool named `tool`.
    pub fn status_check(self, tool: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        self.section(tool, "status_check", key, value.into())
    }

    /// Sets `[tool.compensate] key = value` of the tool named `tool`.
    pub fn compensate(self, tool: &str, key: &str, value: impl Into<toml::Value>) -> Self {
        self.section(tool, "compensate", key, value.into())
    }

    fn section(mut self, tool: &str, section: &str, key: &str, value: toml::Value) -> Self {
        let tools = self
            .table
            .get_mut("tool")
            .and_then(toml::Value::as_array_mut)
            .expect("the example catalog has [[tool]] entries");
        let entry = tools
            .iter_mut()
            .filter_map(toml::Value::as_table_mut)
            .find(|t| t.get("name").and_then(toml::Value::as_str) == Some(tool))
            .unwrap_or_else(|| panic!("the example catalog has no tool {tool}"));
        entry
            .entry(section.to_owned())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap_or_else(|| panic!("{tool}.{section} is a table"))
            .insert(key.to_owned(), value);
        self.edited = true;
        self
    }

    /// The catalog text after the edits.
    pub fn text(&self) -> String {
        let mut table = self.table.clone();
        if !self.default_breakers {
            breakers_off(&mut table);
        }
        toml::to_string(&table).expect("a TOML table serializes")
    }

    /// Parses and validates the edited catalog, as the services would at start.
    pub fn build(&self) -> Catalog {
        if !self.edited {
            return example_catalog(&self.base_url);
        }
        Catalog::from_toml_str(&self.text(), "deploy/catalog.toml (edited for a test)")
            .unwrap_or_else(|e| panic!("the edited catalog is valid: {e}"))
    }
}

/// `breaker = false` on every tool of `table` that names no upstream ([`CatalogEdit`] says
/// why).
fn breakers_off(table: &mut toml::Table) {
    let tools = table
        .get_mut("tool")
        .and_then(toml::Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(toml::Value::as_table_mut);
    for tool in tools {
        if !tool.contains_key("upstream") {
            tool.entry("breaker").or_insert(toml::Value::Boolean(false));
        }
    }
}

/// The wire with short calls and horizons: a wire looked up after an ambiguous answer is sent
/// again within seconds (the suites that play an upstream misbehaving for seconds).
pub fn short_wire(c: CatalogEdit) -> CatalogEdit {
    c.dispatch("payments/wire", "timeout_ms", 1_000)
        .policy("payments/wire", "lease_ttl_ms", 3_000)
        .policy("payments/wire", "late_commit_ms", 200)
        .policy("payments/wire", "settle_ms", 300)
        .policy("payments/wire", "verify_after_ms", 1_000)
}

/// The example catalog at `base_url`, unedited but for `breaker = false` on its tools
/// ([`CatalogEdit`] says why).
pub fn example_catalog(base_url: &str) -> Catalog {
    let text = EXAMPLE_CATALOG.replace(EXAMPLE_UPSTREAM, base_url.trim_end_matches('/'));
    let mut table: toml::Table = toml::from_str(&text).expect("the example catalog is valid TOML");
    breakers_off(&mut table);
    let text = toml::to_string(&table).expect("a TOML table serializes");
    Catalog::from_toml_str(&text, "deploy/catalog.toml (built in)")
        .expect("the example catalog is valid")
}

/// A test configuration: the ledger in `data_dir`, the producer on a free port, a fast sweep.
pub fn test_config(data_dir: &Path) -> Config {
    let mut config = Config::default();
    config.ledger.data_dir = data_dir.to_owned();
    config.producer.listen = ANY_PORT;
    config.reconciler.sweep_interval_ms = SWEEP_INTERVAL_MS;
    // A process that crashed holds its due-index shards until their leases lapse; the
    // shortest lease allowed keeps a restarted pipeline's recovery within the tests' bounds.
    config.reconciler.shard_lease_ms = 3_000;
    // No tokens unless a suite installs them ([`tokens::install`]): open, on loopback.
    config.producer.open = true;
    config.validate().expect("the test configuration is valid");
    config
}

/// Starts the four services in this runtime.
pub async fn start_pipeline(config: &Config, catalog: Catalog) -> Pipeline {
    sluice_embedded::dev::start(config, catalog, Shutdown::new())
        .await
        .expect("the pipeline starts")
}

/// The upstream, a pipeline on a fresh data directory, and an agent.
#[derive(Debug)]
pub struct Harness {
    pub upstream: Upstream,
    pub pipeline: Pipeline,
    pub agent: Agent,
    pub config: Config,
    /// Kept so the ledger directory lives as long as the harness.
    pub data: TempDir,
}

impl Harness {
    /// The upstream with `faults`, the example catalog edited by `edit`, the test config.
    pub async fn start(faults: Faults, edit: impl FnOnce(CatalogEdit) -> CatalogEdit) -> Self {
        Self::start_with(faults, edit, |_| {}).await
    }

    /// As [`Harness::start`], with `tune` applied to the configuration too.
    pub async fn start_with(
        faults: Faults,
        edit: impl FnOnce(CatalogEdit) -> CatalogEdit,
        tune: impl FnOnce(&mut Config),
    ) -> Self {
        init_tracing();
        let upstream = start_upstream(faults).await;
        let catalog = edit(CatalogEdit::example(&upstream.base_url())).build();
        let data = tempfile::tempdir().expect("a temporary directory");
        let mut config = test_config(data.path());
        tune(&mut config);
        config.validate().expect("the tuned configuration is valid");
        let pipeline = start_pipeline(&config, catalog).await;
        let agent = Agent::new(&pipeline.url());
        Self {
            upstream,
            pipeline,
            agent,
            config,
            data,
        }
    }

    pub fn ctx(&self) -> &Context {
        &self.pipeline.ctx
    }

    /// The run's audit chain, verified.
    pub async fn audit(&self, run: &str) -> Trail {
        verified_audit(self.ctx().ledger.as_ref(), run).await
    }

    /// Stops the pipeline and the upstream, failing if a service failed.
    pub async fn stop(self) {
        self.pipeline
            .stop()
            .await
            .expect("every service stops cleanly");
        self.upstream.shutdown().await;
    }
}

/// A pipeline on a runtime of its own, which [`Detached::crash`] tears down without waiting:
/// every task is dropped at its next await, as if the process had been killed, so leases stay
/// held and bus messages are lost. The ledger (SQLite, on disk) keeps what was committed.
#[derive(Debug)]
pub struct Detached {
    runtime: Option<tokio::runtime::Runtime>,
    pub url: String,
}

impl Detached {
    /// Starts the four services on a new two-thread runtime.
    pub async fn start(config: &Config, catalog: Catalog) -> Self {
        let config = config.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A plain thread: a runtime cannot be started from inside another one's worker.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the detached pipeline");
            let pipeline = runtime.block_on(start_pipeline(&config, catalog));
            let url = pipeline.url();
            // The services run as tasks of this runtime; the handle is not needed (a crash
            // never calls `stop`), and dropping it neither stops nor detaches them.
            drop(pipeline);
            let _ = tx.send((runtime, url));
        });
        let (runtime, url) = rx.await.expect("the detached pipeline starts");
        Self {
            runtime: Some(runtime),
            url,
        }
    }

    /// Kills the pipeline: its runtime is shut down in the background, dropping every task.
    pub fn crash(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        // Dropping a runtime inside another one panics; shutting it down in the background
        // does not.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A TCP listener that accepts connections and never answers on them: an upstream endpoint
/// that hangs. Counts the connections it accepted, so a test can tell that a call is in flight.
#[derive(Debug)]
pub struct BlackHole {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind(ANY_PORT)
            .await
            .expect("a free loopback port");
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                held.push(socket);
            }
        });
        Self {
            addr,
            accepted,
            task,
        }
    }

    /// `http://<addr>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens the ledger in `data_dir` directly, as an operator tool would, without any service.
pub fn open_ledger(data_dir: &Path) -> SqliteLedger {
    SqliteLedger::open(SqliteConfig::in_dir(data_dir)).expect("the ledger reopens")
}

/// A command key as one URL path segment (`/` → `%2F`).
pub fn encode_key(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The submission of one effect.
pub fn effect(run: &str, decision: u32, tool: &str, call_idx: u32, args: Value) -> Value {
    json!({
        "run_id": run,
        "decision": decision,
        "tool": tool,
        "call_idx": call_idx,
        "args": args,
    })
}

/// Arguments of `payments/wire`; the business key is
/// `{account}:{beneficiary}:{amount_minor}:{date}`.
/// Fails if the upstream saw any NON_IDEMPOTENT effect commit twice, naming them.
pub fn assert_no_double_commit(stats: &sluice_upstream::Stats) {
    let doubles = stats.double_commits();
    assert!(
        doubles.is_empty(),
        "a NON_IDEMPOTENT effect committed twice: {doubles:?}\n{stats:?}"
    );
}

pub fn wire_args(account: &str, amount_minor: i64) -> Value {
    json!({
        "account": account,
        "amount_minor": amount_minor,
        "beneficiary": "b-9",
        "date": "2026-11-22",
        "reference": "invoice 42",
    })
}

/// The business key of [`wire_args`].
pub fn wire_business_key(account: &str, amount_minor: i64) -> String {
    format!("{account}:b-9:{amount_minor}:2026-11-22")
}

pub fn email_args(subject: &str) -> Value {
    json!({ "to": "ops@example.com", "subject": subject, "body": "hello" })
}

pub fn ticket_args(title: &str) -> Value {
    json!({ "title": title, "priority": "high" })
}

pub fn search_args(query: &str) -> Value {
    json!({ "query": query, "limit": 2 })
}

/// Polls `check` until it returns `Some`, failing with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_for(timeout, check)
        .await
        .unwrap_or_else(|| panic!("timed out after {timeout:?} waiting for {what}"))
}

/// Polls `check` until it returns `Some`; `None` once `timeout` has passed.
pub async fn poll_for<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A run's audit chain after verification.
#[derive(Debug, Clone)]
pub struct Trail {
    pub entries: Vec<AuditEntry>,
}

impl Trail {
    /// The records of one command, in chain order.
    pub fn of(&self, key: &str) -> Vec<&AuditEntry> {
        self.entries
            .iter()
            .filter(|e| {
                e.record
                    .command_key
                    .as_ref()
                    .map(ToString::to_string)
                    .as_deref()
                    == Some(key)
            })
            .collect()
    }

    /// The `(from, to)` statuses of one command's records, in chain order.
    pub fn path(&self, key: &str) -> Vec<(Option<CommandStatus>, Option<CommandStatus>)> {
        self.of(key)
            .into_iter()
            .map(|e| (e.record.from, e.record.to))
            .collect()
    }

    /// The first record of `key` going `from` → `to`, failing when there is none.
    pub fn find(&self, key: &str, from: CommandStatus, to: CommandStatus) -> &AuditEntry {
        self.of(key)
            .into_iter()
            .find(|e| e.record.from == Some(from) && e.record.to == Some(to))
            .unwrap_or_else(|| {
                panic!(
                    "no {from} -> {to} record for {key}; its records: {:#?}",
                    self.describe(key)
                )
            })
    }

    /// One line per record of `key`, for failure messages.
    pub fn describe(&self, key: &str) -> Vec<String> {
        self.of(key)
            .into_iter()
            .map(|e| {
                format!(
                    "#{} {} {:?} -> {:?} by {}: {} {}",
                    e.record.seq,
                    e.record.at,
                    e.record.from,
                    e.record.to,
                    e.record.actor,
                    e.record.reason,
                    e.record.evidence
                )
            })
            .collect()
    }
}

/// Reads a run's audit chain from `ledger` and verifies every link.
pub async fn verified_audit(ledger: &dyn Ledger, run: &str) -> Trail {
    let run_id = RunId::parse(run).expect("a valid run id");
    let trail = ledger
        .audit_read(&run_id)
        .await
        .expect("the ledger reads the audit chain");
    let verified = verify(&run_id, trail.checkpoint.as_ref(), &trail.entries)
        .unwrap_or_else(|broken| panic!("the audit chain of {run} verifies: {broken}"));
    assert_eq!(verified.records, trail.entries.len() as u64);
    Trail {
        entries: trail.entries,
    }
}

/// Reads one command straight from a ledger.
pub async fn ledger_get(ledger: &dyn Ledger, run: &str, key: &str) -> Option<Command> {
    let run_id = RunId::parse(run).expect("a valid run id");
    let key = CommandKey::parse(key).expect("a valid command key");
    ledger
        .get(&run_id, &key)
        .await
        .expect("the ledger reads a command")
}

/// The bearer tokens of an authenticated test pipeline: two agents, an operator, an admin.
pub mod tokens {
    use sluice_runtime::Config;
    use sluice_runtime::config::{Role, TokenConfig};

    pub const AGENT_A: &str = "agent-a-token-0123456789";
    pub const AGENT_B: &str = "agent-b-token-0123456789";
    pub const OPERATOR: &str = "operator-token-0123456789";
    pub const ADMIN: &str = "admin-token-0123456789";

    /// Adds the four tokens to `config` (names: agent-a, agent-b, operator-1, admin-1); the
    /// API is then no longer open.
    pub fn install(config: &mut Config) {
        config.producer.open = false;
        for (name, role, token) in [
            ("agent-a", Role::Agent, AGENT_A),
            ("agent-b", Role::Agent, AGENT_B),
            ("operator-1", Role::Operator, OPERATOR),
            ("admin-1", Role::Admin, ADMIN),
        ] {
            config.auth.tokens.push(TokenConfig {
                name: name.into(),
                role,
                token: Some(token.into()),
                token_sha256: None,
                tenants: Vec::new(),
            });
        }
    }
}
