//! The seeded fault runner (being built): its ground-truth upstream so far.

pub mod dice;
pub mod upstream;
