//! The four services in one process on the embedded ledger and bus: `sluice dev` ([`dev`], its
//! data directory [`devdir`]), `sluice demo` (agents against a fault-injecting upstream,
//! checked for lost, doubled or unaudited effects) and `sluice bench` (effects per second and
//! their latency).

pub mod bench;
pub mod demo;
pub mod dev;
pub mod devdir;
