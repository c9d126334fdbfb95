//! Evidence received by webhook (`sluice_core::evidence`): one record per (source, event id),
//! stored insert-if-absent before the event is carried to its command, so the same event sent
//! twice (a sender's retry, a replayed capture) is recognised and never applied twice; and
//! listable per source, unmatched ones included, for an admin to read.

use async_trait::async_trait;

use sluice_core::evidence::EvidenceRecord;

use crate::LedgerError;

/// How long a received event is kept: 30 days, well past every sender's retry schedule
/// (Stripe retries for three days). A replay after that finds no record; it is then carried to
/// its command again, whose state machine refuses what is settled already.
pub const EVIDENCE_RETENTION_MS: i64 = 30 * 24 * 3_600_000;

// A callback token lives no longer than its record is kept, so its second use is always a
// replay or expired (`sluice_core::callback::MAX_LIFETIME_MS`).
const _: () = assert!(EVIDENCE_RETENTION_MS >= sluice_core::callback::MAX_LIFETIME_MS);

/// The evidence records of one ledger.
#[async_trait]
pub trait EvidenceStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `record` unless one with its source and event id is stored: `None` when it was
    /// stored now, else the one stored before (of any number of racing puts, exactly one
    /// stores).
    async fn evidence_put(
        &self,
        record: &EvidenceRecord,
    ) -> Result<Option<EvidenceRecord>, LedgerError>;

    /// Rewrites a stored record (its disposition, what was done) once it was carried to its
    /// command.
    async fn evidence_settle(&self, record: &EvidenceRecord) -> Result<(), LedgerError>;

    /// The records of events that named the command `idempotency_key` and were kept, not
    /// applied ([`Disposition::Recorded`]: it was still PENDING or LEASED when they came), oldest
    /// first: the reconciler applies the latest when the command goes UNKNOWN.
    ///
    /// [`Disposition::Recorded`]: sluice_core::evidence::Disposition::Recorded
    async fn evidence_held(
        &self,
        idempotency_key: &str,
    ) -> Result<Vec<EvidenceRecord>, LedgerError>;

    /// `source`'s records still kept, newest first, at most `limit`.
    async fn evidence_list(
        &self,
        source: &str,
        limit: usize,
    ) -> Result<Vec<EvidenceRecord>, LedgerError>;
}
