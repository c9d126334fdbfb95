//! Revisions: what an edit records, what it hides, and what policy lets it do.

use serde_json::json;

use super::*;
use crate::catalog::Catalog;
use crate::command::{Approval, EffectSemantics, Intent};
use crate::ids::{CommandKey, RunId};
use crate::machine::{self, Event, Operator, Refusal};

const PAY: &str = r#"
    policy_version = "3"
    [[tool]]
    name = "payments/wire"
    semantics = "NON_IDEMPOTENT"
    schema = { type = "object", required = ["beneficiary", "amount_minor"], additionalProperties = false, properties = { beneficiary = { type = "object", properties = { iban = { type = "string" }, name = { type = "string" } } }, amount_minor = { type = "integer", minimum = 1 }, pin = { type = "string", writeOnly = true } } }
    [tool.policy]
    approve_above = { field = "amount_minor", value = 1000 }
    [[tool.rule]]
    name = "sanctioned"
    when = "args.beneficiary.iban.startsWith('XX')"
    then = "deny"
    reason = "sanctioned country"
    [tool.dispatch]
    url = "http://bank/wires"
    [tool.status_check]
    url = "http://bank/wires/{idempotency_key}"
"#;

fn tool() -> Tool {
    Catalog::from_toml_str(PAY, "pay.toml")
        .expect("the catalog is valid")
        .tools()[0]
        .clone()
}

fn blocked(args: Value) -> Command {
    let mut command = Command::from_intent(
        Intent {
            run_id: RunId::parse("r-1").expect("run"),
            command_key: CommandKey::parse("d-1/payments/wire/0").expect("key"),
            semantics: EffectSemantics::NonIdempotent,
            args,
            business_key: None,
            policy_version: "3".into(),
            max_attempts: 3,
            not_before: None,
        },
        Timestamp::from_millis(1_000),
        60_000,
    );
    command.state.status = crate::command::CommandStatus::Blocked;
    command
}

fn approval() -> Approval {
    Approval {
        approver: "ops-ana".into(),
        reason: "fixed the amount".into(),
        at: Timestamp::from_millis(2_000),
        policy_version: "3".into(),
    }
}

fn submitted() -> Value {
    json!({"beneficiary": {"iban": "DE89", "name": "ACME"}, "amount_minor": 5000, "pin": "1234"})
}

#[test]
fn a_revision_lists_each_changed_pointer_with_old_and_new_values_but_hides_secrets() {
    let command = blocked(submitted());
    let edited = json!({"beneficiary": {"iban": "DE44", "name": "ACME"}, "amount_minor": 500, "pin": "9999"});
    let revision = revise(
        &command,
        &tool(),
        edited.clone(),
        "ops-ana",
        "typo",
        Timestamp::from_millis(2_000),
    )
    .expect("a change");
    assert_eq!(revision.number, 1);
    assert_eq!(revision.previous_hash, command.args_hash);
    assert_eq!(revision.args_hash, crate::canonical::args_hash(&edited));
    let shown: Vec<(&str, Option<&Value>, Option<&Value>, bool)> = revision
        .changes
        .iter()
        .map(|c| (c.pointer.as_str(), c.old.as_ref(), c.new.as_ref(), c.secret))
        .collect();
    assert_eq!(
        shown,
        [
            (
                "/amount_minor",
                Some(&json!(5000)),
                Some(&json!(500)),
                false
            ),
            (
                "/beneficiary/iban",
                Some(&json!("DE89")),
                Some(&json!("DE44")),
                false
            ),
            ("/pin", None, None, true),
        ]
    );
    let text = serde_json::to_string(&revision.summary()).expect("json");
    assert!(!text.contains("1234") && !text.contains("9999"), "{text}");
}

#[test]
fn an_edit_to_the_current_arguments_is_refused_and_revisions_are_bounded() {
    let mut command = blocked(submitted());
    let same = revise(
        &command,
        &tool(),
        submitted(),
        "a",
        "r",
        Timestamp::from_millis(2),
    );
    assert_eq!(same, Err(EditRefusal::Unchanged));
    for n in 0..MAX_REVISIONS {
        let mut args = submitted();
        args["amount_minor"] = json!(100 + n);
        let revision =
            revise(&command, &tool(), args, "a", "r", Timestamp::from_millis(2)).expect("room");
        assert_eq!(revision.number as usize, n + 1);
        command.state.revisions.push(revision);
    }
    let mut args = submitted();
    args["amount_minor"] = json!(1);
    assert_eq!(
        revise(&command, &tool(), args, "a", "r", Timestamp::from_millis(2)),
        Err(EditRefusal::TooMany(MAX_REVISIONS))
    );
    // The last revision's arguments are the current ones; every hash is answered to.
    assert_eq!(
        command.current_args()["amount_minor"],
        json!(100 + MAX_REVISIONS - 1)
    );
    assert!(command.answers_to(command.args_hash.as_str()));
    assert!(command.answers_to(command.state.revisions[3].args_hash.as_str()));
    assert!(!command.answers_to(crate::canonical::args_hash(&json!({})).as_str()));
}

#[test]
fn policy_is_checked_again_on_the_edit_a_deny_refuses_and_approval_covers_the_rest() {
    let command = blocked(submitted());
    let now = Timestamp::from_millis(2_000);
    // Over approve_above: covered by the approval being given.
    let mut larger = submitted();
    larger["amount_minor"] = json!(900_000);
    let revision = revise(&command, &tool(), larger, "a", "r", now).expect("edit");
    assert_eq!(
        check(&command, &tool(), &revision, &approval(), "3", now),
        Ok(PolicyDecision::Allow)
    );
    // A rule that denies the edited arguments refuses the edit, whatever the approval.
    let mut sanctioned = submitted();
    sanctioned["beneficiary"]["iban"] = json!("XX11");
    let revision = revise(&command, &tool(), sanctioned, "a", "r", now).expect("edit");
    let refused = check(&command, &tool(), &revision, &approval(), "3", now).expect_err("denied");
    assert_eq!(refused.code(), "policy_denied");
    assert!(
        refused.to_string().contains("sanctioned country"),
        "{refused}"
    );
}

#[test]
fn the_machine_records_the_revision_with_the_approval_and_refuses_a_stale_one() {
    let command = blocked(submitted());
    let rules = tool().rules();
    let now = Timestamp::from_millis(2_000);
    let mut edited = submitted();
    edited["amount_minor"] = json!(700);
    let revision = revise(
        &command,
        &tool(),
        edited.clone(),
        "ops-ana",
        "wrong amount",
        now,
    )
    .expect("edit");
    let approve = |revision: Option<Revision>| Event::Approve {
        operator: Operator {
            actor: "ops-ana".into(),
            reason: "wrong amount".into(),
        },
        policy_version: "3".into(),
        revision: revision.map(Box::new),
    };
    let step = machine::apply(
        &command.state,
        &rules,
        &approve(Some(revision.clone())),
        now,
    )
    .expect("approved");
    assert_eq!(step.state.status, crate::command::CommandStatus::Approved);
    assert_eq!(step.state.revisions, vec![revision.clone()]);
    assert!(
        step.reason.contains("revision 1: /amount_minor"),
        "{}",
        step.reason
    );
    assert_eq!(step.evidence["args_hash"], json!(revision.args_hash));
    let mut after = command.clone();
    after.state = step.state;
    assert_eq!(**after.current_args(), edited);
    assert_eq!(after.current_args_hash(), &revision.args_hash);
    assert_eq!(after.args_hash, command.args_hash, "the identity stays");
    // A revision numbered against an older state is refused.
    let mut again = after.clone();
    again.state.status = crate::command::CommandStatus::Blocked;
    let refusal =
        machine::apply(&again.state, &rules, &approve(Some(revision)), now).expect_err("stale");
    assert_eq!(
        refusal,
        Refusal::StaleRevision {
            current: 1,
            given: 1
        }
    );
    // The stored state round-trips, revisions and all.
    let text = serde_json::to_string(&after.state).expect("json");
    let back: crate::command::CommandState = serde_json::from_str(&text).expect("reads");
    assert_eq!(back, after.state);
}
