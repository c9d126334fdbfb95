//! A run's head and a command row: as stored, as read (plain or SERIAL), and the basis a
//! guarded write is built on.

use super::*;

/// A run's partition-level state, from its static columns.
#[derive(Debug, Clone)]
pub(super) struct Head {
    /// `audit_seq` as stored (`None`: the run was never written).
    pub(super) stored_seq: Option<i64>,
    /// `audit_head` as stored: the value an LWT's condition compares.
    pub(super) stored_hash: Option<String>,
    pub(super) chain: ChainHead,
    /// The record at `audit_seq - 1` when a build before schema 007 wrote it: kept whole in
    /// the head (`audit_pending`) until its plain insert into `audit`, which the next writer
    /// makes sure of. Records written since are rows of the partition, written by their LWT.
    pub(super) pending: Option<Link>,
    pub(super) run_created_at: Option<i64>,
    pub(super) updated_at: Option<i64>,
    pub(super) checkpoint: Option<(i64, String, i64)>,
    /// Closed by a rollback: no new commands.
    pub(super) closed: bool,
}

impl Head {
    pub(super) fn empty() -> Self {
        Self {
            stored_seq: None,
            stored_hash: None,
            chain: ChainHead::genesis(),
            pending: None,
            run_created_at: None,
            updated_at: None,
            checkpoint: None,
            closed: false,
        }
    }

    pub(super) fn of(fields: &Fields) -> Self {
        let stored_seq = fields.bigint("audit_seq");
        let hash = fields.text("audit_head").unwrap_or(GENESIS_HASH).to_owned();
        let chain = match stored_seq {
            Some(seq) => ChainHead {
                next_seq: u64::try_from(seq).unwrap_or(0),
                hash: hash.clone(),
            },
            None => ChainHead::genesis(),
        };
        let pending = match (stored_seq, fields.text("audit_pending")) {
            (Some(seq), Some(record)) if seq > 0 => Some(Link {
                seq: seq - 1,
                record: record.to_owned(),
                prev_hash: fields
                    .text("audit_pending_prev")
                    .unwrap_or_default()
                    .to_owned(),
                hash,
                write_id: fields.uuid("audit_write_id"),
            }),
            _ => None,
        };
        let checkpoint = match (fields.bigint("ckpt_count"), fields.text("ckpt_hash")) {
            (Some(count), Some(hash)) => Some((
                count,
                hash.to_owned(),
                fields.bigint("ckpt_at").unwrap_or_default(),
            )),
            _ => None,
        };
        Self {
            stored_seq,
            stored_hash: fields.text("audit_head").map(str::to_owned),
            chain,
            pending,
            run_created_at: fields.bigint("run_created_at"),
            updated_at: fields.bigint("updated_at"),
            checkpoint,
            closed: fields.bigint("run_closed_at").is_some(),
        }
    }

    /// Records below this seq were purged.
    pub(super) fn floor(&self) -> i64 {
        self.checkpoint.as_ref().map_or(0, |c| c.0)
    }

    /// The head as an applied LWT left it: `chain` advanced past the record the LWT wrote
    /// (in its own row, so nothing is pending). `run_created_at` is what the LWT stored (or
    /// kept).
    pub(super) fn after(
        &self,
        chain: ChainHead,
        run_created_at: Option<i64>,
        updated_at: i64,
    ) -> Self {
        Self {
            stored_seq: Some(seq_i64(chain.next_seq)),
            stored_hash: Some(chain.hash.clone()),
            chain,
            pending: None,
            run_created_at,
            updated_at: Some(updated_at),
            checkpoint: self.checkpoint.clone(),
            closed: self.closed,
        }
    }
}

/// A command row as read, with the run's head.
#[derive(Debug, Clone)]
pub(super) struct StoredRow {
    pub(super) identity: Arc<Identity>,
    pub(super) state: CommandState,
    pub(super) due_at: Option<i64>,
    pub(super) args_hash: String,
    pub(super) write_id: Option<Uuid>,
    pub(super) head: Head,
}

impl StoredRow {
    pub(super) fn known(&self) -> Option<KnownRow> {
        Some(KnownRow {
            identity: Arc::clone(&self.identity),
            status: self.state.status,
            epoch: self.state.lease.epoch,
            due_at: self.due_at,
            write_id: self.write_id?,
        })
    }

    pub(super) fn basis(&self) -> Basis {
        Basis {
            identity: Arc::clone(&self.identity),
            due_at: self.due_at,
            write_id: self.write_id,
            head: self.head.clone(),
        }
    }

    pub(super) fn command(&self) -> Command {
        Identity::clone(&self.identity).with_state(self.state.clone())
    }
}

/// What a transition is computed from and pinned to: the row (its version is `write_id`) and
/// the run's head, as read just now or as this process last knew them.
#[derive(Debug, Clone)]
pub(super) struct Basis {
    pub(super) identity: Arc<Identity>,
    pub(super) due_at: Option<i64>,
    pub(super) write_id: Option<Uuid>,
    pub(super) head: Head,
}

impl CqlLedger {
    pub(super) async fn read_head(
        &self,
        op: Op,
        run: &str,
        serial: bool,
    ) -> Result<Head, LedgerError> {
        let (statement, kind) = if serial {
            (&self.inner.st.read_head_serial, Kind::Serial)
        } else {
            (&self.inner.st.read_head, Kind::Plain)
        };
        let rows = self.paged(op, "read head", statement, (run,), kind).await?;
        let head = rows.first().map_or_else(Head::empty, Head::of);
        self.remember_head(run, &head);
        Ok(head)
    }

    /// The command in `fields`, if it holds one. One that does not decode is
    /// [`LedgerError::UndecodableCommand`] and is quarantined; one of a newer build's status
    /// is [`LedgerError::NewerCommand`] (`sluice_ledger::stored`).
    pub(super) fn stored_row(
        &self,
        run: &str,
        fields: &Fields,
    ) -> Result<Option<StoredRow>, LedgerError> {
        let (Some(identity), Some(state)) = (fields.text("identity"), fields.text("state")) else {
            // The partition's static row (the run exists, this command does not), or a row
            // that holds only claim fences.
            return Ok(None);
        };
        let key = fields.text("command_key").unwrap_or_default();
        let noted = |e| self.inner.quarantine.note(e);
        Ok(Some(StoredRow {
            state: sluice_ledger::stored::state(run, key, state).map_err(noted)?,
            identity: Arc::new(sluice_ledger::stored::identity(run, key, identity).map_err(noted)?),
            due_at: fields.bigint("due_at"),
            args_hash: fields.text("args_hash").unwrap_or_default().to_owned(),
            write_id: fields.uuid("write_id"),
            head: Head::of(fields),
        }))
    }

    pub(super) async fn read_row(
        &self,
        op: Op,
        run: &str,
        key: &str,
        serial: bool,
    ) -> Result<Option<StoredRow>, LedgerError> {
        let rows = if serial {
            self.paged(
                op,
                "read command",
                &self.inner.st.read_command_serial,
                (run, key),
                Kind::Serial,
            )
            .await?
        } else {
            self.plain(op, "read command", &self.inner.st.read_command, (run, key))
                .await?
        };
        let Some(fields) = rows.first() else {
            return Ok(None);
        };
        let row = self.stored_row(run, fields)?;
        match &row {
            Some(row) => {
                self.remember_head(run, &row.head);
                self.remember_row(run, key, row.known());
            }
            None => self.remember_head(run, &Head::of(fields)),
        }
        Ok(row)
    }
}
