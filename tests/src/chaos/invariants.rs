//! The guarantees, checked against the upstream's own record once the run has settled.
//!
//! Sluice's ledger says what Sluice believes; the upstream's [`Record`] says what happened.
//! Every check compares the two per accepted command (matched by its idempotency key, which
//! every dispatch of the command carries), or reads the run's audit chain for how Sluice came
//! to its outcome. A violation names the seed, the run, the command key and the idempotency
//! key, and carries the command's audit path and upstream history so it can be followed
//! without rerunning.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::Value;
use sluice_core::audit::AuditEntry;
use sluice_core::command::{Command, CommandStatus, EffectSemantics};

use super::catalog::{Policy, Timing, ToolKind};
use super::crashes::{Crash, Tightened};
use super::driver::{Accepted, RollbackAsk};
use super::mcp::McpCall;
use super::purge::Purged;
use super::upstream::record::{Commit, DispatchRequest, LookupBy, Record, ReverseOutcome};

/// Everything the checks read.
#[derive(Debug)]
pub struct Evidence<'a> {
    pub seed: u64,
    pub accepted: &'a [Accepted],
    /// The final state of every command, by (run, command key).
    pub commands: &'a HashMap<(String, String), Command>,
    /// Each run's commands in journal order.
    pub journals: &'a HashMap<String, Vec<String>>,
    pub audits: &'a HashMap<String, Vec<AuditEntry>>,
    /// The API's verdict per run (`GET …/audit/verify`).
    pub verdicts: &'a HashMap<String, Value>,
    pub record: &'a Record,
    pub rollbacks: &'a [RollbackAsk],
    pub crashes: &'a [Crash],
    pub timing: &'a Timing,
    /// No attempt lands later than its arrival + its call's timeout + this.
    pub late_commit_horizon_ms: u64,
    /// Each component's clock may be off by this much either way.
    pub clock_skew_ms: u64,
}

/// What only the runner's own scenario has, beyond the [`Evidence`] every oracle reads: the
/// restart that tightened the policy, and the calls made through `sluice mcp`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Scenario<'a> {
    /// When the stricter catalog took over, if it did.
    pub tightened: Option<Tightened>,
    /// The MCP stories' calls; `None` when none were told.
    pub mcp: Option<&'a [McpCall]>,
    /// The runs retention purged mid-run; `None` when no purges ran.
    pub purged: Option<&'a [Purged]>,
}

/// One broken guarantee.
#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: &'static str,
    pub run_id: String,
    pub command_key: String,
    pub idempotency_key: String,
    pub what: String,
    /// The command's audit path and upstream history.
    pub story: Vec<String>,
}

/// One invariant's result.
#[derive(Debug, Clone)]
pub struct Checked {
    pub invariant: &'static str,
    pub checked: u64,
    pub violations: Vec<Violation>,
}

pub const NOTHING_LOST: &str = "NothingLost";
pub const NO_DUPLICATE: &str = "NoDuplicateLeftStanding";
pub const NO_DUPLICATE_KEY_IGNORING: &str = "NoDuplicateLeftStanding (key-ignoring IDEMPOTENT)";
pub const EXACTLY_ONCE: &str = "ExactlyOnce (honest IDEMPOTENT)";
pub const NO_BLIND_RETRY: &str = "NoBlindRetry";
pub const COMPENSATION_LIFO: &str = "CompensationLIFO";
pub const NO_ORPHAN_COMPENSATION: &str = "NoOrphanCompensation";
pub const EXTERNAL_REF: &str = "ExternalRefAgrees";
pub const ROLLBACK_COMPLETE: &str = "RollbackLeavesNothingStanding";
pub const AUDIT_VERIFIES: &str = "AuditChainVerifies";
pub const NO_UNEXPECTED_EXIT: &str = "NoUnexpectedExit";
pub const SLOW_LOOKUPS_END: &str = "SlowLookupsEndResolvedOrStuck";
pub const ONE_KEY_PER_EFFECT: &str = "OneKeyPerEffect (upstream)";
pub const TIGHTENED_TRUTHFULLY: &str = "PolicyTightenedInFlightTruthful";
pub const MCP_SAME_KEYS: &str = "McpRetryAndRedriveSameKeys";
pub const PURGED_AT_REST: &str = "PurgeTakesOnlyRunsOwingNothing";

/// Runs every check that [`Evidence`] alone supports.
pub fn check(evidence: &Evidence<'_>) -> Vec<Checked> {
    check_with(evidence, &Scenario::default())
}

/// Runs every check, with the scenario's own where it has them.
pub fn check_with(evidence: &Evidence<'_>, scenario: &Scenario<'_>) -> Vec<Checked> {
    let view = View::new(evidence);
    let mut checks = vec![
        nothing_lost(&view),
        slow_lookups_end(&view),
        outcome_matches_commits(&view, NO_DUPLICATE, |k| {
            k.semantics() == EffectSemantics::NonIdempotent
        }),
        exactly_once(&view),
        outcome_matches_commits(&view, NO_DUPLICATE_KEY_IGNORING, |k| {
            k.semantics() == EffectSemantics::Idempotent && !k.honest_idempotent()
        }),
        no_blind_retry(&view),
        compensation_lifo(&view),
        no_orphan_compensation(&view),
        external_ref(&view),
        rollback_complete(&view),
        audit_verifies(&view),
        no_unexpected_exit(&view),
        one_key_per_effect(&view),
    ];
    if let Some(tightened) = scenario.tightened {
        checks.push(tightened_truthfully(&view, tightened));
    }
    if let Some(calls) = scenario.mcp {
        checks.push(mcp_same_keys(&view, calls));
    }
    if let Some(purged) = scenario.purged {
        checks.push(purged_at_rest(purged));
    }
    checks
}

/// The evidence indexed for the checks.
struct View<'a> {
    e: &'a Evidence<'a>,
    commits: HashMap<&'a str, Vec<&'a Commit>>,
    dispatches: HashMap<&'a str, Vec<&'a DispatchRequest>>,
    by_key: HashMap<&'a str, &'a Accepted>,
}

impl<'a> View<'a> {
    fn new(e: &'a Evidence<'a>) -> Self {
        let mut commits: HashMap<&str, Vec<&Commit>> = HashMap::new();
        for commit in &e.record.commits {
            if let Some(key) = commit.meta.idempotency_key.as_deref() {
                commits.entry(key).or_default().push(commit);
            }
        }
        let mut dispatches: HashMap<&str, Vec<&DispatchRequest>> = HashMap::new();
        for request in &e.record.dispatches {
            if let Some(key) = request.meta.idempotency_key.as_deref() {
                dispatches.entry(key).or_default().push(request);
            }
        }
        let by_key = e
            .accepted
            .iter()
            .map(|a| (a.idempotency_key.as_str(), a))
            .collect();
        Self {
            e,
            commits,
            dispatches,
            by_key,
        }
    }

    fn command(&self, a: &Accepted) -> Option<&'a Command> {
        self.e
            .commands
            .get(&(a.run_id.clone(), a.command_key.clone()))
    }

    fn commits(&self, a: &Accepted) -> &[&'a Commit] {
        self.commits
            .get(a.idempotency_key.as_str())
            .map_or(&[], Vec::as_slice)
    }

    fn live(&self, a: &Accepted) -> Vec<&'a Commit> {
        self.commits(a)
            .iter()
            .copied()
            .filter(|c| c.live())
            .collect()
    }

    /// The command's audit records, in chain order.
    fn trail(&self, a: &Accepted) -> Vec<&'a AuditEntry> {
        self.e
            .audits
            .get(&a.run_id)
            .map(|entries| {
                entries
                    .iter()
                    .filter(|entry| {
                        entry
                            .record
                            .command_key
                            .as_ref()
                            .map(ToString::to_string)
                            .as_deref()
                            == Some(a.command_key.as_str())
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn violation(&self, invariant: &'static str, a: &Accepted, what: String) -> Violation {
        Violation {
            invariant,
            run_id: a.run_id.clone(),
            command_key: a.command_key.clone(),
            idempotency_key: a.idempotency_key.clone(),
            what,
            story: self.story(a),
        }
    }

    /// The command's history: its audit records and the upstream's requests, commits and
    /// reversals, times in ms after its first audit record.
    fn story(&self, a: &Accepted) -> Vec<String> {
        let trail = self.trail(a);
        let origin = trail
            .first()
            .map(|e| e.record.at.as_millis())
            .or_else(|| self.command(a).map(|c| c.created_at.as_millis()))
            .unwrap_or(0);
        let mut lines = Vec::new();
        for entry in trail {
            let r = &entry.record;
            let status = r
                .evidence
                .get("http_status")
                .map(|s| format!(" [HTTP {s}]"))
                .unwrap_or_default();
            lines.push(format!(
                "audit #{} +{}ms {} -> {} by {}: {}{status}",
                r.seq,
                r.at.as_millis() - origin,
                r.from.map_or("-".into(), |s| s.to_string()),
                r.to.map_or("-".into(), |s| s.to_string()),
                r.actor,
                r.reason
            ));
        }
        for request in self
            .dispatches
            .get(a.idempotency_key.as_str())
            .into_iter()
            .flatten()
        {
            lines.push(format!(
                "upstream request #{} +{}ms {}{} (work ended {})",
                request.seq,
                request.arrived_at - origin,
                request.fault,
                if request.in_progress {
                    ", answered 409 in progress"
                } else {
                    ""
                },
                request
                    .finished_at
                    .map_or("never".into(), |t| format!("+{}ms", t - origin)),
            ));
        }
        for commit in self.commits(a) {
            lines.push(format!(
                "upstream commit {} +{}ms by request #{} ({}), visible +{}ms, {}",
                commit.id,
                commit.committed_at - origin,
                commit.request,
                commit.how,
                commit.visible_at - origin,
                match &commit.reversal {
                    None => "live".to_owned(),
                    Some(r) => format!(
                        "reversed +{}ms by {}",
                        r.at - origin,
                        r.key.as_deref().unwrap_or("?")
                    ),
                }
            ));
        }
        if let Some(command) = self.command(a) {
            lines.push(format!(
                "ledger: {} escalated={} external_ref={} attempts={} replays={}",
                command.status(),
                command.state.escalated,
                command.state.external_ref.as_deref().unwrap_or("-"),
                command.state.attempts,
                command.state.replays
            ));
        }
        lines
    }
}

fn result(invariant: &'static str, checked: u64, violations: Vec<Violation>) -> Checked {
    Checked {
        invariant,
        checked,
        violations,
    }
}

/// Every accepted command ends terminal or STUCK.
fn nothing_lost(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    for a in view.e.accepted {
        match view.command(a) {
            None => violations.push(view.violation(
                NOTHING_LOST,
                a,
                "answered 201/200 but missing from the ledger".into(),
            )),
            Some(c) if c.status().is_terminal() || c.status() == CommandStatus::Stuck => {}
            Some(c) => violations.push(view.violation(
                NOTHING_LOST,
                a,
                format!("still {} when the run settled", c.status()),
            )),
        }
    }
    result(NOTHING_LOST, view.e.accepted.len() as u64, violations)
}

/// CONFIRMED ⇔ exactly one live commit; FAILED, CANCELLED, COMPENSATED ⇔ none; anything else
/// STUCK or escalated, never silent. For the tools `applies` selects.
fn outcome_matches_commits(
    view: &View<'_>,
    invariant: &'static str,
    applies: impl Fn(ToolKind) -> bool,
) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    for a in view.e.accepted.iter().filter(|a| applies(a.tool)) {
        let Some(command) = view.command(a) else {
            continue;
        };
        checked += 1;
        let status = command.status();
        let live = view.live(a).len();
        let excused = status == CommandStatus::Stuck || command.state.escalated;
        let expected = match status {
            CommandStatus::Confirmed => Some(1),
            CommandStatus::Failed | CommandStatus::Cancelled | CommandStatus::Compensated => {
                Some(0)
            }
            _ => None,
        };
        let wrong = match expected {
            Some(n) => live != n,
            // Not an outcome that says how many commits stand: it must have told a person.
            None => status.is_terminal() && !excused,
        };
        if wrong && !excused {
            violations.push(view.violation(
                invariant,
                a,
                format!("{status}, not escalated, with {live} live commit(s) at the upstream"),
            ));
        }
    }
    result(invariant, checked, violations)
}

/// For IDEMPOTENT tools whose upstream honours the key: committed at most once, and Sluice's
/// outcome says whether it did.
fn exactly_once(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    for a in view
        .e
        .accepted
        .iter()
        .filter(|a| a.tool.honest_idempotent())
    {
        let Some(command) = view.command(a) else {
            continue;
        };
        checked += 1;
        let commits = view.commits(a).len();
        let live = view.live(a).len();
        let status = command.status();
        let ok = commits <= 1
            && match status {
                CommandStatus::Confirmed | CommandStatus::NoCompensation => live == 1,
                CommandStatus::Failed | CommandStatus::Cancelled => commits == 0,
                CommandStatus::Compensated => commits == 1 && live == 0,
                CommandStatus::Stuck | CommandStatus::CompensationFailed => true,
                // Unsettled: NothingLost reports it.
                _ => true,
            };
        if !ok {
            violations.push(view.violation(
                EXACTLY_ONCE,
                a,
                format!("{status} with {commits} commit(s), {live} live, at the upstream"),
            ));
        }
    }
    result(EXACTLY_ONCE, checked, violations)
}

/// Every automatic redispatch of a NON_IDEMPOTENT command (UNKNOWN → PENDING) rests on an
/// `absent` observation made once the earlier attempt could no longer land: no sooner than
/// its lease plus the call's timeout plus the late-commit horizon, and with no request of an
/// earlier attempt still being processed at the upstream.
fn no_blind_retry(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    // Records are timed by the components' clocks, which may each be off by the skew bound.
    let slack = 2 * i64::try_from(view.e.clock_skew_ms).unwrap_or(0);
    for a in view
        .e
        .accepted
        .iter()
        .filter(|a| a.tool.semantics() == EffectSemantics::NonIdempotent)
    {
        let trail = view.trail(a);
        let horizon = i64::try_from(
            view.e.timing.dispatch_timeout_ms(a.tool) + view.e.late_commit_horizon_ms,
        )
        .unwrap_or(i64::MAX);
        let mut lease_at = None;
        for (i, entry) in trail.iter().enumerate() {
            let r = &entry.record;
            if r.to == Some(CommandStatus::Leased) {
                lease_at = Some(r.at.as_millis());
            }
            if !(r.from == Some(CommandStatus::Unknown) && r.to == Some(CommandStatus::Pending)) {
                continue;
            }
            checked += 1;
            let at = r.at.as_millis();
            if r.evidence.get("http_status").and_then(Value::as_u64) != Some(404) {
                violations.push(view.violation(
                    NO_BLIND_RETRY,
                    a,
                    format!(
                        "audit #{}: redispatched without an absent observation",
                        r.seq
                    ),
                ));
                continue;
            }
            if let Some(leased) = lease_at
                && at - leased + slack < horizon
            {
                violations.push(view.violation(
                    NO_BLIND_RETRY,
                    a,
                    format!(
                        "audit #{}: redispatched on an absent seen {} ms after the attempt's lease; \
                         the attempt could land until {horizon} ms after it (timeout + late-commit horizon)",
                        r.seq,
                        at - leased
                    ),
                ));
                continue;
            }
            // The next attempt's lease: requests arriving before it belong to earlier ones.
            let next_lease = trail[i + 1..]
                .iter()
                .find(|e| e.record.to == Some(CommandStatus::Leased))
                .map_or(i64::MAX, |e| e.record.at.as_millis());
            let still_running = view
                .dispatches
                .get(a.idempotency_key.as_str())
                .into_iter()
                .flatten()
                .find(|q| {
                    q.arrived_at + slack < next_lease
                        && q.finished_at.is_none_or(|end| end > at + slack)
                });
            if let Some(q) = still_running {
                violations.push(view.violation(
                    NO_BLIND_RETRY,
                    a,
                    format!(
                        "audit #{}: redispatched while upstream request #{} ({}) of an earlier attempt \
                         was still being processed",
                        r.seq, q.seq, q.fault
                    ),
                ));
            }
        }
    }
    result(NO_BLIND_RETRY, checked, violations)
}

/// Within one rollback, the commands' own commits are reversed at the upstream last in the
/// journal first.
fn compensation_lifo(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    let accepted: HashMap<(&str, &str), &Accepted> = view
        .e
        .accepted
        .iter()
        .map(|a| ((a.run_id.as_str(), a.command_key.as_str()), a))
        .collect();
    for ask in view.e.rollbacks.iter().filter(|r| r.status == Some(202)) {
        let Some(journal) = view.e.journals.get(&ask.run_id) else {
            continue;
        };
        let recorded = format!("run rolled back: {}", ask.reason);
        // (journal position, command, reversal time of its own commit)
        let mut group = Vec::new();
        for (position, key) in journal.iter().enumerate() {
            let Some(a) = accepted.get(&(ask.run_id.as_str(), key.as_str())) else {
                continue;
            };
            let begun = view.trail(a).iter().any(|e| {
                e.record.to == Some(CommandStatus::Compensating) && e.record.reason == recorded
            });
            if !begun {
                continue;
            }
            let own = format!("{}/compensate", a.idempotency_key);
            let reversed = view
                .e
                .record
                .reversals
                .iter()
                .find(|r| {
                    r.outcome == ReverseOutcome::Reversed
                        && r.meta.idempotency_key.as_deref() == Some(own.as_str())
                })
                .map(|r| r.at);
            if let Some(at) = reversed {
                group.push((position, *a, at));
            }
        }
        if group.len() < 2 {
            continue;
        }
        checked += 1;
        for pair in group.windows(2) {
            let ((_, earlier, earlier_at), (_, later, later_at)) = (pair[0], pair[1]);
            if later_at > earlier_at {
                let mut violation = view.violation(
                    COMPENSATION_LIFO,
                    earlier,
                    format!(
                        "rollback {:?}: reversed at the upstream {} ms before {}, which comes later in the journal",
                        ask.reason,
                        later_at - earlier_at,
                        later.command_key
                    ),
                );
                violation.story.push(format!(
                    "-- and {} (later in the journal):",
                    later.command_key
                ));
                violation.story.extend(view.story(later));
                violations.push(violation);
            }
        }
    }
    result(COMPENSATION_LIFO, checked, violations)
}

/// Nothing is reversed that the command did not commit, and no commit is undone twice.
fn no_orphan_compensation(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    for reversal in &view.e.record.reversals {
        let what = match reversal.outcome {
            ReverseOutcome::UnknownCommit => {
                format!("reversal of {}, which never committed", reversal.target)
            }
            ReverseOutcome::AlreadyReversed => format!(
                "a second undo of {} under another key ({})",
                reversal.target,
                reversal.meta.idempotency_key.as_deref().unwrap_or("?")
            ),
            _ if reversal.foreign => {
                format!("reversal of {}, another command's commit", reversal.target)
            }
            _ => continue,
        };
        let owner = reversal
            .meta
            .dispatch_key
            .as_deref()
            .and_then(|k| view.by_key.get(k));
        violations.push(match owner {
            Some(a) => view.violation(NO_ORPHAN_COMPENSATION, a, what),
            None => Violation {
                invariant: NO_ORPHAN_COMPENSATION,
                run_id: "?".into(),
                command_key: "?".into(),
                idempotency_key: reversal.meta.dispatch_key.clone().unwrap_or_default(),
                what,
                story: Vec::new(),
            },
        });
    }
    result(
        NO_ORPHAN_COMPENSATION,
        view.e.record.reversals.len() as u64,
        violations,
    )
}

/// A CONFIRMED command's `external_ref` names a live commit of its own; a COMPENSATED one's a
/// reversed commit of its own.
fn external_ref(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    for a in view
        .e
        .accepted
        .iter()
        .filter(|a| a.tool.semantics() != EffectSemantics::ObserveOnly)
    {
        let Some(command) = view.command(a) else {
            continue;
        };
        let want_live = match command.status() {
            CommandStatus::Confirmed | CommandStatus::NoCompensation => true,
            CommandStatus::Compensated => false,
            _ => continue,
        };
        checked += 1;
        let reference = command.state.external_ref.as_deref();
        let commit = reference.and_then(|r| view.commits(a).iter().find(|c| c.id == r));
        let problem = match (reference, commit) {
            (None, _) => Some("no external_ref recorded".to_owned()),
            (Some(r), None) => Some(format!("external_ref {r} is not a commit of this command")),
            (Some(r), Some(c)) if c.live() != want_live => Some(format!(
                "external_ref {r} is {} at the upstream",
                if c.live() { "live" } else { "reversed" }
            )),
            _ => None,
        };
        if let Some(problem) = problem {
            violations.push(view.violation(
                EXTERNAL_REF,
                a,
                format!("{}: {problem}", command.status()),
            ));
        }
    }
    result(EXTERNAL_REF, checked, violations)
}

/// After a run was rolled back, none of its commits stands unless a person was told.
fn rollback_complete(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut checked = 0;
    let rolled_back: std::collections::HashSet<&str> = view
        .e
        .rollbacks
        .iter()
        // 200: already rolled back by an attempt whose answer was lost.
        .filter(|r| matches!(r.status, Some(200 | 202)))
        .map(|r| r.run_id.as_str())
        .collect();
    for a in view.e.accepted.iter().filter(|a| {
        rolled_back.contains(a.run_id.as_str())
            && a.tool.semantics() != EffectSemantics::ObserveOnly
    }) {
        let Some(command) = view.command(a) else {
            continue;
        };
        checked += 1;
        let live = view.live(a).len();
        let excused = command.status() == CommandStatus::Stuck || command.state.escalated;
        if live > 0 && !excused {
            violations.push(view.violation(
                ROLLBACK_COMPLETE,
                a,
                format!(
                    "the run was rolled back, yet the command is {} with {live} live commit(s) and nobody was told",
                    command.status()
                ),
            ));
        }
    }
    result(ROLLBACK_COMPLETE, checked, violations)
}

/// Every run's chain verifies through the API.
fn audit_verifies(view: &View<'_>) -> Checked {
    let mut violations = Vec::new();
    let mut runs: BTreeMap<&str, &Accepted> = BTreeMap::new();
    for a in view.e.accepted {
        runs.entry(a.run_id.as_str()).or_insert(a);
    }
    for (run, a) in &runs {
        match view.e.verdicts.get(*run) {
            Some(verdict) if verdict["valid"] == Value::Bool(true) => {}
            Some(verdict) => violations.push(view.violation(
                AUDIT_VERIFIES,
                a,
                format!("the audit chain does not verify: {verdict}"),
            )),
            None => violations.push(view.violation(AUDIT_VERIFIES, a, "no verdict".into())),
        }
    }
    result(AUDIT_VERIFIES, runs.len() as u64, violations)
}

/// The pipeline never ended in a way the runner did not cause.
fn no_unexpected_exit(view: &View<'_>) -> Checked {
    let violations = view
        .e
        .crashes
        .iter()
        .filter(|c| !c.injected())
        .map(|c| Violation {
            invariant: NO_UNEXPECTED_EXIT,
            run_id: "-".into(),
            command_key: "-".into(),
            idempotency_key: "-".into(),
            what: format!(
                "generation {} {} after {:?} (see its log)",
                c.generation, c.cause, c.uptime
            ),
            story: Vec::new(),
        })
        .collect();
    result(NO_UNEXPECTED_EXIT, view.e.crashes.len() as u64, violations)
}

mod edges;
#[cfg(test)]
mod tests;

use edges::{
    mcp_same_keys, one_key_per_effect, purged_at_rest, slow_lookups_end, tightened_truthfully,
};
