//! Scale-out and node loss on real clusters: 2 producers, 2 dispatchers, 2 reconcilers and 2
//! compensators as OS processes (the service binaries of this build) on the 3-node Cassandra
//! (keyspace RF 3, QUORUM / SERIAL) and the 3-broker Kafka (topics RF 3, `min.insync.replicas`
//! 2, `acks=all`) that `scripts/engines/cluster.sh` runs. The fault runner's workload drives
//! ≥ 2,000 effects of every shape against its ground-truth upstream (ambiguous faults: commits
//! answered 5xx, timed out or dropped, late commits, double commits), split over both
//! producers, while in turn one Cassandra node is killed with SIGKILL and restarted, one Kafka
//! broker likewise, one replica of each service likewise, and every service gets a rolling
//! restart. Then the fault runner's oracle (`sluice_tests::chaos::invariants`) checks, from the
//! upstream's own record and the ledger: nothing accepted lost, at most one live commit per
//! NON_IDEMPOTENT effect unless a person was told, every audit chain verifies; and each
//! replica of each service did a share of the work (per-replica counts from `/metrics`).
//!
//! Skipped, saying why, unless `SLUICE_TEST_CLUSTER_CQL_NODES` and
//! `SLUICE_TEST_CLUSTER_KAFKA_BROKERS` are set (`eval "$(scripts/engines/cluster.sh start)"`;
//! `scripts/test.sh` does). `SLUICE_CLUSTER_TEST_EFFECTS` and `SLUICE_CLUSTER_TEST_RATE`
//! (effects per second over both producers) change the workload.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use sluice_ledger_cql::{Consistency, Replication, Serial, connect_session};
use sluice_runtime::Config;
use sluice_tests::chaos::api::Api;
use sluice_tests::chaos::catalog::{self, Horizons, Timing};
use sluice_tests::chaos::upstream::{ChaosUpstream, FaultRates, FaultTimes};
use sluice_tests::chaos::workload::{self, RunPlan, WorkloadOptions};
use sluice_tests::chaos::{self, driver, invariants, operator};
use sluice_tests::processes::{self, free_port};
use tokio_util::sync::CancellationToken;

const SERVICES: [&str; 4] = [
    "sluice-producer",
    "sluice-dispatcher",
    "sluice-reconciler",
    "sluice-compensator",
];

fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "[cluster] {line}");
}

fn cluster_or_skip() -> Option<(Vec<String>, String)> {
    let nodes = std::env::var("SLUICE_TEST_CLUSTER_CQL_NODES").ok();
    let brokers = std::env::var("SLUICE_TEST_CLUSTER_KAFKA_BROKERS").ok();
    match (nodes, brokers) {
        (Some(nodes), Some(brokers)) if !nodes.is_empty() && !brokers.is_empty() => Some((
            nodes.split(',').map(|s| s.trim().to_owned()).collect(),
            brokers,
        )),
        _ => {
            say(
                "SLUICE_TEST_CLUSTER_CQL_NODES / SLUICE_TEST_CLUSTER_KAFKA_BROKERS unset: the \
                 cluster test is skipped (start the clusters with scripts/engines/cluster.sh start)",
            );
            None
        }
    }
}

fn env_number(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `target/<profile>/`, where this build put the service binaries.
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: build the service binaries first with `cargo build --workspace --bins`",
        path.display()
    );
    path
}

/// `scripts/engines/cluster.sh ARGS`, which must succeed.
async fn engines(args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/engines/cluster.sh");
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    let started = Instant::now();
    let shown = args.join(" ");
    let output = tokio::task::spawn_blocking(move || Process::new(script).args(&args).output())
        .await
        .expect("the engine task")
        .expect("cluster.sh runs");
    assert!(
        output.status.success(),
        "cluster.sh {shown} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    say(&format!(
        "cluster.sh {shown}: done in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    // Its own account (when the node answered, when it was back in its cluster): where a slow
    // restart spent its time.
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        say(&format!("  {line}"));
    }
}

/// The work a process reports in its `/metrics`, by kind.
type Counts = BTreeMap<&'static str, f64>;

/// What each service's share is counted in: the metric families summed over their labels.
const COUNTED: [(&str, &str); 4] = [
    ("transitions", "sluice_transitions_total"),
    ("submissions", "sluice_effects_submitted_total"),
    ("upstream calls", "sluice_dispatch_duration_seconds_count"),
    ("sweep items", "sluice_sweep_items_total"),
];

fn parse_counts(text: &str) -> Counts {
    let mut counts = Counts::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        let Some((kind, _)) = COUNTED.iter().find(|(_, metric)| *metric == name) else {
            continue;
        };
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *counts.entry(kind).or_default() += value;
    }
    counts
}

/// One replica of one service: an OS process, restarted in place (same slot, same port).
struct Replica {
    service: &'static str,
    slot: usize,
    port: u16,
    config: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
    generation: u32,
    /// What earlier generations of this replica did, scraped before each was stopped.
    counted: Counts,
}

impl Replica {
    fn name(&self) -> String {
        format!("{}-{}", self.service, self.slot)
    }

    fn start(&mut self) {
        self.generation += 1;
        let log = self
            .dir
            .join(format!("{}-{}.log", self.name(), self.generation));
        let out = std::fs::File::create(&log).expect("a log file");
        let err = out.try_clone().expect("a second handle on the log file");
        let listen = format!("127.0.0.1:{}", self.port);
        let key = if self.service == "sluice-producer" {
            "SLUICE_PRODUCER__LISTEN"
        } else {
            "SLUICE_TELEMETRY__LISTEN"
        };
        let child = Process::new(binary(self.service))
            .arg("--config")
            .arg(&self.config)
            .env_remove("SLUICE_CONFIG")
            .env(key, &listen)
            .env("SLUICE_TELEMETRY__LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.name()));
        self.child = Some(child);
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    async fn wait_ready(&mut self, http: &reqwest::Client) {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("{} exited with {status} while starting", self.name());
            }
            let ready = http.get(self.url("/readyz")).send().await;
            if matches!(ready, Ok(r) if r.status() == reqwest::StatusCode::OK) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} not ready after 180 s",
                self.name()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn scrape(&self, http: &reqwest::Client) -> Counts {
        match http.get(self.url("/metrics")).send().await {
            Ok(response) => parse_counts(&response.text().await.unwrap_or_default()),
            Err(_) => Counts::new(),
        }
    }

    /// Adds what the running generation did to `counted`, before it goes.
    async fn bank(&mut self, http: &reqwest::Client) {
        for (kind, n) in self.scrape(http).await {
            *self.counted.entry(kind).or_default() += n;
        }
    }

    fn assert_running(&mut self) {
        let name = self.name();
        let child = self.child.as_mut().expect("the replica runs");
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{name} exited by itself with {status} (see its log)");
        }
    }

    /// SIGKILL: no shutdown hook, leases held, offsets uncommitted.
    async fn kill(&mut self, http: &reqwest::Client) {
        self.assert_running();
        self.bank(http).await;
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait: the graceful stop of a rolling restart.
    async fn stop(&mut self, http: &reqwest::Client) {
        self.assert_running();
        self.bank(http).await;
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = Process::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        say(&format!(
            "{} did not stop within 30 s of SIGTERM: killed",
            self.name()
        ));
        let _ = child.kill();
        let _ = child.wait();
    }

    async fn total(&self, http: &reqwest::Client) -> Counts {
        let mut total = self.counted.clone();
        for (kind, n) in self.scrape(http).await {
            *total.entry(kind).or_default() += n;
        }
        total
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn cluster_config(dir: &Path, nodes: Vec<String>, brokers: &str, catalog: &Path) -> PathBuf {
    let names = processes::Names {
        keyspace: "sluice_c",
        topics: "sluice-cluster",
    };
    let (path, _) =
        processes::services_config(dir, catalog.to_owned(), nodes, brokers, &names, |config| {
            config.ledger.cql.replication = Replication::Simple {
                replication_factor: 3,
            };
            config.ledger.cql.consistency = Consistency::Quorum;
            config.ledger.cql.serial_consistency = Serial::Serial;
            config.bus.kafka.replication_factor = Some(3);
            config.bus.kafka.min_insync_replicas = Some(2);
            // Eight processes reading the whole ledger for gauges would only add load.
            config.metrics.command_gauges = false;
        });
    // Dispatchers act on signed copies, as a deployment with a key does: node kills and
    // rebalances then hand them copies gone stale, which must cost reads, never a guarantee.
    processes::add_copy_key(dir, &path);
    path
}

/// Every partition of every topic with `prefix` has 3 replicas.
async fn assert_topics_replicated(brokers: &str, prefix: &str) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (brokers, prefix) = (brokers.to_owned(), prefix.to_owned());
    let replicas: Vec<(String, usize)> = tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("a metadata client");
        let metadata = client
            .fetch_metadata(None, Duration::from_secs(30))
            .expect("the cluster's metadata");
        metadata
            .topics()
            .iter()
            .filter(|t| t.name().starts_with(&prefix))
            .flat_map(|t| {
                t.partitions()
                    .iter()
                    .map(|p| (format!("{}/{}", t.name(), p.id()), p.replicas().len()))
            })
            .collect()
    })
    .await
    .expect("the metadata task");
    assert!(!replicas.is_empty(), "the topics exist");
    assert!(
        replicas.iter().all(|(_, n)| *n == 3),
        "every partition has 3 replicas: {replicas:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_every_service_survive_node_loss_on_three_node_clusters() {
    let Some((nodes, brokers)) = cluster_or_skip() else {
        return;
    };
    let began = Instant::now();
    let seed = chaos::random_seed();
    let effects = env_number("SLUICE_CLUSTER_TEST_EFFECTS", 2_000.0) as usize;
    // Paced so that submissions go on through the faults (8-9 minutes of them here), not
    // only through the first: at 14/s the last effect was accepted while the first Cassandra
    // node was still restarting, and the later faults met only the backlog.
    let rate = env_number("SLUICE_CLUSTER_TEST_RATE", 4.0);
    say(&format!(
        "seed {seed}: {effects} effects at {rate}/s over 2 producers"
    ));

    // The fault runner's world, with room for a ledger that is 3 replicas deep on 2 cores.
    let mut options = chaos::Options::new(seed);
    options.timing = Timing {
        bank_timeout_ms: 800,
        fast_timeout_ms: 600,
        check_timeout_ms: 1_500,
        compensate_timeout_ms: 800,
        settle_ms: 300,
        tight_lease_margin_ms: 150,
    };
    options.times = FaultTimes {
        hold_past_timeout_ms: 250,
        late_commit_ms: (100, 700),
        lag_ms: (700, 1_500),
    };
    options.settle_timeout = Duration::from_secs(420);
    let upstream = Arc::new(
        ChaosUpstream::start(
            catalog::endpoints(&options.timing),
            FaultRates::standard(),
            options.times.clone(),
            seed,
        )
        .await
        .expect("the ground-truth upstream starts"),
    );
    let dir = tempfile::Builder::new()
        .prefix("sluice-cluster-")
        .tempdir()
        .expect("a temporary directory");
    let catalog_text = catalog::catalog_toml(
        &upstream.base_url(),
        &options.timing,
        &options.times,
        &Horizons::default(),
    );
    catalog::validate(&catalog_text).expect("the catalog is valid");
    let catalog_path = dir.path().join("catalog.toml");
    std::fs::write(&catalog_path, catalog_text).expect("write the catalog");
    let config_path = cluster_config(dir.path(), nodes, &brokers, &catalog_path);
    let config = Config::load(Some(&config_path), std::iter::empty::<(String, String)>())
        .expect("the configuration loads");

    // Schema changes on a fresh 3-node cluster on a loaded machine may outlast the driver's
    // 60 s wait for agreement; every statement is `IF NOT EXISTS`, so asking again is safe.
    let mut migrate = None;
    for attempt in 1..=3 {
        let output = Process::new(binary("sluice"))
            .args(["migrate", "--config"])
            .arg(&config_path)
            .env_remove("SLUICE_CONFIG")
            .output()
            .expect("sluice migrate runs");
        let ok = output.status.success();
        migrate = Some(output);
        if ok {
            break;
        }
        say(&format!("sluice migrate attempt {attempt} failed; again"));
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let migrate = migrate.expect("migrate ran");
    assert!(
        migrate.status.success(),
        "sluice migrate failed: {}{}",
        String::from_utf8_lossy(&migrate.stdout),
        String::from_utf8_lossy(&migrate.stderr)
    );
    assert_topics_replicated(&brokers, &config.bus.topic_prefix).await;
    let session = connect_session(&config.ledger.cql)
        .await
        .expect("a session to the cluster");
    let replication: String = session
        .query_unpaged(
            "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?",
            (&config.ledger.cql.keyspace,),
        )
        .await
        .expect("system_schema answers")
        .into_rows_result()
        .expect("rows")
        .first_row::<(BTreeMap<String, String>,)>()
        .map(|(r,)| format!("{r:?}"))
        .expect("the keyspace exists");
    assert!(
        replication.contains("\"replication_factor\": \"3\""),
        "{replication}"
    );
    drop(session);

    // Two replicas of each service, each on a port of its own kept across restarts.
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client");
    let mut replicas: Vec<Replica> = Vec::new();
    for service in SERVICES {
        for slot in 1..=2 {
            let mut replica = Replica {
                service,
                slot,
                port: if service == "sluice-producer" && slot == 1 {
                    config.producer.listen.port()
                } else {
                    free_port()
                },
                config: config_path.clone(),
                dir: dir.path().to_owned(),
                child: None,
                generation: 0,
                counted: Counts::new(),
            };
            replica.start();
            replicas.push(replica);
        }
    }
    for replica in &mut replicas {
        replica.wait_ready(&http).await;
    }
    say(&format!(
        "8 service processes ready after {:.1} s",
        began.elapsed().as_secs_f64()
    ));

    // The workload, its runs dealt to the two producers in turn.
    let plan = workload::plan(
        seed,
        &WorkloadOptions {
            effects,
            ..WorkloadOptions::default()
        },
    );
    let planned: usize = plan.iter().map(|r| r.effects.len()).sum();
    let (mut first, mut second): (Vec<RunPlan>, Vec<RunPlan>) = (Vec::new(), Vec::new());
    for (i, run) in plan.into_iter().enumerate() {
        if i % 2 == 0 {
            first.push(run);
        } else {
            second.push(run);
        }
    }
    let apis: Vec<Api> = replicas
        .iter()
        .filter(|r| r.service == "sluice-producer")
        .map(|r| Api::new(&r.url(""), "open", "open").expect("an API client"))
        .collect();
    let settling = Arc::new(AtomicBool::new(false));
    let stop_operating = CancellationToken::new();
    let operating = tokio::spawn(operator::operate(
        apis[0].clone(),
        Arc::clone(&upstream),
        seed,
        Duration::from_secs(45),
        Duration::from_secs(1),
        Arc::clone(&settling),
        stop_operating.clone(),
    ));
    let driving = {
        let (a, b) = (apis[0].clone(), apis[1].clone());
        tokio::spawn(async move {
            let driven = tokio::join!(
                driver::drive(a, first, rate / 2.0, 24),
                driver::drive(b, second, rate / 2.0, 24)
            );
            (driven, Instant::now())
        })
    };

    // The faults, in turn, while the effects flow.
    let faults_began = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    engines(&["kill", "cassandra-2"]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    engines(&["restart", "cassandra-2"]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    engines(&["kill", "kafka-3"]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    engines(&["restart", "kafka-3"]).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // One replica of each service, SIGKILL, then back.
    for (service, slot) in [
        ("sluice-producer", 2),
        ("sluice-dispatcher", 1),
        ("sluice-reconciler", 2),
        ("sluice-compensator", 1),
    ] {
        let replica = replicas
            .iter_mut()
            .find(|r| r.service == service && r.slot == slot)
            .expect("the replica exists");
        replica.kill(&http).await;
        say(&format!("killed {} (SIGKILL)", replica.name()));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for replica in replicas.iter_mut().filter(|r| r.child.is_none()) {
        replica.start();
        replica.wait_ready(&http).await;
        say(&format!("{} restarted", replica.name()));
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    // A rolling restart of every process, one at a time.
    for replica in &mut replicas {
        replica.stop(&http).await;
        replica.start();
        replica.wait_ready(&http).await;
        say(&format!("rolled {}", replica.name()));
    }
    say(&format!(
        "faults done in {:.1} s",
        faults_began.elapsed().as_secs_f64()
    ));

    let ((driven_a, driven_b), submitted_at) = driving.await.expect("the agents");
    say(&format!(
        "the last submission was answered {:.1} s after the faults began",
        submitted_at.duration_since(faults_began).as_secs_f64()
    ));
    let mut driven = driven_a.expect("the first producer's agents finish");
    let driven_b = driven_b.expect("the second producer's agents finish");
    driven.accepted.extend(driven_b.accepted);
    driven.rollbacks.extend(driven_b.rollbacks);
    driven.unexpected.extend(driven_b.unexpected);
    let workload_done = faults_began.elapsed();
    say(&format!(
        "workload done after {:.1} s: {} of {planned} effects accepted, {} unexpected answers",
        workload_done.as_secs_f64(),
        driven.accepted.len(),
        driven.unexpected.len()
    ));
    for line in driven.unexpected.iter().take(10) {
        say(&format!("unexpected: {line}"));
    }

    // Settle: the faults stop, the pipeline finishes what it holds.
    upstream.calm();
    settling.store(true, std::sync::atomic::Ordering::SeqCst);
    let run_ids: Vec<String> = driven
        .accepted
        .iter()
        .map(|a| a.run_id.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let settle_began = Instant::now();
    let settled = chaos::settle(&apis[0], &upstream, &run_ids, &options)
        .await
        .expect("the settle loop reads the API");
    stop_operating.cancel();
    let operated = operating
        .await
        .expect("the operator")
        .expect("the operator acts");
    say(&format!(
        "settled={settled} after {:.1} s; operator: {:?}",
        settle_began.elapsed().as_secs_f64(),
        operated.actions
    ));

    // The oracle, on the ledger (through the API) and the upstream's own record.
    let chaos::Ended {
        commands,
        journals,
        audits,
        verdicts,
    } = chaos::read_ended(&apis[0], &run_ids)
        .await
        .expect("the ledger's view of every run");
    let record = upstream.record();
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for command in commands.values() {
        *statuses.entry(command.status().to_string()).or_default() += 1;
    }
    let evidence = invariants::Evidence {
        seed,
        accepted: &driven.accepted,
        commands: &commands,
        journals: &journals,
        audits: &audits,
        verdicts: &verdicts,
        record: &record,
        rollbacks: &driven.rollbacks,
        crashes: &[],
        timing: &options.timing,
        late_commit_horizon_ms: options.times.late_commit_horizon_ms(),
        clock_skew_ms: 0,
    };
    let checks = invariants::check(&evidence);
    say(&format!("statuses: {statuses:?}"));
    say(&format!(
        "upstream: {} dispatches, {} commits, {} reversals; faults {:?}",
        record.dispatches.len(),
        record.commits.len(),
        record.reversals.len(),
        record.dispatch_faults()
    ));
    let mut violations = Vec::new();
    for check in &checks {
        say(&format!(
            "{:<50} checked {:>5}, violations {}",
            check.invariant,
            check.checked,
            check.violations.len()
        ));
        for v in check.violations.iter().take(5) {
            violations.push(format!(
                "{}: run {} command {} (idempotency key {}): {}\n    {}",
                v.invariant,
                v.run_id,
                v.command_key,
                v.idempotency_key,
                v.what,
                v.story.join("\n    ")
            ));
        }
    }

    // The split of the work.
    let mut shares: BTreeMap<String, Counts> = BTreeMap::new();
    for replica in &mut replicas {
        replica.assert_running();
        shares.insert(replica.name(), replica.total(&http).await);
    }
    for (name, counts) in &shares {
        say(&format!("{name:<22} {counts:?}"));
    }
    say(&format!(
        "total {:.1} s (workload and faults {:.1} s, settle {:.1} s); logs in {}",
        began.elapsed().as_secs_f64(),
        workload_done.as_secs_f64(),
        settle_began.elapsed().as_secs_f64(),
        dir.path().display()
    ));

    assert!(
        driven.accepted.len() * 10 >= planned * 9,
        "most effects were accepted: {} of {planned}",
        driven.accepted.len()
    );
    assert!(
        violations.is_empty(),
        "seed {seed}: guarantees broken:\n{}",
        violations.join("\n")
    );
    assert!(settled, "seed {seed}: the pipeline did not settle");
    for (name, counts) in &shares {
        let count = |kind: &str| counts.get(kind).copied().unwrap_or(0.0);
        let work = if name.starts_with("sluice-producer") {
            count("submissions")
        } else if name.starts_with("sluice-dispatcher") {
            count("upstream calls")
        } else if name.starts_with("sluice-reconciler") {
            count("transitions") + count("sweep items")
        } else {
            count("transitions")
        };
        assert!(work > 0.0, "{name} did a share of the work: {counts:?}");
    }
    // Nothing to keep: the keyspace and the topics have names of their own, and CI removes
    // the clusters after the test.
    if std::env::var("SLUICE_CLUSTER_TEST_KEEP").is_ok_and(|v| v == "1") {
        let kept = dir.keep();
        say(&format!("kept {}", kept.display()));
    }
}
