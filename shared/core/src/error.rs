//! Errors of the pure core. Messages are lowercase, name the offending value and say what to do.

use thiserror::Error;

/// A malformed identifier.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdError {
    #[error("invalid run id {value:?}: {why}")]
    RunId { value: String, why: &'static str },
    #[error("invalid tool name {value:?}: {why}")]
    ToolName { value: String, why: &'static str },
    #[error("invalid command key {value:?}: {why}")]
    CommandKey { value: String, why: &'static str },
    #[error("invalid idempotency key {value:?}: {why}")]
    IdempotencyKey { value: String, why: &'static str },
}

/// A malformed or unrepresentable time.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TimeError {
    #[error("invalid time {value:?}: expected RFC 3339 such as 2026-11-22T10:00:00Z")]
    NotRfc3339 { value: String },
    #[error("time is outside the representable range")]
    OutOfRange,
}
