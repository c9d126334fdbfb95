//! The upstream's phases (issue 30, flow control): a third of the way through the workload the
//! upstream rate-limits 30 % of calls (429 `Retry-After: 1`), two thirds of the way the bank's
//! endpoints answer every call and lookup 503, each for `Options::phases`; and what flow
//! control did about them, read back from the ledger for the report.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::upstream::{self, ChaosUpstream};
use super::{ChaosError, api, catalog};

/// The upstream's phases over a workload of `workload` (see [`Options::phases`]).
pub async fn play(
    upstream: Arc<ChaosUpstream>,
    workload: Duration,
    length: Duration,
    progress: bool,
) {
    let bank: Vec<String> = catalog::ToolKind::ALL
        .into_iter()
        .filter(|kind| kind.upstream() == Some("bank"))
        .map(|kind| kind.endpoint().to_owned())
        .collect();
    let phases = [
        upstream::Phase::RateLimited {
            share: 0.3,
            retry_after_s: 1,
        },
        upstream::Phase::Outage { endpoints: bank },
    ];
    let mut at = Duration::ZERO;
    for (n, phase) in phases.into_iter().enumerate() {
        let start = workload.mul_f64((n + 1) as f64 / 3.0);
        tokio::time::sleep(start.saturating_sub(at)).await;
        if progress {
            eprintln!("phase: {phase:?} for {:.0} s", length.as_secs_f64());
        }
        upstream.set_phase(phase);
        tokio::time::sleep(length).await;
        upstream.set_phase(upstream::Phase::Normal);
        at = start + length;
    }
}

/// What flow control did: the breakers' changes (in the ledger's own chain) and the holds of
/// the runs still in the ledger, by why.
pub async fn figures(
    api: &api::Api,
    audits: &HashMap<String, Vec<sluice_core::audit::AuditEntry>>,
) -> Result<BTreeMap<String, u64>, ChaosError> {
    let system = api.audit(sluice_ledger::SYSTEM_RUN).await?;
    let mut figures = BTreeMap::new();
    for (what, text) in [
        ("breaker opened", "circuit breaker opened"),
        ("breaker half open", "circuit breaker half open"),
        ("breaker closed", "circuit breaker closed"),
    ] {
        let n = system
            .iter()
            .filter(|e| e.record.reason.contains(text))
            .count();
        figures.insert(what.to_owned(), n as u64);
    }
    for entries in audits.values() {
        for entry in entries {
            let reason = &entry.record.reason;
            let held = if reason.starts_with("look held until") {
                "looks held"
            } else if !reason.starts_with("held until") {
                continue;
            } else if reason.contains("circuit breaker") {
                "calls held (breaker)"
            } else if reason.contains("'s rate") {
                "calls held (rate)"
            } else {
                "calls held (other)"
            };
            *figures.entry(held.to_owned()).or_default() += 1;
        }
    }
    Ok(figures)
}
