//! What this process knows of runs and rows: the cache of heads and rows it last read or
//! wrote (`Known`), which lets a transition skip its read, and the audit records it knows are
//! in `audit` (see the module doc of `ledger`, "What a process knows").

use super::*;

/// What this process last read or wrote of a command row: enough to write its next transition
/// without reading it first. The LWT that relies on it is guarded by `write_id` (the row is
/// exactly this version: same identity, state and due time) besides status and epoch.
#[derive(Debug, Clone)]
pub(super) struct KnownRow {
    pub(super) identity: Arc<Identity>,
    pub(super) status: CommandStatus,
    pub(super) epoch: LeaseEpoch,
    pub(super) due_at: Option<i64>,
    pub(super) write_id: Uuid,
}

/// The per-process cache of runs' heads and commands' rows, as this process last read or
/// wrote them (see `write` and `reserve_row`). It is only ever a guess: every LWT built on it
/// names in its condition all it relied on (`audit_seq`, `audit_head`, `run_created_at`, the
/// row's `write_id`), so a stale entry costs one LWT that does not apply, after which the
/// entry is dropped and the operation reads, as without a cache.
///
/// A run written by other processes too (an API reserving while a dispatcher leases) would
/// make that cost recur; so a run whose cached state once proved stale goes in `shared`, and
/// its writes read first from then on, as without a cache: at most one LWT lost per run and
/// process (per task, when several tasks of the process write the run from the same stale
/// entry at once). Bounded: past the capacity an arbitrary entry makes room.
#[derive(Debug, Default)]
pub(super) struct Known {
    pub(super) heads: HashMap<String, Head>,
    pub(super) rows: HashMap<(String, String), KnownRow>,
    pub(super) shared: HashMap<String, ()>,
}

/// What an LWT that did not apply was built on, for [`CqlLedger::forget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stale {
    /// A read made for it: ordinary contention.
    Read,
    /// The cache.
    Cached,
    /// Nothing: a run taken to be new without a read ([`guess_new_run`](super::reserve)).
    Guessed,
}

/// What [`CqlLedger::basis_of`] hands out and [`CqlLedger::adopt_basis`] takes back: the
/// row's version and the run's head that a compare-and-set from the copy is conditioned on.
/// Short names: it rides in every dispatch request.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct WireBasis {
    /// The row's `write_id`.
    w: Uuid,
    /// The head: `audit_seq`, `audit_head`, `run_created_at`, `updated_at`.
    s: i64,
    h: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    c: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    u: Option<i64>,
}

/// Entries of each map of [`Known`].
pub(super) const KNOWN_CAPACITY: usize = 10_000;

pub(super) fn make_room<K: Clone + Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>, key: &K) {
    if map.len() >= KNOWN_CAPACITY
        && !map.contains_key(key)
        && let Some(victim) = map.keys().next().cloned()
    {
        map.remove(&victim);
    }
}

impl CqlLedger {
    /// The head to write from without a read, unless the run is written by others too.
    pub(super) fn known_head(&self, run: &str) -> Option<Head> {
        let known = self.inner.known.lock().ok()?;
        if known.shared.contains_key(run) {
            return None;
        }
        known.heads.get(run).cloned()
    }

    /// Keeps `head` unless a later one (higher `audit_seq`) is known already: reads and writes
    /// of one run by concurrent tasks of this process complete in any order.
    pub(super) fn remember_head(&self, run: &str, head: &Head) {
        if let Ok(mut known) = self.inner.known.lock() {
            let key = run.to_owned();
            if known
                .heads
                .get(&key)
                .is_some_and(|known| known.stored_seq > head.stored_seq)
            {
                return;
            }
            make_room(&mut known.heads, &key);
            known.heads.insert(key, head.clone());
        }
    }

    /// A row is only worth keeping while it has transitions ahead; a terminal one (or one
    /// without a `write_id`, which an LWT could not pin) is dropped.
    pub(super) fn remember_row(&self, run: &str, key: &str, row: Option<KnownRow>) {
        if let Ok(mut known) = self.inner.known.lock() {
            let id = (run.to_owned(), key.to_owned());
            match row.filter(|row| !row.status.is_terminal()) {
                Some(row) => {
                    make_room(&mut known.rows, &id);
                    known.rows.insert(id, row);
                }
                None => {
                    known.rows.remove(&id);
                }
            }
        }
    }

    /// Drops what this process knows of a run's head and, with `key`, of that command: after
    /// an LWT that did not apply (or may not have), the next round reads. `Stale::Cached`: the
    /// LWT was built on the cache, so the run is written by others too (see [`Known`]).
    pub(super) fn forget(&self, run: &str, key: Option<&str>, stale: Stale) {
        if let Ok(mut known) = self.inner.known.lock() {
            known.heads.remove(run);
            if let Some(key) = key {
                known.rows.remove(&(run.to_owned(), key.to_owned()));
            }
            if stale == Stale::Cached {
                let run = run.to_owned();
                make_room(&mut known.shared, &run);
                known.shared.insert(run, ());
            }
        }
    }

    /// Drops everything known of a run (it was purged).
    pub(super) fn forget_run(&self, run: &str) {
        if let Ok(mut known) = self.inner.known.lock() {
            known.heads.remove(run);
            known.rows.retain(|(known_run, _), _| known_run != run);
        }
    }

    /// The row and head a transition under `guard` can be written from without a read: both
    /// known, and the row at the guard's status and epoch.
    pub(super) fn known_basis(&self, run: &str, key: &str, guard: Guard) -> Option<Basis> {
        let known = self.inner.known.lock().ok()?;
        if known.shared.contains_key(run) {
            return None;
        }
        let row = known
            .rows
            .get(&(run.to_owned(), key.to_owned()))
            .filter(|row| row.status == guard.status && row.epoch == guard.epoch)?;
        let head = known.heads.get(run)?;
        Some(Basis {
            identity: Arc::clone(&row.identity),
            due_at: row.due_at,
            write_id: Some(row.write_id),
            head: head.clone(),
        })
    }

    /// The row and head this process knows `key` by, for another process to adopt with a
    /// copy of the command (`CommandStore::basis`). Asked right after this process wrote the
    /// command, so even in a run written by others too (whose own writes here read first) it
    /// is what that write left, unless another write of the run came in between.
    pub(super) fn basis_of(&self, run: &str, key: &str) -> Option<String> {
        let known = self.inner.known.lock().ok()?;
        let row = known.rows.get(&(run.to_owned(), key.to_owned()))?;
        let head = known.heads.get(run)?;
        Some(encode(&WireBasis {
            w: row.write_id,
            s: head.stored_seq?,
            h: head.stored_hash.clone()?,
            c: head.run_created_at,
            u: head.updated_at,
        }))
    }

    /// Takes `copy` and its `basis` as though this process had written them
    /// (`CommandStore::adopt`): the next transition of the command writes its LWT from them
    /// without a read. A head this process knows at a later seq is kept.
    pub(super) fn adopt_basis(&self, copy: &Command, basis: &str) -> bool {
        let Ok(basis) = serde_json::from_str::<WireBasis>(basis) else {
            return false;
        };
        let Ok(next_seq) = u64::try_from(basis.s) else {
            return false;
        };
        let run = copy.run_id.as_str();
        let head = Head {
            stored_seq: Some(basis.s),
            stored_hash: Some(basis.h.clone()),
            chain: ChainHead {
                next_seq,
                hash: basis.h,
            },
            pending: None,
            run_created_at: basis.c,
            updated_at: basis.u,
            checkpoint: None,
            closed: false,
        };
        self.remember_head(run, &head);
        self.remember_row(
            run,
            copy.command_key.as_str(),
            Some(KnownRow {
                identity: Arc::new(Identity::of(copy)),
                status: copy.state.status,
                epoch: copy.state.lease.epoch,
                due_at: copy.state.due_at.map(Timestamp::as_millis),
                write_id: basis.w,
            }),
        );
        true
    }

    pub(super) fn known_flushed(&self, run: &str, seq: i64) -> bool {
        self.inner
            .flushed
            .lock()
            .map(|map| map.get(run).is_some_and(|&done| done >= seq))
            .unwrap_or(false)
    }

    pub(super) fn mark_flushed(&self, run: &str, seq: i64) {
        if let Ok(mut map) = self.inner.flushed.lock() {
            if map.len() >= FLUSHED_CAPACITY {
                map.clear();
            }
            let done = map.entry(run.to_owned()).or_insert(seq);
            *done = (*done).max(seq);
        }
    }
}
