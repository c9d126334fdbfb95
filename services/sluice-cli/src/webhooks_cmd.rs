//! `sluice webhooks`: for operators of `[[webhooks]]`. `test` sends one signed test event to a
//! subscription's receiver and prints what it answered (nothing is stored); `list` shows a
//! subscription's deliveries as the ledger keeps them; `retry` makes given-up deliveries
//! pending again, to be sent by the running deliverer.

use std::sync::Arc;

use clap::{Args, Subcommand};
use comfy_table::Table;
use futures::future::BoxFuture;
use sluice_core::time::{Clock, SystemClock};
use sluice_core::webhook::{Delivery, DeliveryStatus};
use sluice_reconciler::webhooks::{Hook, send};
use sluice_runtime::Config;
use sluice_runtime::cli::ServiceArgs;
use sluice_runtime::config::WebhookConfig;

#[derive(Debug, Args)]
pub struct WebhooksArgs {
    #[command(subcommand)]
    pub command: WebhooksCommand,
    #[command(flatten)]
    pub service: ServiceArgs,
}

#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Send a signed test event (type dev.sluice.webhook.test) to the webhook's receiver and
    /// print its answer. Nothing is stored; fails unless the receiver answers 2xx.
    Test {
        /// The webhook's name in the configuration.
        name: String,
    },
    /// Show the webhook's deliveries, newest first: status, attempts, last answer.
    List {
        name: String,
        /// Show at most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Make the webhook's FAILED deliveries (or the one with this event id) PENDING again, their
    /// attempts starting over; the running deliverer sends them.
    Retry {
        name: String,
        /// Only the delivery of this event id.
        #[arg(long)]
        event_id: Option<String>,
    },
}

/// Runs the command; its output, or an error message.
pub fn run(args: WebhooksArgs) -> BoxFuture<'static, Result<String, String>> {
    Box::pin(run_body(args))
}

async fn run_body(args: WebhooksArgs) -> Result<String, String> {
    let config = args.service.load().map_err(|e| format!("{e:#}"))?;
    match args.command {
        WebhooksCommand::Test { name } => test(find(&config, &name)?).await,
        WebhooksCommand::List { name, limit } => {
            find(&config, &name)?;
            list(&config, &name, limit).await
        }
        WebhooksCommand::Retry { name, event_id } => {
            find(&config, &name)?;
            retry(&config, &name, event_id.as_deref()).await
        }
    }
}

fn find<'c>(config: &'c Config, name: &str) -> Result<&'c WebhookConfig, String> {
    config
        .webhooks
        .iter()
        .find(|hook| hook.name == name)
        .ok_or_else(|| {
            let known: Vec<&str> = config.webhooks.iter().map(|h| h.name.as_str()).collect();
            if known.is_empty() {
                format!("no webhook named {name:?}: the configuration has no [[webhooks]]")
            } else {
                format!(
                    "no webhook named {name:?}; the configuration names {}",
                    known.join(", ")
                )
            }
        })
}

/// Sends the test event; the receiver's answer, as a report.
pub async fn test(config: &WebhookConfig) -> Result<String, String> {
    let hook = Hook::new(config)?;
    let client = send::client()?;
    let event = send::test_event(&hook.name, SystemClock.now());
    let answer = hook
        .post(&client, &event)
        .await
        .map_err(|why| format!("webhook {}: no answer from the receiver: {why}", hook.name))?;
    let report = format!(
        "webhook {} answered HTTP {} to test event {} (type {}){}{}",
        hook.name,
        answer.status,
        event.id(),
        event.kind(),
        if answer.body.is_empty() { "" } else { ":\n" },
        answer.body
    );
    if (200..300).contains(&answer.status) {
        Ok(report)
    } else {
        Err(format!("{report}\nthe receiver did not accept it (2xx)"))
    }
}

async fn open(config: &Config) -> Result<Arc<dyn sluice_ledger::Ledger>, String> {
    sluice_assemble::open_ledger(config, Arc::new(SystemClock))
        .await
        .map_err(|e| format!("cannot open the ledger: {e}"))
}

/// `sluice webhooks list`: the webhook's deliveries the ledger keeps, newest first.
pub async fn list(config: &Config, name: &str, limit: usize) -> Result<String, String> {
    let ledger = open(config).await?;
    let deliveries = ledger
        .webhook_list(name, limit)
        .await
        .map_err(|e| format!("cannot read the deliveries: {e}"))?;
    Ok(table(name, &deliveries))
}

/// The deliveries as a table, and a line of totals.
pub fn table(name: &str, deliveries: &[Delivery]) -> String {
    let mut table = Table::new();
    table.set_header([
        "event id",
        "type",
        "status",
        "attempts",
        "created",
        "next / done",
        "last answer",
    ]);
    let mut counts = [0usize; 3];
    for delivery in deliveries {
        counts[delivery.status as usize] += 1;
        let when = match delivery.status {
            DeliveryStatus::Pending => delivery.next_at.to_string(),
            DeliveryStatus::Delivered => delivery
                .delivered_at
                .map(|at| at.to_string())
                .unwrap_or_default(),
            DeliveryStatus::Failed => delivery
                .last_attempt_at
                .map(|at| at.to_string())
                .unwrap_or_default(),
        };
        let last = match (&delivery.last_status, &delivery.last_error) {
            (_, Some(error)) => error.chars().take(80).collect(),
            (Some(status), None) => format!("HTTP {status}"),
            (None, None) => String::new(),
        };
        table.add_row([
            delivery.id().to_owned(),
            delivery.event.kind().to_owned(),
            delivery.status.as_str().to_owned(),
            delivery.attempts.to_string(),
            delivery.created_at.to_string(),
            when,
            last,
        ]);
    }
    format!(
        "webhook {name}: {} pending, {} delivered, {} failed (of the {} newest kept)\n{table}",
        counts[DeliveryStatus::Pending as usize],
        counts[DeliveryStatus::Delivered as usize],
        counts[DeliveryStatus::Failed as usize],
        deliveries.len()
    )
}

/// `sluice webhooks retry`: FAILED deliveries (or the one of `event_id`) pending again.
pub async fn retry(config: &Config, name: &str, event_id: Option<&str>) -> Result<String, String> {
    let ledger = open(config).await?;
    let now = SystemClock.now();
    let kept = ledger
        .webhook_list(name, usize::MAX)
        .await
        .map_err(|e| format!("cannot read the deliveries: {e}"))?;
    let chosen: Vec<&Delivery> = kept
        .iter()
        .filter(|d| match event_id {
            Some(id) => d.id() == id,
            None => d.status == DeliveryStatus::Failed,
        })
        .collect();
    if let Some(id) = event_id
        && chosen.is_empty()
    {
        return Err(format!("webhook {name} keeps no delivery of event {id}"));
    }
    let mut retried = 0;
    for delivery in chosen {
        let Some(next) = delivery.retried(now) else {
            continue;
        };
        if ledger
            .webhook_update(&next, delivery.version)
            .await
            .map_err(|e| format!("cannot store the retry: {e}"))?
        {
            retried += 1;
        }
    }
    Ok(format!(
        "webhook {name}: {retried} deliveries pending again; the deliverer sends them"
    ))
}
