//! The ledger contract suite: written once, run against every [`Ledger`] implementation.
//!
//! Each check is a public async function taking a fresh ledger; [`ledger_contract_tests!`]
//! turns the whole list into one `#[tokio::test]` per check for an implementation:
//!
//! ```text
//! sluice_ledger::ledger_contract_tests!(|| async { my_ledger().await });
//! ```
//!
//! The maker returns `(Arc<dyn Ledger>, keep_alive)`; `keep_alive` (a temporary directory, a
//! keyspace guard) is dropped when the test ends. Every check works in run ids of its own, so
//! implementations backed by a shared server can run them side by side.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use sluice_core::audit::{AuditDraft, verify};
use sluice_core::command::{Command, CommandStatus, EffectSemantics, Intent, Observation};
use sluice_core::ids::{BusinessKey, CommandKey, LeaseEpoch, RunId, ToolName};
use sluice_core::machine::{self, DispatchOutcome, Event, Rules};
use sluice_core::policy::PolicyDecision;
use sluice_core::retention::Owed;
use sluice_core::time::{Clock, SystemClock, Timestamp};

use crate::{
    Cas, Claim, Closing, Guard, KeptRun, Ledger, LedgerError, MAX_RESULT_BYTES, Reserved,
    RunCursor, SYSTEM_RUN, Transition,
};

/// Generates one test per contract check for the ledger made by `$make`.
#[macro_export]
macro_rules! ledger_contract_tests {
    ($make:expr) => {
        $crate::ledger_contract_tests!(@each $make;
            reserve_is_insert_if_absent,
            reserve_with_other_arguments_is_drift,
            concurrent_reserves_yield_one_command,
            business_key_returns_the_existing_command,
            business_key_claims_are_idempotent_for_the_holder,
            sixteen_racing_leases_have_one_winner,
            sixteen_dispatchers_taking_over_a_lapsed_reservation_lease_have_one_winner,
            a_stale_epoch_never_finalizes,
            a_quiet_step_is_fenced_and_writes_no_record,
            lease_and_finalize_refuse_the_wrong_shape,
            transitions_are_audited_and_conflicts_are_not,
            list_run_is_in_journal_order_and_filters_by_status,
            due_index_returns_what_is_due_in_time_order,
            results_are_size_capped,
            unknown_commands_conflict_with_none,
            audit_append_records_run_level_facts,
            a_closed_run_takes_no_new_commands_and_replays_its_own,
            eight_rollbacks_at_once_close_a_run_once,
            a_dry_run_purge_reports_what_a_purge_would_remove_and_removes_nothing,
            purge_removes_finished_runs_and_leaves_checkpoints,
            purge_keeps_runs_that_still_owe_work,
            list_runs_shows_recent_runs_with_open_counts,
            list_runs_pages_with_a_cursor_and_misses_none,
            the_submitter_is_kept_through_transitions,
            the_tenant_is_kept_through_transitions,
            the_trace_context_is_kept_through_transitions,
            reserve_own_refuses_a_run_with_another_submitter,
            two_agents_opening_one_run_at_once_cannot_both_get_in,
            shard_leases_are_taken_renewed_and_released_under_their_epoch,
            sixteen_racing_shard_takers_have_one_winner,
            sweep_members_are_announced_and_withdrawn,
            due_in_returns_only_the_listed_shards,
            flow_controls_are_written_under_their_version_and_read_back_whole,
            sixteen_racing_breaker_writers_have_one_winner,
            webhook_deliveries_are_stored_once_and_come_back_when_due,
            sixteen_racing_webhook_claims_have_one_winner,
            evidence_is_stored_once_per_source_and_event_and_listed_newest_first,
            sixteen_racing_puts_of_one_event_store_it_once,
            evidence_kept_for_a_command_is_found_by_its_key_until_applied,
            a_reference_is_indexed_to_its_first_command_and_read_back,
            sixteen_racing_puts_of_one_reference_index_one_command,
            budget_holds_fit_up_to_the_limit_once_per_command,
            thirty_two_racing_holds_never_pass_the_limit,
            budget_holds_follow_the_command_status,
            a_reservation_and_its_holds_are_one_step,
            what_others_hold_leaves_out_the_commands_own_holds,
            a_purge_removes_holds_of_ended_windows_and_keeps_total_ones,
            an_edit_moves_the_commands_hold_to_the_edited_amount,
            an_approval_link_is_used_once,
            sixteen_racing_uses_of_one_link_have_one_winner
        );
    };
    (@each $make:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (ledger, _keep_alive) = ($make)().await;
                $crate::contract::$name(ledger).await;
            }
        )*
    };
}

mod budgets;
mod closing;
mod edits;
mod evidence;
mod flow;
mod links;
mod newer;
mod purge_preview;
mod shards;
mod takeover;
mod webhooks;
pub use budgets::{
    a_purge_removes_holds_of_ended_windows_and_keeps_total_ones,
    a_reservation_and_its_holds_are_one_step, budget_holds_fit_up_to_the_limit_once_per_command,
    budget_holds_follow_the_command_status, thirty_two_racing_holds_never_pass_the_limit,
    what_others_hold_leaves_out_the_commands_own_holds,
};
pub use closing::eight_rollbacks_at_once_close_a_run_once;
pub use edits::an_edit_moves_the_commands_hold_to_the_edited_amount;
pub use evidence::{
    a_reference_is_indexed_to_its_first_command_and_read_back,
    evidence_is_stored_once_per_source_and_event_and_listed_newest_first,
    evidence_kept_for_a_command_is_found_by_its_key_until_applied,
    sixteen_racing_puts_of_one_event_store_it_once,
    sixteen_racing_puts_of_one_reference_index_one_command,
};
pub use flow::{
    flow_controls_are_written_under_their_version_and_read_back_whole,
    sixteen_racing_breaker_writers_have_one_winner,
};
pub use links::{an_approval_link_is_used_once, sixteen_racing_uses_of_one_link_have_one_winner};
pub use newer::{NewerWriter, a_command_of_a_newer_status_is_left_to_a_newer_build};
pub use purge_preview::a_dry_run_purge_reports_what_a_purge_would_remove_and_removes_nothing;
pub use shards::{
    due_in_returns_only_the_listed_shards,
    shard_leases_are_taken_renewed_and_released_under_their_epoch,
    sixteen_racing_shard_takers_have_one_winner, sweep_members_are_announced_and_withdrawn,
};
pub use takeover::sixteen_dispatchers_taking_over_a_lapsed_reservation_lease_have_one_winner;
pub use webhooks::{
    sixteen_racing_webhook_claims_have_one_winner,
    webhook_deliveries_are_stored_once_and_come_back_when_due,
};

static RUNS: AtomicU64 = AtomicU64::new(0);

/// A run id no other check (or concurrent test process) uses.
pub fn fresh_run(label: &str) -> RunId {
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let unique = uuid::Uuid::new_v4().simple().to_string();
    RunId::parse(&format!("r-{label}-{n}-{}", &unique[..12])).expect("generated run ids are valid")
}

fn now() -> Timestamp {
    SystemClock.now()
}

/// A wire: NON_IDEMPOTENT, with status check and compensate.
pub fn wire_rules() -> Rules {
    Rules {
        has_status_check: true,
        has_compensate: true,
        ..Rules::defaults(EffectSemantics::NonIdempotent)
    }
}

/// A command for `run` at journal position `decision`/`call_idx` of tool `tool`.
/// The ledger work of one dispatched effect, as the benchmarks measure it and the pipeline
/// does it: reserve, acquire the lease, finalize as CONFIRMED (each with its audit record) —
/// or, for an IDEMPOTENT or OBSERVE_ONLY tool, reserve already leased and finalize. Effect `i` of `task` goes to
/// run `r-bench-<task>-<i / per_run>`; `tool`'s namespace picks the semantics (see
/// [`command_with_key`]).
pub async fn dispatch_effect(
    ledger: &dyn Ledger,
    tool: &str,
    task: usize,
    i: usize,
    per_run: usize,
) {
    let run = RunId::parse(&format!("r-bench-{task}-{}", i / per_run)).expect("valid");
    let pending = command(
        &run,
        (i % per_run) as u32,
        tool,
        0,
        json!({"account": format!("acc-{task}"), "amount_minor": i, "date": "2026-11-23"}),
    );
    let rules = Rules {
        has_status_check: true,
        ..Rules::defaults(pending.semantics)
    };
    let now = SystemClock.now();
    let pending = pending.leased_at_reservation(&rules, &PolicyDecision::Allow, now);
    let audit = pending.reservation_audit("bench");
    let pending = ledger
        .reserve(pending, audit)
        .await
        .expect("reserve")
        .into_command();
    let leased = if pending.status() == CommandStatus::Leased {
        pending
    } else {
        let lease = machine::apply(
            &pending.state,
            &rules,
            &Event::Lease {
                owner: "bench".into(),
            },
            now,
        )
        .expect("lease applies");
        ledger
            .acquire_lease(Transition::from_step(&pending, &lease, "bench"))
            .await
            .expect("lease")
            .applied()
            .cloned()
            .expect("uncontended lease")
    };
    let outcome = machine::apply(
        &leased.state,
        &rules,
        &Event::Dispatched {
            epoch: leased.epoch(),
            sent_at: now,
            outcome: DispatchOutcome::Committed {
                external_ref: Some(format!("w-{task}-{i}")),
                result: Some(Arc::new(json!({"id": format!("w-{task}-{i}")}))),
            },
        },
        now,
    )
    .expect("outcome applies");
    let confirmed = ledger
        .finalize(Transition::from_step(&leased, &outcome, "bench"))
        .await
        .expect("finalize");
    assert!(confirmed.is_applied(), "an uncontended finalize applies");
}

pub fn command(run: &RunId, decision: u32, tool: &str, call_idx: u32, args: Value) -> Command {
    command_with_key(run, decision, tool, call_idx, args, None)
}

pub fn command_with_key(
    run: &RunId,
    decision: u32,
    tool: &str,
    call_idx: u32,
    args: Value,
    business_key: Option<&str>,
) -> Command {
    let tool = ToolName::parse(tool).expect("fixture tool names are valid");
    let semantics = match tool.namespace() {
        "payments" => EffectSemantics::NonIdempotent,
        "search" => EffectSemantics::ObserveOnly,
        _ => EffectSemantics::Idempotent,
    };
    Command::from_intent(
        Intent {
            run_id: run.clone(),
            command_key: CommandKey::new(decision, tool, call_idx),
            semantics,
            args,
            business_key: business_key.map(BusinessKey::new),
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        now(),
        10_000,
    )
}

async fn reserve_new(ledger: &dyn Ledger, command: Command) -> Command {
    let audit = command.reservation_audit("contract");
    match ledger.reserve(command, audit).await.expect("reserve") {
        Reserved::Created(command) => command,
        other => panic!("expected a new command, got {other:?}"),
    }
}

/// Applies `event` through the state machine and writes it with `write`.
fn step(command: &Command, event: Event) -> Transition {
    let step = machine::apply(&command.state, &wire_rules(), &event, now())
        .unwrap_or_else(|refusal| panic!("{event:?} refused: {refusal}"));
    Transition::from_step(command, &step, "contract")
}

async fn lease(ledger: &dyn Ledger, command: &Command, owner: &str) -> Cas {
    ledger
        .acquire_lease(step(
            command,
            Event::Lease {
                owner: owner.into(),
            },
        ))
        .await
        .expect("lease request is well formed")
}

fn committed(epoch: LeaseEpoch, result: Value) -> Event {
    Event::Dispatched {
        epoch,
        sent_at: now(),
        outcome: DispatchOutcome::Committed {
            external_ref: Some("w-1".into()),
            result: Some(Arc::new(result)),
        },
    }
}

pub async fn reserve_is_insert_if_absent(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("reserve");
    let wire = command(
        &run,
        3,
        "payments/wire",
        0,
        json!({"account": "a-1", "amount": 5}),
    );
    let created = reserve_new(&*ledger, wire.clone()).await;
    assert_eq!(created.status(), CommandStatus::Pending);
    assert_eq!(
        created.idempotency_key.to_string(),
        format!("{run}/d-3/payments/wire/0")
    );

    // Same key, same arguments in another key order: the stored command, nothing new.
    let again = command(
        &run,
        3,
        "payments/wire",
        0,
        json!({"amount": 5, "account": "a-1"}),
    );
    let audit = again.reservation_audit("contract");
    match ledger.reserve(again, audit).await.expect("reserve") {
        Reserved::Existing(existing) => assert_eq!(existing, created),
        other => panic!("expected the existing command, got {other:?}"),
    }
    let stored = ledger
        .get(&run, &created.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(stored, created);
    assert_eq!(
        ledger.audit_read(&run).await.expect("audit").entries.len(),
        1
    );
}

pub async fn reserve_with_other_arguments_is_drift(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("drift");
    let original = reserve_new(
        &*ledger,
        command(&run, 1, "payments/wire", 0, json!({"amount": 5})),
    )
    .await;
    let drifted = command(&run, 1, "payments/wire", 0, json!({"amount": 500}));
    let audit = drifted.reservation_audit("contract");
    let err = ledger
        .reserve(drifted, audit)
        .await
        .expect_err("drift is refused");
    match &err {
        LedgerError::ArgumentDrift {
            run_id,
            command_key,
            stored,
            presented,
        } => {
            assert_eq!(run_id, run.as_str());
            assert_eq!(command_key, "d-1/payments/wire/0");
            assert_eq!(stored, original.args_hash.as_str());
            assert_ne!(presented, stored);
        }
        other => panic!("expected ArgumentDrift, got {other:?}"),
    }
    let stored = ledger
        .get(&run, &original.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(*stored.args, json!({"amount": 5}), "never merged");
}

pub async fn concurrent_reserves_yield_one_command(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("race-reserve");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let ledger = Arc::clone(&ledger);
            let wire = command(&run, 0, "payments/wire", 0, json!({"amount": 1}));
            tokio::spawn(async move {
                let audit = wire.reservation_audit("contract");
                ledger.reserve(wire, audit).await
            })
        })
        .collect();
    let mut created = 0;
    let mut keys = Vec::new();
    for task in tasks {
        let reserved = task.await.expect("task").expect("reserve");
        created += usize::from(reserved.is_created());
        keys.push(reserved.command().idempotency_key.clone());
    }
    assert_eq!(created, 1, "exactly one reservation creates the command");
    assert!(keys.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(ledger.list_run(&run, None).await.expect("list").len(), 1);
    assert_eq!(
        ledger.audit_read(&run).await.expect("audit").entries.len(),
        1
    );
}

pub async fn business_key_returns_the_existing_command(ledger: Arc<dyn Ledger>) {
    let (first_run, second_run) = (fresh_run("bk-a"), fresh_run("bk-b"));
    let business_key = format!("acc-1:125000:2026-11-22:{first_run}");
    let first = reserve_new(
        &*ledger,
        command_with_key(
            &first_run,
            1,
            "payments/wire",
            0,
            json!({"n": 1}),
            Some(&business_key),
        ),
    )
    .await;
    // The same logical wire under a fresh call index, even from another run.
    let second = command_with_key(
        &second_run,
        4,
        "payments/wire",
        2,
        json!({"n": 1}),
        Some(&business_key),
    );
    let audit = second.reservation_audit("contract");
    match ledger.reserve(second, audit).await.expect("reserve") {
        Reserved::BusinessKeyHeld(held) => assert_eq!(held, first),
        other => panic!("expected the holder of the business key, got {other:?}"),
    }
    assert!(
        ledger
            .list_run(&second_run, None)
            .await
            .expect("list")
            .is_empty()
    );
    // Another tool may use the same business key.
    reserve_new(
        &*ledger,
        command_with_key(
            &second_run,
            5,
            "email/send",
            0,
            json!({}),
            Some(&business_key),
        ),
    )
    .await;
}

pub async fn business_key_claims_are_idempotent_for_the_holder(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("claim");
    let holder = reserve_new(&*ledger, command(&run, 1, "payments/wire", 0, json!({}))).await;
    let tool = ToolName::parse("payments/wire").expect("valid");
    let key = BusinessKey::new(format!("claim-{run}"));
    for _ in 0..2 {
        let claim = ledger
            .claim_business_key(&tool, &key, &run, &holder.command_key)
            .await
            .expect("claim");
        assert_eq!(claim, Claim::Claimed);
    }
    let other = CommandKey::parse("d-9/payments/wire/0").expect("valid");
    let claim = ledger
        .claim_business_key(&tool, &key, &run, &other)
        .await
        .expect("claim");
    assert_eq!(
        claim,
        Claim::HeldBy {
            run_id: run.clone(),
            command_key: holder.command_key.clone()
        }
    );
}

pub async fn sixteen_racing_leases_have_one_winner(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("race-lease");
    let pending = reserve_new(&*ledger, command(&run, 0, "payments/wire", 0, json!({}))).await;
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let ledger = Arc::clone(&ledger);
            let pending = pending.clone();
            tokio::spawn(async move { lease(&*ledger, &pending, &format!("dispatcher-{i}")).await })
        })
        .collect();
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("task") {
            Cas::Applied(leased) => winners.push(leased),
            Cas::Conflict(current) => {
                let current = current.expect("the command exists");
                assert_eq!(current.status(), CommandStatus::Leased);
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one dispatcher holds the lease");
    let stored = ledger
        .get(&run, &pending.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(stored, winners[0]);
    assert_eq!(stored.epoch(), LeaseEpoch::new(1));
    assert_eq!(stored.state.attempts, 1);
}

pub async fn a_stale_epoch_never_finalizes(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("fence");
    let rules = Rules::defaults(EffectSemantics::Idempotent);
    let pending = reserve_new(&*ledger, command(&run, 0, "email/send", 0, json!({}))).await;
    let first = lease(&*ledger, &pending, "zombie")
        .await
        .applied()
        .cloned()
        .expect("first lease");

    // The zombie's lease expires; the sweep marks it UNKNOWN; it is retried and re-leased.
    let expired = machine::apply(
        &first.state,
        &rules,
        &Event::LeaseExpired,
        first.state.lease.expires_at.expect("leased"),
    )
    .expect("expired");
    let unknown = ledger
        .transition(Transition::from_step(&first, &expired, "sweep"))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    let retry = machine::apply(&unknown.state, &rules, &Event::RetrySameKey, now()).expect("retry");
    let pending_again = ledger
        .transition(Transition::from_step(&unknown, &retry, "reconciler"))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    let second = lease(&*ledger, &pending_again, "fresh")
        .await
        .applied()
        .cloned()
        .expect("second lease");
    assert_eq!(second.epoch(), LeaseEpoch::new(2));

    // The zombie wakes up and reports under epoch 1: refused, whatever it claims.
    let zombie_step = machine::apply(
        &first.state,
        &rules,
        &committed(first.epoch(), json!({"by": "zombie"})),
        now(),
    )
    .expect("valid from the zombie's point of view");
    let zombie = ledger
        .finalize(Transition::from_step(&first, &zombie_step, "zombie"))
        .await
        .expect("write");
    match zombie {
        Cas::Conflict(Some(current)) => assert_eq!(current.epoch(), LeaseEpoch::new(2)),
        other => panic!("a stale epoch finalized: {other:?}"),
    }
    let fresh = ledger
        .finalize(step(
            &second,
            committed(second.epoch(), json!({"by": "fresh"})),
        ))
        .await
        .expect("write");
    let confirmed = fresh.applied().expect("the holder finalizes");
    assert_eq!(confirmed.status(), CommandStatus::Confirmed);
    assert_eq!(
        confirmed.state.result,
        Some(Arc::new(json!({"by": "fresh"})))
    );
}

/// A quiet step of the machine (a lease extension, a claim) is an ordinary guarded write
/// without an audit record: the holder's applies, a stale holder's loses its compare-and-set,
/// and a claim's new epoch fences the write of whoever read the command before it.
pub async fn a_quiet_step_is_fenced_and_writes_no_record(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("extend");
    let pending = reserve_new(&*ledger, command(&run, 0, "payments/wire", 0, json!({}))).await;
    let leased = lease(&*ledger, &pending, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    let later = now().plus_millis(120_000);
    let extend = Event::ExtendLease {
        epoch: leased.epoch(),
        to: later,
    };
    let write = step(&leased, extend.clone());
    assert!(write.audit.is_none(), "an extension is quiet");
    let extended = ledger.transition(write).await.expect("extend");
    let extended = extended.applied().cloned().expect("holder extends");
    assert_eq!(extended.state.lease.expires_at, Some(later));
    assert_eq!(extended.state.due_at, Some(later));
    // Decided on a copy whose epoch is gone: the guard no longer matches.
    let mut stale = leased.clone();
    stale.state.lease.epoch = LeaseEpoch::ZERO;
    let mut write = step(&leased, extend);
    write.guard = Guard::of(&stale);
    assert!(!ledger.transition(write).await.expect("write").is_applied());
    // The lease holder's outcome is fenced out by a claim made after it read the command.
    let mut expired = extended.clone();
    expired.state.lease.expires_at = Some(now());
    let unknown = ledger
        .transition(step(&expired, Event::LeaseExpired))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("expired");
    let claimed = ledger
        .transition(step(
            &unknown,
            Event::Claim {
                job: machine::ClaimJob::Look,
                hold_ms: 10_000,
            },
        ))
        .await
        .expect("claim")
        .applied()
        .cloned()
        .expect("claimed");
    assert_eq!(claimed.epoch(), unknown.epoch().next());
    assert_eq!(claimed.status(), CommandStatus::Unknown);
    let late = step(
        &unknown,
        Event::GiveUp {
            reason: "decided on the read before the claim".into(),
        },
    );
    assert!(!ledger.transition(late).await.expect("write").is_applied());
    // Neither the extension nor the claim is a transition: reservation, lease, expiry only.
    assert_eq!(
        ledger.audit_read(&run).await.expect("audit").entries.len(),
        3
    );
}

pub async fn lease_and_finalize_refuse_the_wrong_shape(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("shape");
    let pending = reserve_new(&*ledger, command(&run, 0, "payments/wire", 0, json!({}))).await;
    let cancel = step(
        &pending,
        Event::Cancel {
            operator: machine::Operator {
                actor: "ops".into(),
                reason: "test".into(),
            },
        },
    );
    assert!(matches!(
        ledger.acquire_lease(cancel.clone()).await,
        Err(LedgerError::InvalidRequest { .. })
    ));
    assert!(matches!(
        ledger.finalize(cancel).await,
        Err(LedgerError::InvalidRequest { .. })
    ));
    let mut backwards = step(&pending, Event::Lease { owner: "d".into() });
    backwards.next.lease.epoch = LeaseEpoch::ZERO;
    backwards.guard.epoch = LeaseEpoch::new(1);
    assert!(
        ledger.transition(backwards).await.is_err(),
        "epochs never go back"
    );
    let stored = ledger
        .get(&run, &pending.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(stored, pending, "a refused request changes nothing");
}

pub async fn transitions_are_audited_and_conflicts_are_not(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("audit");
    let pending = reserve_new(&*ledger, command(&run, 0, "payments/wire", 0, json!({}))).await;
    let leased = lease(&*ledger, &pending, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    // A second lease from the stale PENDING view conflicts and records nothing.
    assert!(!lease(&*ledger, &pending, "other").await.is_applied());
    let ambiguous = Event::Dispatched {
        epoch: leased.epoch(),
        sent_at: now(),
        outcome: DispatchOutcome::Ambiguous {
            reason: "timeout after send".into(),
        },
    };
    let unknown = ledger
        .finalize(step(&leased, ambiguous))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    let present = Event::Observed {
        observation: Observation::Present,
        external_ref: Some("w-77".into()),
        evidence: json!({"status": 200}),
        extra_refs: vec![],
        retry_after_ms: None,
        record: None,
    };
    let confirmed = ledger
        .transition(step(&unknown, present))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    assert_eq!(confirmed.state.external_ref.as_deref(), Some("w-77"));

    let trail = ledger.audit_read(&run).await.expect("audit");
    let path: Vec<_> = trail
        .entries
        .iter()
        .map(|e| (e.record.from, e.record.to))
        .collect();
    use CommandStatus as S;
    assert_eq!(
        path,
        vec![
            (None, Some(S::Pending)),
            (Some(S::Pending), Some(S::Leased)),
            (Some(S::Leased), Some(S::Unknown)),
            (Some(S::Unknown), Some(S::Confirmed)),
        ]
    );
    assert_eq!(trail.entries[3].record.evidence, json!({"status": 200}));
    let verified = verify(&run, trail.checkpoint.as_ref(), &trail.entries).expect("verifies");
    assert_eq!(verified.records, 4);
}

pub async fn list_run_is_in_journal_order_and_filters_by_status(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("list");
    for (decision, call) in [(10, 0), (2, 1), (2, 0), (1, 5)] {
        reserve_new(
            &*ledger,
            command(&run, decision, "email/send", call, json!({})),
        )
        .await;
    }
    let confirmed_one = ledger
        .get(&run, &CommandKey::parse("d-2/email/send/1").expect("valid"))
        .await
        .expect("get")
        .expect("stored");
    let leased = lease(&*ledger, &confirmed_one, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    ledger
        .finalize(step(&leased, committed(leased.epoch(), json!({}))))
        .await
        .expect("write");
    let keys: Vec<String> = ledger
        .list_run(&run, None)
        .await
        .expect("list")
        .iter()
        .map(|c| c.command_key.to_string())
        .collect();
    assert_eq!(
        keys,
        [
            "d-1/email/send/5",
            "d-2/email/send/0",
            "d-2/email/send/1",
            "d-10/email/send/0"
        ]
    );
    let confirmed = ledger
        .list_run(&run, Some(CommandStatus::Confirmed))
        .await
        .expect("list");
    assert_eq!(confirmed.len(), 1);
    assert_eq!(confirmed[0].command_key.to_string(), "d-2/email/send/1");
    assert!(
        ledger
            .list_run(&fresh_run("empty"), None)
            .await
            .expect("list")
            .is_empty()
    );
}

pub async fn due_index_returns_what_is_due_in_time_order(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("due");
    let base = now();
    let mut scheduled = command(&run, 1, "email/send", 0, json!({}));
    let at = base.plus_millis(3_600_000);
    scheduled.not_before = Some(at);
    scheduled.state = sluice_core::command::CommandState::reserved(base, Some(at), 10_000);
    let scheduled = reserve_new(&*ledger, scheduled).await;
    assert_eq!(scheduled.status(), CommandStatus::Scheduled);
    let pending = reserve_new(&*ledger, command(&run, 2, "email/send", 0, json!({}))).await;

    let mine = |items: Vec<crate::DueItem>| -> Vec<(String, CommandStatus)> {
        items
            .into_iter()
            .filter(|item| item.run_id == run)
            .map(|item| (item.command_key.to_string(), item.status))
            .collect()
    };
    assert!(
        mine(ledger.due(base, 10_000).await.expect("due")).is_empty(),
        "nothing due yet"
    );
    let stale_at = pending
        .state
        .due_at
        .expect("a PENDING command is due when stale");
    let stale = mine(ledger.due(stale_at, 10_000).await.expect("due"));
    assert_eq!(
        stale,
        vec![("d-2/email/send/0".to_owned(), CommandStatus::Pending)]
    );
    let both = ledger.due(at, 100_000).await.expect("due");
    let ours: Vec<_> = both.iter().filter(|i| i.run_id == run).collect();
    assert_eq!(ours.len(), 2);
    assert!(ours[0].due_at <= ours[1].due_at, "earliest first");
    assert!(both.windows(2).all(|w| w[0].due_at <= w[1].due_at));

    // Leased by a dispatcher: still due when the reservation was (the lease keeps the earlier
    // time). Found due under the live lease, it is moved to the lease's end, quietly.
    let leased = lease(&*ledger, &pending, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    assert_eq!(leased.state.due_at, Some(stale_at));
    let leased_key = ("d-2/email/send/0".to_owned(), CommandStatus::Leased);
    assert!(mine(ledger.due(stale_at, 10_000).await.expect("due")).contains(&leased_key));
    let expiry = leased.state.lease.expires_at.expect("expiry");
    let moved = machine::apply(&leased.state, &wire_rules(), &Event::LeaseExpired, stale_at)
        .expect("moved to the lease's end");
    assert!(moved.quiet);
    let leased = ledger
        .transition(Transition::from_step(&leased, &moved, "sweep"))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("uncontended");
    assert_eq!(leased.state.due_at, Some(expiry));
    assert!(
        !mine(ledger.due(stale_at, 10_000).await.expect("due")).contains(&leased_key),
        "no longer due at the reservation's time"
    );
    let at_expiry = mine(ledger.due(expiry, 100_000).await.expect("due"));
    assert!(at_expiry.contains(&leased_key));
    // Confirmed: leaves the index.
    ledger
        .finalize(step(&leased, committed(leased.epoch(), json!({}))))
        .await
        .expect("write");
    let after = mine(ledger.due(at, 100_000).await.expect("due"));
    assert_eq!(
        after,
        vec![("d-1/email/send/0".to_owned(), CommandStatus::Scheduled)]
    );
}

pub async fn results_are_size_capped(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("cap");
    let pending = reserve_new(&*ledger, command(&run, 0, "email/send", 0, json!({}))).await;
    let leased = lease(&*ledger, &pending, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    let huge = json!({"body": "x".repeat(MAX_RESULT_BYTES * 2)});
    let confirmed = ledger
        .finalize(step(&leased, committed(leased.epoch(), huge)))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    let stored = ledger
        .get(&run, &confirmed.command_key)
        .await
        .expect("get")
        .expect("stored");
    let result = stored.state.result.expect("kept");
    assert_eq!(result["truncated"], json!(true));
    assert!(result.to_string().len() <= MAX_RESULT_BYTES);
    assert_eq!(
        result["bytes"].as_u64(),
        Some((MAX_RESULT_BYTES * 2 + 11) as u64)
    );
}

pub async fn unknown_commands_conflict_with_none(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("ghost");
    let ghost = command(&run, 0, "payments/wire", 0, json!({}));
    assert_eq!(
        ledger.get(&run, &ghost.command_key).await.expect("get"),
        None
    );
    let write = ledger
        .acquire_lease(step(&ghost, Event::Lease { owner: "d".into() }))
        .await;
    assert_eq!(write.expect("well formed"), Cas::Conflict(None));
    assert!(
        ledger
            .audit_read(&run)
            .await
            .expect("audit")
            .entries
            .is_empty()
    );
}

pub async fn audit_append_records_run_level_facts(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("note");
    reserve_new(&*ledger, command(&run, 0, "payments/wire", 0, json!({}))).await;
    let entry = ledger
        .audit_append(
            &run,
            AuditDraft {
                command_key: None,
                from: None,
                to: None,
                actor: "alice".into(),
                reason: "rollback requested".into(),
                evidence: json!({"ticket": "OPS-1"}),
            },
            now(),
        )
        .await
        .expect("append");
    assert_eq!(entry.record.seq, 1);
    let trail = ledger.audit_read(&run).await.expect("audit");
    assert_eq!(trail.entries.last(), Some(&entry));
    verify(&run, None, &trail.entries).expect("verifies");
}

pub async fn a_closed_run_takes_no_new_commands_and_replays_its_own(ledger: Arc<dyn Ledger>) {
    let (run, other) = (fresh_run("closed"), fresh_run("closed-other"));
    let since = now().plus_millis(-1);
    let key = format!("closed-{run}");
    let wire = reserve_new(
        &*ledger,
        command_with_key(
            &run,
            1,
            "payments/wire",
            0,
            json!({"amount": 5}),
            Some(&key),
        ),
    )
    .await;
    reserve_new(&*ledger, command(&other, 1, "email/send", 0, json!({}))).await;
    let draft = || AuditDraft {
        command_key: None,
        from: None,
        to: None,
        actor: "alice".into(),
        reason: "run rollback: went off the rails".into(),
        evidence: json!({}),
    };
    let closing = ledger.close_run(&run, draft(), now()).await.expect("close");
    match closing {
        Closing::Closed(entry) => {
            assert_eq!(entry.record.seq, 1, "the record follows the reservation's");
        }
        Closing::AlreadyClosed => panic!("an open run is closed by its first close"),
    }
    // The run listing tells the closed run from the open one (the console marks it).
    let listed = ledger
        .list_runs(since, None, 100_000)
        .await
        .expect("list runs");
    let closed_at = |id: &RunId| {
        listed
            .iter()
            .find(|r| &r.run_id == id)
            .map(|r| r.rolled_back_at)
    };
    assert!(
        matches!(closed_at(&run), Some(Some(_))),
        "a closed run is listed as rolled back: {listed:?}"
    );
    assert_eq!(closed_at(&other), Some(None), "an open run is not");

    // Nothing new goes in, with or without a business key, whatever the process caches.
    for fresh in [
        command(&run, 2, "email/send", 0, json!({})),
        command_with_key(
            &run,
            3,
            "payments/wire",
            0,
            json!({"amount": 6}),
            Some(&format!("{key}-2")),
        ),
    ] {
        let audit = fresh.reservation_audit("contract");
        match ledger.reserve(fresh, audit).await {
            Err(LedgerError::RunClosed { run_id, .. }) => assert_eq!(run_id, run.as_str()),
            other => panic!("a closed run takes no new command, got {other:?}"),
        }
    }
    // What is there still replays, and drift is still drift.
    let again = command_with_key(
        &run,
        1,
        "payments/wire",
        0,
        json!({"amount": 5}),
        Some(&key),
    );
    let audit = again.reservation_audit("contract");
    match ledger.reserve(again, audit).await.expect("a replay") {
        Reserved::Existing(existing) => assert_eq!(existing.command_key, wire.command_key),
        other => panic!("expected the existing command, got {other:?}"),
    }
    let drifted = command_with_key(
        &run,
        1,
        "payments/wire",
        0,
        json!({"amount": 7}),
        Some(&key),
    );
    let audit = drifted.reservation_audit("contract");
    assert!(matches!(
        ledger.reserve(drifted, audit).await,
        Err(LedgerError::ArgumentDrift { .. })
    ));
    // Closing again writes nothing; a plain run-level record does not reopen the run; other
    // runs are untouched.
    let twice = ledger
        .close_run(&run, draft(), now())
        .await
        .expect("close again");
    assert_eq!(twice, Closing::AlreadyClosed);
    let note = ledger
        .audit_append(&run, draft(), now())
        .await
        .expect("a note");
    assert_eq!(note.record.seq, 2);
    let later = command(&run, 4, "email/send", 0, json!({}));
    let audit = later.reservation_audit("contract");
    assert!(matches!(
        ledger.reserve(later, audit).await,
        Err(LedgerError::RunClosed { .. })
    ));
    reserve_new(&*ledger, command(&other, 2, "email/send", 0, json!({}))).await;
    let trail = ledger.audit_read(&run).await.expect("audit");
    assert_eq!(
        trail.entries.len(),
        3,
        "the reservation, one closing record and the note only"
    );
    verify(&run, None, &trail.entries).expect("verifies");
    assert_eq!(
        ledger.list_run(&run, None).await.expect("list").len(),
        1,
        "nothing was added"
    );
}

pub async fn purge_removes_finished_runs_and_leaves_checkpoints(ledger: Arc<dyn Ledger>) {
    let (done, open) = (fresh_run("purge-done"), fresh_run("purge-open"));
    let key = format!("purge-{done}");
    let finished = reserve_new(
        &*ledger,
        command_with_key(&done, 0, "payments/wire", 0, json!({}), Some(&key)),
    )
    .await;
    let leased = lease(&*ledger, &finished, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    ledger
        .finalize(step(&leased, committed(leased.epoch(), json!({}))))
        .await
        .expect("write");
    reserve_new(&*ledger, command(&open, 0, "payments/wire", 0, json!({}))).await;
    let before = ledger.audit_read(&done).await.expect("audit");
    let head = before.entries.last().expect("records").hash.clone();

    let cutoff = now().plus_millis(1_000);
    let mut report = crate::PurgeReport::default();
    // Other tests' finished runs may be purged too; loop until ours is gone.
    for _ in 0..100 {
        let batch = ledger
            .purge(cutoff, 10_000, "retention", now(), false)
            .await
            .expect("purge");
        let found = batch.checkpoints.iter().any(|c| c.run_id == done);
        if found {
            report = batch;
            break;
        }
        assert!(batch.runs > 0, "our finished run was not purged");
    }
    let checkpoint = report
        .checkpoints
        .iter()
        .find(|c| c.run_id == done)
        .expect("checkpoint left")
        .clone();
    assert_eq!(
        (checkpoint.last_hash.as_str(), checkpoint.count),
        (head.as_str(), 3)
    );
    assert_eq!(
        ledger.get(&done, &finished.command_key).await.expect("get"),
        None
    );
    assert!(
        ledger.list_run(&open, None).await.expect("list").len() == 1,
        "open runs stay"
    );

    // The business key is free again, and the run's chain continues after the checkpoint.
    let tool = ToolName::parse("payments/wire").expect("valid");
    let again = command_with_key(&done, 7, "payments/wire", 0, json!({}), Some(&key));
    let claim = ledger
        .claim_business_key(
            &tool,
            &BusinessKey::new(key.clone()),
            &done,
            &again.command_key,
        )
        .await
        .expect("claim");
    assert_eq!(claim, Claim::Claimed);
    reserve_new(&*ledger, again).await;
    let trail = ledger.audit_read(&done).await.expect("audit");
    assert_eq!(trail.checkpoint.as_ref(), Some(&checkpoint));
    assert_eq!(trail.entries[0].record.seq, 3);
    verify(&done, trail.checkpoint.as_ref(), &trail.entries).expect("verifies after purge");

    // The purge itself is in the system chain, which verifies.
    let system = RunId::parse(SYSTEM_RUN).expect("valid");
    let log = ledger.audit_read(&system).await.expect("audit");
    assert!(log.entries.iter().any(|e| {
        e.record.actor == "retention"
            && e.record.evidence["checkpoints"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["run_id"] == json!(done.as_str())))
    }));
    verify(&system, log.checkpoint.as_ref(), &log.entries).expect("system chain verifies");
}

/// A wire with `business_key` that went through UNKNOWN and was then observed: CONFIRMED, with
/// what the observation leaves owed (a last look, a duplicate's clean-up).
async fn confirmed_after_a_look(
    ledger: &dyn Ledger,
    run: &RunId,
    business_key: &str,
    observation: Observation,
    extra_refs: &[&str],
) -> Command {
    let pending = reserve_new(
        ledger,
        command_with_key(run, 0, "payments/wire", 0, json!({}), Some(business_key)),
    )
    .await;
    let leased = lease(ledger, &pending, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    let ambiguous = Event::Dispatched {
        epoch: leased.epoch(),
        sent_at: now(),
        outcome: DispatchOutcome::Ambiguous {
            reason: "timeout after send".into(),
        },
    };
    let unknown = ledger
        .finalize(step(&leased, ambiguous))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    let observed = Event::Observed {
        observation,
        external_ref: Some("w-1".into()),
        evidence: json!({"status": 200}),
        extra_refs: extra_refs.iter().map(|r| (*r).to_owned()).collect(),
        retry_after_ms: None,
        record: None,
    };
    let confirmed = ledger
        .transition(step(&unknown, observed))
        .await
        .expect("write")
        .applied()
        .cloned()
        .expect("applied");
    assert_eq!(confirmed.status(), CommandStatus::Confirmed);
    confirmed
}

/// A run whose commands are all terminal is still not finished while one of them owes a last
/// look (`verify_pending`) or a duplicate's clean-up (`owed_duplicates`): a purge keeps it
/// whole — its commands, so the look and the clean-up still run, and its business key, so the
/// same wire is not accepted again as new — while a finished run beside it goes.
pub async fn purge_keeps_runs_that_still_owe_work(ledger: Arc<dyn Ledger>) {
    let (looks, cleans, done) = (
        fresh_run("purge-look"),
        fresh_run("purge-dup"),
        fresh_run("purge-done"),
    );
    let look_key = format!("purge-{looks}");
    let clean_key = format!("purge-{cleans}");
    let owes_look =
        confirmed_after_a_look(&*ledger, &looks, &look_key, Observation::Present, &[]).await;
    assert!(owes_look.state.verify_pending, "a last look is owed");
    let owes_clean_up = confirmed_after_a_look(
        &*ledger,
        &cleans,
        &clean_key,
        Observation::Duplicate,
        &["w-2"],
    )
    .await;
    assert_eq!(owes_clean_up.state.owed_duplicates, vec!["w-2".to_owned()]);
    let finished = reserve_new(&*ledger, command(&done, 0, "payments/wire", 0, json!({}))).await;
    let leased = lease(&*ledger, &finished, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    ledger
        .finalize(step(&leased, committed(leased.epoch(), json!({}))))
        .await
        .expect("write");

    let cutoff = now().plus_millis(1_000);
    let mut gone = false;
    let mut kept = Vec::new();
    // One run per call: the runs kept (created first) must not use up a call's `max_runs`,
    // or a purge would stop at them for good.
    for _ in 0..100 {
        let batch = ledger
            .purge(cutoff, 1, "retention", now(), false)
            .await
            .expect("purge");
        assert!(batch.runs <= 1, "{batch:?}");
        assert!(batch.kept_runs >= batch.kept.len() as u64, "{batch:?}");
        kept.extend(batch.kept);
        gone = ledger
            .get(&done, &finished.command_key)
            .await
            .expect("get")
            .is_none();
        if gone || batch.runs == 0 {
            break;
        }
    }
    assert!(gone, "the finished run beside them was purged");
    // The purge says what it kept and why: the duplicate's clean-up is named before the last
    // look that a duplicate found also owes.
    for (run, owed, why) in [
        (&looks, &owes_look, Owed::LastLook),
        (&cleans, &owes_clean_up, Owed::DuplicateCleanUp),
    ] {
        assert!(
            kept.contains(&KeptRun {
                run_id: run.clone(),
                command_key: owed.command_key.clone(),
                owed: why,
            }),
            "{run} not reported kept for {why}: {kept:?}"
        );
    }
    assert!(
        !kept.iter().any(|k| k.run_id == done),
        "a purged run is not reported kept"
    );

    for (run, owed, business_key) in [
        (&looks, &owes_look, &look_key),
        (&cleans, &owes_clean_up, &clean_key),
    ] {
        let kept = ledger.get(run, &owed.command_key).await.expect("get");
        assert_eq!(
            kept.as_ref(),
            Some(owed),
            "{run}: a command that still owes work was purged"
        );
        let other = fresh_run("purge-again");
        let again = command_with_key(&other, 0, "payments/wire", 0, json!({}), Some(business_key));
        let claim = ledger
            .claim_business_key(
                &again.tool,
                &BusinessKey::new(business_key.clone()),
                &other,
                &again.command_key,
            )
            .await
            .expect("claim");
        assert_eq!(
            claim,
            Claim::HeldBy {
                run_id: run.clone(),
                command_key: owed.command_key.clone(),
            },
            "{run}: the business key of a command that owes work was freed"
        );
        let trail = ledger.audit_read(run).await.expect("audit");
        assert_eq!(
            trail.checkpoint, None,
            "{run}: no checkpoint for a kept run"
        );
        verify(run, None, &trail.entries).expect("the kept run's chain verifies");
    }
}

pub async fn list_runs_shows_recent_runs_with_open_counts(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("runs");
    let since = now().plus_millis(-1);
    let first = reserve_new(&*ledger, command(&run, 0, "email/send", 0, json!({}))).await;
    reserve_new(&*ledger, command(&run, 1, "email/send", 0, json!({}))).await;
    let leased = lease(&*ledger, &first, "d")
        .await
        .applied()
        .cloned()
        .expect("lease");
    ledger
        .finalize(step(&leased, committed(leased.epoch(), json!({}))))
        .await
        .expect("write");
    let runs = ledger.list_runs(since, None, 100_000).await.expect("runs");
    let ours = runs.iter().find(|r| r.run_id == run).expect("listed");
    assert_eq!(ours.open_commands, 1);
    assert!(runs.iter().all(|r| r.run_id.as_str() != SYSTEM_RUN));
    assert!(
        runs.windows(2).all(|w| w[0].created_at >= w[1].created_at),
        "newest first"
    );
}

/// A listing paged with cursors gives every run once, in order, however small the pages, even
/// when several runs share a millisecond (a page may end inside it). Found by the fault runner:
/// an operator listing BLOCKED effects saw only the newest 1,000 runs and never the rest.
pub async fn list_runs_pages_with_a_cursor_and_misses_none(ledger: Arc<dyn Ledger>) {
    let at = now();
    let mut ours = Vec::new();
    for (n, created_at) in [at, at, at, at, at, at.plus_millis(1), at.plus_millis(1)]
        .into_iter()
        .enumerate()
    {
        let run = fresh_run(&format!("page{n}"));
        let mut fresh = command(&run, 0, "email/send", 0, json!({}));
        fresh.created_at = created_at;
        reserve_new(&*ledger, fresh).await;
        ours.push((created_at, run));
    }
    // Newest first; runs of one millisecond by descending id.
    ours.sort_by(|a, b| (b.0, b.1.as_str()).cmp(&(a.0, a.1.as_str())));
    let expected: Vec<RunId> = ours.into_iter().map(|(_, run)| run).collect();
    for page in [1, 2, 3, 100] {
        let mut seen = Vec::new();
        let mut cursor: Option<RunCursor> = None;
        loop {
            let runs = ledger
                .list_runs(at, cursor.as_ref(), page)
                .await
                .expect("runs");
            assert!(runs.len() <= page, "a page holds at most its limit");
            let Some(last) = runs.last() else { break };
            cursor = Some(last.cursor());
            seen.extend(runs.into_iter().map(|r| r.run_id));
        }
        // Other tests may add runs to a shared ledger meanwhile: ours must each come once.
        let listed: Vec<RunId> = seen
            .iter()
            .filter(|r| expected.contains(r))
            .cloned()
            .collect();
        assert_eq!(listed, expected, "pages of {page}");
    }
}

/// The principal that submitted a command is stored with it and survives its transitions (an
/// agent's right to read a run rests on it).
pub async fn the_submitter_is_kept_through_transitions(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("submitter");
    let anonymous = reserve_new(&*ledger, command(&run, 0, "email/send", 0, json!({}))).await;
    assert_eq!(anonymous.submitted_by, None);
    let owned = reserve_new(
        &*ledger,
        command(&run, 1, "email/send", 0, json!({})).submitted_by("agent-7"),
    )
    .await;
    assert_eq!(owned.submitted_by.as_deref(), Some("agent-7"));
    let leased = lease(&*ledger, &owned, "d-1");
    let leased = leased.await;
    let leased = leased.applied().expect("the lease applies");
    assert_eq!(leased.submitted_by.as_deref(), Some("agent-7"));
    let read = ledger
        .get(&run, &owned.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(read.submitted_by.as_deref(), Some("agent-7"));
    let listed = ledger.list_run(&run, None).await.expect("list");
    let submitters: Vec<Option<&str>> = listed.iter().map(|c| c.submitted_by.as_deref()).collect();
    assert_eq!(submitters, vec![None, Some("agent-7")]);
}

/// A command's tenant is stored with its identity and survives its transitions (each tenant's
/// quota, and fair dispatch between tenants, rest on it); a command stored without one (as
/// before tenants existed) reads as its submitter's, or the anonymous principal's.
pub async fn the_tenant_is_kept_through_transitions(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("tenant");
    let named = reserve_new(
        &*ledger,
        command(&run, 0, "email/send", 0, json!({}))
            .submitted_by("platform")
            .for_tenant("acme"),
    )
    .await;
    assert_eq!(named.tenant(), "acme");
    let leased = lease(&*ledger, &named, "d-1").await;
    let leased = leased.applied().expect("the lease applies");
    assert_eq!(
        (leased.tenant(), leased.submitted_by.as_deref()),
        ("acme", Some("platform"))
    );
    let unnamed = reserve_new(
        &*ledger,
        command(&run, 1, "email/send", 0, json!({})).submitted_by("platform"),
    )
    .await;
    assert_eq!(unnamed.tenant(), "platform");
    let other = fresh_run("tenant-anon");
    reserve_new(&*ledger, command(&other, 0, "email/send", 0, json!({}))).await;
    let read = ledger
        .get(&run, &named.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(read.tenant.as_deref(), Some("acme"));
    let listed = ledger.list_run(&run, None).await.expect("list");
    let tenants: Vec<Option<&str>> = listed.iter().map(|c| c.tenant.as_deref()).collect();
    assert_eq!(
        tenants,
        vec![Some("acme"), Some("platform")],
        "read back, each names its tenant"
    );
    let anonymous = ledger.list_run(&other, None).await.expect("list");
    assert_eq!(
        anonymous[0].tenant.as_deref(),
        Some(sluice_core::tenant::ANONYMOUS)
    );
}

/// The trace context a command was submitted under is stored with its identity and survives
/// its transitions: every later step of the effect (a sweep's included) joins that trace.
pub async fn the_trace_context_is_kept_through_transitions(ledger: Arc<dyn Ledger>) {
    use sluice_core::trace::TraceContext;
    let run = fresh_run("trace");
    let trace = TraceContext::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        Some("vendor=opaque"),
    );
    assert!(trace.is_some());
    let untraced = reserve_new(&*ledger, command(&run, 0, "email/send", 0, json!({}))).await;
    assert_eq!(untraced.trace, None);
    let traced = reserve_new(
        &*ledger,
        command(&run, 1, "email/send", 0, json!({})).traced(trace.clone()),
    )
    .await;
    assert_eq!(traced.trace, trace);
    let leased = lease(&*ledger, &traced, "d-1").await;
    let leased = leased.applied().expect("the lease applies");
    assert_eq!(leased.trace, trace);
    let read = ledger
        .get(&run, &traced.command_key)
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(read.trace, trace);
    let listed = ledger.list_run(&run, None).await.expect("list");
    let traces: Vec<Option<TraceContext>> = listed.iter().map(|c| c.trace.clone()).collect();
    assert_eq!(traces, vec![None, trace.clone()]);
    // The same key again returns the stored command with its own context, not the caller's.
    let again = ledger
        .reserve(
            command(&run, 1, "email/send", 0, json!({})),
            command(&run, 1, "email/send", 0, json!({})).reservation_audit("contract"),
        )
        .await
        .expect("reserve");
    match again {
        Reserved::Existing(existing) => assert_eq!(existing.trace, trace),
        other => panic!("expected the existing command, got {other:?}"),
    }
}

async fn reserve_own(ledger: &dyn Ledger, command: Command) -> Result<Reserved, LedgerError> {
    let audit = command.reservation_audit("contract");
    ledger.reserve_own(command, audit).await
}

/// An agent confined to its own runs gets into a new run and into a run of its own commands,
/// and is refused, with nothing written, in a run holding someone else's command or a command
/// submitted by no one, a replay of an existing key included.
pub async fn reserve_own_refuses_a_run_with_another_submitter(ledger: Arc<dyn Ledger>) {
    let mine = fresh_run("own-mine");
    let first = reserve_own(
        &*ledger,
        command(&mine, 0, "email/send", 0, json!({})).submitted_by("agent-a"),
    )
    .await
    .expect("a new run is open to anyone");
    assert!(matches!(first, Reserved::Created(_)), "{first:?}");
    let second = reserve_own(
        &*ledger,
        command(&mine, 0, "email/send", 1, json!({})).submitted_by("agent-a"),
    )
    .await
    .expect("the agent's own run");
    assert!(matches!(second, Reserved::Created(_)), "{second:?}");

    let refused = reserve_own(
        &*ledger,
        command(&mine, 0, "email/send", 2, json!({})).submitted_by("agent-b"),
    )
    .await;
    match refused {
        Err(LedgerError::ForeignRun {
            run_id,
            submitter,
            other,
        }) => {
            assert_eq!(run_id, mine.as_str());
            assert_eq!(submitter, "agent-b");
            assert_eq!(other, "agent-a");
        }
        other => panic!("expected ForeignRun, got {other:?}"),
    }
    let replay = reserve_own(
        &*ledger,
        command(&mine, 0, "email/send", 0, json!({})).submitted_by("agent-b"),
    )
    .await;
    assert!(
        matches!(replay, Err(LedgerError::ForeignRun { .. })),
        "a replay of another agent's key is refused too: {replay:?}"
    );
    let listed = ledger.list_run(&mine, None).await.expect("list");
    assert_eq!(listed.len(), 2, "nothing was written for agent-b");

    // Unconfined, the same reservation goes in (an operator, or an open API).
    let operator = reserve_new(
        &*ledger,
        command(&mine, 0, "email/send", 3, json!({})).submitted_by("operator-1"),
    )
    .await;
    assert_eq!(operator.submitted_by.as_deref(), Some("operator-1"));
    let now_shared = reserve_own(
        &*ledger,
        command(&mine, 0, "email/send", 4, json!({})).submitted_by("agent-a"),
    )
    .await;
    assert!(
        matches!(now_shared, Err(LedgerError::ForeignRun { ref other, .. }) if other == "operator-1"),
        "{now_shared:?}"
    );

    let anonymous = fresh_run("own-anonymous");
    reserve_new(&*ledger, command(&anonymous, 0, "email/send", 0, json!({}))).await;
    let refused = reserve_own(
        &*ledger,
        command(&anonymous, 0, "email/send", 1, json!({})).submitted_by("agent-a"),
    )
    .await;
    assert!(
        matches!(refused, Err(LedgerError::ForeignRun { ref other, .. }) if other == "nobody"),
        "{refused:?}"
    );
}

/// Eight agents open the same new run at the same instant: exactly one gets in, and the run
/// holds that agent's command only.
pub async fn two_agents_opening_one_run_at_once_cannot_both_get_in(ledger: Arc<dyn Ledger>) {
    let run = fresh_run("own-race");
    let attempts = (0..8u32).map(|i| {
        let ledger = Arc::clone(&ledger);
        let command =
            command(&run, 0, "email/send", i, json!({})).submitted_by(format!("agent-{i}"));
        tokio::spawn(async move { reserve_own(&*ledger, command).await })
    });
    let mut admitted = Vec::new();
    for attempt in futures::future::join_all(attempts).await {
        match attempt.expect("task") {
            Ok(reserved) => admitted.push(reserved.into_command()),
            Err(LedgerError::ForeignRun { .. }) => {}
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(admitted.len(), 1, "exactly one agent opens the run");
    let listed = ledger.list_run(&run, None).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].submitted_by, admitted[0].submitted_by);
}
