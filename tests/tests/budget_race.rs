//! Spend budgets under racing admissions on real engines: two `sluice-producer` processes (the
//! binaries of this build) on one Cassandra keyspace, with a dispatcher and a reconciler on
//! Kafka. Every wire is submitted to both producers at once (a retried admission on another
//! replica), far more than the budget holds, and the first producer is killed (SIGKILL) while
//! its submissions are in flight; what it left unanswered is submitted again to the second.
//! Some wires' holds are also written beforehand exactly as a producer that died between the
//! hold and the reservation leaves them (through the ledger, with the submission's tag). Then,
//! from the bank's own record and the ledger: the committed spend never passes the limit, every
//! recorded wire is counted exactly once (nothing double-held by the race, the kill or the
//! orphaned holds, nothing leaked), and the limit was really reached.
//!
//! `SLUICE_SKIP_KAFKA=1` or `SLUICE_SKIP_CQL=1` skips it (a machine without engines); CI runs it.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use sluice_core::budget::lines;
use sluice_core::catalog::Catalog;
use sluice_core::command::{Command, CommandStatus};
use sluice_ledger::{BudgetStore, Held, HoldMode, submission_tag};
use sluice_ledger_cql::{CqlConfig, CqlLedger};
use sluice_tests::processes::{self, Service, binary, free_port};
use sluice_tests::*;
use sluice_upstream::Faults;

const LIMIT: i64 = 5_000_000;
const WIRES: u32 = 48;
const SETTLE: Duration = Duration::from_secs(120);

fn engines_or_skip() -> Option<(String, Vec<String>)> {
    for var in ["SLUICE_SKIP_KAFKA", "SLUICE_SKIP_CQL"] {
        if std::env::var(var).is_ok_and(|v| v == "1") {
            let _ = writeln!(std::io::stderr(), "{var}=1: the budget race is skipped");
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

/// Amounts between 100,000 and 450,000: their sum (about 13,000,000) is far past the limit.
fn amount(i: u32) -> i64 {
    100_000 + i64::from((i * 7_919) % 36) * 10_000
}

fn wire(i: u32) -> Value {
    effect(
        &format!("r-race-{i}"),
        1,
        "payments/wire",
        0,
        wire_args(&format!("acc-{i}"), amount(i)),
    )
}

async fn ready(http: &reqwest::Client, base: &str) {
    eventually("a producer to be ready", SETTLE, || async {
        let ready = http.get(format!("{base}/readyz")).send().await.ok()?;
        (ready.status() == StatusCode::OK).then_some(())
    })
    .await;
}

/// Counts a submission task as done when it ends, however it ends.
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_admissions_on_two_producers_never_pass_a_budget_and_a_crash_double_holds_nothing() {
    let Some((brokers, nodes)) = engines_or_skip() else {
        return;
    };
    init_tracing();
    let upstream = start_upstream(Faults::none()).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let catalog = dir.path().join("catalog.toml");
    let edit = CatalogEdit::example(&upstream.base_url()).budget(
        "race",
        &format!(
            "tools = [\"payments/wire\"]\nscope = \"tenant\"\nwindow = \"total\"\n\
             limits = {{ EUR = {LIMIT} }}\non_exceed = \"deny\"\n"
        ),
    );
    std::fs::write(&catalog, edit.text()).expect("write the catalog");
    let (config_path, config) = processes::services_config(
        dir.path(),
        catalog,
        nodes,
        &brokers,
        &processes::Names {
            keyspace: "sluice_t",
            topics: "sluice-budget",
        },
        |config| config.bus.kafka.replication_factor = Some(1),
    );
    let migrate = std::process::Command::new(binary("sluice"))
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

    // Wires 0..4 are held as a producer that died after holding them, before recording them,
    // leaves them: the command key and the submission's tag, no command.
    let cql = CqlLedger::connect(CqlConfig {
        migrate_on_start: false,
        ..config.ledger.cql.clone()
    })
    .await
    .expect("the test writes to the ledger directly");
    let catalog = Catalog::from_toml_str(&edit.text(), "catalog.toml").expect("the catalog");
    let tool = catalog.resolve("payments/wire").expect("the wire");
    for i in 0..4 {
        let submitted = wire(i);
        let command = Command::from_intent(
            sluice_core::command::Intent {
                run_id: submitted["run_id"]
                    .as_str()
                    .expect("a run")
                    .parse()
                    .expect("a run id"),
                command_key: sluice_core::ids::CommandKey::new(1, tool.name().clone(), 0),
                semantics: tool.semantics(),
                args: submitted["args"].clone(),
                business_key: None,
                policy_version: "1".into(),
                max_attempts: 3,
                not_before: None,
            },
            sluice_core::time::Timestamp::from_millis(0),
            10_000,
        );
        let held = cql
            .budget_hold(
                &command.run_id,
                &command.command_key,
                &submission_tag(command.args_hash.as_str(), None),
                &lines(catalog.budgets(), &command, command.created_at).expect("lines"),
                HoldMode::Enforce,
            )
            .await
            .expect("an orphaned hold");
        assert_eq!(held, Held::Fresh);
    }

    let port_b = free_port();
    let mut producer_a = Service::start("sluice-producer", &config_path, dir.path(), 1);
    let producer_b = Service::start_with(
        "sluice-producer",
        &config_path,
        dir.path(),
        2,
        &[("SLUICE_PRODUCER__LISTEN", format!("127.0.0.1:{port_b}"))],
    );
    let _others: Vec<Service> = ["sluice-dispatcher", "sluice-reconciler"]
        .into_iter()
        .map(|name| Service::start(name, &config_path, dir.path(), 1))
        .collect();
    let base_a = format!("http://{}", config.producer.listen);
    let base_b = format!("http://127.0.0.1:{port_b}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a client");
    ready(&http, &base_a).await;
    ready(&http, &base_b).await;

    // Every wire to both producers at once.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..WIRES {
        for base in [&base_a, &base_b] {
            let (http, url, body) = (http.clone(), format!("{base}/v1/effects"), wire(i));
            let done = done.clone();
            tasks.push(tokio::spawn(async move {
                let _counted = Counted(done);
                let answer = http.post(url).json(&body).send().await;
                let answer = match answer {
                    Ok(response) => {
                        let status = response.status();
                        let body: Value = response.json().await.unwrap_or(Value::Null);
                        Some((status, body))
                    }
                    // The aborted producer's connections.
                    Err(_) => None,
                };
                (i, answer)
            }));
        }
    }
    // Killed (SIGKILL) once a fifth of the submissions are answered, the rest in flight.
    eventually("submissions to be answered", SETTLE, || async {
        (done.load(std::sync::atomic::Ordering::SeqCst) >= tasks.len() / 5).then_some(())
    })
    .await;
    producer_a.kill();
    let mut answered: BTreeMap<u32, Vec<StatusCode>> = BTreeMap::new();
    let mut unanswered = 0;
    for task in tasks {
        let (i, answer) = task.await.expect("a submission task");
        match answer {
            Some((status, _)) if status != StatusCode::SERVICE_UNAVAILABLE => {
                answered.entry(i).or_default().push(status);
            }
            _ => unanswered += 1,
        }
    }
    let aborted = producer_a.exit_within(Duration::from_secs(30));
    assert!(
        aborted
            .as_ref()
            .is_some_and(|(status, _)| !status.success()),
        "producer A aborted at the failpoint: {aborted:?}"
    );
    assert!(unanswered > 0, "the abort left submissions unanswered");

    // The agents retry what the crash left unanswered, on the producer still up.
    for i in 0..WIRES {
        loop {
            let answer = http
                .post(format!("{base_b}/v1/effects"))
                .json(&wire(i))
                .send()
                .await
                .expect("producer B answers");
            let status = answer.status();
            if status == StatusCode::SERVICE_UNAVAILABLE {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            assert!(
                [StatusCode::CREATED, StatusCode::OK, StatusCode::CONFLICT].contains(&status),
                "wire {i}: {status} {}",
                answer.text().await.unwrap_or_default()
            );
            answered.entry(i).or_default().push(status);
            break;
        }
    }

    // Every recorded wire settles; the refused ones were never recorded.
    let agent = Agent::new(&base_b);
    let mut recorded = 0i64;
    let mut confirmed = 0i64;
    let mut refused = 0;
    for i in 0..WIRES {
        let run = format!("r-race-{i}");
        let key = "d-1/payments/wire/0";
        let found = agent
            .call(
                "GET",
                &format!("/v1/runs/{run}/effects/{}", encode_key(key)),
                None,
            )
            .await;
        if found.status == StatusCode::NOT_FOUND {
            refused += 1;
            continue;
        }
        let settled = agent.wait_settled_within(&run, key, SETTLE).await;
        recorded += amount(i);
        if settled.status() == CommandStatus::Confirmed {
            confirmed += amount(i);
        } else {
            panic!("wire {i} settled {}: {settled:?}", settled.status());
        }
    }
    assert!(refused > 0, "the budget refused some wires: {answered:?}");

    // The bank's own record: what committed.
    let stats = upstream.stats();
    let banked: i64 = stats
        .standing_wires_by_key
        .iter()
        .map(|(key, standing)| {
            let amount: i64 = key
                .split(':')
                .nth(2)
                .and_then(|a| a.parse().ok())
                .expect("an amount");
            amount * i64::try_from(*standing).expect("a count")
        })
        .sum();
    assert_eq!(
        banked, confirmed,
        "the bank booked what the ledger confirmed"
    );
    assert!(
        banked <= LIMIT,
        "committed spend {banked} passed the limit {LIMIT}"
    );
    assert!(
        banked > LIMIT - 450_000,
        "the limit was really reached: {banked} of {LIMIT}"
    );
    assert_no_double_commit(&stats);

    // The counter holds exactly what was recorded: the crash and the double submissions held
    // nothing twice, and the hold the abort left was taken up by the retry, not leaked.
    let budgets = agent.call("GET", "/v1/budgets", None).await;
    assert_eq!(budgets.status, StatusCode::OK, "{}", budgets.text);
    let counters = &budgets.body["budgets"][0]["counters"];
    assert_eq!(
        counters.as_array().map(Vec::len),
        Some(1),
        "{}",
        budgets.text
    );
    assert_eq!(counters[0]["used"], json!(recorded), "{}", budgets.text);
    assert_eq!(recorded, confirmed);
    let _ = writeln!(
        std::io::stderr(),
        "budget race: {WIRES} wires x 2 producers, {unanswered} unanswered by the killed one, \
         {refused} refused, {confirmed} of {LIMIT} committed and held"
    );
    upstream.shutdown().await;
    drop(producer_b);
}
