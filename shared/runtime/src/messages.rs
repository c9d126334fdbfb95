//! What travels on the bus: requests between the services and lifecycle events for the world.
//!
//! Requests carry only identities: every handler re-reads the command from the ledger, which is
//! the source of truth, so a stale, duplicated or reordered message is harmless. Each message is
//! keyed by its run id. Their JSON Schemas are in `schemas/messages/`.
//!
//! Lifecycle events follow CloudEvents 1.0 in binary mode: the attributes travel as `ce_`
//! headers and the payload is the public projection of the command
//! (`sluice_core::events::EffectEvent`, docs/events.md): the topic is the public contract, so
//! its payload is never the stored record. Their schemas are in `schemas/events/`; the
//! requests' (internal) ones in `schemas/messages/`.
//!
//! Every message carries the format it is written in ([`FORMAT_HEADER`], [`FORMAT_VERSION`]),
//! and readers are tolerant, so services of two builds share the bus during a rolling upgrade:
//! a field a reader does not know is ignored (no `deny_unknown_fields` here, unlike the
//! configuration), a [`Cause`] it does not know reads as [`Cause::Other`], and a message of a
//! newer format or a compensation job of a kind it does not know
//! ([`CompensateJob::NewerKind`]) is skipped by the consume loop, not dead-lettered
//! (`crate::consumer`, "Messages of a newer build").
//!
//! Every message carries the effect's trace context in the W3C headers `traceparent` and
//! `tracestate` (as Kafka headers on Kafka, where OpenTelemetry's Kafka instrumentations read
//! them); lifecycle events carry it in the CloudEvents distributed-tracing extension
//! (`ce_traceparent`, `ce_tracestate`) as well. The builders
//! here ([`dispatch_request`], [`reconcile_request`], [`compensate_request`],
//! [`LifecycleEvent::new`]) are the only places a message is put together, so none goes out
//! without it; the context is the sending span's when it is in the command's trace, else the
//! one stored with the command (`sluice_trace::outgoing`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use sluice_core::command::{Command, CommandStatus};
use sluice_core::events::{EffectEvent, FlowEvent};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::time::Timestamp;
use sluice_core::trace::TraceContext;

/// Largest message accepted from the bus.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// The header naming the format a message is written in: [`FORMAT_VERSION`] as decimal text.
/// A message without it was written before the header existed, in format 1.
pub const FORMAT_HEADER: &str = "sluice-format";

/// The message format this build writes and reads. Raised only for a change an older reader
/// cannot survive by ignoring what it does not know (a field whose absence would make it act
/// wrongly, a meaning changed): such a message is skipped by older readers and left to the
/// ledger's sweep. Added fields, causes and job kinds do not raise it.
pub const FORMAT_VERSION: u32 = 1;

/// The format a message was written in ([`FORMAT_HEADER`]; 1 without it). A header that is
/// not a number is a malformed message.
pub fn format_of(headers: &[(String, Vec<u8>)]) -> Result<u32, MessageError> {
    let Some((_, value)) = headers.iter().rev().find(|(key, _)| key == FORMAT_HEADER) else {
        return Ok(1);
    };
    std::str::from_utf8(value)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .ok_or_else(|| MessageError::Invalid {
            what: "message format header",
            reason: format!(
                "{FORMAT_HEADER} is {:?}, not a format number",
                String::from_utf8_lossy(&value[..value.len().min(32)])
            ),
        })
}

/// The format header of everything this build writes.
fn format_header() -> (String, Vec<u8>) {
    (
        FORMAT_HEADER.to_owned(),
        FORMAT_VERSION.to_string().into_bytes(),
    )
}

/// Why a dispatch was requested: decided by the core with the step that leads to it
/// (`machine::cause_of`), so it is defined there.
pub use sluice_core::machine::Cause;

/// `requested`: lease this command and call its tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchRequest {
    pub run_id: RunId,
    pub command_key: CommandKey,
    pub cause: Cause,
}

/// `unknown`: resolve this command's ambiguous outcome from evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileRequest {
    pub run_id: RunId,
    pub command_key: CommandKey,
}

/// `compensate`: undo effects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompensateRequest {
    pub run_id: RunId,
    pub job: CompensateJob,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CompensateJob {
    /// Roll the whole run back: its CONFIRMED commands, last first.
    Rollback { actor: String, reason: String },
    /// Call compensate for one command already moved to COMPENSATING.
    Command { command_key: CommandKey },
    /// Undo the extra commits a `duplicate` observation found for this command.
    Duplicate {
        command_key: CommandKey,
        extra_refs: Vec<String>,
    },
    /// A kind a newer build added, which this build cannot carry out: the compensator skips
    /// the message (counted, not dead-lettered) and the command's own job comes again from
    /// the sweep of a build that knows it. Read, never written.
    #[serde(other, skip_serializing)]
    NewerKind,
}

/// A request ready for the bus: its payload and its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub payload: Vec<u8>,
    pub headers: Vec<(String, Vec<u8>)>,
}

/// The header of the CloudEvents distributed-tracing extension's `traceparent`.
pub const CE_TRACEPARENT: &str = "ce_traceparent";
/// The header of the CloudEvents distributed-tracing extension's `tracestate`.
pub const CE_TRACESTATE: &str = "ce_tracestate";

/// The W3C trace headers of `trace` (under `prefix`: `""` for requests, `"ce_"` for events).
fn trace_headers(prefix: &str, trace: Option<&TraceContext>) -> Vec<(String, Vec<u8>)> {
    let Some(trace) = trace else {
        return Vec::new();
    };
    let mut headers = vec![(
        format!("{prefix}{}", sluice_trace::TRACEPARENT),
        trace.traceparent.as_bytes().to_vec(),
    )];
    if let Some(state) = &trace.tracestate {
        headers.push((
            format!("{prefix}{}", sluice_trace::TRACESTATE),
            state.as_bytes().to_vec(),
        ));
    }
    headers
}

/// The trace context a delivered message carries: `traceparent`/`tracestate` on requests,
/// `ce_traceparent`/`ce_tracestate` on lifecycle events.
pub fn trace_of(headers: &[(String, Vec<u8>)]) -> Option<TraceContext> {
    let find = |name: &str| {
        headers
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_slice())
    };
    sluice_trace::from_headers(find).or_else(|| {
        let traceparent = std::str::from_utf8(find(CE_TRACEPARENT)?).ok()?;
        let tracestate = find(CE_TRACESTATE).and_then(|v| std::str::from_utf8(v).ok());
        TraceContext::parse(traceparent, tracestate)
    })
}

/// The header of a dispatch request naming its command's tenant: the lane it waits in at the
/// dispatcher (fair dispatch, `sluice_core::tenant::lanes`). A header, not a field, so a
/// dispatcher reads it without decoding the payload and one built before it reads the message
/// as before; a request without it waits in the lane of [`sluice_core::tenant::ANONYMOUS`].
/// It orders work only: the dispatcher re-reads the command and acts on what the ledger holds.
pub const TENANT_HEADER: &str = "sluice-tenant";

/// A request about `command`, with the trace headers it is sent under.
fn request_for<T: Serialize>(command: &Command, request: &T) -> Outgoing {
    let mut headers = vec![format_header()];
    headers.extend(trace_headers(
        "",
        sluice_trace::outgoing(command.trace.as_ref()).as_ref(),
    ));
    Outgoing {
        payload: encode(request),
        headers,
    }
}

/// `requested`: a dispatch request for `command`, with its tenant's header and, when the
/// services share copy keys, the command's signed copy (`crate::copies`, sealed by
/// [`crate::Context::seal_copy`]).
pub fn dispatch_request(command: &Command, cause: Cause, copy: Option<Vec<u8>>) -> Outgoing {
    let mut request = request_for(
        command,
        &DispatchRequest {
            run_id: command.run_id.clone(),
            command_key: command.command_key.clone(),
            cause,
        },
    );
    request
        .headers
        .push((TENANT_HEADER.into(), command.tenant().as_bytes().to_vec()));
    if let Some(copy) = copy {
        request
            .headers
            .push((crate::copies::COPY_HEADER.into(), copy));
    }
    request
}

/// `unknown`: a reconcile request for `command`.
pub fn reconcile_request(command: &Command) -> Outgoing {
    request_for(
        command,
        &ReconcileRequest {
            run_id: command.run_id.clone(),
            command_key: command.command_key.clone(),
        },
    )
}

/// `compensate`: a job about `command` (its own compensation, or its duplicates').
pub fn compensate_request(command: &Command, job: CompensateJob) -> Outgoing {
    request_for(
        command,
        &CompensateRequest {
            run_id: command.run_id.clone(),
            job,
        },
    )
}

/// `compensate`: a job about a whole run (a rollback), sent under the current span's context.
pub fn run_compensate_request(run_id: &RunId, job: CompensateJob) -> Outgoing {
    Outgoing {
        payload: encode(&CompensateRequest {
            run_id: run_id.clone(),
            job,
        }),
        headers: std::iter::once(format_header())
            .chain(trace_headers("", sluice_trace::current().as_ref()))
            .collect(),
    }
}

/// A message that cannot be used; it goes to the dead-letter topic with this reason.
#[derive(Debug, Error)]
pub enum MessageError {
    #[error("message of {size} bytes is over the {max} byte limit")]
    TooLarge { size: usize, max: usize },
    #[error("message is not a valid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
}

/// Decodes a request, refusing oversized or malformed payloads.
pub fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    payload: &[u8],
) -> Result<T, MessageError> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return Err(MessageError::TooLarge {
            size: payload.len(),
            max: MAX_MESSAGE_BYTES,
        });
    }
    serde_json::from_slice(payload).map_err(|e| MessageError::Invalid {
        what,
        reason: e.to_string(),
    })
}

/// Encodes a request; our own types always serialize.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    serde_json::to_vec(message).unwrap_or_default()
}

/// The CloudEvents `type` of a command reaching `status`: `dev.sluice.effect.<status>.v1`.
pub fn event_type(status: CommandStatus) -> String {
    sluice_core::events::effect_type(status)
}

/// A lifecycle event in CloudEvents binary mode: `ce_` headers and the public projection of
/// the command as payload.
#[derive(Debug, Clone, PartialEq)]
pub struct LifecycleEvent {
    pub headers: Vec<(String, Vec<u8>)>,
    pub payload: Vec<u8>,
}

/// The headers every event has: the CloudEvents attributes (`ce_type` with its `ce_dataschema`),
/// the content type and the format.
fn cloudevent_headers(
    id: String,
    source: &str,
    kind: &str,
    subject: Vec<u8>,
    at: Timestamp,
) -> Vec<(String, Vec<u8>)> {
    vec![
        ("ce_specversion".to_owned(), b"1.0".to_vec()),
        ("ce_id".to_owned(), id.into_bytes()),
        (
            "ce_source".to_owned(),
            [b"/sluice/", source.as_bytes()].concat(),
        ),
        ("ce_type".to_owned(), kind.as_bytes().to_vec()),
        (
            "ce_dataschema".to_owned(),
            sluice_core::events::dataschema(kind).into_bytes(),
        ),
        ("ce_subject".to_owned(), subject),
        ("ce_time".to_owned(), at.to_string().into_bytes()),
        ("content-type".to_owned(), b"application/json".to_vec()),
        format_header(),
    ]
}

/// What a lifecycle event is built from besides the command: the status the transition left
/// (`None` when rebuilt from the ledger without it) and the arguments the tool publishes
/// (`Tool::event_args`).
#[derive(Debug, Clone, Copy, Default)]
pub struct EventOrigin<'a> {
    pub from: Option<CommandStatus>,
    pub include_args: &'a [String],
}

impl LifecycleEvent {
    /// The event of `command` reaching its status (`dev.sluice.effect.<status>.v1`).
    pub fn new(
        source: &str,
        command: &Command,
        transition: EventOrigin<'_>,
        at: Timestamp,
    ) -> Self {
        Self::build(
            source,
            command,
            transition,
            at,
            &event_type(command.status()),
            None,
        )
    }

    /// The event of a command handed to a person ([`ESCALATED_TYPE`]), with the reason in the
    /// payload's `escalation_reason` and the `ce_reason` extension: beside the status's own
    /// event, so a subscription can take every escalation — an extra commit left standing on
    /// a CONFIRMED command included — by one type.
    pub fn escalated(
        source: &str,
        command: &Command,
        transition: EventOrigin<'_>,
        at: Timestamp,
        reason: &str,
    ) -> Self {
        let mut event = Self::build(
            source,
            command,
            transition,
            at,
            ESCALATED_TYPE,
            Some(reason),
        );
        event
            .headers
            .push(("ce_reason".to_owned(), reason.as_bytes().to_vec()));
        event
    }

    fn build(
        source: &str,
        command: &Command,
        transition: EventOrigin<'_>,
        at: Timestamp,
        kind: &str,
        escalation: Option<&str>,
    ) -> Self {
        // Values are written straight into their bytes: one event per transition, and the
        // `format!`s and `to_string`s they replaced showed in profiles.
        let run_id = command.run_id.as_str();
        let key = command.command_key.as_str();
        let mut subject = Vec::with_capacity(run_id.len() + 1 + key.len());
        subject.extend_from_slice(run_id.as_bytes());
        subject.push(b'/');
        subject.extend_from_slice(key.as_bytes());
        let id = event_id_of(command, kind);
        let mut headers = cloudevent_headers(id, source, kind, subject, at);
        // The W3C headers OpenTelemetry's Kafka instrumentations read, and the CloudEvents
        // distributed-tracing extension.
        let trace = sluice_trace::outgoing(command.trace.as_ref());
        headers.extend(trace_headers("", trace.as_ref()));
        headers.extend(trace_headers("ce_", trace.as_ref()));
        let payload = EffectEvent::project(
            command,
            transition.from,
            transition.include_args,
            escalation,
        )
        .to_json();
        Self { headers, payload }
    }

    /// The value of a header, as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

/// The `ce_id` of the event of type `kind` about `command` as it stands: the same for the same
/// transition (`sluice_core::webhook::event_id`), so webhooks deliver it once however often it
/// is published or rebuilt. Derived from the type's name without its version: the id a build
/// before versioned types gave the same transition, so an upgrade delivers nothing twice, and
/// one occurrence published in two versions has one id.
fn event_id_of(command: &Command, kind: &str) -> String {
    sluice_core::webhook::event_id(
        command.run_id.as_str(),
        command.command_key.as_str(),
        sluice_core::events::split_version(kind).0,
        command.state.updated_at,
        command.epoch().get(),
    )
}

/// The CloudEvents `type` of an escalation ([`LifecycleEvent::escalated`]).
pub const ESCALATED_TYPE: &str = sluice_core::events::ESCALATED_TYPE;

/// The value of a header, as text.
pub fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(key, _)| key == name)
        .and_then(|(_, value)| std::str::from_utf8(value).ok())
}

/// The header carrying the reason a message was dead-lettered.
pub const DLQ_REASON_HEADER: &str = "sluice-dlq-reason";
/// The header naming the topic a dead-lettered message came from.
pub const DLQ_TOPIC_HEADER: &str = "sluice-dlq-topic";

/// Evidence attached to an event or audit record, capped to keep records small.
pub fn cap_evidence(value: Value) -> Value {
    const MAX: usize = 4 * 1024;
    let text = value.to_string();
    if text.len() <= MAX {
        return value;
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    serde_json::json!({ "truncated": true, "prefix": &text[..end] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_ignore_what_a_newer_build_adds() {
        let request = DispatchRequest {
            run_id: RunId::parse("r-1").expect("valid"),
            command_key: CommandKey::parse("d-1/payments/wire/0").expect("valid"),
            cause: Cause::Reserved,
        };
        let bytes = encode(&request);
        assert_eq!(
            decode::<DispatchRequest>("dispatch request", &bytes).expect("ok"),
            request
        );
        let extra = br#"{"run_id":"r-1","command_key":"d-1/payments/wire/0","cause":"due","x":1}"#;
        let read = decode::<DispatchRequest>("dispatch request", extra).expect("tolerated");
        assert_eq!(read.cause, Cause::Due);
        let newer_cause =
            br#"{"run_id":"r-1","command_key":"d-1/payments/wire/0","cause":"autoscaled"}"#;
        let read = decode::<DispatchRequest>("dispatch request", newer_cause).expect("tolerated");
        assert_eq!(
            (read.cause, read.command_key.as_str()),
            (Cause::Other, "d-1/payments/wire/0")
        );
        let not_json = decode::<DispatchRequest>("dispatch request", b"{");
        assert!(not_json.is_err());
        let bad_key = br#"{"run_id":"r-1","command_key":"wire","cause":"due"}"#;
        assert!(decode::<DispatchRequest>("dispatch request", bad_key).is_err());
        let huge = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            decode::<DispatchRequest>("dispatch request", &huge),
            Err(MessageError::TooLarge { .. })
        ));
    }

    #[test]
    fn compensate_jobs_are_tagged() {
        let job = CompensateRequest {
            run_id: RunId::parse("r-1").expect("valid"),
            job: CompensateJob::Rollback {
                actor: "alice".into(),
                reason: "abort".into(),
            },
        };
        let text = String::from_utf8(encode(&job)).expect("utf8");
        assert!(text.contains(r#""kind":"rollback""#), "{text}");
        assert_eq!(
            decode::<CompensateRequest>("compensate request", text.as_bytes()).expect("ok"),
            job
        );
        // A newer build's kind, with fields of its own; and a known kind with a field added.
        let newer = br#"{"run_id":"r-1","job":{"kind":"partial_refund","command_key":"d-1/payments/wire/0","amount":5},"hint":1}"#;
        assert_eq!(
            decode::<CompensateRequest>("compensate request", newer)
                .expect("read")
                .job,
            CompensateJob::NewerKind
        );
        let added = br#"{"run_id":"r-1","job":{"kind":"command","command_key":"d-1/payments/wire/0","priority":2}}"#;
        assert!(matches!(
            decode::<CompensateRequest>("compensate request", added)
                .expect("read")
                .job,
            CompensateJob::Command { .. }
        ));
        // No kind at all is no job: malformed.
        assert!(
            decode::<CompensateRequest>("compensate request", br#"{"run_id":"r-1","job":{}}"#)
                .is_err()
        );
    }

    #[test]
    fn the_format_header_reads_as_a_number_and_defaults_to_one() {
        assert_eq!(format_of(&[]).expect("absent"), 1);
        let with = |v: &[u8]| vec![(FORMAT_HEADER.to_owned(), v.to_vec())];
        assert_eq!(format_of(&with(b"2")).expect("two"), 2);
        assert!(format_of(&with(b"two")).is_err());
        assert!(format_of(&with(&[0xff])).is_err());
    }

    /// An email of run `r-1` made at 1 ms (`d-1/email/send/0`).
    fn email_command() -> Command {
        use sluice_core::command::{EffectSemantics, Intent};
        Command::from_intent(
            Intent {
                run_id: RunId::parse("r-1").expect("valid"),
                command_key: CommandKey::parse("d-1/email/send/0").expect("valid"),
                semantics: EffectSemantics::Idempotent,
                args: serde_json::json!({}),
                business_key: None,
                policy_version: "v1".into(),
                max_attempts: 3,
                not_before: None,
            },
            Timestamp::from_millis(1),
            1_000,
        )
    }

    #[test]
    fn every_message_carries_the_commands_trace_context() {
        let trace = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            Some("vendor=x"),
        );
        let command = email_command().traced(trace.clone());
        for outgoing in [
            dispatch_request(&command, Cause::Reserved, None),
            reconcile_request(&command),
            compensate_request(
                &command,
                CompensateJob::Command {
                    command_key: command.command_key.clone(),
                },
            ),
        ] {
            assert_eq!(
                header(&outgoing.headers, "traceparent"),
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            );
            assert_eq!(header(&outgoing.headers, "tracestate"), Some("vendor=x"));
            assert_eq!(trace_of(&outgoing.headers), trace);
        }
        let event = LifecycleEvent::new(
            "dispatcher",
            &command,
            EventOrigin::default(),
            Timestamp::from_millis(2),
        );
        // Both: the W3C headers OpenTelemetry's Kafka instrumentations read, and the
        // CloudEvents extension.
        for (name, value) in [
            (
                "ce_traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
            ("ce_tracestate", "vendor=x"),
            ("tracestate", "vendor=x"),
        ] {
            assert_eq!(event.header(name), Some(value), "{name}");
        }
        assert_eq!(trace_of(&event.headers), trace);
        // No context, no headers: a command submitted without one and no span to send from.
        let untraced = command.clone().traced(None);
        assert_eq!(
            dispatch_request(&untraced, Cause::Due, None).headers,
            [
                (FORMAT_HEADER.to_owned(), b"1".to_vec()),
                (TENANT_HEADER.to_owned(), b"anonymous".to_vec())
            ],
            "a dispatch request names its format and tenant, and nothing else without a context"
        );
        let named = untraced.clone().for_tenant("acme");
        assert_eq!(
            header(
                &dispatch_request(&named, Cause::Due, None).headers,
                TENANT_HEADER
            ),
            Some("acme")
        );
        assert_eq!(
            reconcile_request(&untraced).headers,
            [(FORMAT_HEADER.to_owned(), b"1".to_vec())]
        );
        assert_eq!(
            header(
                &LifecycleEvent::new(
                    "x",
                    &untraced,
                    EventOrigin::default(),
                    Timestamp::from_millis(2)
                )
                .headers,
                FORMAT_HEADER
            ),
            Some("1")
        );
        assert_eq!(
            format_of(
                &run_compensate_request(
                    &untraced.run_id,
                    CompensateJob::Rollback {
                        actor: "a".into(),
                        reason: "b".into(),
                    },
                )
                .headers,
            )
            .expect("a format"),
            FORMAT_VERSION
        );
        let untraced_event = LifecycleEvent::new(
            "x",
            &untraced,
            EventOrigin::default(),
            Timestamp::from_millis(2),
        );
        assert_eq!(untraced_event.header("ce_traceparent"), None);
        assert_eq!(untraced_event.header("traceparent"), None);
    }

    #[test]
    fn event_types_name_the_state_and_version() {
        assert_eq!(
            event_type(CommandStatus::NoCompensation),
            "dev.sluice.effect.no_compensation.v1"
        );
        assert_eq!(
            event_type(CommandStatus::Confirmed),
            "dev.sluice.effect.confirmed.v1"
        );
    }

    #[test]
    fn an_events_id_is_the_one_a_build_before_versions_gave_it() {
        let command = email_command();
        let event = LifecycleEvent::new(
            "x",
            &command,
            EventOrigin::default(),
            Timestamp::from_millis(2),
        );
        let unversioned = sluice_core::webhook::event_id(
            "r-1",
            "d-1/email/send/0",
            "dev.sluice.effect.pending",
            command.state.updated_at,
            command.epoch().get(),
        );
        assert_eq!(event.header("ce_id"), Some(unversioned.as_str()));
        assert_eq!(
            event.header("ce_dataschema"),
            Some("https://sluice.dev/schemas/events/dev.sluice.effect.pending.v1.json")
        );
        let escalated = LifecycleEvent::escalated(
            "x",
            &command,
            EventOrigin::default(),
            Timestamp::from_millis(2),
            "why",
        );
        assert_ne!(escalated.header("ce_id"), event.header("ce_id"));
        assert_eq!(escalated.header("ce_type"), Some(ESCALATED_TYPE));
        assert_eq!(escalated.header("ce_reason"), Some("why"));
        let payload: Value = serde_json::from_slice(&escalated.payload).expect("json");
        assert_eq!(payload["escalation_reason"], "why");
        assert!(payload.get("args").is_none() && payload.get("lease").is_none());
    }
}

/// A change of a flow control (`sluice_core::flow`): an operator's pause or resume, a circuit
/// breaker opening, half-opening or closing. Published on the events topic as a CloudEvent
/// (binary mode, like [`LifecycleEvent`]) keyed by the tool or upstream name, and audited in
/// the ledger's own chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowChange {
    Paused,
    Resumed,
    BreakerOpened,
    BreakerHalfOpen,
    BreakerClosed,
}

impl FlowChange {
    /// What changed from `before` to `after`; `None`: nothing anyone is told of.
    pub fn between(
        before: &sluice_core::flow::FlowControl,
        after: &sluice_core::flow::FlowControl,
    ) -> Option<Self> {
        use sluice_core::flow::Breaker;
        match (&before.paused, &after.paused) {
            (None, Some(_)) => return Some(Self::Paused),
            (Some(_), None) => return Some(Self::Resumed),
            _ => {}
        }
        match (&before.breaker, &after.breaker) {
            (Breaker::Open { .. }, Breaker::Open { .. }) | (Breaker::Closed, Breaker::Closed) => {
                None
            }
            (Breaker::HalfOpen { .. }, Breaker::HalfOpen { .. }) => None,
            (_, Breaker::Open { .. }) => Some(Self::BreakerOpened),
            (_, Breaker::HalfOpen { .. }) => Some(Self::BreakerHalfOpen),
            (_, Breaker::Closed) => Some(Self::BreakerClosed),
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Self::Paused => "paused",
            Self::Resumed => "resumed",
            Self::BreakerOpened => "breaker_opened",
            Self::BreakerHalfOpen => "breaker_half_open",
            Self::BreakerClosed => "breaker_closed",
        }
    }

    /// The breaker state it leads to, for the transitions metric.
    pub fn breaker_to(self) -> Option<&'static str> {
        match self {
            Self::BreakerOpened => Some("open"),
            Self::BreakerHalfOpen => Some("half_open"),
            Self::BreakerClosed => Some("closed"),
            Self::Paused | Self::Resumed => None,
        }
    }

    /// The CloudEvents `type`: `dev.sluice.flow.<kind>.v1`.
    pub fn event_type(self) -> String {
        sluice_core::events::flow_type(self.kind())
    }

    /// One line for the audit record and the log.
    pub fn describe(self, name: &str) -> String {
        match self {
            Self::Paused => format!("{name} paused: its calls wait until it is resumed"),
            Self::Resumed => format!("{name} resumed: its waiting calls go at its rate"),
            Self::BreakerOpened => {
                format!("upstream {name}: circuit breaker opened; its calls wait")
            }
            Self::BreakerHalfOpen => {
                format!("upstream {name}: circuit breaker half open; one probe goes")
            }
            Self::BreakerClosed => {
                format!("upstream {name}: circuit breaker closed; calls go again")
            }
        }
    }

    /// The event: CloudEvents binary mode, the public projection of the control after the
    /// change (`sluice_core::events::FlowEvent`) as its JSON payload, sent under the current
    /// span's trace context.
    pub fn event(
        self,
        control: &sluice_core::flow::FlowControl,
        actor: &str,
        at: Timestamp,
    ) -> LifecycleEvent {
        let id = uuid::Uuid::new_v4().to_string();
        let kind = self.event_type();
        let mut headers =
            cloudevent_headers(id, actor, &kind, control.name.clone().into_bytes(), at);
        let trace = sluice_trace::current();
        headers.extend(trace_headers("", trace.as_ref()));
        headers.extend(trace_headers("ce_", trace.as_ref()));
        LifecycleEvent {
            headers,
            payload: encode(&FlowEvent::project(control, self.kind())),
        }
    }
}
