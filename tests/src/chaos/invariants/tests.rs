//! The checks find what they are meant to find: each is shown a made-up run that breaks it,
//! and one that does not.

use std::collections::HashMap;

use serde_json::{Value, json};
use sluice_core::audit::{AuditDraft, AuditEntry, ChainHead, Checkpoint};
use sluice_core::command::{Command, CommandStatus, Intent};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;

use super::*;
use crate::chaos::upstream::record::{CallMeta, Reversal, ReverseRequest};
use crate::chaos::upstream::{DispatchFault, ReverseFault};

const RUN: &str = "r-1";
const T0: i64 = 1_700_000_000_000;

#[derive(Default)]
struct Fixture {
    accepted: Vec<Accepted>,
    commands: HashMap<(String, String), Command>,
    journals: HashMap<String, Vec<String>>,
    audits: HashMap<String, Vec<AuditEntry>>,
    head: Option<ChainHead>,
    verdicts: HashMap<String, Value>,
    record: Record,
    rollbacks: Vec<RollbackAsk>,
    next_commit: u64,
    tightened: Option<Tightened>,
    mcp: Option<Vec<McpCall>>,
    purged: Option<Vec<Purged>>,
}

impl Fixture {
    /// A command of `tool` at journal position `decision`, ending `status`.
    fn command(&mut self, decision: u32, tool: ToolKind, status: CommandStatus) -> String {
        let key = format!("d-{decision}/{}/0", tool.name());
        let intent = Intent {
            run_id: RunId::parse(RUN).expect("a run id"),
            command_key: CommandKey::parse(&key).expect("a command key"),
            semantics: tool.semantics(),
            args: json!({"ref": key, "amount_minor": 1}),
            business_key: None,
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        };
        let mut command = Command::from_intent(intent, Timestamp::from_millis(T0), 10_000);
        command.state.status = status;
        let idempotency_key = command.idempotency_key.to_string();
        self.accepted.push(Accepted {
            run_id: RUN.into(),
            command_key: key.clone(),
            idempotency_key: idempotency_key.clone(),
            tool,
            journal: (decision, 0),
            business_key: None,
        });
        self.journals
            .entry(RUN.into())
            .or_default()
            .push(key.clone());
        self.commands.insert((RUN.into(), key), command);
        self.verdicts.insert(RUN.into(), json!({"valid": true}));
        idempotency_key
    }

    fn state(&mut self, decision: u32, tool: ToolKind) -> &mut Command {
        let key = format!("d-{decision}/{}/0", tool.name());
        self.commands.get_mut(&(RUN.into(), key)).expect("declared")
    }

    /// An audit record of the command at `decision`, `at` ms after T0.
    fn audit(
        &mut self,
        (decision, tool): (u32, ToolKind),
        (from, to): (CommandStatus, CommandStatus),
        at: i64,
        reason: &str,
        evidence: Value,
    ) {
        let key = CommandKey::parse(&format!("d-{decision}/{}/0", tool.name())).expect("a key");
        let head = self.head.get_or_insert_with(ChainHead::genesis);
        let draft =
            AuditDraft::transition(&key, Some(from), to, "test", reason).with_evidence(evidence);
        let entry = head.append(
            &RunId::parse(RUN).expect("a run id"),
            draft,
            Timestamp::from_millis(T0 + at),
        );
        self.audits.entry(RUN.into()).or_default().push(entry);
    }

    /// A dispatch request of `key` for the effect `effect_ref`.
    fn request_of(&mut self, key: &str, effect_ref: &str) {
        let seq = self.request(key, 0, Some(1), DispatchFault::None);
        self.record.dispatches[seq as usize].meta.effect_ref = Some(effect_ref.into());
    }

    /// A dispatch request of `key` arriving `at` ms after T0, its work over at `finished`.
    fn request(&mut self, key: &str, at: i64, finished: Option<i64>, fault: DispatchFault) -> u64 {
        let seq = self.record.dispatches.len() as u64;
        self.record.dispatches.push(DispatchRequest {
            seq,
            endpoint: "e".into(),
            meta: CallMeta {
                idempotency_key: Some(key.into()),
                ..CallMeta::default()
            },
            arrived_at: T0 + at,
            fault,
            finished_at: finished.map(|f| T0 + f),
            in_progress: false,
        });
        seq
    }

    /// A commit of `key`; reversed at `reversed` (with the command's own compensation key).
    fn commit(&mut self, key: &str, at: i64, reversed: Option<i64>) -> String {
        self.next_commit += 1;
        let id = format!("c-{}", self.next_commit);
        self.record.commits.push(Commit {
            id: id.clone(),
            endpoint: "e".into(),
            meta: CallMeta {
                idempotency_key: Some(key.into()),
                ..CallMeta::default()
            },
            request: 0,
            how: DispatchFault::None,
            committed_at: T0 + at,
            visible_at: T0 + at,
            reversal: reversed.map(|r| Reversal {
                id: format!("rev-{id}"),
                at: T0 + r,
                key: Some(format!("{key}/compensate")),
                dispatch_key: Some(key.into()),
            }),
        });
        if let Some(r) = reversed {
            self.record.reversals.push(ReverseRequest {
                endpoint: "e".into(),
                target: id.clone(),
                meta: CallMeta {
                    idempotency_key: Some(format!("{key}/compensate")),
                    dispatch_key: Some(key.into()),
                    ..CallMeta::default()
                },
                at: T0 + r,
                fault: ReverseFault::None,
                outcome: ReverseOutcome::Reversed,
                foreign: false,
            });
        }
        id
    }

    fn violations(&self, invariant: &str) -> Vec<Violation> {
        let timing = Timing::default();
        let evidence = Evidence {
            seed: 1,
            accepted: &self.accepted,
            commands: &self.commands,
            journals: &self.journals,
            audits: &self.audits,
            verdicts: &self.verdicts,
            record: &self.record,
            rollbacks: &self.rollbacks,
            crashes: &[],
            timing: &timing,
            late_commit_horizon_ms: 700,
            clock_skew_ms: 0,
        };
        let scenario = Scenario {
            tightened: self.tightened,
            mcp: self.mcp.as_deref(),
            purged: self.purged.as_deref(),
        };
        let checks = check_with(&evidence, &scenario);
        let found = checks
            .into_iter()
            .find(|c| c.invariant == invariant)
            .unwrap_or_else(|| panic!("{invariant} is checked"));
        assert!(found.checked > 0, "{invariant} checked nothing");
        found.violations
    }
}

#[test]
fn a_confirmed_wire_with_two_live_commits_is_a_duplicate_unless_escalated() {
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Wire, CommandStatus::Confirmed);
    let first = f.commit(&key, 10, None);
    f.state(1, ToolKind::Wire).state.external_ref = Some(first);
    assert!(f.violations(NO_DUPLICATE).is_empty());
    f.commit(&key, 900, None);
    let found = f.violations(NO_DUPLICATE);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("2 live commit"), "{}", found[0].what);
    assert_eq!(found[0].idempotency_key, key);
    f.state(1, ToolKind::Wire).state.escalated = true;
    assert!(f.violations(NO_DUPLICATE).is_empty());
}

#[test]
fn a_failed_or_compensated_command_with_a_live_commit_is_a_violation() {
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Transfer, CommandStatus::Failed);
    f.commit(&key, 10, None);
    assert_eq!(f.violations(NO_DUPLICATE).len(), 1);
    let mut g = Fixture::default();
    let key = g.command(1, ToolKind::Transfer, CommandStatus::Compensated);
    g.commit(&key, 10, Some(50));
    assert!(g.violations(NO_DUPLICATE).is_empty());
}

#[test]
fn exactly_once_holds_only_when_the_outcome_matches_the_single_commit() {
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Ticket, CommandStatus::Failed);
    assert!(f.violations(EXACTLY_ONCE).is_empty());
    // A late commit after Sluice gave up on it.
    f.commit(&key, 2_000, None);
    assert_eq!(f.violations(EXACTLY_ONCE).len(), 1);
    let mut g = Fixture::default();
    g.command(1, ToolKind::Email, CommandStatus::Confirmed);
    assert_eq!(
        g.violations(EXACTLY_ONCE).len(),
        1,
        "confirmed without a commit"
    );
}

#[test]
fn a_redispatch_before_the_attempt_could_no_longer_land_is_a_blind_retry() {
    use CommandStatus as S;
    let absent = json!({"http_status": 404});
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Wire, S::Confirmed);
    f.audit(
        (1, ToolKind::Wire),
        (S::Pending, S::Leased),
        0,
        "leased",
        Value::Null,
    );
    f.request(&key, 5, Some(405), DispatchFault::TimeoutNoCommit);
    f.audit(
        (1, ToolKind::Wire),
        (S::Leased, S::Unknown),
        400,
        "timed out",
        Value::Null,
    );
    // Timeout 400 + horizon 700: an absent before 1,100 ms after the lease proves nothing.
    f.audit(
        (1, ToolKind::Wire),
        (S::Unknown, S::Pending),
        750,
        "absent twice",
        absent.clone(),
    );
    let found = f.violations(NO_BLIND_RETRY);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].what.contains("750 ms after the attempt's lease"),
        "{}",
        found[0].what
    );

    let mut g = Fixture::default();
    let key = g.command(1, ToolKind::Wire, S::Confirmed);
    g.audit(
        (1, ToolKind::Wire),
        (S::Pending, S::Leased),
        0,
        "leased",
        Value::Null,
    );
    g.request(&key, 5, Some(405), DispatchFault::TimeoutNoCommit);
    g.audit(
        (1, ToolKind::Wire),
        (S::Leased, S::Unknown),
        400,
        "timed out",
        Value::Null,
    );
    g.audit(
        (1, ToolKind::Wire),
        (S::Unknown, S::Pending),
        1_200,
        "absent twice",
        absent.clone(),
    );
    g.audit(
        (1, ToolKind::Wire),
        (S::Pending, S::Leased),
        1_210,
        "leased",
        Value::Null,
    );
    assert!(g.violations(NO_BLIND_RETRY).is_empty());
    // The same, but an earlier attempt's request reaches the upstream after the decision.
    g.request(&key, 1_205, None, DispatchFault::LateCommit);
    let found = g.violations(NO_BLIND_RETRY);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].what.contains("still being processed"),
        "{}",
        found[0].what
    );

    let mut h = Fixture::default();
    h.command(1, ToolKind::Wire, S::Confirmed);
    h.audit(
        (1, ToolKind::Wire),
        (S::Pending, S::Leased),
        0,
        "leased",
        Value::Null,
    );
    h.audit(
        (1, ToolKind::Wire),
        (S::Unknown, S::Pending),
        5_000,
        "why not",
        json!({"http_status": 503}),
    );
    assert_eq!(
        h.violations(NO_BLIND_RETRY).len(),
        1,
        "no absent observation"
    );
}

#[test]
fn compensations_out_of_reverse_journal_order_break_lifo() {
    use CommandStatus as S;
    let mut f = Fixture::default();
    let first = f.command(1, ToolKind::Wire, S::Compensated);
    let second = f.command(2, ToolKind::Transfer, S::Compensated);
    let reason = "chaos rollback #1";
    f.rollbacks.push(RollbackAsk {
        run_id: RUN.into(),
        reason: reason.into(),
        status: Some(202),
    });
    let recorded = format!("run rolled back: {reason}");
    f.audit(
        (1, ToolKind::Wire),
        (S::Confirmed, S::Compensating),
        100,
        &recorded,
        Value::Null,
    );
    f.audit(
        (2, ToolKind::Transfer),
        (S::Confirmed, S::Compensating),
        100,
        &recorded,
        Value::Null,
    );
    // The later effect is undone first: as it should be.
    f.commit(&second, 10, Some(200));
    f.commit(&first, 5, Some(300));
    assert!(f.violations(COMPENSATION_LIFO).is_empty());
    let mut g = Fixture::default();
    let first = g.command(1, ToolKind::Wire, S::Compensated);
    let second = g.command(2, ToolKind::Transfer, S::Compensated);
    g.rollbacks = f.rollbacks.clone();
    g.audit(
        (1, ToolKind::Wire),
        (S::Confirmed, S::Compensating),
        100,
        &recorded,
        Value::Null,
    );
    g.audit(
        (2, ToolKind::Transfer),
        (S::Confirmed, S::Compensating),
        100,
        &recorded,
        Value::Null,
    );
    g.commit(&second, 10, Some(400));
    g.commit(&first, 5, Some(300));
    assert_eq!(g.violations(COMPENSATION_LIFO).len(), 1);
}

#[test]
fn reversing_what_never_committed_or_twice_is_an_orphan() {
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Wire, CommandStatus::Compensated);
    let id = f.commit(&key, 10, Some(100));
    assert!(f.violations(NO_ORPHAN_COMPENSATION).is_empty());
    for (target, outcome) in [
        ("c-404", ReverseOutcome::UnknownCommit),
        (id.as_str(), ReverseOutcome::AlreadyReversed),
    ] {
        f.record.reversals.push(ReverseRequest {
            endpoint: "e".into(),
            target: target.into(),
            meta: CallMeta {
                idempotency_key: Some(format!("{key}/compensate/{target}")),
                dispatch_key: Some(key.clone()),
                ..CallMeta::default()
            },
            at: T0 + 500,
            fault: ReverseFault::None,
            outcome,
            foreign: false,
        });
    }
    let found = f.violations(NO_ORPHAN_COMPENSATION);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(found[0].run_id, RUN);
}

#[test]
fn the_external_ref_must_name_the_live_commit() {
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Transfer, CommandStatus::Confirmed);
    let reversed = f.commit(&key, 10, Some(50));
    let live = f.commit(&key, 20, None);
    f.state(1, ToolKind::Transfer).state.external_ref = Some(reversed);
    assert_eq!(f.violations(EXTERNAL_REF).len(), 1);
    f.state(1, ToolKind::Transfer).state.external_ref = Some(live);
    assert!(f.violations(EXTERNAL_REF).is_empty());
}

#[test]
fn a_rolled_back_run_may_not_leave_a_silent_commit() {
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Wire, CommandStatus::Confirmed);
    f.commit(&key, 10, None);
    f.rollbacks.push(RollbackAsk {
        run_id: RUN.into(),
        reason: "r".into(),
        status: Some(202),
    });
    assert_eq!(f.violations(ROLLBACK_COMPLETE).len(), 1);
    f.state(1, ToolKind::Wire).state.escalated = true;
    assert!(f.violations(ROLLBACK_COMPLETE).is_empty());
    // A rollback whose answer was lost and whose retry was told "already rolled back" (200)
    // rolled the run back all the same.
    let mut g = Fixture::default();
    let key = g.command(1, ToolKind::Wire, CommandStatus::Confirmed);
    g.commit(&key, 10, None);
    for status in [None, Some(200)] {
        g.rollbacks.push(RollbackAsk {
            run_id: RUN.into(),
            reason: "r".into(),
            status,
        });
    }
    assert_eq!(g.violations(ROLLBACK_COMPLETE).len(), 1);
}

#[test]
fn unsettled_commands_and_broken_chains_are_reported() {
    let mut f = Fixture::default();
    f.command(1, ToolKind::Wire, CommandStatus::Unknown);
    assert_eq!(f.violations(NOTHING_LOST).len(), 1);
    f.verdicts.insert(
        RUN.into(),
        json!({"valid": false, "message": "hash mismatch at 3"}),
    );
    assert_eq!(f.violations(AUDIT_VERIFIES).len(), 1);
}

#[test]
fn a_command_behind_slow_lookups_must_still_come_to_rest() {
    use crate::chaos::upstream::record::SlowLookup;
    let mut f = Fixture::default();
    f.command(1, ToolKind::Wire, CommandStatus::Unknown);
    f.accepted[0].business_key = Some("r-1-0:500".into());
    let key = f.command(2, ToolKind::Transfer, CommandStatus::Stuck);
    for (endpoint, looked_up) in [("wires", "r-1-0:500"), ("transfers", key.as_str())] {
        f.record.slow_lookups.push(SlowLookup {
            endpoint: endpoint.into(),
            key: looked_up.into(),
            at: T0,
        });
    }
    let found = f.violations(SLOW_LOOKUPS_END);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("still UNKNOWN"), "{}", found[0].what);
    assert!(found[0].command_key.contains("bank/wire"));
    f.state(1, ToolKind::Wire).state.status = CommandStatus::Stuck;
    assert!(f.violations(SLOW_LOOKUPS_END).is_empty());
    // A confirmed command still owing its last look has not come to rest either.
    f.state(1, ToolKind::Wire).state.status = CommandStatus::Confirmed;
    f.state(1, ToolKind::Wire).state.verify_pending = true;
    assert_eq!(f.violations(SLOW_LOOKUPS_END).len(), 1);
}

#[test]
fn one_effect_under_two_keys_is_made_twice() {
    let mut f = Fixture::default();
    let first = f.command(1, ToolKind::Ticket, CommandStatus::Confirmed);
    let second = f.command(2, ToolKind::Ticket, CommandStatus::Confirmed);
    f.request_of(&first, "e-1");
    f.request_of(&first, "e-1");
    f.request_of(&second, "e-2");
    assert!(f.violations(ONE_KEY_PER_EFFECT).is_empty());
    f.request_of(&second, "e-1");
    let found = f.violations(ONE_KEY_PER_EFFECT);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].what.contains("2 idempotency keys"),
        "{}",
        found[0].what
    );
}

#[test]
fn a_command_in_flight_when_policy_tightened_must_end_truthfully() {
    use CommandStatus as S;
    let mut f = Fixture::default();
    let key = f.command(1, ToolKind::Ticket, S::Failed);
    f.audit(
        (1, ToolKind::Ticket),
        (S::Pending, S::Leased),
        0,
        "leased at its reservation",
        Value::Null,
    );
    f.tightened = Some(Tightened {
        at_ms: T0 + 100,
        generation: 7,
    });
    assert!(f.violations(TIGHTENED_TRUTHFULLY).is_empty());
    // Called under the old policy, committed, and then told FAILED by the new one.
    f.commit(&key, 50, None);
    let found = f.violations(TIGHTENED_TRUTHFULLY);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("generation 7"), "{}", found[0].what);
    f.state(1, ToolKind::Ticket).state.status = S::Confirmed;
    assert!(f.violations(TIGHTENED_TRUTHFULLY).is_empty());
    f.state(1, ToolKind::Ticket).state.status = S::Blocked;
    assert_eq!(f.violations(TIGHTENED_TRUTHFULLY).len(), 1, "never settled");
}

#[test]
fn an_mcp_call_that_takes_another_position_is_reported() {
    let mut f = Fixture::default();
    f.command(1, ToolKind::Ticket, CommandStatus::Confirmed);
    let answer =
        |key: &str| json!({"status": "CONFIRMED", "command_key": key, "external_ref": "t-1"});
    let planned = format!("d-1/{}/0", ToolKind::Ticket.name());
    let call = McpCall {
        run_id: RUN.into(),
        tool: ToolKind::Ticket,
        planned_key: planned.clone(),
        journal: (1, 0),
        business_key: None,
        first: Some(answer(&planned)),
        first_key: Some(planned.clone()),
        redrive: Some(answer(&planned)),
        redrive_key: Some(planned.clone()),
        timed_out: true,
        unanswered: 0,
    };
    f.mcp = Some(vec![call.clone()]);
    assert!(f.violations(MCP_SAME_KEYS).is_empty());
    let other = format!("d-1/{}/1", ToolKind::Ticket.name());
    let mut moved = call;
    moved.redrive_key = Some(other.clone());
    moved.redrive = Some(answer(&other));
    f.mcp = Some(vec![moved]);
    f.journals.get_mut(RUN).expect("a journal").push(other);
    let found = f.violations(MCP_SAME_KEYS);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].what.contains("re-driven in a new session"),
        "{}",
        found[0].what
    );
    assert!(
        found[1].what.contains("no call of its conversation"),
        "{}",
        found[1].what
    );
}

#[test]
fn a_purge_may_take_only_a_run_that_owes_nothing_and_as_it_was_read() {
    use crate::chaos::purge::Snapshot;
    use CommandStatus as S;
    let mut f = Fixture::default();
    f.command(1, ToolKind::Wire, S::Confirmed);
    f.audit(
        (1, ToolKind::Wire),
        (S::Leased, S::Confirmed),
        10,
        "done",
        Value::Null,
    );
    // At rest: nothing due.
    f.state(1, ToolKind::Wire).state.due_at = None;
    let audit = f.audits[RUN].clone();
    let last = audit.last().expect("a record");
    let purged = |f: &Fixture, hash: &str, count: u64| Purged {
        run_id: RUN.into(),
        snapshot: Some(Snapshot {
            commands: f.commands.values().cloned().collect(),
            audit: audit.clone(),
            verdict: json!({"valid": true}),
        }),
        checkpoint: Some(Checkpoint {
            run_id: RunId::parse(RUN).expect("a run id"),
            last_hash: hash.into(),
            count,
            purged_at: Timestamp::from_millis(T0 + 100),
        }),
        cutoff_ms: T0 + 50,
    };
    f.purged = Some(vec![purged(&f, &last.hash, 1)]);
    let found = f.violations(PURGED_AT_REST);
    assert!(found.is_empty(), "{found:?}");
    // The chain went on after the runner read it.
    f.purged = Some(vec![purged(&f, "another", 2)]);
    let found = f.violations(PURGED_AT_REST);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].what.contains("changed after the cutoff"),
        "{}",
        found[0].what
    );
    // Purged while its last look was still owed.
    f.state(1, ToolKind::Wire).state.verify_pending = true;
    f.purged = Some(vec![purged(&f, &last.hash, 1)]);
    let found = f.violations(PURGED_AT_REST);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].what.contains("owing last_look"),
        "{}",
        found[0].what
    );
    // A run the runner never read as purgeable.
    let mut unread = purged(&f, &last.hash, 1);
    unread.snapshot = None;
    f.purged = Some(vec![unread]);
    assert_eq!(f.violations(PURGED_AT_REST).len(), 1);
}
