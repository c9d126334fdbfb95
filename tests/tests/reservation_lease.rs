//! The lease an IDEMPOTENT or OBSERVE_ONLY command takes with its reservation
//! (`machine::lease_at_reservation`), seen from the dispatcher: it calls under that lease
//! without a lease write, gives it back when policy changed in between, and takes one too
//! short of time over with a lease of its own. Real SQLite file, real upstream on loopback.

use serde_json::json;
use sluice_assemble::assemble;
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine;
use sluice_core::policy::PolicyDecision;
use sluice_core::time::{Clock, SystemClock};
use sluice_runtime::Context;
use sluice_tests::{CatalogEdit, init_tracing, start_upstream, test_config};
use sluice_upstream::{Faults, Upstream};

/// A context on a fresh ledger file whose catalog is the example one, edited by `edit`.
async fn context(
    dir: &std::path::Path,
    upstream: &Upstream,
    edit: impl FnOnce(CatalogEdit) -> CatalogEdit,
) -> Context {
    let catalog = edit(CatalogEdit::example(&upstream.base_url())).build();
    assemble(&test_config(dir), catalog)
        .await
        .expect("a context on the test ledger")
}

/// Reserves an email as the producer does: leased by its reservation.
async fn reserve_leased_email(ctx: &Context, run: &RunId, decision: u32) -> Command {
    let tool = ctx
        .catalog
        .resolve("email/send")
        .expect("the example catalog has email/send");
    let command = sluice_ledger::contract::command(
        run,
        decision,
        "email/send",
        0,
        json!({"to": "a@example.com", "subject": format!("s{decision}"), "body": "b"}),
    )
    .leased_at_reservation(&tool.rules(), &PolicyDecision::Allow, SystemClock.now());
    assert_eq!(command.status(), CommandStatus::Leased);
    let audit = command.reservation_audit("producer");
    ctx.ledger
        .reserve(command, audit)
        .await
        .expect("reserve")
        .into_command()
}

/// What the dispatcher does with `key`'s dispatch request, and the command afterwards.
async fn dispatch(ctx: &Context, run: &RunId, key: &CommandKey) -> Command {
    sluice_dispatcher::dispatch(ctx, "dispatcher-test", run, key)
        .await
        .expect("dispatch")
        .expect("the command exists")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dispatcher_calls_under_the_reservations_lease_without_a_lease_write() {
    init_tracing();
    let upstream = start_upstream(Faults::none()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = context(dir.path(), &upstream, |c| c).await;
    let run = RunId::parse("r-reservation-lease").expect("valid");
    let reserved = reserve_leased_email(&ctx, &run, 1).await;

    let done = dispatch(&ctx, &run, &reserved.command_key).await;
    assert_eq!(done.status(), CommandStatus::Confirmed, "{done:?}");
    assert_eq!(done.epoch(), reserved.epoch(), "no second lease was taken");
    assert_eq!(done.state.attempts, 1);
    assert_eq!(upstream.stats().emails, 1);
    let trail = ctx.ledger.audit_read(&run).await.expect("audit");
    let path: Vec<_> = trail
        .entries
        .iter()
        .map(|e| (e.record.from, e.record.to, e.record.actor.as_str()))
        .collect();
    assert_eq!(
        path,
        [
            (None, Some(CommandStatus::Leased), "producer"),
            (
                Some(CommandStatus::Leased),
                Some(CommandStatus::Confirmed),
                "dispatcher"
            ),
        ]
    );

    // A second delivery of the same request finds it settled and calls nothing.
    let again = dispatch(&ctx, &run, &reserved.command_key).await;
    assert_eq!(again.status(), CommandStatus::Confirmed);
    assert_eq!(upstream.stats().emails, 1, "not called again");
    upstream.shutdown().await;
}

/// The catalog changed between the reservation and the dispatch: the tool now needs approval.
/// A dispatcher on the earlier catalog may already have called under the reservation's lease
/// (a rolling deploy), so the dispatcher on the new one does not block it outright: the lease's
/// epoch moves on (fencing the other caller's write), the command is UNKNOWN and looked up, and
/// policy is asked again once the look finds nothing. This dispatcher sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_lease_met_by_a_tighter_policy_is_looked_up_before_it_is_blocked() {
    init_tracing();
    let upstream = start_upstream(Faults::none()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let producer = context(dir.path(), &upstream, |c| c).await;
    let run = RunId::parse("r-policy-changed").expect("valid");
    let reserved = reserve_leased_email(&producer, &run, 1).await;
    drop(producer);

    let dispatcher = context(dir.path(), &upstream, |c| {
        c.policy("email/send", "requires_approval", true)
    })
    .await;
    let looked = dispatch(&dispatcher, &run, &reserved.command_key).await;
    assert_eq!(looked.status(), CommandStatus::Unknown, "{looked:?}");
    assert!(
        looked.epoch() > reserved.epoch(),
        "the old caller is fenced"
    );
    assert_eq!(looked.state.lease.owner, None, "the lease was given back");
    let trail = dispatcher.ledger.audit_read(&run).await.expect("audit");
    let reason = &trail.entries.last().expect("a record").record.reason;
    assert!(
        reason.contains("blocked by policy")
            && reason.contains("looked up before anything is decided"),
        "{reason}"
    );
    assert_eq!(upstream.stats().emails, 0, "nothing sent");
    upstream.shutdown().await;
}

/// A reservation lease with no more than the call's timeout left is not called under: the
/// outcome could land after the sweep took the lease for expired. Its dispatch request waited on
/// the bus too long (a backlog, a slow ledger), so the dispatcher takes the lease over with a
/// lease of its own, in one write, and calls with the same key: an email is sent once. (Left
/// to the sweep it cost four more writes: lease expiry, UNKNOWN, a status check, a retry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_lease_short_of_time_is_taken_over_and_called_once() {
    init_tracing();
    let upstream = start_upstream(Faults::none()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let ctx = context(dir.path(), &upstream, |c| c).await;
    let run = RunId::parse("r-short-lease").expect("valid");
    let reserved = reserve_leased_email(&ctx, &run, 1).await;
    let rules = ctx.rules_of(&reserved);
    let expires_at = reserved.state.lease.expires_at.expect("an expiry");
    assert!(machine::reservation_lease_usable(
        &reserved.state,
        &rules,
        SystemClock.now()
    ));

    // The same command as a dispatcher would see it later, with less than the timeout left.
    let late = expires_at.plus_millis(-rules.dispatch_timeout_ms);
    assert!(!machine::reservation_lease_usable(
        &reserved.state,
        &rules,
        late
    ));
    let late_ctx = Context {
        clock: std::sync::Arc::new(sluice_core::time::ManualClock::starting_at(late)),
        ..ctx.clone()
    };
    let sent = dispatch(&late_ctx, &run, &reserved.command_key).await;
    assert_eq!(sent.status(), CommandStatus::Confirmed);
    assert_eq!(
        sent.state.attempts, 2,
        "the taken-over lease is an attempt of its own"
    );
    assert_eq!(upstream.stats().emails, 1, "sent once, under the new lease");
    let trail = ctx.ledger.audit_read(&run).await.expect("audit");
    let reasons: Vec<&str> = trail
        .entries
        .iter()
        .map(|e| e.record.reason.as_str())
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("taken over by dispatcher-test with the same key")),
        "{reasons:?}"
    );

    // Its request delivered again (the first dispatcher's offset was never committed): the
    // command is settled, nothing is sent twice.
    let again = dispatch(&late_ctx, &run, &reserved.command_key).await;
    assert_eq!(again.status(), CommandStatus::Confirmed);
    assert_eq!(upstream.stats().emails, 1);
    upstream.shutdown().await;
}
