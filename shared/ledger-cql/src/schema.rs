//! The CQL schema (`schemas/cql/`) and its idempotent application: what `sluice migrate` runs.

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

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = 1;

/// Schema files in order; each is applied whole, every statement idempotent.
const SCHEMA_FILES: [(&str, &str); 8] = [
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
];

#[cfg(feature = "driver")]
/// Whether a failed schema statement is one that was already applied: an `ALTER TABLE … ADD` of
/// a column the table has (CQL has no `ADD IF NOT EXISTS` on Cassandra 5).
fn already_applied(statement: &str, error: &str) -> bool {
    statement.starts_with("ALTER TABLE")
        && (error.contains("conflicts with an existing column") || error.contains("already exists"))
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
        .flat_map(|(_, text)| {
            let without_comments: String = text
                .lines()
                .map(|line| line.split("--").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            without_comments
                .split(';')
                .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.replace("{keyspace}", keyspace)
                        .replace("{replication}", &replication)
                })
                .collect::<Vec<_>>()
        })
        .collect()
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
/// Creates the keyspace (with `replication`, if it does not exist yet) and every table, and
/// records the schema version and the origin of the due index. Safe to run again and from
/// several processes at once: every statement is `IF NOT EXISTS`, or an `ALTER … ADD` whose
/// "already there" answer counts as done.
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
    for statement in schema_statements(keyspace, replication, tablets) {
        let mut ddl = Statement::new(statement.as_str());
        ddl.set_consistency(Consistency::All);
        match session.query_unpaged(ddl, ()).await {
            Ok(_) => {}
            Err(e) if already_applied(&statement, &e.to_string()) => {}
            // The statement was applied; only the driver's wait for every node to see it timed
            // out (a loaded or just-started node). Waiting longer is all there is to do.
            Err(ExecutionError::SchemaAgreementError(_)) => agree(session)
                .await
                .map_err(|e| failed(&statement, Box::new(e)))?,
            Err(e) => return Err(failed(&statement, Box::new(e))),
        }
    }
    agree(session)
        .await
        .map_err(|e| failed("await schema agreement", Box::new(e)))?;

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
    let found = read_meta(session, keyspace, "schema_version")
        .await
        .map_err(|e| failed("read schema_version", e))?;
    if let Some(found) = found
        && found > SCHEMA_VERSION
    {
        return Err(CqlError::Schema {
            keyspace: keyspace.to_owned(),
            why: format!(
                "has ledger schema version {found}, this build understands up to {SCHEMA_VERSION}; upgrade Sluice"
            ),
        });
    }
    tracing::info!(keyspace, %replication, "CQL ledger schema is in place");
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
                "ALTER TABLE sluice_test.audit WITH compaction = {'class': 'SizeTieredCompactionStrategy', 'tombstone_threshold': '0.2', 'unchecked_tombstone_compaction': 'true'} AND gc_grace_seconds = 864000"
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
