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

#[test]
fn schemas_refuse_what_the_services_refuse() {
    let dispatch = validator("dispatch_request.json");
    for bad in [
        json!({"run_id": "r-1", "command_key": "wire", "cause": "due"}),
        json!({"run_id": "r/1", "command_key": "d-1/payments/wire/0", "cause": "due"}),
        json!({"run_id": "r-1", "command_key": "d-1/payments/wire/0", "cause": "whim"}),
        json!({"run_id": "r-1", "command_key": "d-1/payments/wire/0", "cause": "due", "x": 1}),
    ] {
        assert!(!dispatch.is_valid(&bad), "{bad} should be refused");
        assert!(
            serde_json::from_value::<DispatchRequest>(bad.clone()).is_err(),
            "the service refuses {bad} too"
        );
    }
}

#[test]
fn lifecycle_event_payload_matches_its_schema() {
    let (run_id, command_key) = ids();
    let command = Command::from_intent(
        Intent {
            run_id,
            command_key,
            semantics: EffectSemantics::NonIdempotent,
            args: json!({"account": "acc-1", "amount_minor": 5}),
            business_key: Some(sluice_core::ids::BusinessKey::new("acc-1:5:2026-11-22")),
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        Timestamp::from_millis(1_763_800_000_000),
        10_000,
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
}
