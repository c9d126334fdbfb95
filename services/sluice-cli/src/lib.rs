//! The `sluice` command's operator commands, each a client of a running deployment or of its
//! configuration: the console (`sluice runs`, `approve`, …, on the producer's HTTP API),
//! `sluice catalog` (a catalog checked, its requests shown), `sluice webhooks`, `sluice migrate`
//! (the ledger schema and bus topics) and `sluice health` (the image's healthcheck).

pub mod catalog_cmd;
pub mod console;
pub mod health;
pub mod migrate;
pub mod webhooks_cmd;
