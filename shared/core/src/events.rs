//! The public event contract (docs/events.md): what stream consumers and webhook receivers are
//! told of an effect, built here and nowhere else.
//!
//! The `events` topic carries one CloudEvent per transition worth telling. Its payload is a
//! documented, stable **projection** of the command ([`EffectEvent`]), not the stored record: no
//! lease, no internal bookkeeping, no arguments unless the tool opts fields in
//! (`[tool.events] include_args`, checked at catalog load), and not the upstream's raw answer.
//! A change of the ledger's record is therefore never a change of the contract.
//!
//! Types are versioned per transition: `dev.sluice.effect.<status>.v1`,
//! `dev.sluice.effect.escalated.v1` and `dev.sluice.flow.<change>.v1`, each with its JSON
//! Schema (`schemas/events/<type>.json`, named by the `dataschema` attribute,
//! [`dataschema`]). The compatibility rule: a field may be added to a version; removing or
//! retyping one, or making a new one required, needs a new version, both published side by
//! side for the deprecation period docs/events.md names.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::command::{Command, CommandStatus, Observation};
use crate::time::Timestamp;

/// The version every type of this contract has now.
pub const VERSION: &str = "v1";

/// What every effect event's type starts with.
pub const EFFECT_PREFIX: &str = "dev.sluice.effect.";

/// What every flow-control event's type starts with.
pub const FLOW_PREFIX: &str = "dev.sluice.flow.";

/// The type of an escalation: a command handed to a person (beside its status's own event).
pub const ESCALATED_TYPE: &str = "dev.sluice.effect.escalated.v1";

/// Where the event schemas are published: `<SCHEMA_BASE><type>.json`, each schema's `$id`.
pub const SCHEMA_BASE: &str = "https://sluice.dev/schemas/events/";

/// The statuses a command's event is published for: where it settled, or where it waits for a
/// person. The intermediate ones (PENDING, LEASED, UNKNOWN, …) are not events.
pub const PUBLISHED: [CommandStatus; 8] = [
    CommandStatus::Confirmed,
    CommandStatus::Failed,
    CommandStatus::Stuck,
    CommandStatus::Blocked,
    CommandStatus::Cancelled,
    CommandStatus::Compensated,
    CommandStatus::CompensationFailed,
    CommandStatus::NoCompensation,
];

/// The flow-control changes published (`dev.sluice.flow.<change>.v1`).
pub const FLOW_CHANGES: [&str; 5] = [
    "paused",
    "resumed",
    "breaker_opened",
    "breaker_half_open",
    "breaker_closed",
];

/// The longest `last_error` and `escalation_reason` an event carries; longer ones are cut at a
/// character boundary and end with `…`.
pub const MAX_TEXT: usize = 512;

/// The type of the event of a command reaching `status`: `dev.sluice.effect.<status>.v1`.
pub fn effect_type(status: CommandStatus) -> String {
    let name = status.as_str();
    let mut kind = String::with_capacity(EFFECT_PREFIX.len() + name.len() + 1 + VERSION.len());
    kind.push_str(EFFECT_PREFIX);
    kind.extend(name.chars().map(|c| c.to_ascii_lowercase()));
    kind.push('.');
    kind.push_str(VERSION);
    kind
}

/// The type of a flow-control change: `dev.sluice.flow.<change>.v1`.
pub fn flow_type(change: &str) -> String {
    let mut kind = String::with_capacity(FLOW_PREFIX.len() + change.len() + 1 + VERSION.len());
    kind.push_str(FLOW_PREFIX);
    kind.push_str(change);
    kind.push('.');
    kind.push_str(VERSION);
    kind
}

/// The `dataschema` of events of type `kind`: the URL (`$id`) of its JSON Schema.
pub fn dataschema(kind: &str) -> String {
    let mut url = String::with_capacity(SCHEMA_BASE.len() + kind.len() + 5);
    url.push_str(SCHEMA_BASE);
    url.push_str(kind);
    url.push_str(".json");
    url
}

/// An event type split into its name and version: `dev.sluice.effect.confirmed.v1` is
/// `("dev.sluice.effect.confirmed", Some(1))`; a type without a version (published before
/// types had one, in message format 1) is `(kind, None)`.
pub fn split_version(kind: &str) -> (&str, Option<u32>) {
    if let Some((name, version)) = kind.rsplit_once(".v")
        && !version.is_empty()
        && version.bytes().all(|b| b.is_ascii_digit())
        && let Ok(number) = version.parse()
    {
        return (name, Some(number));
    }
    (kind, None)
}

/// The status an effect event's type names, of any version (`dev.sluice.effect.confirmed.v1`,
/// or `dev.sluice.effect.confirmed` from a build before versions); `None` for any other type,
/// the escalation's included.
pub fn status_of_type(kind: &str) -> Option<CommandStatus> {
    let (name, _) = split_version(kind);
    let status = name.strip_prefix(EFFECT_PREFIX)?;
    if status == "escalated" {
        return None;
    }
    status.parse().ok()
}

/// Whether a subscription's type `pattern` takes events of type `kind`. A pattern matches its
/// own type; one ending in `*` every type starting with what precedes it; `*` alone every
/// type; and a pattern naming a type without a version (`dev.sluice.effect.stuck`, as written
/// before types had versions) takes that type's version 1 too, so such subscriptions keep
/// working (docs/events.md, "Webhooks").
pub fn type_matches(pattern: &str, kind: &str) -> bool {
    if let Some(prefix) = pattern.strip_suffix('*') {
        return kind.starts_with(prefix);
    }
    if pattern == kind {
        return true;
    }
    let (name, version) = split_version(kind);
    version == Some(1) && split_version(pattern).1.is_none() && name == pattern
}

/// What brought a command to a final status: how it was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    /// The upstream's answer to the call.
    Call,
    /// A status check of an outcome that was ambiguous (see `outcome.observation`).
    Lookup,
    /// The last look after the command settled found a commit that must not stand.
    Verification,
    /// A person: a resolution of a STUCK command, a rejection, a cancellation, a rollback.
    Person,
    /// The catalog's policy (a denial).
    Policy,
    /// Nobody approved a BLOCKED command in time.
    ApprovalTimeout,
    /// The answer to the tool's compensate call.
    Compensation,
}

impl DecidedBy {
    /// What brought a command from `from` to the final status `to` (`escalated`: the command
    /// is escalated now); `None` when `to` is not final or the pair is not one the state
    /// machine makes.
    pub fn of(from: CommandStatus, to: CommandStatus, escalated: bool) -> Option<Self> {
        use CommandStatus as S;
        if !to.is_terminal() {
            return None;
        }
        Some(match (from, to) {
            (_, S::Compensated | S::CompensationFailed) => Self::Compensation,
            (S::Stuck, _) => Self::Person,
            (S::Blocked, S::Cancelled) if escalated => Self::ApprovalTimeout,
            (S::Blocked, _) => Self::Person,
            (S::Unknown, _) => Self::Lookup,
            // A rollback found the call unsent.
            (S::Leased, S::Cancelled) => Self::Person,
            (S::Leased, _) => Self::Call,
            // A rollback of a confirmed command whose tool cannot compensate.
            (S::Confirmed, S::NoCompensation) => Self::Person,
            (S::Confirmed | S::Failed | S::Cancelled | S::Compensated, _) => Self::Verification,
            (S::Scheduled | S::Pending | S::Approved, S::Failed) => Self::Policy,
            (S::Scheduled | S::Pending | S::Approved, S::Cancelled) => Self::Person,
            _ => return None,
        })
    }
}

/// How the command's outcome was reached: counts and flags from its record, and for a final
/// status what decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// What brought the command to a final status; absent for STUCK and BLOCKED (they wait
    /// for a person) and for an event rebuilt without its transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<DecidedBy>,
    /// What the status check found, when one decided it: `present`, `absent` or `duplicate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    /// Calls made in the current cycle.
    pub attempts: u32,
    /// Status checks made while the outcome was unknown, in the current cycle.
    pub checks: u32,
    /// Operator replays so far.
    pub replays: u32,
    /// An attempt's outcome was once unknown (the effect went through UNKNOWN).
    pub ambiguous: bool,
    /// A last look at the upstream is still owed (a commit that lands late is then undone or
    /// escalated).
    pub verification_pending: bool,
    /// Extra commits found by a status check that are still to be undone.
    pub duplicates_owed: u32,
}

/// The approval of a command that needed one (who approved is not told: a person's name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalSummary {
    pub at: Timestamp,
    pub policy_version: String,
}

/// A compensation's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompensationSummary {
    pub started_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<Timestamp>,
    /// The upstream's reference of the undo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    pub attempts: u32,
}

/// The payload of every `dev.sluice.effect.*.v1` event (schemas/events/). Field names are the
/// contract: never renamed, removed or retyped within v1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectEvent<'a> {
    #[serde(borrow)]
    pub run_id: Cow<'a, str>,
    #[serde(borrow)]
    pub command_key: Cow<'a, str>,
    #[serde(borrow)]
    pub tool: Cow<'a, str>,
    /// The command's status now (`CONFIRMED`, `STUCK`, …).
    pub status: CommandStatus,
    #[serde(borrow)]
    pub tenant: Cow<'a, str>,
    /// The API token (principal) that submitted the effect, when it was authenticated.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<Cow<'a, str>>,
    /// The key the upstream saw: `<run_id>/<command_key>`.
    #[serde(borrow)]
    pub idempotency_key: Cow<'a, str>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub business_key: Option<Cow<'a, str>>,
    /// The upstream's reference of the effect (a payment id, a message id).
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub external_ref: Option<Cow<'a, str>>,
    pub outcome: Outcome,
    /// Handed to a person (STUCK, NO_COMPENSATION, a failed compensation, an extra commit).
    pub escalated: bool,
    /// Why, on `dev.sluice.effect.escalated.v1`.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub escalation_reason: Option<Cow<'a, str>>,
    /// The last error recorded (secret-free by construction: the connector never writes
    /// credentials into it), at most [`MAX_TEXT`] bytes.
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<CompensationSummary>,
    /// When the effect was submitted (recorded in the ledger). Named apart from the stored
    /// record's `created_at` on purpose: a waiter of a build before this contract reads an
    /// event that lacks `created_at` as one it cannot use and reads the ledger instead
    /// (docs/decisions.md, "The public event contract").
    pub submitted_at: Timestamp,
    /// When the command reached this state.
    pub updated_at: Timestamp,
    /// The arguments the tool opted in (`[tool.events] include_args`), and only those present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Map<String, Value>>,
}

/// `a/b`, written straight into its bytes (one event per transition: no `format!`).
fn joined(a: &str, b: &str) -> String {
    let mut text = String::with_capacity(a.len() + 1 + b.len());
    text.push_str(a);
    text.push('/');
    text.push_str(b);
    text
}

/// `text` cut to [`MAX_TEXT`] bytes at a character boundary.
fn capped(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_TEXT {
        return Cow::Borrowed(text);
    }
    let mut end = MAX_TEXT - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut cut = String::with_capacity(MAX_TEXT);
    cut.push_str(&text[..end]);
    cut.push('…');
    Cow::Owned(cut)
}

impl<'a> EffectEvent<'a> {
    /// The projection of `command` as it stands. `from`: the status the transition left
    /// (`None` when the event is rebuilt from the ledger without it). `include_args`: the
    /// top-level argument fields the tool publishes (checked at catalog load). `escalation`:
    /// the reason, on an escalation's event.
    pub fn project(
        command: &'a Command,
        from: Option<CommandStatus>,
        include_args: &[String],
        escalation: Option<&'a str>,
    ) -> Self {
        let state = &command.state;
        let status = state.status;
        let decided_by = from.and_then(|from| DecidedBy::of(from, status, state.escalated));
        let observation = match (decided_by, status) {
            (Some(DecidedBy::Lookup), CommandStatus::Confirmed) => {
                Some(if state.owed_duplicates.is_empty() {
                    Observation::Present
                } else {
                    Observation::Duplicate
                })
            }
            (Some(DecidedBy::Lookup), CommandStatus::Failed | CommandStatus::Cancelled)
                if state.first_absent_at.is_some() =>
            {
                Some(Observation::Absent)
            }
            (Some(DecidedBy::Lookup | DecidedBy::Verification), CommandStatus::NoCompensation) => {
                Some(Observation::Present)
            }
            _ => None,
        };
        let args = match command.current_args().as_object() {
            Some(given) if !include_args.is_empty() => Some(
                include_args
                    .iter()
                    .filter_map(|field| Some((field.clone(), given.get(field)?.clone())))
                    .collect::<Map<_, _>>(),
            ),
            _ => None,
        };
        Self {
            run_id: Cow::Borrowed(command.run_id.as_str()),
            command_key: Cow::Borrowed(command.command_key.as_str()),
            tool: Cow::Owned(joined(command.tool.namespace(), command.tool.name())),
            status,
            tenant: Cow::Borrowed(command.tenant()),
            submitted_by: command.submitted_by.as_deref().map(Cow::Borrowed),
            idempotency_key: Cow::Owned(joined(
                command.run_id.as_str(),
                command.command_key.as_str(),
            )),
            business_key: command
                .business_key
                .as_ref()
                .map(|key| Cow::Borrowed(key.as_str())),
            external_ref: state.external_ref.as_deref().map(Cow::Borrowed),
            outcome: Outcome {
                decided_by,
                observation,
                attempts: state.attempts,
                checks: state.checks,
                replays: state.replays,
                ambiguous: state.ambiguous_before,
                verification_pending: state.verify_pending,
                duplicates_owed: u32::try_from(state.owed_duplicates.len()).unwrap_or(u32::MAX),
            },
            escalated: state.escalated,
            escalation_reason: escalation.map(capped),
            last_error: state.last_error.as_deref().map(capped),
            approval: state.approval.as_ref().map(|approval| ApprovalSummary {
                at: approval.at,
                policy_version: approval.policy_version.clone(),
            }),
            compensation: state.compensation.as_ref().map(|info| CompensationSummary {
                started_at: info.started_at,
                ended_at: info.ended_at,
                reference: info.reference.clone(),
                attempts: info.attempts,
            }),
            submitted_at: command.created_at,
            updated_at: state.updated_at,
            args,
        }
    }

    /// The JSON payload.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a reader of the bus needs of an effect event to know where its command stands: the
/// fields every version of the payload has, the stored command that builds before this
/// contract published included (which has `status` and `updated_at` under the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct EventState {
    pub status: CommandStatus,
    pub updated_at: Timestamp,
}

/// The payload of every `dev.sluice.flow.*.v1` event: a tool's or upstream's pause and circuit
/// breaker after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowEvent {
    /// The tool or upstream.
    pub name: String,
    /// `paused`, `resumed`, `breaker_opened`, `breaker_half_open` or `breaker_closed`.
    pub change: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<FlowPause>,
    pub breaker: FlowBreaker,
}

/// An operator's pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowPause {
    pub actor: String,
    pub reason: String,
    pub at: Timestamp,
}

/// A circuit breaker's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowBreaker {
    /// `closed`, `open` or `half_open`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// When an open breaker lets its probe go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_at: Option<Timestamp>,
    /// How many times in a row it opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl FlowEvent {
    /// The projection of `control` after the change `change`.
    pub fn project(control: &crate::flow::FlowControl, change: &str) -> Self {
        use crate::flow::Breaker;
        let breaker = match &control.breaker {
            Breaker::Closed => FlowBreaker {
                state: "closed".into(),
                since: None,
                probe_at: None,
                opened: None,
                reason: None,
            },
            Breaker::Open {
                since,
                probe_at,
                opened,
                reason,
            } => FlowBreaker {
                state: "open".into(),
                since: Some(*since),
                probe_at: Some(*probe_at),
                opened: Some(*opened),
                reason: Some(capped(reason).into_owned()),
            },
            Breaker::HalfOpen { since, opened, .. } => FlowBreaker {
                state: "half_open".into(),
                since: Some(*since),
                probe_at: None,
                opened: Some(*opened),
                reason: None,
            },
        };
        Self {
            name: control.name.clone(),
            change: change.to_owned(),
            pause: control.paused.as_ref().map(|pause| FlowPause {
                actor: pause.actor.clone(),
                reason: capped(&pause.reason).into_owned(),
                at: pause.at,
            }),
            breaker,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_carry_their_version_and_schema() {
        assert_eq!(
            effect_type(CommandStatus::NoCompensation),
            "dev.sluice.effect.no_compensation.v1"
        );
        assert_eq!(
            flow_type("breaker_opened"),
            "dev.sluice.flow.breaker_opened.v1"
        );
        assert_eq!(
            dataschema(ESCALATED_TYPE),
            "https://sluice.dev/schemas/events/dev.sluice.effect.escalated.v1.json"
        );
        assert_eq!(
            split_version("dev.sluice.effect.stuck.v12"),
            ("dev.sluice.effect.stuck", Some(12))
        );
        assert_eq!(
            split_version("dev.sluice.effect.stuck"),
            ("dev.sluice.effect.stuck", None)
        );
        assert_eq!(split_version("a.v"), ("a.v", None));
        assert_eq!(split_version("a.vx1"), ("a.vx1", None));
        for status in PUBLISHED {
            assert_eq!(status_of_type(&effect_type(status)), Some(status));
        }
        assert_eq!(
            status_of_type("dev.sluice.effect.confirmed"),
            Some(CommandStatus::Confirmed),
            "a type of a build before versions"
        );
        assert_eq!(status_of_type(ESCALATED_TYPE), None);
        assert_eq!(status_of_type("dev.sluice.flow.paused.v1"), None);
        assert_eq!(status_of_type("dev.sluice.effect.done.v1"), None);
    }

    #[test]
    fn unversioned_patterns_take_version_one() {
        let kind = effect_type(CommandStatus::Stuck);
        assert!(type_matches("dev.sluice.effect.stuck", &kind));
        assert!(type_matches("dev.sluice.effect.stuck.v1", &kind));
        assert!(type_matches("dev.sluice.effect.*", &kind));
        assert!(type_matches("*", &kind));
        assert!(type_matches(
            "dev.sluice.effect.stuck",
            "dev.sluice.effect.stuck"
        ));
        assert!(!type_matches(
            "dev.sluice.effect.stuck",
            "dev.sluice.effect.stuck.v2"
        ));
        assert!(!type_matches(
            "dev.sluice.effect.stuck.v1",
            "dev.sluice.effect.stuck.v2"
        ));
        assert!(!type_matches(
            "dev.sluice.effect.stuck",
            "dev.sluice.effect.stuck_again.v1"
        ));
        assert!(!type_matches(
            "dev.sluice.effect.stuck.v1",
            "dev.sluice.effect.stuck"
        ));
    }

    #[test]
    fn what_decided_a_final_status() {
        use CommandStatus as S;
        assert_eq!(
            DecidedBy::of(S::Leased, S::Confirmed, false),
            Some(DecidedBy::Call)
        );
        assert_eq!(
            DecidedBy::of(S::Unknown, S::Failed, false),
            Some(DecidedBy::Lookup)
        );
        assert_eq!(
            DecidedBy::of(S::Stuck, S::Confirmed, false),
            Some(DecidedBy::Person)
        );
        assert_eq!(
            DecidedBy::of(S::Blocked, S::Cancelled, true),
            Some(DecidedBy::ApprovalTimeout)
        );
        assert_eq!(
            DecidedBy::of(S::Blocked, S::Cancelled, false),
            Some(DecidedBy::Person)
        );
        assert_eq!(
            DecidedBy::of(S::Pending, S::Failed, false),
            Some(DecidedBy::Policy)
        );
        assert_eq!(
            DecidedBy::of(S::Compensating, S::Compensated, false),
            Some(DecidedBy::Compensation)
        );
        assert_eq!(
            DecidedBy::of(S::Failed, S::NoCompensation, true),
            Some(DecidedBy::Verification)
        );
        assert_eq!(DecidedBy::of(S::Unknown, S::Stuck, true), None, "not final");
        assert_eq!(
            DecidedBy::of(S::Pending, S::Blocked, false),
            None,
            "not final"
        );
    }

    #[test]
    fn long_texts_are_capped_at_a_character_boundary() {
        let long = "é".repeat(MAX_TEXT);
        let cut = capped(&long);
        assert!(cut.len() <= MAX_TEXT, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(capped("short"), "short");
    }
}
