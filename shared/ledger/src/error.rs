//! Ledger errors. Each names what it concerns (run, command, file) and what to do about it.

use std::path::PathBuf;

use thiserror::Error;

#[derive(Debug, Error)]
pub enum LedgerError {
    /// The same command key was reserved before with other arguments. Never merged.
    #[error(
        "command {run_id}/{command_key} was reserved with other arguments (stored hash {stored}, presented {presented}); use a new call index for a new effect"
    )]
    ArgumentDrift {
        run_id: String,
        command_key: String,
        stored: String,
        presented: String,
    },
    /// The run was rolled back and takes no new commands (its existing ones still replay).
    #[error(
        "run {run_id} was rolled back and takes no new effects ({command_key} is new); start a new run"
    )]
    RunClosed { run_id: String, command_key: String },
    /// An agent confined to its own runs (see [`crate::CommandStore::reserve_own`]) reserved in a
    /// run that holds a command someone else submitted. Nothing was written.
    #[error(
        "run {run_id} holds a command not submitted by {submitter} ({other}); an agent adds effects to its own runs only"
    )]
    ForeignRun {
        run_id: String,
        submitter: String,
        /// Who submitted the other command, as stored ("nobody" when no one was named).
        other: String,
    },
    /// The caller asked for something the contract does not allow.
    #[error("invalid ledger request for {run_id}/{command_key}: {why}")]
    InvalidRequest {
        run_id: String,
        command_key: String,
        why: String,
    },
    /// The file exists but is not a Sluice ledger, or is damaged.
    #[error(
        "{path} is not a usable Sluice ledger: {why}; point data_dir at another directory or restore the file from a backup"
    )]
    Corrupt { path: PathBuf, why: String },
    /// The file was written by a newer Sluice.
    #[error(
        "{path} has ledger schema version {found}, this build understands up to {supported}; upgrade Sluice"
    )]
    SchemaTooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    /// Another process kept the database locked longer than the busy timeout.
    #[error(
        "{path} stayed locked by another process for longer than {timeout_ms} ms; nothing was written, try again"
    )]
    Locked { path: PathBuf, timeout_ms: u64 },
    /// The disk (or the configured size limit) is full. Nothing of the operation was written.
    #[error(
        "{path} is full (disk or configured size limit); nothing was written, free space and try again"
    )]
    Full { path: PathBuf },
    /// The ledger directory or file could not be opened or created.
    #[error("cannot open ledger at {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A stored command cannot be decoded (a damaged row, or one written by a build that
    /// stores what this one cannot read). Nothing can act on it until a person repairs or
    /// removes the row, so the ledger sets it aside (see [`crate::quarantine`]): sweeps skip
    /// it, and a service that meets it dead-letters its message instead of retrying.
    #[error(
        "stored command {run_id}/{command_key} cannot be decoded ({what}: {why}); it is quarantined until a person repairs or removes the row"
    )]
    UndecodableCommand {
        run_id: String,
        command_key: String,
        what: &'static str,
        why: String,
    },
    /// A stored command is of a status this build does not know: a newer Sluice wrote it
    /// (during a rolling upgrade, or after a rollback of this service). Not damage: the row is
    /// left as it is, for a newer service to act on; this build's sweeps pass over it, keeping
    /// it in the due index, and a message about it is acknowledged without a dead letter
    /// (see [`crate::stored`]).
    #[error(
        "stored command {run_id}/{command_key} has status {status:?}, which this build does not know; a newer Sluice wrote it and a newer service will act on it"
    )]
    NewerCommand {
        run_id: String,
        command_key: String,
        status: String,
    },
    /// A stored value could not be decoded.
    #[error("stored {what} of {run_id} cannot be decoded: {why}")]
    Decode {
        what: &'static str,
        run_id: String,
        why: String,
    },
    /// Any other storage failure, with the operation it happened in.
    #[error("ledger storage failed during {op}")]
    Storage {
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The ledger is shutting down or its writer stopped.
    #[error("the ledger is closed")]
    Closed,
}

impl LedgerError {
    /// The refusal of `command`, confined to its submitter's runs, in a run holding a command
    /// submitted by `other` (`None`: by no one named).
    pub fn foreign_run(command: &sluice_core::command::Command, other: Option<&str>) -> Self {
        Self::ForeignRun {
            run_id: command.run_id.to_string(),
            submitter: command
                .submitted_by
                .as_deref()
                .unwrap_or("nobody")
                .to_owned(),
            other: other.unwrap_or("nobody").to_owned(),
        }
    }

    /// Worth retrying the same request later (nothing was written).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Locked { .. } | Self::Full { .. } | Self::Closed)
    }
}
