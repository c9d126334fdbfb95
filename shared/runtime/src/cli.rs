//! The flags every service binary takes, and the start-up they share.

use std::path::PathBuf;

use anyhow::{Context as _, bail};

use crate::config::{BusKind, Config};

/// Flags of a service binary. Configuration is layered: defaults → `--config` file →
/// `SLUICE_<SECTION>__<KEY>` environment → these flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServiceArgs {
    /// The configuration file (TOML).
    #[arg(long, short, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log format: text or json.
    #[arg(long)]
    pub log_json: bool,
    /// Log filter, e.g. `info` or `sluice=debug,info`.
    #[arg(long)]
    pub log_level: Option<String>,
}

impl ServiceArgs {
    /// The configuration these flags and the process environment select.
    pub fn load(&self) -> anyhow::Result<Config> {
        let mut config = Config::load(self.config.as_deref(), std::env::vars())
            .context("invalid configuration")?;
        if self.log_json {
            config.telemetry.log_format = crate::config::LogFormat::Json;
        }
        if let Some(level) = &self.log_level {
            config.telemetry.log_level = level.clone();
        }
        Ok(config)
    }
}

/// Refuses to start a lone service on the embedded bus, which exists only inside one process.
pub fn require_shared_bus(config: &Config, service: &str) -> anyhow::Result<()> {
    match config.bus.kind {
        BusKind::Embedded => bail!(
            "the {service} alone cannot use the embedded bus: it lives inside one process. \
             Run all four services together with `sluice dev`, or configure a shared bus \
             (bus.kind) to run them as separate processes"
        ),
        BusKind::Kafka => Ok(()),
    }
}
