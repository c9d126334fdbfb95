//! The per-run audit hash chain.
//!
//! Every transition of a run's commands appends one [`AuditRecord`]. Each entry stores
//! `hash = sha256(prev_hash || canonical_json(record))`, where `prev_hash` is the 32 raw bytes of
//! the previous entry's hash (the genesis value is 32 zero bytes), so changing, removing,
//! reordering or inserting any record breaks every later link. [`verify`] recomputes a chain and
//! names the first broken link.
//!
//! Retention removes whole finished runs. What it leaves is a [`Checkpoint`] (the last hash, the
//! number of records and the purge time): a chain that continues after a checkpoint starts from
//! its hash and count, so what remains still verifies, and the purge is itself recorded.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::canonical::to_canonical_bytes;
use crate::command::CommandStatus;
use crate::ids::{CommandKey, RunId};
use crate::time::Timestamp;

/// Hash before the first record of a run: 32 zero bytes, in hex.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One hashed fact about a run: a transition, a compensation, an operator action, a purge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub run_id: RunId,
    pub seq: u64,
    pub at: Timestamp,
    /// The command concerned; `None` for a run-level record such as a purge.
    pub command_key: Option<CommandKey>,
    pub from: Option<CommandStatus>,
    pub to: Option<CommandStatus>,
    pub actor: String,
    pub reason: String,
    #[serde(default)]
    pub evidence: Value,
}

/// A record before the ledger gives it its place (`seq`) in the run's chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditDraft {
    pub command_key: Option<CommandKey>,
    pub from: Option<CommandStatus>,
    pub to: Option<CommandStatus>,
    pub actor: String,
    pub reason: String,
    #[serde(default)]
    pub evidence: Value,
}

impl AuditDraft {
    /// A record of a command moving between states.
    pub fn transition(
        command_key: &CommandKey,
        from: Option<CommandStatus>,
        to: CommandStatus,
        actor: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            command_key: Some(command_key.clone()),
            from,
            to: Some(to),
            actor: actor.into(),
            reason: reason.into(),
            evidence: Value::Null,
        }
    }

    #[must_use]
    pub fn with_evidence(mut self, evidence: Value) -> Self {
        self.evidence = evidence;
        self
    }
}

/// A record in its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    #[serde(flatten)]
    pub record: AuditRecord,
    pub prev_hash: String,
    pub hash: String,
}

/// What retention leaves of a purged run: enough to continue and verify its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub run_id: RunId,
    pub last_hash: String,
    /// Records removed; the next record of the run has this `seq`.
    pub count: u64,
    pub purged_at: Timestamp,
}

/// The end of a chain, where the next record goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub next_seq: u64,
    pub hash: String,
}

impl ChainHead {
    /// The head of a run with no records.
    pub fn genesis() -> Self {
        Self {
            next_seq: 0,
            hash: GENESIS_HASH.to_owned(),
        }
    }

    /// The head after a checkpoint.
    pub fn after(checkpoint: &Checkpoint) -> Self {
        Self {
            next_seq: checkpoint.count,
            hash: checkpoint.last_hash.clone(),
        }
    }

    /// Places `draft` at the end of the chain and moves the head past it.
    pub fn append(&mut self, run_id: &RunId, draft: AuditDraft, at: Timestamp) -> AuditEntry {
        let record = AuditRecord {
            run_id: run_id.clone(),
            seq: self.next_seq,
            at,
            command_key: draft.command_key,
            from: draft.from,
            to: draft.to,
            actor: draft.actor,
            reason: draft.reason,
            evidence: draft.evidence,
        };
        let hash = link_hash(&self.hash, &record);
        let entry = AuditEntry {
            record,
            prev_hash: std::mem::replace(&mut self.hash, hash.clone()),
            hash,
        };
        self.next_seq += 1;
        entry
    }
}

/// `sha256(prev_hash || canonical_json(record))`, in lowercase hex.
pub fn link_hash(prev_hash: &str, record: &AuditRecord) -> String {
    let record = serde_json::to_value(record).unwrap_or(Value::Null);
    link_hash_canonical(prev_hash, &to_canonical_bytes(&record))
}

/// [`link_hash`] of a record already in canonical form.
pub fn link_hash_canonical(prev_hash: &str, canonical_record: &[u8]) -> String {
    let mut hasher = Sha256::new();
    // Every hash this chain writes is 32 bytes; decode those on the stack (a ledger's single
    // writer computes one link per transition).
    let mut digest = [0u8; 32];
    if hex::decode_to_slice(prev_hash, &mut digest).is_ok() {
        hasher.update(digest);
    } else {
        match hex::decode(prev_hash) {
            Ok(bytes) => hasher.update(&bytes),
            // A malformed stored hash still hashes deterministically, and can never match a
            // well-formed chain, so verification reports the link instead of panicking.
            Err(_) => hasher.update(prev_hash.as_bytes()),
        }
    }
    hasher.update(canonical_record);
    let mut text = [0u8; 64];
    // 64 bytes of room for 32 bytes in hex: cannot fail.
    let hex = hex::encode_to_slice(hasher.finalize(), &mut text)
        .map(|()| text.as_slice())
        .unwrap_or_default();
    String::from_utf8_lossy(hex).into_owned()
}

/// A record whose canonical form is computed except for its place in the chain.
///
/// A ledger appends records on one serialising writer; preparing the record beforehand on the
/// caller's thread leaves the writer only to splice in the sequence number and hash. The
/// canonical form sorts keys, and `seq` sorts after every other key but `to`, so the text is
/// `prefix + seq + suffix`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedRecord {
    record: AuditRecord,
    prefix: String,
    suffix: String,
}

/// The record's canonical text before and after its `seq`, written field by field in the
/// canonical order (keys sorted: actor, at, command_key, evidence, from, reason, run_id, seq,
/// to) instead of through a `Value` tree; a property test holds it to the canonical form of the
/// serialized record.
fn canonical_around_seq(record: &AuditRecord) -> (String, String) {
    use crate::canonical::{into_string, write_string, write_value};
    let status = |status: Option<CommandStatus>, out: &mut Vec<u8>| match status {
        Some(status) => write_string(status.as_str(), out),
        None => out.extend_from_slice(b"null"),
    };
    let mut prefix = Vec::with_capacity(256);
    prefix.extend_from_slice(b"{\"actor\":");
    write_string(&record.actor, &mut prefix);
    prefix.extend_from_slice(b",\"at\":");
    write_string(&record.at.to_string(), &mut prefix);
    prefix.extend_from_slice(b",\"command_key\":");
    match &record.command_key {
        Some(key) => write_string(key.as_str(), &mut prefix),
        None => prefix.extend_from_slice(b"null"),
    }
    prefix.extend_from_slice(b",\"evidence\":");
    write_value(&record.evidence, &mut prefix);
    prefix.extend_from_slice(b",\"from\":");
    status(record.from, &mut prefix);
    prefix.extend_from_slice(b",\"reason\":");
    write_string(&record.reason, &mut prefix);
    prefix.extend_from_slice(b",\"run_id\":");
    write_string(record.run_id.as_str(), &mut prefix);
    prefix.extend_from_slice(b",\"seq\":");
    let mut suffix = Vec::with_capacity(32);
    suffix.extend_from_slice(b",\"to\":");
    status(record.to, &mut suffix);
    suffix.push(b'}');
    (into_string(prefix), into_string(suffix))
}

impl PreparedRecord {
    pub fn new(run_id: &RunId, draft: AuditDraft, at: Timestamp) -> Self {
        let record = AuditRecord {
            run_id: run_id.clone(),
            seq: 0,
            at,
            command_key: draft.command_key,
            from: draft.from,
            to: draft.to,
            actor: draft.actor,
            reason: draft.reason,
            evidence: draft.evidence,
        };
        let (prefix, suffix) = canonical_around_seq(&record);
        Self {
            record,
            prefix,
            suffix,
        }
    }

    pub fn run_id(&self) -> &RunId {
        &self.record.run_id
    }

    pub fn at(&self) -> Timestamp {
        self.record.at
    }

    /// Places the record at `head` and moves the head past it: the link as stored (its
    /// canonical text and hashes), without building the entry.
    pub fn seal_link(&self, head: &mut ChainHead) -> SealedLink {
        let mut canonical = String::with_capacity(self.prefix.len() + 20 + self.suffix.len());
        canonical.push_str(&self.prefix);
        // `seq` in decimal, as JSON writes an integer; writing to a String cannot fail.
        let _ = crate::ids::write_decimal(&mut canonical, head.next_seq);
        canonical.push_str(&self.suffix);
        let hash = link_hash_canonical(&head.hash, canonical.as_bytes());
        let link = SealedLink {
            seq: head.next_seq,
            canonical,
            prev_hash: std::mem::replace(&mut head.hash, hash.clone()),
            hash,
        };
        head.next_seq += 1;
        link
    }

    /// The entry of a sealed link.
    pub fn entry(&self, link: &SealedLink) -> AuditEntry {
        let mut record = self.record.clone();
        record.seq = link.seq;
        AuditEntry {
            record,
            prev_hash: link.prev_hash.clone(),
            hash: link.hash.clone(),
        }
    }

    /// Places the record at `head`: returns the entry and its canonical text, and moves the
    /// head past it.
    pub fn seal(&self, head: &mut ChainHead) -> (AuditEntry, String) {
        let link = self.seal_link(head);
        (self.entry(&link), link.canonical)
    }
}

/// A record placed in its chain, as stored: its canonical text and the hashes around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedLink {
    pub seq: u64,
    pub canonical: String,
    pub prev_hash: String,
    pub hash: String,
}

/// A chain that verified: how many records, and its head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verified {
    pub records: u64,
    pub head: ChainHead,
    pub checkpoint: Option<Checkpoint>,
}

/// Why a link failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakKind {
    /// The stored hash is not the hash of the stored record: the record was altered.
    HashMismatch,
    /// The stored previous hash is not the hash of the record before: a record was removed,
    /// inserted or reordered.
    PrevHashMismatch,
    /// The sequence numbers skip or repeat.
    SequenceGap,
    /// The record belongs to another run.
    ForeignRecord,
}

/// The first broken link of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error(
    "audit chain of run {run_id} is broken at seq {seq}: {kind:?} (expected {expected}, found {found})"
)]
pub struct BrokenLink {
    pub run_id: RunId,
    pub seq: u64,
    pub kind: BreakKind,
    pub expected: String,
    pub found: String,
}

/// Recomputes a run's chain from its checkpoint (if any) and entries in `seq` order.
pub fn verify(
    run_id: &RunId,
    checkpoint: Option<&Checkpoint>,
    entries: &[AuditEntry],
) -> Result<Verified, BrokenLink> {
    let mut head = checkpoint.map_or_else(ChainHead::genesis, ChainHead::after);
    let broken = |seq, kind, expected: String, found: String| BrokenLink {
        run_id: run_id.clone(),
        seq,
        kind,
        expected,
        found,
    };
    for entry in entries {
        let record = &entry.record;
        if &record.run_id != run_id {
            return Err(broken(
                record.seq,
                BreakKind::ForeignRecord,
                run_id.to_string(),
                record.run_id.to_string(),
            ));
        }
        if record.seq != head.next_seq {
            return Err(broken(
                head.next_seq,
                BreakKind::SequenceGap,
                head.next_seq.to_string(),
                record.seq.to_string(),
            ));
        }
        if entry.prev_hash != head.hash {
            return Err(broken(
                record.seq,
                BreakKind::PrevHashMismatch,
                head.hash.clone(),
                entry.prev_hash.clone(),
            ));
        }
        let recomputed = link_hash(&head.hash, record);
        if recomputed != entry.hash {
            return Err(broken(
                record.seq,
                BreakKind::HashMismatch,
                recomputed,
                entry.hash.clone(),
            ));
        }
        head = ChainHead {
            next_seq: head.next_seq + 1,
            hash: entry.hash.clone(),
        };
    }
    Ok(Verified {
        records: entries.len() as u64,
        head,
        checkpoint: checkpoint.cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run() -> RunId {
        RunId::parse("r-audit").expect("valid")
    }

    fn key(i: u32) -> CommandKey {
        CommandKey::parse(&format!("d-{i}/payments/wire/0")).expect("valid")
    }

    fn chain(n: u32) -> Vec<AuditEntry> {
        let mut head = ChainHead::genesis();
        (0..n)
            .map(|i| {
                let draft = AuditDraft::transition(
                    &key(i),
                    Some(CommandStatus::Pending),
                    CommandStatus::Leased,
                    "dispatcher",
                    "lease",
                )
                .with_evidence(json!({"i": i}));
                head.append(&run(), draft, Timestamp::from_millis(i64::from(i)))
            })
            .collect()
    }

    #[test]
    fn a_prepared_record_seals_to_the_same_chain() {
        let mut by_append = ChainHead::genesis();
        let mut by_seal = ChainHead::genesis();
        for i in 0..4u32 {
            let draft = AuditDraft::transition(
                &key(i),
                Some(CommandStatus::Leased),
                CommandStatus::Confirmed,
                "dispatcher",
                "committed",
            )
            .with_evidence(json!({"seq": 99, "nested": {"to": "x"}, "n": 1.0}));
            let at = Timestamp::from_millis(7);
            let appended = by_append.append(&run(), draft.clone(), at);
            let (sealed, text) = PreparedRecord::new(&run(), draft, at).seal(&mut by_seal);
            assert_eq!(sealed, appended);
            // The stored text reads back to a record that hashes to the same link (numbers
            // keep their canonical spelling, so `1.0` reads back as `1`).
            let parsed: AuditRecord = serde_json::from_str(&text).expect("canonical text parses");
            assert_eq!(link_hash(&sealed.prev_hash, &parsed), sealed.hash);
            let reparsed: Value = serde_json::from_str(&text).expect("json");
            assert_eq!(crate::canonical::to_canonical_string(&reparsed), text);
        }
        assert_eq!(by_append, by_seal);
    }

    #[test]
    fn prepared_text_is_the_canonical_form_of_the_record() {
        let drafts = [
            AuditDraft::transition(
                &key(3),
                Some(CommandStatus::Unknown),
                CommandStatus::Stuck,
                "reconciler \"7\"",
                "no answer\nafter 3 checks: é \u{1F600} <&>",
            )
            .with_evidence(
                json!({"z": [3, 1.5, null], "a": {"y": "\u{0001}", "b": true}, "é": 1.0}),
            ),
            AuditDraft::transition(
                &key(0),
                None,
                CommandStatus::Pending,
                "producer",
                "reserved",
            ),
            AuditDraft {
                command_key: None,
                from: None,
                to: None,
                actor: "operator".into(),
                reason: "purge".into(),
                evidence: json!({"runs": 2}),
            },
        ];
        let mut head = ChainHead::genesis();
        for (i, draft) in drafts.into_iter().enumerate() {
            let at = Timestamp::from_millis(1_700_000_000_123 + i as i64);
            let (entry, text) = PreparedRecord::new(&run(), draft, at).seal(&mut head);
            let value = serde_json::to_value(&entry.record).expect("a record is JSON");
            assert_eq!(text, crate::canonical::to_canonical_string(&value));
        }
    }

    proptest::proptest! {
        #[test]
        fn any_record_is_prepared_as_its_canonical_form(
            actor in "\\PC{0,24}",
            reason in "(\\PC|[\n\t\"\\\\\u{1}\u{7f}]){0,40}",
            from in proptest::option::of(0..CommandStatus::ALL.len()),
            to in proptest::option::of(0..CommandStatus::ALL.len()),
            command in proptest::option::of(0_u32..1_000),
            millis in -1_000_000_000_000_i64..5_000_000_000_000,
            evidence in proptest::collection::btree_map("\\PC{0,8}", "\\PC{0,8}", 0..4),
            seq in 0_u64..100_000,
        ) {
            let draft = AuditDraft {
                command_key: command.map(key),
                from: from.map(|i| CommandStatus::ALL[i]),
                to: to.map(|i| CommandStatus::ALL[i]),
                actor,
                reason,
                evidence: serde_json::to_value(&evidence).expect("a map is JSON"),
            };
            let mut head = ChainHead { next_seq: seq, hash: GENESIS_HASH.to_owned() };
            let at = Timestamp::from_millis(millis);
            let (entry, text) = PreparedRecord::new(&run(), draft, at).seal(&mut head);
            let value = serde_json::to_value(&entry.record).expect("a record is JSON");
            proptest::prop_assert_eq!(text, crate::canonical::to_canonical_string(&value));
        }
    }

    #[test]
    fn links_hash_as_specified_for_any_seq_and_prev_hash() {
        use sha2::{Digest, Sha256};
        let draft = AuditDraft::transition(
            &key(1),
            None,
            CommandStatus::Pending,
            "dispatcher",
            "reserve",
        );
        let record = PreparedRecord::new(&run(), draft, Timestamp::from_millis(1));
        // Well-formed, odd-length and non-hex previous hashes, and seqs of every width.
        for prev in [GENESIS_HASH, "abcd", "zz", ""] {
            for seq in [0, 7, 10, 99, 12_345, u64::MAX - 1] {
                let mut head = ChainHead {
                    next_seq: seq,
                    hash: prev.to_owned(),
                };
                let link = record.seal_link(&mut head);
                let mut record_at = record.record.clone();
                record_at.seq = seq;
                let text = serde_json::to_value(&record_at).expect("serializes");
                assert_eq!(link.canonical, crate::canonical::to_canonical_string(&text));
                let mut expected = Sha256::new();
                expected.update(hex::decode(prev).unwrap_or_else(|_| prev.as_bytes().to_vec()));
                expected.update(link.canonical.as_bytes());
                assert_eq!(link.hash, hex::encode(expected.finalize()));
                assert_eq!((head.next_seq, &head.hash), (seq + 1, &link.hash));
            }
        }
    }

    #[test]
    fn an_untouched_chain_verifies() {
        let entries = chain(5);
        let verified = verify(&run(), None, &entries).expect("verifies");
        assert_eq!(verified.records, 5);
        assert_eq!(verified.head.next_seq, 5);
        assert_eq!(verified.head.hash, entries[4].hash);
        assert_eq!(entries[0].prev_hash, GENESIS_HASH);
    }

    #[test]
    fn an_altered_record_is_named_at_its_seq() {
        let mut entries = chain(5);
        entries[2].record.reason = "nothing to see".into();
        let broken = verify(&run(), None, &entries).expect_err("tampered");
        assert_eq!((broken.seq, broken.kind), (2, BreakKind::HashMismatch));
    }

    #[test]
    fn a_removed_record_is_a_gap() {
        let mut entries = chain(5);
        entries.remove(3);
        let broken = verify(&run(), None, &entries).expect_err("gap");
        assert_eq!((broken.seq, broken.kind), (3, BreakKind::SequenceGap));
    }

    #[test]
    fn a_rehashed_forgery_breaks_the_next_link() {
        let mut entries = chain(5);
        entries[1].record.actor = "mallory".into();
        entries[1].hash = link_hash(&entries[1].prev_hash, &entries[1].record);
        let broken = verify(&run(), None, &entries).expect_err("forged");
        assert_eq!((broken.seq, broken.kind), (2, BreakKind::PrevHashMismatch));
    }

    #[test]
    fn a_chain_continues_after_a_checkpoint() {
        let entries = chain(6);
        let checkpoint = Checkpoint {
            run_id: run(),
            last_hash: entries[3].hash.clone(),
            count: 4,
            purged_at: Timestamp::from_millis(99),
        };
        let verified = verify(&run(), Some(&checkpoint), &entries[4..]).expect("verifies");
        assert_eq!(verified.records, 2);
        assert_eq!(verified.head.next_seq, 6);
        let broken = verify(&run(), Some(&checkpoint), &entries[3..]).expect_err("overlap");
        assert_eq!(broken.kind, BreakKind::SequenceGap);
    }
}
