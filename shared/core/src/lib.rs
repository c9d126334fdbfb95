//! The pure core of Sluice: everything every service agrees on, with no IO.
//!
//! * [`ids`] — validated identifiers: run id, command key, idempotency key, tool name, epoch.
//! * [`command`] — the command record, its semantics and statuses.
//! * [`events`] — the public event contract: versioned types and the payload projection.
//! * [`machine`] — the state machine: `(state, event) -> step | refusal`, pure and total.
//! * [`canonical`] — canonical JSON and the argument hash that detects drift.
//! * [`catalog`] — the tool catalog, loaded from TOML and validated once at start.
//! * [`load`] — bounds on the work per effect when the ledger or the bus falls behind.
//! * [`policy`] — deterministic policy checks against a command's stored arguments.
//! * [`audit`] — the per-run audit hash chain and its verification.
//! * [`budget`] — spend budgets: which cover a command, whether it fits, what a status change releases.
//! * [`browser`] — which requests the API serves, judged by what a browser could have made of them.
//! * [`retention`] — which runs a purge may remove, and what keeps the others.
//! * [`sweep`] — due-index shards and the plan by which reconcilers split them.
//! * [`tenant`] — whose effects a command counts against, and the per-tenant quota of effects in flight.
//! * [`time`] — millisecond timestamps and the `Clock` port.
//! * [`trace`] — the W3C trace context a command carries from the agent's call onwards.
//! * [`secret`] — [`Secret`], a configuration value that is never shown.
//! * [`webhook`] — which events a webhook subscription takes, and each delivery's retries.

pub mod approval_link;
pub mod audit;
pub mod browser;
pub mod budget;
pub mod callback;
pub mod canonical;
pub mod catalog;
pub mod command;
pub mod error;
pub mod events;
pub mod evidence;
pub mod flow;
pub mod ids;
pub mod journal;
pub mod load;
pub mod machine;
pub mod policy;
pub mod replay;
pub mod retention;
pub mod revision;
pub mod secret;
pub mod sweep;
pub mod tenant;
pub mod time;
pub mod trace;
pub mod webhook;

pub use audit::{AuditDraft, AuditEntry, AuditRecord, BrokenLink, ChainHead, Checkpoint};
pub use command::{Command, CommandState, CommandStatus, EffectSemantics, Observation};
pub use ids::{ArgsHash, BusinessKey, CommandKey, IdempotencyKey, LeaseEpoch, RunId, ToolName};
pub use machine::{Action, Event, Refusal, Rules, Step};
pub use secret::Secret;
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
