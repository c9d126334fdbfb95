//! The webhook deliverer (docs/decisions.md, "Webhooks"): pushes the events a person must act
//! on to the receivers of `[[webhooks]]`.
//!
//! Two loops. The *intake* consumes `events` as the consumer group [`Group::Webhooks`] and,
//! for each subscription whose `types` take the event's `ce_type`, stores a delivery in the ledger
//! (`WebhookStore::webhook_enqueue`, once per event id) before the message is acknowledged:
//! from then on the delivery survives a crash of this process or of the receiver. The
//! *sender* reads each subscription's due deliveries, claims one (a compare-and-set on its
//! version that holds it for longer than an attempt), posts it (`send.rs`) and stores what
//! the core makes of the answer (`sluice_core::webhook::Delivery::after_attempt`): delivered,
//! sent again after a jittered exponential backoff, or given up. Several processes may run
//! both loops on one ledger: the group splits the intake, the claims split the sending.

mod catch_up;
pub mod send;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::{Client, Url};
use sluice_bus::{BusError, Delivery as BusDelivery, Group, Subscription, Topic};
use sluice_core::time::Timestamp;
use sluice_core::webhook::{Delivery, DeliveryStatus, RetryRules, WebhookEvent, matches};
use sluice_runtime::config::WebhookConfig;
use sluice_runtime::consumer::{ConsumerSpec, Handled, RetryPolicy, consume_subscribed};
use sluice_runtime::messages::header;
use sluice_runtime::{Context, PipelineError, Shutdown};
use tokio::sync::Notify;

/// How often the sender looks for due deliveries when nothing woke it.
const POLL: Duration = Duration::from_millis(500);
/// Deliveries sent per subscription per pass.
const BATCH: usize = 32;
/// Pending deliveries read per subscription per pass (the figure `sluice_webhook_pending`
/// shows, and its bound).
const PENDING_READ: usize = 1_000;
/// How much longer than its timeout a claim holds a delivery: time to store the outcome. A
/// deliverer that dies mid-attempt leaves its delivery to the others for its timeout plus this.
const HOLD_MARGIN_MS: u64 = 5_000;

/// One subscription, checked and ready to send.
#[derive(Debug, Clone)]
pub struct Hook {
    pub name: String,
    pub url: Url,
    key: Vec<u8>,
    pub types: Vec<String>,
    pub timeout: Duration,
    pub rules: RetryRules,
}

impl Hook {
    /// The subscription of `config` (already validated at load; a hand-built one may fail).
    pub fn new(config: &WebhookConfig) -> Result<Self, String> {
        let url = Url::parse(&config.url)
            .map_err(|e| format!("webhook {}: the url is not a URL: {e}", config.name))?;
        let key = config
            .key()
            .map_err(|why| format!("webhook {}: secret: {why}", config.name))?;
        Ok(Self {
            name: config.name.clone(),
            url,
            key,
            types: config.types.clone(),
            timeout: Duration::from_millis(config.timeout_ms),
            rules: config.retry_rules(),
        })
    }

    /// Posts `event` once, outside the ledger (`sluice webhooks test`).
    pub async fn post(
        &self,
        client: &Client,
        event: &WebhookEvent,
    ) -> Result<send::Answer, String> {
        send::post(client, &self.url, &self.key, event, self.timeout).await
    }

    fn hold_ms(&self) -> u64 {
        u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX) + HOLD_MARGIN_MS
    }
}

/// The CloudEvent a bus message carries in binary mode, or `None` if it has no `ce_id` or
/// `ce_type`, or its data is not text.
pub fn event_of(message: &BusDelivery) -> Option<WebhookEvent> {
    event_from(&message.message.headers, message.payload())
}

/// The CloudEvent of binary-mode `headers` and `payload`.
fn event_from(headers: &[(String, Vec<u8>)], payload: &[u8]) -> Option<WebhookEvent> {
    let mut attributes = std::collections::BTreeMap::new();
    for (name, value) in headers {
        if let Some(attribute) = name.strip_prefix("ce_")
            && let Ok(value) = std::str::from_utf8(value)
        {
            attributes.insert(attribute.to_owned(), value.to_owned());
        }
    }
    if !attributes.contains_key("id") || !attributes.contains_key("type") {
        return None;
    }
    let data = std::str::from_utf8(payload).ok()?.to_owned();
    Some(WebhookEvent {
        attributes,
        content_type: header(headers, "content-type").map(str::to_owned),
        data,
    })
}

/// The deliverer of one process, its intake already in its consumer group.
#[derive(Debug)]
pub struct Deliverer {
    ctx: Context,
    hooks: Arc<Vec<Hook>>,
    client: Client,
    /// `None` when no webhook is served.
    subscription: Option<Subscription>,
}

impl Deliverer {
    /// Joins the intake's consumer group, so that every event published from now on is taken
    /// (on the embedded bus an event all the groups then in the topic acknowledged is gone):
    /// call it before the services that publish start. With no webhook configured it joins
    /// nothing.
    pub fn start(
        ctx: Context,
        webhooks: &[WebhookConfig],
    ) -> BoxFuture<'_, Result<Self, BusError>> {
        Box::pin(Self::start_body(ctx, webhooks))
    }

    async fn start_body(ctx: Context, webhooks: &[WebhookConfig]) -> Result<Self, BusError> {
        let hooks: Vec<Hook> = webhooks
            .iter()
            .filter_map(|config| match Hook::new(config) {
                Ok(hook) => Some(hook),
                Err(why) => {
                    tracing::error!("{why}; this webhook is not served");
                    None
                }
            })
            .collect();
        let (client, hooks) = match send::client() {
            Ok(client) => (client, hooks),
            Err(why) => {
                // Never a client with other settings (redirects, no timeouts): none at all.
                tracing::error!("{why}; no webhook is served");
                (Client::new(), Vec::new())
            }
        };
        let subscription = if hooks.is_empty() {
            None
        } else {
            let group = ctx.bus.group_id(Group::Webhooks);
            Some(ctx.bus.subscribe(Topic::Events, &group, &member()).await?)
        };
        Ok(Self {
            ctx,
            hooks: Arc::new(hooks),
            client,
            subscription,
        })
    }

    /// Runs the intake and the sender until `shutdown`.
    pub fn run(self, shutdown: Shutdown) -> BoxFuture<'static, Result<(), BusError>> {
        Box::pin(self.run_body(shutdown))
    }

    async fn run_body(self, shutdown: Shutdown) -> Result<(), BusError> {
        let Some(subscription) = self.subscription else {
            shutdown.cancelled().await;
            return Ok(());
        };
        let (ctx, hooks) = (self.ctx, self.hooks);
        let wake = Arc::new(Notify::new());
        tokio::spawn(catch_up::run(
            ctx.clone(),
            Arc::clone(&hooks),
            Arc::clone(&wake),
            shutdown.clone(),
        ));
        let sender = tokio::spawn(send_loop(
            ctx.clone(),
            Arc::clone(&hooks),
            self.client,
            Arc::clone(&wake),
            shutdown.clone(),
        ));
        let spec = ConsumerSpec {
            topic: Topic::Events,
            group: subscription.group().to_owned(),
            member: member(),
            concurrency: 4,
            lanes: None,
        };
        let (bus, metrics) = (ctx.bus.clone(), ctx.metrics.clone());
        let consumed = consume_subscribed(
            bus,
            metrics,
            spec,
            RetryPolicy::default(),
            subscription,
            shutdown,
            move |message: BusDelivery| {
                let (ctx, hooks, wake) = (ctx.clone(), Arc::clone(&hooks), Arc::clone(&wake));
                async move {
                    intake(&ctx, &hooks, &message).await?;
                    wake.notify_one();
                    Ok(Handled::Done)
                }
            },
        )
        .await;
        let _ = sender.await;
        consumed
    }
}

fn member() -> String {
    format!("webhooks-{}", std::process::id())
}

/// Starts the deliverer for `webhooks` and runs it until `shutdown` (a process whose
/// publishers already run: the reconciler's binary, where the group's committed offsets on
/// Kafka keep what was published meanwhile).
pub async fn run(
    ctx: Context,
    webhooks: Vec<WebhookConfig>,
    shutdown: Shutdown,
) -> Result<(), BusError> {
    Deliverer::start(ctx, &webhooks).await?.run(shutdown).await
}

/// Stores a delivery of the message's event for every subscription that takes it.
async fn intake(ctx: &Context, hooks: &[Hook], message: &BusDelivery) -> Result<(), PipelineError> {
    let Some(event) = event_of(message) else {
        // Not a CloudEvent this deliverer can send; another consumer of `events` may want it.
        tracing::debug!("an event without ce_id, ce_type or text data is not pushed");
        return Ok(());
    };
    let now = ctx.clock.now();
    for hook in hooks
        .iter()
        .filter(|hook| matches(&hook.types, event.kind()))
    {
        let delivery = Delivery::new(&hook.name, event.clone(), now);
        if ctx.ledger.webhook_enqueue(&delivery).await? {
            ctx.metrics
                .webhook_deliveries
                .with_label_values(&[&hook.name, "enqueued"])
                .inc();
        }
    }
    Ok(())
}

async fn send_loop(
    ctx: Context,
    hooks: Arc<Vec<Hook>>,
    client: Client,
    wake: Arc<Notify>,
    shutdown: Shutdown,
) {
    loop {
        let passes = hooks
            .iter()
            .map(|hook| deliver_due(&ctx, &client, hook, &shutdown));
        futures::future::join_all(passes).await;
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = wake.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// One pass over `hook`'s deliveries: the pending figures, then each due one sent once.
async fn deliver_due(ctx: &Context, client: &Client, hook: &Hook, shutdown: &Shutdown) {
    let now = ctx.clock.now();
    // Every pending delivery, in the order they fall due: the gauges, and the due ones first.
    let far = sluice_core::webhook::pending_horizon(now);
    let pending = match ctx.ledger.webhook_due(&hook.name, far, PENDING_READ).await {
        Ok(pending) => pending,
        Err(error) => {
            tracing::warn!(webhook = %hook.name, %error, "cannot read webhook deliveries");
            return;
        }
    };
    observe_pending(ctx, hook, &pending, now);
    for delivery in pending.iter().filter(|d| d.is_due(now)).take(BATCH) {
        if shutdown.is_cancelled() {
            return;
        }
        if let Err(error) = deliver_one(ctx, client, hook, delivery, shutdown).await {
            tracing::warn!(webhook = %hook.name, event_id = %delivery.id(), %error,
                "a webhook delivery could not be stored; it is sent again when due");
        }
    }
}

fn observe_pending(ctx: &Context, hook: &Hook, pending: &[Delivery], now: Timestamp) {
    let metrics = &ctx.metrics;
    metrics
        .webhook_pending
        .with_label_values(&[&hook.name])
        .set(i64::try_from(pending.len()).unwrap_or(i64::MAX));
    let oldest = pending.iter().map(|d| d.created_at).min();
    let age_ms = sluice_core::webhook::oldest_pending_age_ms(oldest, now);
    metrics
        .webhook_oldest_pending
        .with_label_values(&[&hook.name])
        .set(age_ms as f64 / 1_000.0);
}

/// Claims `delivery`, sends it, stores the outcome. A claim lost to another deliverer sends
/// nothing; a shutdown mid-attempt leaves the claim to lapse, and the delivery is sent again.
async fn deliver_one(
    ctx: &Context,
    client: &Client,
    hook: &Hook,
    delivery: &Delivery,
    shutdown: &Shutdown,
) -> Result<(), sluice_ledger::LedgerError> {
    let Some(claimed) = delivery.claim(ctx.clock.now(), hook.hold_ms()) else {
        return Ok(());
    };
    if !ctx
        .ledger
        .webhook_update(&claimed, delivery.version)
        .await?
    {
        return Ok(());
    }
    let attempt = tokio::select! {
        () = shutdown.cancelled() => return Ok(()),
        attempt = send::attempt(client, &hook.url, &hook.key, &claimed.event, hook.timeout) => attempt,
    };
    let jitter = (uuid::Uuid::new_v4().as_u128() % 1_000_000) as f64 / 1_000_000.0;
    let next = claimed.after_attempt(&attempt, ctx.clock.now(), &hook.rules, jitter);
    let outcome = match next.status {
        DeliveryStatus::Delivered => "delivered",
        DeliveryStatus::Pending => "retry",
        DeliveryStatus::Failed => "failed",
    };
    ctx.metrics
        .webhook_deliveries
        .with_label_values(&[&hook.name, outcome])
        .inc();
    match next.status {
        DeliveryStatus::Delivered => {
            tracing::debug!(webhook = %hook.name, event_id = %next.id(), "webhook delivered");
        }
        DeliveryStatus::Pending => tracing::info!(
            webhook = %hook.name,
            event_id = %next.id(),
            attempts = next.attempts,
            error = next.last_error.as_deref().unwrap_or(""),
            next_at = %next.next_at,
            "webhook not delivered; sent again later"
        ),
        DeliveryStatus::Failed => tracing::warn!(
            webhook = %hook.name,
            event_id = %next.id(),
            attempts = next.attempts,
            error = next.last_error.as_deref().unwrap_or(""),
            "webhook delivery given up: `sluice webhooks retry` sends it again"
        ),
    }
    ctx.ledger.webhook_update(&next, claimed.version).await?;
    Ok(())
}
