//! Connectors: the one place where Sluice touches the outside world on a command's behalf.
//!
//! A connector carries out what the state machine asks (`CallUpstream`, `Reconcile`,
//! `Compensate`, `CompensateDuplicate`) and answers in the core's own words — a
//! [`DispatchOutcome`], an [`Observation`] with evidence, a [`CompensationOutcome`] — so the
//! services hold no rules about HTTP status codes or socket errors.
//!
//! * [`port`] — the [`Connector`] trait, the [`StatusReport`] and the [`CompensationTarget`].
//! * [`request`] — pure: the HTTP call of each operation (URL, headers, body) for a command.
//! * [`callback`] — the signed callback URL an asynchronous tool's dispatch gives its upstream,
//!   and the redaction of its token from what the dispatch leaves behind.
//! * [`classify`] — pure: what an upstream's answer means (the classification table of the wire
//!   contract, docs/architecture.md), from a status code, headers and a size-capped body.
//! * [`retry_after`] — pure: the delay a `Retry-After` header asks for, on the answers that
//!   mean "later" by it (429, 503, 403).
//! * [`http`] — [`HttpConnector`]: it sends the calls and tells "nothing was sent" apart from
//!   "the request may have been processed".
//! * [`mcp`] — [`McpConnector`]: the gateway's, for the tools of upstream MCP servers, over an
//!   MCP client; [`Routed`] sends each tool to its connector.
//! * [`error`] — [`ConnectorError`], for the one fallible step: building the HTTP client.
//!
//! The connector calls never fail: every transport problem is an outcome the state machine
//! knows how to handle (`NotSent`, `Ambiguous`, `inconclusive`, `Retry`).
//!
//! [`DispatchOutcome`]: sluice_core::machine::DispatchOutcome
//! [`CompensationOutcome`]: sluice_core::machine::CompensationOutcome
//! [`Observation`]: sluice_core::Observation

pub mod callback;
pub mod classify;
pub mod credentials;
pub mod error;
pub mod http;
pub mod mcp;
pub mod port;
pub mod preview;
pub mod request;
pub mod retry_after;

pub use callback::CallbackSigner;
pub use error::ConnectorError;
pub use http::{HttpConnector, HttpOptions};
pub use mcp::{McpConnector, Routed};
pub use port::{CompensationTarget, Connector, StatusReport};
