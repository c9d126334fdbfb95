//! Every message the services put on the bus matches its JSON Schema in `schemas/messages/`,
//! and the schemas refuse what the services refuse.

use serde_json::{Value, json};
use sluice_core::command::{Command, EffectSemantics, Intent};
use sluice_core::ids::{CommandKey, RunId, ToolName};
use sluice_core::time::Timestamp;
use sluice_runtime::messages::{
    Cause, CompensateJob, CompensateRequest, DispatchRequest, LifecycleEvent, ReconcileRequest,
    encode,
};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas/messages/");

fn load(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{DIR}{name}")).expect("schema file");
    serde_json::from_str(&text).expect("schema is JSON")
}

fn validator(name: &str) -> jsonschema::Validator {
    let registry = jsonschema::Registry::new()
        .add(
            "https://sluice.dev/schemas/messages/common.json",
            jsonschema::Resource::from_contents(load("common.json")),
        )
        .expect("valid uri")
        .prepare()
        .expect("registry");
    jsonschema::options()
        .with_registry(&registry)
        .should_validate_formats(true)
        .build(&load(name))
        .expect("schema compiles")
}

fn assert_valid(validator: &jsonschema::Validator, bytes: &[u8]) {
    let value: Value = serde_json::from_slice(bytes).expect("message is JSON");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{value} does not match: {errors:?}");
}

fn ids() -> (RunId, CommandKey) {
    (
        RunId::parse("r-abc").expect("valid"),
        CommandKey::parse("d-3/payments/wire/0").expect("valid"),
    )
}

/// A `payments/wire` command `d-<decision>/payments/wire/0` of run `r-abc`, just reserved.
fn wire_command(decision: u32, args: Value, business_key: Option<&str>) -> Command {
    Command::from_intent(
        Intent {
            run_id: RunId::parse("r-abc").expect("valid"),
            command_key: CommandKey::parse(&format!("d-{decision}/payments/wire/0"))
                .expect("valid"),
            semantics: EffectSemantics::NonIdempotent,
            args,
            business_key: business_key.map(sluice_core::ids::BusinessKey::new),
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        Timestamp::from_millis(1_763_800_000_000),
        10_000,
    )
}

#[test]
fn requests_match_their_schemas() {
    let (run_id, command_key) = ids();
    let dispatch = validator("dispatch_request.json");
    for cause in [Cause::Reserved, Cause::Due, Cause::Stale, Cause::Replayed] {
        assert_valid(
            &dispatch,
            &encode(&DispatchRequest {
                run_id: run_id.clone(),
                command_key: command_key.clone(),
                cause,
            }),
        );
    }
    assert_valid(
        &validator("reconcile_request.json"),
        &encode(&ReconcileRequest {
            run_id: run_id.clone(),
            command_key: command_key.clone(),
        }),
    );
    let compensate = validator("compensate_request.json");
    for job in [
        CompensateJob::Rollback {
            actor: "alice".into(),
            reason: "abort".into(),
        },
        CompensateJob::Command {
            command_key: command_key.clone(),
        },
        CompensateJob::Duplicate {
            command_key: command_key.clone(),
            extra_refs: vec!["w-2".into()],
        },
    ] {
        assert_valid(
            &compensate,
            &encode(&CompensateRequest {
                run_id: run_id.clone(),
                job,
            }),
        );
    }
}

/// The schemas are what this build writes (format 1), exactly; the services read more
/// tolerantly (`sluice_runtime::messages`): a malformed request is refused by both, while a
/// cause or a field a newer build added is refused by the schema but read by the service.
#[test]
fn schemas_refuse_what_this_build_never_writes_and_services_tolerate_what_a_newer_one_adds() {
    let dispatch = validator("dispatch_request.json");
    for bad in [
        json!({"run_id": "r-1", "command_key": "wire", "cause": "due"}),
        json!({"run_id": "r/1", "command_key": "d-1/payments/wire/0", "cause": "due"}),
    ] {
        assert!(!dispatch.is_valid(&bad), "{bad} should be refused");
        assert!(
            serde_json::from_value::<DispatchRequest>(bad.clone()).is_err(),
            "the service refuses {bad} too"
        );
    }
    for newer in [
        json!({"run_id": "r-1", "command_key": "d-1/payments/wire/0", "cause": "whim"}),
        json!({"run_id": "r-1", "command_key": "d-1/payments/wire/0", "cause": "due", "x": 1}),
    ] {
        assert!(
            !dispatch.is_valid(&newer),
            "{newer} is not what this build writes"
        );
        assert!(
            serde_json::from_value::<DispatchRequest>(newer.clone()).is_ok(),
            "the service reads {newer}"
        );
    }
}

#[test]
fn lifecycle_event_payload_matches_its_schema() {
    let command = wire_command(
        3,
        json!({"account": "acc-1", "amount_minor": 5}),
        Some("acc-1:5:2026-11-22"),
    );
    assert_eq!(
        command.tool,
        ToolName::parse("payments/wire").expect("valid")
    );
    let event = LifecycleEvent::new("dispatcher", &command, Timestamp::from_millis(1));
    assert_valid(&validator("lifecycle_event.json"), &event.payload);
    assert_eq!(event.header("ce_type"), Some("dev.sluice.effect.pending"));
    assert_eq!(
        event.header("ce_subject"),
        Some("r-abc/d-3/payments/wire/0")
    );
    assert_eq!(event.header("ce_specversion"), Some("1.0"));
    assert_eq!(event.header("ce_source"), Some("/sluice/dispatcher"));
    assert_eq!(event.header("ce_time"), Some("1970-01-01T00:00:00.001Z"));
    assert_eq!(event.header("content-type"), Some("application/json"));
    let id = event.header("ce_id").expect("an id");
    let parsed = uuid::Uuid::parse_str(id).expect("a UUID");
    assert_eq!(
        parsed.hyphenated().to_string(),
        id,
        "hyphenated, lower case"
    );
    assert_eq!(
        parsed.get_version_num(),
        8,
        "derived from the transition (RFC 9562 version 8), so the same event has one id"
    );
    assert_eq!(parsed.get_variant(), uuid::Variant::RFC4122);
}

/// Every lifecycle event the pipeline publishes — including those of operator actions, whose
/// commands carry an approval, a compensation or a submitter — matches the schema, with the
/// CloudEvents type of its status.
#[test]
fn every_published_lifecycle_event_matches_its_schema() {
    use sluice_core::machine::{
        self, Action, CompensationOutcome, DispatchOutcome, Event, Operator, Resolution, Rules,
    };

    let mut command = wire_command(3, json!({"account": "acc-1", "amount_minor": 5}), None)
        .submitted_by("agent-7");
    let rules = Rules {
        has_status_check: true,
        has_compensate: true,
        ..Rules::defaults(EffectSemantics::NonIdempotent)
    };
    let operator = Operator {
        actor: "admin-1".into(),
        reason: "checked".into(),
    };
    let schema = validator("lifecycle_event.json");
    let mut seen = Vec::new();
    let mut at = 1_763_800_000_000;
    let mut apply = |command: &mut Command, event: Event| {
        at += 60_000; // past any lease
        let step = machine::apply(&command.state, &rules, &event, Timestamp::from_millis(at))
            .unwrap_or_else(|refusal| panic!("{event:?}: {refusal}"));
        command.state = step.state.clone();
        if step
            .actions
            .iter()
            .any(|a| matches!(a, Action::Publish { .. }))
        {
            let event = LifecycleEvent::new("producer", command, Timestamp::from_millis(at));
            assert_valid(&schema, &event.payload);
            let expected = format!(
                "dev.sluice.effect.{}",
                command.status().as_str().to_ascii_lowercase()
            );
            assert_eq!(event.header("ce_type"), Some(expected.as_str()));
            seen.push(command.status());
        }
    };
    let blocked = |command: &mut Command, apply: &mut dyn FnMut(&mut Command, Event)| {
        apply(
            command,
            Event::Block {
                reason: "above the threshold".into(),
                epoch: None,
            },
        );
    };
    let mut wire = command.clone();
    blocked(&mut wire, &mut apply);
    apply(
        &mut wire,
        Event::Approve {
            operator: operator.clone(),
            policy_version: "1".into(),
        },
    );
    apply(
        &mut wire,
        Event::Lease {
            owner: "d-1".into(),
        },
    );
    let epoch = wire.state.lease.epoch;
    apply(
        &mut wire,
        Event::Dispatched {
            epoch,
            sent_at: Timestamp::from_millis(1_763_800_000_000),
            outcome: DispatchOutcome::Committed {
                external_ref: Some("w-1".into()),
                result: Some(std::sync::Arc::new(json!({"id": "w-1"}))),
            },
        },
    );
    apply(
        &mut wire,
        Event::Rollback {
            operator: operator.clone(),
        },
    );
    let epoch = wire.state.lease.epoch;
    apply(
        &mut wire,
        Event::Compensated {
            epoch,
            outcome: CompensationOutcome::Done {
                reference: Some("rev-1".into()),
            },
        },
    );
    blocked(&mut command, &mut apply);
    apply(
        &mut command,
        Event::Reject {
            operator: operator.clone(),
        },
    );
    let mut stuck = wire_command(4, json!({}), None);
    apply(
        &mut stuck,
        Event::Lease {
            owner: "d-1".into(),
        },
    );
    apply(&mut stuck, Event::LeaseExpired);
    apply(
        &mut stuck,
        Event::GiveUp {
            reason: "no evidence".into(),
        },
    );
    apply(
        &mut stuck,
        Event::Resolve {
            operator,
            resolution: Resolution::Confirmed {
                external_ref: "w-9".into(),
            },
            evidence: json!({"statement": "line 4"}),
        },
    );
    use sluice_core::command::CommandStatus as S;
    assert_eq!(
        seen,
        [
            S::Blocked,
            S::Confirmed,
            S::Compensated,
            S::Blocked,
            S::Cancelled,
            S::Stuck,
            S::Confirmed
        ]
    );
}
