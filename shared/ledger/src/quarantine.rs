//! Commands a ledger cannot decode, set aside so that they stop nobody else.
//!
//! A command row whose stored JSON or columns do not decode (a damaged row, or one a build
//! stored that this build cannot read) is reported as [`LedgerError::UndecodableCommand`],
//! naming its run and key. Every later read of the same command fails the same way, so what
//! reads many commands must not fail whole because of one: a ledger remembers each such command
//! here the first time it meets it (logged at error level, counted for
//! `sluice_ledger_quarantined_commands_total`), and its `due` skips the commands held here —
//! and any it cannot parse itself — instead of failing the sweep or returning them to every
//! sweep again (with enough of them, they would fill each sweep's batch).
//!
//! The quarantine is this process's, in memory, on purpose: the row and its due time stay as
//! they are, so a repaired row, or a newer build that can read it, takes it up again (after a
//! restart of this process, the first read meets it once more and sets it aside again). A
//! person must look: the log line names the command and why it cannot be read.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::LedgerError;

/// Commands held at most; past it a new one is still logged and counted, not held.
pub const QUARANTINE_CAPACITY: usize = 10_000;

/// The commands one ledger handle has set aside, and those it left to a newer build.
#[derive(Debug, Default)]
pub struct Quarantine {
    held: Mutex<HashSet<(String, String)>>,
    count: AtomicU64,
    /// Commands of a status only a newer build knows ([`crate::stored`]), met so far: not
    /// held (nothing is wrong with them), only remembered so each is logged and counted once.
    newer: Mutex<HashSet<(String, String)>>,
    newer_count: AtomicU64,
}

impl Quarantine {
    /// Sets the command aside if `error` says it cannot be decoded, notes it if a newer build
    /// wrote it. Returns `error`.
    pub fn note(&self, error: LedgerError) -> LedgerError {
        match &error {
            LedgerError::UndecodableCommand {
                run_id,
                command_key,
                ..
            } => self.set_aside(run_id, command_key, &error.to_string()),
            LedgerError::NewerCommand {
                run_id,
                command_key,
                status,
            } => self.left_for_newer(run_id, command_key, status),
            _ => {}
        }
        error
    }

    /// Notes a command of a status only a newer build knows: logged and counted the first
    /// time. Not set aside: sweeps pass over it because they cannot read its status, and a
    /// newer build acts on it.
    pub fn left_for_newer(&self, run_id: &str, command_key: &str, status: &str) {
        let Ok(mut met) = self.newer.lock() else {
            return;
        };
        let key = (run_id.to_owned(), command_key.to_owned());
        if met.contains(&key) {
            return;
        }
        if met.len() < QUARANTINE_CAPACITY {
            met.insert(key);
        }
        drop(met);
        self.newer_count.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            run_id,
            command_key,
            status,
            "command of a status a newer Sluice wrote: left to a newer service (this build's sweeps pass over it and messages about it are skipped); expected while a rolling upgrade is under way"
        );
    }

    /// Commands of a newer build's status met since the ledger opened, each counted once.
    pub fn newer_count(&self) -> u64 {
        self.newer_count.load(Ordering::Relaxed)
    }

    /// Sets the command aside: logs and counts it the first time.
    pub fn set_aside(&self, run_id: &str, command_key: &str, why: &str) {
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        let key = (run_id.to_owned(), command_key.to_owned());
        if held.contains(&key) {
            return;
        }
        if held.len() < QUARANTINE_CAPACITY {
            held.insert(key);
        }
        drop(held);
        self.count.fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            run_id,
            command_key,
            why,
            "command quarantined: it cannot be decoded, so sweeps skip it and messages about it are dead-lettered; a person must repair or remove the row"
        );
    }

    /// Whether the command is set aside.
    pub fn holds(&self, run_id: &str, command_key: &str) -> bool {
        self.held
            .lock()
            .is_ok_and(|held| held.contains(&(run_id.to_owned(), command_key.to_owned())))
    }

    /// Commands held now.
    pub fn len(&self) -> usize {
        self.held.lock().map_or(0, |held| held.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Commands set aside since the ledger opened, each counted once.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_is_set_aside_once_and_other_errors_pass() {
        let quarantine = Quarantine::default();
        let undecodable = || LedgerError::UndecodableCommand {
            run_id: "r-1".into(),
            command_key: "d-1/payments/wire/0".into(),
            what: "command state",
            why: "EOF while parsing".into(),
        };
        assert!(matches!(
            quarantine.note(undecodable()),
            LedgerError::UndecodableCommand { .. }
        ));
        quarantine.note(undecodable());
        quarantine.note(LedgerError::Closed);
        assert_eq!((quarantine.count(), quarantine.len()), (1, 1));
        assert!(quarantine.holds("r-1", "d-1/payments/wire/0"));
        assert!(!quarantine.holds("r-1", "d-2/payments/wire/0"));
    }

    #[test]
    fn a_newer_command_is_counted_once_and_never_held() {
        let quarantine = Quarantine::default();
        let newer = || LedgerError::NewerCommand {
            run_id: "r-1".into(),
            command_key: "d-1/payments/wire/0".into(),
            status: "HIBERNATING".into(),
        };
        quarantine.note(newer());
        quarantine.note(newer());
        assert_eq!(quarantine.newer_count(), 1);
        assert_eq!((quarantine.count(), quarantine.len()), (0, 0));
        assert!(!quarantine.holds("r-1", "d-1/payments/wire/0"));
    }
}
