//! The Sluice demo upstream: the world Sluice's tools change in `sluice demo` and in the
//! end-to-end tests. A small bank, mail, ticket and search service over real HTTP on loopback,
//! with in-memory state, that injects faults so that reconciliation can be exercised and
//! checked.
//!
//! * [`faults`] — what can go wrong ([`FaultKind`]), at which rates ([`Faults`]), and the pure
//!   choice of a fault from one seeded draw.
//! * `world` — the in-memory bank (NON-idempotent: it books every request), mailbox and ticket
//!   desk (both deduplicate by Idempotency-Key), and the [`Stats`] they report.
//! * `http` — the routes and the acting out of faults.
//! * `server` — [`Upstream`]: binding, the accept loop that can drop a connection without a
//!   response, and shutdown.
//!
//! The endpoints follow the wire contract (docs/architecture.md, "Wire contract"):
//!
//! | request | answer |
//! | --- | --- |
//! | `POST /bank/wires` `{account, amount_minor, beneficiary, date, reference?}` | 201 `{"id": "w-<n>", "status": "booked", …}` |
//! | `GET /bank/wires/by-key/{business_key}` | 200 the wire, 404 none, 409 `{"id", "refs"}` when several stand |
//! | `GET /bank/wires/{id}` | 200 the wire, 404 |
//! | `POST /bank/wires/{id}/reverse` | 200 `{"id": "rev-<n>"}`, 404 unknown, 409 already reversed |
//! | `POST /email/messages` `{to, subject, body}` | 201 `{"id": "m-<n>"}`, 200 for a repeated Idempotency-Key |
//! | `POST /tickets` `{title, body?, priority?}` | 201 `{"id": "t-<n>"}`, 200 for a repeated Idempotency-Key |
//! | `POST /tickets/{id}/close` | 200 `{"id", "status": "closed"}`, 404 |
//! | `POST /search` `{query, limit?}` | 200 `{"results": […]}` |
//! | `GET /_stats` | [`Stats`] |
//! | `GET /_faults`, `POST /_faults` | [`Faults`] (422 when invalid) |
//!
//! The business key of a wire is the `X-Sluice-Business-Key` header, or
//! `{account}:{beneficiary}:{amount_minor}:{date}` without it. Faults apply to the three dispatch endpoints
//! (`POST /bank/wires`, `/email/messages`, `/tickets`) and, as `status_inconclusive`, to the
//! by-key lookup; compensations and reads are never faulted.

pub mod faults;
mod http;
mod server;
mod world;

pub use faults::{Family, FaultCounts, FaultKind, FaultRates, Faults, FaultsError};
pub use server::{SHUTDOWN_GRACE, Upstream, UpstreamHandle};
pub use world::Stats;
