//! What `sluice demo` found, and how it is shown: the report and the table it ends with.

use super::*;

/// Everything the demo saw, and the invariants it found broken.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    pub setup: Setup,
    pub runs: u32,
    pub effects_per_run: u32,
    pub rollback_every: u32,
    pub fault_rate: f64,
    pub skipped_faults: Vec<FaultKind>,
    pub seed: u64,
    pub elapsed_secs: f64,
    /// Commands created (201).
    pub submitted: u64,
    /// Runs rolled back.
    pub rolled_back_runs: u64,
    pub statuses: StatusCounts,
    pub reconciled: Reconciled,
    pub upstream: UpstreamReport,
    pub idempotency: IdempotencyReport,
    pub audit: AuditReport,
    /// The invariants that broke; empty when all held.
    pub violations: Vec<String>,
}

impl DemoReport {
    /// True when every invariant held.
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Final statuses of the submitted commands.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StatusCounts {
    pub confirmed: u64,
    pub failed: u64,
    pub blocked: u64,
    pub cancelled: u64,
    pub stuck: u64,
    pub compensated: u64,
    pub no_compensation: u64,
    pub compensation_failed: u64,
    /// Still moving at the end (PENDING, LEASED, UNKNOWN, COMPENSATING, …): lost by the
    /// deadline.
    pub unsettled: u64,
    /// Commands marked for a person (STUCK, NO_COMPENSATION, failed compensations, duplicates
    /// that could not be undone).
    pub escalated: u64,
}

/// Commands whose audit chain records a status check answer of each kind.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Reconciled {
    pub present: u64,
    pub absent: u64,
    /// Found committed twice, after an ambiguous outcome or by a post-commit verification.
    pub duplicate: u64,
    pub inconclusive: u64,
    /// 2xx commits looked up again (`verify_after_commit`) and found exactly once.
    pub verified_once: u64,
}

/// What the upstream saw.
#[derive(Debug, Clone, Serialize)]
pub struct UpstreamReport {
    pub faults: FaultCounts,
    pub wires_committed: u64,
    pub wires_reversed: u64,
    /// Business keys under which the bank booked more than one wire.
    pub keys_committed_twice: u64,
    /// Of those, keys left with at most one standing wire (the extra commits were undone).
    pub keys_committed_twice_compensated: u64,
    /// Business keys with more than one standing wire at the end.
    pub double_commits: BTreeMap<String, u64>,
    pub status_checks: u64,
    pub emails: u64,
    pub email_replays: u64,
    pub tickets: u64,
    pub tickets_closed: u64,
    pub searches: u64,
}

/// The idempotency contract as the API answered it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IdempotencyReport {
    /// Effects re-submitted with the same key and arguments.
    pub replays: u64,
    /// Of those, answered 200 with the stored command.
    pub replays_answered_stored: u64,
    /// A re-submission with the same key and other arguments answered 409.
    pub drift_refused: Option<bool>,
    /// A wire re-submitted under a new call index with the same business key answered 200
    /// with the existing command.
    pub business_key_answered_existing: Option<bool>,
}

/// The audit chains.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub runs: u64,
    pub verified: u64,
    pub records: u64,
}

pub(super) fn print_header(args: &DemoArgs, setup: &Setup, temporary: bool) {
    let percent = args.fault_rate * 100.0;
    let skipped = if args.skip_faults.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = args.skip_faults.iter().map(|kind| kind.as_str()).collect();
        format!(" except {}", names.join(", "))
    };
    println!(
        "sluice demo: {} runs x {} effects ({} in all), rollback every {} run(s), fault rate {}, seed {}",
        args.runs,
        args.effects,
        u64::from(args.runs) * u64::from(args.effects),
        args.rollback_every,
        args.fault_rate,
        args.seed
    );
    println!(
        "  upstream  {}  each fault kind at {percent}% per call (status checks inconclusive too){skipped}; \
         commit_then_timeout holds its answer {} ms",
        setup.upstream_url, setup.timeout_sleep_ms
    );
    println!(
        "  catalog   deploy/catalog.toml with every tool timeout cut to {} ms and settle_ms to {} ms, \
         so the demo stays short",
        setup.tool_timeout_ms, setup.settle_ms
    );
    println!(
        "  pipeline  {}  {} bus partitions, sweep every {} ms",
        setup.producer_url, setup.partitions, setup.sweep_interval_ms
    );
    println!(
        "  ledger    {}{}",
        setup.data_dir.display(),
        if temporary && !args.keep {
            " (removed at the end; --keep keeps it)"
        } else {
            ""
        }
    );
    println!();
}

pub(super) fn print_report(report: &DemoReport) {
    let s = &report.statuses;
    let r = &report.reconciled;
    let u = &report.upstream;
    let f = &u.faults;
    let i = &report.idempotency;
    let yes_no = |answer: Option<bool>| match answer {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "not tried",
    };
    let rows: Vec<(String, String)> = vec![
        ("submitted".into(), report.submitted.to_string()),
        ("confirmed".into(), s.confirmed.to_string()),
        ("failed".into(), s.failed.to_string()),
        ("blocked (awaiting approval)".into(), s.blocked.to_string()),
        ("cancelled".into(), s.cancelled.to_string()),
        (
            "reconciled present / absent / duplicate".into(),
            format!("{} / {} / {}", r.present, r.absent, r.duplicate),
        ),
        (
            "  (status checks inconclusive)".into(),
            r.inconclusive.to_string(),
        ),
        (
            "2xx commits verified, found once".into(),
            r.verified_once.to_string(),
        ),
        (
            "runs rolled back".into(),
            report.rolled_back_runs.to_string(),
        ),
        ("compensated".into(), s.compensated.to_string()),
        ("no_compensation".into(), s.no_compensation.to_string()),
        (
            "compensation_failed".into(),
            s.compensation_failed.to_string(),
        ),
        ("stuck".into(), s.stuck.to_string()),
        ("escalated".into(), s.escalated.to_string()),
        ("unsettled at the deadline".into(), s.unsettled.to_string()),
        (
            "upstream faults injected".into(),
            format!(
                "{} (commit_then_timeout {}, drop_response {}, error_5xx {}, commit_then_5xx {}, commit_twice {}, status_inconclusive {})",
                f.total(),
                f.commit_then_timeout,
                f.drop_response,
                f.error_5xx,
                f.commit_then_5xx,
                f.commit_twice,
                f.status_inconclusive
            ),
        ),
        (
            "wires booked / reversed".into(),
            format!("{} / {}", u.wires_committed, u.wires_reversed),
        ),
        (
            "wires committed twice (one business key)".into(),
            format!(
                "{}, compensated {}, still standing twice {}",
                u.keys_committed_twice,
                u.keys_committed_twice_compensated,
                u.double_commits.len()
            ),
        ),
        (
            "emails sent (key replays) / tickets".into(),
            format!("{} ({}) / {}", u.emails, u.email_replays, u.tickets),
        ),
        (
            "replays with same key and args -> 200".into(),
            format!("{}/{}", i.replays_answered_stored, i.replays),
        ),
        (
            "same key, other args -> 409".into(),
            yes_no(i.drift_refused).into(),
        ),
        (
            "same business key, new call -> existing".into(),
            yes_no(i.business_key_answered_existing).into(),
        ),
        (
            "audit chains verified".into(),
            format!(
                "{}/{} ({} records)",
                report.audit.verified, report.audit.runs, report.audit.records
            ),
        ),
    ];
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in rows {
        println!("  {name:<width$}  {value}");
    }
    println!();
    if report.ok() {
        println!(
            "invariants hold: no double commit left standing, nothing lost, every audit chain verifies ({:.1} s)",
            report.elapsed_secs
        );
    } else {
        println!("INVARIANTS BROKEN ({:.1} s):", report.elapsed_secs);
        for violation in &report.violations {
            println!("  - {violation}");
        }
    }
}
