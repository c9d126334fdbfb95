//! One closed-loop or paced pass of `sluice bench`: the workload, the client tasks that submit
//! it, and the reader of lifecycle events that stamps each effect's confirmation.

use super::*;

/// How a pass submits its effects.
#[derive(Debug, Clone)]
pub(super) enum Submission {
    Single,
    Batch,
    /// Open loop: batches sent on a fixed schedule at `rate` effects per second.
    Paced {
        rate: f64,
        of: String,
    },
}

impl Submission {
    fn name(&self) -> String {
        match self {
            Self::Single => "single".into(),
            Self::Batch => "batch".into(),
            Self::Paced { of, .. } => format!("{of}, paced"),
        }
    }

    fn slug(&self) -> &'static str {
        match self {
            Self::Single => "single",
            Self::Batch => "batch",
            Self::Paced { .. } => "paced",
        }
    }
}

/// The effects of one pass and where each one's events are expected.
#[derive(Debug)]
pub(super) struct Workload {
    /// Each effect's request body, encoded before the pass starts: the client shares the
    /// pipeline's 2 cores, so it spends as little of them as it can.
    bodies: Vec<Box<RawValue>>,
    /// `<run_id>/<command_key>` (the events' `ce_subject`) to the effect's index.
    index: HashMap<String, usize>,
}

impl Workload {
    fn new(slug: &str, tool: BenchTool, effects: usize, per_run: usize) -> Self {
        let name = tool.name();
        let nonce = &uuid::Uuid::new_v4().simple().to_string()[..8];
        let mut bodies = Vec::with_capacity(effects);
        let mut index = HashMap::with_capacity(effects);
        for i in 0..effects {
            let run_id = format!("bench-{nonce}-{slug}-{}", i / per_run);
            let decision = i % per_run;
            index.insert(format!("{run_id}/d-{decision}/{name}/0"), i);
            let body = json!({
                "run_id": run_id,
                "decision": decision,
                "tool": name,
                "call_idx": 0,
                "args": tool.args(i),
            });
            bodies.push(serde_json::value::to_raw_value(&body).expect("a JSON value encodes"));
        }
        Self { bodies, index }
    }

    /// The body of `POST /v1/effects/batch` for the effects in `range`, joined from their
    /// encoded bodies.
    #[cfg(test)]
    fn batch_body(&self, range: std::ops::Range<usize>) -> String {
        self.batch_body_of(range)
    }

    /// The body of `POST /v1/effects/batch` for the effects at `indices`.
    fn batch_body_of(&self, indices: impl IntoIterator<Item = usize>) -> String {
        let effects: Vec<&RawValue> = indices.into_iter().map(|i| &*self.bodies[i]).collect();
        let len = effects.iter().map(|b| b.get().len() + 1).sum::<usize>();
        let mut body = String::with_capacity(len + 16);
        body.push_str("{\"effects\":[");
        for (i, effect) in effects.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(effect.get());
        }
        body.push_str("]}");
        body
    }
}

/// What the client reads of a batch answer: each effect's status, and its error when it has
/// one. The (minimal) commands in the answer are skipped, not built.
#[derive(Debug, serde::Deserialize)]
pub(super) struct BatchStatuses {
    results: Vec<EffectStatus>,
}

#[derive(Debug, serde::Deserialize)]
pub(super) struct EffectStatus {
    status: u16,
    #[serde(default)]
    error: Option<Box<RawValue>>,
}

/// When each effect was sent and confirmed, in nanoseconds since `origin` plus one (0: not
/// yet), written by the submitting tasks and the events reader.
#[derive(Debug)]
pub(super) struct Tracker {
    origin: Instant,
    pub(super) sent: Vec<AtomicU64>,
    pub(super) confirmed: Vec<AtomicU64>,
    confirmed_count: AtomicUsize,
    /// Effects that settled otherwise (FAILED, STUCK, BLOCKED, CANCELLED).
    failed: AtomicUsize,
    refused: AtomicUsize,
    /// Effects answered 503 (admission: the pipeline is behind) and submitted again after the
    /// answer's `Retry-After`, as a client should.
    pub(super) deferred: AtomicUsize,
    first_refusal: std::sync::Mutex<Option<String>>,
    settled: Notify,
}

impl Tracker {
    fn new(effects: usize) -> Self {
        Self {
            origin: Instant::now(),
            sent: (0..effects).map(|_| AtomicU64::new(0)).collect(),
            confirmed: (0..effects).map(|_| AtomicU64::new(0)).collect(),
            confirmed_count: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            deferred: AtomicUsize::new(0),
            first_refusal: std::sync::Mutex::new(None),
            settled: Notify::new(),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX - 1)
            + 1
    }

    fn mark_sent(&self, effect: usize, at: Instant) {
        self.sent[effect].store(self.stamp(at), Ordering::Relaxed);
    }

    fn refuse(&self, count: usize, why: String) {
        self.refused.fetch_add(count, Ordering::Relaxed);
        if let Ok(mut first) = self.first_refusal.lock() {
            first.get_or_insert(why);
        }
    }

    fn settled(&self) -> usize {
        self.confirmed_count.load(Ordering::Relaxed) + self.failed.load(Ordering::Relaxed)
    }
}

/// Starts a pipeline on a fresh ledger, measures one pass and stops the pipeline.
/// The pass's result line is printed as it ends unless `args.json`.
pub(super) async fn run_pass(
    args: &BenchArgs,
    submission: Submission,
    upstream: &Upstream,
    data_dir: &Path,
    scratch: &Scratch,
    shutdown: &Shutdown,
    progress: &Progress,
) -> Result<PassResult, BenchError> {
    let pass = submission.name();
    let mut config = args.config(&data_dir.join(submission.slug()))?;
    // Topics of its own per pass on a shared broker: the events group reads only this pass.
    config.bus.topic_prefix = format!(
        "{}bench-{}-{}.",
        config.bus.topic_prefix,
        &uuid::Uuid::new_v4().simple().to_string()[..8],
        submission.slug()
    );
    scratch.adopt(&mut config);
    // The client submits as an agent, with a bearer token, as agents do in production: the
    // producer then checks that each effect goes into a run of the agent's own.
    let token = uuid::Uuid::new_v4().simple().to_string();
    config.producer.open = false;
    config.auth.tokens.push(TokenConfig {
        name: BENCH_AGENT.into(),
        role: Role::Agent,
        token: Some(token.clone()),
        token_sha256: None,
        tenants: Vec::new(),
    });
    let catalog = example_catalog_at(&upstream.base_url())?;
    let pipeline = crate::dev::start(&config, catalog, shutdown.child_token()).await?;
    let measured = async {
        // Subscribed before the first submission, so no event is missed: a new group reads
        // the topic from its oldest message.
        let events = pipeline
            .ctx
            .bus
            .subscribe(
                Topic::Events,
                &format!("{}{EVENTS_GROUP}", pipeline.ctx.bus.group_prefix()),
                "bench",
            )
            .await?;
        let workload = Arc::new(Workload::new(
            submission.slug(),
            args.tool,
            args.effects,
            args.effects_per_run,
        ));
        let tracker = Arc::new(Tracker::new(args.effects));
        let bar = progress.bar(args.effects as u64, submission.slug());
        let reader = tokio::spawn(read_events(
            events,
            Arc::clone(&workload),
            Arc::clone(&tracker),
            bar.clone(),
        ));
        let client = http_client(Some(&token));
        let url = pipeline.url();
        let cpu_before = process_cpu();
        let submitted = submit(&client, &url, &submission, args, &pass, &workload, &tracker).await;
        let submit_secs = tracker.origin.elapsed().as_secs_f64();
        let stalled = submitted.is_ok() && !wait_settled(&tracker, args.effects).await;
        let cpu = process_cpu()
            .zip(cpu_before)
            .map(|(after, before)| after.saturating_sub(before));
        reader.abort();
        bar.finish_and_clear();
        submitted?;
        let refused = tracker.refused.load(Ordering::Relaxed);
        if refused > 0 {
            return Err(BenchError::Refused {
                pass: pass.clone(),
                refused,
                effects: args.effects,
                first: tracker
                    .first_refusal
                    .lock()
                    .ok()
                    .and_then(|first| first.clone())
                    .unwrap_or_default(),
            });
        }
        let confirmed = tracker.confirmed_count.load(Ordering::Relaxed);
        if confirmed < args.effects {
            return Err(BenchError::Incomplete {
                pass: pass.clone(),
                confirmed,
                failed: tracker.failed.load(Ordering::Relaxed),
                effects: args.effects,
                stalled,
            });
        }
        let mut result = summarize(&pass, &submission, &tracker, submit_secs, cpu);
        count_round_trips(&mut result, pipeline.ctx.ledger.round_trips());
        count_bus_messages(&mut result, pipeline.ctx.bus.traffic());
        Ok(result)
    };
    let result = measured.await;
    let stopped = pipeline.stop().await;
    scratch.tidy_topics().await;
    let result = result?;
    stopped.map_err(|error| BenchError::Stopped { pass, error })?;
    if !args.json {
        println!("{}", result.line());
    }
    Ok(result)
}

/// Reads lifecycle events and stamps the effects they confirm.
pub(super) async fn read_events(
    mut events: Subscription,
    workload: Arc<Workload>,
    tracker: Arc<Tracker>,
    bar: ProgressBar,
) {
    let confirmed = event_type(sluice_core::command::CommandStatus::Confirmed);
    while let Some(delivery) = events.next().await {
        let at = Instant::now();
        let headers = &delivery.message.headers;
        if let (Some(subject), Some(kind)) =
            (header(headers, "ce_subject"), header(headers, "ce_type"))
        {
            if let Some(&effect) = workload.index.get(subject) {
                if kind == confirmed {
                    // The first CONFIRMED counts; a repeated event (at-least-once) does not.
                    if tracker.confirmed[effect]
                        .compare_exchange(
                            0,
                            tracker.stamp(at),
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                    {
                        tracker.confirmed_count.fetch_add(1, Ordering::Relaxed);
                        bar.inc(1);
                        tracker.settled.notify_one();
                    }
                } else {
                    tracker.failed.fetch_add(1, Ordering::Relaxed);
                    tracker.settled.notify_one();
                }
            }
        }
        // Acknowledged so the partition hands out its next event; a refusal only means the
        // partition moved, which cannot happen to the group's only member.
        let _ = delivery.ack().await;
    }
}

/// Waits until every effect settled (true), or nothing settled for [`STALL`] (false).
pub(super) async fn wait_settled(tracker: &Tracker, effects: usize) -> bool {
    let mut last = tracker.settled();
    let mut quiet_since = Instant::now();
    while tracker.settled() < effects {
        let _ = tokio::time::timeout(Duration::from_millis(200), tracker.settled.notified()).await;
        let now = tracker.settled();
        if now != last {
            last = now;
            quiet_since = Instant::now();
        } else if quiet_since.elapsed() >= STALL {
            return false;
        }
    }
    true
}

/// Sends the workload as `submission` says; returns when every submission was answered.
pub(super) async fn submit(
    client: &reqwest::Client,
    url: &str,
    submission: &Submission,
    args: &BenchArgs,
    pass: &str,
    workload: &Arc<Workload>,
    tracker: &Arc<Tracker>,
) -> Result<(), BenchError> {
    let effects = workload.bodies.len();
    let mut tasks: JoinSet<Result<(), BenchError>> = JoinSet::new();
    match submission {
        Submission::Single => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..args.clients().min(effects) {
                let (client, url, pass) = (client.clone(), url.to_owned(), pass.to_owned());
                let (workload, tracker, next) =
                    (Arc::clone(workload), Arc::clone(tracker), Arc::clone(&next));
                tasks.spawn(async move {
                    loop {
                        let effect = next.fetch_add(1, Ordering::Relaxed);
                        if effect >= workload.bodies.len() {
                            return Ok(());
                        }
                        tracker.mark_sent(effect, Instant::now());
                        post_one(&client, &url, &pass, &workload.bodies[effect], &tracker).await?;
                    }
                });
            }
        }
        Submission::Batch => {
            let batches: Arc<Vec<std::ops::Range<usize>>> = Arc::new(
                (0..effects)
                    .step_by(args.batch)
                    .map(|start| start..(start + args.batch).min(effects))
                    .collect(),
            );
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..args.clients().min(batches.len()) {
                let (client, url, pass) = (client.clone(), url.to_owned(), pass.to_owned());
                let (workload, tracker, next, batches) = (
                    Arc::clone(workload),
                    Arc::clone(tracker),
                    Arc::clone(&next),
                    Arc::clone(&batches),
                );
                tasks.spawn(async move {
                    loop {
                        let Some(range) = batches.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return Ok(());
                        };
                        let now = Instant::now();
                        for effect in range.clone() {
                            tracker.mark_sent(effect, now);
                        }
                        post_batch(&client, &url, &pass, &workload, range.clone(), &tracker)
                            .await?;
                    }
                });
            }
        }
        Submission::Paced { rate, .. } => {
            // A batch per tick; at low rates one effect every 1/rate seconds.
            let rate = rate.max(1.0);
            let tick = PACE_TICK.max(Duration::from_secs_f64(1.0 / rate));
            let per_tick = rate * tick.as_secs_f64();
            let start = tokio::time::Instant::now();
            let (mut sent, mut owed, mut ticks) = (0_usize, 0.0_f64, 0_u32);
            while sent < effects {
                let due = start + tick * ticks;
                tokio::time::sleep_until(due).await;
                ticks += 1;
                owed += per_tick;
                let count = (owed.floor() as usize).min(effects - sent);
                if count == 0 {
                    continue;
                }
                owed -= count as f64;
                let range = sent..sent + count;
                sent += count;
                // Stamped with when it was due, not when the task got to send it.
                let due = due.into_std();
                for effect in range.clone() {
                    tracker.mark_sent(effect, due);
                }
                let (client, url, pass) = (client.clone(), url.to_owned(), pass.to_owned());
                let (workload, tracker) = (Arc::clone(workload), Arc::clone(tracker));
                tasks.spawn(async move {
                    post_batch(&client, &url, &pass, &workload, range, &tracker).await
                });
                while let Some(done) = tasks.try_join_next() {
                    flatten(done)?;
                }
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        flatten(done)?;
    }
    Ok(())
}

pub(super) fn flatten(
    done: Result<Result<(), BenchError>, tokio::task::JoinError>,
) -> Result<(), BenchError> {
    match done {
        Ok(result) => result,
        // A submitting task panicked: that is a bug in the bench, not a measurement.
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

pub(super) async fn post_one(
    client: &reqwest::Client,
    url: &str,
    pass: &str,
    body: &RawValue,
    tracker: &Tracker,
) -> Result<(), BenchError> {
    let response = client
        .post(format!("{url}/v1/effects"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(PREFER, RETURN_MINIMAL)
        .body(body.get().to_owned())
        .send()
        .await
        .map_err(|source| BenchError::Http {
            pass: pass.to_owned(),
            what: "POST /v1/effects",
            source,
        })?;
    let status = response.status();
    if status != StatusCode::CREATED {
        let text = response.text().await.unwrap_or_default();
        tracker.refuse(1, format!("{status} {text}"));
    }
    Ok(())
}

pub(super) async fn post_batch(
    client: &reqwest::Client,
    url: &str,
    pass: &str,
    workload: &Workload,
    range: std::ops::Range<usize>,
    tracker: &Tracker,
) -> Result<(), BenchError> {
    let http = |source| BenchError::Http {
        pass: pass.to_owned(),
        what: "POST /v1/effects/batch",
        source,
    };
    let mut pending: Vec<usize> = range.collect();
    // Effects answered 503 are submitted again after the server's Retry-After, for up to
    // this many rounds (the pipeline's admission refuses work it cannot start in time).
    for round in 0..ADMISSION_ROUNDS {
        let count = pending.len();
        let response = client
            .post(format!("{url}/v1/effects/batch"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(PREFER, RETURN_MINIMAL)
            .body(workload.batch_body_of(pending.iter().copied()))
            .send()
            .await
            .map_err(http)?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(1);
        let last = round + 1 == ADMISSION_ROUNDS;
        if status == StatusCode::SERVICE_UNAVAILABLE && !last {
            tracker.deferred.fetch_add(count, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(retry_after.clamp(1, 30))).await;
            continue;
        }
        if status != StatusCode::OK {
            let text = response.text().await.unwrap_or_default();
            tracker.refuse(count, format!("{status} {text}"));
            return Ok(());
        }
        let answer: BatchStatuses = response.json().await.map_err(http)?;
        let results = answer.results;
        let mut again = Vec::new();
        let mut wait_s = 1;
        for (result, index) in results.iter().zip(&pending) {
            if result.status == 503 && !last {
                again.push(*index);
                wait_s = wait_s.max(retry_after_of(result));
            } else if result.status != 201 {
                let error = result.error.as_ref().map_or("no error given", |e| e.get());
                tracker.refuse(1, format!("{} {error}", result.status));
            }
        }
        if results.len() != count {
            tracker.refuse(
                count.saturating_sub(results.len()),
                format!("{} results for {count} effects", results.len()),
            );
        }
        if again.is_empty() {
            return Ok(());
        }
        tracker.deferred.fetch_add(again.len(), Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(wait_s.clamp(1, 30))).await;
        pending = again;
    }
    Ok(())
}

/// Rounds of 503 answers a batch's effects are submitted again after.
const ADMISSION_ROUNDS: usize = 60;

/// The `retry_after_s` an effect's 503 error names (`details`), else 1.
fn retry_after_of(result: &EffectStatus) -> u64 {
    result
        .error
        .as_ref()
        .and_then(|e| serde_json::from_str::<Value>(e.get()).ok())
        .and_then(|e| e["details"]["retry_after_s"].as_u64())
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_subjects_match_the_command_keys() {
        let workload = Workload::new("single", BenchTool::Email, 10, 4);
        assert_eq!(workload.bodies.len(), 10);
        assert_eq!(workload.index.len(), 10);
        let body: Value = serde_json::from_str(workload.bodies[5].get()).expect("JSON");
        let subject = format!(
            "{}/d-{}/email/send/0",
            body["run_id"].as_str().expect("run id"),
            body["decision"]
        );
        assert_eq!(workload.index.get(&subject), Some(&5));
        let batch: Value = serde_json::from_str(&workload.batch_body(4..7)).expect("JSON");
        let effects = batch["effects"].as_array().expect("an array");
        assert_eq!(effects.len(), 3);
        assert_eq!(effects[1], body);
    }

    #[test]
    fn a_batch_answer_is_read_for_its_statuses() {
        let answer = r#"{"results":[{"status":201,"command":{"run_id":"r","args":{"a":[1,2]}}},
            {"status":422,"error":{"code":"invalid_arguments","message":"no"}}]}"#;
        let read: BatchStatuses = serde_json::from_str(answer).expect("parses");
        let statuses: Vec<u16> = read.results.iter().map(|r| r.status).collect();
        assert_eq!(statuses, vec![201, 422]);
        assert!(read.results[0].error.is_none());
        assert_eq!(
            read.results[1].error.as_ref().map(|e| e.get()),
            Some(r#"{"code":"invalid_arguments","message":"no"}"#)
        );
    }
}
