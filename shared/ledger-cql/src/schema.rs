//! The CQL schema (`schemas/cql/`), its idempotent application (what `sluice migrate` runs) and
//! the record of what was applied.
//!
//! Each schema file applied to a keyspace is recorded in its `schema_migrations` table (file,
//! checksum, when, by which build), and `meta.schema_version` moves up to the number of files
//! applied. A migration applies only the files not recorded yet; a recorded file whose
//! checksum is not this build's is refused (someone edited a released file, or a build of
//! another lineage migrated the keyspace), and so is a keyspace newer than the build: every
//! start checks both ([`check`]), so a binary rolled back past a migration stops with both
//! versions named instead of running on tables it does not know. A keyspace migrated before
//! the record existed has every file re-applied (each statement is idempotent) and recorded.

#[cfg(feature = "driver")]
use scylla::client::session::Session;
#[cfg(feature = "driver")]
use scylla::errors::{ExecutionError, SchemaAgreementError};
#[cfg(feature = "driver")]
use scylla::frame::types::Consistency;
#[cfg(feature = "driver")]
use scylla::statement::unprepared::Statement;

#[cfg(feature = "driver")]
use crate::CqlError;
#[cfg(feature = "driver")]
use crate::codec::MINUTE_MS;
#[cfg(feature = "driver")]
use crate::config::validate_keyspace;
use crate::config::{Replication, Tablets};

/// The schema version this build writes and understands: the number of its schema files,
/// numbered from `001` without gaps (a test holds them to it), so adding a file moves it.
#[allow(clippy::cast_possible_wrap)] // a handful of files
pub const SCHEMA_VERSION: i64 = SCHEMA_FILES.len() as i64;

/// Who applied a file, as recorded: this build.
const APPLIED_BY: &str = concat!("sluice ", env!("CARGO_PKG_VERSION"));

/// The table recording which schema files were applied. Created by the migration itself, not
/// by a file: it must exist before the first file is recorded, and a keyspace migrated before
/// it existed gets it the same way.
const RECORD_TABLE: &str = "schema_migrations";

/// Schema files in order; each is applied whole, every statement idempotent.
const SCHEMA_FILES: [(&str, &str); 12] = [
    (
        "001_schema.cql",
        include_str!("../../../schemas/cql/001_schema.cql"),
    ),
    (
        "002_run_closed.cql",
        include_str!("../../../schemas/cql/002_run_closed.cql"),
    ),
    (
        "003_claim_fence.cql",
        include_str!("../../../schemas/cql/003_claim_fence.cql"),
    ),
    (
        "004_sweep_shards.cql",
        include_str!("../../../schemas/cql/004_sweep_shards.cql"),
    ),
    (
        "005_flow_controls.cql",
        include_str!("../../../schemas/cql/005_flow_controls.cql"),
    ),
    (
        "006_webhooks.cql",
        include_str!("../../../schemas/cql/006_webhooks.cql"),
    ),
    (
        "007_audit_links.cql",
        include_str!("../../../schemas/cql/007_audit_links.cql"),
    ),
    (
        "008_table_options.cql",
        include_str!("../../../schemas/cql/008_table_options.cql"),
    ),
    (
        "009_budgets.cql",
        include_str!("../../../schemas/cql/009_budgets.cql"),
    ),
    (
        "010_evidence.cql",
        include_str!("../../../schemas/cql/010_evidence.cql"),
    ),
    (
        "011_approval_links.cql",
        include_str!("../../../schemas/cql/011_approval_links.cql"),
    ),
    (
        "012_references.cql",
        include_str!("../../../schemas/cql/012_references.cql"),
    ),
];

#[cfg(feature = "driver")]
/// Whether a failed schema statement is one that was already applied: an `ALTER TABLE … ADD` of
/// a column the table has (CQL has no `ADD IF NOT EXISTS` on Cassandra 5).
fn already_applied(statement: &str, error: &str) -> bool {
    statement.starts_with("ALTER TABLE")
        && (error.contains("conflicts with an existing column") || error.contains("already exists"))
}

/// A file's statements as written (placeholders kept), comments and extra whitespace removed.
fn file_statements(text: &str) -> Vec<String> {
    let without_comments: String = text
        .lines()
        .map(|line| line.split("--").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    without_comments
        .split(';')
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect()
}

/// A file's statements for `keyspace`, in order.
fn statements_for(text: &str, keyspace: &str, replication: &str) -> Vec<String> {
    file_statements(text)
        .into_iter()
        .map(|s| {
            s.replace("{keyspace}", keyspace)
                .replace("{replication}", replication)
        })
        .collect()
}

/// The checksum recorded for a schema file: SHA-256 (hex) of its statements as written, one
/// per line. Of the statements, not the text: a comment or a line break edited in a released
/// file changes nothing applied, and must not stop every keyspace it was applied to.
pub fn file_checksum(text: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for statement in file_statements(text) {
        hasher.update(statement.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// This build's schema files, in order: name and checksum.
pub fn schema_files() -> Vec<(&'static str, String)> {
    SCHEMA_FILES
        .iter()
        .map(|(name, text)| (*name, file_checksum(text)))
        .collect()
}

/// The statements of the schema for `keyspace`, in order, comments removed.
pub fn schema_statements(
    keyspace: &str,
    replication: &Replication,
    tablets: Tablets,
) -> Vec<String> {
    let replication = format!("{replication}{}", tablets.clause());
    SCHEMA_FILES
        .iter()
        .flat_map(|(_, text)| statements_for(text, keyspace, &replication))
        .collect()
}

/// What a person applying [`schema_statements`] by hand runs after them so that services find
/// the schema recorded: the record table, one row per file applied at `at` (ms), and the
/// facts of `meta` that [`migrate`] writes (the schema version, the due index's origin).
pub fn record_statements(keyspace: &str, at: i64) -> Vec<String> {
    let mut statements = vec![record_table(keyspace)];
    let origin = at.div_euclid(60_000) - 1;
    for (name, value) in [
        ("schema_version", SCHEMA_VERSION),
        ("due_origin", origin),
        ("purge_day", origin / (24 * 60)),
    ] {
        statements.push(format!(
            "INSERT INTO {keyspace}.meta (name, value) VALUES ('{name}', {value}) IF NOT EXISTS"
        ));
    }
    statements.extend(schema_files().into_iter().map(|(file, checksum)| {
        format!(
            "INSERT INTO {keyspace}.{RECORD_TABLE} (file, checksum, applied_at, applied_by) \
             VALUES ('{file}', '{checksum}', {at}, '{APPLIED_BY} (by hand)') IF NOT EXISTS"
        )
    }));
    statements.push(format!(
        "UPDATE {keyspace}.meta SET value = {SCHEMA_VERSION} WHERE name = 'schema_version' \
         IF value < {SCHEMA_VERSION}"
    ));
    statements
}

/// The statement creating the record table.
fn record_table(keyspace: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {keyspace}.{RECORD_TABLE} (file text PRIMARY KEY, \
         checksum text, applied_at bigint, applied_by text)"
    )
}

/// A file recorded as applied to a keyspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedFile {
    pub file: String,
    /// [`file_checksum`] of the file as applied.
    pub checksum: String,
    /// Milliseconds since the epoch.
    pub applied_at: i64,
    /// The build that applied it (`sluice <version>`).
    pub applied_by: String,
}

#[cfg(feature = "driver")]
/// Whether the recorded files agree with this build's: each recorded file this build has must
/// carry its checksum. Returns the first that does not, as the error to start with.
fn verify_records(keyspace: &str, applied: &[AppliedFile]) -> Result<(), CqlError> {
    for (file, checksum) in schema_files() {
        if let Some(record) = applied.iter().find(|record| record.file == file)
            && record.checksum != checksum
        {
            return Err(CqlError::ChecksumMismatch {
                keyspace: keyspace.to_owned(),
                file: file.to_owned(),
                recorded: record.checksum.clone(),
                expected: checksum,
            });
        }
    }
    Ok(())
}

#[cfg(feature = "driver")]
/// The error of a keyspace whose schema is newer than this build's.
fn too_new(keyspace: &str, found: i64) -> CqlError {
    CqlError::SchemaTooNew {
        keyspace: keyspace.to_owned(),
        found,
        supported: SCHEMA_VERSION,
    }
}

#[cfg(feature = "driver")]
/// Drops `keyspace` and everything in it, and waits for the cluster to agree. For tooling that
/// made a keyspace of its own (`sluice bench` on a cluster); no service calls it.
pub async fn drop_keyspace(session: &Session, keyspace: &str) -> Result<(), CqlError> {
    validate_keyspace(keyspace)?;
    let statement = format!("DROP KEYSPACE IF EXISTS {keyspace}");
    let failed = |source: Box<dyn std::error::Error + Send + Sync>| CqlError::Migrate {
        keyspace: keyspace.to_owned(),
        statement: statement.clone(),
        source,
    };
    let mut ddl = Statement::new(statement.as_str());
    ddl.set_consistency(Consistency::All);
    // A drop flushes and snapshots the keyspace's tables first, which on a busy node outlasts
    // the request timeout while the drop goes on; `IF EXISTS` makes asking again safe.
    let mut attempt = 1;
    loop {
        match session.query_unpaged(ddl.clone(), ()).await {
            Ok(_) => break,
            Err(_) if attempt < DROP_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            Err(e) => return Err(failed(Box::new(e))),
        }
    }
    agree(session).await.map_err(|e| failed(Box::new(e)))?;
    Ok(())
}

#[cfg(feature = "driver")]
/// Waits for every node to agree on the schema, for up to [`AGREEMENT_ATTEMPTS`] times the
/// driver's own timeout: on a cluster whose nodes are busy or just started, a table's creation
/// can take minutes to reach every node, and a migration that gives up then leaves a service
/// that cannot start.
async fn agree(session: &Session) -> Result<(), SchemaAgreementError> {
    let mut attempt = 1;
    loop {
        match session.await_schema_agreement().await {
            Ok(_) => return Ok(()),
            Err(SchemaAgreementError::Timeout(_)) if attempt < AGREEMENT_ATTEMPTS => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(feature = "driver")]
/// Driver timeouts (60 s each) waited for schema agreement before a migration fails.
const AGREEMENT_ATTEMPTS: u32 = 4;

#[cfg(feature = "driver")]
/// Times a keyspace drop is asked for before its error is returned.
const DROP_ATTEMPTS: u32 = 3;

#[cfg(feature = "driver")]
/// Creates the keyspace (with `replication`, if it does not exist yet) and every table, records
/// each file it applies, and moves the schema version up to this build's. Safe to run again and
/// from several processes at once: a recorded file is not applied again, and every statement is
/// `IF NOT EXISTS`, or an `ALTER … ADD` whose "already there" answer counts as done. Refuses a
/// keyspace newer than this build, or one a recorded file of which has another checksum, before
/// applying anything.
pub async fn migrate(
    session: &Session,
    keyspace: &str,
    replication: &Replication,
) -> Result<(), CqlError> {
    migrate_with(session, keyspace, replication, Tablets::ServerDefault).await
}

#[cfg(feature = "driver")]
/// [`migrate`], choosing whether a new keyspace has tablets (ScyllaDB: it must not).
pub async fn migrate_with(
    session: &Session,
    keyspace: &str,
    replication: &Replication,
    tablets: Tablets,
) -> Result<(), CqlError> {
    validate_keyspace(keyspace)?;
    replication.validate()?;
    let failed =
        |statement: &str, source: Box<dyn std::error::Error + Send + Sync>| CqlError::Migrate {
            keyspace: keyspace.to_owned(),
            statement: statement.chars().take(120).collect(),
            source,
        };
    let tables = tables_of(session, keyspace)
        .await
        .map_err(|e| failed("read system_schema.tables", e))?;
    if tables.iter().any(|t| t == "meta")
        && let Some(found) = read_meta(session, keyspace, "schema_version")
            .await
            .map_err(|e| failed("read schema_version", e))?
        && found > SCHEMA_VERSION
    {
        return Err(too_new(keyspace, found));
    }
    let mut applied = if tables.iter().any(|t| t == RECORD_TABLE) {
        applied_files(session, keyspace)
            .await
            .map_err(|e| failed("read schema_migrations", e))?
    } else {
        Vec::new()
    };
    verify_records(keyspace, &applied)?;
    let replication_clause = format!("{replication}{}", tablets.clause());
    let mut record_table_made = tables.iter().any(|t| t == RECORD_TABLE);
    for (file, text) in SCHEMA_FILES {
        if applied.iter().any(|record| record.file == file) {
            continue;
        }
        for statement in statements_for(text, keyspace, &replication_clause) {
            apply(session, &statement)
                .await
                .map_err(|e| failed(&statement, e))?;
        }
        if !record_table_made {
            // The first file made the keyspace (or found it); the record goes beside it.
            let statement = record_table(keyspace);
            apply(session, &statement)
                .await
                .map_err(|e| failed(&statement, e))?;
            record_table_made = true;
        }
        agree(session)
            .await
            .map_err(|e| failed("await schema agreement", Box::new(e)))?;
        let record = AppliedFile {
            file: file.to_owned(),
            checksum: file_checksum(text),
            applied_at: sluice_core::time::Clock::now(&sluice_core::time::SystemClock).as_millis(),
            applied_by: APPLIED_BY.to_owned(),
        };
        record_file(session, keyspace, &record)
            .await
            .map_err(|e| failed("record a schema file", e))?;
        tracing::info!(keyspace, file, "CQL schema file applied and recorded");
        applied.push(record);
    }

    // The first minute a due entry can be filed in: sweeps never look before it.
    let now = sluice_core::time::SystemClock;
    let now = sluice_core::time::Clock::now(&now);
    let origin = now.as_millis() / MINUTE_MS - 1;
    let facts = [
        ("schema_version", SCHEMA_VERSION),
        ("due_origin", origin),
        ("purge_day", origin / (24 * 60)),
    ];
    let insert = format!("INSERT INTO {keyspace}.meta (name, value) VALUES (?, ?) IF NOT EXISTS");
    for (name, value) in facts {
        let mut statement = Statement::new(insert.as_str());
        statement.set_consistency(Consistency::Quorum);
        session
            .query_unpaged(statement, (name, value))
            .await
            .map_err(|e| failed(&insert, Box::new(e)))?;
    }
    // Up, never down: a keyspace an older build made reads 1 here; one a newer build
    // migrated meanwhile keeps its version (and is refused by the check below).
    let raise =
        format!("UPDATE {keyspace}.meta SET value = ? WHERE name = 'schema_version' IF value < ?");
    let mut statement = Statement::new(raise.as_str());
    statement.set_consistency(Consistency::Quorum);
    session
        .query_unpaged(statement, (SCHEMA_VERSION, SCHEMA_VERSION))
        .await
        .map_err(|e| failed(&raise, Box::new(e)))?;
    check(session, keyspace).await?;
    tracing::info!(keyspace, %replication, version = SCHEMA_VERSION, "CQL ledger schema is in place");
    Ok(())
}

#[cfg(feature = "driver")]
/// The check every start makes, migrating or not: the keyspace has a Sluice schema of this
/// build's version, and every file this build has is recorded with its checksum. A keyspace
/// newer than the build ([`CqlError::SchemaTooNew`]: a binary rolled back past a migration), a
/// recorded file of another checksum ([`CqlError::ChecksumMismatch`]) or an older keyspace
/// (`sluice migrate` has not run with this build) stops the start.
pub async fn check(session: &Session, keyspace: &str) -> Result<(), CqlError> {
    let unreadable = |e: Box<dyn std::error::Error + Send + Sync>| CqlError::Schema {
        keyspace: keyspace.to_owned(),
        why: format!("cannot be read ({e}); run `sluice migrate` first"),
    };
    let found = read_meta(session, keyspace, "schema_version")
        .await
        .map_err(unreadable)?
        .ok_or_else(|| CqlError::Schema {
            keyspace: keyspace.to_owned(),
            why: "has no Sluice ledger schema; run `sluice migrate` first".into(),
        })?;
    if found > SCHEMA_VERSION {
        return Err(too_new(keyspace, found));
    }
    let applied = match applied_files(session, keyspace).await {
        Ok(applied) => applied,
        // A keyspace migrated before the record existed has no record table: said below.
        Err(_) if found < SCHEMA_VERSION => Vec::new(),
        Err(e) => return Err(unreadable(e)),
    };
    verify_records(keyspace, &applied)?;
    let missing: Vec<&str> = SCHEMA_FILES
        .iter()
        .map(|(file, _)| *file)
        .filter(|file| !applied.iter().any(|record| record.file == *file))
        .collect();
    if found < SCHEMA_VERSION || !missing.is_empty() {
        let unrecorded = if missing.is_empty() {
            String::new()
        } else {
            format!(" ({} not recorded as applied)", missing.join(", "))
        };
        return Err(CqlError::Schema {
            keyspace: keyspace.to_owned(),
            why: format!(
                "has ledger schema version {found}{unrecorded}, this build needs {SCHEMA_VERSION}; run `sluice migrate` with this build first"
            ),
        });
    }
    Ok(())
}

#[cfg(feature = "driver")]
/// Applies one schema statement; an `ALTER … ADD` already applied counts as done.
async fn apply(
    session: &Session,
    statement: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut ddl = Statement::new(statement);
    ddl.set_consistency(Consistency::All);
    match session.query_unpaged(ddl, ()).await {
        Ok(_) => Ok(()),
        Err(e) if already_applied(statement, &e.to_string()) => Ok(()),
        // The statement was applied; only the driver's wait for every node to see it timed
        // out (a loaded or just-started node). Waiting longer is all there is to do.
        Err(ExecutionError::SchemaAgreementError(_)) => Ok(agree(session).await?),
        Err(e) => Err(Box::new(e)),
    }
}

#[cfg(feature = "driver")]
/// The tables of `keyspace` (none if it does not exist).
async fn tables_of(
    session: &Session,
    keyspace: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let mut statement =
        Statement::new("SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?");
    statement.set_consistency(Consistency::One);
    let rows = session
        .query_unpaged(statement, (keyspace,))
        .await?
        .into_rows_result()?;
    Ok(rows
        .rows::<(String,)>()?
        .map(|row| row.map(|(name,)| name))
        .collect::<Result<_, _>>()?)
}

#[cfg(feature = "driver")]
/// The files recorded as applied to `keyspace`, in file order.
pub async fn applied_files(
    session: &Session,
    keyspace: &str,
) -> Result<Vec<AppliedFile>, Box<dyn std::error::Error + Send + Sync>> {
    let mut statement = Statement::new(format!(
        "SELECT file, checksum, applied_at, applied_by FROM {keyspace}.{RECORD_TABLE}"
    ));
    statement.set_consistency(Consistency::Quorum);
    let rows = session
        .query_unpaged(statement, ())
        .await?
        .into_rows_result()?;
    type Row = (String, Option<String>, Option<i64>, Option<String>);
    let mut applied: Vec<AppliedFile> = rows
        .rows::<Row>()?
        .map(|row| {
            row.map(|(file, checksum, applied_at, applied_by)| AppliedFile {
                file,
                checksum: checksum.unwrap_or_default(),
                applied_at: applied_at.unwrap_or_default(),
                applied_by: applied_by.unwrap_or_default(),
            })
        })
        .collect::<Result<_, _>>()?;
    applied.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(applied)
}

#[cfg(feature = "driver")]
/// Records `record` as applied, unless another process recorded the file first (then its row
/// stands, and the checksums are compared at the next start).
async fn record_file(
    session: &Session,
    keyspace: &str,
    record: &AppliedFile,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut statement = Statement::new(format!(
        "INSERT INTO {keyspace}.{RECORD_TABLE} (file, checksum, applied_at, applied_by) \
         VALUES (?, ?, ?, ?) IF NOT EXISTS"
    ));
    statement.set_consistency(Consistency::Quorum);
    session
        .query_unpaged(
            statement,
            (
                &record.file,
                &record.checksum,
                record.applied_at,
                &record.applied_by,
            ),
        )
        .await?;
    Ok(())
}

#[cfg(feature = "driver")]
/// One value of the `meta` table.
pub(crate) async fn read_meta(
    session: &Session,
    keyspace: &str,
    name: &str,
) -> Result<Option<i64>, Box<dyn std::error::Error + Send + Sync>> {
    let mut statement = Statement::new(format!("SELECT value FROM {keyspace}.meta WHERE name = ?"));
    statement.set_consistency(Consistency::Quorum);
    let rows = session
        .query_unpaged(statement, (name,))
        .await?
        .into_rows_result()?;
    Ok(rows.maybe_first_row::<(Option<i64>,)>()?.and_then(|(v,)| v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_alter_whose_column_exists_counts_as_applied() {
        let alter = "ALTER TABLE ks.commands ADD run_closed_at bigint static";
        assert!(already_applied(
            alter,
            "Invalid column name run_closed_at because it conflicts with an existing column"
        ));
        assert!(!already_applied(alter, "Unauthorized: no ALTER permission"));
        assert!(!already_applied(
            "CREATE TABLE IF NOT EXISTS ks.x (a int PRIMARY KEY)",
            "conflicts with an existing column"
        ));
    }

    #[test]
    fn the_version_is_the_number_of_files_numbered_without_gaps() {
        for (index, (file, _)) in SCHEMA_FILES.iter().enumerate() {
            assert!(
                file.starts_with(&format!("{:03}_", index + 1)) && file.ends_with(".cql"),
                "schema file {index} is {file}: files are numbered 001, 002, … in order"
            );
        }
        assert_eq!(
            SCHEMA_VERSION,
            i64::try_from(SCHEMA_FILES.len()).expect("few")
        );
        const { assert!(SCHEMA_VERSION >= 7) };
    }

    #[test]
    fn a_checksum_follows_the_statements_not_the_comments() {
        let text = "-- a comment\nCREATE TABLE IF NOT EXISTS {keyspace}.x (a int PRIMARY KEY);\n";
        let reworded =
            "-- another comment\nCREATE TABLE IF NOT EXISTS {keyspace}.x\n  (a int PRIMARY KEY);";
        let changed = "CREATE TABLE IF NOT EXISTS {keyspace}.x (a bigint PRIMARY KEY);";
        assert_eq!(file_checksum(text), file_checksum(reworded));
        assert_ne!(file_checksum(text), file_checksum(changed));
        assert_eq!(file_checksum(text).len(), 64);
        let files = schema_files();
        assert_eq!(files.len(), SCHEMA_FILES.len());
        assert_eq!(files[0].0, "001_schema.cql");
    }

    #[test]
    fn the_statements_for_a_person_record_every_file_and_the_version() {
        let statements = record_statements("ks", 5);
        assert!(statements[0].starts_with("CREATE TABLE IF NOT EXISTS ks.schema_migrations"));
        assert_eq!(statements.len(), SCHEMA_FILES.len() + 5);
        assert!(statements[4].contains("'001_schema.cql'") && statements[4].contains(", 5, "));
        assert!(
            statements
                .last()
                .is_some_and(|s| s.contains(&format!("SET value = {SCHEMA_VERSION}")))
        );
    }

    #[test]
    fn the_schema_splits_into_keyspace_then_tables_then_alterations() {
        let statements = schema_statements(
            "sluice_test",
            &Replication::default(),
            Tablets::ServerDefault,
        );
        assert!(statements[0].starts_with("CREATE KEYSPACE IF NOT EXISTS sluice_test WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}"));
        let tables: Vec<_> = statements[1..]
            .iter()
            .map(|s| {
                s.strip_prefix("CREATE TABLE IF NOT EXISTS sluice_test.")
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap_or(s)
            })
            .collect();
        assert_eq!(
            tables,
            [
                "commands",
                "audit",
                "due",
                "sweep_cursor",
                "business_keys",
                "runs",
                "meta",
                "ALTER TABLE sluice_test.commands ADD run_closed_at bigint static",
                "ALTER TABLE sluice_test.business_keys ADD claim_id uuid",
                "ALTER TABLE sluice_test.commands ADD claim_fences map<uuid, bigint>",
                "sweep_shards",
                "sweep_members",
                "flow_controls",
                "webhook_deliveries",
                "ALTER TABLE sluice_test.commands ADD link_record text",
                "ALTER TABLE sluice_test.commands ADD link_prev text",
                "ALTER TABLE sluice_test.commands ADD link_hash text",
                "ALTER TABLE sluice_test.due WITH compaction = {'class': 'LeveledCompactionStrategy', 'sstable_size_in_mb': '64', 'tombstone_threshold': '0.2', 'unchecked_tombstone_compaction': 'true'} AND gc_grace_seconds = 10800",
                "ALTER TABLE sluice_test.audit WITH compaction = {'class': 'SizeTieredCompactionStrategy', 'tombstone_threshold': '0.2', 'unchecked_tombstone_compaction': 'true'} AND gc_grace_seconds = 864000",
                "budget_counters",
                "budget_windows",
                "budget_command_holds",
                "evidence_events",
                "evidence_held",
                "approval_link_uses",
                "evidence_references"
            ]
        );
        assert!(
            statements
                .iter()
                .all(|s| !s.contains("--") && !s.contains('{')
                    || s.starts_with("CREATE KEYSPACE")
                    || s.contains(" WITH compaction = {'class'"))
        );
    }
}
