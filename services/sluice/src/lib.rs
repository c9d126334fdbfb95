//! The `sluice` command: `sluice dev` (the four services in one process on the embedded ledger
//! and bus), `sluice demo` and `sluice bench`.

pub mod bench;
pub mod demo;
pub mod dev;
pub mod migrate;
