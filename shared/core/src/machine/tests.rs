//! Tests of the state machine: one table over every (state, event) pair, targeted tests of the
//! rules that matter most for money, and property tests of the invariants over random event
//! sequences.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::command::{CommandState, CommandStatus as S, EffectSemantics as E, Observation as O};
use crate::evidence::EvidenceOutcome;

const NOW: i64 = 1_000_000;

fn now() -> Timestamp {
    Timestamp::from_millis(NOW)
}

fn op(reason: &str) -> Operator {
    Operator {
        actor: "alice".into(),
        reason: reason.into(),
    }
}

/// Rules of a NON_IDEMPOTENT tool with every resolution strategy declared.
fn wire_rules() -> Rules {
    Rules {
        has_status_check: true,
        has_compensate: true,
        ..Rules::defaults(E::NonIdempotent)
    }
}

/// A representative state for each status: one attempt used, lease epoch 1, due now.
fn state_in(status: CommandStatus) -> CommandState {
    let mut state = CommandState::reserved(now(), None, 10_000);
    state.status = status;
    state.attempts = 1;
    state.lease.epoch = LeaseEpoch::new(1);
    state.due_at = Some(now());
    if status == S::Leased {
        state.lease.owner = Some("dispatcher-1".into());
        state.lease.expires_at = Some(now());
    }
    if status == S::Confirmed {
        // A CONFIRMED command that still owes the clean-up of a duplicate commit.
        state.owed_duplicates = vec!["w-2".into()];
    }
    if status == S::Compensating {
        state.compensation = Some(Box::new(CompensationInfo {
            started_at: now(),
            ended_at: None,
            reference: None,
            detail: None,
            attempts: 0,
        }));
    }
    state
}

/// One concrete event per column of the table.
fn samples() -> Vec<(&'static str, Event)> {
    let epoch = LeaseEpoch::new(1);
    let dispatched = |outcome| Event::Dispatched {
        epoch,
        outcome,
        sent_at: now(),
    };
    let observed = |observation| Event::Observed {
        observation,
        external_ref: Some("w-1".into()),
        evidence: json!({"checked": true}),
        extra_refs: if observation == O::Duplicate {
            vec!["w-2".into()]
        } else {
            vec![]
        },
        retry_after_ms: None,
        record: None,
    };
    vec![
        ("Due", Event::Due),
        (
            "Lse",
            Event::Lease {
                owner: "dispatcher-2".into(),
            },
        ),
        (
            "Ext",
            Event::ExtendLease {
                epoch,
                to: now().plus_millis(5_000),
            },
        ),
        (
            "CLk",
            Event::Claim {
                job: ClaimJob::Look,
                hold_ms: 10_000,
            },
        ),
        (
            "CCm",
            Event::Claim {
                job: ClaimJob::Compensate,
                hold_ms: 60_000,
            },
        ),
        (
            "CDu",
            Event::Claim {
                job: ClaimJob::UndoDuplicates,
                hold_ms: 60_000,
            },
        ),
        ("Rpb", Event::Republish { grace_ms: 5_000 }),
        (
            "Rel",
            Event::Release {
                epoch,
                reason: "lease too short".into(),
            },
        ),
        (
            "Blk",
            Event::Block {
                reason: "over limit".into(),
                epoch: Some(epoch),
            },
        ),
        (
            "Dny",
            Event::Deny {
                reason: "blocked account".into(),
                epoch: Some(epoch),
            },
        ),
        (
            "Cmt",
            dispatched(DispatchOutcome::Committed {
                external_ref: Some("w-1".into()),
                result: Some(std::sync::Arc::new(json!({"id": "w-1"}))),
            }),
        ),
        (
            "Ref",
            dispatched(DispatchOutcome::Refused {
                reason: "400".into(),
            }),
        ),
        (
            "Amb",
            dispatched(DispatchOutcome::Ambiguous {
                reason: "timeout".into(),
            }),
        ),
        (
            "NoS",
            dispatched(DispatchOutcome::NotSent {
                reason: "connection refused".into(),
            }),
        ),
        (
            "RtL",
            dispatched(DispatchOutcome::RateLimited {
                reason: "HTTP 429".into(),
                retry_after_ms: 1_000,
                refusal: false,
            }),
        ),
        ("Exp", Event::LeaseExpired),
        ("Pre", observed(O::Present)),
        ("Abs", observed(O::Absent)),
        ("Dup", observed(O::Duplicate)),
        ("Inc", observed(O::Inconclusive)),
        (
            "IRa",
            Event::Observed {
                observation: O::Inconclusive,
                external_ref: None,
                evidence: json!({"http_status": 429}),
                extra_refs: vec![],
                retry_after_ms: Some(1_000),
                record: None,
            },
        ),
        ("Rty", Event::RetrySameKey),
        (
            "Giv",
            Event::GiveUp {
                reason: "no status check".into(),
            },
        ),
        (
            "Apv",
            Event::Approve {
                operator: op("checked the beneficiary"),
                policy_version: "1".into(),
                revision: None,
            },
        ),
        (
            "Rej",
            Event::Reject {
                operator: op("wrong account"),
            },
        ),
        ("AEx", Event::ApprovalExpired),
        (
            "Can",
            Event::Cancel {
                operator: op("agent changed its mind"),
            },
        ),
        (
            "Rbk",
            Event::Rollback {
                operator: op("run aborted"),
            },
        ),
        (
            "Mrk",
            Event::MarkRollback {
                operator: op("run aborted"),
            },
        ),
        (
            "Cmp",
            Event::Compensated {
                epoch,
                outcome: CompensationOutcome::Done {
                    reference: Some("rev-1".into()),
                },
            },
        ),
        (
            "Dst",
            Event::DuplicateSettled {
                epoch,
                outcome: CompensationOutcome::Done {
                    reference: Some("rev-2".into()),
                },
                undone: vec![],
            },
        ),
        (
            "Res",
            Event::Resolve {
                operator: op("bank statement shows the wire"),
                resolution: Resolution::Confirmed {
                    external_ref: "w-9".into(),
                },
                evidence: json!({"statement": "2026-11-22 line 4"}),
            },
        ),
        (
            "Rpl",
            Event::Replay {
                operator: op("bank confirmed no wire"),
                evidence: Some(json!({"ticket": "BANK-77"})),
            },
        ),
        ("EvP", evidence(EvidenceOutcome::Present)),
        ("EvF", evidence(EvidenceOutcome::Failed)),
    ]
}

/// A signed event from an evidence source saying `outcome`.
fn evidence(outcome: EvidenceOutcome) -> Event {
    Event::Evidence {
        source: "stripe".into(),
        event_id: "evt_1".into(),
        outcome,
        external_ref: Some("w-1".into()),
        evidence: json!({"type": "charge.succeeded"}),
    }
}

/// Expected outcome of every (state, event) pair, for a NON_IDEMPOTENT tool with a status
/// check and a compensate: the next status, `-` for "does not apply", `!` for another refusal.
const TABLE: &str = "
                     Due Lse Ext CLk CCm CDu Rpb Rel Blk Dny Cmt Ref Amb NoS RtL Exp Pre Abs Dup Inc IRa Rty Giv Apv Rej AEx Can Rbk Mrk Cmp Dst Res Rpl EvP EvF
SCHEDULED            PEN -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   CAN -   -   -   -   -   -   -   -
PENDING              -   LSD -   -   -   -   PEN -   BLK FLD -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   CAN -   -   -   -   -   -   -   -
BLOCKED              -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   APR CAN CAN CAN -   -   -   -   -   -   -   -
APPROVED             -   LSD -   -   -   -   APR -   BLK FLD -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   CAN -   -   -   -   -   -   -   -
LEASED               -   -   LSD -   -   -   -   PEN BLK FLD CNF FLD UNK PEN UNK UNK -   -   -   -   -   -   -   -   -   -   -   -   LSD -   -   -   -   -   -
CONFIRMED            -   -   -   !   -   CNF CNF -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   CMG -   -   CNF -   -   -   CNF
FAILED               -   -   -   !   -   -   !   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   FLD -   -   -   PEN   -   -
UNKNOWN              -   -   -   UNK -   -   UNK -   -   -   -   -   -   -   -   -   CNF UNK CNF UNK UNK !   STK -   -   -   -   -   UNK -   -   -   -   CNF UNK
STUCK                -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   STK -   -   CNF PEN   -   -
CANCELLED            -   -   -   !   -   -   !   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   CAN -   -   -   -   -   -
COMPENSATING         -   -   -   -   CMG -   CMG -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   CMD -   -   -   -   -
COMPENSATED          -   -   -   !   -   -   !   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -
COMPENSATION_FAILED  -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -
NO_COMPENSATION      -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -   -
";

fn abbreviation(status: CommandStatus) -> &'static str {
    match status {
        S::Scheduled => "SCH",
        S::Pending => "PEN",
        S::Blocked => "BLK",
        S::Approved => "APR",
        S::Leased => "LSD",
        S::Confirmed => "CNF",
        S::Failed => "FLD",
        S::Unknown => "UNK",
        S::Stuck => "STK",
        S::Cancelled => "CAN",
        S::Compensating => "CMG",
        S::Compensated => "CMD",
        S::CompensationFailed => "CMF",
        S::NoCompensation => "NOC",
    }
}

#[test]
fn every_state_and_event_pair_matches_the_table() {
    let samples = samples();
    let mut lines = TABLE.lines().filter(|line| !line.trim().is_empty());
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    let names: Vec<&str> = samples.iter().map(|(name, _)| *name).collect();
    assert_eq!(header, names, "table columns follow the samples");
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), S::ALL.len(), "one row per status");
    let rules = wire_rules();
    let mut checked = 0;
    for (row, status) in rows.iter().zip(S::ALL) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[0], status.as_str(), "rows follow CommandStatus::ALL");
        assert_eq!(
            cells.len(),
            samples.len() + 1,
            "row {status} has every column"
        );
        let state = state_in(status);
        for ((name, event), expected) in samples.iter().zip(&cells[1..]) {
            let got = match apply(&state, &rules, event, now()) {
                Ok(step) => {
                    assert_eq!(step.from, status);
                    abbreviation(step.to()).to_owned()
                }
                Err(Refusal::NotAllowed {
                    status: refused,
                    event: kind,
                }) => {
                    assert_eq!((refused, kind), (status, event.kind()));
                    "-".to_owned()
                }
                Err(_) => "!".to_owned(),
            };
            assert_eq!(&got, expected, "{status} + {name}");
            checked += 1;
        }
    }
    assert_eq!(checked, S::ALL.len() * samples.len());
}

fn step(state: &CommandState, rules: &Rules, event: Event) -> Step {
    apply(state, rules, &event, now()).expect("transition applies")
}

#[test]
fn a_lease_bumps_the_epoch_and_counts_the_attempt() {
    let state = state_in(S::Pending);
    let leased = step(
        &state,
        &wire_rules(),
        Event::Lease {
            owner: "d-1".into(),
        },
    );
    assert_eq!(leased.state.lease.epoch, LeaseEpoch::new(2));
    assert_eq!(leased.state.attempts, 2);
    assert_eq!(leased.state.due_at, Some(now().plus_millis(30_000)));
    assert_eq!(leased.actions, vec![Action::CallUpstream]);
}

#[test]
fn a_repeatable_tool_is_leased_by_its_reservation_and_the_lease_lapses_when_a_stale_pending_would()
{
    let fresh = CommandState::reserved(now(), None, 10_000);
    for semantics in [E::Idempotent, E::ObserveOnly] {
        let rules = Rules {
            dispatch_timeout_ms: 5_000,
            ..Rules::defaults(semantics)
        };
        let leased = lease_at_reservation(&fresh, &rules, &PolicyDecision::Allow, now())
            .expect("a repeatable tool allowed by policy is leased at reservation");
        assert_eq!(leased.status, S::Leased);
        assert_eq!(leased.lease.epoch, LeaseEpoch::new(1));
        assert_eq!(leased.lease.owner.as_deref(), Some(RESERVATION_OWNER));
        assert_eq!(leased.attempts, 1);
        // pending_stale_ms (10 s) + the call's timeout (5 s), below lease_ttl_ms (30 s).
        let expiry = now().plus_millis(15_000);
        assert_eq!(leased.lease.expires_at, Some(expiry));
        assert_eq!(
            leased.due_at,
            Some(expiry),
            "the lease-expiry sweep finds it"
        );

        // A dispatcher may call under it while more than the call's timeout and the clock
        // skew bound (500 ms) is left.
        assert!(reservation_lease_usable(&leased, &rules, now()));
        assert!(reservation_lease_usable(
            &leased,
            &rules,
            now().plus_millis(9_499)
        ));
        assert!(!reservation_lease_usable(
            &leased,
            &rules,
            now().plus_millis(9_500)
        ));
        // Its outcome is written under the reservation's epoch like any other lease's.
        let outcome = step(
            &leased,
            &rules,
            Event::Dispatched {
                epoch: LeaseEpoch::new(1),
                sent_at: now(),
                outcome: DispatchOutcome::Committed {
                    external_ref: Some("m-1".into()),
                    result: None,
                },
            },
        );
        assert_eq!(outcome.state.status, S::Confirmed);
        assert!(!reservation_lease_usable(&outcome.state, &rules, now()));
        // Lapsed, it is reconciled like any lease that expired.
        let expired = apply(&leased, &rules, &Event::LeaseExpired, expiry).expect("lapses");
        assert_eq!(expired.state.status, S::Unknown);
    }
}

#[test]
fn a_reservation_leases_nothing_that_needs_one_caller_a_person_or_a_later_time() {
    let fresh = CommandState::reserved(now(), None, 10_000);
    let idempotent = Rules::defaults(E::Idempotent);
    let allow = PolicyDecision::Allow;
    assert_eq!(
        lease_at_reservation(&fresh, &wire_rules(), &allow, now()),
        None,
        "NON_IDEMPOTENT: the lease's compare-and-set picks the one caller"
    );
    let approval = PolicyDecision::RequireApproval {
        reason: "needs a person".into(),
    };
    let deny = PolicyDecision::Deny {
        reason: "never".into(),
    };
    assert_eq!(
        lease_at_reservation(&fresh, &idempotent, &approval, now()),
        None
    );
    assert_eq!(
        lease_at_reservation(&fresh, &idempotent, &deny, now()),
        None
    );
    let scheduled = CommandState::reserved(now(), Some(now().plus_millis(60_000)), 10_000);
    assert_eq!(scheduled.status, S::Scheduled);
    assert_eq!(
        lease_at_reservation(&scheduled, &idempotent, &allow, now()),
        None
    );
    // A lease some dispatcher took is never "usable" as a reservation's.
    let taken = step(
        &fresh,
        &idempotent,
        Event::Lease {
            owner: "dispatcher-1".into(),
        },
    );
    assert!(!reservation_lease_usable(&taken.state, &idempotent, now()));
}

#[test]
fn a_stale_epoch_can_never_finalize() {
    let state = state_in(S::Leased);
    for stale in [0, 2, 7] {
        let refused = apply(
            &state,
            &wire_rules(),
            &Event::Dispatched {
                epoch: LeaseEpoch::new(stale),
                sent_at: now(),
                outcome: DispatchOutcome::Committed {
                    external_ref: None,
                    result: None,
                },
            },
            now(),
        );
        assert_eq!(
            refused,
            Err(Refusal::StaleEpoch {
                current: LeaseEpoch::new(1),
                presented: LeaseEpoch::new(stale)
            })
        );
    }
}

#[test]
fn no_more_leases_once_attempts_are_used() {
    let mut state = state_in(S::Pending);
    state.attempts = 3;
    let refused = apply(
        &state,
        &wire_rules(),
        &Event::Lease { owner: "d".into() },
        now(),
    );
    assert_eq!(refused, Err(Refusal::AttemptsExhausted { max_attempts: 3 }));
}

#[test]
fn not_sent_goes_back_to_pending_with_backoff_until_attempts_run_out() {
    let rules = wire_rules();
    let not_sent = Event::Dispatched {
        epoch: LeaseEpoch::new(1),
        sent_at: now(),
        outcome: DispatchOutcome::NotSent {
            reason: "connection refused".into(),
        },
    };
    let retried = step(&state_in(S::Leased), &rules, not_sent.clone());
    assert_eq!(retried.to(), S::Pending);
    assert_eq!(retried.state.due_at, Some(now().plus_millis(500)));
    assert_eq!(retried.state.lease.owner, None);
    let mut last = state_in(S::Leased);
    last.attempts = 3;
    let failed = step(&last, &rules, not_sent);
    assert_eq!(failed.to(), S::Failed);
    assert!(failed.reason.contains("not sent after 3 attempts"));
}

#[test]
fn an_unexpired_lease_is_not_taken_away() {
    let mut state = state_in(S::Leased);
    state.lease.expires_at = Some(now().plus_millis(1));
    state.due_at = state.lease.expires_at;
    assert_eq!(
        apply(&state, &wire_rules(), &Event::LeaseExpired, now()),
        Err(Refusal::LeaseStillValid {
            expires_at: now().plus_millis(1)
        })
    );
    // Due before its end (the due time a lease kept): only the due time moves.
    state.due_at = Some(now());
    let moved = apply(&state, &wire_rules(), &Event::LeaseExpired, now()).expect("moved");
    assert_eq!(
        (moved.to(), moved.quiet, moved.state.lease.clone()),
        (S::Leased, true, state.lease.clone())
    );
}

/// A dispatcher's lease keeps the reservation's earlier due time (so a ledger indexing due
/// times writes no entry for it); a call still running then is moved to the lease's end,
/// quietly, and only the lease's end makes its outcome unknown.
#[test]
fn a_lease_keeps_an_earlier_due_time_and_the_sweep_then_waits_for_the_leases_end() {
    let rules = wire_rules();
    let reserved = CommandState::reserved(now(), None, rules.pending_stale_ms);
    let reserved_due = now().plus_millis(rules.pending_stale_ms);
    assert_eq!(reserved.due_at, Some(reserved_due));
    let at = |ms: i64| now().plus_millis(ms);

    let leased = apply(
        &reserved,
        &rules,
        &Event::Lease {
            owner: "d-1".into(),
        },
        at(20),
    )
    .expect("leased")
    .state;
    let lease_end = at(20 + rules.lease_ttl_ms);
    assert_eq!(leased.status, S::Leased);
    assert_eq!(leased.lease.expires_at, Some(lease_end));
    assert_eq!(
        leased.due_at,
        Some(reserved_due),
        "the due time did not move"
    );

    // Before the lease's end nothing is due yet: refused as before.
    assert_eq!(
        apply(&leased, &rules, &Event::LeaseExpired, at(5_000)),
        Err(Refusal::LeaseStillValid {
            expires_at: lease_end
        })
    );
    // Due while the call runs: moved to the lease's end, quietly.
    let moved = apply(&leased, &rules, &Event::LeaseExpired, reserved_due).expect("moves");
    assert!(moved.quiet);
    assert_eq!(moved.to(), S::Leased);
    assert_eq!(moved.state.due_at, Some(lease_end));
    assert_eq!(moved.state.lease, leased.lease);
    assert!(moved.actions.is_empty());
    // Once there, the lease is still valid until its end, then the outcome is unknown.
    assert_eq!(
        apply(&moved.state, &rules, &Event::LeaseExpired, at(10_001)),
        Err(Refusal::LeaseStillValid {
            expires_at: lease_end
        })
    );
    let expired = apply(&moved.state, &rules, &Event::LeaseExpired, lease_end).expect("expires");
    assert!(!expired.quiet);
    assert_eq!(expired.to(), S::Unknown);
    assert_eq!(expired.actions, vec![Action::Reconcile]);
}

fn absent() -> Event {
    Event::Observed {
        observation: O::Absent,
        external_ref: None,
        evidence: json!({"status": 404}),
        extra_refs: vec![],
        retry_after_ms: None,
        record: None,
    }
}

#[test]
fn non_idempotent_redispatch_needs_absent_twice_a_settle_interval_apart() {
    let rules = wire_rules();
    let first = step(&state_in(S::Unknown), &rules, absent());
    assert_eq!(first.to(), S::Unknown);
    assert_eq!(first.state.first_absent_at, Some(now()));
    assert_eq!(first.state.due_at, Some(now().plus_millis(rules.settle_ms)));

    let too_soon = apply(&first.state, &rules, &absent(), now().plus_millis(1_999))
        .expect("observation is recorded");
    assert_eq!(too_soon.to(), S::Unknown, "not trusted before settle");
    assert_eq!(too_soon.state.first_absent_at, Some(now()));

    let settled = apply(&too_soon.state, &rules, &absent(), now().plus_millis(2_000))
        .expect("observation is recorded");
    assert_eq!(settled.to(), S::Pending);
    assert_eq!(settled.actions, vec![Action::Dispatch]);
    assert_eq!(settled.state.first_absent_at, None);
}

#[test]
fn on_absent_fail_hands_the_decision_to_a_person() {
    let rules = Rules {
        on_absent: OnAbsent::Fail,
        ..wire_rules()
    };
    let failed = step(&state_in(S::Unknown), &rules, absent());
    assert_eq!(failed.to(), S::Failed);
    assert!(failed.reason.contains("on_absent = fail"));
}

#[test]
fn idempotent_absent_redispatches_at_once_but_not_past_max_attempts() {
    let rules = Rules::defaults(E::Idempotent);
    assert_eq!(
        step(&state_in(S::Unknown), &rules, absent()).to(),
        S::Pending
    );
    let mut exhausted = state_in(S::Unknown);
    exhausted.attempts = rules.max_attempts;
    assert_eq!(step(&exhausted, &rules, absent()).to(), S::Failed);
}

#[test]
fn inconclusive_checks_back_off_then_get_stuck_and_escalate() {
    let rules = Rules {
        max_checks: 3,
        ..wire_rules()
    };
    let inconclusive = Event::Observed {
        observation: O::Inconclusive,
        external_ref: None,
        evidence: json!({"status": 503}),
        extra_refs: vec![],
        retry_after_ms: None,
        record: None,
    };
    let mut state = state_in(S::Unknown);
    let mut delays = vec![];
    for _ in 0..2 {
        let next = step(&state, &rules, inconclusive.clone());
        assert_eq!(next.to(), S::Unknown);
        delays.push(next.state.due_at.expect("due").millis_since(now()));
        state = next.state;
    }
    assert_eq!(delays, vec![500, 1_000], "exponential backoff");
    let stuck = step(&state, &rules, inconclusive);
    assert_eq!(stuck.to(), S::Stuck);
    assert!(stuck.state.escalated);
    assert!(matches!(stuck.actions[0], Action::Escalate { .. }));
    assert!(
        stuck
            .actions
            .contains(&Action::Publish { status: S::Stuck })
    );
}

#[test]
fn a_duplicate_is_confirmed_and_its_extra_commit_compensated() {
    let duplicate = Event::Observed {
        observation: O::Duplicate,
        external_ref: Some("w-1".into()),
        evidence: json!({"refs": ["w-1", "w-2"]}),
        extra_refs: vec!["w-2".into()],
        retry_after_ms: None,
        record: None,
    };
    let with = step(&state_in(S::Unknown), &wire_rules(), duplicate.clone());
    assert_eq!(with.to(), S::Confirmed);
    assert_eq!(with.actions[0], Action::CompensateDuplicate);
    // The clean-up is owed in the ledger, with a due time, so it survives a crash.
    assert_eq!(with.state.owed_duplicates, vec!["w-2".to_owned()]);
    assert!(with.state.due_at.is_some());
    let settled = step(
        &with.state,
        &wire_rules(),
        Event::DuplicateSettled {
            epoch: with.state.lease.epoch,
            outcome: CompensationOutcome::Done {
                reference: Some("rev-1".into()),
            },
            undone: vec![],
        },
    );
    assert!(settled.state.owed_duplicates.is_empty());
    // A last look follows the clean-up: a third commit may still show (fault_paths.rs).
    assert!(settled.state.verify_pending);
    assert!(settled.state.due_at.is_some());
    let without = step(
        &state_in(S::Unknown),
        &Rules {
            has_compensate: false,
            ..wire_rules()
        },
        duplicate,
    );
    assert_eq!(without.to(), S::Confirmed);
    assert!(without.state.escalated, "nobody can undo the extra commit");
}

#[test]
fn blind_retry_is_refused_for_non_idempotent_and_bounded_for_the_rest() {
    assert_eq!(
        apply(
            &state_in(S::Unknown),
            &wire_rules(),
            &Event::RetrySameKey,
            now()
        ),
        Err(Refusal::BlindRetry)
    );
    let idempotent = Rules::defaults(E::Idempotent);
    let retried = step(&state_in(S::Unknown), &idempotent, Event::RetrySameKey);
    assert_eq!(retried.to(), S::Pending);
    let mut exhausted = state_in(S::Unknown);
    exhausted.attempts = 3;
    assert_eq!(
        step(&exhausted, &idempotent, Event::RetrySameKey).to(),
        S::Stuck
    );
    let read = Rules::defaults(E::ObserveOnly);
    assert_eq!(step(&exhausted, &read, Event::RetrySameKey).to(), S::Failed);
}

#[test]
fn rollback_compensates_escalates_or_skips_by_semantics() {
    let rollback = Event::Rollback {
        operator: op("run aborted"),
    };
    let compensating = step(&state_in(S::Confirmed), &wire_rules(), rollback.clone());
    assert_eq!(compensating.to(), S::Compensating);
    assert_eq!(
        compensating
            .state
            .compensation
            .as_ref()
            .map(|c| c.started_at),
        Some(now())
    );
    let no_comp = step(
        &state_in(S::Confirmed),
        &Rules::defaults(E::Idempotent),
        rollback.clone(),
    );
    assert_eq!(no_comp.to(), S::NoCompensation);
    assert!(no_comp.state.escalated);
    assert_eq!(
        apply(
            &state_in(S::Confirmed),
            &Rules {
                has_compensate: true,
                ..Rules::defaults(E::ObserveOnly)
            },
            &rollback,
            now()
        ),
        Err(Refusal::NotCompensable)
    );
}

#[test]
fn compensation_records_its_end_after_the_handler_and_retries_are_bounded() {
    let rules = wire_rules();
    let started = step(
        &state_in(S::Confirmed),
        &rules,
        Event::Rollback {
            operator: op("abort"),
        },
    )
    .state;
    let ended_at = now().plus_millis(1_234);
    let done = apply(
        &started,
        &rules,
        &Event::Compensated {
            epoch: started.lease.epoch,
            outcome: CompensationOutcome::Done {
                reference: Some("rev-1".into()),
            },
        },
        ended_at,
    )
    .expect("applies");
    let info = done.state.compensation.expect("recorded");
    assert_eq!((info.started_at, info.ended_at), (now(), Some(ended_at)));

    let retry = Event::Compensated {
        epoch: started.lease.epoch,
        outcome: CompensationOutcome::Retry {
            reason: "503".into(),
            retry_after_ms: None,
        },
    };
    let mut state = started;
    for _ in 0..2 {
        let next = step(&state, &rules, retry.clone());
        assert_eq!(next.to(), S::Compensating);
        state = next.state;
    }
    let failed = step(&state, &rules, retry);
    assert_eq!(failed.to(), S::CompensationFailed);
    assert!(failed.state.escalated);
}

#[test]
fn a_rejection_keeps_who_and_why_for_the_agent_and_the_audit_says_rejected() {
    for written in ["wrong beneficiary", "rejected: wrong beneficiary"] {
        let step = apply(
            &state_in(S::Blocked),
            &wire_rules(),
            &Event::Reject {
                operator: op(written),
            },
            now(),
        )
        .expect("a BLOCKED command is rejected");
        assert_eq!(step.to(), S::Cancelled);
        let rejection = step.state.rejection.as_deref().expect("kept");
        assert_eq!(
            (
                rejection.by.as_str(),
                rejection.reason.as_str(),
                rejection.at
            ),
            ("alice", "wrong beneficiary", now()),
            "an event from an older build carries the audit's prefix: {written}"
        );
        assert_eq!(step.reason, "rejected: wrong beneficiary");
    }
    let cancelled = apply(
        &state_in(S::Blocked),
        &wire_rules(),
        &Event::Cancel {
            operator: op("not needed"),
        },
        now(),
    )
    .expect("cancelled");
    assert_eq!(
        cancelled.state.rejection, None,
        "a cancel is not a rejection"
    );
}

#[test]
fn operator_actions_need_a_reason() {
    for event in [
        Event::Cancel { operator: op(" ") },
        Event::Approve {
            operator: op(""),
            policy_version: "1".into(),
            revision: None,
        },
    ] {
        assert_eq!(
            apply(&state_in(S::Blocked), &wire_rules(), &event, now()),
            Err(Refusal::ReasonRequired)
        );
    }
}

#[test]
fn resolve_needs_evidence_and_replay_of_an_unknown_wire_needs_evidence_too() {
    let rules = wire_rules();
    assert_eq!(
        apply(
            &state_in(S::Stuck),
            &rules,
            &Event::Resolve {
                operator: op("looked"),
                resolution: Resolution::Failed,
                evidence: json!(null),
            },
            now()
        ),
        Err(Refusal::EvidenceRequired)
    );
    assert_eq!(
        apply(
            &state_in(S::Stuck),
            &rules,
            &Event::Replay {
                operator: op("try again"),
                evidence: None,
            },
            now()
        ),
        Err(Refusal::ReplayNeedsEvidence)
    );
    // A FAILED command definitively did not commit, so its replay needs no evidence.
    let replayed = step(
        &state_in(S::Failed),
        &rules,
        Event::Replay {
            operator: op("fixed the account"),
            evidence: None,
        },
    );
    assert_eq!(replayed.to(), S::Pending);
    assert_eq!((replayed.state.attempts, replayed.state.replays), (0, 1));
    let mut worn = state_in(S::Failed);
    worn.replays = rules.max_replays;
    assert!(matches!(
        apply(
            &worn,
            &rules,
            &Event::Replay {
                operator: op("again"),
                evidence: None
            },
            now()
        ),
        Err(Refusal::ReplayLimit { .. })
    ));
}

#[test]
fn approval_records_who_and_under_which_policy() {
    let approved = step(
        &state_in(S::Blocked),
        &wire_rules(),
        Event::Approve {
            operator: op("called the customer"),
            policy_version: "2026-11".into(),
            revision: None,
        },
    );
    let approval = approved.state.approval.clone().expect("recorded");
    assert_eq!(approval.approver, "alice");
    assert_eq!(approval.policy_version, "2026-11");
    assert_eq!(approved.actions, vec![Action::Dispatch]);
    let audit = approved
        .audit(
            &crate::ids::CommandKey::parse("d-1/payments/wire/0").expect("valid"),
            "alice",
        )
        .expect("an approval is audited");
    assert_eq!(
        (audit.from, audit.to),
        (Some(S::Blocked), Some(S::Approved))
    );
    assert_eq!(audit.reason, "called the customer");
}

#[test]
fn a_verified_commit_catches_a_double_commit_behind_a_2xx() {
    let rules = Rules {
        verify_after_commit: true,
        ..wire_rules()
    };
    let committed = step(
        &state_in(S::Leased),
        &rules,
        Event::Dispatched {
            epoch: LeaseEpoch::new(1),
            sent_at: now(),
            outcome: DispatchOutcome::Committed {
                external_ref: Some("w-1".into()),
                result: None,
            },
        },
    );
    assert_eq!(committed.to(), S::Confirmed);
    assert!(committed.state.verify_pending);
    assert_eq!(
        committed.state.due_at,
        Some(now().plus_millis(rules.verify_after_ms))
    );
    let duplicate = step(
        &committed.state,
        &rules,
        Event::Observed {
            observation: O::Duplicate,
            external_ref: Some("w-1".into()),
            evidence: json!({"refs": ["w-1", "w-2"]}),
            extra_refs: vec!["w-2".into()],
            retry_after_ms: None,
            record: None,
        },
    );
    assert_eq!(duplicate.to(), S::Confirmed);
    assert!(!duplicate.state.verify_pending);
    assert_eq!(duplicate.actions[0], Action::CompensateDuplicate);
    let present = step(
        &committed.state,
        &rules,
        Event::Observed {
            observation: O::Present,
            external_ref: Some("w-1".into()),
            evidence: json!({}),
            extra_refs: vec![],
            retry_after_ms: None,
            record: None,
        },
    );
    assert!(!present.state.verify_pending);
    assert_eq!(present.state.due_at, None);
    // Without a pending verification a CONFIRMED command takes no observation.
    assert!(apply(&present.state, &rules, &absent(), now()).is_err());
}

#[test]
fn a_commit_that_cannot_be_verified_is_escalated_not_retried() {
    let rules = Rules {
        verify_after_commit: true,
        max_checks: 2,
        ..wire_rules()
    };
    let mut state = state_in(S::Confirmed);
    state.verify_pending = true;
    let first = step(&state, &rules, absent());
    assert!(first.state.verify_pending);
    let second = step(&first.state, &rules, absent());
    assert_eq!(
        second.to(),
        S::Confirmed,
        "a 2xx is never undone by a lagging lookup"
    );
    assert!(!second.state.verify_pending);
    assert!(second.state.escalated);
    assert_eq!(
        second.state.attempts, state.attempts,
        "nothing is redispatched"
    );
}

// ---- property tests over random event sequences ----

fn arb_rules() -> impl Strategy<Value = Rules> {
    (
        prop::sample::select(E::ALL.to_vec()),
        1u32..5,
        1u32..5,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0i64..3_000,
        (
            prop::sample::select(vec![0i64, 1_500, 30_000]),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                semantics,
                max_attempts,
                max_checks,
                check,
                compensate,
                fail_on_absent,
                settle,
                (max_rate_limited_ms, rate_limited_commits_nothing),
            )| {
                Rules {
                    max_rate_limited_ms,
                    rate_limited_commits_nothing,
                    max_attempts,
                    max_checks,
                    has_status_check: check,
                    has_compensate: compensate,
                    on_absent: if fail_on_absent {
                        OnAbsent::Fail
                    } else {
                        OnAbsent::Redispatch
                    },
                    settle_ms: settle,
                    verify_after_commit: check,
                    ..Rules::defaults(semantics)
                }
            },
        )
}

fn arb_operator() -> impl Strategy<Value = Operator> {
    prop::sample::select(vec!["", "because"]).prop_map(op)
}

fn arb_compensation() -> impl Strategy<Value = CompensationOutcome> {
    prop_oneof![
        Just(CompensationOutcome::Done { reference: None }),
        Just(CompensationOutcome::Impossible {
            reason: "409".into()
        }),
        Just(CompensationOutcome::Retry {
            reason: "503".into(),
            retry_after_ms: None,
        }),
        Just(CompensationOutcome::Retry {
            reason: "429".into(),
            retry_after_ms: Some(1_000),
        }),
    ]
}

fn arb_event() -> impl Strategy<Value = Event> {
    let epoch = (0u64..5).prop_map(LeaseEpoch::new);
    // Any send time, even one a skewed clock put after the answer: the core bounds it.
    let sent_at = (0i64..200_000).prop_map(|ms| now().plus_millis(ms));
    let outcome = prop_oneof![
        Just(DispatchOutcome::Committed {
            external_ref: Some("x".into()),
            result: None
        }),
        Just(DispatchOutcome::Refused {
            reason: "400".into()
        }),
        Just(DispatchOutcome::Ambiguous {
            reason: "timeout".into()
        }),
        Just(DispatchOutcome::NotSent {
            reason: "refused".into()
        }),
        // A Retry-After from none to more than the largest ceiling drawn; the connector never
        // reports a negative one, but the core must not trust that.
        (-1_000i64..40_000, any::<bool>()).prop_map(|(retry_after_ms, refusal)| {
            DispatchOutcome::RateLimited {
                reason: "429".into(),
                retry_after_ms,
                refusal,
            }
        }),
    ];
    let evidence = prop_oneof![Just(json!(null)), Just(json!({"ref": "x"}))];
    prop_oneof![
        Just(Event::Due),
        Just(Event::Lease { owner: "d".into() }),
        // `to` is an offset from the time the event is applied at (rebased in the test).
        (epoch.clone(), 0i64..60_000).prop_map(|(epoch, ms)| Event::ExtendLease {
            epoch,
            to: Timestamp::from_millis(ms)
        }),
        (
            prop::sample::select(vec![
                ClaimJob::Look,
                ClaimJob::Compensate,
                ClaimJob::UndoDuplicates
            ]),
            0i64..60_000
        )
            .prop_map(|(job, hold_ms)| Event::Claim { job, hold_ms }),
        (0i64..30_000).prop_map(|grace_ms| Event::Republish { grace_ms }),
        prop::option::of(epoch.clone()).prop_map(|epoch| Event::Block {
            reason: "policy".into(),
            epoch
        }),
        prop::option::of(epoch.clone()).prop_map(|epoch| Event::Deny {
            reason: "policy".into(),
            epoch
        }),
        (epoch.clone(), outcome.clone(), sent_at.clone()).prop_map(|(epoch, outcome, sent_at)| {
            Event::Dispatched {
                epoch,
                outcome,
                sent_at,
            }
        }),
        // Weight the lease holder's own epoch up so sequences reach the later states.
        (outcome, sent_at).prop_map(|(outcome, sent_at)| Event::Dispatched {
            epoch: LeaseEpoch::new(u64::MAX),
            outcome,
            sent_at
        }),
        Just(Event::LeaseExpired),
        (
            prop::sample::select(O::ALL.to_vec()),
            evidence.clone(),
            prop::option::of(-1_000i64..40_000)
        )
            .prop_map(|(observation, evidence, retry_after_ms)| Event::Observed {
                observation,
                external_ref: Some("x".into()),
                evidence,
                extra_refs: vec!["y".into()],
                retry_after_ms,
                record: None,
            }),
        Just(Event::RetrySameKey),
        Just(Event::GiveUp {
            reason: "no status check".into()
        }),
        arb_operator().prop_map(|operator| Event::Approve {
            operator,
            policy_version: "1".into(),
            revision: None,
        }),
        arb_operator().prop_map(|operator| Event::Reject { operator }),
        arb_operator().prop_map(|operator| Event::Cancel { operator }),
        arb_operator().prop_map(|operator| Event::Rollback { operator }),
        (epoch.clone(), arb_compensation())
            .prop_map(|(epoch, outcome)| Event::Compensated { epoch, outcome }),
        (epoch.clone(), arb_compensation()).prop_map(|(epoch, outcome)| Event::DuplicateSettled {
            epoch,
            outcome,
            undone: vec![]
        }),
        epoch.clone().prop_map(|epoch| Event::Release {
            epoch,
            reason: "short lease".into()
        }),
        Just(Event::ApprovalExpired),
        arb_operator().prop_map(|operator| Event::MarkRollback { operator }),
        (arb_operator(), any::<bool>(), evidence.clone()).prop_map(|(operator, ok, evidence)| {
            Event::Resolve {
                operator,
                resolution: if ok {
                    Resolution::Confirmed {
                        external_ref: "x".into(),
                    }
                } else {
                    Resolution::Failed
                },
                evidence,
            }
        }),
        (arb_operator(), prop::option::of(evidence))
            .prop_map(|(operator, evidence)| { Event::Replay { operator, evidence } }),
    ]
}

fn is_compensation_state(status: CommandStatus) -> bool {
    matches!(
        status,
        S::Compensating | S::Compensated | S::CompensationFailed | S::NoCompensation
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_over_random_event_sequences(
        rules in arb_rules(),
        scheduled in any::<bool>(),
        events in prop::collection::vec((arb_event(), 0i64..5_000), 1..60),
    ) {
        let start = now();
        let not_before = scheduled.then(|| start.plus_millis(1_000));
        let mut state = CommandState::reserved(start, not_before, rules.pending_stale_ms);
        let mut clock = start;
        for (mut event, advance) in events {
            clock = clock.plus_millis(advance);
            // The sentinel epoch stands for "the current holder's epoch".
            if let Event::Dispatched { epoch, .. } = &mut event
                && epoch.get() == u64::MAX
            {
                *epoch = state.lease.epoch;
            }
            if let Event::ExtendLease { to, .. } = &mut event {
                *to = clock.plus_millis(to.as_millis());
            }
            let result = apply(&state, &rules, &event, clock);
            if let Event::ExtendLease { epoch, .. } = &event
                && *epoch != state.lease.epoch
            {
                prop_assert!(result.is_err(), "a stale holder extended the lease: {event:?}");
            }
            if let Event::Dispatched { epoch, .. } = &event
                && *epoch != state.lease.epoch
                && !(state.rollback_pending == Some(*epoch)
                    && state.lease.epoch == epoch.next()
                    && state.lease.owner.is_some())
            {
                prop_assert!(result.is_err(), "a stale epoch finalized: {event:?}");
            }
            if let Event::Compensated { epoch, .. } | Event::DuplicateSettled { epoch, .. } = &event
                && *epoch != state.lease.epoch
            {
                prop_assert!(result.is_err(), "a stale claim wrote a compensation: {event:?}");
            }
            let Ok(step) = result else { continue };
            let (from, to) = (state.status, step.to());

            let quiet_event = matches!(
                event,
                Event::ExtendLease { .. } | Event::Claim { .. } | Event::Republish { .. }
            ) || (event == Event::LeaseExpired
                && state.lease.expires_at.is_some_and(|at| at > clock));
            prop_assert_eq!(step.quiet, quiet_event, "only claims and due-time moves are quiet");
            if step.quiet {
                prop_assert_eq!(from, to, "a quiet step moved the status");
                prop_assert!(step.audit(&CommandKey::parse("d-1/payments/wire/0").expect("valid"), "x").is_none());
            }
            match &event {
                Event::Claim { job, hold_ms } => {
                    prop_assert_eq!(awaited(&state), Some(job.action()), "claimed for work not awaited");
                    prop_assert_eq!(step.state.lease.epoch, state.lease.epoch.next(), "a claim fences");
                    prop_assert_eq!(step.state.due_at, Some(clock.plus_millis(*hold_ms)));
                    prop_assert!(step.actions.is_empty());
                    if *job == ClaimJob::Look {
                        prop_assert!(state.due_at.is_none_or(|at| at <= clock), "looked before due");
                    } else {
                        prop_assert!(!job_claimed(&state, clock), "two compensation jobs at once");
                        prop_assert_eq!(step.state.claimed_until, Some(clock.plus_millis(*hold_ms)));
                    }
                }
                Event::ExtendLease { to: until, .. } => {
                    prop_assert_eq!(step.state.lease.epoch, state.lease.epoch);
                    prop_assert_eq!(step.state.lease.expires_at, Some(*until));
                    prop_assert!(state.lease.expires_at.is_none_or(|at| at < *until), "shortened");
                }
                Event::LeaseExpired if step.quiet => {
                    // Only a due time earlier than a live lease's end moves, to that end.
                    prop_assert!(state.due_at.is_some_and(|at| at <= clock), "moved before due");
                    prop_assert_eq!(step.state.lease.clone(), state.lease.clone());
                    prop_assert_eq!(step.state.due_at, state.lease.expires_at);
                    prop_assert!(step.actions.is_empty());
                }
                Event::Republish { .. } => {
                    prop_assert_eq!(step.state.lease.epoch, state.lease.epoch);
                    prop_assert_eq!(step.actions.clone(), awaited(&state).into_iter().collect::<Vec<_>>());
                    prop_assert!(step.state.due_at.is_some_and(|at| at >= clock));
                }
                _ => {}
            }

            if rules.semantics == E::NonIdempotent && from == S::Unknown && to == S::Pending {
                let absent = matches!(
                    event,
                    Event::Observed { observation: O::Absent, .. }
                );
                prop_assert!(absent, "non-idempotent left UNKNOWN for redispatch on {event:?}");
                prop_assert!(
                    state.lands_by.is_none_or(|lands_by| lands_by <= clock),
                    "redispatched before the last attempt could no longer land"
                );
                prop_assert!(state.rollback_pending.is_none(), "redispatched in a rolled-back run");
            }
            if rules.semantics == E::ObserveOnly {
                prop_assert!(!is_compensation_state(to), "observe-only compensated: {to}");
                prop_assert!(!step.actions.iter().any(|a| matches!(
                    a,
                    Action::Compensate | Action::CompensateDuplicate
                )));
            }
            prop_assert!(step.state.attempts <= rules.max_attempts);
            // Waiting on Retry-After: bounded by the ceiling over a cycle, spending neither
            // an attempt nor a check, and never sending a NON_IDEMPOTENT effect again without
            // a look unless the tool says such an answer commits nothing.
            prop_assert!(step.state.rate_limited_ms <= rules.max_rate_limited_ms.max(0));
            if matches!(event, Event::Replay { .. }) {
                prop_assert_eq!(step.state.rate_limited_ms, 0, "a replay starts a new cycle");
            } else {
                prop_assert!(step.state.rate_limited_ms >= state.rate_limited_ms, "waiting forgotten");
            }
            if step.state.rate_limited_ms > state.rate_limited_ms {
                let waited = step.state.rate_limited_ms - state.rate_limited_ms;
                prop_assert!(step.actions.is_empty());
                prop_assert_eq!(step.state.due_at, Some(clock.plus_millis(waited)));
                match &event {
                    Event::Dispatched { .. } => {
                        prop_assert_eq!(from, S::Leased);
                        prop_assert_eq!(step.state.attempts + 1, state.attempts, "attempt spent");
                        let look_first = rules.semantics == E::NonIdempotent
                            && !rules.rate_limited_commits_nothing;
                        prop_assert_eq!(to, if look_first { S::Unknown } else { S::Pending });
                    }
                    Event::Observed { observation, .. } => {
                        prop_assert_eq!(*observation, O::Inconclusive);
                        prop_assert_eq!(step.state.checks, state.checks, "check spent");
                        prop_assert_eq!(from, to);
                    }
                    Event::Compensated {
                        outcome: CompensationOutcome::Retry { retry_after_ms: Some(_), .. },
                        ..
                    } => {
                        let attempts = |s: &CommandState| s.compensation.as_ref().map_or(0, |c| c.attempts);
                        prop_assert_eq!(attempts(&step.state), attempts(&state), "attempt spent");
                        prop_assert_eq!(from, to);
                    }
                    _ => prop_assert!(false, "waited on {:?}", event),
                }
            }
            if matches!(event, Event::Lease { .. }) && from != S::Leased {
                prop_assert!(!rate_limit_holds(&state, &rules, clock), "leased before Retry-After");
                prop_assert_eq!(step.state.rate_limited_until, None);
            }
            if from.is_terminal() && to != from {
                // Only a person, or the last look at a command decided on absence that finds
                // it committed after all, moves a terminal command.
                let last_look = state.verify_pending && matches!(event, Event::Observed { .. });
                prop_assert!(
                    event.operator().is_some() || last_look,
                    "{from} -> {to} without an operator"
                );
            }
            if let Some(operator) = event.operator() {
                prop_assert!(!operator.reason.trim().is_empty(), "operator action without reason");
            }
            prop_assert!(step.state.lease.epoch >= state.lease.epoch, "epoch went back");
            if to != S::Leased {
                prop_assert_eq!(&step.state.lease.owner, &None, "lease held outside LEASED");
            }
            if to.is_terminal()
                && !step.state.verify_pending
                && step.state.owed_duplicates.is_empty()
            {
                prop_assert_eq!(step.state.due_at, None, "terminal command still due");
            }
            if step.state.verify_pending {
                prop_assert!(
                    matches!(to, S::Confirmed | S::Failed | S::Cancelled | S::Compensating | S::Compensated),
                    "only a settled (or undone) command is verified, not a {}", to
                );
            }
            if !step.state.owed_duplicates.is_empty() {
                prop_assert!(
                    matches!(to, S::Confirmed | S::Compensating),
                    "owed clean-up in {}", to
                );
            }
            if matches!(to, S::Confirmed | S::Failed | S::Cancelled | S::Compensated)
                && (step.state.verify_pending || !step.state.owed_duplicates.is_empty())
            {
                prop_assert!(step.state.due_at.is_some(), "owed work without a due time");
            }
            state = step.state;
        }
    }
}

/// Claims, lease extensions and republishes are quiet steps of the machine (issue 29): each is
/// refused where its work is not awaited, and a claim's new epoch fences whoever read the
/// command before it.
#[test]
fn claims_extensions_and_republishes_are_fenced_quiet_steps() {
    let rules = wire_rules();
    // A compensation job: a second is refused while the first holds it, and the first's stale
    // result is refused once a later claim took over.
    let compensating = state_in(S::Compensating);
    let claim = |job| Event::Claim {
        job,
        hold_ms: 60_000,
    };
    let first = step(&compensating, &rules, claim(ClaimJob::Compensate));
    assert!(first.quiet && first.actions.is_empty());
    assert_eq!(first.state.lease.epoch, LeaseEpoch::new(2));
    assert_eq!(first.state.claimed_until, Some(now().plus_millis(60_000)));
    assert_eq!(first.state.due_at, Some(now().plus_millis(60_000)));
    assert_eq!(
        apply(&first.state, &rules, &claim(ClaimJob::Compensate), now()),
        Err(Refusal::JobClaimed {
            until: now().plus_millis(60_000)
        })
    );
    let later = now().plus_millis(60_001);
    let second = apply(&first.state, &rules, &claim(ClaimJob::Compensate), later)
        .expect("the first claim lapsed");
    assert_eq!(second.state.lease.epoch, LeaseEpoch::new(3));
    let stale = Event::Compensated {
        epoch: LeaseEpoch::new(2),
        outcome: CompensationOutcome::Done { reference: None },
    };
    assert!(matches!(
        apply(&second.state, &rules, &stale, later),
        Err(Refusal::StaleEpoch { .. })
    ));

    // A look: only when due, and only for a command that waits for one.
    let unknown = state_in(S::Unknown);
    let looked = step(&unknown, &rules, claim(ClaimJob::Look));
    assert_eq!(
        apply(&looked.state, &rules, &claim(ClaimJob::Look), now()),
        Err(Refusal::NotYetDue {
            due_at: now().plus_millis(60_000)
        })
    );
    assert_eq!(
        apply(&state_in(S::Failed), &rules, &claim(ClaimJob::Look), now()),
        Err(Refusal::NotAwaited)
    );
    let mut owing = state_in(S::Failed);
    owing.verify_pending = true;
    assert!(apply(&owing, &rules, &claim(ClaimJob::Look), now()).is_ok());

    // A lease extension: the holder's only, never shorter.
    let leased = state_in(S::Leased);
    let extend = |epoch, at: i64| Event::ExtendLease {
        epoch: LeaseEpoch::new(epoch),
        to: now().plus_millis(at),
    };
    let extended = step(&leased, &rules, extend(1, 5_000));
    assert!(extended.quiet);
    assert_eq!(extended.state.lease.epoch, leased.lease.epoch);
    assert_eq!(
        extended.state.lease.expires_at,
        Some(now().plus_millis(5_000))
    );
    assert!(matches!(
        apply(&leased, &rules, &extend(0, 5_000), now()),
        Err(Refusal::StaleEpoch { .. })
    ));
    assert_eq!(
        apply(&extended.state, &rules, &extend(1, 4_000), now()),
        Err(Refusal::LeaseNotExtended {
            expires_at: now().plus_millis(5_000)
        })
    );

    // A republish: the awaited request, the epoch kept, a PENDING one held its stale wait.
    let pending = state_in(S::Pending);
    let again = step(&pending, &rules, Event::Republish { grace_ms: 1_000 });
    assert!(again.quiet);
    assert_eq!(again.actions, vec![Action::Dispatch]);
    assert_eq!(again.state.lease.epoch, pending.lease.epoch);
    assert_eq!(
        again.state.due_at,
        Some(now().plus_millis(rules.pending_stale_ms))
    );
    assert!(matches!(
        apply(
            &again.state,
            &rules,
            &Event::Republish { grace_ms: 1_000 },
            now()
        ),
        Err(Refusal::NotYetDue { .. })
    ));
}

/// Found by `sluice bench` on a slow ledger (issue 15): a dispatch request that waited on the bus
/// longer than its reservation lease was sized for found the lease short of time and left the
/// command to the sweep — lease expiry, UNKNOWN, a status check, a same-key retry and a lease:
/// four more writes per effect on a ledger already behind. For a tool whose attempts repeat
/// with the same key, the dispatcher takes the lease over instead, in one write.
#[test]
fn a_reservation_lease_short_of_time_is_taken_over_with_the_same_key() {
    let fresh = CommandState::reserved(now(), None, 10_000);
    for semantics in [E::Idempotent, E::ObserveOnly] {
        let rules = Rules {
            dispatch_timeout_ms: 5_000,
            ..Rules::defaults(semantics)
        };
        let leased = lease_at_reservation(&fresh, &rules, &PolicyDecision::Allow, now())
            .expect("leased at reservation");
        let expiry = leased.lease.expires_at.expect("an expiry");
        let take = Event::Lease {
            owner: "d-2".into(),
        };
        // Still usable: the request is called under it, nobody takes it over.
        assert!(apply(&leased, &rules, &take, now().plus_millis(9_499)).is_err());

        for at in [now().plus_millis(9_500), expiry.plus_millis(60_000)] {
            let taken = apply(&leased, &rules, &take, at).expect("taken over");
            assert_eq!(taken.state.status, S::Leased);
            assert_eq!(
                taken.state.lease.epoch,
                LeaseEpoch::new(2),
                "fences the old one"
            );
            assert_eq!(taken.state.lease.owner.as_deref(), Some("d-2"));
            assert_eq!(taken.state.lease.expires_at, Some(at.plus_millis(30_000)));
            assert_eq!(taken.state.attempts, 2);
            assert_eq!(taken.actions, vec![Action::CallUpstream]);
            // Whoever called under the reservation's lease may still land, with the same key.
            assert!(taken.state.outcome_unknown && taken.state.ambiguous_before);
            let ended = expiry.max(at);
            assert_eq!(
                taken.state.lands_by,
                Some(ended.plus_millis(rules.late_commit_ms + rules.clock_skew_ms))
            );
            // The old holder's outcome is refused; the new holder's is written.
            let stale = Event::Dispatched {
                epoch: LeaseEpoch::new(1),
                sent_at: now(),
                outcome: DispatchOutcome::Committed {
                    external_ref: Some("m-1".into()),
                    result: None,
                },
            };
            assert!(matches!(
                apply(&taken.state, &rules, &stale, at),
                Err(Refusal::StaleEpoch { .. })
            ));
        }

        // Not once a rollback marked it, nor with its attempts used up: the sweep's.
        let mut marked = leased.clone();
        marked.rollback_pending = Some(marked.lease.epoch);
        assert!(apply(&marked, &rules, &take, expiry).is_err());
        let spent = Rules {
            max_attempts: 1,
            ..rules.clone()
        };
        assert_eq!(
            apply(&leased, &spent, &take, expiry),
            Err(Refusal::AttemptsExhausted { max_attempts: 1 })
        );
    }
    // A lease of a NON_IDEMPOTENT command is never taken over, whoever holds it.
    let wire = wire_rules();
    let mut held = state_in(S::Leased);
    held.lease.owner = Some(RESERVATION_OWNER.into());
    assert!(
        apply(
            &held,
            &wire,
            &Event::Lease {
                owner: "d-2".into()
            },
            now().plus_millis(600_000)
        )
        .is_err()
    );
}

/// The dispatcher's plan for each kind of command it may be handed, with each policy.
#[test]
fn plan_dispatch_decides_call_lease_take_over_block_deny_or_nothing() {
    use crate::command::{Command, Intent};
    use crate::ids::{CommandKey, RunId, ToolName};
    let rules = Rules::defaults(E::Idempotent);
    let owner: std::sync::Arc<str> = std::sync::Arc::from("d-1");
    let tool = ToolName::parse("email/send").expect("valid");
    let command = |state: CommandState| {
        let mut command = Command::from_intent(
            Intent {
                run_id: RunId::parse("r-1").expect("valid"),
                command_key: CommandKey::new(1, tool.clone(), 0),
                semantics: E::Idempotent,
                args: json!({}),
                business_key: None,
                policy_version: "1".into(),
                max_attempts: 3,
                not_before: None,
            },
            now(),
            10_000,
        );
        command.state = state;
        command
    };
    let allow = PolicyDecision::Allow;
    let approve = PolicyDecision::RequireApproval {
        reason: "large".into(),
    };
    let deny = PolicyDecision::Deny {
        reason: "forbidden".into(),
    };
    let pending = command(CommandState::reserved(now(), None, 10_000));
    let reserved =
        command(lease_at_reservation(&pending.state, &rules, &allow, now()).expect("leased"));
    let plan = |command: &Command, policy: Option<&PolicyDecision>, at: Timestamp| {
        plan_dispatch(command, &rules, policy, None, &owner, at)
    };
    assert_eq!(plan(&reserved, Some(&allow), now()), DispatchPlan::Call);
    assert_eq!(
        plan(&pending, Some(&allow), now()),
        DispatchPlan::Apply(Event::Lease {
            owner: owner.clone()
        })
    );
    let lapsing_at = reserved.state.lease.expires_at.expect("an expiry");
    assert_eq!(
        plan(&reserved, Some(&allow), lapsing_at),
        DispatchPlan::Apply(Event::Lease {
            owner: owner.clone()
        }),
        "a lapsing reservation lease is taken over"
    );
    assert_eq!(
        plan(&reserved, Some(&approve), now()),
        DispatchPlan::Apply(Event::Block {
            reason: "large".into(),
            epoch: Some(reserved.state.lease.epoch)
        })
    );
    assert_eq!(
        plan(&pending, Some(&deny), now()),
        DispatchPlan::Apply(Event::Deny {
            reason: "forbidden".into(),
            epoch: None
        })
    );
    let DispatchPlan::Apply(Event::Deny { reason, .. }) = plan(&pending, None, now()) else {
        panic!("a tool gone from the catalog is denied");
    };
    assert!(reason.contains("no longer in the catalog"), "{reason}");
    assert_eq!(
        plan(&command(state_in(S::Confirmed)), Some(&allow), now()),
        DispatchPlan::Nothing
    );
}

/// Flow control's hold: an allowed command is put back until its time, PENDING, with no
/// attempt spent and a reservation's unused lease given back; the dispatcher will not lease it
/// before then; a rate's hold books its slot; policy still blocks or denies first.
#[test]
fn a_held_command_waits_pending_without_spending_an_attempt() {
    use crate::command::{Command, Intent};
    use crate::flow::{Held, HoldCause};
    use crate::ids::{CommandKey, RunId, ToolName};
    let rules = Rules::defaults(E::Idempotent);
    let owner: std::sync::Arc<str> = std::sync::Arc::from("d-1");
    let mut pending = Command::from_intent(
        Intent {
            run_id: RunId::parse("r-1").expect("valid"),
            command_key: CommandKey::new(1, ToolName::parse("bank/wire").expect("valid"), 0),
            semantics: E::Idempotent,
            args: json!({}),
            business_key: None,
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        now(),
        10_000,
    );
    let allow = PolicyDecision::Allow;
    let reserved_state =
        lease_at_reservation(&pending.state, &rules, &allow, now()).expect("leased");
    let mut reserved = pending.clone();
    reserved.state = reserved_state;
    let until = now().plus_millis(30_000);
    for (cause, spread) in [(HoldCause::BreakerOpen, true), (HoldCause::Rate, false)] {
        let held = Held {
            until,
            cause,
            reason: "upstream bank's circuit breaker is open".into(),
        };
        for command in [&pending, &reserved] {
            let DispatchPlan::Apply(event) =
                plan_dispatch(command, &rules, Some(&allow), Some(&held), &owner, now())
            else {
                panic!("{cause:?}: not held");
            };
            let Event::Hold { until: at, .. } = &event else {
                panic!("{event:?}");
            };
            assert!(*at >= until && *at <= until.plus_millis(2_000));
            assert_eq!(
                *at == until,
                !spread,
                "{cause:?}: a rate's slot is kept exact"
            );
            let step = apply(&command.state, &rules, &event, now()).expect("applies");
            assert_eq!(step.state.status, S::Pending);
            assert_eq!(step.state.attempts, 0, "no attempt spent");
            assert_eq!(step.state.lease.owner, None);
            assert_eq!(
                step.state.due_at,
                Some(*at),
                "the sweep brings it back then"
            );
            assert_eq!(step.state.flow_slot.is_some(), cause == HoldCause::Rate);
            assert!(step.actions.is_empty(), "{:?}", step.actions);
            // Before its time no dispatcher leases it, whoever asks.
            let mut back = command.clone();
            back.state = step.state.clone();
            assert_eq!(
                plan_dispatch(&back, &rules, Some(&allow), None, &owner, now()),
                DispatchPlan::Nothing
            );
            assert!(
                apply(
                    &back.state,
                    &rules,
                    &Event::Lease {
                        owner: owner.clone()
                    },
                    now()
                )
                .is_err()
            );
            let leased = apply(
                &back.state,
                &rules,
                &Event::Lease {
                    owner: owner.clone(),
                },
                at.plus_millis(1),
            )
            .expect("leased after the hold");
            assert_eq!(leased.state.flow_slot, None, "a slot is used once");
            assert_eq!(leased.state.attempts, 1);
        }
    }
    // Policy first: a command needing approval is blocked, not held.
    let approve = PolicyDecision::RequireApproval {
        reason: "large".into(),
    };
    let held = Held {
        until,
        cause: HoldCause::Paused,
        reason: "paused".into(),
    };
    assert!(matches!(
        plan_dispatch(&pending, &rules, Some(&approve), Some(&held), &owner, now()),
        DispatchPlan::Apply(Event::Block { .. })
    ));
    // An UNKNOWN command's look waits too: only its due time moves, no check spent.
    let unknown = state_in(S::Unknown);
    let hold = Event::Hold {
        epoch: None,
        until,
        cause: HoldCause::Paused,
        reason: "p".into(),
    };
    let step = apply(&unknown, &rules, &hold, now()).expect("a look is held");
    assert_eq!(step.state.due_at, Some(until));
    assert_eq!(step.state.status, S::Unknown);
    assert_eq!(
        (step.state.checks, step.state.attempts),
        (unknown.checks, unknown.attempts)
    );
    // Nothing called under, settled or waiting for a person is held.
    for status in [S::Leased, S::Confirmed, S::Failed, S::Stuck, S::Blocked] {
        pending.state = state_in(status);
        assert!(
            apply(&pending.state, &rules, &hold, now()).is_err(),
            "{status:?}"
        );
    }
}

/// A compensation the upstream asked to call again later is waited out without spending an
/// attempt, under the same ceiling as a dispatch's waits; past it, it counts as any retry.
#[test]
fn a_rate_limited_compensation_waits_without_spending_an_attempt() {
    let rules = wire_rules();
    let mut compensating = state_in(S::Compensating);
    compensating.rate_limited_ms = 0;
    let outcome = CompensationOutcome::Retry {
        reason: "HTTP 429: slow down".into(),
        retry_after_ms: Some(2_000),
    };
    let epoch = compensating.lease.epoch;
    let event = Event::Compensated {
        epoch,
        outcome: outcome.clone(),
    };
    let step = apply(&compensating, &rules, &event, now()).expect("applies");
    assert_eq!(step.state.status, S::Compensating);
    let attempts = |s: &CommandState| s.compensation.as_ref().map_or(0, |c| c.attempts);
    assert_eq!(
        attempts(&step.state),
        attempts(&compensating),
        "no attempt spent"
    );
    assert_eq!(step.state.due_at, Some(now().plus_millis(2_000)));
    assert_eq!(step.state.rate_limited_ms, 2_000);
    assert!(
        step.reason.contains("without spending an attempt"),
        "{}",
        step.reason
    );
    // Past the ceiling it counts: an attempt spent, the usual backoff.
    let mut spent = compensating.clone();
    spent.rate_limited_ms = rules.max_rate_limited_ms;
    let step = apply(&spent, &rules, &event, now()).expect("applies");
    assert_eq!(attempts(&step.state), attempts(&spent) + 1);
}

/// The sweep's work on a due command is the machine's: each kind it names applies to the
/// state it was named for, and a command left alone has nothing a sweep could write.
#[test]
fn the_sweeps_work_on_each_status_is_a_step_the_machine_takes() {
    let rules = wire_rules();
    for status in S::ALL {
        let state = state_in(status);
        let work = sweep_work(&state);
        let taken = match &work {
            SweepWork::Fire(event) => apply(&state, &rules, event, now()),
            SweepWork::Look => apply(
                &state,
                &rules,
                &Event::Claim {
                    job: ClaimJob::Look,
                    hold_ms: look_hold_ms(Some(12_000)),
                },
                now(),
            ),
            SweepWork::Republish => {
                apply(&state, &rules, &Event::Republish { grace_ms: 5_000 }, now())
            }
            SweepWork::Leave => {
                assert!(
                    apply(&state, &rules, &Event::Republish { grace_ms: 5_000 }, now()).is_err(),
                    "{status:?} is left alone, yet a republish applies"
                );
                continue;
            }
        };
        assert!(taken.is_ok(), "{status:?}: {work:?} is refused: {taken:?}");
    }
    // A CONFIRMED command owing a last look is looked at; once its duplicate's clean-up is
    // owed, that comes first.
    let mut verifying = state_in(S::Confirmed);
    verifying.verify_pending = true;
    assert_eq!(sweep_work(&verifying), SweepWork::Republish);
    verifying.owed_duplicates.clear();
    assert_eq!(sweep_work(&verifying), SweepWork::Look);
    assert!(awaits_look(&verifying));
}

/// A look holds its claim for two of its check's timeouts, so a sweep does not start the same
/// slow check again; never less than a second, five without a check.
#[test]
fn a_looks_claim_outlasts_two_of_its_checks() {
    assert_eq!(look_hold_ms(Some(12_000)), 24_000);
    assert_eq!(look_hold_ms(Some(100)), 1_000);
    assert_eq!(look_hold_ms(None), 5_000);
    assert_eq!(look_hold_ms(Some(u64::MAX)), i64::MAX);
}

#[test]
fn evidence_settles_an_unknown_command_as_a_lookups_answer_would() {
    let rules = wire_rules();
    // present: CONFIRMED with the event's reference and the event as evidence.
    let present = step(
        &state_in(S::Unknown),
        &rules,
        evidence(EvidenceOutcome::Present),
    );
    assert_eq!(present.to(), S::Confirmed);
    assert_eq!(present.state.external_ref.as_deref(), Some("w-1"));
    assert_eq!(present.evidence, json!({"type": "charge.succeeded"}));
    assert!(
        present
            .reason
            .starts_with("evidence stripe/evt_1 (present): present"),
        "{}",
        present.reason
    );
    // A NON_IDEMPOTENT command went through UNKNOWN: a last look is owed, as after a lookup.
    assert!(present.state.verify_pending);

    // failed (and absent) are an absence: for a NON_IDEMPOTENT tool it must hold over the
    // settle interval, exactly as a status check's `absent` — never a redispatch at once.
    let failed = step(
        &state_in(S::Unknown),
        &rules,
        evidence(EvidenceOutcome::Failed),
    );
    assert_eq!(failed.to(), S::Unknown);
    assert_eq!(failed.state.first_absent_at, Some(now()));
    let by_lookup = step(&state_in(S::Unknown), &rules, absent());
    assert_eq!(failed.state.due_at, by_lookup.state.due_at);

    // Before the last attempt can no longer land, an absence proves nothing.
    let mut landing = state_in(S::Unknown);
    landing.lands_by = Some(now().plus_millis(5_000));
    let early = step(&landing, &rules, evidence(EvidenceOutcome::Absent));
    assert_eq!(early.to(), S::Unknown);
    assert_eq!(early.state.due_at, Some(now().plus_millis(5_000)));

    // An IDEMPOTENT tool redispatches on it with the same key at once.
    let idem = Rules::defaults(E::Idempotent);
    let retried = step(
        &state_in(S::Unknown),
        &idem,
        evidence(EvidenceOutcome::Failed),
    );
    assert_eq!(retried.to(), S::Pending);
    assert_eq!(retried.actions, vec![Action::Dispatch]);
}

#[test]
fn evidence_is_applied_once_and_not_to_a_command_still_in_flight() {
    let rules = wire_rules();
    // Applied once: the same event again finds the command CONFIRMED and is refused.
    let confirmed = step(
        &state_in(S::Unknown),
        &rules,
        evidence(EvidenceOutcome::Present),
    );
    let mut settled = confirmed.state.clone();
    settled.verify_pending = false;
    assert!(matches!(
        apply(&settled, &rules, &evidence(EvidenceOutcome::Present), now()),
        Err(Refusal::NotAllowed {
            event: EventKind::Evidence,
            ..
        })
    ));
    // Evidence before the dispatch's answer: refused, kept by the service unapplied.
    for status in [S::Pending, S::Leased, S::Approved, S::Blocked] {
        assert!(
            apply(
                &state_in(status),
                &rules,
                &evidence(EvidenceOutcome::Present),
                now()
            )
            .is_err(),
            "{status}"
        );
    }
}

#[test]
fn a_failed_event_for_a_confirmed_command_goes_to_a_person_once() {
    let rules = wire_rules();
    let mut confirmed = state_in(S::Confirmed);
    confirmed.owed_duplicates.clear();
    let escalated = step(&confirmed, &rules, evidence(EvidenceOutcome::Failed));
    assert_eq!(escalated.to(), S::Confirmed);
    assert!(escalated.state.escalated);
    assert!(matches!(
        escalated.actions.as_slice(),
        [Action::Escalate { reason }] if reason.contains("did not commit")
    ));
    // So too while its last look is owed: the event is no lagging lookup.
    let mut owing = confirmed.clone();
    owing.verify_pending = true;
    let escalated_owing = step(&owing, &rules, evidence(EvidenceOutcome::Failed));
    assert_eq!(escalated_owing.to(), S::Confirmed);
    assert!(escalated_owing.state.escalated);
    // Escalated already: a second contradicting event changes nothing.
    assert!(
        apply(
            &escalated.state,
            &rules,
            &evidence(EvidenceOutcome::Failed),
            now()
        )
        .is_err()
    );
}
