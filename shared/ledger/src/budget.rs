//! Spend budgets' holds (`sluice_core::budget`): the amount of each command against each
//! counter (budget, scope, window, currency) it counts against, checked and written in one
//! atomic step so that no number of racing admissions, in one process or many, holds past a
//! limit.
//!
//! A hold is keyed by the command and the counter, so holding is idempotent: a retried
//! admission, a replayed write or two producers admitting one command hold it once. Holds
//! change with the command's status in the ledger's own transition write
//! (`sluice_core::budget::hold_change`): ending FAILED, CANCELLED or COMPENSATED releases them,
//! an approval makes a deferred hold count, an operator's replay takes a released one back.

use async_trait::async_trait;
use serde::Serialize;

use sluice_core::audit::AuditDraft;
use sluice_core::budget::{BudgetCounter, BudgetLine};
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};

use crate::{LedgerError, Reserved};

/// The tag of one submission of a command: its argument hash and submitter. Holds are keyed by
/// the command and this tag, so a submission refused by the ledger (argument drift, another
/// agent's run) gives back only its own holds, never those of the command recorded under the
/// key; status changes move every hold of the command.
pub fn submission_tag(args_hash: &str, submitter: Option<&str>) -> String {
    format!("{args_hash}:{}", submitter.unwrap_or("-"))
}

/// How [`BudgetStore::budget_hold`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldMode {
    /// Counted, if every line fits its limit; else nothing is written.
    Enforce,
    /// Recorded but not counted, past the limit: counts once the command is approved.
    Defer,
}

/// What a hold did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "held", rename_all = "snake_case")]
pub enum Held {
    /// At least one line was held now (or deferred, with [`HoldMode::Defer`]).
    Fresh,
    /// The command held (or had deferred, or released) every line before: nothing changed.
    Already,
    /// `line` would pass its limit with `used` already held: nothing was written.
    Exceeded { line: Box<BudgetLine>, used: i64 },
}

/// What [`BudgetStore::reserve_held`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Budgeted {
    /// The lines were held (or already were) and the reservation answered.
    Recorded { reserved: Box<Reserved>, held: Held },
    /// A line would pass its limit: nothing was held or recorded.
    Exceeded { line: Box<BudgetLine>, used: i64 },
}

/// Whether a reservation's answer means nothing was recorded under the key for this submission
/// (so its own fresh holds are given back): argument drift, another agent's run, a closed run,
/// a business key held by another command.
pub fn refused(reserved: &Result<Reserved, LedgerError>) -> bool {
    matches!(
        reserved,
        Ok(Reserved::BusinessKeyHeld(_))
            | Err(LedgerError::ArgumentDrift { .. }
                | LedgerError::ForeignRun { .. }
                | LedgerError::RunClosed { .. })
    )
}

/// The holds of commands against spend budgets.
#[async_trait]
pub trait BudgetStore: Send + Sync + std::fmt::Debug + 'static {
    /// Holds `lines` for the command's submission `tag`: lines it already has (in any state) are left as they are;
    /// the others are written together, [`HoldMode::Enforce`] only if each fits its limit (or
    /// none is written and the answer is [`Held::Exceeded`]). Lines are in counter order
    /// (`sluice_core::budget::lines`).
    async fn budget_hold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Held, LedgerError>;

    /// Holds `lines` under `tag` for an approver's edit of the command
    /// (`sluice_core::revision`, tagged `sluice_core::budget::revision_tag`), as
    /// [`BudgetStore::budget_hold`] does, except that whether a line fits leaves out what the
    /// command's other counted holds hold on its counter: the edit moves the command's spend,
    /// it does not add to it. The old holds still count until [`BudgetStore::budget_supersede`]
    /// (after the edit is written) or [`BudgetStore::budget_unhold`] of `tag` (the edit was
    /// refused) — a crash in between counts more, never less.
    async fn budget_rehold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Held, LedgerError>;

    /// Marks every hold of the command but those of `keep` moved
    /// (`sluice_core::budget::HoldState::Moved`): they count no more, and no status change
    /// brings them back. Idempotent.
    async fn budget_supersede(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        keep: &str,
    ) -> Result<(), LedgerError>;

    /// Removes the holds of the submission `tag` of the command as if never written, giving
    /// back what they counted: for an admission whose command was not recorded (refused by
    /// the ledger after its hold). Another submission's holds under the same key stay.
    async fn budget_unhold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
    ) -> Result<(), LedgerError>;

    /// Holds `lines` ([`BudgetStore::budget_hold`]) and, if they fit (or `mode` defers them),
    /// reserves `command` ([`crate::CommandStore::reserve`], or `reserve_own` when `confined`);
    /// a reservation [`refused`] gives back this submission's fresh holds. SQLite does it all in
    /// one write transaction, so a crash leaves both or neither; CQL in two steps, hold first
    /// (a crash in between leaves the hold keyed for the retried admission to take over).
    #[allow(clippy::too_many_arguments)]
    async fn reserve_held(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Budgeted, LedgerError>;

    /// What other commands than the one at `run_id`/`command_key` hold in each of `counters`
    /// (`sluice_core::budget::used_by_others`; 0 for a counter never written), in order: what a
    /// policy rule reads as `budgets.<name>.used`.
    async fn budget_used_by_others(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        counters: &[String],
    ) -> Result<Vec<i64>, LedgerError>;

    /// The counters of `budget` in the window starting at `window_start`.
    async fn budget_counters(
        &self,
        budget: &str,
        window_start: i64,
    ) -> Result<Vec<BudgetCounter>, LedgerError>;
}
