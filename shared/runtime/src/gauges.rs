//! The state gauges' figures: how many commands are in each unresolved status now, by tool, and
//! since when the oldest of each status has been in it — kept up to date at every guarded write
//! this process makes ([`GaugedLedger`]) and seeded from the ledger once at start, so a scrape
//! reads counters in memory and never the ledger.
//!
//! Only unresolved (non-terminal) commands are held: terminal ones are history, which
//! `sluice_transitions_total` counts, and a purge removes them. Each held command costs one map
//! entry and one ordered-set entry (its key and two timestamps), so memory follows the backlog,
//! not the ledger's size.
//!
//! Right across restarts: the seed re-reads the ledger at start. Right across processes: a
//! process sees only its own writes, so where several processes write one ledger the figures of
//! the process that reports them are refreshed from the ledger every `refresh` (see
//! `docs/architecture.md`, "Observability"); writes made while a seed reads are replayed over it.
//!
//! A refresh reads what can have changed, not the whole ledger: the runs created since the last
//! read began (less [`RECENT_OVERLAP`], for writers whose clocks or writes lag) and the runs that
//! held unresolved commands. Reading every run of the retention every minute cost one read per
//! run kept (30 days of runs, each minute, on a busy ledger). What that leaves out is an old run
//! reopened by another process (a rollback or a replay of a settled run): every
//! [`FULL_EVERY`]th refresh reads every run again, which bounds how long such a run is missed.

mod forward;

use sluice_ledger::CommandStore;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use sluice_core::audit::AuditDraft;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::time::{Clock, Timestamp};
use sluice_ledger::{
    Cas, Claim, Ledger, LedgerError, PurgeReport, Reserved, RoundTrips, RunCursor, RunSummary,
    Transition,
};

/// Where one held command stands.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// Its run: a refresh reads again every run that holds a command.
    run: RunId,
    status: CommandStatus,
    tool: Arc<str>,
    /// Its tenant (`Command::tenant`): what a tenant holds in flight is what its quota bounds.
    tenant: Arc<str>,
    /// When it entered `status` (its last write, for a seeded command).
    since: Timestamp,
}

/// A gauge's labels: the status and the tool.
type Labels = (CommandStatus, Arc<str>);

#[derive(Debug, Default)]
struct State {
    held: HashMap<Arc<str>, Held>,
    /// Per (status, tool), its commands by the time they entered the status: the first is
    /// the oldest.
    by_age: HashMap<Labels, BTreeSet<(Timestamp, Arc<str>)>>,
    /// Per (status, tool), how many are held.
    counts: HashMap<Labels, u64>,
    /// Per tenant, how many are held: its effects in flight (kept at zero once emptied).
    by_tenant: HashMap<Arc<str>, u64>,
    /// While a seed reads the ledger: the latest state of every command written meanwhile
    /// (`None`: it left the unresolved statuses), replayed over the seed when it lands.
    during_seed: Option<HashMap<Arc<str>, Option<Held>>>,
    /// Whether a seed has landed: until then the figures are this process's writes only.
    seeded: bool,
    /// Each tool's name as a label, made once (a write must not allocate it again).
    tools: HashMap<ToolName, Arc<str>>,
    /// Each tenant's name, made once.
    tenants: std::collections::HashSet<Arc<str>>,
}

impl State {
    fn tool(&mut self, tool: &ToolName) -> Arc<str> {
        Arc::clone(
            self.tools
                .entry(tool.clone())
                .or_insert_with(|| Arc::from(tool.to_string())),
        )
    }

    fn tenant(&mut self, tenant: &str) -> Arc<str> {
        if let Some(known) = self.tenants.get(tenant) {
            return Arc::clone(known);
        }
        let made: Arc<str> = Arc::from(tenant);
        self.tenants.insert(Arc::clone(&made));
        made
    }

    fn remove(&mut self, key: &Arc<str>) {
        if let Some(old) = self.held.remove(key) {
            let slot = (old.status, old.tool);
            if let Some(set) = self.by_age.get_mut(&slot) {
                set.remove(&(old.since, Arc::clone(key)));
            }
            if let Some(count) = self.counts.get_mut(&slot) {
                *count = count.saturating_sub(1);
                // Kept at zero rather than removed: a series that drops out of a scrape looks
                // like a missing scrape, and an alert on it would hold its last value.
            }
            if let Some(count) = self.by_tenant.get_mut(&old.tenant) {
                *count = count.saturating_sub(1);
            }
        }
    }

    fn insert(&mut self, key: Arc<str>, held: Held) {
        self.remove(&key);
        self.by_age
            .entry((held.status, Arc::clone(&held.tool)))
            .or_default()
            .insert((held.since, Arc::clone(&key)));
        *self
            .counts
            .entry((held.status, Arc::clone(&held.tool)))
            .or_default() += 1;
        *self.by_tenant.entry(Arc::clone(&held.tenant)).or_default() += 1;
        self.held.insert(key, held);
    }

    fn set(&mut self, key: Arc<str>, held: Option<Held>) {
        match held {
            Some(held) => self.insert(key, held),
            None => self.remove(&key),
        }
    }
}

/// The figures behind `sluice_commands` and `sluice_oldest_command_age_seconds`.
#[derive(Debug, Clone, Default)]
pub struct CommandGauges {
    state: Arc<Mutex<State>>,
}

/// One (status, tool) figure, for the metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCount {
    pub status: CommandStatus,
    pub tool: Arc<str>,
    pub count: u64,
    /// How long the oldest of them has been in the status (zero when none is).
    pub oldest: Duration,
}

fn key_of(run_id: &RunId, command_key: &CommandKey) -> Arc<str> {
    format!("{}/{}", run_id.as_str(), command_key.as_str()).into()
}

impl CommandGauges {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a set of counters: one poisoned by a panic elsewhere is still usable.
        self.state.lock().unwrap_or_else(|poisoned| {
            self.state.clear_poison();
            poisoned.into_inner()
        })
    }

    /// Records `command` as stored by an applied write; `changed` says whether the write moved
    /// its status (the time it entered its status is then the write's).
    pub fn observe(&self, command: &Command, changed: bool) {
        let key = key_of(&command.run_id, &command.command_key);
        let status = command.status();
        let mut state = self.lock();
        let held = (!status.is_terminal()).then(|| {
            let since = match state.held.get(&key) {
                Some(old) if !changed && old.status == status => old.since,
                _ => command.state.updated_at,
            };
            Held {
                run: command.run_id.clone(),
                status,
                tool: state.tool(&command.tool),
                tenant: state.tenant(command.tenant()),
                since,
            }
        });
        if let Some(pending) = state.during_seed.as_mut() {
            pending.insert(Arc::clone(&key), held.clone());
        }
        state.set(key, held);
    }

    /// Forgets the command `<run_id>/<command_key>` (a lifecycle event's `ce_subject`), which
    /// a write at `at` took to a final status, often another process's: a producer hears of it
    /// from the events it watches, long before its next read of the ledger. Kept if it entered
    /// its status well after `at` (by more than [`EVENT_SKEW`]): a replay since, whose event is
    /// still to come.
    pub fn forget(&self, subject: &str, at: Timestamp) {
        let mut state = self.lock();
        let Some((key, held)) = state.held.get_key_value(subject) else {
            return;
        };
        let skew = i64::try_from(EVENT_SKEW.as_millis()).unwrap_or(i64::MAX);
        if held.since > at.plus_millis(skew) {
            return;
        }
        let key = Arc::clone(key);
        if let Some(pending) = state.during_seed.as_mut() {
            pending.insert(Arc::clone(&key), None);
        }
        state.remove(&key);
    }

    /// The commands of `tenant` held now: its effects in flight (not yet in a final status).
    pub fn in_flight(&self, tenant: &str) -> u64 {
        self.lock().by_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Every tenant seen since start with its effects in flight (at zero once emptied), by
    /// name.
    pub fn tenant_figures(&self) -> Vec<(Arc<str>, u64)> {
        let state = self.lock();
        let mut figures: Vec<(Arc<str>, u64)> = state
            .by_tenant
            .iter()
            .map(|(tenant, count)| (Arc::clone(tenant), *count))
            .collect();
        figures.sort();
        figures
    }

    /// Replaces the figures with the unresolved commands of `ledger`, read through its run
    /// listing (runs with open commands only), then replays the writes made meanwhile.
    pub async fn seed(&self, ledger: &dyn Ledger) -> Result<usize, LedgerError> {
        self.seed_from(ledger, Timestamp::from_millis(0)).await
    }

    /// [`CommandGauges::seed`] from the runs created since `since` and those that hold
    /// unresolved commands now: a run older than `since` that held none is taken to hold none
    /// still (see the module's doc for when that is not so, and how long it lasts).
    pub async fn seed_from(
        &self,
        ledger: &dyn Ledger,
        since: Timestamp,
    ) -> Result<usize, LedgerError> {
        let open_runs: Vec<RunId> = {
            let mut state = self.lock();
            state.during_seed = Some(HashMap::new());
            let runs: std::collections::BTreeSet<&RunId> =
                state.held.values().map(|held| &held.run).collect();
            runs.into_iter().cloned().collect()
        };
        let read = read_open(ledger, since, open_runs).await;
        let mut state = self.lock();
        let meanwhile = state.during_seed.take().unwrap_or_default();
        let commands = read?;
        let mut fresh = State {
            seeded: true,
            ..State::default()
        };
        // Every status the previous figures had keeps a series (at zero if it emptied).
        for (status, tool) in state.counts.keys() {
            fresh.counts.insert((*status, Arc::clone(tool)), 0);
        }
        for tenant in state.by_tenant.keys() {
            fresh.by_tenant.insert(Arc::clone(tenant), 0);
        }
        let held = commands.len();
        for command in commands {
            let tool = fresh.tool(&command.tool);
            let tenant = fresh.tenant(command.tenant());
            fresh.insert(
                key_of(&command.run_id, &command.command_key),
                Held {
                    run: command.run_id.clone(),
                    status: command.status(),
                    tool,
                    tenant,
                    since: command.state.updated_at,
                },
            );
        }
        for (key, held) in meanwhile {
            fresh.set(key, held);
        }
        *state = fresh;
        Ok(held)
    }

    /// Whether a seed has landed.
    pub fn is_seeded(&self) -> bool {
        self.lock().seeded
    }

    /// Held commands by status and tool, with the age of the oldest at `now` (every pair
    /// seen since start, at zero once empty). Reads the first entry of each ordered set: no
    /// walk over the commands.
    pub fn figures(&self, now: Timestamp) -> Vec<StatusCount> {
        let state = self.lock();
        let mut figures: Vec<StatusCount> = state
            .counts
            .iter()
            .map(|(slot, count)| {
                let age = state
                    .by_age
                    .get(slot)
                    .and_then(BTreeSet::first)
                    .map_or(0, |(since, _)| {
                        now.as_millis().saturating_sub(since.as_millis()).max(0)
                    });
                StatusCount {
                    status: slot.0,
                    tool: Arc::clone(&slot.1),
                    count: *count,
                    oldest: Duration::from_millis(age.unsigned_abs()),
                }
            })
            .collect();
        figures.sort_by(|a, b| (a.status.as_str(), &a.tool).cmp(&(b.status.as_str(), &b.tool)));
        figures
    }

    /// Seeds once, then (with a `refresh`) again every `refresh`, for as long as the ledger is
    /// open (held weakly: this loop never keeps a closed ledger alive): each refresh from the
    /// runs created since the last read began, every [`FULL_EVERY`]th from all of them. A
    /// failed read is logged and tried again a refresh (or ten seconds) later, whole.
    pub async fn keep_seeded(
        self,
        ledger: Weak<dyn Ledger>,
        refresh: Option<Duration>,
        clock: Arc<dyn Clock>,
    ) {
        // When the last read that landed began; `None`: the next read is whole.
        let mut last_began: Option<Timestamp> = None;
        let mut since_full = 0u32;
        loop {
            let Some(open) = ledger.upgrade() else { return };
            let began = clock.now();
            let since = match last_began {
                Some(at) if since_full < FULL_EVERY => {
                    at.plus_millis(-i64::try_from(RECENT_OVERLAP.as_millis()).unwrap_or(0))
                }
                _ => Timestamp::from_millis(0),
            };
            let seeded = self.seed_from(open.as_ref(), since).await;
            drop(open);
            let retry = match seeded {
                Ok(held) => {
                    tracing::debug!(held, since = %since, "command gauges seeded from the ledger");
                    since_full = if since == Timestamp::from_millis(0) {
                        0
                    } else {
                        since_full + 1
                    };
                    last_began = Some(began);
                    refresh
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot seed the command gauges; trying again");
                    last_began = None;
                    Some(refresh.unwrap_or(Duration::from_secs(10)))
                }
            };
            let Some(wait) = retry else { return };
            tokio::time::sleep(wait).await;
        }
    }
}

/// How much later than a final status's event a held command may have entered its status and
/// still be taken to be the one the event ended: the writers' clocks differ by up to the skew
/// bound, while a replay after a final status is an operator's action, seconds later.
pub const EVENT_SKEW: Duration = Duration::from_secs(1);

/// How far before the last read's start a refresh reads new runs from: a run's creation time is
/// its first reservation's, taken before the write, on the writer's clock. Every run created in
/// this window is read again at each refresh (one read each), so it is kept short: at 5 minutes
/// and a refresh a minute each run was read six times, 3.5 reads per effect on a pipeline of
/// one-effect runs, more than all its other reads together (docs/scaling.md). A run whose
/// registration lands later than this after its creation time (a writer stalled that long, or
/// a clock that far behind) shows at the next whole read.
pub const RECENT_OVERLAP: Duration = Duration::from_secs(30);
/// Every this many refreshes one reads every run (hourly at the minute's refresh on Kafka).
pub const FULL_EVERY: u32 = 60;

/// The unresolved commands of `ledger`'s runs created since `since` that have open commands,
/// and of the runs in `also` (whatever their age): each such run read whole.
async fn read_open(
    ledger: &dyn Ledger,
    since: Timestamp,
    also: Vec<RunId>,
) -> Result<Vec<Command>, LedgerError> {
    let runs = ledger.list_runs(since, None, usize::MAX).await?;
    let mut to_read: std::collections::BTreeSet<RunId> = also.into_iter().collect();
    to_read.extend(
        runs.into_iter()
            .filter(|run| run.open_commands > 0)
            .map(|run| run.run_id),
    );
    let mut open = Vec::new();
    for run in to_read {
        open.extend(
            ledger
                .list_run(&run, None)
                .await?
                .into_iter()
                .filter(|command| !command.status().is_terminal()),
        );
    }
    Ok(open)
}

/// A ledger that tells [`CommandGauges`] about every write of it that applied; everything else
/// passes through unchanged.
#[derive(Debug)]
pub struct GaugedLedger {
    inner: Arc<dyn Ledger>,
    gauges: CommandGauges,
}

impl GaugedLedger {
    pub fn wrap(inner: Arc<dyn Ledger>, gauges: CommandGauges) -> Arc<dyn Ledger> {
        Arc::new(Self { inner, gauges })
    }

    fn reserved(&self, reserved: &Reserved) {
        if let Reserved::Created(command) = reserved {
            self.gauges.observe(command, true);
        }
    }

    fn cas(&self, guard: CommandStatus, cas: &Cas) {
        if let Cas::Applied(command) = cas {
            self.gauges.observe(command, command.status() != guard);
        }
    }
}

#[async_trait]
impl CommandStore for GaugedLedger {
    async fn reserve(&self, command: Command, audit: AuditDraft) -> Result<Reserved, LedgerError> {
        let reserved = self.inner.reserve(command, audit).await?;
        self.reserved(&reserved);
        Ok(reserved)
    }

    async fn reserve_own(
        &self,
        command: Command,
        audit: AuditDraft,
    ) -> Result<Reserved, LedgerError> {
        let reserved = self.inner.reserve_own(command, audit).await?;
        self.reserved(&reserved);
        Ok(reserved)
    }

    async fn transition(&self, transition: Transition) -> Result<Cas, LedgerError> {
        let guard = transition.guard.status;
        let cas = self.inner.transition(transition).await?;
        self.cas(guard, &cas);
        Ok(cas)
    }

    async fn acquire_lease(&self, transition: Transition) -> Result<Cas, LedgerError> {
        let guard = transition.guard.status;
        let cas = self.inner.acquire_lease(transition).await?;
        self.cas(guard, &cas);
        Ok(cas)
    }

    async fn finalize(&self, transition: Transition) -> Result<Cas, LedgerError> {
        let guard = transition.guard.status;
        let cas = self.inner.finalize(transition).await?;
        self.cas(guard, &cas);
        Ok(cas)
    }

    async fn get(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Option<Command>, LedgerError> {
        self.inner.get(run_id, command_key).await
    }

    async fn list_run(
        &self,
        run_id: &RunId,
        status: Option<CommandStatus>,
    ) -> Result<Vec<Command>, LedgerError> {
        self.inner.list_run(run_id, status).await
    }

    async fn list_runs(
        &self,
        since: Timestamp,
        before: Option<&RunCursor>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, LedgerError> {
        self.inner.list_runs(since, before, limit).await
    }

    async fn claim_business_key(
        &self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Claim, LedgerError> {
        self.inner
            .claim_business_key(tool, business_key, run_id, command_key)
            .await
    }

    async fn close_run(
        &self,
        run_id: &RunId,
        draft: AuditDraft,
        at: Timestamp,
    ) -> Result<sluice_ledger::Closing, LedgerError> {
        self.inner.close_run(run_id, draft, at).await
    }

    /// A purge removes terminal commands only, which the gauges do not hold.
    async fn purge(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<PurgeReport, LedgerError> {
        self.inner
            .purge(older_than, max_runs, actor, now, dry_run)
            .await
    }

    fn cached(&self, run_id: &RunId, command_key: &CommandKey) -> Option<Command> {
        self.inner.cached(run_id, command_key)
    }

    fn basis(&self, run_id: &RunId, command_key: &CommandKey) -> Option<String> {
        self.inner.basis(run_id, command_key)
    }

    fn adopt(&self, copy: &Command, basis: &str) -> bool {
        self.inner.adopt(copy, basis)
    }
}

impl Ledger for GaugedLedger {
    fn round_trips(&self) -> Vec<RoundTrips> {
        self.inner.round_trips()
    }

    fn write_latency_ms(&self) -> i64 {
        self.inner.write_latency_ms()
    }

    fn quarantined(&self) -> u64 {
        self.inner.quarantined()
    }

    fn left_for_newer(&self) -> u64 {
        self.inner.left_for_newer()
    }

    fn db_identity(&self) -> sluice_ledger::DbIdentity<'_> {
        self.inner.db_identity()
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::command::{EffectSemantics, Intent};

    use super::*;

    fn command(run: &str, key: &str, status: CommandStatus, at: i64) -> Command {
        let intent = Intent {
            run_id: RunId::parse(run).expect("a run id"),
            command_key: CommandKey::parse(key).expect("a command key"),
            semantics: EffectSemantics::NonIdempotent,
            args: serde_json::json!({}),
            business_key: None,
            policy_version: "p-1".into(),
            max_attempts: 3,
            not_before: None,
        };
        let mut command = Command::from_intent(intent, Timestamp::from_millis(at), 5_000);
        command.state.status = status;
        command.state.updated_at = Timestamp::from_millis(at);
        command
    }

    fn figure(gauges: &CommandGauges, status: CommandStatus, now: i64) -> (u64, u64) {
        gauges
            .figures(Timestamp::from_millis(now))
            .into_iter()
            .find(|f| f.status == status)
            .map_or((0, 0), |f| {
                (f.count, u64::try_from(f.oldest.as_millis()).unwrap_or(0))
            })
    }

    #[test]
    fn writes_move_commands_between_statuses_and_terminal_ones_leave() {
        let gauges = CommandGauges::default();
        let key = "d-1/payments/wire/0";
        gauges.observe(&command("r-1", key, CommandStatus::Blocked, 1_000), true);
        gauges.observe(&command("r-2", key, CommandStatus::Blocked, 3_000), true);
        assert_eq!(figure(&gauges, CommandStatus::Blocked, 10_000), (2, 9_000));
        // The oldest leaves: the next is the oldest now.
        gauges.observe(&command("r-1", key, CommandStatus::Approved, 5_000), true);
        assert_eq!(figure(&gauges, CommandStatus::Blocked, 10_000), (1, 7_000));
        assert_eq!(figure(&gauges, CommandStatus::Approved, 10_000), (1, 5_000));
        // A write that keeps the status (a lease extension) keeps the time it entered it.
        gauges.observe(&command("r-1", key, CommandStatus::Approved, 8_000), false);
        assert_eq!(figure(&gauges, CommandStatus::Approved, 10_000), (1, 5_000));
        // Terminal: held nowhere, its series stays at zero.
        gauges.observe(&command("r-1", key, CommandStatus::Confirmed, 9_000), true);
        assert_eq!(figure(&gauges, CommandStatus::Approved, 10_000), (0, 0));
        assert!(
            gauges
                .figures(Timestamp::from_millis(10_000))
                .iter()
                .all(|f| !f.status.is_terminal())
        );
        assert!(!gauges.is_seeded());
    }

    /// A tenant's effects in flight are its commands not yet final, STUCK and BLOCKED among
    /// them; a final status, written here or heard of from another process, lowers the count.
    #[test]
    fn each_tenant_counts_its_commands_not_yet_final() {
        let gauges = CommandGauges::default();
        let key = "d-1/payments/wire/0";
        let of = |run: &str, status, tenant: &str| {
            command(run, key, status, 1_000)
                .submitted_by("platform")
                .for_tenant(tenant)
        };
        gauges.observe(&of("r-1", CommandStatus::Pending, "acme"), true);
        gauges.observe(&of("r-2", CommandStatus::Stuck, "acme"), true);
        gauges.observe(&of("r-3", CommandStatus::Blocked, "globex"), true);
        // Recorded before tenants: counted as its submitter's.
        gauges.observe(
            &command("r-4", key, CommandStatus::Leased, 1_000).submitted_by("bot"),
            true,
        );
        assert_eq!(
            (
                gauges.in_flight("acme"),
                gauges.in_flight("globex"),
                gauges.in_flight("bot")
            ),
            (2, 1, 1)
        );
        assert_eq!(gauges.in_flight("initech"), 0);
        gauges.observe(&of("r-1", CommandStatus::Confirmed, "acme"), true);
        // An event older than the status held (a replay since) leaves it; a current one ends it.
        gauges.forget("r-3/d-1/payments/wire/0", Timestamp::from_millis(-5_000));
        assert_eq!(gauges.in_flight("globex"), 1);
        gauges.forget("r-3/d-1/payments/wire/0", Timestamp::from_millis(900));
        gauges.forget("r-9/d-1/payments/wire/0", Timestamp::from_millis(900));
        let acme: Arc<str> = Arc::from("acme");
        let globex: Arc<str> = Arc::from("globex");
        let bot: Arc<str> = Arc::from("bot");
        assert_eq!(
            gauges.tenant_figures(),
            vec![(acme, 1), (bot, 1), (globex, 0)]
        );
    }

    #[test]
    fn writes_made_while_a_seed_reads_are_replayed_over_it() {
        let gauges = CommandGauges::default();
        let key = "d-1/payments/wire/0";
        gauges.lock().during_seed = Some(HashMap::new());
        // Written during the read: the read may have seen the command before it.
        gauges.observe(&command("r-1", key, CommandStatus::Stuck, 2_000), true);
        let meanwhile = gauges.lock().during_seed.take().unwrap_or_default();
        let mut fresh = State::default();
        fresh.insert(
            key_of(
                &RunId::parse("r-1").expect("a run id"),
                &CommandKey::parse(key).expect("a key"),
            ),
            Held {
                run: RunId::parse("r-1").expect("a run id"),
                status: CommandStatus::Unknown,
                tool: Arc::from("payments/wire"),
                tenant: Arc::from("anonymous"),
                since: Timestamp::from_millis(1_000),
            },
        );
        for (key, held) in meanwhile {
            fresh.set(key, held);
        }
        assert_eq!(
            fresh.held.len(),
            1,
            "one command, in the status it was written to"
        );
        assert_eq!(
            fresh
                .counts
                .get(&(CommandStatus::Stuck, Arc::from("payments/wire"))),
            Some(&1)
        );
        assert_eq!(
            fresh
                .counts
                .get(&(CommandStatus::Unknown, Arc::from("payments/wire"))),
            Some(&0)
        );
    }
}
