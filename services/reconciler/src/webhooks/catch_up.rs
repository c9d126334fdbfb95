//! The deliverer's catch-up at start: a STUCK or BLOCKED command whose event never reached the
//! intake (its process died between the transition and the publish; the embedded bus lost it
//! in a crash; the subscription was added since) is enqueued from the ledger. Its event is
//! rebuilt as it was published — the same `ce_id`, derived from the transition
//! (`sluice_core::webhook::event_id`) — so one already delivered is not delivered again.
//!
//! Only commands that reached their status within [`LOOK_BACK_MS`] are taken: less than the
//! time a delivered delivery is kept (`WEBHOOK_RETENTION_MS`), past which a rebuilt event could
//! no longer be recognised as sent.

use std::sync::Arc;

use sluice_core::command::CommandStatus;
use sluice_core::webhook::{Delivery, matches};
use sluice_ledger::{LedgerError, RunCursor, WEBHOOK_RETENTION_MS};
use sluice_runtime::messages::{EventOrigin, LifecycleEvent, event_type};
use sluice_runtime::pipeline::tool_of;
use sluice_runtime::{Context, Shutdown};
use tokio::sync::Notify;

use super::{Hook, event_from};

/// How far back the catch-up looks: a day less than deliveries are kept.
pub const LOOK_BACK_MS: i64 = WEBHOOK_RETENTION_MS - 24 * 3_600_000;

/// Runs listed per page.
const PAGE: usize = 500;

pub(super) async fn run(
    ctx: Context,
    hooks: Arc<Vec<Hook>>,
    wake: Arc<Notify>,
    shutdown: Shutdown,
) {
    let wanted: Vec<CommandStatus> = sluice_core::webhook::CATCH_UP_STATUSES
        .into_iter()
        .filter(|status| {
            hooks
                .iter()
                .any(|h| matches(&h.types, &event_type(*status)))
        })
        .collect();
    if wanted.is_empty() {
        return;
    }
    tokio::select! {
        () = shutdown.cancelled() => {}
        caught = catch_up(&ctx, &hooks, &wanted) => match caught {
            Ok(0) => tracing::debug!("webhook catch-up: nothing missed"),
            Ok(enqueued) => {
                tracing::info!(enqueued, "webhook catch-up: events never delivered enqueued");
                wake.notify_one();
            }
            Err(error) => tracing::warn!(%error, "webhook catch-up failed; events missed before \
                this start are not pushed (the ledger-side alerts still fire)"),
        },
    }
}

/// Enqueues the event of every command in `wanted` that got there within the look-back;
/// how many deliveries were new.
async fn catch_up(
    ctx: &Context,
    hooks: &[Hook],
    wanted: &[CommandStatus],
) -> Result<usize, LedgerError> {
    let now = ctx.clock.now();
    let since = sluice_core::webhook::catch_up_since(now, LOOK_BACK_MS);
    let mut cursor: Option<RunCursor> = None;
    let mut enqueued = 0;
    loop {
        let runs = ctx.ledger.list_runs(since, cursor.as_ref(), PAGE).await?;
        let Some(last) = runs.last() else {
            return Ok(enqueued);
        };
        cursor = Some(last.cursor());
        for run in runs.iter().filter(|run| run.open_commands > 0) {
            for command in ctx.ledger.list_run(&run.run_id, None).await? {
                if !sluice_core::webhook::catch_up_takes(&command.state, wanted, since) {
                    continue;
                }
                // Rebuilt without its transition (the status it left is not stored): a STUCK or
                // BLOCKED event's payload does not depend on it (`outcome.decided_by` is only
                // given for final statuses).
                let transition = EventOrigin {
                    from: None,
                    include_args: tool_of(&ctx.catalog, &command)
                        .map(|tool| tool.event_args())
                        .unwrap_or_default(),
                };
                let event = LifecycleEvent::new(
                    "reconciler",
                    &command,
                    transition,
                    command.state.updated_at,
                );
                let Some(event) = event_from(&event.headers, &event.payload) else {
                    continue;
                };
                for hook in hooks.iter().filter(|h| matches(&h.types, event.kind())) {
                    let delivery = Delivery::new(&hook.name, event.clone(), now);
                    if ctx.ledger.webhook_enqueue(&delivery).await? {
                        enqueued += 1;
                        ctx.metrics
                            .webhook_deliveries
                            .with_label_values(&[&hook.name, "enqueued"])
                            .inc();
                    }
                }
            }
        }
        if runs.len() < PAGE {
            return Ok(enqueued);
        }
    }
}
