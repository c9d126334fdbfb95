//! The `sluice` command: `sluice dev` (the four services in one process on the embedded ledger
//! and bus), `sluice demo`, `sluice bench`, `sluice mcp`, `sluice health` (the
//! image's healthcheck) and the operator console.

pub mod bench;
pub mod catalog_cmd;
pub mod console;
pub mod demo;
pub mod dev;
pub mod devdir;
pub mod health;
pub mod mcp;
pub mod migrate;
pub mod webhooks_cmd;
