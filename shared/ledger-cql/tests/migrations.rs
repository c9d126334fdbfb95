//! The CQL schema's migration record against a real Cassandra node: every file applied is
//! recorded with its checksum, the schema version follows the files, a keyspace migrated before
//! the record existed is recorded as it stands, and a start refuses a keyspace newer than the
//! build or a recorded file whose checksum is not the build's.
//!
//! The node is `SLUICE_TEST_CQL_NODES` (default `127.0.0.1:19042`); `SLUICE_SKIP_CQL=1` skips
//! this file. Each test makes a keyspace of its own (named like `tests/cassandra.rs`'s, so a
//! leftover is dropped by its next run) and drops it at the end.

use std::io::Write;

use sluice_core::time::{Clock, SystemClock};
use sluice_ledger_cql::{
    CqlConfig, CqlError, CqlLedger, Replication, SCHEMA_VERSION, applied_files, schema_files,
};

const NODES_VAR: &str = "SLUICE_TEST_CQL_NODES";
const SKIP_VAR: &str = "SLUICE_SKIP_CQL";
const DEFAULT_NODES: &str = "127.0.0.1:19042";

fn nodes() -> Vec<String> {
    std::env::var(NODES_VAR)
        .unwrap_or_else(|_| DEFAULT_NODES.to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

fn skip_if_asked() {
    if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        let _ = writeln!(
            std::io::stderr(),
            "{SKIP_VAR}=1: the CQL migration tests are skipped (no Cassandra node)"
        );
        std::process::exit(0);
    }
}

/// A fresh keyspace's settings (the name as `tests/cassandra.rs` makes them).
fn config() -> CqlConfig {
    let secs = SystemClock.now().as_millis() / 1_000;
    let unique = uuid::Uuid::new_v4().simple().to_string();
    CqlConfig {
        nodes: nodes(),
        keyspace: format!("sluice_t_{secs}_{}", &unique[..10]),
        replication: Replication::Simple {
            replication_factor: 1,
        },
        ..CqlConfig::default()
    }
}

/// Connects without migrating: what a service with `migrate_on_start = false` does.
fn without_migrating(config: &CqlConfig) -> CqlConfig {
    CqlConfig {
        migrate_on_start: false,
        ..config.clone()
    }
}

async fn connect(config: &CqlConfig) -> CqlLedger {
    skip_if_asked();
    CqlLedger::connect(config.clone())
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no CQL node answers at {} ({e}); start one with `scripts/engines/start.sh cassandra`, \
                 or set {SKIP_VAR}=1 to skip these tests",
                nodes().join(",")
            )
        })
}

async fn run(ledger: &CqlLedger, cql: String) {
    ledger
        .session()
        .query_unpaged(cql.as_str(), ())
        .await
        .unwrap_or_else(|e| panic!("{cql}: {e}"));
}

async fn schema_version(ledger: &CqlLedger) -> i64 {
    let keyspace = &ledger.config().keyspace;
    let rows = ledger
        .session()
        .query_unpaged(
            format!("SELECT value FROM {keyspace}.meta WHERE name = 'schema_version'"),
            (),
        )
        .await
        .expect("read meta")
        .into_rows_result()
        .expect("rows");
    rows.single_row::<(i64,)>().expect("one version").0
}

async fn drop_keyspace(ledger: &CqlLedger) {
    sluice_ledger_cql::drop_keyspace(ledger.session(), &ledger.config().keyspace)
        .await
        .expect("drop the test keyspace");
}

/// A new keyspace has every file recorded with this build's checksum and the version of the
/// files; a keyspace that an older build migrated (no record table, version 1, as every build
/// before the record left it) is refused by a start that does not migrate, with both versions
/// named, and recorded whole by one that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_file_is_recorded_and_an_older_keyspace_is_recorded_as_it_stands() {
    let config = config();
    let ledger = connect(&config).await;
    let keyspace = config.keyspace.clone();
    let expected = schema_files();
    let recorded = applied_files(ledger.session(), &keyspace)
        .await
        .expect("records");
    assert_eq!(
        recorded
            .iter()
            .map(|r| (r.file.as_str(), r.checksum.clone()))
            .collect::<Vec<_>>(),
        expected
            .iter()
            .map(|(file, sum)| (*file, sum.clone()))
            .collect::<Vec<_>>()
    );
    let now = SystemClock.now().as_millis();
    assert!(recorded.iter().all(|r| r.applied_by.starts_with("sluice ")
        && r.applied_at > now - 600_000
        && r.applied_at <= now));
    assert_eq!(schema_version(&ledger).await, SCHEMA_VERSION);
    // A start that does not migrate finds it all in place.
    CqlLedger::connect(without_migrating(&config))
        .await
        .expect("a migrated keyspace starts without migrating");
    // A second migration applies nothing and keeps the first records.
    let again = connect(&config).await;
    assert_eq!(
        applied_files(again.session(), &keyspace)
            .await
            .expect("records"),
        recorded
    );

    // The keyspace as a build before the record left it.
    run(&ledger, format!("DROP TABLE {keyspace}.schema_migrations")).await;
    run(
        &ledger,
        format!("UPDATE {keyspace}.meta SET value = 1 WHERE name = 'schema_version'"),
    )
    .await;
    let refused = CqlLedger::connect(without_migrating(&config))
        .await
        .expect_err("an older keyspace is not started on without a migration");
    let said = refused.to_string();
    assert!(
        said.contains("schema version 1")
            && said.contains(&format!("needs {SCHEMA_VERSION}"))
            && said.contains("sluice migrate"),
        "{said}"
    );
    let migrated = connect(&config).await;
    let rerecorded = applied_files(migrated.session(), &keyspace)
        .await
        .expect("records");
    assert_eq!(rerecorded.len(), expected.len());
    assert!(
        rerecorded
            .iter()
            .zip(&expected)
            .all(|(r, (file, sum))| r.file == *file && r.checksum == *sum)
    );
    assert_eq!(schema_version(&migrated).await, SCHEMA_VERSION);
    CqlLedger::connect(without_migrating(&config))
        .await
        .expect("the upgraded keyspace starts without migrating");
    drop_keyspace(&ledger).await;
}

/// A binary older than the keyspace (its schema version is higher than the build's) refuses
/// to start, migrating or not, with both versions named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_older_than_the_keyspace_refuses_to_start() {
    let config = config();
    let ledger = connect(&config).await;
    let keyspace = config.keyspace.clone();
    let newer = SCHEMA_VERSION + 1;
    run(
        &ledger,
        format!("UPDATE {keyspace}.meta SET value = {newer} WHERE name = 'schema_version'"),
    )
    .await;
    for config in [config.clone(), without_migrating(&config)] {
        let migrating = config.migrate_on_start;
        let err = CqlLedger::connect(config)
            .await
            .expect_err("a newer keyspace is refused");
        assert!(
            matches!(err, CqlError::SchemaTooNew { found, supported, .. }
                if found == newer && supported == SCHEMA_VERSION),
            "migrating: {migrating}: {err}"
        );
        let said = err.to_string();
        assert!(
            said.contains(&format!("schema version {newer}"))
                && said.contains(&format!("this build's {SCHEMA_VERSION}"))
                && said.contains(&keyspace),
            "{said}"
        );
    }
    // The refusal changed nothing: the version stays the newer build's.
    assert_eq!(schema_version(&ledger).await, newer);
    drop_keyspace(&ledger).await;
}

/// A recorded file whose checksum is not this build's copy's is refused, migrating or not,
/// naming the file and both checksums.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_checksum_of_an_applied_file_is_refused() {
    let config = config();
    let ledger = connect(&config).await;
    let keyspace = config.keyspace.clone();
    let file = "003_claim_fence.cql";
    let tampered = "0".repeat(64);
    run(
        &ledger,
        format!(
            "UPDATE {keyspace}.schema_migrations SET checksum = '{tampered}' WHERE file = '{file}'"
        ),
    )
    .await;
    let ours = schema_files()
        .into_iter()
        .find(|(name, _)| *name == file)
        .expect("the build has the file")
        .1;
    for config in [config.clone(), without_migrating(&config)] {
        let err = CqlLedger::connect(config)
            .await
            .expect_err("a changed checksum is refused");
        assert!(
            matches!(&err, CqlError::ChecksumMismatch { file: named, recorded, expected, .. }
                if named == file && *recorded == tampered && *expected == ours),
            "{err}"
        );
        assert!(err.to_string().contains(file), "{err}");
    }
    drop_keyspace(&ledger).await;
}
