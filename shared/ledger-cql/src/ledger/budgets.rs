//! Spend budgets on CQL (docs/cql.md, "Spend budgets"): one row per counter, holding the
//! amount held and every command's hold as JSON, written only by LWTs on its version — the
//! check that an amount fits and the hold that takes it are one Paxos round, so racing
//! admissions on any number of producers never pass a limit. Holds are keyed by the command:
//! a retried or replayed hold finds its own and changes nothing.
//!
//! A command's holds on several counters are several LWTs (one partition each): a hold that
//! does not fit gives back the ones this call took; a crash in between leaves them held,
//! keyed by the command, so the retried admission finds them (over-counting until then, never
//! under). A status change moves the holds after its own LWT applied (a release) or before it
//! (an approval or replay that makes a hold count), so a crash between the two leaves more
//! counted, never less.

use std::collections::BTreeMap;

use uuid::Uuid;

use sluice_core::audit::AuditDraft;
use sluice_core::budget::{
    BudgetCounter, BudgetLine, HoldChange, HoldState, apply_change, counter_window_ended, fits,
    used_by_others,
};
use sluice_core::command::Command;
use sluice_core::ids::{CommandKey, RunId};
use sluice_ledger::{Budgeted, Held, HoldMode, LedgerError};

use super::trips::back_off;
use super::{CqlLedger, Lwt};
use crate::codec::Fields;
use crate::stats::{Kind, Op};

/// Attempts at a counter's LWT under contention before the hold reports the store busy.
const MAX_ATTEMPTS: u32 = 64;

/// A command's hold on one counter: its amount and state.
type Holds = BTreeMap<String, (i64, HoldState)>;

/// The holder key of a command's submission in a counter's `holds`.
fn holder(run_id: &str, command_key: &str, tag: &str) -> String {
    format!("{}{tag}", command_prefix(run_id, command_key))
}

/// What every holder key of a command starts with.
fn command_prefix(run_id: &str, command_key: &str) -> String {
    format!("{run_id}\u{1f}{command_key}\u{1f}")
}

fn holds_of(row: &Fields) -> Holds {
    row.text("holds")
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}

/// What one counter's update decided.
enum Decision<R> {
    /// Nothing to write; the answer.
    Leave(R),
    /// Write `used` and the holds; the answer once written.
    Write(i64, R),
}

impl CqlLedger {
    /// Reads a counter (SERIAL), lets `decide` change it, and writes it under its version,
    /// again until the write applies or `decide` leaves it.
    async fn budget_update<R>(
        &self,
        counter: &str,
        meta: Option<&BudgetLine>,
        decide: impl Fn(i64, &mut Holds) -> Decision<R>,
    ) -> Result<R, LedgerError> {
        let op = Op::Budget;
        for attempt in 0..MAX_ATTEMPTS {
            let rows = self
                .paged(
                    op,
                    "read budget counter",
                    &self.inner.st.read_budget_serial,
                    (counter,),
                    Kind::Serial,
                )
                .await?;
            let stored = rows.first();
            let used = stored.and_then(|row| row.bigint("used")).unwrap_or(0);
            let version = stored.and_then(|row| row.bigint("version"));
            let mut holds = stored.map(holds_of).unwrap_or_default();
            let (next_used, answer) = match decide(used, &mut holds) {
                Decision::Leave(answer) => return Ok(answer),
                Decision::Write(next_used, answer) => (next_used, answer),
            };
            let text = serde_json::to_string(&holds).unwrap_or_default();
            let write_id = Uuid::new_v4();
            let next_version = version.unwrap_or(0) + 1;
            let lwt = match (version, meta) {
                (None, Some(line)) => {
                    self.lwt(
                        op,
                        "create budget counter",
                        &self.inner.st.create_budget,
                        (
                            counter,
                            line.budget.as_str(),
                            line.scope_value.as_str(),
                            line.window_start,
                            line.currency.as_str(),
                            next_used,
                            text.as_str(),
                            next_version,
                            write_id,
                        ),
                    )
                    .await?
                }
                // A counter never written holds nothing to release.
                (None, None) => return Ok(answer),
                (Some(version), _) => {
                    self.lwt(
                        op,
                        "write budget counter",
                        &self.inner.st.write_budget,
                        (
                            next_used,
                            text.as_str(),
                            next_version,
                            write_id,
                            counter,
                            version,
                        ),
                    )
                    .await?
                }
            };
            match lwt {
                Lwt::Applied => return Ok(answer),
                Lwt::Unknown => {
                    let rows = self
                        .paged(
                            op,
                            "settle budget counter",
                            &self.inner.st.read_budget_serial,
                            (counter,),
                            Kind::Serial,
                        )
                        .await?;
                    if rows.first().and_then(|row| row.uuid("write_id")) == Some(write_id) {
                        return Ok(answer);
                    }
                }
                Lwt::NotApplied(_) => {}
            }
            self.inner.stats.retry(op);
            back_off(attempt).await;
        }
        Err(LedgerError::Storage {
            op: "budget counter",
            source: format!(
                "the counter {counter:?} kept changing under {MAX_ATTEMPTS} attempts: too much contention"
            )
            .into(),
        })
    }

    /// The counters a command holds.
    async fn budget_counters_of(&self, run: &str, key: &str) -> Result<Vec<String>, LedgerError> {
        let rows = self
            .paged(
                Op::Budget,
                "read command budget holds",
                &self.inner.st.read_budget_command,
                (run, key),
                Kind::Plain,
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|row| row.text("counter").map(str::to_owned))
            .collect())
    }

    /// Removes a purged command's holds from the counters whose window has ended
    /// (`sluice_core::budget::counter_window_ended`), leaving what they counted in `used` (the
    /// window's spend stays as it was) and the holds of `total` budgets as they are; how many.
    /// `dry_run`: only counted.
    pub(super) async fn purge_budget_holds(
        &self,
        run: &str,
        key: &str,
        now: sluice_core::time::Timestamp,
        dry_run: bool,
    ) -> Result<u64, LedgerError> {
        let prefix = command_prefix(run, key);
        let mut removed = 0u64;
        for counter in self.budget_counters_of(run, key).await? {
            if !counter_window_ended(&counter, now) {
                continue;
            }
            removed += if dry_run {
                let rows = self
                    .paged(
                        Op::Budget,
                        "read budget counter",
                        &self.inner.st.read_budget_counter,
                        (counter.as_str(),),
                        Kind::Plain,
                    )
                    .await?;
                rows.first().map_or(0, |row| {
                    holds_of(row)
                        .keys()
                        .filter(|holder| holder.starts_with(&prefix))
                        .count() as u64
                })
            } else {
                let gone = self
                    .budget_update(&counter, None, |used, holds| {
                        let before = holds.len();
                        holds.retain(|holder, _| !holder.starts_with(&prefix));
                        match before - holds.len() {
                            0 => Decision::Leave(0),
                            gone => Decision::Write(used, gone as u64),
                        }
                    })
                    .await?;
                self.plain(
                    Op::Budget,
                    "purge command budget hold",
                    &self.inner.st.delete_budget_command,
                    (run, key, counter.as_str()),
                )
                .await?;
                gone
            };
        }
        Ok(removed)
    }

    /// Removes the holder's hold on `counter`, giving back what it counted.
    async fn budget_remove(&self, counter: &str, who: &str) -> Result<(), LedgerError> {
        self.budget_update(counter, None, |used, holds| match holds.remove(who) {
            None => Decision::Leave(()),
            Some((amount, HoldState::Held)) => Decision::Write(used - amount, ()),
            Some(_) => Decision::Write(used, ()),
        })
        .await
    }

    /// [`sluice_ledger::BudgetStore::budget_hold`], and with `net`
    /// [`sluice_ledger::BudgetStore::budget_rehold`]: the command's other counted holds on a
    /// counter are left out of whether a line fits, in the same LWT that checks it.
    pub(super) async fn hold_budget(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
        net: bool,
    ) -> Result<Held, LedgerError> {
        self.inner.stats.call(Op::Budget);
        let (run, key) = (run_id.as_str(), command_key.as_str());
        let who = holder(run, key, tag);
        let prefix = command_prefix(run, key);
        let mut taken: Vec<&str> = Vec::new();
        for line in lines {
            // Indexed first, so whatever the LWT does is found by the command's status changes.
            self.plain(
                Op::Budget,
                "index budget hold",
                &self.inner.st.index_budget_command,
                (run, key, line.counter.as_str()),
            )
            .await?;
            self.plain(
                Op::Budget,
                "index budget window",
                &self.inner.st.index_budget_window,
                (
                    line.budget.as_str(),
                    line.window_start,
                    line.counter.as_str(),
                ),
            )
            .await?;
            let state = match mode {
                HoldMode::Enforce => HoldState::Held,
                HoldMode::Defer => HoldState::Deferred,
            };
            let outcome = self
                .budget_update(&line.counter, Some(line), |used, holds| {
                    if holds.contains_key(&who) {
                        return Decision::Leave(None);
                    }
                    if state == HoldState::Deferred {
                        holds.insert(who.clone(), (line.amount, state));
                        return Decision::Write(used, Some(Ok(())));
                    }
                    let elsewhere: i64 = if net {
                        holds
                            .range(prefix.clone()..)
                            .take_while(|(other, _)| other.starts_with(&prefix))
                            .filter(|(other, (_, state))| {
                                **other != who && *state == HoldState::Held
                            })
                            .map(|(_, (amount, _))| amount)
                            .sum()
                    } else {
                        0
                    };
                    if !fits(used - elsewhere, line.amount, line.limit) {
                        return Decision::Leave(Some(Err(used - elsewhere)));
                    }
                    holds.insert(who.clone(), (line.amount, state));
                    Decision::Write(used + line.amount, Some(Ok(())))
                })
                .await?;
            match outcome {
                None => {}
                Some(Ok(())) => taken.push(&line.counter),
                Some(Err(used)) => {
                    for counter in taken {
                        self.budget_remove(counter, &who).await?;
                    }
                    return Ok(Held::Exceeded {
                        line: Box::new(line.clone()),
                        used,
                    });
                }
            }
        }
        Ok(if taken.is_empty() {
            Held::Already
        } else {
            Held::Fresh
        })
    }

    /// [`sluice_ledger::BudgetStore::reserve_held`]: the holds, then the reservation — two
    /// partitions, so two steps; a refused reservation gives back this submission's fresh
    /// holds, and a crash in between leaves them for the retried admission to take over.
    pub(super) async fn reserve_budgeted(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
    ) -> Result<Budgeted, LedgerError> {
        let (run_id, command_key) = (command.run_id.clone(), command.command_key.clone());
        let held = self
            .hold_budget(&run_id, &command_key, tag, lines, mode, false)
            .await?;
        if let Held::Exceeded { line, used } = held {
            return Ok(Budgeted::Exceeded { line, used });
        }
        let reserved = self.reserve_as(command, audit, confined).await;
        if held == Held::Fresh
            && sluice_ledger::budget::refused(&reserved)
            && let Err(e) = self.unhold_budget(&run_id, &command_key, tag).await
        {
            // Held all the same: more counted than spent, never less.
            tracing::warn!(run_id = %run_id, command_key = %command_key, error = %e, "the budget hold of a refused reservation was not given back");
        }
        Ok(Budgeted::Recorded {
            reserved: Box::new(reserved?),
            held,
        })
    }

    /// [`sluice_ledger::BudgetStore::budget_unhold`].
    pub(super) async fn unhold_budget(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
    ) -> Result<(), LedgerError> {
        self.inner.stats.call(Op::Budget);
        let (run, key) = (run_id.as_str(), command_key.as_str());
        let who = holder(run, key, tag);
        for counter in self.budget_counters_of(run, key).await? {
            self.budget_remove(&counter, &who).await?;
        }
        Ok(())
    }

    /// [`sluice_ledger::BudgetStore::budget_supersede`]: one LWT per counter the command holds.
    pub(super) async fn supersede_budget(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        keep: &str,
    ) -> Result<(), LedgerError> {
        self.inner.stats.call(Op::Budget);
        let (run, key) = (run_id.as_str(), command_key.as_str());
        let prefix = command_prefix(run, key);
        let kept = holder(run, key, keep);
        for counter in self.budget_counters_of(run, key).await? {
            self.budget_update(&counter, None, |used, holds| {
                let mut used = used;
                let mut moved = false;
                for (who, (amount, state)) in holds
                    .range_mut(prefix.clone()..)
                    .take_while(|(who, _)| who.starts_with(&prefix))
                {
                    if *who == kept || *state == HoldState::Moved {
                        continue;
                    }
                    if *state == HoldState::Held {
                        used -= *amount;
                    }
                    *state = HoldState::Moved;
                    moved = true;
                }
                if moved {
                    Decision::Write(used, ())
                } else {
                    Decision::Leave(())
                }
            })
            .await?;
        }
        Ok(())
    }

    /// Moves a command's holds by `change` (its status changed, or is about to).
    pub(super) async fn follow_budget(
        &self,
        run: &str,
        key: &str,
        change: HoldChange,
    ) -> Result<(), LedgerError> {
        if change == HoldChange::Keep {
            return Ok(());
        }
        let prefix = command_prefix(run, key);
        for counter in self.budget_counters_of(run, key).await? {
            self.budget_update(&counter, None, |used, holds| {
                let mut used = used;
                let mut moved = false;
                for (_, (amount, state)) in holds
                    .range_mut(prefix.clone()..)
                    .take_while(|(who, _)| who.starts_with(&prefix))
                {
                    let (next, delta) = apply_change(*state, *amount, change);
                    if next != *state {
                        *state = next;
                        used += delta;
                        moved = true;
                    }
                }
                if moved {
                    Decision::Write(used, ())
                } else {
                    Decision::Leave(())
                }
            })
            .await?;
        }
        Ok(())
    }

    /// [`sluice_ledger::BudgetStore::budget_used_by_others`].
    pub(super) async fn read_used_by_others(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        counters: &[String],
    ) -> Result<Vec<i64>, LedgerError> {
        self.inner.stats.call(Op::Budget);
        let prefix = command_prefix(run_id.as_str(), command_key.as_str());
        let mut out = Vec::with_capacity(counters.len());
        for counter in counters {
            let rows = self
                .paged(
                    Op::Budget,
                    "read budget counter",
                    &self.inner.st.read_budget_counter,
                    (counter.as_str(),),
                    Kind::Plain,
                )
                .await?;
            out.push(rows.first().map_or(0, |row| {
                let holds = holds_of(row);
                let own = holds
                    .iter()
                    .filter(|(holder, _)| holder.starts_with(&prefix))
                    .map(|(_, hold)| *hold);
                used_by_others(row.bigint("used").unwrap_or(0), own)
            }));
        }
        Ok(out)
    }

    /// [`sluice_ledger::BudgetStore::budget_counters`].
    pub(super) async fn read_budget_counters(
        &self,
        budget: &str,
        window_start: i64,
    ) -> Result<Vec<BudgetCounter>, LedgerError> {
        self.inner.stats.call(Op::Budget);
        let counters = self
            .paged(
                Op::Budget,
                "read budget window",
                &self.inner.st.read_budget_window,
                (budget, window_start),
                Kind::Plain,
            )
            .await?;
        let mut out = Vec::with_capacity(counters.len());
        for counter in counters.iter().filter_map(|row| row.text("counter")) {
            let rows = self
                .paged(
                    Op::Budget,
                    "read budget counter",
                    &self.inner.st.read_budget_counter,
                    (counter,),
                    Kind::Plain,
                )
                .await?;
            let Some(row) = rows.first() else { continue };
            let holds = holds_of(row);
            out.push(BudgetCounter {
                budget: budget.to_owned(),
                scope_value: row.text("scope_value").unwrap_or_default().to_owned(),
                window_start,
                currency: row.text("currency").unwrap_or_default().to_owned(),
                used: row.bigint("used").unwrap_or(0),
                holds: holds
                    .values()
                    .filter(|(_, state)| *state == HoldState::Held)
                    .count() as u64,
            });
        }
        out.sort_by(|a, b| (&a.scope_value, &a.currency).cmp(&(&b.scope_value, &b.currency)));
        Ok(out)
    }
}

#[async_trait::async_trait]
impl sluice_ledger::BudgetStore for CqlLedger {
    async fn budget_hold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Held, LedgerError> {
        self.hold_budget(run_id, command_key, tag, lines, mode, false)
            .await
    }

    async fn budget_rehold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Held, LedgerError> {
        self.hold_budget(run_id, command_key, tag, lines, mode, true)
            .await
    }

    async fn budget_supersede(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        keep: &str,
    ) -> Result<(), LedgerError> {
        self.supersede_budget(run_id, command_key, keep).await
    }

    async fn budget_unhold(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        tag: &str,
    ) -> Result<(), LedgerError> {
        self.unhold_budget(run_id, command_key, tag).await
    }

    async fn budget_counters(
        &self,
        budget: &str,
        window_start: i64,
    ) -> Result<Vec<sluice_core::budget::BudgetCounter>, LedgerError> {
        self.read_budget_counters(budget, window_start).await
    }

    async fn budget_used_by_others(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        counters: &[String],
    ) -> Result<Vec<i64>, LedgerError> {
        self.read_used_by_others(run_id, command_key, counters)
            .await
    }

    async fn reserve_held(
        &self,
        command: Command,
        audit: AuditDraft,
        confined: bool,
        tag: &str,
        lines: &[sluice_core::budget::BudgetLine],
        mode: sluice_ledger::HoldMode,
    ) -> Result<sluice_ledger::Budgeted, LedgerError> {
        self.reserve_budgeted(command, audit, confined, tag, lines, mode)
            .await
    }
}
