//! Retention while the work goes on: an operator purges finished runs (`POST /v1/audit/purge`)
//! every few seconds through the workload and the settling, with a cutoff as recent as the
//! agents allow, so a purge meets runs whose commands are terminal but still owe a last look
//! or a duplicate's clean-up, and must keep them.
//!
//! A purged run's commands and audit chain are gone from the ledger, so the oracle reads them
//! first: before each purge, every run the purge may take (finished, created and last changed
//! before the cutoff: `GET /v1/runs`) is read whole ([`Snapshot`]). A run untouched since the
//! cutoff that a purge removed is exactly as read, which the purge's own checkpoint confirms
//! (the chain's length and last hash); the invariants then judge the snapshot against the
//! upstream's record like any run read at the end. A purged run must have had every command
//! terminal and owing nothing ([`sluice_core::retention`]).
//!
//! The runner never purges a run its agents still use: the cutoff stays before the first
//! submission of every run whose submissions, cancels, rollback or MCP conversation are not
//! over ([`Activity`]) — an operator's retention is for runs nobody works on any more.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use sluice_core::audit::{AuditEntry, Checkpoint};
use sluice_core::command::Command;
use sluice_core::time::Timestamp;
use sluice_ledger::{PurgeReport, RunSummary};
use tokio_util::sync::CancellationToken;

use super::ChaosError;
use super::api::{Api, Role};
use super::upstream::record::now_ms;

/// The runs the agents still work on, each with when its first request went out.
#[derive(Debug, Clone, Default)]
pub struct Activity(Arc<Mutex<HashMap<String, (i64, u32)>>>);

/// One piece of work on a run; the run is the agents' while any is held.
#[derive(Debug)]
pub struct Hold {
    activity: Activity,
    run: String,
}

impl Activity {
    /// Holds `run` until the returned guard is dropped.
    pub fn hold(&self, run: &str) -> Hold {
        let mut runs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = runs.entry(run.to_owned()).or_insert((now_ms(), 0));
        slot.1 += 1;
        Hold {
            activity: self.clone(),
            run: run.to_owned(),
        }
    }

    /// When the oldest run still held was first worked on.
    pub fn oldest(&self) -> Option<i64> {
        let runs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        runs.values().map(|(first, _)| *first).min()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut runs = self
            .activity
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = runs.get_mut(&self.run) {
            slot.1 = slot.1.saturating_sub(1);
            if slot.1 == 0 {
                runs.remove(&self.run);
            }
        }
    }
}

/// A run as read just before a purge that may take it.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub commands: Vec<Command>,
    pub audit: Vec<AuditEntry>,
    /// `GET …/audit/verify`.
    pub verdict: Value,
}

/// A run a purge removed, and what the runner read of it first.
#[derive(Debug, Clone)]
pub struct Purged {
    pub run_id: String,
    /// `None`: the purge took a run the runner had not read (it was not finished, or changed or
    /// was created after the cutoff, as the listing said).
    pub snapshot: Option<Snapshot>,
    /// The purge's checkpoint; `None` when its answer was lost and the run was found gone.
    pub checkpoint: Option<Checkpoint>,
    /// The purge's cutoff (ms since the epoch).
    pub cutoff_ms: i64,
}

/// What the purges did.
#[derive(Debug, Default, Clone)]
pub struct Purges {
    pub rounds: u64,
    pub purged: Vec<Purged>,
    /// Runs kept because a command still owed work, summed over the purges.
    pub kept_runs: u64,
    /// The kept runs the purges named, by what was owed.
    pub kept: BTreeMap<String, u64>,
    /// Purges whose answer was lost (the pipeline crashed): what they removed was read back.
    pub unanswered: u64,
    pub unexpected: Vec<String>,
}

/// How the purges are paced.
#[derive(Debug, Clone)]
pub struct Retention {
    pub every: Duration,
    /// A run must be unchanged this long (and its agents done) to be purged: at least twice
    /// the clock skew between services, so no write after the cutoff can carry an earlier time.
    pub age: Duration,
    /// Kept between the cutoff and the first request of a run the agents still work on.
    pub margin: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(5),
            age: Duration::from_millis(1_000),
            margin: Duration::from_millis(1_000),
        }
    }
}

/// Purges every `retention.every` until `stop`; `since_ms` is the run's start (no run is
/// older).
pub async fn purge_loop(
    api: Api,
    activity: Activity,
    retention: Retention,
    since_ms: i64,
    stop: CancellationToken,
) -> Purges {
    let mut purges = Purges::default();
    loop {
        tokio::select! {
            () = stop.cancelled() => return purges,
            () = tokio::time::sleep(retention.every) => {}
        }
        let now = now_ms();
        let age = i64::try_from(retention.age.as_millis()).unwrap_or(i64::MAX);
        let margin = i64::try_from(retention.margin.as_millis()).unwrap_or(i64::MAX);
        let cutoff = activity
            .oldest()
            .map_or(now - age, |oldest| (now - age).min(oldest - margin));
        if cutoff <= since_ms {
            continue;
        }
        if let Err(e) = round(&api, &mut purges, since_ms, cutoff).await {
            purges
                .unexpected
                .push(format!("purge round {}: {e}", purges.rounds + 1));
        }
    }
}

/// One purge: read what it may take, purge, and account for what it took.
async fn round(
    api: &Api,
    purges: &mut Purges,
    since_ms: i64,
    cutoff: i64,
) -> Result<(), ChaosError> {
    let candidates = purgeable(api, since_ms, cutoff, purges).await?;
    if candidates.is_empty() {
        return Ok(());
    }
    let read: Vec<(String, Snapshot)> = futures::stream::iter(candidates)
        .map(|run| async move {
            let snapshot = Snapshot {
                commands: api.run_commands(&run).await?,
                audit: api.audit(&run).await?,
                verdict: api.verify(&run).await?,
            };
            Ok::<_, ChaosError>((run, snapshot))
        })
        .buffer_unordered(8)
        .try_collect()
        .await?;
    let mut snapshots: HashMap<String, Snapshot> = read.into_iter().collect();
    purges.rounds += 1;
    let body = json!({
        "older_than": Timestamp::from_millis(cutoff).to_string(),
        "reason": format!("chaos: retention round {}", purges.rounds),
        "max_runs": 1000,
    });
    // Once: a purge asked again after a lost answer would not say what the first removed.
    let answer = api
        .try_call(Role::Admin, Method::POST, "/v1/audit/purge", Some(&body))
        .await;
    let report = match &answer {
        Some(answer) if answer.status.is_success() => Some(
            serde_json::from_value::<PurgeReport>(answer.body["report"].clone()).map_err(|e| {
                ChaosError::Unexpected {
                    what: "POST /v1/audit/purge".into(),
                    status: answer.status.as_u16(),
                    body: format!("not a purge report ({e}): {}", answer.body),
                }
            })?,
        ),
        Some(answer) if !matches!(answer.status.as_u16(), 502..=504) => {
            return Err(ChaosError::Unexpected {
                what: "POST /v1/audit/purge".into(),
                status: answer.status.as_u16(),
                body: answer.body.to_string(),
            });
        }
        // No answer (the pipeline crashed under it) or unavailable: it may have purged.
        _ => None,
    };
    match report {
        Some(report) => {
            purges.kept_runs += report.kept_runs;
            for kept in &report.kept {
                *purges.kept.entry(kept.owed.to_string()).or_default() += 1;
            }
            for checkpoint in report.checkpoints {
                let run_id = checkpoint.run_id.to_string();
                purges.purged.push(Purged {
                    snapshot: snapshots.remove(&run_id),
                    run_id,
                    checkpoint: Some(checkpoint),
                    cutoff_ms: cutoff,
                });
            }
        }
        None => {
            purges.unanswered += 1;
            // What it removed: the runs read for it that are gone now (a purged run's chain is
            // its checkpoint alone).
            let runs: Vec<String> = snapshots.keys().cloned().collect();
            for run_id in runs {
                let path = format!("/v1/runs/{run_id}/audit");
                let trail = api.call(Role::Admin, Method::GET, &path, None).await?;
                let gone = !trail.body["checkpoint"].is_null()
                    && trail.body["entries"].as_array().is_some_and(Vec::is_empty);
                if gone {
                    let checkpoint = serde_json::from_value(trail.body["checkpoint"].clone()).ok();
                    purges.purged.push(Purged {
                        snapshot: snapshots.remove(&run_id),
                        run_id,
                        checkpoint,
                        cutoff_ms: cutoff,
                    });
                }
            }
        }
    }
    Ok(())
}

/// The runs a purge at `cutoff` may take: finished (no open command), created and last changed
/// before the cutoff, and not purged already.
async fn purgeable(
    api: &Api,
    since_ms: i64,
    cutoff: i64,
    purges: &Purges,
) -> Result<Vec<String>, ChaosError> {
    let gone: std::collections::HashSet<&str> =
        purges.purged.iter().map(|p| p.run_id.as_str()).collect();
    let since = Timestamp::from_millis(since_ms - 60_000).to_string();
    let mut runs = Vec::new();
    let mut before = String::new();
    loop {
        let path = format!("/v1/runs?since={since}&limit=1000{before}");
        let answer = api.call(Role::Admin, Method::GET, &path, None).await?;
        if !answer.status.is_success() {
            return Err(ChaosError::Unexpected {
                what: path,
                status: answer.status.as_u16(),
                body: answer.body.to_string(),
            });
        }
        let page: Vec<RunSummary> =
            serde_json::from_value(answer.body["runs"].clone()).map_err(|e| {
                ChaosError::Unexpected {
                    what: path.clone(),
                    status: 200,
                    body: format!("not a list of runs ({e})"),
                }
            })?;
        runs.extend(
            page.into_iter()
                .filter(|r| {
                    r.open_commands == 0
                        && r.created_at.as_millis() < cutoff
                        && r.updated_at.as_millis() < cutoff
                        && !gone.contains(r.run_id.as_str())
                })
                .map(|r| r.run_id.to_string()),
        );
        match answer.body["next"].as_str() {
            Some(next) => before = format!("&before={next}"),
            None => return Ok(runs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_held_until_every_piece_of_work_on_it_is_done() {
        let activity = Activity::default();
        assert_eq!(activity.oldest(), None);
        let submissions = activity.hold("r-1");
        let first = activity.oldest().expect("held");
        let rollback = activity.hold("r-1");
        drop(submissions);
        assert_eq!(
            activity.oldest(),
            Some(first),
            "its rollback is still to come"
        );
        let other = activity.hold("r-2");
        drop(rollback);
        assert!(activity.oldest().is_some_and(|t| t >= first));
        drop(other);
        assert_eq!(activity.oldest(), None);
    }
}
