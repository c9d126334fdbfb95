//! How a stored command is read back, the same for every ledger (the `identity` and `state`
//! JSON of SQLite and CQL alike), so that a rolling upgrade sends no command to a person.
//!
//! * **What a newer build adds is tolerated.** Neither [`Identity`] nor
//!   [`sluice_core::command::CommandState`] refuses fields it does not know, and every field
//!   added since the first release has a default: an older build reads a newer row as far as
//!   it understands it. (It writes back only through the state machine, which rebuilds the
//!   whole state; a field a newer build added is then lost, which is why a newer field must be
//!   advisory to older builds: docs/operations.md, "Upgrading Sluice".)
//! * **A status this build does not know is left to a newer service**
//!   ([`LedgerError::NewerCommand`]): its state names a status of a status's shape
//!   ([`is_newer_status`]) that is not one of this build's. Neither quarantined nor escalated:
//!   sweeps pass over it (it stays in the due index, where a newer reconciler finds it), a
//!   purge keeps its run, and a message about it is acknowledged and counted
//!   (`sluice_messages_skipped_total{reason="newer_command"}`).
//! * **Anything else that does not decode is damage** ([`LedgerError::UndecodableCommand`]):
//!   not JSON, a bad key, a status that is no status's shape. Quarantined as before.

use serde_json::Value;

use sluice_core::command::{Command, CommandState, CommandStatus};

use crate::LedgerError;
use crate::identity::Identity;

/// Longest status name read as a newer build's; a longer one is damage.
const MAX_STATUS_LEN: usize = 64;

/// Whether `status` is a status only a newer build knows: a status name's shape (upper-case
/// ASCII letters, digits and underscores, starting with a letter) that this build does not
/// know. Lower case is refused too: every build writes status names in upper case.
pub fn is_newer_status(status: &str) -> bool {
    status.len() <= MAX_STATUS_LEN
        && status.starts_with(|c: char| c.is_ascii_uppercase())
        && status
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && !CommandStatus::ALL.iter().any(|s| s.as_str() == status)
}

/// The state stored for `run_id`/`command_key`.
pub fn state(run_id: &str, command_key: &str, text: &str) -> Result<CommandState, LedgerError> {
    serde_json::from_str(text).map_err(|e| {
        let newer = serde_json::from_str::<Value>(text).ok().and_then(|value| {
            value
                .get("status")
                .and_then(Value::as_str)
                .filter(|status| is_newer_status(status))
                .map(str::to_owned)
        });
        match newer {
            Some(status) => LedgerError::NewerCommand {
                run_id: run_id.to_owned(),
                command_key: command_key.to_owned(),
                status,
            },
            None => undecodable(run_id, command_key, "command state", &e),
        }
    })
}

/// The fixed part stored for `run_id`/`command_key`.
pub fn identity(run_id: &str, command_key: &str, text: &str) -> Result<Identity, LedgerError> {
    serde_json::from_str(text).map_err(|e| undecodable(run_id, command_key, "command", &e))
}

/// The command stored for `run_id`/`command_key`. Its state is read first: a row of a newer
/// status is the newer build's whatever else it holds.
pub fn command(
    run_id: &str,
    command_key: &str,
    identity_text: &str,
    state_text: &str,
) -> Result<Command, LedgerError> {
    let state = state(run_id, command_key, state_text)?;
    Ok(identity(run_id, command_key, identity_text)?.with_state(state))
}

fn undecodable(
    run_id: &str,
    command_key: &str,
    what: &'static str,
    e: &serde_json::Error,
) -> LedgerError {
    LedgerError::UndecodableCommand {
        run_id: run_id.to_owned(),
        command_key: command_key.to_owned(),
        what,
        why: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_status_is_told_from_damage() {
        assert!(is_newer_status("HIBERNATING"));
        assert!(is_newer_status("WAITING_FOR_2FA"));
        for not_newer in ["CONFIRMED", "", "hibernating", "_X", "X Y", &"X".repeat(65)] {
            assert!(!is_newer_status(not_newer), "{not_newer:?}");
        }
    }

    #[test]
    fn a_state_with_fields_a_newer_build_added_reads_and_a_newer_status_is_left() {
        let state = state(
            "r-1",
            "d-1/email/send/0",
            r#"{"status":"PENDING","attempts":2,"updated_at":"2026-01-01T00:00:00Z","added_by_a_newer_build":{"x":1}}"#,
        )
        .expect("an added field is tolerated");
        assert_eq!((state.status, state.attempts), (CommandStatus::Pending, 2));
        let newer = super::state(
            "r-1",
            "d-1/email/send/0",
            r#"{"status":"HIBERNATING","attempts":2,"updated_at":"2026-01-01T00:00:00Z"}"#,
        )
        .expect_err("a newer status");
        assert!(
            matches!(&newer, LedgerError::NewerCommand { status, .. } if status == "HIBERNATING"),
            "{newer}"
        );
        for damaged in [
            r#"{"status":"#,
            r#"{"status":"hibernating"}"#,
            r#"{"attempts":1}"#,
        ] {
            let err = super::state("r-1", "d-1/email/send/0", damaged).expect_err("damaged");
            assert!(
                matches!(err, LedgerError::UndecodableCommand { .. }),
                "{damaged}: {err}"
            );
        }
    }
}
