//! Kafka as platforms grant it (docs/security.md, "Kafka: the ACLs each service needs").
//!
//! * On the authorizing broker of `scripts/engines/kafka-secure.sh` (StandardAuthorizer,
//!   `allow.everyone.if.no.acl.found=false`, SASL PLAIN users), started here through the script
//!   if it is not running: `sluice migrate` creates the topics as a user holding `CREATE`; each
//!   of the four service binaries then runs as a user holding only the ACLs docs/security.md
//!   lists for it, with `create_topics = "never"`, and an effect ends CONFIRMED. A user lacking
//!   one ACL gets a start error naming the permission and the resource.
//! * On the plain broker of `scripts/engines/start.sh`: two installs with different topic
//!   prefixes, each `sluice dev` on Kafka, confirm their own effects, and the broker's groups
//!   show each install's members only in its own groups.
//!
//! `SLUICE_SKIP_KAFKA=1` (or `SLUICE_SKIP_CQL=1` for the first) skips them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::Mutex;
use std::time::Duration;

use sluice_core::command::CommandStatus;
use sluice_core::secret::Secret;
use sluice_ledger_cql::{CqlConfig, CqlLedger};
use sluice_runtime::Config;
use sluice_runtime::config::{BusKind, CreateTopics, KafkaSasl, SaslMechanism, SecurityProtocol};
use sluice_tests::processes::{self, Service, binary};
use sluice_tests::*;
use sluice_upstream::Faults;

/// How long an effect may take to settle.
const SETTLE: Duration = Duration::from_secs(90);
/// How long a service refused a permission may take to stop: its start's own timeouts.
const REFUSED: Duration = Duration::from_secs(60);

fn skipped(vars: &[&str]) -> bool {
    for var in vars {
        if std::env::var(var).is_ok_and(|v| v == "1") {
            let _ = writeln!(std::io::stderr(), "{var}=1: skipped");
            return true;
        }
    }
    false
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the repository")
        .to_owned()
}

/// The authorizing broker's SASL address, started through its script once per test binary
/// (the script says so and returns when it already runs).
fn secure_broker() -> String {
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = STARTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if !*started {
        let out = Process::new(repo().join("scripts/engines/kafka-secure.sh"))
            .arg("start")
            .output()
            .expect("scripts/engines/kafka-secure.sh runs");
        assert!(
            out.status.success(),
            "the authorizing broker did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        *started = true;
    }
    std::env::var("SLUICE_TEST_KAFKA_SECURE_BROKERS").unwrap_or_else(|_| "127.0.0.1:29092".into())
}

/// Adds one ACL line as the broker's admin (`kafka-acls --add ARGS`).
fn grant(args: &[String]) {
    let out = Process::new(repo().join("scripts/engines/kafka-secure.sh"))
        .arg("acl")
        .arg("--add")
        .arg("--force")
        .args(args)
        .output()
        .expect("kafka-acls runs");
    assert!(
        out.status.success(),
        "kafka-acls --add {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn line(user: &str, ops: &[&str], resource: &[&str]) -> Vec<String> {
    let mut args = vec!["--allow-principal".to_owned(), format!("User:{user}")];
    for op in ops {
        args.extend(["--operation".to_owned(), (*op).to_owned()]);
    }
    args.extend(resource.iter().map(|s| (*s).to_owned()));
    args
}

/// The ACLs docs/security.md lists for `service`, for the topic prefix `t` and the group
/// prefix `g`, granted to `user`.
fn documented(service: &str, user: &str, t: &str, g: &str) -> Vec<Vec<String>> {
    let every = || {
        line(
            user,
            &["Write", "Describe"],
            &["--topic", t, "--resource-pattern-type", "prefixed"],
        )
    };
    match service {
        "sluice-producer" => vec![
            every(),
            line(user, &["Read"], &["--topic", &format!("{t}events")]),
            line(user, &["Describe"], &["--group", &format!("{g}dispatcher")]),
            line(
                user,
                &["Describe"],
                &["--group", &format!("{g}watch-unjoined")],
            ),
        ],
        "sluice-dispatcher" => vec![
            every(),
            line(
                user,
                &["Read"],
                &[
                    "--topic",
                    &format!("{t}requested"),
                    "--group",
                    &format!("{g}dispatcher"),
                ],
            ),
        ],
        "sluice-reconciler" => vec![
            every(),
            line(
                user,
                &["Read"],
                &[
                    "--topic",
                    &format!("{t}unknown"),
                    "--group",
                    &format!("{g}reconciler"),
                ],
            ),
        ],
        "sluice-compensator" => vec![
            every(),
            line(
                user,
                &["Read"],
                &[
                    "--topic",
                    &format!("{t}compensate"),
                    "--group",
                    &format!("{g}compensator"),
                ],
            ),
        ],
        "sluice migrate" => vec![line(
            user,
            &["Create", "Describe"],
            &["--topic", t, "--resource-pattern-type", "prefixed"],
        )],
        other => panic!("no documented ACLs for {other}"),
    }
}

/// SASL PLAIN as `user` (the test users' passwords are `<user>-secret`), through the
/// environment as a deployment passes a secret.
fn as_user(user: &str) -> Vec<(&'static str, String)> {
    vec![
        ("SLUICE_BUS__KAFKA__SASL__USERNAME", user.to_owned()),
        (
            "SLUICE_BUS__KAFKA__SASL__PASSWORD",
            format!("{user}-secret"),
        ),
    ]
}

/// The services on the authorizing broker and Cassandra, topics never created by them.
fn secured_config(dir: &Path, brokers: &str, upstream: &str, topics: &str) -> (PathBuf, Config) {
    let nodes = std::env::var("SLUICE_TEST_CQL_NODES")
        .unwrap_or_else(|_| "127.0.0.1:19042".to_owned())
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    let catalog = dir.join("catalog.toml");
    std::fs::write(&catalog, CatalogEdit::example(upstream).text()).expect("write the catalog");
    processes::services_config(
        dir,
        catalog,
        nodes,
        brokers,
        &processes::Names {
            keyspace: "sluice_t",
            topics,
        },
        |config| {
            let kafka = &mut config.bus.kafka;
            kafka.replication_factor = Some(1);
            kafka.create_topics = CreateTopics::Never;
            kafka.security_protocol = SecurityProtocol::SaslPlaintext;
            kafka.sasl = Some(KafkaSasl {
                mechanism: SaslMechanism::Plain,
                // Every process is given its own user and password in its environment.
                username: "nobody".into(),
                password: Secret::from("unused"),
            });
        },
    )
}

/// `sluice migrate` as `user`: the keyspace and the topics.
fn migrate(config_path: &Path, user: &str) {
    let out = Process::new(binary("sluice"))
        .args(["migrate", "--config"])
        .arg(config_path)
        .env_remove("SLUICE_CONFIG")
        .envs(as_user(user))
        .output()
        .expect("sluice migrate runs");
    assert!(
        out.status.success(),
        "sluice migrate as {user} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_runs_with_only_its_documented_acls() {
    if skipped(&["SLUICE_SKIP_KAFKA", "SLUICE_SKIP_CQL"]) {
        return;
    }
    init_tracing();
    let brokers = secure_broker();
    let upstream = start_upstream(Faults::none()).await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (path, config) = secured_config(dir.path(), &brokers, &upstream.base_url(), "sluice-acl");
    let (t, g) = (
        config.bus.topic_prefix.clone(),
        config.bus.kafka_config().group_prefix(),
    );
    assert_eq!(
        g,
        format!("{}-", t.trim_end_matches('.')),
        "the group prefix follows the topics"
    );

    for acl in documented("sluice migrate", "migrate", &t, &g) {
        grant(&acl);
    }
    migrate(&path, "migrate");
    let users = [
        ("sluice-producer", "producer"),
        ("sluice-dispatcher", "dispatcher"),
        ("sluice-reconciler", "reconciler"),
        ("sluice-compensator", "compensator"),
    ];
    for (service, user) in users {
        for acl in documented(service, user, &t, &g) {
            grant(&acl);
        }
    }
    let mut services: BTreeMap<&str, Service> = users
        .iter()
        .map(|(service, user)| {
            (
                *service,
                Service::start_with(service, &path, dir.path(), 1, &as_user(user)),
            )
        })
        .collect();

    let base = format!("http://{}", config.producer.listen);
    let http = reqwest::Client::new();
    eventually("the producer to be ready", SETTLE, || async {
        let ready = http.get(format!("{base}/readyz")).send().await.ok()?;
        (ready.status() == reqwest::StatusCode::OK).then_some(())
    })
    .await;
    let agent = Agent::new(&base);
    agent
        .batch_created(vec![
            effect("r-acl", 1, "payments/wire", 0, wire_args("acc-acl", 4_200)),
            effect("r-acl", 2, "email/send", 0, email_args("acl")),
        ])
        .await;
    let ledger = CqlLedger::connect(CqlConfig {
        migrate_on_start: false,
        ..config.ledger.cql.clone()
    })
    .await
    .expect("the test reads the ledger");
    for key in ["d-1/payments/wire/0", "d-2/email/send/0"] {
        let command = eventually(&format!("{key} to settle"), SETTLE, || async {
            let command = ledger_get(&ledger, "r-acl", key).await?;
            command.status().is_settled().then_some(command)
        })
        .await;
        assert_eq!(
            command.status(),
            CommandStatus::Confirmed,
            "{key} ends CONFIRMED with least-privilege users: {:#?}",
            verified_audit(&ledger, "r-acl").await.describe(key)
        );
    }
    for (name, service) in &mut services {
        service.assert_running();
        let log = service.log();
        assert!(
            !log.to_lowercase().contains("authorization failed"),
            "{name} was refused nothing on the way:\n{log}"
        );
    }
}

/// Starts the dispatcher as `user` with `env` and returns its log once it stopped, failing
/// the test if it keeps running.
fn refused(path: &Path, dir: &Path, generation: u32, user: &str, env: &[(&str, String)]) -> String {
    let mut vars = as_user(user);
    vars.extend(env.iter().map(|(k, v)| (*k, v.clone())));
    let mut dispatcher = Service::start_with("sluice-dispatcher", path, dir, generation, &vars);
    let Some((status, log)) = dispatcher.exit_within(REFUSED) else {
        panic!(
            "the dispatcher as {user} kept running without its ACLs:\n{}",
            dispatcher.log()
        );
    };
    assert!(
        !status.success(),
        "a refused start exits with an error: {log}"
    );
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_lacking_an_acl_gets_a_start_error_naming_it() {
    if skipped(&["SLUICE_SKIP_KAFKA", "SLUICE_SKIP_CQL"]) {
        return;
    }
    init_tracing();
    let brokers = secure_broker();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (path, config) = secured_config(dir.path(), &brokers, "http://127.0.0.1:9", "sluice-nacl");
    let (t, g) = (
        config.bus.topic_prefix.clone(),
        config.bus.kafka_config().group_prefix(),
    );
    for acl in documented("sluice migrate", "migrate", &t, &g) {
        grant(&acl);
    }
    migrate(&path, "migrate");

    // "lacking" holds the dispatcher's ACLs but READ on its group.
    let all = documented("sluice-dispatcher", "lacking", &t, &g);
    grant(&all[0]);
    grant(&line(
        "lacking",
        &["Read"],
        &["--topic", &format!("{t}requested")],
    ));
    let log = refused(&path, dir.path(), 1, "lacking", &[]);
    let group = format!("lacks the READ permission on group {g}dispatcher");
    assert!(log.contains(&group), "the error names {group:?}:\n{log}");

    // "dev" holds nothing on these topics: not even their metadata.
    let log = refused(&path, dir.path(), 2, "dev", &[]);
    let topic = format!("lacks the DESCRIBE permission on topic {t}requested");
    assert!(log.contains(&topic), "the error names {topic:?}:\n{log}");

    // Told to create topics at every start, "lacking" (no CREATE) is refused even though
    // the topics exist.
    let log = refused(
        &path,
        dir.path(),
        3,
        "lacking",
        &[("SLUICE_BUS__KAFKA__CREATE_TOPICS", "always".to_owned())],
    );
    assert!(
        log.contains("lacks the CREATE permission on topic") && log.contains("if_missing"),
        "the error names CREATE and the setting that avoids it:\n{log}"
    );
}

/// Every group on `brokers` whose id starts with `prefix`, with its members' client ids.
async fn groups_starting(brokers: &str, prefix: &str) -> BTreeMap<String, Vec<String>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (brokers, prefix) = (brokers.to_owned(), prefix.to_owned());
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .expect("an admin client");
        let list = client
            .fetch_group_list(None, Duration::from_secs(15))
            .expect("the broker's groups");
        list.groups()
            .iter()
            .filter(|group| group.name().starts_with(&prefix))
            .map(|group| {
                (
                    group.name().to_owned(),
                    group
                        .members()
                        .iter()
                        .map(|m| m.client_id().to_owned())
                        .collect(),
                )
            })
            .collect()
    })
    .await
    .expect("the group listing task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_installs_on_one_broker_keep_to_their_own_groups() {
    if skipped(&["SLUICE_SKIP_KAFKA"]) {
        return;
    }
    let brokers =
        std::env::var("SLUICE_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:19092".into());
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let install = |name: &'static str| {
        let (brokers, unique) = (brokers.clone(), unique.clone());
        move |config: &mut Config| {
            config.bus.kind = BusKind::Kafka;
            config.bus.topic_prefix = format!("sluice-gp{}-{name}.", &unique[..8]);
            config.bus.partitions = 2;
            config.bus.kafka.brokers = brokers;
            config.bus.kafka.replication_factor = Some(1);
            config.bus.kafka.client_id = format!("install-{name}");
            config
                .bus
                .kafka
                .extra
                .insert("session.timeout.ms".into(), "6000".into());
        }
    };
    let a = Harness::start_with(Faults::none(), |c| c, install("a")).await;
    let b = Harness::start_with(Faults::none(), |c| c, install("b")).await;
    for (harness, run) in [(&a, "r-install-a"), (&b, "r-install-b")] {
        harness
            .agent
            .submit_created(&effect(run, 1, "payments/wire", 0, wire_args(run, 1_000)))
            .await;
        let settled = harness.agent.wait_settled(run, "d-1/payments/wire/0").await;
        assert_eq!(settled.status(), CommandStatus::Confirmed, "{run}");
    }
    let stem = format!("sluice-gp{}-", &unique[..8]);
    let groups = groups_starting(&brokers, &stem).await;
    for name in ["a", "b"] {
        let prefix = format!("{stem}{name}-");
        for role in ["dispatcher", "reconciler", "compensator"] {
            let id = format!("{prefix}{role}");
            let members = groups
                .get(&id)
                .unwrap_or_else(|| panic!("install {name}'s group {id} exists: {groups:?}"));
            assert!(
                !members.is_empty()
                    && members
                        .iter()
                        .all(|m| m.starts_with(&format!("install-{name}-"))),
                "{id} holds install {name}'s members only: {members:?}"
            );
        }
    }
    for (id, members) in &groups {
        let owner = if id.starts_with(&format!("{stem}a-")) {
            "a"
        } else {
            "b"
        };
        assert!(
            members
                .iter()
                .all(|m| m.starts_with(&format!("install-{owner}-"))),
            "no member of the other install is in {id}: {members:?}"
        );
    }
    a.stop().await;
    b.stop().await;
}
