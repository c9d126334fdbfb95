//! The `sluice` command line: parses the command and hands it to the crate that carries it
//! out — `sluice-embedded` (`dev`, `demo`, `bench`), `sluice-mcp` (`mcp`), `sluice-cli` (the
//! console, `catalog`, `webhooks`, `migrate`, `health`), `sluice-upstream` (`upstream`). What
//! is its own is `sluice dev`'s first start: the admin token and keys kept in the data
//! directory.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use futures::future::LocalBoxFuture;
use sluice_assemble::load_catalog;
use sluice_cli::console::{ConsoleArgs, ConsoleCommand};
use sluice_embedded::devdir;
use sluice_runtime::cli::ServiceArgs;
use sluice_runtime::config::{Role, TokenConfig};

#[derive(Debug, Parser)]
#[command(
    name = "sluice",
    version = sluice_runtime::build_info::LONG_VERSION,
    about = "Safe side effects for AI agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    console: ConsoleArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run all four services in one process on the embedded ledger and bus.
    Dev {
        #[command(flatten)]
        service: ServiceArgs,
    },
    /// Apply the ledger schema (CQL keyspace and tables, or the SQLite file) and create the
    /// bus topics of the configuration, then exit. Safe to run again.
    Migrate {
        #[command(flatten)]
        service: ServiceArgs,
        /// Print the CQL statements instead of applying anything.
        #[arg(long)]
        print: bool,
    },
    /// Play agents against a fault-injecting upstream through the whole pipeline, and check
    /// that nothing is lost, committed twice or missing from the audit chain.
    Demo(sluice_embedded::demo::DemoArgs),
    /// Measure effects per second from submission to CONFIRMED, and their latency.
    Bench(sluice_embedded::bench::BenchArgs),
    /// Serve the demo upstream (a small bank, mail, ticket and search service on loopback that
    /// the example catalog calls) until Ctrl-C; `--faults demo` makes it misbehave on purpose,
    /// as `sluice demo` does. Point the example catalog elsewhere with SLUICE_UPSTREAM_URL.
    Upstream {
        #[arg(long, default_value = "127.0.0.1:8787")]
        listen: std::net::SocketAddr,
        /// `none`, or `demo`: every fault at 5 % (commit then time out, drop the response,
        /// 5xx, commit then 5xx, book a wire twice, status checks answered 503).
        #[arg(long, value_enum, default_value = "none")]
        faults: UpstreamFaults,
        /// Seed of the fault draws (the same seed and requests give the same faults).
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
    /// Serve the demo upstream without faults until a signal: the upstream process of `sluice
    /// bench --mode agents`, which prints its URL on the first line of stdout.
    #[command(hide = true)]
    BenchUpstream {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: std::net::SocketAddr,
    },
    /// Serve the catalog's tools over the Model Context Protocol (stdio or streamable HTTP):
    /// every tool call of an MCP agent is recorded, executed and reconciled by Sluice.
    Mcp(sluice_mcp::McpArgs),
    /// For catalog authors: check a catalog and its secrets, or print the requests a tool's
    /// endpoints would send, secrets masked, without sending them.
    Catalog(sluice_cli::catalog_cmd::CatalogArgs),
    /// For operators of [[webhooks]]: send a signed test event, list deliveries, retry those
    /// given up.
    Webhooks(sluice_cli::webhooks_cmd::WebhooksArgs),
    /// For container healthchecks (the image has no shell or curl): GET a URL, exit 0 when it
    /// answers 2xx, else exit 1 saying what it answered.
    Health(sluice_cli::health::HealthArgs),
    #[command(flatten)]
    Console(ConsoleCommand),
}

/// Runs the command of this process's arguments; the exit code says how it went (a failed
/// demo or console command has its own), an error what kept it from running.
pub fn run() -> LocalBoxFuture<'static, anyhow::Result<ExitCode>> {
    Box::pin(run_body())
}

async fn run_body() -> anyhow::Result<ExitCode> {
    sluice_faults::setup()?;
    let cli = Cli::parse();
    match cli.command {
        Command::Dev { service } => {
            let mut config = service.load()?;
            // One process per data directory; held until this process ends.
            let _lock = devdir::lock(&config.ledger.data_dir)?;
            let generated = ensure_admin_token(&mut config)?;
            ensure_link_key(&mut config)?;
            ensure_callback_key(&mut config)?;
            // The web console is on in dev unless the configuration turns it off.
            let console = *config.producer.console.get_or_insert(true);
            sluice_runtime::telemetry::init(&config.telemetry);
            let catalog = load_catalog(&config.catalog)?;
            let shutdown = sluice_runtime::shutdown_on_signals();
            let pipeline = sluice_embedded::dev::start(&config, catalog, shutdown).await?;
            // Counted after the start: the tools of MCP servers are listed by it.
            let tools = pipeline.ctx.catalog.len();
            // On the terminal only, never through the log. A reader that goes away (`| head`)
            // must not take the server with it: a failed write is ignored, not a panic.
            let mut banner = String::new();
            if let Some((token, path)) = generated {
                banner.push_str(&format!(
                    "admin token (not logged; kept in {} for the next start; give it to the console):\n  export SLUICE_URL={} SLUICE_TOKEN={token}\n",
                    path.display(),
                    pipeline.url()
                ));
            }
            if console {
                banner.push_str(&format!("web console: {}/ui/\n", pipeline.url()));
            }
            {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(banner.as_bytes()).and_then(|()| out.flush());
            }
            tracing::info!(
                url = %pipeline.url(),
                data_dir = %config.ledger.data_dir.display(),
                tools,
                "sluice dev is running; Ctrl-C stops it"
            );
            let ran = pipeline.wait().await;
            sluice_runtime::telemetry::shutdown();
            ran.map_err(anyhow::Error::msg)?;
        }
        Command::Migrate { service, print } => {
            let config = service.load()?;
            if print {
                for statement in sluice_cli::migrate::cql_statements(&config) {
                    println!("{statement};\n");
                }
                return Ok(ExitCode::SUCCESS);
            }
            sluice_runtime::telemetry::init(&config.telemetry);
            for line in sluice_cli::migrate::run(config).await? {
                println!("{line}");
            }
        }
        Command::Demo(args) => {
            let outcome =
                sluice_embedded::demo::run(args, sluice_runtime::shutdown_on_signals()).await;
            return Ok(exit_code(outcome));
        }
        Command::Bench(args) => {
            let outcome =
                sluice_embedded::bench::run(args, sluice_runtime::shutdown_on_signals()).await;
            return Ok(exit_code(outcome));
        }
        Command::Upstream {
            listen,
            faults,
            seed,
        } => {
            let faults = match faults {
                UpstreamFaults::None => sluice_upstream::Faults::none(),
                UpstreamFaults::Demo => sluice_upstream::Faults::demo(),
            };
            let upstream = sluice_upstream::Upstream::start(listen, faults, seed).await?;
            println!("demo upstream listening on {}", upstream.base_url());
            sluice_runtime::shutdown_on_signals().cancelled().await;
            upstream.shutdown().await;
        }
        Command::BenchUpstream { listen } => {
            let upstream =
                sluice_upstream::Upstream::start(listen, sluice_upstream::Faults::none(), 0)
                    .await?;
            println!("upstream listening on {}", upstream.base_url());
            sluice_runtime::shutdown_on_signals().cancelled().await;
            upstream.shutdown().await;
        }
        Command::Mcp(args) => {
            // Logs go to stderr: over stdio, stdout carries the protocol, and the client shows
            // stderr to its user, so only warnings unless asked.
            let telemetry = sluice_runtime::config::TelemetryConfig {
                log_level: args.log_filter(std::env::var("RUST_LOG").ok()),
                ..Default::default()
            };
            sluice_runtime::telemetry::init(&telemetry);
            sluice_mcp::run(
                &cli.console.url,
                cli.console.token,
                args,
                sluice_runtime::shutdown_on_signals(),
            )
            .await?;
        }
        Command::Catalog(args) => {
            return Ok(match sluice_cli::catalog_cmd::run(args).await {
                Ok(out) => {
                    println!("{out}");
                    ExitCode::SUCCESS
                }
                Err(message) => {
                    eprintln!("error: {message}");
                    ExitCode::FAILURE
                }
            });
        }
        Command::Webhooks(args) => {
            return Ok(match sluice_cli::webhooks_cmd::run(args).await {
                Ok(out) => {
                    println!("{out}");
                    ExitCode::SUCCESS
                }
                Err(message) => {
                    eprintln!("error: {message}");
                    ExitCode::FAILURE
                }
            });
        }
        Command::Health(args) => {
            return Ok(match sluice_cli::health::check(&args).await {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(message) => {
                    eprintln!("error: {message}");
                    ExitCode::FAILURE
                }
            });
        }
        Command::Console(command) => {
            return Ok(match sluice_cli::console::run(cli.console, command).await {
                Ok(out) => {
                    println!("{out}");
                    ExitCode::SUCCESS
                }
                Err(failure) => {
                    eprintln!("{}", failure.message);
                    ExitCode::from(failure.exit as u8)
                }
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The demo upstream's fault presets.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum UpstreamFaults {
    None,
    Demo,
}

/// Prints a failed demo or bench as one message with its causes (no backtrace: the failure is
/// a finding about the pipeline, not a crash of this command) and fails the process.
fn exit_code(outcome: Result<(), impl std::error::Error>) -> ExitCode {
    let Err(error) = outcome else {
        return ExitCode::SUCCESS;
    };
    let mut message = format!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    eprintln!("{message}");
    ExitCode::FAILURE
}

/// `sluice dev` without a configured approval-link key: the one kept in the data directory
/// (`devdir::LINK_KEY_FILE`) from an earlier start, else a fresh one kept there, so links
/// given out before a restart still open after it.
fn ensure_link_key(config: &mut sluice_runtime::Config) -> anyhow::Result<()> {
    if config.approval_links.secret.is_some() {
        return Ok(());
    }
    let (key, _generated) = devdir::kept_secret(
        &config.ledger.data_dir,
        devdir::LINK_KEY_FILE,
        sluice_embedded::dev::random_key,
    )?;
    config.approval_links.secret = Some(key.into());
    Ok(())
}

/// `sluice dev` without a configured callback key: the one kept in the data directory
/// (`devdir::CALLBACK_KEY_FILE`) from an earlier start, else a fresh one kept there, so callback
/// URLs given to upstreams before a restart still verify after it. The public URL, when not
/// configured, is the address `sluice_embedded::dev::start` listens on.
fn ensure_callback_key(config: &mut sluice_runtime::Config) -> anyhow::Result<()> {
    if config.callbacks.secret.is_some() {
        return Ok(());
    }
    let (key, _generated) = devdir::kept_secret(
        &config.ledger.data_dir,
        devdir::CALLBACK_KEY_FILE,
        sluice_embedded::dev::random_key,
    )?;
    config.callbacks.secret = Some(key.into());
    Ok(())
}

/// Adds an admin token when the configuration names none (and does not ask for an open API
/// with `producer.open`), so the console can be used at once: the one kept in the data
/// directory from an earlier start, else a fresh one kept there. Returns it and its file for
/// printing.
fn ensure_admin_token(
    config: &mut sluice_runtime::Config,
) -> anyhow::Result<Option<(String, std::path::PathBuf)>> {
    if config.producer.open || config.auth.tokens.iter().any(|t| t.role == Role::Admin) {
        return Ok(None);
    }
    // Two v4 UUIDs: 244 bits from the operating system's random source.
    let (token, _generated) = devdir::admin_token(&config.ledger.data_dir, || {
        format!(
            "sluice-{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        )
    })?;
    config.auth.tokens.push(TokenConfig {
        name: "dev-admin".into(),
        role: Role::Admin,
        token: Some(token.clone()),
        token_sha256: None,
        tenants: Vec::new(),
    });
    Ok(Some((
        token,
        config.ledger.data_dir.join(devdir::TOKEN_FILE),
    )))
}
