//! The runs index: `list_runs`, and `purge` of finished runs with the checkpoint it leaves
//! (docs/cql.md, "Runs and purge").

use futures::StreamExt;

use sluice_core::audit::{AuditDraft, Checkpoint};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::retention::{PurgeVerdict, purge_verdict};
use sluice_core::time::Timestamp;
use sluice_ledger::{LedgerError, PurgeReport, RunCursor, RunSummary, SYSTEM_RUN};

use super::{CqlLedger, FAN_OUT, Head, Lwt, STALE_RUN_ENTRY_MS, epoch_i64, link_key};
use crate::codec::{DAY_MS, MINUTE_MS, bad, day_of, parse_status};
use crate::stats::{Kind, Op};
use sluice_ledger::AuditStore;

impl CqlLedger {
    /// [`CommandStore::list_runs`]: day buckets newest first, each entry checked against its run.
    pub(super) async fn list_runs_by_day(
        &self,
        since: Timestamp,
        before: Option<&RunCursor>,
        limit: usize,
    ) -> Result<Vec<RunSummary>, LedgerError> {
        let op = Op::ListRuns;
        self.inner.stats.call(op);
        let now = self.now().as_millis();
        let first_day = day_of(since.as_millis()).max(day_of(self.inner.due_origin * MINUTE_MS));
        // The cursor's own millisecond is read again; its runs up to the cursor are left out
        // below (the day bucket orders by time, not by the id ties are broken by).
        let (last_day, until) = before.map_or((day_of(now + DAY_MS), i64::MAX), |c| {
            let at = c.created_at.as_millis();
            (day_of(at), at.saturating_add(1))
        });
        let mut summaries = Vec::new();
        let mut day = last_day;
        while day >= first_day && summaries.len() < limit {
            let entries = self
                .paged(
                    op,
                    "list runs",
                    &self.inner.st.read_runs_day,
                    (day, since.as_millis(), until),
                    Kind::Plain,
                )
                .await?;
            let checked: Vec<Result<Option<RunSummary>, LedgerError>> =
                futures::stream::iter(entries)
                    .map(|entry| async move {
                        let (Some(created_at), Some(run)) =
                            (entry.bigint("created_at"), entry.text("run_id"))
                        else {
                            return Ok(None);
                        };
                        if let (Some(cursor), Ok(id)) = (before, RunId::parse(run))
                            && !cursor.lies_past(Timestamp::from_millis(created_at), &id)
                        {
                            return Ok(None);
                        }
                        self.summarise(op, day, created_at, run, now).await
                    })
                    .buffered(FAN_OUT)
                    .collect()
                    .await;
            for summary in checked {
                if let Some(summary) = summary? {
                    summaries.push(summary);
                }
            }
            day -= 1;
        }
        summaries.sort_by(|a, b| {
            (b.created_at, b.run_id.as_str()).cmp(&(a.created_at, a.run_id.as_str()))
        });
        summaries.truncate(limit);
        Ok(summaries)
    }

    /// [`CommandStore::purge`]: day buckets oldest first from the purge cursor; see `purge_run`.
    pub(super) async fn purge_runs(
        &self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> Result<PurgeReport, LedgerError> {
        let op = Op::Purge;
        self.inner.stats.call(op);
        let mut report = PurgeReport {
            dry_run,
            ..PurgeReport::default()
        };
        let cursor_day = self
            .plain(
                op,
                "read purge cursor",
                &self.inner.st.read_meta,
                ("purge_day",),
            )
            .await?
            .first()
            .and_then(|row| row.bigint("value"))
            .unwrap_or_else(|| day_of(self.inner.due_origin * MINUTE_MS));
        let clock = self.now().as_millis();
        let last_day = day_of(older_than.as_millis());
        // The cursor moves past the leading days left without runs (and no longer written to).
        let mut new_cursor = None;
        let mut leading_empty = true;
        let mut day = cursor_day;
        while day <= last_day && (report.runs as usize) < max_runs {
            let entries = self
                .paged(
                    op,
                    "read runs",
                    &self.inner.st.read_runs_day,
                    (day, i64::MIN, older_than.as_millis()),
                    Kind::Plain,
                )
                .await?;
            let mut remaining = 0usize;
            // Oldest first.
            for entry in entries.iter().rev() {
                let (Some(created_at), Some(run)) =
                    (entry.bigint("created_at"), entry.text("run_id"))
                else {
                    continue;
                };
                let gone = (report.runs as usize) < max_runs
                    && self
                        .purge_run(
                            op,
                            run,
                            day,
                            created_at,
                            older_than,
                            now,
                            clock,
                            &mut report,
                        )
                        .await?;
                remaining += usize::from(!gone);
            }
            leading_empty = leading_empty && remaining == 0 && day < day_of(clock) - 1;
            if leading_empty {
                new_cursor = Some(day + 1);
            }
            day += 1;
        }
        if dry_run {
            return Ok(report);
        }
        if let Some(next) = new_cursor {
            self.plain(
                op,
                "move purge cursor",
                &self.inner.st.write_meta,
                (next, "purge_day"),
            )
            .await?;
        }
        if report.runs > 0 {
            let system =
                RunId::parse(SYSTEM_RUN).map_err(|e| bad("run id", SYSTEM_RUN, e.to_string()))?;
            let draft = AuditDraft {
                command_key: None,
                from: None,
                to: None,
                actor: actor.to_owned(),
                reason: format!("purged finished runs older than {older_than}"),
                evidence: report.evidence(older_than),
            };
            self.audit_append(&system, draft, now).await?;
        }
        Ok(report)
    }

    /// Summary of a run listed in `runs` under `created_at`, or `None` if the entry is stale
    /// (the run was purged, or its registration never applied; such entries are dropped once
    /// old enough).
    async fn summarise(
        &self,
        op: Op,
        day: i64,
        created_at: i64,
        run: &str,
        now: i64,
    ) -> Result<Option<RunSummary>, LedgerError> {
        let rows = self
            .paged(
                op,
                "read run",
                &self.inner.st.read_run_brief,
                (run,),
                Kind::Plain,
            )
            .await?;
        let registered = rows.first().and_then(|row| row.bigint("run_created_at"));
        if registered != Some(created_at) {
            if created_at < now - STALE_RUN_ENTRY_MS {
                self.plain(
                    op,
                    "delete stale run entry",
                    &self.inner.st.delete_run,
                    (day, created_at, run),
                )
                .await?;
            }
            return Ok(None);
        }
        let mut open = 0u64;
        for row in &rows {
            // A status this build cannot read (a quarantined command, or a newer build's)
            // counts as open.
            if let Some(status) = row.text("status")
                && !matches!(parse_status(run, status), Ok(status) if status.is_terminal())
            {
                open += 1;
            }
        }
        let updated_at = rows
            .first()
            .and_then(|row| row.bigint("updated_at"))
            .unwrap_or(created_at);
        Ok(Some(RunSummary {
            run_id: RunId::parse(run).map_err(|e| bad("run id", run, e.to_string()))?,
            created_at: Timestamp::from_millis(created_at),
            updated_at: Timestamp::from_millis(updated_at),
            open_commands: open,
            rolled_back_at: rows
                .first()
                .and_then(|row| row.bigint("run_closed_at"))
                .map(Timestamp::from_millis),
        }))
    }

    /// Purges one run if it is finished (the core's `purge_verdict`) and unchanged since
    /// `older_than`; `true` if its `runs` entry is gone (purged, or stale and dropped). A run
    /// whose commands are all terminal but owe work is kept and entered in the report.
    #[allow(clippy::too_many_arguments)]
    async fn purge_run(
        &self,
        op: Op,
        run: &str,
        day: i64,
        created_at: i64,
        older_than: Timestamp,
        now: Timestamp,
        clock: i64,
        report: &mut PurgeReport,
    ) -> Result<bool, LedgerError> {
        if run == SYSTEM_RUN {
            return Ok(false);
        }
        let rows = self
            .paged(op, "read run", &self.inner.st.read_run, (run,), Kind::Plain)
            .await?;
        let head = rows.first().map_or_else(Head::empty, Head::of);
        if head.run_created_at != Some(created_at) {
            if created_at < clock - STALE_RUN_ENTRY_MS && !report.dry_run {
                self.plain(
                    op,
                    "delete stale run entry",
                    &self.inner.st.delete_run,
                    (day, created_at, run),
                )
                .await?;
                return Ok(true);
            }
            return Ok(false);
        }
        let mut commands = Vec::new();
        for fields in &rows {
            match self.stored_row(run, fields) {
                Ok(Some(row)) => commands.push(row),
                Ok(None) => {}
                // Quarantined, or a newer build's: a run with a command this build cannot
                // read is not finished.
                Err(LedgerError::UndecodableCommand { .. } | LedgerError::NewerCommand { .. }) => {
                    return Ok(false);
                }
                Err(e) => return Err(e),
            }
        }
        let quiet = head.updated_at.unwrap_or(created_at) < older_than.as_millis();
        let Some(count) = head.stored_seq.filter(|_| quiet) else {
            return Ok(false);
        };
        let keys: Vec<CommandKey> = commands
            .iter()
            .map(|c| c.identity.command_key().clone())
            .collect();
        match purge_verdict(keys.iter().zip(commands.iter().map(|c| &c.state))) {
            PurgeVerdict::Purge => {}
            PurgeVerdict::Open { .. } => return Ok(false),
            PurgeVerdict::Owes { command_key, owed } => {
                let run_id = RunId::parse(run).map_err(|e| bad("run id", run, e.to_string()))?;
                report.keep(run_id, command_key, owed);
                return Ok(false);
            }
        }
        // The fence: the checkpoint is written, and the run unregistered, only if nothing was
        // appended since the read. A reservation that read the head before now fails its LWT
        // (run_created_at changed) and registers the run afresh, continuing the chain.
        let hash = head.chain.hash.clone();
        if report.dry_run {
            // What the purge below would remove and leave, read from the rows above.
            let run_id = RunId::parse(run).map_err(|e| bad("run id", run, e.to_string()))?;
            report.runs += 1;
            report.commands += commands.len() as u64;
            report.audit_records += u64::try_from(count - head.floor()).unwrap_or(0);
            report.business_keys += commands
                .iter()
                .filter(|c| c.command().business_key.is_some())
                .count() as u64;
            for command in &commands {
                let key = command.identity.command_key().to_string();
                report.budget_holds += self.purge_budget_holds(run, &key, now, true).await?;
            }
            report.checkpoints.push(Checkpoint {
                run_id,
                last_hash: hash,
                count: u64::try_from(count).unwrap_or(0),
                purged_at: now,
            });
            return Ok(false);
        }
        let fenced = self
            .lwt(
                op,
                "purge fence",
                &self.inner.st.purge_fence,
                (
                    count,
                    hash.as_str(),
                    now.as_millis(),
                    run,
                    count,
                    created_at,
                ),
            )
            .await?;
        let fenced = match fenced {
            Lwt::Applied => true,
            Lwt::NotApplied(_) => false,
            Lwt::Unknown => {
                let after = self.read_head(op, run, true).await?;
                after
                    .checkpoint
                    .as_ref()
                    .is_some_and(|c| c.0 == count && c.1 == hash)
                    && after.run_created_at.is_none()
            }
        };
        if !fenced {
            return Ok(false);
        }
        // Whatever this process knew of the run is history now (its LWTs would not apply).
        self.forget_run(run);
        // Row by row, each guarded by the state read: an operator action on one of them in the
        // meantime keeps it (and the run) alive.
        let mut deleted = 0u64;
        let mut kept = false;
        for command in &commands {
            let key = command.identity.command_key().to_string();
            let gone = self
                .lwt(
                    op,
                    "purge command",
                    &self.inner.st.purge_row,
                    (
                        run,
                        key.as_str(),
                        command.state.status.as_str(),
                        epoch_i64(command.state.lease.epoch),
                    ),
                )
                .await?;
            match gone {
                Lwt::Applied => deleted += 1,
                Lwt::NotApplied(_) => kept = true,
                Lwt::Unknown => {
                    if self.read_row(op, run, &key, true).await?.is_some() {
                        kept = true;
                    } else {
                        deleted += 1;
                    }
                }
            }
        }
        if kept {
            // Register the run again: it lives on.
            self.lwt(
                op,
                "restore run",
                &self.inner.st.restore_run,
                (created_at, run),
            )
            .await?;
            tracing::warn!(
                run_id = run,
                "a command changed during its purge; the run stays"
            );
            report.commands += deleted;
            return Ok(false);
        }
        let below = link_key(count);
        futures::try_join!(
            self.plain(
                op,
                "purge audit records",
                &self.inner.st.delete_audit_below,
                (run, count),
            ),
            self.plain(
                op,
                "purge audit records",
                &self.inner.st.delete_links_below,
                (run, below.as_str()),
            ),
        )?;
        for command in &commands {
            let key = command.identity.command_key().to_string();
            report.budget_holds += self.purge_budget_holds(run, &key, now, false).await?;
            let command = command.command();
            if let Some(bk) = &command.business_key {
                let released = self
                    .lwt(
                        op,
                        "purge business key",
                        &self.inner.st.release_claim,
                        (
                            command.tool.to_string().as_str(),
                            bk.as_str(),
                            run,
                            command.command_key.to_string().as_str(),
                        ),
                    )
                    .await?;
                if matches!(released, Lwt::Applied) {
                    report.business_keys += 1;
                }
            }
        }
        self.plain(
            op,
            "unregister run",
            &self.inner.st.delete_run,
            (day, created_at, run),
        )
        .await?;
        let run_id = RunId::parse(run).map_err(|e| bad("run id", run, e.to_string()))?;
        report.runs += 1;
        report.commands += deleted;
        report.audit_records += u64::try_from(count - head.floor()).unwrap_or(0);
        report.checkpoints.push(Checkpoint {
            run_id,
            last_hash: hash,
            count: u64::try_from(count).unwrap_or(0),
            purged_at: now,
        });
        Ok(true)
    }
}
