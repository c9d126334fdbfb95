//! What retention may remove: the rule both ledgers' purges apply to a run.
//!
//! A purge deletes a run's commands, audit records and business keys. A command whose status is
//! terminal can still owe work: a last look (`verify_pending`) that may find a late or second
//! commit to undo, or the clean-up of extra commits already found (`owed_duplicates`). Its due
//! time brings the sweep back to it; deleting it would drop that work for good and free its
//! business key, so the same wire would be taken as new. So a run goes only when every command
//! is terminal and at rest ([`CommandState::at_rest`]); a run whose commands are all terminal
//! but one still owes work is kept, and the purge says which and why.

use serde::{Deserialize, Serialize};

use crate::command::{CommandState, CommandStatus};
use crate::ids::CommandKey;

/// Work the pipeline still owes a command, whatever its status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owed {
    /// Extra commits a look found are still to be compensated (`owed_duplicates`).
    DuplicateCleanUp,
    /// A last look is still to come (`verify_pending`): a late or second commit may yet be
    /// found and undone.
    LastLook,
    /// Something else is still due for a sweep (the command has a due time).
    Due,
}

impl Owed {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DuplicateCleanUp => "duplicate_clean_up",
            Self::LastLook => "last_look",
            Self::Due => "due",
        }
    }

    /// What the command owes, for a settled one: the clean-up of a duplicate first (a second
    /// effect stands until then), then the last look, then any other due time. `None` when
    /// the command is at rest ([`CommandState::at_rest`]) and owes nothing.
    pub fn of(state: &CommandState) -> Option<Self> {
        if !state.owed_duplicates.is_empty() {
            Some(Self::DuplicateCleanUp)
        } else if state.verify_pending {
            Some(Self::LastLook)
        } else if state.status.is_settled() && !state.at_rest() {
            Some(Self::Due)
        } else {
            None
        }
    }
}

impl std::fmt::Display for Owed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a purge does with a run whose last change is older than its cutoff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeVerdict {
    /// Every command is terminal and owes nothing: the run goes.
    Purge,
    /// A command is not terminal (in flight, or waiting for a person): the run is open, and
    /// stays without comment.
    Open {
        command_key: CommandKey,
        status: CommandStatus,
    },
    /// Every command is terminal, but this one still owes work: the run stays, and the purge
    /// reports it.
    Owes { command_key: CommandKey, owed: Owed },
}

/// The verdict on a run from its commands (an empty run goes). An open command wins over one
/// that owes work: a run is reported as kept only when nothing but the owed work keeps it.
pub fn purge_verdict<'a>(
    commands: impl IntoIterator<Item = (&'a CommandKey, &'a CommandState)>,
) -> PurgeVerdict {
    let mut verdict = PurgeVerdict::Purge;
    for (command_key, state) in commands {
        if !state.status.is_terminal() {
            return PurgeVerdict::Open {
                command_key: command_key.clone(),
                status: state.status,
            };
        }
        if let (PurgeVerdict::Purge, Some(owed)) = (&verdict, Owed::of(state)) {
            verdict = PurgeVerdict::Owes {
                command_key: command_key.clone(),
                owed,
            };
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ToolName;
    use crate::time::Timestamp;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn key(call_idx: u32) -> CommandKey {
        CommandKey::new(
            0,
            ToolName::parse("payments/wire").expect("valid"),
            call_idx,
        )
    }

    fn settled(status: CommandStatus) -> CommandState {
        let mut state = CommandState::reserved(at(0), None, 10_000);
        state.status = status;
        state.due_at = None;
        state
    }

    #[test]
    fn a_terminal_command_at_rest_owes_nothing() {
        for status in CommandStatus::ALL.into_iter().filter(|s| s.is_terminal()) {
            assert_eq!(Owed::of(&settled(status)), None, "{status}");
        }
    }

    #[test]
    fn owed_work_is_named_the_duplicate_first() {
        let mut look = settled(CommandStatus::Confirmed);
        look.verify_pending = true;
        look.due_at = Some(at(5));
        assert_eq!(Owed::of(&look), Some(Owed::LastLook));
        let mut both = look.clone();
        both.owed_duplicates = vec!["w-2".into()];
        assert_eq!(Owed::of(&both), Some(Owed::DuplicateCleanUp));
        // Owed work is owed even where a due time was lost: the flags decide, not the index.
        let mut undated = look;
        undated.due_at = None;
        assert_eq!(Owed::of(&undated), Some(Owed::LastLook));
        let mut due = settled(CommandStatus::Failed);
        due.due_at = Some(at(5));
        assert_eq!(Owed::of(&due), Some(Owed::Due));
    }

    #[test]
    fn a_run_goes_only_when_every_command_is_terminal_and_owes_nothing() {
        let (a, b) = (key(0), key(1));
        let done = settled(CommandStatus::Confirmed);
        assert_eq!(purge_verdict([]), PurgeVerdict::Purge);
        assert_eq!(
            purge_verdict([(&a, &done), (&b, &settled(CommandStatus::Compensated))]),
            PurgeVerdict::Purge
        );

        let mut look = settled(CommandStatus::Cancelled);
        look.verify_pending = true;
        look.due_at = Some(at(5));
        assert_eq!(
            purge_verdict([(&a, &done), (&b, &look)]),
            PurgeVerdict::Owes {
                command_key: b.clone(),
                owed: Owed::LastLook
            }
        );

        // STUCK and BLOCKED wait for a person; in flight is in flight: open, whatever else.
        for status in [
            CommandStatus::Stuck,
            CommandStatus::Blocked,
            CommandStatus::Compensating,
        ] {
            let open = settled(status);
            assert_eq!(
                purge_verdict([(&a, &look), (&b, &open)]),
                PurgeVerdict::Open {
                    command_key: b.clone(),
                    status
                },
                "{status}"
            );
        }
    }
}
