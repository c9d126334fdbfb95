//! Round trips to the cluster, each counted with its wait (`stats`): a plain request, a paged
//! read, and an LWT whose timeout is reported as an unknown outcome, never as not applied.
//! Also what the handle reports of itself through the [`Ledger`] port for the metrics: its
//! round trips, its write latency, the commands it quarantined or left to a newer build.

use super::*;

/// How a lightweight transaction went.
pub(super) enum Lwt {
    Applied,
    /// Not applied; the row holds the current values of the columns in the condition.
    NotApplied(Fields),
    /// It timed out or lost its connection: it may have applied.
    Unknown,
}

/// Whether a failed LWT may still have applied. Only errors that prove the request was never
/// acted on (refused before the Paxos round, or never sent) are "not applied"; anything else,
/// including errors this build does not know, is treated as unknown and settled by a read.
pub(super) fn outcome_unknown(error: &ExecutionError) -> bool {
    match error {
        ExecutionError::BadQuery(_)
        | ExecutionError::EmptyPlan
        | ExecutionError::PrepareError(_)
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::UseKeyspaceError(_) => false,
        ExecutionError::LastAttemptError(attempt) => match attempt {
            RequestAttemptError::SerializationError(_)
            | RequestAttemptError::CqlRequestSerialization(_)
            | RequestAttemptError::UnableToAllocStreamId => false,
            RequestAttemptError::DbError(db, _) => !matches!(
                db,
                DbError::SyntaxError
                    | DbError::Invalid
                    | DbError::AlreadyExists { .. }
                    | DbError::FunctionFailure { .. }
                    | DbError::AuthenticationError
                    | DbError::Unauthorized
                    | DbError::ConfigError
                    | DbError::Unavailable { .. }
                    | DbError::Overloaded
                    | DbError::IsBootstrapping
                    | DbError::TruncateError
                    | DbError::Unprepared { .. }
                    | DbError::RateLimitReached { .. }
                    | DbError::ProtocolError
            ),
            _ => true,
        },
        _ => true,
    }
}

/// A short random pause before trying again under contention (grows with the attempt).
pub(super) async fn back_off(attempt: u32) {
    let ceiling = 2u128 << attempt.min(6);
    let jitter = Uuid::new_v4().as_u128() % ceiling;
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(jitter).unwrap_or(1) + 1,
    ))
    .await;
}

impl CqlLedger {
    pub(super) async fn plain(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Vec<Fields>, LedgerError> {
        let trip = self.inner.stats.round_trip(op, Kind::Plain);
        let result = self
            .inner
            .session
            .execute_unpaged(statement, values)
            .await
            .map_err(|e| storage(what, e))?;
        drop(trip);
        rows_of(result).map_err(|why| storage_msg(what, why))
    }

    /// A read that may span pages; one round trip per page.
    pub(super) async fn paged(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        kind: Kind,
    ) -> Result<Vec<Fields>, LedgerError> {
        let mut rows = Vec::new();
        let mut paging = PagingState::start();
        loop {
            let trip = self.inner.stats.round_trip(op, kind);
            let (result, next) = self
                .inner
                .session
                .execute_single_page(statement, &values, paging)
                .await
                .map_err(|e| storage(what, e))?;
            drop(trip);
            rows.extend(rows_of(result).map_err(|why| storage_msg(what, why))?);
            match next {
                PagingStateResponse::HasMorePages { state } => paging = state,
                PagingStateResponse::NoMorePages => return Ok(rows),
            }
        }
    }

    pub(super) async fn lwt(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<Lwt, LedgerError> {
        let answer = self
            .timed_lwt(op, self.inner.session.execute_unpaged(statement, values))
            .await;
        self.lwt_answer(op, what, answer).await
    }

    /// An audited LWT: `statement` (which moves the run's head to `link`'s hash) and the
    /// insert of `link`'s own row into the same partition, as one conditional batch — one
    /// Paxos round, so the record exists exactly when the head names it (docs/cql.md, "Write
    /// protocol"). The batch applies or not as `statement`'s condition says.
    pub(super) async fn lwt_linked(
        &self,
        op: Op,
        what: &'static str,
        statement: &PreparedStatement,
        values: impl SerializeRow,
        run: &str,
        link: &Link,
    ) -> Result<Lwt, LedgerError> {
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(statement.clone());
        batch.append_statement(self.inner.st.insert_link.clone());
        batch.set_is_idempotent(false);
        if self.inner.config.lwt_timeout_ms > 0 {
            batch.set_request_timeout(Some(Duration::from_millis(
                self.inner.config.lwt_timeout_ms,
            )));
        }
        let key = link_key(link.seq);
        let row = (
            run,
            key.as_str(),
            link.record.as_str(),
            link.prev_hash.as_str(),
            link.hash.as_str(),
            link.write_id,
        );
        let answer = self
            .timed_lwt(op, self.inner.session.batch(&batch, (values, row)))
            .await;
        self.lwt_answer(op, what, answer).await
    }

    /// One LWT round trip, counted and timed (the ledger's write latency, which admission
    /// and lease sizing read).
    async fn timed_lwt<T>(&self, op: Op, request: impl Future<Output = T>) -> T {
        let trip = self.inner.stats.round_trip(op, Kind::Lwt);
        let started = std::time::Instant::now();
        let answer = request.await;
        self.inner.write_latency.observe(started.elapsed());
        drop(trip);
        answer
    }

    async fn lwt_answer(
        &self,
        op: Op,
        what: &'static str,
        answer: Result<scylla::response::query_result::QueryResult, ExecutionError>,
    ) -> Result<Lwt, LedgerError> {
        match answer {
            Ok(result) => {
                let row = rows_of(result)
                    .map_err(|why| storage_msg(what, why))?
                    .into_iter()
                    .next()
                    .ok_or_else(|| {
                        storage_msg(what, "the LWT answered without an [applied] row")
                    })?;
                Ok(if row.boolean("[applied]") == Some(true) {
                    Lwt::Applied
                } else {
                    Lwt::NotApplied(row)
                })
            }
            Err(e) if outcome_unknown(&e) => {
                self.inner.stats.unknown(op);
                tracing::warn!(op = what, error = %e, "LWT outcome unknown; settling it with a SERIAL read");
                // The request may still start its round at the coordinator: wait until it can
                // no longer apply before the read that decides.
                tokio::time::sleep(Duration::from_millis(
                    self.inner.config.unknown_settle_delay_ms,
                ))
                .await;
                Ok(Lwt::Unknown)
            }
            Err(e) => Err(storage(what, e)),
        }
    }
}

impl Ledger for CqlLedger {
    fn write_latency_ms(&self) -> i64 {
        self.inner.write_latency.millis()
    }

    fn db_identity(&self) -> sluice_ledger::DbIdentity<'_> {
        sluice_ledger::DbIdentity {
            system: "cassandra",
            namespace: &self.inner.config.keyspace,
        }
    }

    fn quarantined(&self) -> u64 {
        self.inner.quarantine.count()
    }

    fn left_for_newer(&self) -> u64 {
        self.inner.quarantine.newer_count()
    }

    fn round_trips(&self) -> Vec<sluice_ledger::RoundTrips> {
        self.stats()
            .ops
            .into_iter()
            .flat_map(|(op, counts)| {
                [
                    ("lwt", counts.lwt, counts.lwt_us),
                    ("serial", counts.serial, counts.serial_us),
                    ("plain", counts.plain, counts.plain_us),
                ]
                .map(|(kind, count, waited_us)| sluice_ledger::RoundTrips {
                    op,
                    kind,
                    count,
                    waited_us,
                })
            })
            .collect()
    }
}
