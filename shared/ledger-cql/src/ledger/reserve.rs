//! Reservations: the LWT that writes a new command row (and registers a new run), under a
//! business-key claim when the tool has one, and what a reservation that finds the row
//! already there answers.

use super::*;

/// How the row write of a reservation went. Moved once, as `Reserved` itself is.
#[allow(clippy::large_enum_variant)]
pub(super) enum RowReserved {
    Done(Reserved),
    /// The business-key claim it was made under is fenced here (taken over, or being taken
    /// over): nothing was written; claim again.
    Fenced,
}

#[derive(scylla::SerializeRow)]
struct ReserveValues<'a> {
    status: &'a str,
    lease_epoch: i64,
    due_at: Option<i64>,
    args_hash: &'a str,
    identity: &'a str,
    state: &'a str,
    write_id: Uuid,
    next_seq: i64,
    head: &'a str,
    updated_at: i64,
    new_run_created_at: i64,
    run_id: &'a str,
    command_key: &'a str,
    seq: Option<i64>,
    seq_head: Option<&'a str>,
    run_created_at: Option<i64>,
}

/// A reservation under a business-key claim: the same, and the claim's id.
#[derive(scylla::SerializeRow)]
struct ClaimedReserveValues<'a> {
    #[scylla(flatten)]
    reserve: ReserveValues<'a>,
    claim_id: Uuid,
}

impl CqlLedger {
    /// Reserves `command`; `confined` refuses a run holding another submitter's command.
    pub(super) async fn reserve_as(
        &self,
        mut command: Command,
        audit: AuditDraft,
        confined: bool,
    ) -> Result<Reserved, LedgerError> {
        let op = Op::Reserve;
        self.inner.stats.call(op);
        command.state.result = cap_result(command.state.result.take());
        let record = PreparedRecord::new(&command.run_id, audit, command.state.updated_at);
        let mut fresh_claim = false;
        // A claim id this reservation found fenced: the next claim takes it over or gives way.
        let mut dead = None;
        for _ in 0..self.inner.config.max_attempts {
            let claim = match &command.business_key {
                None => None,
                Some(business_key) => {
                    sluice_faults::point!("ledger.claim_key.pre");
                    let claimed = self
                        .claim(
                            op,
                            &command.tool,
                            business_key,
                            &command.run_id,
                            &command.command_key,
                            dead,
                        )
                        .await?;
                    sluice_faults::point!("ledger.claim_key.post");
                    match claimed {
                        Claimed::Mine { id, fresh } => {
                            fresh_claim |= fresh;
                            Some(id)
                        }
                        Claimed::HeldBy(run, key) => {
                            let holder = self
                                .read_row(op, run.as_str(), &key.to_string(), false)
                                .await?
                                .ok_or_else(|| {
                                    bad(
                                        "business key holder",
                                        run.as_str(),
                                        format!("{key} vanished"),
                                    )
                                })?;
                            return Ok(Reserved::BusinessKeyHeld(holder.command()));
                        }
                    }
                }
            };
            self.pause("reserve.claimed", command.run_id.as_str()).await;
            sluice_faults::point!("ledger.reserve.pre");
            let row = self.reserve_row(&command, &record, confined, claim).await;
            sluice_faults::point!("ledger.reserve.post");
            let reserved = match row {
                Ok(RowReserved::Done(reserved)) => Ok(reserved),
                Ok(RowReserved::Fenced) => {
                    dead = claim;
                    continue;
                }
                Err(e) => Err(e),
            };
            if fresh_claim
                && matches!(
                    reserved,
                    Err(LedgerError::ArgumentDrift { .. }
                        | LedgerError::RunClosed { .. }
                        | LedgerError::ForeignRun { .. })
                )
            {
                self.release_claim(op, &command).await;
            }
            return reserved;
        }
        Err(self.too_contended(op, command.run_id.as_str()))
    }

    /// Writes the command's row, under business-key claim `claim` if it has one.
    pub(super) async fn reserve_row(
        &self,
        command: &Command,
        record: &PreparedRecord,
        confined: bool,
        claim: Option<Uuid>,
    ) -> Result<RowReserved, LedgerError> {
        let op = Op::Reserve;
        let run = command.run_id.as_str();
        let key = command.command_key.to_string();
        let identity = Arc::new(Identity::of(command));
        let encoded_identity = encode(&*identity);
        let state = encode(&command.state);
        for attempt in 0..self.inner.config.max_attempts {
            // The head as this process last read or wrote it, if it did: the LWT's condition
            // holds all of it that the write relies on, so a stale one only fails the LWT.
            // Unknown here, a run's first command is taken to open the run: its LWT, written
            // for a partition with no head, applies only if the run is new (issue 31: one
            // plain read less per run).
            let (head, source) = match self.known_head(run) {
                Some(head) => (head, Stale::Cached),
                None if attempt == 0 && guess_new_run(command) => (Head::empty(), Stale::Guessed),
                None => (self.read_head(op, run, false).await?, Stale::Read),
            };
            if head.closed {
                // A closed run: what is there still replays; nothing new goes in. (A cached head
                // that missed the closing fails its LWT below and is read afresh.)
                if let Some(stored) = self.read_row(op, run, &key, false).await? {
                    return self
                        .existing(command, &key, Some(stored))
                        .await
                        .map(RowReserved::Done);
                }
                return Err(LedgerError::RunClosed {
                    run_id: run.to_owned(),
                    command_key: key,
                });
            }
            // A run never written has no commands; one that was is read whole. The LWT below
            // is conditioned on the head this check saw, so a command added since fails it.
            if confined
                && head.stored_seq.is_some()
                && let Some(refused) = self.foreign(command).await?
            {
                return Err(refused);
            }
            let created_at = head
                .run_created_at
                .unwrap_or_else(|| command.created_at.as_millis());
            let register =
                (head.run_created_at.is_none() && run != SYSTEM_RUN).then_some(created_at);
            let due = command
                .state
                .due_at
                .map(|at| (key.as_str(), at, command.state.status));
            self.before_lwt(op, run, Some(&head), due, register).await?;
            let mut chain = head.chain.clone();
            let sealed = record.seal_link(&mut chain);
            let write_id = Uuid::new_v4();
            let values = ReserveValues {
                status: command.state.status.as_str(),
                lease_epoch: epoch_i64(command.state.lease.epoch),
                due_at: command.state.due_at.map(Timestamp::as_millis),
                args_hash: command.args_hash.as_str(),
                identity: &encoded_identity,
                state: &state,
                write_id,
                next_seq: seq_i64(chain.next_seq),
                head: &sealed.hash,
                updated_at: command.state.updated_at.as_millis(),
                new_run_created_at: created_at,
                run_id: run,
                command_key: &key,
                seq: head.stored_seq,
                seq_head: head.stored_hash.as_deref(),
                run_created_at: head.run_created_at,
            };
            let link = Link::sealed(&sealed, write_id);
            let outcome = match claim {
                None => {
                    self.lwt_linked(op, "reserve", &self.inner.st.reserve, values, run, &link)
                        .await?
                }
                Some(claim_id) => {
                    let values = ClaimedReserveValues {
                        reserve: values,
                        claim_id,
                    };
                    let statement = &self.inner.st.reserve_claimed;
                    self.lwt_linked(op, "reserve", statement, values, run, &link)
                        .await?
                }
            };
            let applied = match outcome {
                Lwt::Applied => true,
                Lwt::NotApplied(row) if row.text("status").is_some() => {
                    return self
                        .existing(command, &key, None)
                        .await
                        .map(RowReserved::Done);
                }
                Lwt::NotApplied(row)
                    if claim.is_some_and(|id| row.map_has_uuid("claim_fences", id)) =>
                {
                    return Ok(RowReserved::Fenced);
                }
                Lwt::NotApplied(_) if source == Stale::Guessed => {
                    // The run was not new: read its head and write on it, at once (not
                    // contention). Its `runs` entry written before the LWT names a creation
                    // time the run does not have: listings skip it, and delete it later.
                    self.inner.stats.guess_missed(op);
                    continue;
                }
                Lwt::NotApplied(_) => {
                    // The head moved, or the run was purged or registered: read it afresh.
                    self.forget(run, None, source);
                    self.inner.stats.retry(op);
                    back_off(attempt).await;
                    continue;
                }
                Lwt::Unknown => {
                    // Not a sign of a stale cache; the SERIAL read refreshes it.
                    self.forget(run, None, Stale::Read);
                    self.settle_audited(op, run, write_id, seq_i64(sealed.seq))
                        .await?
                }
            };
            if applied {
                let after = head.after(
                    chain,
                    Some(created_at),
                    command.state.updated_at.as_millis(),
                );
                self.remember_head(run, &after);
                self.remember_row(
                    run,
                    &key,
                    Some(KnownRow {
                        identity: Arc::clone(&identity),
                        status: command.state.status,
                        epoch: command.state.lease.epoch,
                        due_at: command.state.due_at.map(Timestamp::as_millis),
                        write_id,
                    }),
                );
                return Ok(RowReserved::Done(Reserved::Created(command.clone())));
            }
            if let Some(stored) = self.read_row(op, run, &key, false).await? {
                return self
                    .existing(command, &key, Some(stored))
                    .await
                    .map(RowReserved::Done);
            }
        }
        Err(self.too_contended(op, run))
    }

    /// The stored command under the key (read unless the caller just did): the same arguments
    /// replay it, others are drift.
    pub(super) async fn existing(
        &self,
        command: &Command,
        key: &str,
        stored: Option<StoredRow>,
    ) -> Result<Reserved, LedgerError> {
        let run = command.run_id.as_str();
        let stored = match stored {
            Some(stored) => stored,
            None => self
                .read_row(Op::Reserve, run, key, false)
                .await?
                .ok_or_else(|| bad("command", run, format!("{key} exists but cannot be read")))?,
        };
        if stored.args_hash == command.args_hash.as_str() {
            Ok(Reserved::Existing(stored.command()))
        } else {
            Err(LedgerError::ArgumentDrift {
                run_id: run.to_owned(),
                command_key: key.to_owned(),
                stored: stored.args_hash,
                presented: command.args_hash.to_string(),
            })
        }
    }
}

/// Whether a reservation should first take its run to be new: the command is the run's first
/// call of its first decision (an agent numbers its decisions from 0 or 1), the command most
/// often submitted before any other of the run. A guess that misses costs a failed LWT before
/// the head's read; one that hits saves the read. A run's later commands are not guessed: a
/// producer that has not seen the run (another replica wrote its first command) reads it.
fn guess_new_run(command: &Command) -> bool {
    command.command_key.decision() <= 1 && command.command_key.call_idx() == 0
}
