//! The table of every job against every status: what the core plans, so what the service does
//! (`jobs.rs`). A status or a job added fails here until its row or column is filled in: the
//! table's rows must cover `CommandStatus::ALL`, and each row has one entry per `Job::ALL`.

use serde_json::json;

use super::*;
use crate::command::{Command, CommandState, CommandStatus as S, EffectSemantics as E, Intent};
use crate::evidence::EvidenceOutcome;
use crate::flow::{Held, HoldCause};
use crate::ids::{CommandKey, RunId, ToolName};

const NOW: i64 = 1_000_000;

fn now() -> Timestamp {
    Timestamp::from_millis(NOW)
}

/// A NON_IDEMPOTENT tool with a status check and a compensate.
fn rules() -> Rules {
    Rules {
        has_status_check: true,
        has_compensate: true,
        ..Rules::defaults(E::NonIdempotent)
    }
}

/// A representative command in each status, due: one attempt used, lease epoch 1; LEASED by a
/// dispatcher with its lease run out; CONFIRMED owing an extra commit's clean-up.
fn command_in(status: CommandStatus) -> Command {
    let mut state = CommandState::reserved(now(), None, 10_000);
    state.status = status;
    state.attempts = 1;
    state.lease.epoch = LeaseEpoch::new(1);
    state.due_at = Some(now().plus_millis(-1));
    if status == S::Leased {
        state.lease.owner = Some("dispatcher-1".into());
        state.lease.expires_at = Some(now());
    }
    if status == S::Confirmed {
        state.owed_duplicates = vec!["w-2".into()];
    }
    if status == S::Compensating {
        state.compensation = Some(Box::new(CompensationInfo::started(now())));
    }
    let mut command = Command::from_intent(
        Intent {
            run_id: RunId::parse("r-1").expect("valid"),
            command_key: CommandKey::new(1, ToolName::parse("bank/wire").expect("valid"), 0),
            semantics: E::NonIdempotent,
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
}

/// What `job` plans for `command`, named; every event planned must be one the core applies.
fn plan_of(job: Job, command: &Command) -> String {
    let rules = rules();
    let state = &command.state;
    let owner: std::sync::Arc<str> = std::sync::Arc::from("d-1");
    let applies = |event: &Event| {
        apply(state, &rules, event, now())
            .unwrap_or_else(|refusal| panic!("{job:?} planned {event:?} on {state:?}: {refusal}"))
    };
    // The event's kind, and the cause of the requests its step publishes (`:cause`).
    let name = |event: &Event| {
        let step = applies(event);
        let kind = format!("{:?}", event.kind()).to_lowercase();
        let requests = step.actions.iter().any(|action| {
            matches!(
                action,
                Action::Dispatch
                    | Action::Reconcile
                    | Action::Compensate
                    | Action::CompensateDuplicate
            )
        });
        if requests {
            format!("{kind}:{:?}", cause_of(job, event, &step.state)).to_lowercase()
        } else {
            kind
        }
    };
    match job {
        Job::Dispatch => {
            let dispatch = match plan_dispatch(
                command,
                &rules,
                Some(&PolicyDecision::Allow),
                None,
                &owner,
                now(),
            ) {
                DispatchPlan::Call => "call".to_owned(),
                DispatchPlan::Apply(event) => name(&event),
                DispatchPlan::Nothing => "nothing".to_owned(),
            };
            let call = match plan_call(state, &rules, now()) {
                CallPlan::Call => "call".to_owned(),
                CallPlan::Release(event) => name(&event),
                CallPlan::Leave => "leave".to_owned(),
            };
            format!("{dispatch}/{call}")
        }
        Job::Look => {
            let held = Held {
                until: now().plus_millis(10_000),
                cause: HoldCause::Paused,
                reason: "paused".into(),
            };
            let look = |gate| {
                let read = LookRead {
                    tool_present: true,
                    check_timeout_ms: Some(1_000),
                    gate,
                };
                match plan_look(command, &rules, read, now()) {
                    LookPlan::Leave => "leave".to_owned(),
                    LookPlan::Hold(event) | LookPlan::Claim(event) => name(&event),
                }
            };
            format!("{}/{}", look(None), look(Some(&held)))
        }
        Job::Sweep => match plan_sweep(state, republish_grace_ms(1_000), now()) {
            SweepPlan::Fire(event) | SweepPlan::Republish(event) => name(&event),
            SweepPlan::Look => "look".to_owned(),
            SweepPlan::Leave => "leave".to_owned(),
        },
        Job::Compensate => plan_compensate(state, &rules).map_or("leave".into(), |e| name(&e)),
        Job::SettleDuplicate => {
            plan_settle_duplicate(state, &rules).map_or("leave".into(), |e| name(&e))
        }
        // The operator's event is the plan: each action the core lets through, or "none".
        Job::Operate => {
            let taken: Vec<String> = operator_events()
                .iter()
                .filter(|event| apply(state, &rules, event, now()).is_ok())
                .map(name)
                .collect();
            if taken.is_empty() {
                "none".to_owned()
            } else {
                taken.join(",")
            }
        }
        // The source's event is the plan: what a commit seen, then one not seen, does.
        Job::Evidence => {
            let outcome = |outcome| {
                let event = evidence_event(outcome);
                match apply(state, &rules, &event, now()) {
                    Ok(_) => name(&event),
                    Err(_) => "kept".to_owned(),
                }
            };
            format!(
                "{}/{}",
                outcome(EvidenceOutcome::Present),
                outcome(EvidenceOutcome::Absent)
            )
        }
    }
}

/// Every action an operator takes on one command, as the producer writes it.
fn operator_events() -> [Event; 5] {
    let operator = || Operator {
        actor: "ops".into(),
        reason: "checked".into(),
    };
    [
        Event::Approve {
            operator: operator(),
            policy_version: "1".into(),
            revision: None,
        },
        Event::Reject {
            operator: operator(),
        },
        Event::Cancel {
            operator: operator(),
        },
        Event::Replay {
            operator: operator(),
            evidence: Some(json!({"checked": "by hand"})),
        },
        Event::Resolve {
            operator: operator(),
            resolution: Resolution::Failed,
            evidence: json!({"checked": "by hand"}),
        },
    ]
}

/// An evidence source's event saying what became of the effect.
fn evidence_event(outcome: EvidenceOutcome) -> Event {
    Event::Evidence {
        source: "bank".into(),
        event_id: "e-1".into(),
        outcome,
        external_ref: None,
        evidence: json!({"source": "bank", "event_id": "e-1"}),
    }
}

/// Status → what each job (in `Job::ALL` order: dispatch/call, look (no gate)/(gate held),
/// sweep, compensate, settle duplicate, the operator's actions that apply, evidence of a
/// commit/of none) plans.
const TABLE: &[(CommandStatus, [&str; Job::ALL.len()])] = &[
    (
        S::Scheduled,
        [
            "nothing/leave",
            "leave/leave",
            "due:due",
            "leave",
            "leave",
            "cancel",
            "kept/kept",
        ],
    ),
    (
        S::Pending,
        [
            "lease/leave",
            "leave/leave",
            "republish:stale",
            "leave",
            "leave",
            "cancel",
            "kept/kept",
        ],
    ),
    (
        S::Blocked,
        [
            "nothing/leave",
            "leave/leave",
            "approvalexpired",
            "leave",
            "leave",
            "approve:approved,reject,cancel",
            "kept/kept",
        ],
    ),
    (
        S::Approved,
        [
            "lease/leave",
            "leave/leave",
            "republish:stale",
            "leave",
            "leave",
            "cancel",
            "kept/kept",
        ],
    ),
    (
        S::Leased,
        [
            "nothing/release:retry",
            "leave/leave",
            "leaseexpired:retry",
            "leave",
            "leave",
            "none",
            "kept/kept",
        ],
    ),
    (
        S::Confirmed,
        [
            "nothing/leave",
            "leave/leave",
            "republish:retry",
            "leave",
            "claim",
            "none",
            "kept/evidence",
        ],
    ),
    (
        S::Failed,
        [
            "nothing/leave",
            "leave/leave",
            "leave",
            "leave",
            "leave",
            "replay:replayed",
            "kept/kept",
        ],
    ),
    (
        S::Unknown,
        [
            "nothing/leave",
            "claim/hold",
            "look",
            "leave",
            "leave",
            "none",
            "evidence/evidence",
        ],
    ),
    (
        S::Stuck,
        [
            "nothing/leave",
            "leave/leave",
            "leave",
            "leave",
            "leave",
            "replay:replayed,resolve",
            "kept/kept",
        ],
    ),
    (
        S::Cancelled,
        [
            "nothing/leave",
            "leave/leave",
            "leave",
            "leave",
            "leave",
            "none",
            "kept/kept",
        ],
    ),
    (
        S::Compensating,
        [
            "nothing/leave",
            "leave/leave",
            "republish:retry",
            "claim",
            "leave",
            "none",
            "kept/kept",
        ],
    ),
    (
        S::Compensated,
        [
            "nothing/leave",
            "leave/leave",
            "leave",
            "leave",
            "leave",
            "none",
            "kept/kept",
        ],
    ),
    (
        S::CompensationFailed,
        [
            "nothing/leave",
            "leave/leave",
            "leave",
            "leave",
            "leave",
            "none",
            "kept/kept",
        ],
    ),
    (
        S::NoCompensation,
        [
            "nothing/leave",
            "leave/leave",
            "leave",
            "leave",
            "leave",
            "none",
            "kept/kept",
        ],
    ),
];

#[test]
fn every_job_plans_for_every_status_what_the_table_says() {
    let listed: Vec<CommandStatus> = TABLE.iter().map(|(status, _)| *status).collect();
    assert_eq!(listed, CommandStatus::ALL, "one row per status, in order");
    let mut wrong = Vec::new();
    for (status, expected) in TABLE {
        let command = command_in(*status);
        for (job, expected) in Job::ALL.iter().zip(expected) {
            let planned = plan_of(*job, &command);
            if planned != *expected {
                wrong.push(format!(
                    "{status:?} {job:?}: planned {planned}, table {expected}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The producer's jobs name the causes its requests always had: an approval's dispatch is
/// approved, a replay's replayed, any other operator action's reserved, and an evidence
/// source's redispatch is a redispatch.
#[test]
fn the_producers_jobs_name_the_causes_of_their_requests() {
    let stored = command_in(S::Pending).state;
    let causes: Vec<Cause> = operator_events()
        .iter()
        .map(|event| cause_of(Job::Operate, event, &stored))
        .collect();
    assert_eq!(
        causes,
        [
            Cause::Approved,
            Cause::Reserved,
            Cause::Reserved,
            Cause::Replayed,
            Cause::Reserved
        ]
    );
    for outcome in [
        EvidenceOutcome::Present,
        EvidenceOutcome::Absent,
        EvidenceOutcome::Failed,
    ] {
        let event = evidence_event(outcome);
        assert_eq!(cause_of(Job::Evidence, &event, &stored), Cause::Redispatch);
    }
}

/// A clean-up's transient failure is stored (attempt, due time, the extra commits undone struck
/// off) until the tool's attempts are spent, then escalated as before.
#[test]
fn a_duplicate_clean_up_retries_from_the_ledger_then_escalates() {
    let rules = rules();
    let mut state = command_in(S::Confirmed).state;
    state.owed_duplicates = vec!["w-2".into(), "w-3".into()];
    let answers = |second: CompensationOutcome| {
        vec![
            (
                "w-2".to_owned(),
                CompensationOutcome::Done { reference: None },
            ),
            ("w-3".to_owned(), second),
        ]
    };
    let retry = || CompensationOutcome::Retry {
        reason: "503".into(),
        retry_after_ms: None,
    };
    let first = duplicates_settled(state.lease.epoch, answers(retry()));
    let step = apply(&state, &rules, &first, now()).expect("applies");
    assert_eq!(step.state.status, S::Confirmed);
    assert_eq!(step.state.owed_duplicates, vec!["w-3".to_owned()]);
    assert_eq!(step.state.duplicate_attempts, 1);
    assert_eq!(
        step.state.due_at,
        Some(now().plus_millis(rules.backoff_ms(0)))
    );
    assert!(step.actions.is_empty() && !step.state.escalated);
    assert_eq!(awaited(&step.state), Some(Action::CompensateDuplicate));

    let mut state = step.state;
    for attempt in 2..=rules.max_attempts {
        let event = duplicates_settled(state.lease.epoch, vec![("w-3".to_owned(), retry())]);
        let step = apply(&state, &rules, &event, now()).expect("applies");
        state = step.state;
        let last = attempt == rules.max_attempts;
        assert_eq!(state.escalated, last, "attempt {attempt}");
        assert_eq!(state.owed_duplicates.is_empty(), last, "attempt {attempt}");
    }
    assert_eq!(state.duplicate_attempts, 0);
    assert_eq!(awaited(&state), None);
}

/// The answers of a compensation job fold into one outcome: the own commit's, unless an extra
/// commit was not undone.
#[test]
fn a_compensation_job_folds_its_answers_into_one_outcome() {
    let done = CompensationOutcome::Done {
        reference: Some("rev".into()),
    };
    let impossible = CompensationOutcome::Impossible {
        reason: "gone".into(),
    };
    assert_eq!(
        fold_compensation(vec![
            (UndoTarget::ExtraCommit("w-2".into()), done.clone()),
            (UndoTarget::OwnCommit, done.clone()),
        ]),
        done
    );
    assert_eq!(
        fold_compensation(vec![
            (UndoTarget::ExtraCommit("w-2".into()), impossible),
            (UndoTarget::OwnCommit, done),
        ]),
        CompensationOutcome::Impossible {
            reason: "extra commit w-2: gone".into()
        }
    );
}
