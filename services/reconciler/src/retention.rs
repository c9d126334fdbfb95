//! Retention as the reconciler carries it out: every replica looks at the purge lease each
//! minute (or sooner, when its interval is shorter); the core's `retention::purge_step` says
//! whether a purge is due, and the replica whose compare-and-set on the lease applies purges
//! the finished runs past the retention in batches, stopping before its lease could lapse.
//! Which runs may go is the ledgers' purge, by the core's `purge_verdict`: a run owing work
//! is kept, and every purged run leaves its audit checkpoint, so its chain still verifies.
//!
//! The lease keeps the load of purging on one replica at a time; it is not what makes a purge
//! safe. Two purges at once (this one and an operator's `sluice purge`) remove each run once:
//! both ledgers purge a run under a guard on its state.

use std::time::{Duration, Instant};

use sluice_core::retention::{self, PURGE_GROUP, PURGE_SHARD, PurgeStep};
use sluice_ledger::{LedgerError, ShardCas};
use sluice_runtime::config::ReconcilerConfig;
use sluice_runtime::{Context, Shutdown};

/// The actor a scheduled purge is recorded under in the `sluice.system` chain.
pub const ACTOR: &str = "retention";

/// The longest a replica waits before looking at the purge lease again.
const LOOK_EVERY_MS: u64 = 60_000;

/// What one look at the schedule did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purged {
    /// Retention is off: nothing is purged.
    Off,
    /// Not due, or another replica took this interval's purge.
    NotMine,
    /// This replica purged: `runs` removed, `kept` past the cutoff kept for owed work, in
    /// `calls` purge calls; `cut_off`: it stopped at its lease's end with more left.
    Done {
        runs: u64,
        kept: u64,
        calls: u32,
        cut_off: bool,
    },
}

/// Looks at the schedule once as replica `me` and purges when it is due and this replica wins
/// the lease.
pub async fn purge_if_due(
    ctx: &Context,
    config: &ReconcilerConfig,
    me: &str,
) -> Result<Purged, LedgerError> {
    let skew = crate::shard_times(ctx, config).skew_ms;
    let retention = config.retention(skew);
    let now = ctx.clock.now();
    let view = ctx.ledger.sweep_view(PURGE_GROUP, 1).await?;
    let stored = view.leases.iter().find(|l| l.shard == PURGE_SHARD);
    let (guard, lease, cutoff, stop_by) = match retention::purge_step(&retention, me, now, stored) {
        PurgeStep::Off => return Ok(Purged::Off),
        PurgeStep::Wait { .. } => return Ok(Purged::NotMine),
        PurgeStep::Purge {
            guard,
            lease,
            cutoff,
            stop_by,
        } => (guard, lease, cutoff, stop_by),
    };
    match ctx
        .ledger
        .write_shard_lease(PURGE_GROUP, guard, lease)
        .await?
    {
        ShardCas::Applied(_) => {}
        ShardCas::Conflict(_) => return Ok(Purged::NotMine),
    }
    let started = Instant::now();
    let metrics = &ctx.metrics.purge;
    let (mut runs, mut kept, mut calls, mut cut_off) = (0, 0, 0, false);
    loop {
        if retention::pass_out_of_time(ctx.clock.now(), stop_by) {
            cut_off = true;
            break;
        }
        calls += 1;
        let report = match ctx
            .ledger
            .purge(cutoff, config.purge_batch, ACTOR, ctx.clock.now(), false)
            .await
        {
            Ok(report) => report,
            Err(error) => {
                metrics
                    .seconds
                    .with_label_values(&["failed"])
                    .observe(started.elapsed().as_secs_f64());
                return Err(error);
            }
        };
        runs += report.runs;
        metrics.runs.inc_by(report.runs);
        // Runs kept are looked at by every call; the last call's count is the one to show.
        kept = report.kept_runs;
        if usize::try_from(report.runs).unwrap_or(usize::MAX) < config.purge_batch {
            break;
        }
    }
    metrics.kept.set(i64::try_from(kept).unwrap_or(i64::MAX));
    metrics
        .seconds
        .with_label_values(&[if cut_off { "cut_off" } else { "done" }])
        .observe(started.elapsed().as_secs_f64());
    tracing::info!(
        runs,
        kept,
        calls,
        cut_off,
        %cutoff,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "scheduled purge of finished runs"
    );
    Ok(Purged::Done {
        runs,
        kept,
        calls,
        cut_off,
    })
}

/// Looks at the schedule every minute (or every `purge_every_ms`, when shorter) until
/// `shutdown`, as replica `me`. Nothing at all with retention off.
pub async fn purge_loop(ctx: Context, config: ReconcilerConfig, me: String, shutdown: Shutdown) {
    if config.retention(0).keep_ms <= 0 {
        tracing::info!("retention is off (reconciler.retention_days = 0): nothing is purged");
        return;
    }
    let every = Duration::from_millis(config.purge_every_ms.min(LOOK_EVERY_MS));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        // A purge ends at its lease's end at the latest; shutdown waits for the call under way.
        if let Err(error) = purge_if_due(&ctx, &config, &me).await {
            tracing::warn!(%error, "scheduled purge failed; the next one is due when its lease lapses");
        }
    }
}
