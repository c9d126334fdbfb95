//! What retention may remove: the rule both ledgers' purges apply to a run.
//!
//! A purge deletes a run's commands, audit records and business keys. A command whose status is
//! terminal can still owe work: a last look (`verify_pending`) that may find a late or second
//! commit to undo, or the clean-up of extra commits already found (`owed_duplicates`). Its due
//! time brings the sweep back to it; deleting it would drop that work for good and free its
//! business key, so the same wire would be taken as new. So a run goes only when every command
//! is terminal and at rest ([`CommandState::at_rest`]); a run whose commands are all terminal
//! but one still owes work is kept, and the purge says which and why.

//!
//! When a purge runs is decided here too ([`purge_step`]): retention is on by default
//! ([`DEFAULT_RETENTION_DAYS`]); the reconciler purges on a schedule under a lease, so one
//! replica purges at a time, and `retention_days = 0` keeps everything.

use serde::{Deserialize, Serialize};

use crate::command::{CommandState, CommandStatus};
use crate::ids::CommandKey;
use crate::sweep::ShardLease;
use crate::time::Timestamp;

/// How long a finished run is kept unless configured: a month covers the questions people ask
/// of recent work (a dispute, a refund, a month-end reconciliation) while keeping a ledger
/// taking a steady load bounded at a month of it. Longer history belongs in an archive fed by
/// the events topic, not in the ledger every LWT and sweep works against.
pub const DEFAULT_RETENTION_DAYS: u32 = 30;
/// How often a purge is due unless configured: hourly keeps each purge small (an hour of
/// finished runs) without the schedule costing anything worth counting.
pub const DEFAULT_PURGE_EVERY_MS: u64 = 3_600_000;
/// The sweep group whose shard-0 lease is the purge lease.
pub const PURGE_GROUP: &str = "sluice-retention";
/// The one shard of [`PURGE_GROUP`].
pub const PURGE_SHARD: u32 = 0;

/// Retention as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// A finished run is purged once unchanged this long; 0 keeps everything.
    pub keep_ms: i64,
    /// A purge is due this often; its lease lasts as long.
    pub every_ms: i64,
    /// The clock-skew bound: another replica may see the lease lapse this much early.
    pub skew_ms: i64,
}

/// What a reconciler does about retention now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurgeStep {
    /// Retention is off (`retention_days = 0`): nothing is ever purged by schedule.
    Off,
    /// This interval's purge is another replica's or done: look again at `until`.
    Wait { until: Timestamp },
    /// Take the purge lease (a compare-and-set from `guard`, `None`: never taken) by writing
    /// `lease`; the one that wins purges the runs finished before `cutoff`, starting no purge
    /// call after `stop_by` (so it ends before another replica may take the lease).
    Purge {
        guard: Option<u64>,
        lease: ShardLease,
        cutoff: Timestamp,
        stop_by: Timestamp,
    },
}

/// The step for replica `me` at `now`, given the purge lease as stored. A purge is due when
/// the last one's lease has lapsed: the lease is held for the whole interval, not given back
/// after the purge, so it is both the lock and the schedule, and a replica that died
/// mid-purge leaves the next purge to whoever sees the lease lapse.
pub fn purge_step(
    retention: &Retention,
    me: &str,
    now: Timestamp,
    stored: Option<&ShardLease>,
) -> PurgeStep {
    if retention.keep_ms <= 0 {
        return PurgeStep::Off;
    }
    if let Some(lease) = stored
        && lease.live(now)
    {
        return PurgeStep::Wait {
            until: lease.expires_at,
        };
    }
    let every = retention.every_ms.max(1);
    let expires_at = now.plus_millis(every);
    // Leave the skew bound, and a tenth of the interval for the last call to finish in.
    let stop_by = expires_at.plus_millis(-(retention.skew_ms.max(0) + every / 10));
    PurgeStep::Purge {
        guard: stored.map(|lease| lease.epoch),
        lease: ShardLease {
            shard: PURGE_SHARD,
            holder: me.to_owned(),
            epoch: stored.map_or(1, |lease| lease.epoch + 1),
            expires_at,
        },
        cutoff: now.plus_millis(-retention.keep_ms),
        stop_by,
    }
}

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

/// Whether a purge pass that must stop by `stop_by` (its [`PurgeStep::Purge`]) is out of time
/// at `now`: it stops before its lease could lapse under it.
pub fn pass_out_of_time(now: Timestamp, stop_by: Timestamp) -> bool {
    now >= stop_by
}

/// Why an operator's purge cutoff (`older_than`) is refused at `now`, if it is: a cutoff in the
/// future would take runs finished after the request.
pub fn check_cutoff(older_than: Timestamp, now: Timestamp) -> Result<(), &'static str> {
    if older_than > now {
        return Err("older_than is in the future: a cutoff must be in the past");
    }
    Ok(())
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

    const RETENTION: Retention = Retention {
        keep_ms: 30 * 86_400_000,
        every_ms: 3_600_000,
        skew_ms: 500,
    };

    fn lease(holder: &str, epoch: u64, expires_at: i64) -> ShardLease {
        ShardLease {
            shard: PURGE_SHARD,
            holder: holder.into(),
            epoch,
            expires_at: at(expires_at),
        }
    }

    #[test]
    fn a_purge_is_due_when_the_last_ones_lease_lapsed_and_never_with_retention_off() {
        let now = at(100 * 86_400_000);
        let PurgeStep::Purge {
            guard,
            lease: taken,
            cutoff,
            stop_by,
        } = purge_step(&RETENTION, "r-1", now, None)
        else {
            panic!("due on a fresh ledger");
        };
        assert_eq!(guard, None);
        assert_eq!(taken, lease("r-1", 1, now.as_millis() + 3_600_000));
        assert_eq!(cutoff, at(70 * 86_400_000));
        assert!(stop_by < taken.expires_at && stop_by > now, "{stop_by}");

        // Held by anyone, itself included, for the interval: nobody purges again until then.
        for holder in ["r-1", "r-2"] {
            let held = lease(holder, 4, now.as_millis() + 10);
            assert_eq!(
                purge_step(&RETENTION, "r-1", now, Some(&held)),
                PurgeStep::Wait {
                    until: held.expires_at
                }
            );
        }
        // Lapsed: taken over from its epoch.
        let lapsed = lease("r-2", 4, now.as_millis());
        assert!(matches!(
            purge_step(&RETENTION, "r-1", now, Some(&lapsed)),
            PurgeStep::Purge { guard: Some(4), lease, .. } if lease.epoch == 5 && lease.holder == "r-1"
        ));
        let off = Retention {
            keep_ms: 0,
            ..RETENTION
        };
        assert_eq!(purge_step(&off, "r-1", now, Some(&lapsed)), PurgeStep::Off);
        assert_eq!(purge_step(&off, "r-1", now, None), PurgeStep::Off);
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

    #[test]
    fn a_purge_cutoff_may_be_now_or_before_but_not_later() {
        assert_eq!(check_cutoff(at(1_000), at(1_000)), Ok(()));
        assert_eq!(check_cutoff(at(999), at(1_000)), Ok(()));
        assert!(check_cutoff(at(1_001), at(1_000)).is_err());
    }
}
