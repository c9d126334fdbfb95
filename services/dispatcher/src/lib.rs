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

use futures::future::BoxFuture;
use sluice_bus::{BusError, Delivery, Group, Topic};
use sluice_core::budget::BudgetView;
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::flow::Held;
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, CallPlan, DispatchOutcome, DispatchPlan, Event, Job};
use sluice_core::policy;
use sluice_runtime::config::DispatcherConfig;
use sluice_runtime::consumer::{ConsumerSpec, Handled, consume};
use sluice_runtime::flow::{Admission, Permit};
use sluice_runtime::messages::{DispatchRequest, decode};
use sluice_runtime::{Context, Current, PipelineError, Ran, Shutdown, Sites};
use tracing::Instrument;

/// The actor named in the audit chain for the dispatcher's transitions.
pub const ACTOR: &str = "dispatcher";

/// The name a dispatcher leases under unless configured: host and process id.
pub fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    format!("{ACTOR}-{host}-{}", std::process::id())
}

/// Consumes dispatch requests until `shutdown`; in-flight calls finish first.
pub fn run(
    ctx: Context,
    config: DispatcherConfig,
    shutdown: Shutdown,
) -> BoxFuture<'static, Result<(), BusError>> {
    Box::pin(run_body(ctx, config, shutdown))
}

async fn run_body(
    ctx: Context,
    config: DispatcherConfig,
    shutdown: Shutdown,
) -> Result<(), BusError> {
    let owner = config.owner.clone().unwrap_or_else(default_owner);
    let spec = ConsumerSpec {
        topic: Topic::Requested,
        group: ctx.bus.group_id(Group::Dispatchers),
        member: owner.clone(),
        concurrency: config.concurrency,
        // Fair dispatch between tenants: requests read ahead into a lane each.
        lanes: (config.queue > 0).then_some(config.queue),
    };
    let (bus, metrics) = (ctx.bus.clone(), ctx.metrics.clone());
    // The shared flow controls, read every second, and this dispatcher's share of the limits.
    tokio::spawn(sluice_runtime::flow::keep_fresh(
        ctx.clone(),
        Some(owner.clone()),
        shutdown.clone(),
    ));
    consume(bus, metrics, spec, shutdown, move |delivery: Delivery| {
        let (ctx, owner) = (ctx.clone(), owner.clone());
        async move {
            let request: DispatchRequest = match decode("dispatch request", delivery.payload()) {
                Ok(request) => request,
                Err(e) => return Ok(Handled::Reject(e)),
            };
            // The producer's signed copy, when the services share copy keys: no ledger read.
            let copy = ctx.adopt_copy(
                delivery.message.header(sluice_runtime::copies::COPY_HEADER),
                &request.run_id,
                &request.command_key,
            );
            // `dispatch_from`'s own future is small: its state machine is boxed inside it.
            dispatch_from(&ctx, &owner, &request.run_id, &request.command_key, copy).await?;
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
pub async fn dispatch(
    ctx: &Context,
    owner: &str,
    run_id: &RunId,
    command_key: &CommandKey,
) -> Result<Option<Command>, PipelineError> {
    dispatch_from(ctx, owner, run_id, command_key, None).await
}

/// [`dispatch`] from `copy` when there is one (the request's signed copy, adopted:
/// [`Context::adopt_copy`]), else from the ledger.
pub async fn dispatch_from(
    ctx: &Context,
    owner: &str,
    run_id: &RunId,
    command_key: &CommandKey,
    copy: Option<Current>,
) -> Result<Option<Command>, PipelineError> {
    let span = tracing::info_span!("dispatch_from", run_id = %run_id, command_key = %command_key);
    // Boxed, and boxed before it is wrapped in its span: the dispatch's state machine is ~12
    // kB, and every move of a future copies all of it. `#[tracing::instrument]` would move it
    // into its span's wrapper after making it, and a caller's box would move it again.
    Box::pin(dispatch_traced(ctx, owner, run_id, command_key, copy))
        .instrument(span)
        .await
}

/// [`dispatch_from`]'s work, inside its span.
async fn dispatch_traced(
    ctx: &Context,
    owner: &str,
    run_id: &RunId,
    command_key: &CommandKey,
    copy: Option<Current>,
) -> Result<Option<Command>, PipelineError> {
    let catalog = ctx.catalog.clone();
    let owner: std::sync::Arc<str> = std::sync::Arc::from(owner);
    let current = match copy {
        Some(copy) => copy,
        None => ctx.current(run_id, command_key).await?,
    };
    // Flow control first: whether the call may go now, or is put back until later.
    let (held, permit) = match &current.command {
        Some(command) => admit(ctx, &catalog, command, &owner).await?,
        None => (None, None),
    };
    let held = held.as_ref();
    // What the tool's rules read of the budgets covering the command, if they read any.
    let standing = match &current.command {
        Some(command) => match catalog.get(&command.tool) {
            Some(tool) => ctx.budget_views(tool, command).await?,
            None => Vec::new(),
        },
        None => Vec::new(),
    };
    let read = Read {
        held,
        budgets: &standing,
    };
    // Decided once on this read (policy evaluated once); the lease's write re-decides only on a
    // copy that moved meanwhile.
    let first = current
        .command
        .as_ref()
        .map(|command| (version(command), plan(ctx, &catalog, command, read, &owner)));
    sluice_faults::point!("dispatcher.lease.pre");
    let leased = match (current, first) {
        (
            Current {
                command: Some(command),
                ..
            },
            Some((_, DispatchPlan::Call)),
        ) => command,
        (current, first) => match lease(ctx, &owner, current, first, read).await? {
            Ran::Applied(command, _) => command,
            Ran::Left(command) | Ran::Refused(command, _) => return Ok(Some(command)),
            Ran::Missing => {
                tracing::warn!("dispatch request for a command the ledger does not have");
                return Ok(None);
            }
        },
    };
    // The write held, blocked or denied it: nothing to call.
    if machine::plan_call(&leased.state, &ctx.rules_of(&leased), ctx.clock.now()) == CallPlan::Leave
    {
        return Ok(Some(leased));
    }
    sluice_faults::point!("dispatcher.lease.post");

    // The lease write and its retries took time: the core decides, right before the call,
    // whether the whole call still fits in what is left of the lease. Too little left: given
    // back unused (nothing was sent; the attempt does not count), and the command is
    // dispatched again under a fresh lease.
    match machine::plan_call(&leased.state, &ctx.rules_of(&leased), ctx.clock.now()) {
        CallPlan::Call => {}
        CallPlan::Release(release) => {
            return Ok(ctx
                .run_job(Job::Dispatch, ACTOR, leased, Sites::NONE, |_| {
                    Some(release.clone())
                })
                .await?
                .command());
        }
        CallPlan::Leave => return Ok(Some(leased)),
    }

    // When the attempt leaves: an ambiguous answer may be worked on until its timeout after.
    let sent_at = ctx.clock.now();
    let outcome = match catalog.get(&leased.tool) {
        Some(tool) => {
            let started = Instant::now();
            sluice_faults::point!("dispatcher.call.pre");
            let outcome = ctx.connector.dispatch(tool, &leased).await;
            sluice_faults::point!("dispatcher.call.post");
            if let Some(permit) = &permit
                && let Err(error) = ctx
                    .flow
                    .after_call(ctx, tool, &outcome, permit, &owner)
                    .await
            {
                // The breaker's count is this process's; the outcome is written regardless.
                tracing::warn!(%error, "could not write the upstream's circuit breaker");
            }
            drop(permit);
            ctx.metrics
                .dispatch_seconds
                .with_label_values(&[&leased.tool.to_string(), outcome.label()])
                .observe(started.elapsed().as_secs_f64());
            outcome
        }
        // Checked before the lease; a catalog swapped in between counts as not sent.
        None => DispatchOutcome::NotSent {
            reason: format!("tool {} is no longer in the catalog", leased.tool),
        },
    };

    // The epoch this dispatcher called under: the outcome is fenced by it, whatever the
    // extension below finds.
    let epoch = leased.epoch();
    let leased = extend_before_finalize(ctx, leased).await?;
    sluice_faults::point!("dispatcher.finalize.pre");
    let outcome = Event::Dispatched {
        epoch,
        outcome,
        sent_at,
    };
    let sites = Sites {
        written: || sluice_faults::point!("dispatcher.finalize.post"),
        carrying: || sluice_faults::point!("dispatcher.carry_out.pre"),
        carried: || sluice_faults::point!("dispatcher.carry_out.post"),
    };
    // A stale epoch's refusal is logged by `run_job`: the reconciler resolves that outcome
    // from evidence.
    Ok(ctx
        .run_job(Job::Dispatch, ACTOR, leased, sites, |_| {
            Some(outcome.clone())
        })
        .await?
        .command())
}

/// Leases a command waiting for dispatch, or writes what the core plans instead
/// (`machine::plan_dispatch`: a hold, a block, a denial). `first`: the plan of the copy in
/// `current`, reused while the write sees that copy; a copy that moved meanwhile is planned
/// again, with policy evaluated again on it (an approval may have come).
async fn lease(
    ctx: &Context,
    owner: &std::sync::Arc<str>,
    current: Current,
    first: Option<(Version, DispatchPlan)>,
    read: Read<'_>,
) -> Result<Ran, PipelineError> {
    let catalog = ctx.catalog.clone();
    let ran = ctx
        .run_job(Job::Dispatch, ACTOR, current, Sites::NONE, |command| {
            let planned = match &first {
                Some((seen, planned)) if *seen == version(command) => planned.clone(),
                Some(_) | None => plan(ctx, &catalog, command, read, owner),
            };
            match planned {
                DispatchPlan::Apply(event) => Some(event),
                // A usable reservation lease found on a re-read: nothing to write, and the
                // next delivery calls under it.
                DispatchPlan::Call | DispatchPlan::Nothing => None,
            }
        })
        .await?;
    // Held by flow control: counted by upstream and cause.
    if let (Ran::Applied(command, _), Some(held)) = (&ran, read.held)
        && command.state.rate_limited_until.is_some()
        && machine::plan_call(&command.state, &ctx.rules_of(command), ctx.clock.now())
            == CallPlan::Leave
    {
        ctx.metrics
            .flow
            .holds
            .with_label_values(&[
                ctx.catalog
                    .get(&command.tool)
                    .map_or("", |tool| tool.upstream()),
                held.cause.as_str(),
            ])
            .inc();
    }
    Ok(ran)
}

/// Which copy of a command a plan was made on: a write that sees another copy plans again.
type Version = (
    CommandStatus,
    sluice_core::ids::LeaseEpoch,
    sluice_core::time::Timestamp,
);

fn version(command: &Command) -> Version {
    (command.status(), command.epoch(), command.state.updated_at)
}

/// What flow control says of a call of `command` now (`sluice_runtime::flow`): held until
/// later, or a permit to call under. Asked only of a command a dispatcher could call now.
async fn admit(
    ctx: &Context,
    catalog: &Catalog,
    command: &Command,
    owner: &str,
) -> Result<(Option<Held>, Option<Permit>), PipelineError> {
    let Some(tool) = catalog.get(&command.tool) else {
        return Ok((None, None));
    };
    if !machine::asks_flow_control(command, &ctx.rules_of(command), ctx.clock.now()) {
        return Ok((None, None));
    }
    Ok(match ctx.flow.admit(ctx, tool, command, owner).await? {
        Admission::Go(permit) => (None, Some(permit)),
        Admission::Hold(held) => (Some(held), None),
    })
}

/// What a dispatch plan reads beside the command: flow control's answer and the budgets
/// covering the command, for rules that read them.
#[derive(Clone, Copy)]
struct Read<'a> {
    held: Option<&'a Held>,
    budgets: &'a [BudgetView],
}

/// The core's plan for `command`, with today's policy for its stored arguments.
fn plan(
    ctx: &Context,
    catalog: &Catalog,
    command: &Command,
    read: Read<'_>,
    owner: &std::sync::Arc<str>,
) -> DispatchPlan {
    let now = ctx.clock.now();
    let policy = catalog.get(&command.tool).map(|tool| {
        policy::evaluate(
            tool,
            &policy::RuleInput::of(command, now).with_budgets(read.budgets),
            command.state.approval.as_deref(),
            catalog.policy_version(),
        )
    });
    machine::plan_dispatch(
        command,
        &ctx.rules_of(command),
        policy.as_ref(),
        read.held,
        owner,
        now,
    )
}

/// Extends the lease first when the core says the outcome's write, at the ledger's pace now,
/// could outlive it (`machine::extend_before_finalize`, a quiet write fenced by the epoch). An
/// extension that is refused (the epoch moved on, the lease already runs long enough) changes
/// nothing: the outcome's write is then decided on the command as it is.
async fn extend_before_finalize(ctx: &Context, leased: Command) -> Result<Command, PipelineError> {
    let write_ms = ctx.ledger.write_latency_ms();
    let epoch = leased.epoch();
    let extend = |current: &Command| {
        machine::extend_before_finalize(
            &current.state,
            &ctx.rules_of(current),
            epoch,
            write_ms,
            ctx.clock.now(),
        )
    };
    if extend(&leased).is_none() {
        return Ok(leased);
    }
    tracing::debug!(write_ms, "extending the lease before writing the outcome");
    let ran = ctx
        .run_job(Job::Dispatch, ACTOR, leased.clone(), Sites::NONE, extend)
        .await?;
    // Under the same epoch: the core extends only for the holder.
    Ok(ran.applied().unwrap_or(leased))
}
