//! The operator at the console while the workload runs: approves or rejects what policy
//! BLOCKED, and settles what the pipeline parked as STUCK (or FAILED on `on_absent = "fail"`)
//! with evidence from the upstream's own record — as a careful person with read access to the
//! bank would.
//!
//! The person acts only on what the record shows: one live commit → resolve CONFIRMED with its
//! reference; none, and no request for the key still being processed → replay (after a dry
//! run) or resolve FAILED; several live commits → leave it escalated (undoing a commit by hand
//! is not this person's call). Every choice between two correct actions is drawn from the seed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use sluice_core::command::{Command, EffectSemantics};
use sluice_core::time::Timestamp;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ChaosError;
use super::api::{Answer, Api};
use super::dice;
use super::upstream::record::now_ms;
use super::upstream::{ChaosUpstream, KeyView};

/// Counts of what the operator did, by action and answer.
#[derive(Debug, Default, Clone)]
pub struct Operated {
    pub actions: BTreeMap<String, u64>,
    pub unexpected: Vec<String>,
    /// Whether runs are purged meanwhile.
    purges: bool,
}

impl Operated {
    fn count(&mut self, action: &str, answer: &Answer) {
        let outcome = match answer.status.as_u16() {
            200 => "applied",
            // The command moved on meanwhile (a rollback cancelled it, a sweep got there).
            409 => "refused",
            // Retention purged its run meanwhile (only a finished run goes, so only an action
            // on a finished command meets this: a replay of a FAILED one).
            404 if self.purges => "gone (run purged)",
            _ => {
                self.unexpected.push(format!(
                    "operator {action}: HTTP {}: {}",
                    answer.status, answer.body
                ));
                "unexpected"
            }
        };
        *self
            .actions
            .entry(format!("{action} {outcome}"))
            .or_default() += 1;
    }
}

/// Acts every `every` until `stop`, on the runs created in the last `window`. Once
/// `settling` is set only BLOCKED commands are acted on, in every run since the operator
/// started: the run is winding down, a replay would start new work, and a command may reach
/// BLOCKED long after its run was created (behind the run's earlier effects; found by seed 77,
/// whose BLOCKED command left the window before anyone looked).
pub async fn operate(
    api: Api,
    upstream: Arc<ChaosUpstream>,
    seed: u64,
    window: Duration,
    every: Duration,
    settling: Arc<AtomicBool>,
    stop: CancellationToken,
) -> Result<Operated, ChaosError> {
    operate_beside_purges(api, upstream, seed, window, every, settling, stop, false).await
}

/// [`operate`], while retention purges finished runs (`purges`): an action on a command whose
/// run was purged meanwhile is then counted, not reported.
#[allow(clippy::too_many_arguments)]
pub async fn operate_beside_purges(
    api: Api,
    upstream: Arc<ChaosUpstream>,
    seed: u64,
    window: Duration,
    every: Duration,
    settling: Arc<AtomicBool>,
    stop: CancellationToken,
    purges: bool,
) -> Result<Operated, ChaosError> {
    let mut operated = Operated {
        purges,
        ..Operated::default()
    };
    let mut blocked_seen: HashMap<(String, String), Instant> = HashMap::new();
    let mut handled: HashSet<(String, String, u32, &'static str)> = HashSet::new();
    let mut round = 0u64;
    let started_ms = now_ms();
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(operated),
            () = tokio::time::sleep(every) => {}
        }
        round += 1;
        let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        let since = if settling.load(Ordering::SeqCst) {
            Timestamp::from_millis(started_ms.saturating_sub(window_ms))
        } else {
            Timestamp::from_millis(now_ms().saturating_sub(window_ms))
        }
        .to_string();
        for command in api.effects_with("BLOCKED", &since).await? {
            let id = (command.run_id.to_string(), command.command_key.to_string());
            let seen = *blocked_seen.entry(id.clone()).or_insert_with(Instant::now);
            let wait = dice::between(seed, &["approval-wait", &id.0, &id.1], 100, 1_500);
            if seen.elapsed() < Duration::from_millis(wait) {
                continue;
            }
            let approve = dice::unit(seed, &["approve", &id.0, &id.1]) < 0.7;
            let (action, reason) = if approve {
                ("approve", "chaos: checked and approved")
            } else {
                ("reject", "chaos: rejected")
            };
            let answer = api
                .act(&id.0, &id.1, action, &json!({ "reason": reason }))
                .await?;
            operated.count(action, &answer);
            blocked_seen.remove(&id);
        }
        if settling.load(Ordering::SeqCst) {
            continue;
        }
        for command in api.effects_with("STUCK", &since).await? {
            let mark = mark(&command, "stuck");
            if handled.contains(&mark) {
                continue;
            }
            if settle_stuck(&api, &upstream, seed, &command, &mut operated).await? {
                handled.insert(mark);
            }
        }
        if round % 4 == 0 {
            for command in api.effects_with("FAILED", &since).await? {
                let mark = mark(&command, "failed");
                if handled.insert(mark) {
                    replay_failed(&api, &upstream, seed, &command, &mut operated).await?;
                }
            }
        }
    }
}

fn mark(command: &Command, what: &'static str) -> (String, String, u32, &'static str) {
    (
        command.run_id.to_string(),
        command.command_key.to_string(),
        command.state.replays,
        what,
    )
}

/// The upstream's record of the key, as evidence for the audit chain.
fn evidence(view: &KeyView, key: &str) -> Value {
    json!({
        "source": "the upstream's own record (chaos runner)",
        "idempotency_key": key,
        "checked_at_ms": now_ms(),
        "commits": view.commits.iter().map(|c| json!({
            "id": c.id,
            "live": c.live(),
            "committed_at_ms": c.committed_at,
        })).collect::<Vec<_>>(),
    })
}

/// Settles one STUCK command if the record allows; `false` to look again later.
async fn settle_stuck(
    api: &Api,
    upstream: &ChaosUpstream,
    seed: u64,
    command: &Command,
    operated: &mut Operated,
) -> Result<bool, ChaosError> {
    let key = command.idempotency_key.to_string();
    let view = upstream.key_view(&key);
    if view.running > 0 {
        // A request for it is still being processed: it may yet commit.
        return Ok(false);
    }
    let (run, ck) = (command.run_id.to_string(), command.command_key.to_string());
    let evidence = evidence(&view, &key);
    let live = view.live();
    match live.len() {
        1 => {
            let body = json!({
                "outcome": "CONFIRMED",
                "external_ref": live[0].id,
                "evidence": evidence,
                "reason": "chaos: the upstream's record shows exactly one live commit",
            });
            let answer = api.act(&run, &ck, "resolve", &body).await?;
            operated.count("resolve confirmed", &answer);
            Ok(true)
        }
        0 => {
            let dry = api
                .act(
                    &run,
                    &ck,
                    "replay",
                    &json!({"reason": "chaos: what would a replay do", "dry_run": true, "evidence": evidence}),
                )
                .await?;
            operated.count("replay dry-run", &dry);
            let allowed = dry.body["allowed"].as_bool().unwrap_or(false);
            if allowed
                && dice::unit(
                    seed,
                    &[
                        "replay-stuck",
                        &run,
                        &ck,
                        &command.state.replays.to_string(),
                    ],
                ) < 0.5
            {
                let answer = api
                    .act(
                        &run,
                        &ck,
                        "replay",
                        &json!({"reason": "chaos: the upstream has no commit; replay", "evidence": evidence}),
                    )
                    .await?;
                operated.count("replay", &answer);
            } else {
                let body = json!({
                    "outcome": "FAILED",
                    "evidence": evidence,
                    "reason": "chaos: the upstream's record shows no live commit",
                });
                let answer = api.act(&run, &ck, "resolve", &body).await?;
                operated.count("resolve failed", &answer);
            }
            Ok(true)
        }
        _ => {
            *operated
                .actions
                .entry("left escalated (several live commits)".into())
                .or_default() += 1;
            Ok(true)
        }
    }
}

/// Replays some FAILED commands whose upstream record shows that nothing ever committed.
async fn replay_failed(
    api: &Api,
    upstream: &ChaosUpstream,
    seed: u64,
    command: &Command,
    operated: &mut Operated,
) -> Result<(), ChaosError> {
    let (run, ck) = (command.run_id.to_string(), command.command_key.to_string());
    if dice::unit(seed, &["replay-failed", &run, &ck]) >= 0.3
        || command.semantics == EffectSemantics::ObserveOnly
    {
        return Ok(());
    }
    let key = command.idempotency_key.to_string();
    let view = upstream.key_view(&key);
    let evidence = evidence(&view, &key);
    let dry = api
        .act(
            &run,
            &ck,
            "replay",
            &json!({"reason": "chaos: what would a replay do", "dry_run": true, "evidence": evidence}),
        )
        .await?;
    operated.count("replay dry-run", &dry);
    if view.running == 0 && view.commits.is_empty() && dry.body["allowed"].as_bool() == Some(true) {
        let answer = api
            .act(
                &run,
                &ck,
                "replay",
                &json!({"reason": "chaos: the upstream never committed it; replay", "evidence": evidence}),
            )
            .await?;
        operated.count("replay", &answer);
    }
    Ok(())
}
