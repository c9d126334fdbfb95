//! The dispatcher: leases a requested command, re-checks policy against its stored arguments,
//! calls the tool with the command's idempotency key and writes the outcome fenced by the lease
//! epoch.
//!
//! Guarantees: a command is called only under a lease this dispatcher holds (the lease is a
//! compare-and-set on status and epoch, so of any number of replicas exactly one wins); the
//! outcome is written only while that lease's epoch is still current, so a dispatcher that
//! lost its lease (it stalled past the expiry and the sweep marked the command UNKNOWN) cannot
//! overwrite what the reconciler decides. An outcome it could not write is not lost: the
//! reconciler finds it from evidence.

use std::time::Instant;

use sluice_bus::{BusError, Delivery, Topic};
use sluice_core::catalog::{Catalog, Tool};
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, DispatchOutcome, Event, Refusal};
use sluice_core::policy::{self, PolicyDecision};
use sluice_runtime::config::DispatcherConfig;
use sluice_runtime::consumer::{ConsumerSpec, Handled, consume};
use sluice_runtime::messages::{Cause, DispatchRequest, decode};
use sluice_runtime::{Context, Current, Driven, PipelineError, Shutdown};

/// The actor named in the audit chain for the dispatcher's transitions.
pub const ACTOR: &str = "dispatcher";
/// The consumer group of all dispatchers.
pub const GROUP: &str = sluice_bus::DISPATCHERS;

/// The name a dispatcher leases under unless configured: host and process id.
pub fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    format!("{ACTOR}-{host}-{}", std::process::id())
}

/// Consumes dispatch requests until `shutdown`; in-flight calls finish first.
pub async fn run(
    ctx: Context,
    config: DispatcherConfig,
    shutdown: Shutdown,
) -> Result<(), BusError> {
    let owner = config.owner.clone().unwrap_or_else(default_owner);
    let spec = ConsumerSpec {
        topic: Topic::Requested,
        group: GROUP.into(),
        member: owner.clone(),
        concurrency: config.concurrency,
    };
    let (bus, metrics) = (ctx.bus.clone(), ctx.metrics.clone());
    consume(bus, metrics, spec, shutdown, move |delivery: Delivery| {
        let (ctx, owner) = (ctx.clone(), owner.clone());
        async move {
            let request: DispatchRequest = match decode("dispatch request", delivery.payload()) {
                Ok(request) => request,
                Err(e) => return Ok(Handled::Reject(e)),
            };
            dispatch(&ctx, &owner, &request.run_id, &request.command_key).await?;
            Ok(Handled::Done)
        }
    })
    .await
}

/// Dispatches one command if it is waiting for dispatch; returns it as it stands afterwards.
///
/// A command leased by its own reservation (an IDEMPOTENT or OBSERVE_ONLY tool, see
/// [`machine::lease_at_reservation`]) is called under that lease as it stands, without a lease
/// write; every other command is leased here first.
#[tracing::instrument(skip(ctx, owner), fields(run_id = %run_id, command_key = %command_key))]
pub async fn dispatch(
    ctx: &Context,
    owner: &str,
    run_id: &RunId,
    command_key: &CommandKey,
) -> Result<Option<Command>, PipelineError> {
    let catalog = ctx.catalog.clone();
    let current = ctx.current(run_id, command_key).await?;
    let usable = current.command.as_ref().is_some_and(|command| {
        catalog.get(&command.tool).is_some_and(|tool| {
            policy_of(&catalog, tool, command) == PolicyDecision::Allow
                && machine::reservation_lease_usable(
                    &command.state,
                    &ctx.rules_of(command),
                    ctx.clock.now(),
                )
        })
    });
    sluice_faults::point!("dispatcher.lease.pre");
    let leased = match current {
        Current {
            command: Some(command),
            ..
        } if usable => command,
        current => match lease(ctx, owner, run_id, command_key, current).await? {
            Ok(command) => command,
            Err(settled) => return Ok(settled),
        },
    };
    sluice_faults::point!("dispatcher.lease.post");

    // The lease write and its retries took time: call only if the whole call still fits in
    // what is left of the lease, or the sweep could take it for expired while the call is in
    // flight. Too little left: give it back unused (nothing was sent; the attempt does not
    // count) and let the command be dispatched again under a fresh lease.
    if !machine::lease_usable(&leased.state, &ctx.rules_of(&leased), ctx.clock.now()) {
        let epoch = leased.epoch();
        let released = ctx
            .drive_from(leased, ACTOR, |_| {
                Some(Event::Release {
                    epoch,
                    reason: "too little of the lease left for the whole call".into(),
                })
            })
            .await?;
        return Ok(match released {
            Driven::Applied(command, step) => {
                ctx.carry_out(ACTOR, &command, &step, Cause::Retry).await?;
                Some(command)
            }
            Driven::Refused(command, _) | Driven::Skipped(command) => Some(command),
            Driven::Missing => None,
        });
    }

    // When the attempt leaves: an ambiguous answer may be worked on until its timeout after.
    let sent_at = ctx.clock.now();
    let outcome = match catalog.get(&leased.tool) {
        Some(tool) => {
            let started = Instant::now();
            sluice_faults::point!("dispatcher.call.pre");
            let outcome = ctx.connector.dispatch(tool, &leased).await;
            sluice_faults::point!("dispatcher.call.post");
            ctx.metrics
                .dispatch_seconds
                .with_label_values(&[&leased.tool.to_string(), outcome_label(&outcome)])
                .observe(started.elapsed().as_secs_f64());
            outcome
        }
        // Checked before the lease; a catalog swapped in between counts as not sent.
        None => DispatchOutcome::NotSent {
            reason: format!("tool {} is no longer in the catalog", leased.tool),
        },
    };

    let leased = extend_before_finalize(ctx, leased).await?;
    let epoch = leased.epoch();
    sluice_faults::point!("dispatcher.finalize.pre");
    let written = ctx
        .drive_from(leased, ACTOR, |_| {
            Some(Event::Dispatched {
                epoch,
                outcome: outcome.clone(),
                sent_at,
            })
        })
        .await?;
    sluice_faults::point!("dispatcher.finalize.post");
    match written {
        Driven::Applied(command, step) => {
            sluice_faults::point!("dispatcher.carry_out.pre");
            ctx.carry_out(ACTOR, &command, &step, Cause::Retry).await?;
            sluice_faults::point!("dispatcher.carry_out.post");
            Ok(Some(command))
        }
        Driven::Refused(command, refusal @ Refusal::StaleEpoch { .. }) => {
            tracing::warn!(
                %refusal,
                outcome = outcome_label(&outcome),
                "lease lost before the outcome was written; the reconciler resolves it from evidence"
            );
            Ok(Some(command))
        }
        Driven::Refused(command, refusal) => {
            tracing::warn!(%refusal, "outcome refused");
            Ok(Some(command))
        }
        Driven::Skipped(command) => Ok(Some(command)),
        Driven::Missing => Ok(None),
    }
}

/// Leases a command waiting for dispatch, or carries out what policy says instead. `Ok` is the
/// leased command to call under; `Err` is the command as it stands when there is nothing to
/// call (blocked, denied, not waiting, missing).
async fn lease(
    ctx: &Context,
    owner: &str,
    run_id: &RunId,
    command_key: &CommandKey,
    current: Current,
) -> Result<Result<Command, Option<Command>>, PipelineError> {
    let catalog = ctx.catalog.clone();
    let leased = ctx
        .drive_current(run_id, command_key, ACTOR, current, |command| {
            // A lease the reservation took meets the policy as it is now (the catalog may have
            // changed in between): if that blocks or denies it, the core has it looked up
            // first, since a dispatcher on the earlier policy may have called under it; one
            // that is merely short of time is taken over.
            if !command.awaits_dispatch() {
                return None;
            }
            // Waiting for dispatch and LEASED: the reservation's lease.
            let reserved_lease = command.status() == CommandStatus::Leased;
            let epoch = reserved_lease.then(|| command.epoch());
            let Some(tool) = catalog.get(&command.tool) else {
                return Some(Event::Deny {
                    reason: format!("tool {} is no longer in the catalog", command.tool),
                    epoch,
                });
            };
            // Policy is deterministic over the stored arguments and the current policy
            // version; checking it right before the lease is the same as right after, since
            // the lease is guarded by the status read here.
            match policy_of(&catalog, tool, command) {
                // Its request waited on the bus past the lease's time: taken over with the
                // same key (one write) rather than left to lapse into the sweep's several.
                PolicyDecision::Allow if reserved_lease => machine::reservation_lease_lapsing(
                    &command.state,
                    &ctx.rules_of(command),
                    ctx.clock.now(),
                )
                .then(|| Event::Lease {
                    owner: std::sync::Arc::from(owner),
                }),
                PolicyDecision::Allow => Some(Event::Lease {
                    owner: std::sync::Arc::from(owner),
                }),
                PolicyDecision::RequireApproval { reason } => Some(Event::Block { reason, epoch }),
                PolicyDecision::Deny { reason } => Some(Event::Deny { reason, epoch }),
            }
        })
        .await?;
    Ok(match leased {
        Driven::Applied(command, _) if command.status() == CommandStatus::Leased => Ok(command),
        Driven::Applied(command, step) => {
            ctx.carry_out(ACTOR, &command, &step, Cause::Reserved)
                .await?;
            Err(Some(command))
        }
        Driven::Refused(command, refusal) => {
            tracing::warn!(%refusal, status = %command.status(), "dispatch refused");
            Err(Some(command))
        }
        Driven::Skipped(command) => Err(Some(command)),
        Driven::Missing => {
            tracing::warn!("dispatch request for a command the ledger does not have");
            Err(None)
        }
    })
}

/// `tool`'s policy for `command` as it is stored.
fn policy_of(catalog: &Catalog, tool: &Tool, command: &Command) -> PolicyDecision {
    policy::evaluate(
        tool,
        &command.args,
        command.state.approval.as_deref(),
        catalog.policy_version(),
    )
}

fn outcome_label(outcome: &DispatchOutcome) -> &'static str {
    match outcome {
        DispatchOutcome::Committed { .. } => "committed",
        DispatchOutcome::Refused { .. } => "refused",
        DispatchOutcome::Ambiguous { .. } => "ambiguous",
        DispatchOutcome::NotSent { .. } => "not_sent",
    }
}

/// Extends the lease first when the outcome's write, at the ledger's pace now, could outlive
/// it (`load::extend_before_write`, the core's decision): a lease that lapsed under its holder's
/// write is taken for expired by the sweep and reconciled, which costs the ledger several more
/// writes for an outcome that was known. An extension that loses its compare-and-set changes
/// nothing: the outcome's write is then decided on the command as it is.
async fn extend_before_finalize(ctx: &Context, leased: Command) -> Result<Command, PipelineError> {
    let now = ctx.clock.now();
    let write_ms = ctx.ledger.write_latency_ms();
    let Some(to) = sluice_core::load::extend_before_write(
        &leased.state,
        &ctx.rules_of(&leased),
        now,
        write_ms,
    ) else {
        return Ok(leased);
    };
    tracing::debug!(write_ms, "extending the lease before writing the outcome");
    Ok(match ctx.ledger.extend_lease(&leased, to).await? {
        sluice_ledger::Cas::Applied(extended) => extended,
        sluice_ledger::Cas::Conflict(_) => leased,
    })
}
