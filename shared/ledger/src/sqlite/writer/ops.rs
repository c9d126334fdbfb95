//! The writer's operations inside a batch's transaction: reserve, transition, claim, append,
//! close and purge, and the per-run audit heads they keep. A logical refusal (drift, a guard
//! that no longer holds, a closed run) is decided before anything is written; only a storage
//! error (the outer `Err`) aborts the batch.

use rusqlite::{OptionalExtension, params};

use sluice_core::audit::{AuditDraft, ChainHead, Checkpoint, PreparedRecord, SealedLink};
use sluice_core::budget::ended_windows_start_by;
use sluice_core::command::{Command, CommandState};
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_core::retention::{PurgeVerdict, purge_verdict};
use sluice_core::time::Timestamp;

use super::{CasReply, Inserted, Op, RawRow, Reply, ReserveReply, RunHead, WriteResult, Writer};
use crate::sqlite::schema::{LAST_AUDIT_AT, RUN_SEQ, TERMINAL_STATUSES, decode};
use crate::{Claim, LedgerError, PurgeReport, SYSTEM_RUN, Transition};

/// The fewest purge candidates read at once.
const PURGE_PAGE: usize = 256;

impl Writer {
    pub(super) fn apply(&mut self, op: &Op) -> Result<Result<Reply, LedgerError>, rusqlite::Error> {
        Ok(match op {
            Op::Reserve {
                command,
                key,
                audit,
                identity,
                state,
                confined,
                budget,
            } => {
                // The budget holds first, in this same transaction: over a limit nothing is
                // recorded; a refused reservation gives back what this submission took.
                let held = match budget {
                    Some(budget) => Some(self.budget_hold(
                        command.run_id.as_str(),
                        key,
                        &budget.tag,
                        &budget.lines,
                        budget.mode,
                        false,
                    )?),
                    None => None,
                };
                if let Some(held @ crate::Held::Exceeded { .. }) = held {
                    return Ok(Ok(Reply::Budget(Some(held))));
                }
                let reserved = if *confined && let Some(refused) = self.foreign(command)? {
                    Err(refused)
                } else {
                    self.reserve(command, key, audit, identity, state)?
                };
                let refused = matches!(
                    &reserved,
                    Ok(ReserveReply::Held(..))
                        | Err(LedgerError::ArgumentDrift { .. }
                            | LedgerError::ForeignRun { .. }
                            | LedgerError::RunClosed { .. })
                );
                if refused
                    && held == Some(crate::Held::Fresh)
                    && let Some(budget) = budget
                {
                    self.budget_unhold(command.run_id.as_str(), key, &budget.tag)?;
                }
                reserved.map(Reply::Reserved)
            }
            Op::Transition {
                transition,
                key,
                state,
                audit,
            } => self
                .transition(transition, key, state, audit.as_ref())?
                .map(Reply::Cas),
            Op::Claim {
                tool,
                business_key,
                run_id,
                command_key,
                at,
            } => self
                .claim(tool, business_key, run_id, command_key, *at)?
                .map(Reply::Claim),
            Op::Append(record) => {
                let link = self.append(record)?;
                Ok(Reply::Entry(record.entry(&link)))
            }
            // One writer: a run read as closed here is closed, and of two closes the second
            // finds the first's mark.
            Op::Close(record)
                if self
                    .stored_head(record.run_id())?
                    .is_some_and(|head| head.closed) =>
            {
                Ok(Reply::AlreadyClosed)
            }
            Op::Close(record) => {
                let link = self.append(record)?;
                let head = self.head(record.run_id(), record.at())?;
                head.closed = true;
                let run_seq = head.run_seq;
                self.conn
                    .prepare_cached(
                        "UPDATE runs SET closed_at = ?2 WHERE run_seq = ?1 AND closed_at IS NULL",
                    )?
                    .execute(params![run_seq, record.at().as_millis()])?;
                Ok(Reply::Entry(record.entry(&link)))
            }
            Op::Purge {
                older_than,
                max_runs,
                actor,
                now,
                dry_run: false,
            } => self
                .purge(*older_than, *max_runs, actor, *now, false)?
                .map(Reply::Purged),
            Op::Purge {
                older_than,
                max_runs,
                actor,
                now,
                dry_run: true,
            } => self
                .purge_dry_run(*older_than, *max_runs, actor, *now)?
                .map(Reply::Purged),
            Op::ShardLease { group, guard, next } => {
                Ok(Reply::Shard(self.write_shard_lease(group, *guard, next)?))
            }
            Op::Announce { group, member } => {
                self.announce(group, member)?;
                Ok(Reply::Announced)
            }
            Op::FlowControl { guard, next } => {
                Ok(Reply::Flow(self.write_flow_control(*guard, next)?))
            }
            Op::EvidencePut(record) => Ok(Reply::Evidence(self.evidence_put(record)?)),
            Op::EvidenceSettle(record) => {
                self.evidence_settle(record)?;
                Ok(Reply::Evidence(None))
            }
            Op::ReferencePut(entry) => Ok(self.reference_put(entry)?),
            Op::LinkConsume {
                link_id,
                run_id,
                command_key,
                at,
            } => Ok(Reply::Webhook(self.link_consume(
                link_id,
                run_id,
                command_key,
                *at,
            )?)),
            Op::WebhookEnqueue(delivery) => Ok(Reply::Webhook(self.webhook_enqueue(delivery)?)),
            Op::WebhookUpdate { next, expected } => {
                Ok(Reply::Webhook(self.webhook_update(next, *expected)?))
            }
            Op::BudgetHold {
                run_id,
                command_key,
                tag,
                lines,
                mode,
                net,
            } => Ok(Reply::Budget(Some(self.budget_hold(
                run_id,
                command_key,
                tag,
                lines,
                *mode,
                *net,
            )?))),
            Op::BudgetSupersede {
                run_id,
                command_key,
                keep,
            } => {
                self.budget_supersede(run_id, command_key, keep)?;
                Ok(Reply::Budget(None))
            }
            Op::BudgetUnhold {
                run_id,
                command_key,
                tag,
            } => {
                self.budget_unhold(run_id, command_key, tag)?;
                Ok(Reply::Budget(None))
            }
        })
    }

    fn load_row(&self, run_id: &str, command_key: &str) -> Result<Option<RawRow>, rusqlite::Error> {
        self.conn
            .prepare_cached(&format!(
                "SELECT identity, state FROM commands WHERE run_seq = {RUN_SEQ} AND command_key = ?2"
            ))?
            .query_row(params![run_id, command_key], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
    }

    /// The run's cached or stored head; `None` for a run the ledger has never seen.
    fn stored_head(&mut self, run_id: &RunId) -> Result<Option<&mut RunHead>, rusqlite::Error> {
        if !self.heads.contains_key(run_id) {
            let run: Option<(i64, Option<i64>)> = self
                .conn
                .prepare_cached("SELECT run_seq, closed_at FROM runs WHERE run_id = ?1")?
                .query_row([run_id.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            let Some((run_seq, closed_at)) = run else {
                return Ok(None);
            };
            let last: Option<(i64, String)> = self
                .conn
                .prepare_cached(
                    "SELECT seq, hash FROM audit WHERE run_seq = ?1 ORDER BY seq DESC LIMIT 1",
                )?
                .query_row([run_seq], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()?;
            let chain = match last {
                Some((seq, hash)) => ChainHead {
                    next_seq: seq as u64 + 1,
                    hash,
                },
                None => self.checkpoint_head(run_id)?,
            };
            self.heads.insert(
                run_id.clone(),
                RunHead {
                    run_seq,
                    chain,
                    closed: closed_at.is_some(),
                },
            );
        }
        Ok(self.heads.get_mut(run_id))
    }

    /// Where a run's chain starts: after its checkpoint if it was purged before, else genesis.
    fn checkpoint_head(&self, run_id: &RunId) -> Result<ChainHead, rusqlite::Error> {
        Ok(self
            .conn
            .prepare_cached("SELECT last_hash, count FROM checkpoints WHERE run_id = ?1")?
            .query_row([run_id.as_str()], |row| {
                Ok(ChainHead {
                    hash: row.get(0)?,
                    next_seq: row.get::<_, i64>(1)? as u64,
                })
            })
            .optional()?
            .unwrap_or_else(ChainHead::genesis))
    }

    /// The run's head, creating the run (continuing after a checkpoint) if it is new.
    fn head(&mut self, run_id: &RunId, now: Timestamp) -> Result<&mut RunHead, rusqlite::Error> {
        if self.stored_head(run_id)?.is_none() {
            let chain = self.checkpoint_head(run_id)?;
            self.conn
                .prepare_cached("INSERT INTO runs (run_id, created_at) VALUES (?1, ?2)")?
                .execute(params![run_id.as_str(), now.as_millis()])?;
            let run_seq = self.conn.last_insert_rowid();
            self.heads.insert(
                run_id.clone(),
                RunHead {
                    run_seq,
                    chain,
                    closed: false,
                },
            );
        }
        Ok(self
            .heads
            .get_mut(run_id)
            .expect("stored_head or the insert above put it there"))
    }

    /// Appends to the run's chain, moving its open-command count by `open_delta`.
    fn append(&mut self, record: &PreparedRecord) -> Result<SealedLink, rusqlite::Error> {
        let at = record.at();
        let head = self.head(record.run_id(), at)?;
        let link = record.seal_link(&mut head.chain);
        let run_seq = head.run_seq;
        self.conn
            .prepare_cached(
                "INSERT INTO audit (run_seq, seq, at, record, prev_hash, hash) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                run_seq,
                link.seq as i64,
                at.as_millis(),
                link.canonical,
                link.prev_hash,
                link.hash,
            ])?;
        Ok(link)
    }

    fn reserve(
        &mut self,
        command: &Command,
        key: &str,
        audit: &PreparedRecord,
        identity: &str,
        state: &str,
    ) -> WriteResult<ReserveReply> {
        if command.business_key.is_none() {
            // Insert first: the unique key says whether the command existed, which saves a
            // lookup for every new command.
            return match self.insert_command(command, key, identity, state)? {
                Inserted::Yes => {
                    self.append(audit)?;
                    Ok(Ok(ReserveReply::Created))
                }
                Inserted::Exists => self.existing(command, key),
                Inserted::RunClosed => self.closed(command, key),
            };
        }
        // With a business key the claim decides first, so look before inserting. The claim,
        // its takeover of an orphan (a holder that was never recorded) and the insert below run
        // in this one transaction on the one writer thread, and another process on the file
        // waits for its write lock: no holder can reserve between another's look at the claim
        // and its insert, so the CQL ledger's stalled-holder hole (a takeover while the holder
        // is between its claim and its insert, which there needs a fence) cannot open here.
        if let Some(head) = self.stored_head(&command.run_id)? {
            if head.closed {
                return self.closed(command, key);
            }
            if self.load_row(command.run_id.as_str(), key)?.is_some() {
                return self.existing(command, key);
            }
        }
        if let Some(business_key) = &command.business_key {
            match self.claim(
                &command.tool,
                business_key,
                &command.run_id,
                &command.command_key,
                command.created_at,
            )? {
                Ok(Claim::Claimed) => {}
                Ok(Claim::HeldBy {
                    run_id,
                    command_key,
                }) => {
                    // claim() frees orphaned claims, so the holder exists.
                    let key = command_key.to_string();
                    return Ok(self
                        .load_row(run_id.as_str(), &key)?
                        .map(|row| ReserveReply::Held(run_id.to_string(), key, row))
                        .ok_or_else(|| LedgerError::Decode {
                            what: "business key holder",
                            run_id: run_id.to_string(),
                            why: "vanished inside the transaction".into(),
                        }));
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        match self.insert_command(command, key, identity, state)? {
            Inserted::Yes => {}
            Inserted::Exists => return self.existing(command, key),
            Inserted::RunClosed => return self.closed(command, key),
        }
        self.append(audit)?;
        Ok(Ok(ReserveReply::Created))
    }

    /// The refusal of `command` if its run holds a command someone other than its submitter
    /// submitted. A run the ledger has never seen costs no query.
    fn foreign(&mut self, command: &Command) -> Result<Option<LedgerError>, rusqlite::Error> {
        let Some(run_seq) = self.stored_head(&command.run_id)?.map(|head| head.run_seq) else {
            return Ok(None);
        };
        let submitter = command.submitted_by.as_deref();
        let other: Option<Option<String>> = self
            .conn
            .prepare_cached(
                "SELECT json_extract(identity, '$.submitted_by') FROM commands \
                 WHERE run_seq = ?1 AND json_extract(identity, '$.submitted_by') IS NOT ?2 \
                 LIMIT 1",
            )?
            .query_row(params![run_seq, submitter], |row| row.get(0))
            .optional()?;
        Ok(other.map(|other| LedgerError::foreign_run(command, other.as_deref())))
    }

    /// A reservation in a closed run: what is there still replays; nothing new goes in.
    fn closed(&mut self, command: &Command, key: &str) -> WriteResult<ReserveReply> {
        if self.load_row(command.run_id.as_str(), key)?.is_some() {
            return self.existing(command, key);
        }
        Ok(Err(LedgerError::RunClosed {
            run_id: command.run_id.to_string(),
            command_key: key.to_owned(),
        }))
    }

    /// Inserts the command unless its key exists or its run is closed.
    fn insert_command(
        &mut self,
        command: &Command,
        key: &str,
        identity: &str,
        state: &str,
    ) -> Result<Inserted, rusqlite::Error> {
        let head = self.head(&command.run_id, command.state.updated_at)?;
        if head.closed {
            return Ok(Inserted::RunClosed);
        }
        let run_seq = head.run_seq;
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO commands (run_seq, run_id, command_key, decision, call_idx, status, \
                 lease_epoch, due_at, args_hash, identity, state) \
                 VALUES (?11, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
                 ON CONFLICT (run_seq, command_key) DO NOTHING",
            )?
            .execute(params![
                command.run_id.as_str(),
                key,
                command.command_key.decision(),
                command.command_key.call_idx(),
                command.state.status.as_str(),
                command.state.lease.epoch.get() as i64,
                command.state.due_at.map(Timestamp::as_millis),
                command.args_hash.as_str(),
                identity,
                state,
                run_seq,
            ])?;
        Ok(if inserted == 1 {
            Inserted::Yes
        } else {
            Inserted::Exists
        })
    }

    /// The stored command under `key`: the same arguments replay it, others are drift.
    fn existing(&mut self, command: &Command, key: &str) -> WriteResult<ReserveReply> {
        let run_seq = self.stored_head(&command.run_id)?.map(|head| head.run_seq);
        let stored: Option<(String, String, String)> = match run_seq {
            None => None,
            Some(run_seq) => self
                .conn
                .prepare_cached(
                    "SELECT args_hash, identity, state FROM commands \
                     WHERE run_seq = ?1 AND command_key = ?2",
                )?
                .query_row(params![run_seq, key], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
                .optional()?,
        };
        let Some((stored_hash, identity, state)) = stored else {
            return Ok(Err(LedgerError::Decode {
                what: "command",
                run_id: command.run_id.to_string(),
                why: format!("{key} conflicted on insert but cannot be read"),
            }));
        };
        Ok(if stored_hash == command.args_hash.as_str() {
            Ok(ReserveReply::Existing((identity, state)))
        } else {
            Err(LedgerError::ArgumentDrift {
                run_id: command.run_id.to_string(),
                command_key: key.to_owned(),
                stored: stored_hash,
                presented: command.args_hash.to_string(),
            })
        })
    }

    fn transition(
        &mut self,
        transition: &Transition,
        key: &str,
        state: &str,
        audit: Option<&PreparedRecord>,
    ) -> WriteResult<CasReply> {
        let run = transition.run_id.as_str();
        let next = &transition.next;
        let Some(run_seq) = self
            .stored_head(&transition.run_id)?
            .map(|head| head.run_seq)
        else {
            return Ok(Ok(CasReply::Conflict(None)));
        };
        // Read, compare, then write by rowid: the writer holds the write lock for the whole
        // batch, so nothing can change the row in between, and this is cheaper than an
        // `UPDATE … RETURNING`, which SQLite runs through a temporary table.
        let current: Option<(i64, bool, String)> = self
            .conn
            .prepare_cached(
                "SELECT rowid, status = ?3 AND lease_epoch = ?4, identity FROM commands \
                 WHERE run_seq = ?1 AND command_key = ?2",
            )?
            .query_row(
                params![
                    run_seq,
                    key,
                    transition.guard.status.as_str(),
                    transition.guard.epoch.get() as i64,
                ],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()?;
        let Some((rowid, true, identity)) = current else {
            return Ok(Ok(CasReply::Conflict(self.load_row(run, key)?)));
        };
        self.conn
            .prepare_cached(
                "UPDATE commands SET status = ?1, lease_epoch = ?2, due_at = ?3, state = ?4 \
                 WHERE rowid = ?5",
            )?
            .execute(params![
                next.status.as_str(),
                next.lease.epoch.get() as i64,
                next.due_at.map(Timestamp::as_millis),
                state,
                rowid,
            ])?;
        if let Some(audit) = audit {
            self.append(audit)?;
        }
        // The command's budget holds follow its status in this same transaction.
        self.budget_follow(run, key, transition.guard.status, next.status)?;
        Ok(Ok(CasReply::Applied { identity }))
    }

    fn claim(
        &mut self,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
        at: Timestamp,
    ) -> WriteResult<Claim> {
        let tool_name = tool.to_string();
        let key = command_key.to_string();
        let holder: Option<(String, String)> = self
            .conn
            .prepare_cached(
                "SELECT run_id, command_key FROM business_keys WHERE tool = ?1 AND business_key = ?2",
            )?
            .query_row(params![tool_name, business_key.as_str()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()?;
        if let Some((held_run, held_key)) = holder {
            if held_run == run_id.as_str() && held_key == key {
                return Ok(Ok(Claim::Claimed));
            }
            let alive: Option<i64> = self
                .conn
                .prepare_cached(&format!(
                    "SELECT 1 FROM commands WHERE run_seq = {RUN_SEQ} AND command_key = ?2"
                ))?
                .query_row(params![held_run, held_key], |row| row.get(0))
                .optional()?;
            if alive.is_some() {
                let parsed = RunId::parse(&held_run)
                    .and_then(|run| CommandKey::parse(&held_key).map(|key| (run, key)));
                return Ok(match parsed {
                    Ok((run_id, command_key)) => Ok(Claim::HeldBy {
                        run_id,
                        command_key,
                    }),
                    Err(e) => Err(LedgerError::Decode {
                        what: "business key holder",
                        run_id: held_run,
                        why: e.to_string(),
                    }),
                });
            }
            // The holder was never recorded (a claim whose reservation did not follow):
            // the claim is free.
        }
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO business_keys (tool, business_key, run_id, command_key, claimed_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                tool_name,
                business_key.as_str(),
                run_id.as_str(),
                key,
                at.as_millis()
            ])?;
        Ok(Ok(Claim::Claimed))
    }

    fn purge(
        &mut self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
        dry_run: bool,
    ) -> WriteResult<PurgeReport> {
        let mut report = PurgeReport::default();
        // Candidates in pages by run_seq: a run kept for owed work does not use up the call's
        // `max_runs`, so runs after it are still reached. A page holds at least
        // `PURGE_PAGE` candidates, so many kept runs cost few queries.
        let mut after = 0i64;
        while (report.runs as usize) < max_runs {
            let left = (max_runs - report.runs as usize).max(PURGE_PAGE);
            let page: Vec<(i64, String)> = self
                .conn
                .prepare_cached(&format!(
                    "SELECT r.run_seq, r.run_id FROM runs r \
                     WHERE r.run_seq > ?4 AND r.created_at < ?1 AND r.run_id <> ?2 \
                     AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.run_seq = r.run_seq \
                                     AND c.status NOT IN {terminal}) \
                     AND COALESCE({last_at}, 0) < ?1 \
                     ORDER BY r.run_seq LIMIT ?3",
                    terminal = &*TERMINAL_STATUSES,
                    last_at = LAST_AUDIT_AT,
                ))?
                .query_map(
                    params![
                        older_than.as_millis(),
                        SYSTEM_RUN,
                        i64::try_from(left).unwrap_or(i64::MAX),
                        after
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )?
                .collect::<Result<_, _>>()?;
            let Some(&(last, _)) = page.last() else {
                break;
            };
            after = last;
            for (run_seq, run) in page {
                if report.runs as usize >= max_runs {
                    break;
                }
                let run_id = match RunId::parse(&run) {
                    Ok(run_id) => run_id,
                    Err(e) => {
                        return Ok(Err(LedgerError::Decode {
                            what: "run id",
                            run_id: run,
                            why: e.to_string(),
                        }));
                    }
                };
                match self.verdict(run_seq, &run)? {
                    // Only this writer writes, so a run read as all terminal is still so; a
                    // command that cannot be decoded keeps its run (`Open` here), as a run
                    // no one can read is not finished.
                    Some(PurgeVerdict::Open { .. }) | None => {}
                    Some(PurgeVerdict::Owes { command_key, owed }) => {
                        report.keep(run_id, command_key, owed);
                    }
                    Some(PurgeVerdict::Purge) => self.purge_run(run_id, &mut report, now)?,
                }
            }
        }
        if report.runs > 0 && !dry_run {
            let system = RunId::parse(SYSTEM_RUN).expect("SYSTEM_RUN is a valid run id");
            let draft = AuditDraft {
                command_key: None,
                from: None,
                to: None,
                actor: actor.to_owned(),
                reason: format!("purged finished runs older than {older_than}"),
                evidence: report.evidence(older_than),
            };
            self.append(&PreparedRecord::new(&system, draft, now))?;
        }
        Ok(Ok(report))
    }

    /// [`Self::purge`] inside a savepoint rolled back at its end: the same choice of runs and
    /// the same counts and checkpoints, with nothing written and no record of it. The cached
    /// heads of the runs it removed are dropped by the purge itself, so the rolled-back rows
    /// are read afresh; nothing else it touched is cached (the ledger's own record is not
    /// appended on a dry run).
    fn purge_dry_run(
        &mut self,
        older_than: Timestamp,
        max_runs: usize,
        actor: &str,
        now: Timestamp,
    ) -> WriteResult<PurgeReport> {
        self.conn.execute_batch("SAVEPOINT purge_dry_run")?;
        let report = self.purge(older_than, max_runs, actor, now, true);
        self.conn
            .execute_batch("ROLLBACK TO purge_dry_run; RELEASE purge_dry_run")?;
        Ok(report?.map(|mut report| {
            report.dry_run = true;
            report
        }))
    }

    /// The core's verdict on a run from its commands' states (`None`: a command that cannot
    /// be decoded, which keeps the run).
    fn verdict(
        &mut self,
        run_seq: i64,
        run: &str,
    ) -> Result<Option<PurgeVerdict>, rusqlite::Error> {
        let rows: Vec<(String, String)> = self
            .conn
            .prepare_cached("SELECT command_key, state FROM commands WHERE run_seq = ?1")?
            .query_map([run_seq], |row| Ok((row.get(0)?, row.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut commands = Vec::with_capacity(rows.len());
        for (key, state) in &rows {
            let (Ok(key), Ok(state)) = (
                CommandKey::parse(key),
                decode::<CommandState>("command state", run, state),
            ) else {
                return Ok(None);
            };
            commands.push((key, state));
        }
        Ok(Some(purge_verdict(commands.iter().map(|(k, s)| (k, s)))))
    }

    /// Deletes one run's commands, business keys and audit records, leaving its checkpoint.
    fn purge_run(
        &mut self,
        run_id: RunId,
        report: &mut PurgeReport,
        now: Timestamp,
    ) -> Result<(), rusqlite::Error> {
        let run = run_id.as_str().to_owned();
        let head = self.head(&run_id, now)?.clone();
        let chain = head.chain;
        self.heads.remove(&run_id);
        report.commands += self
            .conn
            .prepare_cached("DELETE FROM commands WHERE run_seq = ?1")?
            .execute([head.run_seq])? as u64;
        report.business_keys += self
            .conn
            .prepare_cached("DELETE FROM business_keys WHERE run_id = ?1")?
            .execute([&run])? as u64;
        self.purge_references(&run)?;
        report.audit_records += self
            .conn
            .prepare_cached("DELETE FROM audit WHERE run_seq = ?1")?
            .execute([head.run_seq])? as u64;
        // Its spend stays in the counters; the holds that made it up go once their window has
        // ended (nothing can release or move them any more). A `total` budget's stay.
        let ended = ended_windows_start_by(now);
        self.conn
            .prepare_cached(
                "UPDATE budget_counters SET holds = holds - \
                 (SELECT COUNT(*) FROM budget_holds h WHERE h.run_id = ?1 \
                  AND h.counter = budget_counters.counter AND h.state = 'held') \
                 WHERE window_start > 0 AND window_start <= ?2 \
                 AND counter IN (SELECT counter FROM budget_holds WHERE run_id = ?1)",
            )?
            .execute(params![run, ended])?;
        report.budget_holds += self
            .conn
            .prepare_cached(
                "DELETE FROM budget_holds WHERE run_id = ?1 AND counter IN \
                 (SELECT counter FROM budget_counters WHERE window_start > 0 AND window_start <= ?2)",
            )?
            .execute(params![run, ended])? as u64;
        self.conn
            .prepare_cached("DELETE FROM runs WHERE run_seq = ?1")?
            .execute([head.run_seq])?;
        let checkpoint = Checkpoint {
            run_id,
            last_hash: chain.hash,
            count: chain.next_seq,
            purged_at: now,
        };
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO checkpoints (run_id, last_hash, count, purged_at) \
                 VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                run,
                checkpoint.last_hash,
                checkpoint.count as i64,
                now.as_millis()
            ])?;
        report.runs += 1;
        report.checkpoints.push(checkpoint);
        Ok(())
    }
}
