//! Schema 008's table options, read back from a real Cassandra node's `system_schema.tables`
//! after a migrate (`SLUICE_TEST_CQL_NODES`, `scripts/engines/start.sh cassandra`;
//! `SLUICE_SKIP_CQL=1` skips): the due index compacts leveled and keeps tombstones 3 hours,
//! the audit table compacts size-tiered and keeps them 10 days, both with single-sstable
//! tombstone compactions on; and migrating again changes nothing.

use std::collections::HashMap;

use sluice_core::time::{Clock, SystemClock};
use sluice_ledger_cql::{CqlConfig, CqlLedger, Replication};

/// `gc_grace_seconds` and `compaction` of `table`, as the node holds them.
async fn options(ledger: &CqlLedger, table: &str) -> (i32, HashMap<String, String>) {
    let keyspace = ledger.config().keyspace.clone();
    let rows = ledger
        .session()
        .query_unpaged(
            "SELECT gc_grace_seconds, compaction FROM system_schema.tables \
             WHERE keyspace_name = ? AND table_name = ?",
            (keyspace, table),
        )
        .await
        .expect("system_schema.tables reads")
        .into_rows_result()
        .expect("rows");
    let (grace, compaction) = rows
        .single_row::<(i32, HashMap<String, String>)>()
        .unwrap_or_else(|e| panic!("{table} is in system_schema.tables: {e}"));
    (grace, compaction)
}

async fn assert_options(ledger: &CqlLedger) {
    let (grace, compaction) = options(ledger, "due").await;
    assert_eq!(grace, 10_800, "due keeps tombstones 3 h: {compaction:?}");
    assert!(
        compaction["class"].ends_with("LeveledCompactionStrategy"),
        "{compaction:?}"
    );
    assert_eq!(compaction["unchecked_tombstone_compaction"], "true");
    assert_eq!(compaction["tombstone_threshold"], "0.2");
    let (grace, compaction) = options(ledger, "audit").await;
    assert_eq!(
        grace, 864_000,
        "audit keeps tombstones 10 days: {compaction:?}"
    );
    assert!(
        compaction["class"].ends_with("SizeTieredCompactionStrategy"),
        "{compaction:?}"
    );
    assert_eq!(compaction["unchecked_tombstone_compaction"], "true");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_due_index_and_the_audit_table_have_their_options_after_migrate() {
    if std::env::var("SLUICE_SKIP_CQL").is_ok_and(|v| v == "1") {
        eprintln!("SLUICE_SKIP_CQL=1: skipped");
        return;
    }
    let nodes: Vec<String> = std::env::var("SLUICE_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:19042".to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let secs = SystemClock.now().as_millis() / 1_000;
    let config = CqlConfig {
        nodes,
        keyspace: format!("sluice_t_{secs}_{}", &unique[..10]),
        replication: Replication::Simple {
            replication_factor: 1,
        },
        ..CqlConfig::default()
    };
    let ledger = CqlLedger::connect(config.clone())
        .await
        .expect("a Cassandra node (scripts/engines/start.sh cassandra)");
    assert_options(&ledger).await;
    // The file runs again on every migrate: the same options, no error.
    sluice_ledger_cql::migrate(ledger.session(), &config.keyspace, &config.replication)
        .await
        .expect("a second migrate");
    assert_options(&ledger).await;
    let _ = sluice_ledger_cql::drop_keyspace(ledger.session(), &config.keyspace).await;
}
