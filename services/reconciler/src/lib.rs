//! The reconciler: resolves ambiguous outcomes from evidence, and runs the sweeps that keep
//! everything accepted moving.
//!
//! Resolution (docs/architecture.md, "Ambiguous outcomes"): present → CONFIRMED, absent → redispatch
//! (for NON_IDEMPOTENT tools only once the absence held over the tool's settle interval),
//! duplicate → CONFIRMED plus compensation of the extra commit, inconclusive → look again with
//! backoff, then STUCK for a person. IDEMPOTENT and OBSERVE_ONLY tools without a status check
//! are retried with the same key; a NON_IDEMPOTENT tool without one goes to a person at once.
//!
//! Sweeps read the ledger's due index (never a scan of all commands): scheduled commands that
//! are due become PENDING; expired leases become UNKNOWN; BLOCKED commands past their approval
//! timeout are cancelled; a command due for a look (UNKNOWN, or owing its last look) is looked
//! at right there, in a task of its own; every other due command has the request it waits for
//! (`machine::awaited`) republished.
//! A sweep moves a command's due time forward before republishing it, so two sweeps in a row
//! do not flood the bus, and a lost message is republished by a later sweep.
//!
//! Retention (`retention`): finished runs past `reconciler.retention_days` (30 by default) are
//! purged on a schedule, by one replica at a time.

mod held;
pub mod retention;
pub mod shards;
pub mod webhooks;

use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use sluice_bus::{BusError, Delivery, Group, Topic};
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, Event, Job, LookPlan, LookStep, SweepPlan};
use sluice_core::sweep::ShardTimes;
use sluice_ledger::DueItem;
use sluice_runtime::config::ReconcilerConfig;
use sluice_runtime::consumer::{ConsumerSpec, Handled, consume};
use sluice_runtime::messages::{ReconcileRequest, decode};
use sluice_runtime::{Context, PipelineError, Ran, Shutdown, Sites};

/// The actor named in the audit chain for the reconciler's transitions.
pub const ACTOR: &str = "reconciler";
/// The actor of sweep transitions.
pub const SWEEP_ACTOR: &str = "sweep";

/// Consumes reconcile requests and sweeps until `shutdown`.
pub fn run(
    ctx: Context,
    config: ReconcilerConfig,
    shutdown: Shutdown,
) -> BoxFuture<'static, Result<(), BusError>> {
    Box::pin(run_body(ctx, config, shutdown))
}

async fn run_body(
    ctx: Context,
    config: ReconcilerConfig,
    shutdown: Shutdown,
) -> Result<(), BusError> {
    let spec = ConsumerSpec {
        topic: Topic::Unknown,
        group: ctx.bus.group_id(Group::Reconcilers),
        member: format!("{ACTOR}-{}", std::process::id()),
        concurrency: config.concurrency,
        lanes: None,
    };
    let me = config.name.clone().unwrap_or_else(shards::member_name);
    let keeper =
        shards::ShardKeeper::new(me.clone(), shards::SWEEP_GROUP, shard_times(&ctx, &config));
    // Retention: finished runs past it purged on a schedule, one replica at a time.
    tokio::spawn(retention::purge_loop(
        ctx.clone(),
        config.clone(),
        me,
        shutdown.clone(),
    ));
    let sweeper = tokio::spawn(sweep_loop(
        ctx.clone(),
        config.clone(),
        shutdown.clone(),
        keeper,
        |_| {},
    ));
    // The flow controls, so a look at a paused or broken upstream waits (not announced: the
    // limits' shares are the dispatchers').
    tokio::spawn(sluice_runtime::flow::keep_fresh(
        ctx.clone(),
        None,
        shutdown.clone(),
    ));
    let (bus, metrics) = (ctx.bus.clone(), ctx.metrics.clone());
    let consumed = consume(bus, metrics, spec, shutdown, move |delivery: Delivery| {
        let ctx = ctx.clone();
        async move {
            let request: ReconcileRequest = match decode("reconcile request", delivery.payload()) {
                Ok(request) => request,
                Err(e) => return Ok(Handled::Reject(e)),
            };
            reconcile(&ctx, &request.run_id, &request.command_key).await?;
            Ok(Handled::Done)
        }
    })
    .await;
    let _ = sweeper.await;
    consumed
}

/// Resolves one UNKNOWN command (or verifies a CONFIRMED one) whose next look is due;
/// returns it as it stands afterwards.
#[tracing::instrument(skip(ctx), fields(run_id = %run_id, command_key = %command_key))]
pub async fn reconcile(
    ctx: &Context,
    run_id: &RunId,
    command_key: &CommandKey,
) -> Result<Option<Command>, PipelineError> {
    let Some(command) = ctx.ledger.get(run_id, command_key).await? else {
        return Ok(None);
    };
    resolve(ctx, command).await
}

/// Looks at a command as the core plans it (`machine::plan_look`): leaves it when it is not
/// due for a look, holds the look while flow control keeps its upstream back, or claims it,
/// looks for evidence of its outcome and stores what it shows. Only the claimer's result is
/// written: a concurrent look (a sweep, another replica) loses its claim.
async fn resolve(ctx: &Context, command: Command) -> Result<Option<Command>, PipelineError> {
    let tool = ctx.catalog.get(&command.tool);
    let now = ctx.clock.now();
    // Flow control: a look at a paused upstream, or one whose breaker is open, waits.
    let gate = tool.and_then(|tool| ctx.flow.look_gate(ctx, tool));
    let read = machine::LookRead {
        tool_present: tool.is_some(),
        check_timeout_ms: tool
            .and_then(|tool| tool.status_check())
            .map(|check| check.timeout_ms),
        gate: gate.as_ref(),
    };
    let look = |current: &Command| machine::plan_look(current, &ctx.rules_of(current), read, now);
    match look(&command) {
        // Backing off, waiting out the settle interval, or another reconciler is looking; the
        // sweep brings it back when due.
        LookPlan::Leave => return Ok(Some(command)),
        LookPlan::Hold(_) => {
            let held = ctx
                .run_job(
                    Job::Look,
                    ACTOR,
                    command,
                    Sites::NONE,
                    |current| match look(current) {
                        LookPlan::Hold(hold) => Some(hold),
                        LookPlan::Claim(_) | LookPlan::Leave => None,
                    },
                )
                .await?;
            return Ok(held.command());
        }
        LookPlan::Claim(_) => {}
    }
    sluice_faults::point!("reconciler.claim.pre");
    let claimed = ctx
        .run_job(
            Job::Look,
            ACTOR,
            command,
            Sites::NONE,
            |current| match look(current) {
                LookPlan::Claim(claim) => Some(claim),
                LookPlan::Hold(_) | LookPlan::Leave => None,
            },
        )
        .await?;
    let Some(command) = claimed.applied() else {
        return Ok(None);
    };
    sluice_faults::point!("reconciler.claim.post");
    sluice_faults::point!("reconciler.check.pre");
    // Evidence that came while the command was still in flight answers first; else how to
    // look is the core's decision, from the command's rules (its stored semantics kept where
    // stricter than the catalog's now).
    let held = held::evidence_for(ctx, &command, tool).await?;
    let event = match &held {
        Some((event, _)) => event.clone(),
        None => match machine::plan_look_step(
            &command.state,
            &ctx.rules_of(&command),
            tool,
            ctx.clock.now(),
        ) {
            LookStep::StatusCheck(tool) => ctx.connector.status_check(tool, &command).await.into(),
            LookStep::Write(event) => event,
        },
    };
    sluice_faults::point!("reconciler.check.post");
    let claimed_epoch = command.epoch();
    sluice_faults::point!("reconciler.write.pre");
    let sites = Sites {
        written: || sluice_faults::point!("reconciler.write.post"),
        ..Sites::NONE
    };
    // A fenced-out look (another claim, a rollback's mark) is refused or left: the sweep
    // brings the command back when it is due.
    let ran = ctx
        .run_job(Job::Look, ACTOR, command, sites, |current| {
            machine::look_result(&current.state, claimed_epoch, &event)
        })
        .await?;
    if let (Ran::Applied(_, step), Some((_, record))) = (&ran, held) {
        let note = format!("{} -> {}: {}", step.from, step.to(), step.reason);
        held::applied(ctx, record, note).await?;
    }
    Ok(ran.command())
}

/// The times of this reconciler's shard leases: `shard_lease_ms`, against the catalog's
/// largest clock-skew bound.
pub fn shard_times(ctx: &Context, config: &ReconcilerConfig) -> ShardTimes {
    let skew = ctx
        .catalog
        .tools()
        .iter()
        .map(|tool| tool.rules().clock_skew_ms)
        .max()
        .unwrap_or(i64::try_from(sluice_core::catalog::DEFAULT_MAX_CLOCK_SKEW_MS).unwrap_or(500));
    ShardTimes::new(
        i64::try_from(config.shard_lease_ms).unwrap_or(i64::MAX),
        skew,
    )
}

/// What one sweep did: who swept which shards, when, and which commands it acted on.
#[derive(Debug, Clone)]
pub struct SweepReport {
    pub member: String,
    pub shards: Vec<u32>,
    pub started: Instant,
    pub ended: Instant,
    pub items: Vec<DueItem>,
}

/// Every sweep interval: a round of the shard split (`keeper`), then a sweep of the shards
/// held with time left, cut off before the earliest of their leases could lapse. On shutdown
/// the leases are given back. `observe` sees each sweep (tests; nothing in production).
pub async fn sweep_loop(
    ctx: Context,
    config: ReconcilerConfig,
    shutdown: Shutdown,
    mut keeper: shards::ShardKeeper,
    observe: impl Fn(SweepReport) + Send,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(config.sweep_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Err(e) = keeper.round(&*ctx.ledger, ctx.clock.now()).await {
            tracing::warn!(error = %e, "shard leases not kept this round; sweeping what is still held");
        }
        let Some((shards, budget)) = keeper.sweepable(ctx.clock.now()) else {
            continue;
        };
        let started = Instant::now();
        let swept = tokio::time::timeout(budget, sweep_shards(&ctx, &config, &shards)).await;
        match swept {
            Ok(Ok(items)) => {
                if !items.is_empty() {
                    tracing::debug!(items = items.len(), ?shards, "sweep");
                }
                observe(SweepReport {
                    member: keeper.name().to_owned(),
                    shards,
                    started,
                    ended: Instant::now(),
                    items,
                });
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "sweep failed; trying again next interval"),
            Err(_) => tracing::warn!(
                ?budget,
                "sweep cut off before its shard leases could lapse; the rest is swept next round"
            ),
        }
    }
    if let Err(e) = keeper.leave(&*ctx.ledger, ctx.clock.now()).await {
        tracing::warn!(error = %e, "shard leases not given back; they lapse on their own");
    }
}

/// One pass over the whole due index; returns how many items it acted on.
pub async fn sweep_once(ctx: &Context, config: &ReconcilerConfig) -> Result<usize, PipelineError> {
    let all: Vec<u32> = (0..ctx.ledger.due_shards()).collect();
    Ok(sweep_shards(ctx, config, &all).await?.len())
}

/// One pass over the due index's `shards`; returns the items it acted on. Items are handled
/// `sweep_concurrency` at a time, each within `sweep_item_timeout_ms`, so one status endpoint
/// that hangs holds one slot for a bounded time, not the due times of everything behind it.
pub async fn sweep_shards(
    ctx: &Context,
    config: &ReconcilerConfig,
    shards: &[u32],
) -> Result<Vec<DueItem>, PipelineError> {
    let now = ctx.clock.now();
    let items = ctx.ledger.due_in(now, config.sweep_batch, shards).await?;
    let grace = machine::republish_grace_ms(config.sweep_interval_ms);
    let item_timeout = Duration::from_millis(config.sweep_item_timeout_ms);
    let handled = items
        .into_iter()
        .map(|item| sweep_within(ctx, item, grace, item_timeout));
    Ok(futures::stream::iter(handled)
        .buffer_unordered(config.sweep_concurrency.max(1))
        .collect()
        .await)
}

/// Sweeps one item within `item_timeout`; returns it.
async fn sweep_within(ctx: &Context, item: DueItem, grace: i64, item_timeout: Duration) -> DueItem {
    ctx.metrics
        .sweep_items
        .with_label_values(&[item.status.as_str()])
        .inc();
    let result = match tokio::time::timeout(item_timeout, sweep_item(ctx, &item, grace)).await {
        Ok(result) => result,
        Err(_) => {
            tracing::warn!(
                run_id = %item.run_id,
                command_key = %item.command_key,
                ?item_timeout,
                "sweep item timed out; its claim or due time brings it back"
            );
            Ok(())
        }
    };
    if let Err(e) = result {
        tracing::warn!(
            run_id = %item.run_id,
            command_key = %item.command_key,
            error = %e,
            "sweep item failed"
        );
    }
    item
}

/// Carries out what the core plans for one due item (`machine::plan_sweep`).
async fn sweep_item(ctx: &Context, item: &DueItem, grace: i64) -> Result<(), PipelineError> {
    let (run_id, command_key) = (&item.run_id, &item.command_key);
    let Some(command) = ctx.ledger.get(run_id, command_key).await? else {
        return Ok(());
    };
    let now = ctx.clock.now();
    let sweep = move |current: &Command| machine::plan_sweep(&current.state, grace, now);
    let first = sweep(&command);
    let sites = match &first {
        // A time the command waited for has come: the event it brings, if still due.
        SweepPlan::Fire(_) => {
            sluice_faults::point!("reconciler.sweep_due.pre");
            Sites {
                written: || sluice_faults::point!("reconciler.sweep_due.post"),
                ..Sites::NONE
            }
        }
        // The request it waits for, sent again (`Event::Republish`: a quiet write that moves
        // its due time past the grace, so the next sweeps leave it alone meanwhile, and names
        // the request).
        SweepPlan::Republish(_) => {
            sluice_faults::point!("reconciler.sweep_republish.pre");
            Sites {
                written: || sluice_faults::point!("reconciler.sweep_republish.post"),
                ..Sites::NONE
            }
        }
        SweepPlan::Look => return look(ctx, command).await,
        SweepPlan::Leave => return Ok(()),
    };
    // Written only while the command still needs what the sweep found: one that moved on to
    // other work meanwhile is left to it.
    ctx.run_job(Job::Sweep, SWEEP_ACTOR, command, sites, |current| {
        still_planned(&first, sweep(current))
    })
    .await?;
    Ok(())
}

/// The event of `now`, the sweep's plan for the command as it is now, when it is the same work
/// as `first`, the plan the sweep started on.
fn still_planned(first: &SweepPlan, now: SweepPlan) -> Option<Event> {
    match (first, now) {
        (SweepPlan::Fire(_), SweepPlan::Fire(event))
        | (SweepPlan::Republish(_), SweepPlan::Republish(event)) => Some(event),
        (SweepPlan::Fire(_) | SweepPlan::Republish(_) | SweepPlan::Look | SweepPlan::Leave, _) => {
            None
        }
    }
}

/// Looks at a due command waiting for a look (`SweepPlan::Look`). The look runs in a task of
/// its own, so the sweep's budgets (an item's timeout, the shard leases' time left) stop the
/// sweep waiting for it but never cut it off: the status check ends within its own timeout,
/// and what it found — an inconclusive timeout included — is recorded and counted. Cut off
/// instead, a lookup slower than the sweep would record nothing, so its checks would never add
/// up to STUCK and every claim would start over. Its claim keeps the next sweeps from starting
/// another meanwhile.
async fn look(ctx: &Context, command: Command) -> Result<(), PipelineError> {
    let ctx = ctx.clone();
    let look = tokio::spawn(async move { resolve(&ctx, command).await.map(drop) });
    match look.await {
        Ok(result) => result,
        Err(join) => {
            tracing::warn!(error = %join, "a look's task ended without an answer");
            Ok(())
        }
    }
}
