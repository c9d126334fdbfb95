//! Distributed mode end to end: the four services as separate OS processes — the real
//! `sluice-producer`, `sluice-dispatcher`, `sluice-reconciler` and `sluice-compensator`
//! binaries — talking through a real Apache Kafka and keeping state in a real Cassandra, the
//! engines `scripts/engines/start.sh` runs (`SLUICE_TEST_KAFKA_BROKERS`,
//! `SLUICE_TEST_CQL_NODES`). The dispatcher is killed with SIGKILL while upstream calls are in
//! flight and started again: every accepted command must end CONFIRMED, and no
//! NON_IDEMPOTENT effect may reach the bank twice.
//!
//! The binaries are those of this build (`target/<profile>/`); `scripts/test.sh` builds them
//! with `cargo build --workspace --bins` before the tests. `SLUICE_SKIP_KAFKA=1` or
//! `SLUICE_SKIP_CQL=1` skips this file (a machine without engines); CI runs it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use sluice_core::command::CommandStatus::{self, *};
use sluice_embedded::bench::{self, BenchArgs, Mode};
use sluice_embedded::demo::Progress;
use sluice_ledger::Ledger;
use sluice_ledger_cql::{CqlConfig, CqlLedger, connect_session};
use sluice_runtime::{Config, Shutdown};
use sluice_tests::processes::{Service, binary};
use sluice_tests::*;
use sluice_upstream::{Family, FaultKind, FaultRates, Faults};

/// How long the whole pipeline may take to settle after the restart: a Kafka rebalance waits
/// out the killed member's session (6 s here), then sweeps and status checks run.
const SETTLE: Duration = Duration::from_secs(120);

fn engines_or_skip() -> Option<(String, Vec<String>)> {
    for var in ["SLUICE_SKIP_KAFKA", "SLUICE_SKIP_CQL"] {
        if std::env::var(var).is_ok_and(|v| v == "1") {
            let _ = writeln!(
                std::io::stderr(),
                "{var}=1: the distributed end-to-end test is skipped (no engines)"
            );
            return None;
        }
    }
    let brokers =
        std::env::var("SLUICE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".to_owned());
    let nodes = std::env::var("SLUICE_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:19042".to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    Some((brokers, nodes))
}

fn distributed_config(
    dir: &Path,
    brokers: &str,
    nodes: Vec<String>,
    upstream: &str,
) -> (PathBuf, Config) {
    let catalog = dir.join("catalog.toml");
    let edit = CatalogEdit::example(upstream)
        .dispatch("payments/wire", "timeout_ms", 1_500)
        .policy("payments/wire", "lease_ttl_ms", 2_500)
        .policy("payments/wire", "settle_ms", 300)
        .dispatch("email/send", "timeout_ms", 1_500)
        .policy("email/send", "lease_ttl_ms", 2_500);
    std::fs::write(&catalog, edit.text()).expect("write the catalog");

    let (path, config) = processes::services_config(
        dir,
        catalog,
        nodes,
        brokers,
        &processes::Names {
            // The Cassandra suite's prefix: its next run drops keyspaces older than ten minutes.
            keyspace: "sluice_t",
            topics: "sluice-e2e",
        },
        |config| config.bus.kafka.replication_factor = Some(1),
    );
    processes::add_copy_key(dir, &path);
    (path, config)
}

/// The value of the first sample of `name` with `labels` in a Prometheus text exposition.
fn sample(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_kafka_and_cassandra_survive_a_killed_dispatcher() {
    const RUNS: usize = 16;
    let Some((brokers, nodes)) = engines_or_skip() else {
        return;
    };
    init_tracing();
    // Half the wires commit, then hold the answer past the dispatch timeout: when the
    // dispatcher dies, calls are in flight and leases held. (Emails and tickets behave: an
    // IDEMPOTENT tool retried into the same fault five times is rightly STUCK, which is not
    // what this test is about.)
    let faults = Faults::none()
        .with_rates(
            Family::Bank,
            FaultRates::only(FaultKind::CommitThenTimeout, 0.5),
        )
        .with_timeout_sleep(Duration::from_secs(4));
    let upstream = start_upstream(faults).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (config_path, config) =
        distributed_config(dir.path(), &brokers, nodes, &upstream.base_url());

    let migrate = Process::new(binary("sluice"))
        .args(["migrate", "--config"])
        .arg(&config_path)
        .env_remove("SLUICE_CONFIG")
        .output()
        .expect("sluice migrate runs");
    assert!(
        migrate.status.success(),
        "sluice migrate failed: {}{}",
        String::from_utf8_lossy(&migrate.stdout),
        String::from_utf8_lossy(&migrate.stderr)
    );
    let said = String::from_utf8_lossy(&migrate.stdout);
    assert!(
        said.contains(&config.ledger.cql.keyspace) && said.contains(&config.bus.topic_prefix),
        "migrate names the keyspace and the topics: {said}"
    );

    let mut services: BTreeMap<&str, Service> = [
        "sluice-producer",
        "sluice-dispatcher",
        "sluice-reconciler",
        "sluice-compensator",
    ]
    .into_iter()
    .map(|name| (name, Service::start(name, &config_path, dir.path(), 1)))
    .collect();

    let base = format!("http://{}", config.producer.listen);
    let agent = Agent::new(&base);
    let http = reqwest::Client::new();
    eventually("the producer to be ready", SETTLE, || async {
        let ready = http.get(format!("{base}/readyz")).send().await.ok()?;
        (ready.status() == StatusCode::OK).then_some(())
    })
    .await;

    // Each run: a wire, an email and a ticket, submitted as one batch.
    let mut effects = Vec::new();
    let mut expected = Vec::new();
    for i in 0..RUNS {
        let run = format!("r-dist-{i}");
        for (decision, tool, args) in [
            (
                1,
                "payments/wire",
                wire_args(&format!("acc-dist-{i}"), 7_000),
            ),
            (2, "email/send", email_args(&format!("distributed {i}"))),
            (
                3,
                "tickets/create",
                ticket_args(&format!("distributed {i}")),
            ),
        ] {
            effects.push(effect(&run, decision, tool, 0, args));
            expected.push((run.clone(), format!("d-{decision}/{tool}/0")));
        }
    }
    agent.batch_created(effects).await;

    // Kill the dispatcher once calls are in flight at the bank.
    eventually("wires to reach the bank", SETTLE, || async {
        (upstream.stats().wires >= 4).then_some(())
    })
    .await;
    let dispatcher = services
        .get_mut("sluice-dispatcher")
        .expect("the dispatcher runs");
    dispatcher.assert_running();
    dispatcher.kill();
    let ledger = CqlLedger::connect(CqlConfig {
        migrate_on_start: false,
        ..config.ledger.cql.clone()
    })
    .await
    .expect("the test reads the ledger directly");
    let mut at_kill: BTreeMap<CommandStatus, usize> = BTreeMap::new();
    for (run, key) in &expected {
        let command = ledger_get(&ledger, run, key)
            .await
            .unwrap_or_else(|| panic!("{run}/{key} was answered 201, so it is in the ledger"));
        *at_kill.entry(command.status()).or_default() += 1;
    }
    let unsettled: usize = at_kill
        .iter()
        .filter(|(status, _)| !status.is_settled())
        .map(|(_, n)| n)
        .sum();
    assert!(
        unsettled >= 1,
        "the kill left effects in flight: {at_kill:?}"
    );
    let dispatcher_ops = format!("127.0.0.1:{}", processes::free_port());
    services.insert(
        "sluice-dispatcher",
        Service::start_with(
            "sluice-dispatcher",
            &config_path,
            dir.path(),
            2,
            &[("SLUICE_TELEMETRY__LISTEN", dispatcher_ops.clone())],
        ),
    );

    // Every command ends CONFIRMED: the leases the dead dispatcher held expire, the reconciler
    // finds the commits at the bank, the new dispatcher takes what was never sent.
    let mut statuses: BTreeMap<CommandStatus, usize> = BTreeMap::new();
    let mut unconfirmed = Vec::new();
    for (run, key) in &expected {
        let command = eventually(&format!("{run}/{key} to settle"), SETTLE, || async {
            let command = ledger_get(&ledger, run, key).await?;
            command.status().is_settled().then_some(command)
        })
        .await;
        *statuses.entry(command.status()).or_default() += 1;
        if command.status() != Confirmed {
            let trail = verified_audit(&ledger, run).await;
            unconfirmed.push(format!("{run}/{key}: {:#?}", trail.describe(key)));
        }
    }
    for service in services.values_mut() {
        service.assert_running();
    }
    assert_eq!(
        statuses.get(&Confirmed).copied(),
        Some(expected.len()),
        "every command is confirmed after the kill (it left {at_kill:?}): {statuses:?}\n{}",
        unconfirmed.join("\n")
    );
    let stats = upstream.stats();
    assert_no_double_commit(&stats);
    assert_eq!(
        stats.wires as usize, RUNS,
        "one wire per run reached the bank"
    );
    // The chains of every run verify, and the API serves what the ledger holds.
    let ledger: Arc<dyn Ledger> = Arc::new(ledger);
    for i in 0..RUNS {
        verified_audit(ledger.as_ref(), &format!("r-dist-{i}")).await;
    }
    let listed = agent.commands("r-dist-0", Some("CONFIRMED")).await;
    assert_eq!(listed.len(), 3, "the producer lists the run's commands");
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics answer")
        .text()
        .await
        .expect("metrics text");
    assert!(
        metrics.contains("sluice_ledger_round_trips_total{kind=\"lwt\",op=\"reserve\"}"),
        "the producer exports its ledger round trips"
    );
    // The restarted dispatcher took requests on their signed copies (those the sweeps and
    // the reconciler sent again after the kill among them), and none was refused as forged.
    let metrics = http
        .get(format!("http://{dispatcher_ops}/metrics"))
        .send()
        .await
        .expect("the dispatcher's metrics answer")
        .text()
        .await
        .expect("metrics text");
    let copies = |outcome: &str| {
        sample(
            &metrics,
            &format!("sluice_dispatch_copies_total{{outcome=\"{outcome}\"}}"),
        )
    };
    assert!(copies("used") > 0.0, "no copy was used:\n{metrics}");
    for forged in ["bad_signature", "unknown_key", "malformed", "mismatch"] {
        assert_eq!(copies(forged), 0.0, "{forged}");
    }
}

/// The names of the broker's topics that start with `prefix`.
async fn topics_starting(brokers: &str, prefix: &str) -> Vec<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (brokers, prefix) = (brokers.to_owned(), prefix.to_owned());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a metadata client");
        let metadata = client
            .fetch_metadata(None, Duration::from_secs(15))
            .expect("the broker's metadata");
        let mut names: Vec<String> = metadata
            .topics()
            .iter()
            .map(|topic| topic.name().to_owned())
            .filter(|name| name.starts_with(&prefix))
            .collect();
        names.sort();
        names
    })
    .await
    .expect("the metadata task")
}

async fn keyspace_exists(session: &scylla::client::session::Session, keyspace: &str) -> bool {
    let rows = session
        .query_unpaged(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
            (keyspace,),
        )
        .await
        .expect("system_schema answers")
        .into_rows_result()
        .expect("rows");
    rows.rows_num() > 0
}

/// `sluice bench` on a cluster writes into a keyspace and topics of its own, never the
/// configured ones, and removes them when it is done unless told to keep them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_on_kafka_and_cassandra_removes_its_keyspace_and_topics_unless_kept() {
    let Some((brokers, nodes)) = engines_or_skip() else {
        return;
    };
    init_tracing();
    let dir = tempfile::tempdir().expect("a temporary directory");
    // The bench brings its own upstream and catalog; the configured one is not called.
    let (path, config) = distributed_config(dir.path(), &brokers, nodes, "http://127.0.0.1:9");
    let session = connect_session(&config.ledger.cql)
        .await
        .expect("a session to the test node");
    let bench_topics = format!("{}bench-", config.bus.topic_prefix);
    for keep in [true, false] {
        let data = tempfile::tempdir().expect("a data directory");
        let args = BenchArgs {
            effects: 24,
            effects_per_run: 1,
            batch: 12,
            concurrency: vec![2],
            mode: Mode::Batch,
            no_paced: true,
            partitions: Some(2),
            dispatcher_concurrency: Some(8),
            config: Some(path.clone()),
            keep,
            json: true,
            ..BenchArgs::defaults()
        };
        let report = bench::execute(
            &args,
            data.path(),
            &Shutdown::new(),
            &Progress::hidden(),
            |_| {},
        )
        .await
        .expect("the bench runs on the engines");
        assert_eq!(report.results.len(), 1, "{report:#?}");
        assert_eq!(report.results[0].effects, 24, "{report:#?}");
        // The bench's email/send is IDEMPOTENT: leased by its reservation, so each effect
        // costs the reservation's LWT and the outcome's, and no lease LWT in between.
        let lwt = &report.results[0].lwt_per_effect_by_op;
        assert_eq!(lwt.get("reserve"), Some(&1.0), "{lwt:?}");
        assert_eq!(lwt.get("finalize"), Some(&1.0), "{lwt:?}");
        assert_eq!(lwt.get("lease"), Some(&0.0), "{lwt:?}");
        let keyspace = report
            .settings
            .keyspace
            .clone()
            .expect("a keyspace of the bench's own");
        assert!(
            keyspace.starts_with(&format!("{}_bench_", config.ledger.cql.keyspace)),
            "{keyspace}"
        );
        assert!(
            !keyspace_exists(&session, &config.ledger.cql.keyspace).await,
            "the configured keyspace is not touched (not even created)"
        );
        let topics = topics_starting(&brokers, &bench_topics).await;
        if keep {
            assert!(
                keyspace_exists(&session, &keyspace).await,
                "{keyspace} kept"
            );
            assert_eq!(topics.len(), 5, "one pass's five topics kept: {topics:?}");
            let prefix = topics[0]
                .rsplit_once('.')
                .map(|(prefix, _)| format!("{prefix}."))
                .expect("a prefixed topic name");
            assert_eq!(
                report.left_behind,
                [
                    format!("kept: the Kafka topics {prefix}*"),
                    format!("kept: the CQL keyspace {keyspace}"),
                ],
            );
            let mut kept = config.clone();
            kept.bus.topic_prefix = prefix;
            kept.ledger.cql.keyspace.clone_from(&keyspace);
            sluice_assemble::delete_topics(&kept)
                .await
                .expect("delete the kept topics");
            sluice_assemble::drop_keyspace(&kept)
                .await
                .expect("drop the kept keyspace");
        } else {
            assert!(report.left_behind.is_empty(), "{:?}", report.left_behind);
        }
        assert!(
            !keyspace_exists(&session, &keyspace).await,
            "{keyspace} removed"
        );
        // A deletion the controller accepted reaches the broker's metadata a moment later.
        let mut left = topics_starting(&brokers, &bench_topics).await;
        for _ in 0..50 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            left = topics_starting(&brokers, &bench_topics).await;
        }
        assert_eq!(left, Vec::<String>::new(), "every bench topic removed");
    }
}
