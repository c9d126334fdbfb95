//! Every message the services put on the bus matches its JSON Schema: the internal requests'
//! in `schemas/messages/`, the public events' in `schemas/events/` (named by each event's
//! `ce_dataschema`), and the schemas refuse what the services refuse. The public schemas keep
//! the compatibility rule of docs/events.md against their released copies.

use serde_json::{Value, json};
use sluice_core::command::{Command, EffectSemantics, Intent};
use sluice_core::ids::{CommandKey, RunId, ToolName};
use sluice_core::time::Timestamp;
use sluice_runtime::messages::{
    Cause, CompensateJob, CompensateRequest, DispatchRequest, EventOrigin, LifecycleEvent,
    ReconcileRequest, encode,
};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas/messages/");
const EVENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../schemas/events/");

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

/// The schema of events of type `kind` (`schemas/events/<kind>.json`), compiled.
fn event_schema(kind: &str) -> Value {
    let text = std::fs::read_to_string(format!("{EVENTS}{kind}.json"))
        .unwrap_or_else(|e| panic!("no schema for {kind}: {e}"));
    serde_json::from_str(&text).expect("schema is JSON")
}

fn event_validator(kind: &str) -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(&event_schema(kind))
        .expect("schema compiles")
}

/// Checks `event` against the schema its `ce_dataschema` names, which must be its type's.
fn assert_event_valid(event: &LifecycleEvent) {
    let kind = event.header("ce_type").expect("a type");
    assert_eq!(
        event.header("ce_dataschema"),
        Some(sluice_core::events::dataschema(kind).as_str())
    );
    let schema = event_schema(kind);
    assert_eq!(
        schema["$id"].as_str(),
        event.header("ce_dataschema"),
        "the schema's $id is the event's dataschema"
    );
    assert_valid(&event_validator(kind), &event.payload);
}

#[test]
fn lifecycle_event_payload_is_the_projection_and_matches_its_schema() {
    let mut command = wire_command(
        3,
        json!({"account": "acc-1", "amount_minor": 5, "date": "2026-11-22"}),
        Some("acc-1:5:2026-11-22"),
    );
    command.state.status = sluice_core::command::CommandStatus::Confirmed;
    command.state.external_ref = Some("w-1".into());
    command.state.result = Some(std::sync::Arc::new(json!({"id": "w-1", "iban": "DE00"})));
    assert_eq!(
        command.tool,
        ToolName::parse("payments/wire").expect("valid")
    );
    let include = ["amount_minor".to_owned(), "missing".to_owned()];
    let event = LifecycleEvent::new(
        "dispatcher",
        &command,
        EventOrigin {
            from: Some(sluice_core::command::CommandStatus::Leased),
            include_args: &include,
        },
        Timestamp::from_millis(1),
    );
    assert_event_valid(&event);
    assert_eq!(
        event.header("ce_type"),
        Some("dev.sluice.effect.confirmed.v1")
    );
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

    let payload: Value = serde_json::from_slice(&event.payload).expect("JSON");
    assert_eq!(
        payload,
        json!({
            "run_id": "r-abc",
            "command_key": "d-3/payments/wire/0",
            "tool": "payments/wire",
            "status": "CONFIRMED",
            "tenant": "anonymous",
            "idempotency_key": "r-abc/d-3/payments/wire/0",
            "business_key": "acc-1:5:2026-11-22",
            "external_ref": "w-1",
            "outcome": {
                "decided_by": "call",
                "attempts": 0,
                "checks": 0,
                "replays": 0,
                "ambiguous": false,
                "verification_pending": false,
                "duplicates_owed": 0
            },
            "escalated": false,
            "submitted_at": "2025-11-22T08:26:40.000Z",
            "updated_at": "2025-11-22T08:26:40.000Z",
            "args": {"amount_minor": 5}
        }),
        "the projection: the opted-in argument only, no lease, no result, no other argument"
    );
    // Without the opt-in, no arguments at all.
    let bare = LifecycleEvent::new(
        "dispatcher",
        &command,
        EventOrigin::default(),
        Timestamp::from_millis(1),
    );
    let bare: Value = serde_json::from_slice(&bare.payload).expect("JSON");
    assert!(bare.get("args").is_none(), "{bare}");
    assert!(
        bare["outcome"].get("decided_by").is_none(),
        "no transition known"
    );
}

/// Every lifecycle event the pipeline publishes — including those of operator actions, whose
/// commands carry an approval, a compensation or a submitter, and the escalations — matches
/// the schema of its type, with the CloudEvents type of its status.
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
    let no_undo = Rules {
        has_status_check: true,
        has_compensate: false,
        ..Rules::defaults(EffectSemantics::NonIdempotent)
    };
    let operator = Operator {
        actor: "admin-1".into(),
        reason: "checked".into(),
    };
    let include = ["amount_minor".to_owned()];
    let mut seen = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    let mut at = 1_763_800_000_000;
    let mut apply_with = |command: &mut Command, rules: &Rules, event: Event| {
        at += 60_000; // past any lease
        let step = machine::apply(&command.state, rules, &event, Timestamp::from_millis(at))
            .unwrap_or_else(|refusal| panic!("{event:?}: {refusal}"));
        command.state = step.state.clone();
        let origin = EventOrigin {
            from: Some(step.from),
            include_args: &include,
        };
        for action in &step.actions {
            let event = match action {
                Action::Publish { .. } => {
                    LifecycleEvent::new("producer", command, origin, Timestamp::from_millis(at))
                }
                Action::Escalate { reason } => LifecycleEvent::escalated(
                    "producer",
                    command,
                    origin,
                    Timestamp::from_millis(at),
                    reason,
                ),
                _ => continue,
            };
            assert_event_valid(&event);
            let kind = event.header("ce_type").expect("a type").to_owned();
            if matches!(action, Action::Publish { .. }) {
                assert_eq!(
                    kind,
                    format!(
                        "dev.sluice.effect.{}.v1",
                        command.status().as_str().to_ascii_lowercase()
                    )
                );
                seen.push(command.status());
            }
            kinds.insert(kind);
        }
    };
    let mut apply = |command: &mut Command, event: Event| apply_with(command, &rules, event);
    let blocked = |command: &mut Command, apply: &mut dyn FnMut(&mut Command, Event)| {
        apply(
            command,
            Event::Block {
                reason: "above the threshold".into(),
                epoch: None,
            },
        );
    };
    let lease = |command: &mut Command, apply: &mut dyn FnMut(&mut Command, Event)| {
        apply(
            command,
            Event::Lease {
                owner: "d-1".into(),
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
            revision: None,
        },
    );
    lease(&mut wire, &mut apply);
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
    lease(&mut stuck, &mut apply);
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
            operator: operator.clone(),
            resolution: Resolution::Confirmed {
                external_ref: "w-9".into(),
            },
            evidence: json!({"statement": "line 4"}),
        },
    );
    // Refused: FAILED by the call's answer.
    let mut refused = wire_command(5, json!({"account": "acc-2", "amount_minor": 7}), None);
    lease(&mut refused, &mut apply);
    let epoch = refused.state.lease.epoch;
    apply(
        &mut refused,
        Event::Dispatched {
            epoch,
            sent_at: Timestamp::from_millis(1_763_800_000_000),
            outcome: DispatchOutcome::Refused {
                reason: "402 card declined".into(),
            },
        },
    );
    // A compensation the upstream refuses: COMPENSATION_FAILED, escalated.
    let mut undo_refused = wire_command(6, json!({"account": "acc-3", "amount_minor": 9}), None);
    lease(&mut undo_refused, &mut apply);
    let epoch = undo_refused.state.lease.epoch;
    apply(
        &mut undo_refused,
        Event::Dispatched {
            epoch,
            sent_at: Timestamp::from_millis(1_763_800_000_000),
            outcome: DispatchOutcome::Committed {
                external_ref: Some("w-3".into()),
                result: None,
            },
        },
    );
    apply(
        &mut undo_refused,
        Event::Rollback {
            operator: operator.clone(),
        },
    );
    let epoch = undo_refused.state.lease.epoch;
    apply(
        &mut undo_refused,
        Event::Compensated {
            epoch,
            outcome: CompensationOutcome::Impossible {
                reason: "already settled".into(),
            },
        },
    );
    // A rollback of a tool that cannot compensate: NO_COMPENSATION, escalated.
    let mut no_comp = wire_command(7, json!({"account": "acc-4", "amount_minor": 1}), None);
    apply_with(
        &mut no_comp,
        &no_undo,
        Event::Lease {
            owner: "d-1".into(),
        },
    );
    let epoch = no_comp.state.lease.epoch;
    apply_with(
        &mut no_comp,
        &no_undo,
        Event::Dispatched {
            epoch,
            sent_at: Timestamp::from_millis(1_763_800_000_000),
            outcome: DispatchOutcome::Committed {
                external_ref: Some("w-4".into()),
                result: None,
            },
        },
    );
    apply_with(
        &mut no_comp,
        &no_undo,
        Event::Rollback {
            operator: operator.clone(),
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
            S::Confirmed,
            S::Failed,
            S::Confirmed,
            S::CompensationFailed,
            S::Confirmed,
            S::NoCompensation,
        ]
    );
    // Every effect type with a schema was emitted and checked here.
    let expected: std::collections::BTreeSet<String> = sluice_core::events::PUBLISHED
        .into_iter()
        .map(sluice_core::events::effect_type)
        .chain([sluice_core::events::ESCALATED_TYPE.to_owned()])
        .collect();
    assert_eq!(kinds, expected);
}

/// Flow-control events match their schemas too.
#[test]
fn flow_events_match_their_schemas() {
    use sluice_core::flow::{Breaker, FlowControl, Pause};
    use sluice_runtime::messages::FlowChange;
    let closed = FlowControl::new("payments/wire");
    let paused = FlowControl {
        paused: Some(Pause {
            actor: "ops".into(),
            reason: "bank maintenance".into(),
            at: Timestamp::from_millis(5),
        }),
        ..closed.clone()
    };
    let open = FlowControl {
        breaker: Breaker::Open {
            since: Timestamp::from_millis(5),
            probe_at: Timestamp::from_millis(6),
            opened: 2,
            reason: "5 failures in a row".into(),
        },
        ..closed.clone()
    };
    let half = FlowControl {
        breaker: Breaker::HalfOpen {
            since: Timestamp::from_millis(6),
            probe_by: "dispatcher-1".into(),
            until: Timestamp::from_millis(7),
            opened: 2,
        },
        ..closed.clone()
    };
    let mut kinds = Vec::new();
    for (before, after) in [
        (&closed, &paused),
        (&paused, &closed),
        (&closed, &open),
        (&open, &half),
        (&half, &closed),
    ] {
        let change = FlowChange::between(before, after).expect("a change");
        let event = change.event(after, "ops", Timestamp::from_millis(8));
        assert_event_valid(&event);
        assert_eq!(event.header("ce_subject"), Some("payments/wire"));
        let payload: Value = serde_json::from_slice(&event.payload).expect("JSON");
        assert!(payload["breaker"].get("probe_by").is_none(), "{payload}");
        kinds.push(event.header("ce_type").expect("a type").to_owned());
    }
    let expected: Vec<String> = sluice_core::events::FLOW_CHANGES
        .into_iter()
        .map(sluice_core::events::flow_type)
        .collect();
    assert_eq!(kinds, expected);
}

/// Why `current` breaks consumers of `released` (the compatibility rule of docs/events.md),
/// or nothing: a field of `released` removed or retyped (its type, const, format or pattern
/// changed, an enum value dropped), a field made required that was not or the reverse, or
/// further fields refused.
fn breaks(released: &Value, current: &Value, at: &str, out: &mut Vec<String>) {
    for key in ["type", "const", "format", "pattern"] {
        if released.get(key) != current.get(key) {
            out.push(format!(
                "{at}: {key} {} became {}",
                released.get(key).unwrap_or(&Value::Null),
                current.get(key).unwrap_or(&Value::Null)
            ));
        }
    }
    if let Some(values) = released.get("enum").and_then(Value::as_array) {
        let now = current.get("enum").and_then(Value::as_array);
        for value in values {
            if !now.is_some_and(|now| now.contains(value)) {
                out.push(format!("{at}: enum value {value} removed"));
            }
        }
    }
    if current.get("additionalProperties") == Some(&Value::Bool(false)) {
        out.push(format!("{at}: further fields refused"));
    }
    let names = |schema: &Value| -> std::collections::BTreeSet<String> {
        schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (was, now) = (names(released), names(current));
    for added in now.difference(&was) {
        out.push(format!("{at}: {added} made required"));
    }
    for dropped in was.difference(&now) {
        out.push(format!("{at}: {dropped} no longer required"));
    }
    if let Some(properties) = released.get("properties").and_then(Value::as_object) {
        for (name, schema) in properties {
            match current.get("properties").and_then(|p| p.get(name)) {
                Some(now) => breaks(schema, now, &format!("{at}/{name}"), out),
                None => out.push(format!("{at}/{name}: removed")),
            }
        }
    }
}

/// A change made to a schema, to see that the compatibility check finds it.
type Edit = fn(&mut Value);

/// The compatibility rule, checked: no schema of a released type version breaks its released
/// copy (`schemas/events/released/`), and every type version published has one.
#[test]
fn released_event_schemas_are_kept_compatible() {
    let released_dir = format!("{EVENTS}released/");
    let mut released = Vec::new();
    for entry in std::fs::read_dir(&released_dir).expect("schemas/events/released") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).expect("a name");
        released.push(name.trim_end_matches(".json").to_owned());
    }
    released.sort();
    let mut current = Vec::new();
    for entry in std::fs::read_dir(EVENTS).expect("schemas/events") {
        let path = entry.expect("an entry").path();
        if path.is_file() {
            let name = path.file_name().and_then(|n| n.to_str()).expect("a name");
            current.push(name.trim_end_matches(".json").to_owned());
        }
    }
    current.sort();
    assert_eq!(
        current, released,
        "every published type version has a released copy, and none was withdrawn: copy a new \
         one's schema to schemas/events/released/ when it ships (docs/events.md)"
    );
    let mut problems = Vec::new();
    for kind in &released {
        let text = std::fs::read_to_string(format!("{released_dir}{kind}.json")).expect("read");
        let frozen: Value = serde_json::from_str(&text).expect("JSON");
        breaks(&frozen, &event_schema(kind), kind, &mut problems);
    }
    assert!(
        problems.is_empty(),
        "a released event type changed incompatibly; publish a new version instead \
         (docs/events.md, \"Compatibility\"): {problems:#?}"
    );

    // The check itself finds each kind of break.
    let frozen = event_schema("dev.sluice.effect.confirmed.v1");
    let edit = |change: Edit| {
        let mut schema = frozen.clone();
        change(&mut schema);
        let mut found = Vec::new();
        breaks(&frozen, &schema, "x", &mut found);
        found
    };
    assert!(edit(|_| {}).is_empty(), "unchanged");
    let added = edit(|s| s["properties"]["region"] = json!({"type": "string"}));
    assert!(added.is_empty(), "an optional field added: {added:?}");
    let cases: [(&str, Edit); 5] = [
        ("removed", |s| {
            if let Some(properties) = s["properties"].as_object_mut() {
                properties.remove("external_ref");
            }
        }),
        ("type", |s| {
            s["properties"]["outcome"]["properties"]["attempts"]["type"] = json!("string");
        }),
        ("made required", |s| {
            if let Some(required) = s["required"].as_array_mut() {
                required.push(json!("external_ref"));
            }
        }),
        ("enum value", |s| {
            s["properties"]["outcome"]["properties"]["observation"]["enum"] =
                json!(["present", "absent"]);
        }),
        ("further fields refused", |s| {
            s["additionalProperties"] = json!(false);
        }),
    ];
    for (what, change) in cases {
        let found = edit(change);
        assert!(found.iter().any(|p| p.contains(what)), "{what}: {found:?}");
    }
}
