//! Evidence received by webhook (`sluice_core::evidence`): one record per (source, event id),
//! stored insert-if-absent before the event is carried to its command, so the same event sent
//! twice (a sender's retry, a replayed capture) is recognised and never applied twice; and
//! listable per source, unmatched ones included, for an admin to read.
//!
//! Beside the records, the **reference index**: `(tool, reference) → idempotency key`, for the
//! events that name an effect by the upstream's own id (Stripe's `po_…`, the job id a 202
//! answered with) rather than by the key Sluice sent. It is written only for tools whose
//! `[tool.evidence]` declares a `reference_pointer`, before the transition that stores the
//! reference in the command (`sluice_runtime`'s `Context::drive`), so a stored reference is
//! never missing from it; first writer wins. An entry is a hint, never the truth: the reader
//! takes the command only if its tool and its own `external_ref` agree with the event.

use async_trait::async_trait;

use sluice_core::evidence::EvidenceRecord;
use sluice_core::ids::{IdempotencyKey, ToolName};

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

    /// Indexes `tool`'s effect `reference` to the command `key`, unless the pair is indexed
    /// already: the first writer wins (of any number of racing puts, one stores), and every
    /// put answers the key the index holds now — `key`, or the first writer's when another
    /// command of the tool took the same reference first (an upstream that reused an id).
    /// Idempotent for the holder. Entries are removed with their run (a purge), or on CQL by a
    /// TTL of the run retention and a day, like business keys.
    async fn reference_put(
        &self,
        tool: &ToolName,
        reference: &str,
        key: &IdempotencyKey,
    ) -> Result<IdempotencyKey, LedgerError>;

    /// The command `tool`'s effect `reference` is indexed to, if any. A hint: the caller reads
    /// the command and checks that it is of `tool` and stores this reference.
    async fn reference_get(
        &self,
        tool: &ToolName,
        reference: &str,
    ) -> Result<Option<IdempotencyKey>, LedgerError>;
}
