//! The agents: they submit the planned runs through the real HTTP API at a steady pace, and
//! the operator actions tied to a run — its rollback while effects are in flight, cancels of
//! scheduled effects — go out as planned.
//!
//! Every answered submission is recorded: 201 or 200 means the command is Sluice's to keep
//! (NothingLost is checked over exactly these), 409 `run_rolled_back` means it was refused.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_core::time::Timestamp;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::ChaosError;
use super::api::{Api, Role};
use super::catalog::ToolKind;
use super::purge::Activity;
use super::workload::{EffectPlan, RunPlan};

/// A command Sluice accepted.
#[derive(Debug, Clone)]
pub struct Accepted {
    pub run_id: String,
    pub command_key: String,
    pub idempotency_key: String,
    pub tool: ToolKind,
    /// (decision, call_idx): the journal position.
    pub journal: (u32, u32),
    /// The tool's business key for its arguments, when it declares one.
    pub business_key: Option<String>,
}

/// A rollback an operator asked for.
#[derive(Debug, Clone)]
pub struct RollbackAsk {
    pub run_id: String,
    /// Unique per request, so the audit records of one rollback can be told from another's.
    pub reason: String,
    pub status: Option<u16>,
}

/// What the agents did.
#[derive(Debug, Default)]
pub struct Driven {
    pub accepted: Vec<Accepted>,
    /// Answered 200 (a resubmission after a lost answer found the command already recorded).
    pub resubmitted: u64,
    pub refused_rolled_back: u64,
    /// Batch items answered 503 by admission and sent again after their Retry-After.
    pub backed_off: usize,
    pub batches: u64,
    pub rollbacks: Vec<RollbackAsk>,
    pub cancels: BTreeMap<&'static str, u64>,
    /// Answers the runner did not expect: each is a finding about the API or the runner.
    pub unexpected: Vec<String>,
}

type Shared = Arc<Mutex<Driven>>;

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Driven> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Submits every run of `plan`, effect `i` of the whole plan no earlier than `i / rate`
/// seconds after the start, with `agents` runs in flight at once. Returns when every
/// submission and every planned action has been answered.
pub async fn drive(
    api: Api,
    plan: Vec<RunPlan>,
    rate: f64,
    agents: usize,
) -> Result<Driven, ChaosError> {
    drive_noting(api, plan, rate, agents, Activity::default()).await
}

/// [`drive`], holding each run in `activity` from its first submission until its submissions,
/// cancels and rollback are all answered (retention leaves it alone meanwhile).
pub async fn drive_noting(
    api: Api,
    plan: Vec<RunPlan>,
    rate: f64,
    agents: usize,
    activity: Activity,
) -> Result<Driven, ChaosError> {
    let shared: Shared = Arc::default();
    let start = Instant::now();
    let spacing = Duration::from_secs_f64(1.0 / rate.max(0.001));
    let mut offsets = Vec::with_capacity(plan.len());
    let mut next = 0u32;
    for run in &plan {
        offsets.push(next);
        next += u32::try_from(run.effects.len()).unwrap_or(u32::MAX);
    }
    let queue = Arc::new(Mutex::new(
        plan.into_iter().zip(offsets).collect::<Vec<_>>(),
    ));
    queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .reverse();
    let mut agents_set = JoinSet::new();
    let actions = Arc::new(Mutex::new(JoinSet::new()));
    for _ in 0..agents.max(1) {
        let (api, shared, queue, actions, activity) = (
            api.clone(),
            Arc::clone(&shared),
            Arc::clone(&queue),
            Arc::clone(&actions),
            activity.clone(),
        );
        agents_set.spawn(async move {
            loop {
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).pop();
                let Some((run, offset)) = next else {
                    return Ok::<(), ChaosError>(());
                };
                let at = |i: usize| start + spacing * (offset + u32::try_from(i).unwrap_or(0));
                submit_run(&api, &shared, &run, at, &actions, &activity).await?;
            }
        });
    }
    while let Some(joined) = agents_set.join_next().await {
        joined.map_err(|e| ChaosError::Setup(format!("an agent task failed: {e}")))??;
    }
    let mut pending = std::mem::take(&mut *actions.lock().unwrap_or_else(PoisonError::into_inner));
    while let Some(joined) = pending.join_next().await {
        joined.map_err(|e| ChaosError::Setup(format!("an operator task failed: {e}")))??;
    }
    let driven = std::mem::take(&mut *lock(&shared));
    Ok(driven)
}

async fn submit_run(
    api: &Api,
    shared: &Shared,
    run: &RunPlan,
    at: impl Fn(usize) -> Instant,
    actions: &Arc<Mutex<JoinSet<Result<(), ChaosError>>>>,
    activity: &Activity,
) -> Result<(), ChaosError> {
    tokio::time::sleep_until(at(0)).await;
    let _submitting = activity.hold(&run.run_id);
    if run.batch {
        // Items answered 503 (admission: the ledger or the bus is behind; nothing of them was
        // recorded) are sent again after their Retry-After, as a client does.
        let deadline = Instant::now() + super::api::ADMISSION_PATIENCE;
        let mut pending: Vec<&EffectPlan> = run.effects.iter().collect();
        while !pending.is_empty() {
            let bodies: Vec<Value> = pending.iter().map(|e| e.submission(&run.run_id)).collect();
            let answer = api.batch(&bodies).await?;
            lock(shared).batches += 1;
            if answer.status != StatusCode::OK {
                lock(shared).unexpected.push(format!(
                    "batch of {}: HTTP {}: {}",
                    run.run_id, answer.status, answer.body
                ));
                break;
            }
            let results = answer.body["results"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut again = Vec::new();
            let mut wait_s = 0;
            for (effect, result) in pending.iter().zip(results) {
                let status = result["status"].as_u64().unwrap_or(0);
                if status == 503 && Instant::now() < deadline {
                    wait_s = wait_s.max(
                        result["error"]["details"]["retry_after_s"]
                            .as_u64()
                            .unwrap_or(1),
                    );
                    again.push(*effect);
                    continue;
                }
                record(shared, run, effect, status, &result["command"], &result);
            }
            if !again.is_empty() {
                lock(shared).backed_off += again.len();
                tokio::time::sleep(Duration::from_secs(wait_s)).await;
            }
            pending = again;
        }
    } else {
        for (i, effect) in run.effects.iter().enumerate() {
            tokio::time::sleep_until(at(i)).await;
            let answer = api.submit(&effect.submission(&run.run_id)).await?;
            record(
                shared,
                run,
                effect,
                u64::from(answer.status.as_u16()),
                &answer.body,
                &answer.body,
            );
        }
    }
    for effect in &run.effects {
        if let Some(after) = effect.cancel_after_ms {
            let (api, shared) = (api.clone(), Arc::clone(shared));
            let (run_id, key) = (run.run_id.clone(), effect.command_key());
            let hold = activity.hold(&run_id);
            actions
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .spawn(async move {
                    let _hold = hold;
                    tokio::time::sleep(Duration::from_millis(after)).await;
                    cancel(&api, &shared, &run_id, &key).await
                });
        }
    }
    if let Some(after) = run.rollback_after_ms {
        let (api, shared, run_id) = (api.clone(), Arc::clone(shared), run.run_id.clone());
        let hold = activity.hold(&run_id);
        actions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .spawn(async move {
                let _hold = hold;
                tokio::time::sleep(Duration::from_millis(after)).await;
                rollback(&api, &shared, &run_id).await
            });
    }
    Ok(())
}

fn record(
    shared: &Shared,
    run: &RunPlan,
    effect: &EffectPlan,
    status: u64,
    command: &Value,
    whole: &Value,
) {
    let mut driven = lock(shared);
    match status {
        200 | 201 => {
            if status == 200 {
                driven.resubmitted += 1;
            }
            let Some(idempotency_key) = command["idempotency_key"].as_str() else {
                driven.unexpected.push(format!(
                    "{} {}: a {status} without an idempotency key: {whole}",
                    run.run_id,
                    effect.command_key()
                ));
                return;
            };
            driven.accepted.push(Accepted {
                run_id: run.run_id.clone(),
                command_key: effect.command_key(),
                idempotency_key: idempotency_key.to_owned(),
                tool: effect.tool,
                journal: (effect.decision, effect.call_idx),
                business_key: effect.business_key(),
            });
        }
        409 if whole["error"]["code"] == "run_rolled_back" => driven.refused_rolled_back += 1,
        _ => driven.unexpected.push(format!(
            "submission of {} {}: HTTP {status}: {whole}",
            run.run_id,
            effect.command_key()
        )),
    }
}

async fn cancel(api: &Api, shared: &Shared, run_id: &str, key: &str) -> Result<(), ChaosError> {
    let answer = api
        .act(
            run_id,
            key,
            "cancel",
            &json!({"reason": "chaos: not needed after all"}),
        )
        .await?;
    let outcome = match answer.status.as_u16() {
        200 => "cancelled",
        // It started, ended, or was never recorded (a submission refused after a rollback).
        409 => "too late",
        404 => "not recorded",
        _ => {
            lock(shared).unexpected.push(format!(
                "cancel of {run_id} {key}: HTTP {}: {}",
                answer.status, answer.body
            ));
            "unexpected"
        }
    };
    *lock(shared).cancels.entry(outcome).or_default() += 1;
    Ok(())
}

/// Rolls the run back. Each HTTP attempt carries its own reason: an attempt whose answer was
/// lost may have applied, and a second rollback is a rollback of its own.
async fn rollback(api: &Api, shared: &Shared, run_id: &str) -> Result<(), ChaosError> {
    let deadline = Instant::now() + api.patience;
    for attempt in 1.. {
        let reason = format!(
            "chaos rollback of {run_id} #{attempt} at {}",
            Timestamp::from_millis(super::upstream::record::now_ms())
        );
        let path = format!("/v1/runs/{run_id}/rollback");
        let answer = api
            .try_call(
                Role::Admin,
                Method::POST,
                &path,
                Some(&json!({ "reason": reason })),
            )
            .await;
        let status = answer.as_ref().map(|a| a.status.as_u16());
        let done = matches!(status, Some(s) if !(502..=504).contains(&s));
        lock(shared).rollbacks.push(RollbackAsk {
            run_id: run_id.to_owned(),
            reason,
            status,
        });
        if done {
            // 202: rolled back now; 200 with `already_rolled_back`: an earlier attempt (whose
            // answer was lost) rolled it back, and this one wrote nothing.
            if let Some(answer) = answer
                && answer.status != StatusCode::ACCEPTED
                && !(answer.status == StatusCode::OK
                    && answer.body["already_rolled_back"] == json!(true))
            {
                lock(shared).unexpected.push(format!(
                    "rollback of {run_id}: HTTP {}: {}",
                    answer.status, answer.body
                ));
            }
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ChaosError::Unanswered {
                what: format!("rollback of {run_id}"),
                secs: api.patience.as_secs(),
                last: format!("{status:?}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
