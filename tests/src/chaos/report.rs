//! What a run found: the invariants as a table (invariant, checked, violations), the figures
//! of the run, and each violation with the seed that replays it and the command's history.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use comfy_table::Table;

use super::invariants::{Checked, Violation};

/// The figures of one run.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub effects_planned: usize,
    pub runs: usize,
    /// Submissions answered 201 or 200 (commands Sluice must keep).
    pub accepted: usize,
    pub resubmitted: u64,
    pub refused_rolled_back: u64,
    /// Batch items answered 503 (admission) and sent again.
    pub backed_off: usize,
    pub batches: u64,
    /// Dispatch requests the upstream received, and those left ambiguous to the caller.
    pub dispatch_calls: u64,
    pub ambiguous_calls: u64,
    pub faults: BTreeMap<String, u64>,
    pub status_checks: u64,
    pub lagged_misses: u64,
    pub reversals: u64,
    pub crashes: BTreeMap<String, u64>,
    pub injected_crashes: usize,
    pub clean_restarts: u32,
    pub statuses: BTreeMap<String, u64>,
    pub escalated: u64,
    pub operator: BTreeMap<String, u64>,
    pub unexpected: Vec<String>,
    /// What the MCP agents did (stories, sessions, calls, retries, re-drives).
    pub mcp: BTreeMap<String, u64>,
    /// The restart that brought the stricter catalog in, if one did.
    pub tightened: Option<String>,
    /// What retention did (purges, runs purged, runs kept owing work).
    pub purges: BTreeMap<String, u64>,
    /// What flow control did (breaker changes, calls and looks held, by why).
    pub flow: BTreeMap<String, u64>,
    pub workload: Duration,
    pub settle: Duration,
    pub total: Duration,
    pub settled: bool,
}

/// The outcome of one seed.
#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    pub checks: Vec<Checked>,
    pub figures: Figures,
    /// Where the run's files are, when kept.
    pub kept: Option<String>,
}

/// How many violations of each invariant are told with their whole story, unless asked.
pub const STORIES_PER_INVARIANT: usize = 5;

impl Report {
    pub fn violations(&self) -> usize {
        self.checks.iter().map(|c| c.violations.len()).sum()
    }

    /// Violations, or answers the runner did not expect (a finding too).
    pub fn failed(&self) -> bool {
        self.violations() > 0 || !self.figures.unexpected.is_empty()
    }

    pub fn render(&self) -> String {
        self.render_with(STORIES_PER_INVARIANT)
    }

    /// The report, with the whole story of the first `stories` violations of each invariant.
    pub fn render_with(&self, stories: usize) -> String {
        let mut out = String::new();
        let f = &self.figures;
        let _ = writeln!(out, "\nsluice-chaos seed {} — invariants", self.seed);
        let mut table = Table::new();
        table.set_header(vec!["invariant", "checked", "violations"]);
        for check in &self.checks {
            table.add_row(vec![
                check.invariant.to_owned(),
                check.checked.to_string(),
                check.violations.len().to_string(),
            ]);
        }
        let _ = writeln!(out, "{table}");
        for check in self.checks.iter().filter(|c| !c.violations.is_empty()) {
            let _ = writeln!(out, "  {}: {}", check.invariant, by_tool(&check.violations));
        }

        let mut figures = Table::new();
        figures.set_header(vec!["figure", "value"]);
        let pct = |n: u64, of: u64| {
            if of == 0 {
                0.0
            } else {
                100.0 * n as f64 / of as f64
            }
        };
        let rows: Vec<(String, String)> = vec![
            (
                "effects (planned / accepted)".into(),
                format!("{} / {}", f.effects_planned, f.accepted),
            ),
            (
                "runs (batched)".into(),
                format!("{} ({})", f.runs, f.batches),
            ),
            (
                "resubmissions answered 200".into(),
                f.resubmitted.to_string(),
            ),
            (
                "refused: run rolled back".into(),
                f.refused_rolled_back.to_string(),
            ),
            (
                "batch items answered 503, sent again".into(),
                f.backed_off.to_string(),
            ),
            (
                "dispatch calls at the upstream".into(),
                f.dispatch_calls.to_string(),
            ),
            (
                "ambiguous calls".into(),
                format!(
                    "{} ({:.1}%)",
                    f.ambiguous_calls,
                    pct(f.ambiguous_calls, f.dispatch_calls)
                ),
            ),
            ("faults".into(), join(&f.faults)),
            (
                "status checks (lookups that missed a lagging commit)".into(),
                format!("{} ({})", f.status_checks, f.lagged_misses),
            ),
            ("reversal requests".into(), f.reversals.to_string()),
            (
                "crashes".into(),
                format!("{} injected\n{}", f.injected_crashes, join(&f.crashes)),
            ),
            ("clean restarts".into(), f.clean_restarts.to_string()),
            ("final statuses".into(), join(&f.statuses)),
            ("escalated commands".into(), f.escalated.to_string()),
            ("operator actions".into(), join(&f.operator)),
            (
                "policy tightened".into(),
                f.tightened.clone().unwrap_or_else(|| "no".into()),
            ),
            ("MCP agents (sluice mcp over HTTP)".into(), join(&f.mcp)),
            ("retention (purges mid-run)".into(), join(&f.purges)),
            ("flow control (phases)".into(), join(&f.flow)),
            (
                "duration".into(),
                format!(
                    "{:.1} s (workload {:.1} s, settle {:.1} s{})",
                    f.total.as_secs_f64(),
                    f.workload.as_secs_f64(),
                    f.settle.as_secs_f64(),
                    if f.settled {
                        ""
                    } else {
                        ", NOT settled by the deadline"
                    }
                ),
            ),
        ];
        for (name, value) in rows {
            figures.add_row(vec![name, value]);
        }
        let _ = writeln!(out, "{figures}");

        for text in &f.unexpected {
            let _ = writeln!(out, "UNEXPECTED (seed {}): {text}", self.seed);
        }
        for check in &self.checks {
            for (i, violation) in check.violations.iter().enumerate() {
                let _ = writeln!(out, "{}", self.describe(violation, i < stories));
            }
        }
        if self.failed() {
            let _ = writeln!(
                out,
                "FAILED: {} violation(s), {} unexpected answer(s); replay with --seed {}",
                self.violations(),
                f.unexpected.len(),
                self.seed
            );
        } else {
            let _ = writeln!(out, "seed {}: every invariant held", self.seed);
        }
        if let Some(dir) = &self.kept {
            let _ = writeln!(out, "run files kept in {dir}");
        }
        out
    }

    /// One violation, naming the seed and the command; with its story when `whole`.
    pub fn describe(&self, v: &Violation, whole: bool) -> String {
        let mut text = format!(
            "VIOLATION {} (seed {}): run {} command {} idempotency key {}: {}",
            v.invariant, self.seed, v.run_id, v.command_key, v.idempotency_key, v.what
        );
        if whole {
            for line in &v.story {
                text.push_str("\n    ");
                text.push_str(line);
            }
        }
        text
    }
}

/// Violations counted by tool (the command key's tool part), largest first.
fn by_tool(violations: &[Violation]) -> String {
    let mut counts: BTreeMap<&str, u64> = BTreeMap::new();
    for v in violations {
        let tool = v
            .command_key
            .split_once('/')
            .and_then(|(_, rest)| rest.rsplit_once('/'))
            .map_or("-", |(tool, _)| tool);
        *counts.entry(tool).or_default() += 1;
    }
    let mut sorted: Vec<_> = counts.into_iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    sorted
        .iter()
        .map(|(tool, n)| format!("{tool} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One `name count` per line, so the table stays narrow.
fn join(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}
