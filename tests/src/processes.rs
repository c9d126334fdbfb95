//! What the tests that run the services as processes of their own share: a free loopback port,
//! and the configuration of services on CQL and Kafka (`tests/tests/distributed.rs` on the
//! single-node engines, `tests/tests/cluster.rs` on the 3-node clusters, and
//! `tests/tests/kafka_access.rs` on the authorizing broker), and a service binary run as a
//! child process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};

use sluice_ledger_cql::CqlConfig;
use sluice_runtime::Config;
use sluice_runtime::config::{BusKind, LedgerKind};

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Names a configuration's keyspace and topics: `{keyspace}_{secs}_{unique}` (the CQL suites
/// drop keyspaces of their prefixes older than ten minutes) and `{topics}-{unique}.`.
#[derive(Debug)]
pub struct Names<'a> {
    pub keyspace: &'a str,
    pub topics: &'a str,
}

/// The services on the CQL `nodes` and the Kafka `brokers`, with `catalog`: the schema applied
/// by `sluice migrate` beforehand (as in production, where services may not run DDL), 8
/// partitions, a killed member's partitions freed after 6 s (the broker's floor), sweeps every
/// 200 ms, the API open on a free loopback port (by choice, on loopback only). `adjust` changes
/// the rest; the result is validated and written to `dir/sluice.toml`.
pub fn services_config(
    dir: &Path,
    catalog: PathBuf,
    nodes: Vec<String>,
    brokers: &str,
    names: &Names<'_>,
    adjust: impl FnOnce(&mut Config),
) -> (PathBuf, Config) {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut config = Config::default();
    config.catalog.path = Some(catalog);
    config.ledger.kind = LedgerKind::Cql;
    config.ledger.cql = CqlConfig {
        nodes,
        keyspace: format!("{}_{secs}_{}", names.keyspace, &unique[..10]),
        migrate_on_start: false,
        ..CqlConfig::default()
    };
    config.bus.kind = BusKind::Kafka;
    config.bus.topic_prefix = format!("{}-{}.", names.topics, &unique[..8]);
    config.bus.partitions = 8;
    config.bus.kafka.brokers = brokers.to_owned();
    config
        .bus
        .kafka
        .extra
        .insert("session.timeout.ms".into(), "6000".into());
    config.producer.listen = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
    config.producer.open = true;
    config.reconciler.sweep_interval_ms = 200;
    adjust(&mut config);
    config
        .validate()
        .expect("the services' configuration is valid");
    let path = dir.join("sluice.toml");
    std::fs::write(
        &path,
        toml::to_string(&config).expect("the configuration serialises"),
    )
    .expect("write the configuration");
    (path, config)
}

/// Gives every service reading the configuration at `path` one copy key (`[[bus.copy_keys]]`),
/// as a deployment should: the dispatcher then acts on the signed copy of each command in its
/// requests instead of reading it. A written configuration holds no secret, so the key is a
/// file in `dir` the services read.
pub fn add_copy_key(dir: &Path, path: &Path) {
    let key = dir.join("copy.key");
    std::fs::write(&key, uuid::Uuid::new_v4().simple().to_string().repeat(2)).expect("a key");
    let mut text = std::fs::read_to_string(path).expect("the configuration");
    text.push_str(&format!(
        "\n[[bus.copy_keys]]\nid = \"test\"\nsecret = {{ file = {:?} }}\n",
        key.display().to_string()
    ));
    std::fs::write(path, text).expect("the configuration with its copy key");
}

/// `target/<profile>/`, where this build put the service binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in target/<profile>/deps")
        .to_owned()
}

/// The path of the service binary `name` of this build; fails the test if it was not built.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.exists(),
        "{} is missing: build the service binaries first with `cargo build --workspace --bins` \
         (scripts/test.sh does)",
        path.display()
    );
    path
}

/// One service process; killed when dropped, so a failing test leaves none behind.
#[derive(Debug)]
pub struct Service {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Service {
    pub fn start(name: &'static str, config: &Path, dir: &Path, generation: u32) -> Self {
        Self::start_with(name, config, dir, generation, &[])
    }

    pub fn start_with(
        name: &'static str,
        config: &Path,
        dir: &Path,
        generation: u32,
        env: &[(&str, String)],
    ) -> Self {
        let log = dir.join(format!("{name}-{generation}.log"));
        let out = std::fs::File::create(&log).expect("a log file");
        let err = out.try_clone().expect("a second handle on the log file");
        let child = Process::new(binary(name))
            .arg("--config")
            .arg(config)
            .env_remove("SLUICE_CONFIG")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("SLUICE_TELEMETRY__LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        Self { name, child, log }
    }

    /// SIGKILL: no shutdown hook runs, leases stay held, offsets stay uncommitted.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the process to end on its own: its exit status and log, or
    /// `None` if it still runs.
    pub fn exit_within(
        &mut self,
        timeout: std::time::Duration,
    ) -> Option<(std::process::ExitStatus, String)> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some((
                    status,
                    std::fs::read_to_string(&self.log).unwrap_or_default(),
                ));
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// What the process wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited with {status}:\n{}",
                self.name,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}
