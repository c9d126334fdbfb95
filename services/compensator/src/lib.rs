//! The compensator: rolls runs back and cleans up duplicate commits.
//!
//! Run rollback (Fuze's saga semantics): the run's commands that have not started are
//! cancelled; then its CONFIRMED commands are compensated one at a time in reverse journal
//! order (last effect first). OBSERVE_ONLY commands are skipped — a read has nothing to undo; a
//! tool without `compensate` ends NO_COMPENSATION with `escalated = true`. Each compensation's
//! start and end are recorded, the end taken after the compensate call returned, and every step
//! is in the run's audit chain. Commands still in flight (LEASED, UNKNOWN, retrying after an
//! ambiguous attempt, STUCK) when the rollback runs are marked: the core turns a commit they
//! turn out to have made into a compensation, and nothing earlier in the journal is undone
//! before them (`machine::next_to_compensate`), so compensations stay last-in-first-out.
//!
//! Every outcome is written fenced by the epoch of the claim it was made under: a
//! compensator whose claim lapsed (it stalled, another took over) cannot overwrite the result
//! of the one that took over, nor spend its attempts. A compensate call that fails
//! transiently leaves its command COMPENSATING with a due time; the sweep brings it back, and
//! it still waits for every later command of the run to be undone first.

use futures::future::BoxFuture;
use sluice_bus::{BusError, Delivery, Group, Topic};
use sluice_connector::CompensationTarget;
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, Event, Job, UndoTarget};
use sluice_runtime::config::CompensatorConfig;
use sluice_runtime::consumer::{ConsumerSpec, Handled, Skipped, consume};
use sluice_runtime::messages::{CompensateJob, CompensateRequest, decode};
use sluice_runtime::{Context, PipelineError, Shutdown, Sites};

/// The actor named in the audit chain for compensation steps.
pub const ACTOR: &str = "compensator";

/// Consumes compensation requests until `shutdown`.
pub fn run(
    ctx: Context,
    config: CompensatorConfig,
    shutdown: Shutdown,
) -> BoxFuture<'static, Result<(), BusError>> {
    Box::pin(run_body(ctx, config, shutdown))
}

async fn run_body(
    ctx: Context,
    config: CompensatorConfig,
    shutdown: Shutdown,
) -> Result<(), BusError> {
    let spec = ConsumerSpec {
        topic: Topic::Compensate,
        group: ctx.bus.group_id(Group::Compensators),
        member: format!("{ACTOR}-{}", std::process::id()),
        concurrency: config.concurrency,
        lanes: None,
    };
    let (bus, metrics) = (ctx.bus.clone(), ctx.metrics.clone());
    consume(bus, metrics, spec, shutdown, move |delivery: Delivery| {
        let ctx = ctx.clone();
        async move {
            let request: CompensateRequest = match decode("compensate request", delivery.payload())
            {
                Ok(request) => request,
                Err(e) => return Ok(Handled::Reject(e)),
            };
            if request.job == CompensateJob::NewerKind {
                // A newer build's job: its command's own job comes again from the sweep.
                return Ok(Handled::Skip(Skipped::UnknownKind));
            }
            handle(&ctx, request).await?;
            Ok(Handled::Done)
        }
    })
    .await
}

/// Carries out one compensation request.
pub async fn handle(ctx: &Context, request: CompensateRequest) -> Result<(), PipelineError> {
    match request.job {
        CompensateJob::Rollback { .. } => compensate_run(ctx, &request.run_id).await,
        CompensateJob::Command { command_key } => {
            if let Some(command) = ctx.ledger.get(&request.run_id, &command_key).await? {
                compensate(ctx, command).await?;
            }
            Ok(())
        }
        CompensateJob::Duplicate {
            command_key,
            extra_refs,
        } => settle_duplicate(ctx, &request.run_id, &command_key, &extra_refs).await,
        // Nothing this build can carry out (the consume loop skips it before it gets here).
        CompensateJob::NewerKind => Ok(()),
    }
}

/// Compensates a run's COMPENSATING commands one at a time, last in the journal first. The
/// rollback itself was begun durably by whoever asked for it (`Context::begin_rollback`):
/// every command to undo is already COMPENSATING in the ledger, so this job, lost or
/// repeated, changes nothing but the order — the sweep finishes what it leaves.
#[tracing::instrument(skip(ctx), fields(run_id = %run_id))]
pub async fn compensate_run(ctx: &Context, run_id: &RunId) -> Result<(), PipelineError> {
    // One at a time, each chosen afresh from the run as it is now: the last one still to be
    // undone, unless a later command is still in flight under the rollback.
    loop {
        let commands = ctx.ledger.list_run(run_id, None).await?;
        let Some(index) = machine::next_to_compensate(&commands, |command| &command.state) else {
            return Ok(());
        };
        let command = commands[index].clone();
        let key = command.command_key.clone();
        compensate_one(ctx, command).await?;
        // Not finished (a transient failure, or another compensator holds it): the sweep or
        // the holder carries on from here.
        let now = ctx.ledger.get(run_id, &key).await?;
        if now.is_some_and(|command| machine::awaits_compensation(&command.state)) {
            return Ok(());
        }
    }
}

/// Rolls a run back: begins it durably, then compensates in reverse journal order.
pub async fn rollback(
    ctx: &Context,
    run_id: &RunId,
    actor: &str,
    reason: &str,
) -> Result<(), PipelineError> {
    ctx.begin_rollback(run_id, actor, reason).await?;
    compensate_run(ctx, run_id).await
}

/// Compensates a COMPENSATING command when its turn has come (nothing later in its run's
/// journal is still to be undone), then the run's next ones; otherwise leaves it for the
/// compensation of the later command to reach.
pub async fn compensate(ctx: &Context, command: Command) -> Result<(), PipelineError> {
    if !machine::awaits_compensation(&command.state) {
        return Ok(());
    }
    compensate_run(ctx, &command.run_id).await
}

/// Calls compensate for a COMPENSATING command and records what happened.
#[tracing::instrument(skip(ctx, command), fields(run_id = %command.run_id, command_key = %command.command_key))]
async fn compensate_one(ctx: &Context, command: Command) -> Result<(), PipelineError> {
    // Claimed first, for the whole job (every owed extra commit and the command's own, as
    // the core sizes it): one job at a time per command (a rollback job and a sweep may both
    // get here), and its start is when the calls start.
    let claim =
        |current: &Command| machine::plan_compensate(&current.state, &ctx.rules_of(current));
    if claim(&command).is_none() {
        return Ok(());
    }
    sluice_faults::point!("compensator.claim.pre");
    // Refused while another job holds it (`claimed_until`): that job's result, or its claim's
    // end, brings the command back.
    let claimed = ctx
        .run_job(Job::Compensate, ACTOR, command, Sites::NONE, claim)
        .await?;
    let Some(command) = claimed.applied() else {
        return Ok(());
    };
    sluice_faults::point!("compensator.claim.post");
    sluice_faults::point!("compensator.call.pre");
    let outcome = match machine::compensation_calls(&command, ctx.catalog.get(&command.tool)) {
        Ok((tool, targets)) => {
            let mut answers = Vec::with_capacity(targets.len());
            for target in targets {
                let call = match &target {
                    UndoTarget::ExtraCommit(extra) => CompensationTarget::ExtraCommit {
                        external_ref: extra.clone(),
                    },
                    UndoTarget::OwnCommit => CompensationTarget::OwnCommit,
                };
                let answer = ctx.connector.compensate(tool, &command, call).await;
                answers.push((target, answer));
            }
            machine::fold_compensation(answers)
        }
        Err(outcome) => outcome,
    };
    sluice_faults::point!("compensator.call.post");
    // `run_job` takes "now" after the calls returned: that is the compensation's end time.
    // The core refuses the result if the claim's epoch is no longer current.
    let claimed_epoch = command.epoch();
    sluice_faults::point!("compensator.write.pre");
    let sites = Sites {
        carrying: || sluice_faults::point!("compensator.write.post"),
        ..Sites::NONE
    };
    ctx.run_job(Job::Compensate, ACTOR, command, sites, |current| {
        machine::compensated_event(&current.state, claimed_epoch, &outcome)
    })
    .await?;
    Ok(())
}

/// Undoes the extra commits a `duplicate` observation found, one call each, and records the
/// result on the (CONFIRMED) command. A transient failure is not retried here: the core
/// stores it with the attempt and a due time, and the sweep sends the clean-up again then
/// (past the tool's attempts it goes to a person).
#[tracing::instrument(skip(ctx, requested), fields(run_id = %run_id, command_key = %command_key))]
pub async fn settle_duplicate(
    ctx: &Context,
    run_id: &RunId,
    command_key: &CommandKey,
    requested: &[String],
) -> Result<(), PipelineError> {
    let Some(command) = ctx.ledger.get(run_id, command_key).await? else {
        return Ok(());
    };
    // One clean-up at a time, claimed for all of it: the request and a sweep may both get
    // here.
    let claim =
        |current: &Command| machine::plan_settle_duplicate(&current.state, &ctx.rules_of(current));
    if claim(&command).is_none() {
        return Ok(());
    }
    sluice_faults::point!("compensator.claim.pre");
    let claimed = ctx
        .run_job(Job::SettleDuplicate, ACTOR, command, Sites::NONE, claim)
        .await?;
    let Some(command) = claimed.applied() else {
        return Ok(());
    };
    sluice_faults::point!("compensator.claim.post");
    // The ledger's list is the one owed (the request may be older than a retried look).
    if requested != command.state.owed_duplicates.as_slice() {
        tracing::debug!(?requested, owed = ?command.state.owed_duplicates, "clean-up request differs from the ledger");
    }
    sluice_faults::point!("compensator.call.pre");
    let claimed_epoch = command.epoch();
    let settled = match machine::duplicate_calls(&command, ctx.catalog.get(&command.tool)) {
        Ok((tool, extras)) => {
            let mut answers = Vec::with_capacity(extras.len());
            for extra in extras {
                let call = CompensationTarget::ExtraCommit {
                    external_ref: extra.clone(),
                };
                let answer = ctx.connector.compensate(tool, &command, call).await;
                answers.push((extra, answer));
            }
            machine::duplicates_settled(claimed_epoch, answers)
        }
        Err(outcome) => Event::DuplicateSettled {
            epoch: claimed_epoch,
            outcome,
            undone: Vec::new(),
        },
    };
    sluice_faults::point!("compensator.call.post");
    sluice_faults::point!("compensator.write.pre");
    let sites = Sites {
        carrying: || sluice_faults::point!("compensator.write.post"),
        ..Sites::NONE
    };
    ctx.run_job(Job::SettleDuplicate, ACTOR, command, sites, |_| {
        Some(settled.clone())
    })
    .await?;
    Ok(())
}
