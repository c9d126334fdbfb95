//! How commands and rows are encoded: the command's fixed part and its state as JSON text, and
//! untyped result rows read by column name (LWT answers carry different columns depending on
//! whether they applied).

use std::sync::Arc;

use scylla::response::query_result::QueryResult;
use scylla::value::{CqlValue, Row};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use sluice_core::command::CommandStatus;
use sluice_core::time::Timestamp;
use sluice_ledger::LedgerError;
pub(crate) use sluice_ledger::identity::Identity;

pub(crate) fn encode<T: Serialize>(value: &T) -> String {
    // Our own types serialize to a String without failing: no maps with non-string keys and no
    // failing Serialize impls.
    serde_json::to_string(value).unwrap_or_default()
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(
    what: &'static str,
    run_id: &str,
    text: &str,
) -> Result<T, LedgerError> {
    serde_json::from_str(text).map_err(|e| LedgerError::Decode {
        what,
        run_id: run_id.to_owned(),
        why: e.to_string(),
    })
}

pub(crate) fn bad(what: &'static str, run_id: &str, why: impl Into<String>) -> LedgerError {
    LedgerError::Decode {
        what,
        run_id: run_id.to_owned(),
        why: why.into(),
    }
}

pub(crate) fn parse_status(run_id: &str, raw: &str) -> Result<CommandStatus, LedgerError> {
    raw.parse()
        .map_err(|e: sluice_core::command::UnknownStatus| {
            bad("command status", run_id, e.to_string())
        })
}

/// One result row, its values looked up by column name.
#[derive(Debug, Clone)]
pub(crate) struct Fields {
    names: Arc<[String]>,
    values: Vec<Option<CqlValue>>,
}

impl Fields {
    fn get(&self, name: &str) -> Option<&CqlValue> {
        let index = self.names.iter().position(|n| n == name)?;
        self.values.get(index)?.as_ref()
    }

    pub(crate) fn text(&self, name: &str) -> Option<&str> {
        self.get(name)
            .and_then(CqlValue::as_text)
            .map(String::as_str)
    }

    pub(crate) fn bigint(&self, name: &str) -> Option<i64> {
        self.get(name).and_then(CqlValue::as_bigint)
    }

    pub(crate) fn int(&self, name: &str) -> Option<i32> {
        self.get(name).and_then(CqlValue::as_int)
    }

    pub(crate) fn uuid(&self, name: &str) -> Option<Uuid> {
        self.get(name).and_then(CqlValue::as_uuid)
    }

    pub(crate) fn boolean(&self, name: &str) -> Option<bool> {
        self.get(name).and_then(CqlValue::as_boolean)
    }

    /// Whether the map column `name` holds the key `key`.
    pub(crate) fn map_has_uuid(&self, name: &str, key: Uuid) -> bool {
        matches!(self.get(name), Some(CqlValue::Map(entries))
            if entries.iter().any(|(k, _)| k.as_uuid() == Some(key)))
    }
}

/// The rows of a result, untyped; a result that is not rows (a write) has none.
pub(crate) fn rows_of(result: QueryResult) -> Result<Vec<Fields>, String> {
    if !result.is_rows() {
        return Ok(Vec::new());
    }
    let rows = result.into_rows_result().map_err(|e| e.to_string())?;
    let names: Arc<[String]> = rows
        .column_specs()
        .iter()
        .map(|spec| spec.name().to_owned())
        .collect();
    rows.rows::<Row>()
        .map_err(|e| e.to_string())?
        .map(|row| {
            row.map(|row| Fields {
                names: Arc::clone(&names),
                values: row.columns,
            })
            .map_err(|e| e.to_string())
        })
        .collect()
}

/// Minutes and days since the epoch, for the due index and the runs index.
/// The key of audit record `seq`'s row in its run's partition of `commands`: zero-padded, so
/// the records sort by seq, and `a-` sorts before every command key (`d-…`).
pub(crate) fn link_key(seq: i64) -> String {
    format!("{}{:020}", crate::statements::LINKS_START, seq.max(0))
}

/// The seq of a record's row key, [`link_key`]'s inverse.
pub(crate) fn link_seq(key: &str) -> Option<i64> {
    key.strip_prefix(crate::statements::LINKS_START)?
        .parse()
        .ok()
}

pub(crate) const MINUTE_MS: i64 = 60_000;
pub(crate) const DAY_MS: i64 = 86_400_000;

pub(crate) fn minute_of(at: Timestamp) -> i64 {
    at.as_millis().div_euclid(MINUTE_MS)
}

pub(crate) fn day_of(millis: i64) -> i64 {
    millis.div_euclid(DAY_MS)
}

/// FNV-1a: a hash that stays the same across builds and platforms, so every writer and
/// sweeper files a run in the same due shard.
pub(crate) fn shard_of(run_id: &str, shards: u32) -> i32 {
    // `shards` is at most 1024 (validated), so the shard fits an i32. The function is the
    // core's, so reconcilers lease the shards the entries are filed under.
    i32::try_from(sluice_core::sweep::shard_of(run_id, shards)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_and_in_range() {
        // Pinned: changing the hash would re-file every run of a live keyspace.
        assert_eq!(shard_of("r-abc", 4), shard_of("r-abc", 4));
        assert_eq!(shard_of("", 1024), (0x811c_9dc5_u32 % 1024) as i32);
        for i in 0..100 {
            let shard = shard_of(&format!("r-{i}"), 4);
            assert!((0..4).contains(&shard));
        }
    }

    #[test]
    fn minutes_and_days_floor_negative_times_too() {
        assert_eq!(minute_of(Timestamp::from_millis(59_999)), 0);
        assert_eq!(minute_of(Timestamp::from_millis(60_000)), 1);
        assert_eq!(minute_of(Timestamp::from_millis(-1)), -1);
        assert_eq!(day_of(DAY_MS * 3 + 5), 3);
    }
}
