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

use sluice_bus::{BusError, Delivery, Group, Topic};
use sluice_connector::CompensationTarget;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, CompensationOutcome, Event};
use sluice_runtime::config::CompensatorConfig;
use sluice_runtime::consumer::{ConsumerSpec, Handled, Skipped, consume};
use sluice_runtime::messages::{Cause, CompensateJob, CompensateRequest, decode};
use sluice_runtime::{Context, Driven, PipelineError, Shutdown};

/// The actor named in the audit chain for compensation steps.
pub const ACTOR: &str = "compensator";

/// Consumes compensation requests until `shutdown`.
pub async fn run(
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
        if now.is_some_and(|command| command.status() == CommandStatus::Compensating) {
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
    if command.status() != CommandStatus::Compensating {
        return Ok(());
    }
    compensate_run(ctx, &command.run_id).await
}

/// Calls compensate for a COMPENSATING command and records what happened.
#[tracing::instrument(skip(ctx, command), fields(run_id = %command.run_id, command_key = %command.command_key))]
async fn compensate_one(ctx: &Context, command: Command) -> Result<(), PipelineError> {
    if command.status() != CommandStatus::Compensating {
        return Ok(());
    }
    // Claimed first, for the whole job (every owed extra commit and the command's own, as
    // the core sizes it): one job at a time per command (a rollback job and a sweep may both
    // get here), and its start is when the calls start.
    let hold = ctx
        .rules_of(&command)
        .compensation_hold_ms(command.state.owed_duplicates.len() + 1, 1);
    sluice_faults::point!("compensator.claim.pre");
    // Refused while another job holds it (`claimed_until`): that job's result, or its claim's
    // end, brings the command back.
    let Some(command) = ctx
        .claim(command, ACTOR, machine::ClaimJob::Compensate, hold)
        .await?
    else {
        return Ok(());
    };
    sluice_faults::point!("compensator.claim.post");
    sluice_faults::point!("compensator.call.pre");
    let outcome = match ctx.catalog.get(&command.tool) {
        Some(tool) => {
            // Extra commits a status check found and not yet undone go first: undoing the
            // effect means undoing every commit of it.
            let mut failed_extra = None;
            for extra in &command.state.owed_duplicates {
                let target = CompensationTarget::ExtraCommit {
                    external_ref: extra.clone(),
                };
                match ctx.connector.compensate(tool, &command, target).await {
                    CompensationOutcome::Done { .. } => {}
                    other => failed_extra = Some((extra.clone(), other)),
                }
            }
            let own = ctx
                .connector
                .compensate(tool, &command, CompensationTarget::OwnCommit)
                .await;
            match (failed_extra, own) {
                (None, own) => own,
                (
                    Some((
                        extra,
                        CompensationOutcome::Retry {
                            reason,
                            retry_after_ms,
                        },
                    )),
                    _,
                ) => CompensationOutcome::Retry {
                    reason: format!("extra commit {extra}: {reason}"),
                    retry_after_ms,
                },
                (Some((extra, CompensationOutcome::Impossible { reason })), _) => {
                    CompensationOutcome::Impossible {
                        reason: format!("extra commit {extra}: {reason}"),
                    }
                }
                (Some((_, CompensationOutcome::Done { .. })), own) => own,
            }
        }
        None => CompensationOutcome::Impossible {
            reason: format!("tool {} is no longer in the catalog", command.tool),
        },
    };
    sluice_faults::point!("compensator.call.post");
    // `drive` takes "now" after the call returned: that is the compensation's end time. The
    // core refuses the result if the claim's epoch is no longer current.
    let event = Event::Compensated {
        epoch: command.epoch(),
        outcome,
    };
    sluice_faults::point!("compensator.write.pre");
    if let Driven::Applied(command, step) = ctx
        .drive_from(command, ACTOR, |current| {
            (current.status() == CommandStatus::Compensating).then(|| event.clone())
        })
        .await?
    {
        sluice_faults::point!("compensator.write.post");
        ctx.carry_out(ACTOR, &command, &step, Cause::Reserved)
            .await?;
    }
    Ok(())
}

/// Undoes the extra commits a `duplicate` observation found, retrying transient failures a few
/// times, and records the result on the (CONFIRMED) command.
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
    if command.status() != CommandStatus::Confirmed || command.state.owed_duplicates.is_empty() {
        return Ok(());
    }
    let rules = ctx.rules_of(&command);
    // One clean-up at a time, claimed for all of it (each extra commit, with its retries): the
    // request and a sweep may both get here.
    let hold = rules.compensation_hold_ms(command.state.owed_duplicates.len(), rules.max_attempts);
    sluice_faults::point!("compensator.claim.pre");
    let Some(command) = ctx
        .claim(command, ACTOR, machine::ClaimJob::UndoDuplicates, hold)
        .await?
    else {
        return Ok(());
    };
    sluice_faults::point!("compensator.claim.post");
    // The ledger's list is the one owed (the request may be older than a retried look).
    let extra_refs = command.state.owed_duplicates.clone();
    if requested != extra_refs.as_slice() {
        tracing::debug!(?requested, owed = ?extra_refs, "clean-up request differs from the ledger");
    }
    sluice_faults::point!("compensator.call.pre");
    let outcome = match ctx.catalog.get(&command.tool) {
        None => CompensationOutcome::Impossible {
            reason: format!("tool {} is no longer in the catalog", command.tool),
        },
        Some(_) if extra_refs.is_empty() => CompensationOutcome::Impossible {
            reason: "the status check named no extra commit to undo".into(),
        },
        Some(tool) => {
            let mut undone = Vec::new();
            let mut failure = None;
            for reference in extra_refs {
                let mut attempt = 0;
                let outcome = loop {
                    let outcome = ctx
                        .connector
                        .compensate(
                            tool,
                            &command,
                            CompensationTarget::ExtraCommit {
                                external_ref: reference.clone(),
                            },
                        )
                        .await;
                    match outcome {
                        CompensationOutcome::Retry { .. } if attempt + 1 < rules.max_attempts => {
                            tokio::time::sleep(std::time::Duration::from_millis(
                                u64::try_from(rules.backoff_ms(attempt)).unwrap_or(1_000),
                            ))
                            .await;
                            attempt += 1;
                        }
                        other => break other,
                    }
                };
                match outcome {
                    CompensationOutcome::Done { reference: undo } => {
                        undone.push(format!("{reference} -> {}", undo.unwrap_or_default()));
                    }
                    other => failure = Some((reference.clone(), other)),
                }
            }
            match failure {
                None => CompensationOutcome::Done {
                    reference: Some(undone.join(", ")),
                },
                Some((reference, CompensationOutcome::Impossible { reason })) => {
                    CompensationOutcome::Impossible {
                        reason: format!("{reference}: {reason}"),
                    }
                }
                Some((
                    reference,
                    CompensationOutcome::Retry {
                        reason,
                        retry_after_ms,
                    },
                )) => CompensationOutcome::Retry {
                    reason: format!("{reference}: {reason}"),
                    retry_after_ms,
                },
                Some((_, done @ CompensationOutcome::Done { .. })) => done,
            }
        }
    };
    sluice_faults::point!("compensator.call.post");
    let event = Event::DuplicateSettled {
        epoch: command.epoch(),
        outcome,
    };
    sluice_faults::point!("compensator.write.pre");
    if let Driven::Applied(command, step) = ctx
        .drive_from(command, ACTOR, |_| Some(event.clone()))
        .await?
    {
        sluice_faults::point!("compensator.write.post");
        ctx.carry_out(ACTOR, &command, &step, Cause::Reserved)
            .await?;
    }
    Ok(())
}
