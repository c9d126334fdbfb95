//! An operator's action whose follow-up cannot be published (a real embedded bus refusing every
//! message as too large) still answers what it stored, over a real HTTP server and a real
//! SQLite ledger: the step is stored, the sweep republishes it, and the failure is a warning in
//! the log, not an error for the operator. The same failure in a job run for a bus message is
//! an error, so that message comes back. A refused action answers 409 with the core's reason.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use sluice_assemble::{assemble, load_catalog};
use sluice_bus::{EmbeddedBus, EmbeddedConfig};
use sluice_core::command::{Command, CommandStatus, EffectSemantics, Intent};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{Event, Job, Operator};
use sluice_runtime::{Config, Context, PipelineError, Shutdown, Sites};

/// The log, kept for the assertion on the warning.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log lock")).into_owned()
    }
}

impl Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A PENDING command of `run`, reserved in the ledger as the producer would.
async fn reserve(ctx: &Context, run: &str) -> Command {
    let command = Command::from_intent(
        Intent {
            run_id: RunId::parse(run).expect("valid"),
            command_key: CommandKey::parse("d-1/email/send/0").expect("valid"),
            semantics: EffectSemantics::Idempotent,
            args: json!({"to": "a@example.com", "subject": "s", "body": "b"}),
            business_key: None,
            policy_version: "1".into(),
            max_attempts: 3,
            not_before: None,
        },
        ctx.clock.now(),
        10_000,
    );
    let audit = command.reservation_audit("producer");
    let reserved = ctx.ledger.reserve(command, audit).await.expect("reserve");
    assert!(reserved.is_created(), "{reserved:?}");
    reserved.command().clone()
}

async fn cancel(base: &str, run: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!(
            "{base}/v1/runs/{run}/effects/d-1%2Femail%2Fsend%2F0:cancel"
        ))
        .json(&json!({"reason": "not wanted"}))
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_action_whose_follow_up_is_not_published_answers_what_it_stored() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();

    let dir = tempfile::tempdir().expect("a directory");
    let mut config = Config::default();
    config.ledger.data_dir = dir.path().join("ledger");
    config.producer.open = true;
    config.validate().expect("a valid configuration");
    let mut ctx = assemble(&config, load_catalog(&config.catalog).expect("catalog"))
        .await
        .expect("a context");
    // Every message is larger than this: every publication fails.
    ctx.bus = Arc::new(
        EmbeddedBus::new(EmbeddedConfig {
            max_message_bytes: 16,
            ..EmbeddedConfig::default()
        })
        .expect("a bus"),
    );
    let operated = reserve(&ctx, "r-unpublished").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let shutdown = Shutdown::new();
    let served = tokio::spawn({
        let (ctx, config, shutdown) = (ctx.clone(), config.clone(), shutdown.clone());
        async move { sluice_producer::serve(ctx, &config, listener, shutdown).await }
    });

    let (status, body) = cancel(&base, "r-unpublished").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["to"], "CANCELLED", "{body}");
    let stored = ctx
        .ledger
        .get(&operated.run_id, &operated.command_key)
        .await
        .expect("read")
        .expect("the command");
    assert_eq!(stored.status(), CommandStatus::Cancelled);
    let text = log.text();
    assert!(
        text.contains("follow-up not published") && text.contains("r-unpublished"),
        "the failed publication is a warning naming the command: {text}"
    );

    // Cancelled already: refused with the core's reason, nothing written.
    let (status, body) = cancel(&base, "r-unpublished").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "not_allowed", "{body}");
    assert_eq!(body["error"]["details"]["status"], "CANCELLED", "{body}");

    // A job run for a bus message fails on the same publication, so its message comes back.
    let handled = reserve(&ctx, "r-redelivered").await;
    let event = Event::Cancel {
        operator: Operator {
            actor: "dispatcher".into(),
            reason: "cancelled: test".into(),
        },
    };
    let failed = ctx
        .run_job(Job::Dispatch, "dispatcher", handled, Sites::NONE, |_| {
            Some(event.clone())
        })
        .await
        .expect_err("a bus failure is the job's error");
    assert!(matches!(failed, PipelineError::Bus(_)), "{failed:?}");

    shutdown.cancel();
    served
        .await
        .expect("the server task")
        .expect("the server stops");
}
