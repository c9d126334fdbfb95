//! The writer's budget operations (`crate::BudgetStore`), in the batch's write transaction like
//! every other write: one writer holds the lock, so a counter read here is the counter written,
//! and two admissions racing for the last room are serialised.

use rusqlite::{OptionalExtension, params};
use sluice_core::budget::{BudgetLine, HoldChange, HoldState, apply_change, fits, hold_change};
use sluice_core::command::CommandStatus;

use super::Writer;
use crate::{Held, HoldMode};

impl Writer {
    pub(super) fn budget_hold(
        &mut self,
        run_id: &str,
        command_key: &str,
        tag: &str,
        lines: &[BudgetLine],
        mode: HoldMode,
        net: bool,
    ) -> Result<Held, rusqlite::Error> {
        let mut fresh = Vec::with_capacity(lines.len());
        for line in lines {
            let held: Option<i64> = self
                .conn
                .prepare_cached(
                    "SELECT 1 FROM budget_holds \
                     WHERE run_id = ?1 AND command_key = ?2 AND tag = ?3 AND counter = ?4",
                )?
                .query_row(params![run_id, command_key, tag, line.counter], |row| {
                    row.get(0)
                })
                .optional()?;
            if held.is_none() {
                fresh.push(line);
            }
        }
        if fresh.is_empty() {
            return Ok(Held::Already);
        }
        if mode == HoldMode::Enforce {
            for line in &fresh {
                let mut used = self.budget_used(&line.counter)?;
                if net {
                    // An edit moves the command's hold: what its other holds count on this
                    // counter is given back when the edit is written (`budget_supersede`).
                    used -=
                        self.budget_counted_elsewhere(run_id, command_key, tag, &line.counter)?;
                }
                if !fits(used, line.amount, line.limit) {
                    return Ok(Held::Exceeded {
                        line: Box::new((*line).clone()),
                        used,
                    });
                }
            }
        }
        let state = match mode {
            HoldMode::Enforce => HoldState::Held,
            HoldMode::Defer => HoldState::Deferred,
        };
        for line in fresh {
            self.conn
                .prepare_cached(
                    "INSERT INTO budget_holds (run_id, command_key, tag, counter, amount, state) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?
                .execute(params![
                    run_id,
                    command_key,
                    tag,
                    line.counter,
                    line.amount,
                    state.as_str()
                ])?;
            let (delta, holds) = if state == HoldState::Held {
                (line.amount, 1)
            } else {
                (0, 0)
            };
            self.conn
                .prepare_cached(
                    "INSERT INTO budget_counters \
                     (counter, budget, scope_value, window_start, currency, used, holds) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
                     ON CONFLICT (counter) DO UPDATE SET used = used + excluded.used, \
                     holds = holds + excluded.holds",
                )?
                .execute(params![
                    line.counter,
                    line.budget,
                    line.scope_value,
                    line.window_start,
                    line.currency,
                    delta,
                    holds
                ])?;
        }
        Ok(Held::Fresh)
    }

    fn budget_holds_of(
        &self,
        run_id: &str,
        command_key: &str,
        tag: &str,
    ) -> Result<Vec<(String, i64, String)>, rusqlite::Error> {
        self.conn
            .prepare_cached(
                "SELECT counter, amount, state FROM budget_holds \
                 WHERE run_id = ?1 AND command_key = ?2 AND tag = ?3",
            )?
            .query_map(params![run_id, command_key, tag], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })?
            .collect()
    }

    /// What the command's counted holds under tags other than `tag` hold on `counter`.
    fn budget_counted_elsewhere(
        &self,
        run_id: &str,
        command_key: &str,
        tag: &str,
        counter: &str,
    ) -> Result<i64, rusqlite::Error> {
        self.conn
            .prepare_cached(
                "SELECT COALESCE(SUM(amount), 0) FROM budget_holds \
                 WHERE run_id = ?1 AND command_key = ?2 AND tag <> ?3 AND counter = ?4 \
                 AND state = 'held'",
            )?
            .query_row(params![run_id, command_key, tag, counter], |row| row.get(0))
    }

    /// Marks the command's holds under tags other than `keep` moved, giving back what they
    /// counted (`BudgetStore::budget_supersede`).
    pub(super) fn budget_supersede(
        &mut self,
        run_id: &str,
        command_key: &str,
        keep: &str,
    ) -> Result<(), rusqlite::Error> {
        for (tag, counter, amount, state) in self.budget_holds(run_id, command_key)? {
            let state = HoldState::parse(&state);
            if tag == keep || state == Some(HoldState::Moved) {
                continue;
            }
            if state == Some(HoldState::Held) {
                self.budget_count(&counter, -amount, -1)?;
            }
            self.conn
                .prepare_cached(
                    "UPDATE budget_holds SET state = ?5 \
                     WHERE run_id = ?1 AND command_key = ?2 AND tag = ?3 AND counter = ?4",
                )?
                .execute(params![
                    run_id,
                    command_key,
                    tag,
                    counter,
                    HoldState::Moved.as_str()
                ])?;
        }
        Ok(())
    }

    fn budget_used(&self, counter: &str) -> Result<i64, rusqlite::Error> {
        Ok(self
            .conn
            .prepare_cached("SELECT used FROM budget_counters WHERE counter = ?1")?
            .query_row(params![counter], |row| row.get::<_, i64>(0))
            .optional()?
            .unwrap_or(0))
    }

    fn budget_holds(
        &self,
        run_id: &str,
        command_key: &str,
    ) -> Result<Vec<(String, String, i64, String)>, rusqlite::Error> {
        self.conn
            .prepare_cached(
                "SELECT tag, counter, amount, state FROM budget_holds \
                 WHERE run_id = ?1 AND command_key = ?2",
            )?
            .query_map(params![run_id, command_key], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect()
    }

    fn budget_count(&self, counter: &str, delta: i64, holds: i64) -> Result<(), rusqlite::Error> {
        self.conn
            .prepare_cached(
                "UPDATE budget_counters SET used = used + ?2, holds = holds + ?3 WHERE counter = ?1",
            )?
            .execute(params![counter, delta, holds])?;
        Ok(())
    }

    pub(super) fn budget_unhold(
        &mut self,
        run_id: &str,
        command_key: &str,
        tag: &str,
    ) -> Result<(), rusqlite::Error> {
        for (counter, amount, state) in self.budget_holds_of(run_id, command_key, tag)? {
            if HoldState::parse(&state) == Some(HoldState::Held) {
                self.budget_count(&counter, -amount, -1)?;
            }
        }
        self.conn
            .prepare_cached(
                "DELETE FROM budget_holds WHERE run_id = ?1 AND command_key = ?2 AND tag = ?3",
            )?
            .execute(params![run_id, command_key, tag])?;
        Ok(())
    }

    /// Moves the command's holds as its status goes from `from` to `to`.
    pub(super) fn budget_follow(
        &mut self,
        run_id: &str,
        command_key: &str,
        from: CommandStatus,
        to: CommandStatus,
    ) -> Result<(), rusqlite::Error> {
        let change = hold_change(from, to);
        if change == HoldChange::Keep {
            return Ok(());
        }
        for (tag, counter, amount, state) in self.budget_holds(run_id, command_key)? {
            let Some(state) = HoldState::parse(&state) else {
                continue;
            };
            let (next, delta) = apply_change(state, amount, change);
            if next == state {
                continue;
            }
            let holds = i64::from(next == HoldState::Held) - i64::from(state == HoldState::Held);
            self.conn
                .prepare_cached(
                    "UPDATE budget_holds SET state = ?5 \
                     WHERE run_id = ?1 AND command_key = ?2 AND tag = ?3 AND counter = ?4",
                )?
                .execute(params![run_id, command_key, tag, counter, next.as_str()])?;
            self.budget_count(&counter, delta, holds)?;
        }
        Ok(())
    }
}
