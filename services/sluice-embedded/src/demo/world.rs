//! The demo's agents and its checks: the runs it plans and plays through the HTTP API, and
//! what it reads back from the ledger, the bank and the upstream to find a broken guarantee.

use super::*;

/// The kinds of effect the demo agents ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Wire,
    Email,
    Ticket,
    Search,
}

impl Kind {
    fn tool(self) -> &'static str {
        match self {
            Self::Wire => "payments/wire",
            Self::Email => "email/send",
            Self::Ticket => "tickets/create",
            Self::Search => "search/lookup",
        }
    }
}

/// One effect an agent will submit.
#[derive(Debug, Clone)]
pub(super) struct Planned {
    pub(super) run: usize,
    pub(super) decision: u32,
    pub(super) kind: Kind,
    pub(super) args: Value,
}

impl Planned {
    fn request(&self, run_id: &str, call_idx: u32, args: &Value) -> Value {
        json!({
            "run_id": run_id,
            "decision": self.decision,
            "tool": self.kind.tool(),
            "call_idx": call_idx,
            "args": args,
        })
    }
}

/// The effects of every run, drawn from `seed`. Business keys are distinct: the amount is
/// unique per effect, and `nonce` keeps them apart from an earlier demo in the same ledger.
pub(super) fn plan(args: &DemoArgs, nonce: &str) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut planned = Vec::new();
    for run in 0..args.runs as usize {
        for decision in 0..args.effects {
            let serial = planned.len() as i64;
            let draw: f64 = rng.random();
            let (kind, args) = if draw < 0.4 {
                // One wire in eight is above the approval threshold: it waits for a person.
                let large = rng.random_range(0..8) == 0;
                let base = if large {
                    APPROVAL_THRESHOLD_MINOR + 1
                } else {
                    1_000
                };
                (
                    Kind::Wire,
                    json!({
                        "account": format!("acc-{nonce}-{}", run % 10),
                        "amount_minor": base + serial * 137,
                        "beneficiary": format!("beneficiary-{}", rng.random_range(1..50)),
                        "date": "2026-11-22",
                        "reference": format!("invoice {run}-{decision}"),
                    }),
                )
            } else if draw < 0.65 {
                (
                    Kind::Email,
                    json!({
                        "to": format!("customer{}@example.com", rng.random_range(1..500)),
                        "subject": format!("Your order, run {run}"),
                        "body": format!("Step {decision} of run {run} is done."),
                    }),
                )
            } else if draw < 0.85 {
                let priority = ["low", "normal", "high"][rng.random_range(0..3)];
                (
                    Kind::Ticket,
                    json!({
                        "title": format!("Follow up on run {run}, step {decision}"),
                        "priority": priority,
                    }),
                )
            } else {
                (
                    Kind::Search,
                    json!({
                        "query": format!("refund policy {}", rng.random_range(1..20)),
                        "limit": 3,
                    }),
                )
            };
            planned.push(Planned {
                run,
                decision,
                kind,
                args,
            });
        }
    }
    planned
}

/// A command the API accepted.
#[derive(Debug, Clone)]
pub(super) struct Accepted {
    pub(super) run: usize,
    pub(super) command_key: String,
}

/// A status code and a JSON body.
pub(super) type Answer = (StatusCode, Value);

/// The producer's HTTP API, as an agent uses it.
#[derive(Debug, Clone)]
pub(super) struct Api {
    pub(super) client: reqwest::Client,
    pub(super) base: String,
}

impl Api {
    async fn submit(&self, body: &Value) -> Result<Answer, DemoError> {
        let what = || format!("POST /v1/effects ({})", body["tool"]);
        let response = self
            .client
            .post(format!("{}/v1/effects", self.base))
            .json(body)
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: what(),
                source,
            })?;
        let status = response.status();
        let body = response.json().await.map_err(|source| DemoError::Http {
            what: what(),
            source,
        })?;
        Ok((status, body))
    }

    /// Long-polls a command for at most `wait`.
    async fn wait_for(
        &self,
        run_id: &str,
        command_key: &str,
        wait: Duration,
    ) -> Result<Command, DemoError> {
        let path = format!("/v1/runs/{run_id}/effects/{command_key}");
        let response = self
            .client
            .get(format!("{}{path}?wait={}ms", self.base, wait.as_millis()))
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: format!("GET {path}"),
                source,
            })?;
        expect_json(response, StatusCode::OK, &format!("GET {path}")).await
    }

    async fn list(&self, run_id: &str) -> Result<Vec<Command>, DemoError> {
        let path = format!("/v1/runs/{run_id}/effects");
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: format!("GET {path}"),
                source,
            })?;
        let mut body: Value = expect_json(response, StatusCode::OK, &format!("GET {path}")).await?;
        serde_json::from_value(body["effects"].take()).map_err(|e| DemoError::Unexpected {
            what: format!("GET {path}"),
            status: StatusCode::OK,
            body: format!("not a list of commands: {e}"),
        })
    }

    async fn rollback(&self, run_id: &str) -> Result<(), DemoError> {
        let path = format!("/v1/runs/{run_id}/rollback");
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(&json!({ "reason": ROLLBACK_REASON, "actor": "sluice-demo" }))
            .send()
            .await
            .map_err(|source| DemoError::Http {
                what: format!("POST {path}"),
                source,
            })?;
        let _: Value = expect_json(response, StatusCode::ACCEPTED, &format!("POST {path}")).await?;
        Ok(())
    }
}

pub(super) async fn expect_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    expected: StatusCode,
    what: &str,
) -> Result<T, DemoError> {
    let status = response.status();
    let text = response.text().await.map_err(|source| DemoError::Http {
        what: what.to_owned(),
        source,
    })?;
    if status != expected {
        return Err(DemoError::Unexpected {
            what: what.to_owned(),
            status,
            body: text,
        });
    }
    serde_json::from_str(&text).map_err(|e| DemoError::Unexpected {
        what: what.to_owned(),
        status,
        body: format!("unreadable answer ({e}): {text}"),
    })
}

/// Drives the agents against a running pipeline and builds the report.
pub(super) async fn play(
    args: &DemoArgs,
    setup: &Setup,
    pipeline: &Pipeline,
    upstream: &Upstream,
    progress: &Progress,
) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.deadline_secs);
    let api = Api {
        client: http_client(None),
        base: setup.producer_url.clone(),
    };
    let nonce = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let run_ids: Vec<String> = (0..args.runs)
        .map(|run| format!("demo-{nonce}-r{run:03}"))
        .collect();
    let planned = plan(args, &nonce);
    let mut violations = Vec::new();

    let accepted = submit_all(&api, &planned, &run_ids, progress, &mut violations).await?;
    let idempotency = show_idempotency(&api, &planned, &run_ids, &mut violations).await?;
    let mut by_run: Vec<Vec<String>> = vec![Vec::new(); run_ids.len()];
    for command in &accepted {
        by_run[command.run].push(command.command_key.clone());
    }
    let rolled_back_runs = settle_all(
        &api,
        args,
        &run_ids,
        &by_run,
        deadline,
        progress,
        &mut violations,
    )
    .await?;
    let found = inspect_ledger(pipeline, &run_ids, &by_run, &mut violations).await?;
    let upstream_report = inspect_upstream(&api.client, upstream).await?;
    check_the_bank(upstream, &upstream_report, &found.wires, &mut violations);

    Ok(DemoReport {
        setup: setup.clone(),
        runs: args.runs,
        effects_per_run: args.effects,
        rollback_every: args.rollback_every,
        fault_rate: args.fault_rate,
        skipped_faults: args.skip_faults.clone(),
        seed: args.seed,
        elapsed_secs: started.elapsed().as_secs_f64(),
        submitted: accepted.len() as u64,
        rolled_back_runs,
        statuses: found.statuses,
        reconciled: found.reconciled,
        upstream: upstream_report,
        idempotency,
        audit: found.audit,
        violations,
    })
}

/// Submits every planned effect through the API; returns those accepted (201).
pub(super) async fn submit_all(
    api: &Api,
    planned: &[Planned],
    run_ids: &[String],
    progress: &Progress,
    violations: &mut Vec<String>,
) -> Result<Vec<Accepted>, DemoError> {
    let bar = progress.bar(planned.len() as u64, "submitting");
    let answers: Vec<(usize, Result<Answer, DemoError>)> =
        futures::stream::iter(planned.iter().enumerate())
            .map(|(index, effect)| {
                let (api, bar) = (api.clone(), bar.clone());
                let body = effect.request(&run_ids[effect.run], 0, &effect.args);
                async move {
                    let answer = api.submit(&body).await;
                    bar.inc(1);
                    (index, answer)
                }
            })
            .buffer_unordered(SUBMIT_CONCURRENCY)
            .collect()
            .await;
    bar.finish();
    let mut accepted: Vec<Option<Accepted>> = vec![None; planned.len()];
    for (index, answer) in answers {
        let effect = &planned[index];
        let (status, body) = answer?;
        if status == StatusCode::CREATED {
            accepted[index] = Some(Accepted {
                run: effect.run,
                command_key: body["command_key"].as_str().unwrap_or_default().to_owned(),
            });
        } else {
            violations.push(format!(
                "{} {} of run {} was not accepted: {status} {body}",
                effect.kind.tool(),
                effect.decision,
                run_ids[effect.run]
            ));
        }
    }
    Ok(accepted.into_iter().flatten().collect())
}

/// Waits for every run to settle, rolling back every K-th one; returns how many were rolled
/// back.
pub(super) async fn settle_all(
    api: &Api,
    args: &DemoArgs,
    run_ids: &[String],
    by_run: &[Vec<String>],
    deadline: tokio::time::Instant,
    progress: &Progress,
    violations: &mut Vec<String>,
) -> Result<u64, DemoError> {
    let commands = by_run.iter().map(Vec::len).sum::<usize>();
    let settling = progress.bar(commands as u64, "settling");
    let rollbacks = (0..run_ids.len())
        .filter(|run| args.is_rolled_back(*run))
        .count();
    let rolling = progress.bar(rollbacks as u64, "rolling back");
    let outcomes: Vec<Result<RunOutcome, DemoError>> =
        futures::stream::iter(by_run.iter().enumerate())
            .map(|(run, keys)| {
                let (api, settling, rolling) = (api.clone(), settling.clone(), rolling.clone());
                let run_id = run_ids[run].clone();
                let roll_back = args.is_rolled_back(run);
                async move {
                    let outcome =
                        settle_run(&api, &run_id, keys, roll_back, deadline, &settling).await?;
                    if roll_back {
                        rolling.inc(1);
                    }
                    Ok(outcome)
                }
            })
            .buffer_unordered(SETTLE_CONCURRENCY)
            .collect()
            .await;
    settling.finish();
    rolling.finish();
    let mut rolled_back = 0;
    for outcome in outcomes {
        let outcome = outcome?;
        if outcome.rolled_back {
            rolled_back += 1;
        }
        violations.extend(outcome.problems);
    }
    Ok(rolled_back)
}

/// What the ledger holds at the end.
#[derive(Debug, Default)]
pub(super) struct LedgerFindings {
    pub(super) statuses: StatusCounts,
    pub(super) reconciled: Reconciled,
    pub(super) audit: AuditReport,
    /// Per business key, the command that holds it.
    pub(super) wires: HashMap<String, WireCommand>,
}

/// Reads every submitted command and every run's audit chain from the ledger (the source of
/// truth): final statuses, lost commands, status check evidence, chain verification.
pub(super) async fn inspect_ledger(
    pipeline: &Pipeline,
    run_ids: &[String],
    by_run: &[Vec<String>],
    violations: &mut Vec<String>,
) -> Result<LedgerFindings, DemoError> {
    let ledger = &pipeline.ctx.ledger;
    let mut found = LedgerFindings::default();
    for (run, keys) in by_run.iter().enumerate() {
        let run_id = RunId::parse(&run_ids[run]).map_err(|e| DemoError::Unexpected {
            what: "a demo run id".into(),
            status: StatusCode::OK,
            body: e.to_string(),
        })?;
        let stored: HashMap<String, Command> = ledger
            .list_run(&run_id, None)
            .await?
            .into_iter()
            .map(|command| (command.command_key.to_string(), command))
            .collect();
        let trail = ledger.audit_read(&run_id).await?;
        found.audit.runs += 1;
        found.audit.records += trail.entries.len() as u64;
        match audit::verify(&run_id, trail.checkpoint.as_ref(), &trail.entries) {
            Ok(_) => found.audit.verified += 1,
            Err(broken) => violations.push(broken.to_string()),
        }
        // Each command counts once per kind of answer, however often it was checked.
        let mut observed: HashSet<(String, Evidence)> = HashSet::new();
        for entry in &trail.entries {
            if let (Some(kind), Some(key)) = (
                Evidence::of_reason(&entry.record.reason),
                &entry.record.command_key,
            ) {
                observed.insert((key.to_string(), kind));
            }
        }
        for (_, kind) in &observed {
            let counter = match kind {
                Evidence::Present => &mut found.reconciled.present,
                Evidence::Absent => &mut found.reconciled.absent,
                Evidence::Duplicate => &mut found.reconciled.duplicate,
                Evidence::Inconclusive => &mut found.reconciled.inconclusive,
                Evidence::VerifiedOnce => &mut found.reconciled.verified_once,
            };
            *counter += 1;
        }
        for key in keys {
            let Some(command) = stored.get(key) else {
                violations.push(format!("lost: {run_id}/{key} is not in the ledger"));
                continue;
            };
            count_status(&mut found.statuses, command);
            if !command.status().is_settled() {
                violations.push(format!(
                    "lost: {run_id}/{key} is still {} after the deadline",
                    command.status()
                ));
            } else if let Some(due) = command.state.due_at.filter(|_| !command.state.at_rest()) {
                violations.push(format!(
                    "unfinished: {run_id}/{key} is {} but still owed work (due {due}) after the deadline",
                    command.status()
                ));
            }
            if let Some(business_key) = &command.business_key {
                found.wires.insert(
                    business_key.as_str().to_owned(),
                    WireCommand {
                        subject: format!("{run_id}/{key}"),
                        status: command.status(),
                        attempts: command.state.attempts,
                        checked: observed.iter().any(|(observed, _)| observed == key),
                    },
                );
            }
        }
    }
    Ok(found)
}

/// The bank's books against the ledger: no business key with two standing wires, and nothing
/// standing for a wire the ledger says was compensated.
pub(super) fn check_the_bank(
    upstream: &Upstream,
    report: &UpstreamReport,
    wires: &HashMap<String, WireCommand>,
    violations: &mut Vec<String>,
) {
    for (key, standing) in &report.double_commits {
        let holder = wires.get(key).map_or_else(
            || "no command of this demo holds the key".to_owned(),
            WireCommand::describe,
        );
        violations.push(format!(
            "double commit: business key {key} has {standing} standing wires ({holder})"
        ));
    }
    let stats = upstream.stats();
    for (key, wire) in wires {
        let standing = stats.standing_wires(key);
        if wire.status == CommandStatus::Compensated && standing != 0 {
            violations.push(format!(
                "a compensated wire still stands: business key {key} has {standing} standing wire(s) after the rollback ({})",
                wire.describe()
            ));
        }
    }
}

/// What a status check told the reconciler about a command, as its audit chain records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Evidence {
    Present,
    Absent,
    Duplicate,
    Inconclusive,
    /// A 2xx commit looked up again and found once.
    VerifiedOnce,
}

impl Evidence {
    /// The evidence an audit reason records: the reasons `machine::observed` and
    /// `machine::verified` write.
    pub(super) fn of_reason(reason: &str) -> Option<Self> {
        if reason.starts_with("status check: present") {
            Some(Self::Present)
        } else if reason.starts_with("status check: absent") {
            Some(Self::Absent)
        } else if reason.starts_with("status check: duplicate")
            || reason.starts_with("verified: duplicate")
        {
            Some(Self::Duplicate)
        } else if reason.starts_with("status check inconclusive") {
            Some(Self::Inconclusive)
        } else if reason.starts_with("verified: the commit is there once") {
            Some(Self::VerifiedOnce)
        } else {
            None
        }
    }
}

pub(super) fn count_status(counts: &mut StatusCounts, command: &Command) {
    let counter = match command.status() {
        CommandStatus::Confirmed => &mut counts.confirmed,
        CommandStatus::Failed => &mut counts.failed,
        CommandStatus::Blocked => &mut counts.blocked,
        CommandStatus::Cancelled => &mut counts.cancelled,
        CommandStatus::Stuck => &mut counts.stuck,
        CommandStatus::Compensated => &mut counts.compensated,
        CommandStatus::NoCompensation => &mut counts.no_compensation,
        CommandStatus::CompensationFailed => &mut counts.compensation_failed,
        CommandStatus::Scheduled
        | CommandStatus::Pending
        | CommandStatus::Approved
        | CommandStatus::Leased
        | CommandStatus::Unknown
        | CommandStatus::Compensating => &mut counts.unsettled,
    };
    *counter += 1;
    if command.state.escalated {
        counts.escalated += 1;
    }
}

/// The command behind a business key.
#[derive(Debug)]
pub(super) struct WireCommand {
    pub(super) subject: String,
    pub(super) status: CommandStatus,
    pub(super) attempts: u32,
    /// Its audit chain records a status check.
    pub(super) checked: bool,
}

impl WireCommand {
    fn describe(&self) -> String {
        format!(
            "command {} is {} after {} attempt(s), {}",
            self.subject,
            self.status,
            self.attempts,
            if self.checked {
                "with a status check in its audit chain"
            } else {
                "never status-checked: the bank answered its dispatch 2xx"
            }
        )
    }
}

/// What happened to one run.
#[derive(Debug, Default)]
pub(super) struct RunOutcome {
    pub(super) rolled_back: bool,
    pub(super) problems: Vec<String>,
}

/// Settled (terminal, STUCK or BLOCKED) and owed nothing more by the pipeline: no
/// verification or duplicate clean-up is still to come.
pub(super) fn at_rest(command: &Command) -> bool {
    command.state.at_rest()
}

/// Waits until every command of the run is at rest (or the deadline passed); then, for a run
/// to roll back, asks for the rollback and waits until its confirmed effects were compensated.
pub(super) async fn settle_run(
    api: &Api,
    run_id: &str,
    keys: &[String],
    roll_back: bool,
    deadline: tokio::time::Instant,
    bar: &ProgressBar,
) -> Result<RunOutcome, DemoError> {
    let mut outcome = RunOutcome::default();
    let waits = keys.iter().map(|key| async move {
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let command = api.wait_for(run_id, key, left.min(MAX_LONG_POLL)).await?;
            if at_rest(&command) {
                bar.inc(1);
                return Ok::<bool, DemoError>(true);
            }
            if left.is_zero() {
                return Ok(false);
            }
            if command.status().is_settled() {
                // Settled but still owed work: the long poll would answer at once.
                tokio::time::sleep(ROLLBACK_POLL.min(left)).await;
            }
        }
    });
    let settled = futures::future::try_join_all(waits).await?;
    if settled.iter().any(|settled| !settled) || !roll_back || keys.is_empty() {
        // An unsettled command is reported from the ledger afterwards.
        return Ok(outcome);
    }
    api.rollback(run_id).await?;
    outcome.rolled_back = true;
    loop {
        let open: Vec<String> = api
            .list(run_id)
            .await?
            .into_iter()
            .filter(|command| {
                let undone = command.semantics == EffectSemantics::ObserveOnly
                    || !matches!(
                        command.status(),
                        CommandStatus::Confirmed | CommandStatus::Compensating
                    );
                !(undone && at_rest(command))
            })
            .map(|command| format!("{}/{} ({})", run_id, command.command_key, command.status()))
            .collect();
        if open.is_empty() {
            return Ok(outcome);
        }
        if tokio::time::Instant::now() >= deadline {
            outcome.problems.push(format!(
                "rollback of {run_id} unfinished at the deadline: {}",
                open.join(", ")
            ));
            return Ok(outcome);
        }
        tokio::time::sleep(ROLLBACK_POLL).await;
    }
}

/// Re-submits a few effects unchanged (expect 200 and the stored command), one with other
/// arguments (expect 409), and one wire under a new call index with the same business key
/// (expect 200 and the existing command). A different answer is a broken contract.
pub(super) async fn show_idempotency(
    api: &Api,
    planned: &[Planned],
    run_ids: &[String],
    violations: &mut Vec<String>,
) -> Result<IdempotencyReport, DemoError> {
    let mut report = IdempotencyReport::default();
    // One of each kind first, so the replays cover several tools.
    let mut picks: Vec<&Planned> = Vec::new();
    for kind in [Kind::Wire, Kind::Email, Kind::Ticket, Kind::Search] {
        if let Some(effect) = planned.iter().find(|effect| effect.kind == kind) {
            picks.push(effect);
        }
    }
    for effect in picks.into_iter().take(REPLAYS) {
        let run_id = &run_ids[effect.run];
        let (status, body) = api.submit(&effect.request(run_id, 0, &effect.args)).await?;
        report.replays += 1;
        let key = format!("d-{}/{}/0", effect.decision, effect.kind.tool());
        if status == StatusCode::OK && body["command_key"] == key.as_str() {
            report.replays_answered_stored += 1;
        } else {
            violations.push(format!(
                "idempotency: re-submitting {run_id}/{key} unchanged answered {status} {body}; expected 200 and the stored command"
            ));
        }
    }
    if let Some(effect) = planned.iter().find(|effect| effect.kind == Kind::Email) {
        let run_id = &run_ids[effect.run];
        let mut changed = effect.args.clone();
        changed["subject"] = json!("A different subject under the same key");
        let (status, body) = api.submit(&effect.request(run_id, 0, &changed)).await?;
        let refused = status == StatusCode::CONFLICT;
        report.drift_refused = Some(refused);
        if !refused {
            violations.push(format!(
                "idempotency: the same key with other arguments answered {status} {body}; expected 409"
            ));
        }
    }
    if let Some(effect) = planned.iter().find(|effect| effect.kind == Kind::Wire) {
        let run_id = &run_ids[effect.run];
        let (status, body) = api.submit(&effect.request(run_id, 1, &effect.args)).await?;
        let key = format!("d-{}/{}/0", effect.decision, effect.kind.tool());
        let existing = status == StatusCode::OK && body["command_key"] == key.as_str();
        report.business_key_answered_existing = Some(existing);
        if !existing {
            violations.push(format!(
                "idempotency: the same wire under a new call index answered {status} {body}; expected 200 and {run_id}/{key}"
            ));
        }
    }
    Ok(report)
}

/// Reads the upstream's counters, and every wire it booked to find the business keys that
/// were committed more than once.
pub(super) async fn inspect_upstream(
    client: &reqwest::Client,
    upstream: &Upstream,
) -> Result<UpstreamReport, DemoError> {
    let stats = upstream.stats();
    let base = upstream.base_url();
    let wires: Vec<Result<Value, DemoError>> = futures::stream::iter(1..=stats.wires)
        .map(|n| {
            let (client, base) = (client.clone(), base.clone());
            async move {
                let what = format!("GET /bank/wires/w-{n}");
                let response = client
                    .get(format!("{base}/bank/wires/w-{n}"))
                    .send()
                    .await
                    .map_err(|source| DemoError::Http {
                        what: what.clone(),
                        source,
                    })?;
                expect_json(response, StatusCode::OK, &what).await
            }
        })
        .buffer_unordered(SUBMIT_CONCURRENCY)
        .collect()
        .await;
    let mut booked_by_key: HashMap<String, u64> = HashMap::new();
    for wire in wires {
        let wire = wire?;
        let key = wire["business_key"].as_str().unwrap_or_default().to_owned();
        *booked_by_key.entry(key).or_default() += 1;
    }
    let twice: Vec<&String> = booked_by_key
        .iter()
        .filter(|(_, booked)| **booked > 1)
        .map(|(key, _)| key)
        .collect();
    let compensated = twice
        .iter()
        .filter(|key| stats.standing_wires(key) <= 1)
        .count();
    Ok(UpstreamReport {
        faults: stats.faults,
        wires_committed: stats.wires,
        wires_reversed: stats.wires_reversed,
        keys_committed_twice: twice.len() as u64,
        keys_committed_twice_compensated: compensated as u64,
        double_commits: stats
            .double_commits()
            .into_iter()
            .map(|(key, standing)| (key.to_owned(), standing))
            .collect(),
        status_checks: stats.status_checks,
        emails: stats.emails,
        email_replays: stats.email_replays,
        tickets: stats.tickets,
        tickets_closed: stats.tickets_closed,
        searches: stats.searches,
    })
}
