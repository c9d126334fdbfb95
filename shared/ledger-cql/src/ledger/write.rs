//! Transitions: the guarded LWT of every write after the reservation (lease, finalize,
//! transition, quiet write), the plain writes that must land before it, and how a write that
//! did not apply or whose outcome is unknown is retried or settled.

use super::*;

#[derive(scylla::SerializeRow)]
struct TransitionValues<'a> {
    status: &'a str,
    lease_epoch: i64,
    due_at: Option<i64>,
    state: &'a str,
    write_id: Uuid,
    next_seq: i64,
    head: &'a str,
    updated_at: i64,
    run_id: &'a str,
    command_key: &'a str,
    guard_status: &'a str,
    guard_epoch: i64,
    row_write_id: Option<Uuid>,
    seq: i64,
    seq_head: Option<&'a str>,
}

/// Which operation a transition is, for the counters.
pub(super) fn classify(transition: &Transition) -> Op {
    let (guard, next) = (&transition.guard, &transition.next);
    if transition.audit.is_none() {
        Op::QuietWrite
    } else if matches!(
        guard.status,
        CommandStatus::Pending | CommandStatus::Approved
    ) && next.status == CommandStatus::Leased
        && next.lease.epoch == guard.epoch.next()
    {
        Op::Lease
    } else if guard.status == CommandStatus::Leased
        && next.status != CommandStatus::Leased
        && next.lease.epoch == guard.epoch
    {
        Op::Finalize
    } else {
        Op::Transition
    }
}

impl CqlLedger {
    /// Everything that must exist before an LWT that may apply: the record the head still holds
    /// (repair rule), the due entry for a new due time and the `runs` entry of a new run. They go
    /// to different partitions and need no atomicity among themselves (each is idempotent, and
    /// one that lands without its LWT is harmless: the record is the head's own, the due entry
    /// is checked against the command, the runs entry against `run_created_at`), so they are
    /// one UNLOGGED BATCH: one round trip, not one each. A record too large for a quiet batch
    /// goes beside it, in parallel.
    pub(super) async fn before_lwt(
        &self,
        op: Op,
        run: &str,
        head: Option<&Head>,
        due: Option<(&str, Timestamp, CommandStatus)>,
        register: Option<i64>,
    ) -> Result<(), LedgerError> {
        type Values<'v> = Box<dyn SerializeRow + Send + Sync + 'v>;
        let st = &self.inner.st;
        let mut writes: Vec<(&PreparedStatement, Values<'_>)> = Vec::with_capacity(3);
        let pending = head.and_then(|head| match &head.pending {
            Some(link) if link.seq >= head.floor() && !self.known_flushed(run, link.seq) => {
                Some(link)
            }
            Some(_) | None => None,
        });
        let mut alone = None;
        if let Some(link) = pending {
            if link.record.len() + link.prev_hash.len() + link.hash.len() <= BATCH_RECORD_BYTES {
                writes.push((&st.insert_audit, Box::new(Self::link_values(run, link))));
            } else {
                alone = Some(link);
            }
        }
        if let Some((key, at, status)) = due {
            writes.push((
                &st.insert_due,
                Box::new(self.due_values(run, key, at, status)),
            ));
        }
        if let Some(created_at) = register {
            writes.push((
                &st.insert_run,
                Box::new((day_of(created_at), created_at, run)),
            ));
        }
        let together = async {
            match writes.len() {
                0 => Ok(()),
                1 => {
                    let (statement, values) = writes.pop().expect("one write, checked above");
                    self.plain(op, "write before LWT", statement, values)
                        .await
                        .map(drop)
                }
                _ => {
                    let (statements, values): (Vec<_>, Vec<_>) = writes.into_iter().unzip();
                    let mut batch = Batch::new(BatchType::Unlogged);
                    for statement in statements {
                        batch.append_statement(statement.clone());
                    }
                    // Every statement in it is a plain idempotent write.
                    batch.set_is_idempotent(true);
                    let _trip = self.inner.stats.round_trip(op, Kind::Plain);
                    self.inner
                        .session
                        .batch(&batch, values)
                        .await
                        .map(drop)
                        .map_err(|e| storage("write before LWT", e))
                }
            }
        };
        let alone = async {
            match alone {
                Some(link) => self.insert_link(op, run, link).await,
                None => Ok(()),
            }
        };
        futures::try_join!(together, alone)?;
        if let Some(link) = pending {
            self.mark_flushed(run, link.seq);
        }
        Ok(())
    }

    pub(super) async fn write(
        &self,
        op: Op,
        mut transition: Transition,
    ) -> Result<Cas, LedgerError> {
        transition.next.result = cap_result(transition.next.result.take());
        let state = encode(&transition.next);
        let next = &transition.next;
        let record = transition
            .audit
            .take()
            .map(|draft| PreparedRecord::new(&transition.run_id, draft, next.updated_at));
        let run = transition.run_id.as_str();
        let key = transition.command_key.to_string();
        let guard = transition.guard;
        let applied =
            |basis: &Basis| Cas::Applied(Identity::clone(&basis.identity).with_state(next.clone()));
        for attempt in 0..self.inner.config.max_attempts {
            // An audited transition of a row this process last wrote or read at the guard's
            // status and epoch goes straight to its LWT, pinned to that row version and head.
            let known = record
                .as_ref()
                .and_then(|_| self.known_basis(run, &key, guard));
            let stale = if known.is_some() {
                Stale::Cached
            } else {
                Stale::Read
            };
            let basis = match known {
                Some(basis) => basis,
                None => {
                    let Some(row) = self.read_row(op, run, &key, false).await? else {
                        return Ok(Cas::Conflict(None));
                    };
                    if row.state.status != guard.status || row.state.lease.epoch != guard.epoch {
                        return Ok(Cas::Conflict(Some(row.command())));
                    }
                    row.basis()
                }
            };
            let new_due = next
                .due_at
                .filter(|at| Some(at.as_millis()) != basis.due_at)
                .map(|at| (key.as_str(), at, next.status));
            let write_id = Uuid::new_v4();
            let known_row = || KnownRow {
                identity: Arc::clone(&basis.identity),
                status: next.status,
                epoch: next.lease.epoch,
                due_at: next.due_at.map(Timestamp::as_millis),
                write_id,
            };
            match &record {
                None => {
                    self.before_lwt(op, run, None, new_due, None).await?;
                    let values = (
                        next.status.as_str(),
                        epoch_i64(next.lease.epoch),
                        next.due_at.map(Timestamp::as_millis),
                        state.as_str(),
                        write_id,
                        run,
                        key.as_str(),
                        guard.status.as_str(),
                        epoch_i64(guard.epoch),
                    );
                    let done = match self.lwt(op, "write", &self.inner.st.quiet, values).await? {
                        Lwt::Applied => true,
                        Lwt::NotApplied(_) => false,
                        Lwt::Unknown => {
                            let now = self.read_row(op, run, &key, true).await?;
                            now.as_ref().and_then(|r| r.write_id) == Some(write_id)
                        }
                    };
                    if done {
                        self.remember_row(run, &key, Some(known_row()));
                        return Ok(applied(&basis));
                    }
                }
                Some(record) => {
                    self.before_lwt(op, run, Some(&basis.head), new_due, None)
                        .await?;
                    let mut chain = basis.head.chain.clone();
                    let sealed = record.seal_link(&mut chain);
                    let values = TransitionValues {
                        status: next.status.as_str(),
                        lease_epoch: epoch_i64(next.lease.epoch),
                        due_at: next.due_at.map(Timestamp::as_millis),
                        state: &state,
                        write_id,
                        next_seq: seq_i64(chain.next_seq),
                        head: &sealed.hash,
                        updated_at: next.updated_at.as_millis(),
                        run_id: run,
                        command_key: &key,
                        guard_status: guard.status.as_str(),
                        guard_epoch: epoch_i64(guard.epoch),
                        row_write_id: basis.write_id,
                        seq: seq_i64(sealed.seq),
                        seq_head: basis.head.stored_hash.as_deref(),
                    };
                    let link = Link::sealed(&sealed, write_id);
                    let statement = &self.inner.st.transition;
                    let done = match self
                        .lwt_linked(op, "transition", statement, values, run, &link)
                        .await?
                    {
                        Lwt::Applied => true,
                        Lwt::NotApplied(now) => {
                            self.forget(run, Some(&key), stale);
                            let guard_holds = now.text("status") == Some(guard.status.as_str())
                                && now.bigint("lease_epoch") == Some(epoch_i64(guard.epoch));
                            if guard_holds {
                                // Only the head or the row's version moved (another command of
                                // the run, a lease extension, a sweep): read and try again.
                                self.inner.stats.retry(op);
                                back_off(attempt).await;
                            }
                            false
                        }
                        Lwt::Unknown => {
                            self.forget(run, Some(&key), Stale::Read);
                            self.settle_audited(op, run, write_id, seq_i64(sealed.seq))
                                .await?
                        }
                    };
                    if done {
                        let after = basis.head.after(
                            chain,
                            basis.head.run_created_at,
                            next.updated_at.as_millis(),
                        );
                        self.remember_head(run, &after);
                        self.remember_row(run, &key, Some(known_row()));
                        let stale_due = basis
                            .due_at
                            .filter(|&old| Some(old) != next.due_at.map(Timestamp::as_millis));
                        if let Some(at) = stale_due {
                            self.delete_stale_due(op, run, &key, at).await;
                        }
                        return Ok(applied(&basis));
                    }
                }
            }
            // Not applied: the next round reads and either conflicts or tries again.
        }
        Err(self.too_contended(op, run))
    }
}
