//! The operator console: `sluice runs`, `effects`, `show`, `approve`, `approval-link`, `reject`, `cancel`,
//! `replay`, `resolve`, `rollback`, `audit`, `purge` — the producer's HTTP API for people.
//!
//! Output is a readable table, or with `--json` the server's answer as it came, for scripts.
//! The exit code says what happened (see [`Exit`]); the token comes from `--token` or
//! `SLUICE_TOKEN` and is never printed.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{ContentArrangement, Table, presets};
use futures::future::BoxFuture;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
// A run id or command key in a path (command keys hold `/`).
use sluice_core::catalog::path_segment as segment;
use sluice_core::time::{Clock, SystemClock, Timestamp};

mod edit;
mod render;

use render::{render, text};

/// What the console's exit code means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Done.
    Ok = 0,
    /// The server could not be reached, or answered something unexpected.
    Failed = 1,
    /// The request was invalid (bad flags or input the server refused as malformed).
    Usage = 2,
    /// No such run or command.
    NotFound = 3,
    /// The action does not apply to the command as it is (the answer says why).
    Refused = 4,
    /// The token is missing, unknown, or its role may not do this.
    Denied = 5,
    /// An audit chain does not verify.
    Tampered = 6,
    /// The server is up but its ledger is not.
    Unavailable = 7,
}

/// Where the API is and who is calling.
#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    /// The producer's base URL.
    #[arg(
        long,
        global = true,
        env = "SLUICE_URL",
        default_value = "http://127.0.0.1:8700"
    )]
    pub url: String,
    /// The bearer token (`sluice dev` prints one).
    #[arg(long, global = true, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the server's JSON answer instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum OutcomeArg {
    Confirmed,
    Failed,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Print a run's audit chain.
    Show { run: String },
    /// Recompute a run's chain; exit 6 and name the first broken link if it does not verify.
    Verify { run: String },
}

#[derive(Debug, Clone, Subcommand)]
pub enum FlowCommand {
    /// Every upstream and tool: its rate, cap and breaker, paused or not, breaker state.
    List,
    /// Pause a tool (`namespace/name`) or an upstream: its calls wait, spending no attempt,
    /// until it is resumed.
    Pause {
        name: String,
        #[arg(long)]
        reason: String,
    },
    /// Resume a paused tool or upstream: its waiting calls go again, at its rate.
    Resume {
        name: String,
        #[arg(long)]
        reason: String,
    },
}

/// The console's subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum ConsoleCommand {
    /// Who the token is, as the server sees it.
    Whoami,
    /// Recent runs, newest first.
    Runs {
        /// Only runs created within this long (`30m`, `24h`, `7d`) or since an RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Effects of one run, or across recent runs, filtered by status and tool.
    Effects {
        /// A run id; without it, effects across the runs created since `--since`.
        run: Option<String>,
        #[arg(long)]
        status: Option<String>,
        /// A tool, `namespace/name` or a bare name in the default namespace.
        #[arg(long)]
        tool: Option<String>,
        #[arg(long)]
        since: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// A run's scheduled effects, earliest first.
    Scheduled {
        run: String,
        #[arg(long)]
        tool: Option<String>,
    },
    /// One command in full.
    Show { run: String, command_key: String },
    /// Approve a BLOCKED command: it is dispatched under the current policy version. With
    /// `--args` or `--set`, approve it with edited arguments (a revision of the same command).
    Approve {
        run: String,
        command_key: String,
        #[arg(long)]
        reason: String,
        /// The edited arguments, whole: JSON text, or a file holding it.
        #[arg(long, value_name = "FILE|JSON")]
        args: Option<String>,
        /// Change one field of the current arguments (or of `--args`): the value is JSON when
        /// it parses, else text. Repeatable.
        #[arg(long = "set", value_name = "/POINTER=VALUE")]
        set: Vec<String>,
    },
    /// A signed, single-use approval link for a BLOCKED command: a URL a person opens without
    /// a token (from Slack, an email, a ticket) to see the command and approve or reject it.
    /// Prints the URL; treat it as a secret until it is used or expires.
    #[command(name = "approval-link")]
    ApprovalLink {
        run: String,
        command_key: String,
        /// How long the link lives, in seconds: 60 to 604800 (7 days); 86400 by default.
        #[arg(long, value_name = "SECONDS")]
        expires_in: Option<u64>,
        /// Whom the link is for (recorded in the audit chain with the decision).
        #[arg(long = "for", value_name = "WHO")]
        recipient: Option<String>,
    },
    /// Reject a BLOCKED command: it is cancelled.
    Reject {
        run: String,
        command_key: String,
        #[arg(long)]
        reason: String,
    },
    /// Cancel a command that has not started (SCHEDULED, PENDING, BLOCKED, APPROVED).
    Cancel {
        run: String,
        command_key: String,
        #[arg(long)]
        reason: String,
    },
    /// Replay a FAILED or STUCK command; `--dry-run` reports what would happen.
    Replay {
        run: String,
        command_key: String,
        #[arg(long)]
        reason: String,
        #[arg(long)]
        dry_run: bool,
        /// Evidence that an unknown earlier outcome did not commit (JSON, or plain text).
        #[arg(long)]
        evidence: Option<String>,
    },
    /// Settle a STUCK command by hand as CONFIRMED or FAILED, with evidence.
    Resolve {
        run: String,
        command_key: String,
        #[arg(long, value_enum)]
        outcome: OutcomeArg,
        /// The upstream reference (or a JSON record) that proves the outcome.
        #[arg(long)]
        evidence: String,
        #[arg(long)]
        reason: String,
    },
    /// Roll a run back (compensation in reverse order); without `--reason`, show its progress.
    Rollback {
        run: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Read or verify audit chains.
    #[command(subcommand)]
    Audit(AuditCommand),
    /// Flow control: list upstreams and tools, pause or resume one.
    #[command(subcommand)]
    Flow(FlowCommand),
    /// Spend budgets: each budget's counters (held, limit, left) in the current window, or the
    /// one holding --at (operator, admin).
    Budgets {
        /// Any time in the window to show (RFC 3339).
        #[arg(long)]
        at: Option<String>,
    },
    /// Remove finished runs untouched for a while, leaving their audit checkpoints, and list
    /// them; `--dry-run` lists what would be removed and kept, removing nothing.
    Purge {
        /// `30d`, `12h`, or an RFC 3339 cutoff.
        #[arg(long)]
        older_than: String,
        #[arg(long)]
        reason: String,
        #[arg(long)]
        max_runs: Option<usize>,
        /// Report what a purge would remove and keep, and why; remove and record nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// An HTTP answer.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Value,
}

/// The console's failure: what to print and which exit code.
#[derive(Debug)]
pub struct Failure {
    pub exit: Exit,
    pub message: String,
}

impl Failure {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

/// The exit code of an error answer.
fn exit_of(status: StatusCode) -> Exit {
    match status.as_u16() {
        400 | 413 | 422 => Exit::Usage,
        401 | 403 => Exit::Denied,
        404 => Exit::NotFound,
        409 => Exit::Refused,
        503 => Exit::Unavailable,
        _ => Exit::Failed,
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Answer, Failure> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| Failure::new(Exit::Failed, format!("cannot reach {}: {e}", self.base)))?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| Failure::new(Exit::Failed, format!("reading the answer failed: {e}")))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", segment(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

/// `30m`, `24h`, `7d`, `90s` ago, or an RFC 3339 time, as RFC 3339.
pub fn parse_since(raw: &str, now: Timestamp) -> Result<String, Failure> {
    let raw = raw.trim();
    if let Ok(at) = Timestamp::parse_rfc3339(raw) {
        return Ok(at.to_string());
    }
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let value: i64 = number.parse().map_err(|_| {
        Failure::new(
            Exit::Usage,
            format!("{raw:?} is not a duration (30m, 24h, 7d) or an RFC 3339 time"),
        )
    })?;
    let unit_ms: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(Failure::new(
                Exit::Usage,
                format!("{raw:?}: the unit is s, m, h or d"),
            ));
        }
    };
    let ago = value
        .checked_mul(unit_ms)
        .ok_or_else(|| Failure::new(Exit::Usage, format!("{raw:?} is too long")))?;
    Ok(now.plus_millis(-ago).to_string())
}

/// Runs one console command; returns what to print and the exit code.
pub fn run(
    args: ConsoleArgs,
    command: ConsoleCommand,
) -> BoxFuture<'static, Result<String, Failure>> {
    Box::pin(run_body(args, command))
}

async fn run_body(args: ConsoleArgs, command: ConsoleCommand) -> Result<String, Failure> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| Failure::new(Exit::Failed, format!("cannot build an HTTP client: {e}")))?;
    let client = Client {
        http,
        base: args.url.trim_end_matches('/').to_owned(),
        token: args.token.clone().filter(|t| !t.is_empty()),
    };
    let now = SystemClock.now();
    let since = |raw: &Option<String>| raw.as_deref().map(|r| parse_since(r, now)).transpose();
    let key_path =
        |run: &str, key: &str| format!("/v1/runs/{}/effects/{}", segment(run), segment(key));
    let (method, path, body) = match &command {
        ConsoleCommand::Whoami => (Method::GET, "/v1/whoami".to_owned(), None),
        ConsoleCommand::Runs { since: s, limit } => (
            Method::GET,
            format!(
                "/v1/runs{}",
                query(&[("since", since(s)?), ("limit", Some(limit.to_string()))])
            ),
            None,
        ),
        ConsoleCommand::Effects {
            run: Some(run),
            status,
            tool,
            since: s,
            limit: _,
        } => {
            if s.is_some() {
                return Err(Failure::new(
                    Exit::Usage,
                    "--since applies across runs; leave out the run",
                ));
            }
            (
                Method::GET,
                format!(
                    "/v1/runs/{}/effects{}",
                    segment(run),
                    query(&[("status", status.clone()), ("tool", tool.clone())])
                ),
                None,
            )
        }
        ConsoleCommand::Effects {
            run: None,
            status,
            tool,
            since: s,
            limit,
        } => (
            Method::GET,
            format!(
                "/v1/effects{}",
                query(&[
                    ("status", status.clone()),
                    ("tool", tool.clone()),
                    ("since", since(s)?),
                    ("limit", Some(limit.to_string())),
                ])
            ),
            None,
        ),
        ConsoleCommand::Scheduled { run, tool } => (
            Method::GET,
            format!(
                "/v1/runs/{}/scheduled{}",
                segment(run),
                query(&[("tool", tool.clone())])
            ),
            None,
        ),
        ConsoleCommand::Show { run, command_key } => {
            (Method::GET, key_path(run, command_key), None)
        }
        ConsoleCommand::Approve {
            run,
            command_key,
            reason,
            args,
            set,
        } => {
            let path = key_path(run, command_key);
            let mut body = json!({ "reason": reason });
            if let Some(edited) = edit::edited_args(&client, &path, args.as_deref(), set).await? {
                body["args"] = edited;
            }
            (Method::POST, format!("{path}:approve"), Some(body))
        }
        ConsoleCommand::ApprovalLink {
            run,
            command_key,
            expires_in,
            recipient,
        } => {
            let mut body = json!({});
            if let Some(seconds) = expires_in {
                body["expires_in_s"] = json!(seconds);
            }
            if let Some(recipient) = recipient {
                body["for"] = json!(recipient);
            }
            (
                Method::POST,
                format!("{}:approval-link", key_path(run, command_key)),
                Some(body),
            )
        }
        ConsoleCommand::Reject {
            run,
            command_key,
            reason,
        } => (
            Method::POST,
            format!("{}:reject", key_path(run, command_key)),
            Some(json!({ "reason": reason })),
        ),
        ConsoleCommand::Cancel {
            run,
            command_key,
            reason,
        } => (
            Method::POST,
            format!("{}:cancel", key_path(run, command_key)),
            Some(json!({ "reason": reason })),
        ),
        ConsoleCommand::Replay {
            run,
            command_key,
            reason,
            dry_run,
            evidence,
        } => {
            let mut body = json!({ "reason": reason, "dry_run": dry_run });
            if let Some(evidence) = evidence {
                body["evidence"] = serde_json::from_str(evidence)
                    .unwrap_or_else(|_| Value::String(evidence.clone()));
            }
            (
                Method::POST,
                format!("{}:replay", key_path(run, command_key)),
                Some(body),
            )
        }
        ConsoleCommand::Resolve {
            run,
            command_key,
            outcome,
            evidence,
            reason,
        } => {
            let parsed = serde_json::from_str::<Value>(evidence)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::String(evidence.clone()));
            let mut body = json!({ "reason": reason, "evidence": parsed });
            match outcome {
                OutcomeArg::Confirmed => {
                    body["outcome"] = json!("CONFIRMED");
                    if !parsed.is_string() {
                        body["external_ref"] = parsed["external_ref"].clone();
                    }
                }
                OutcomeArg::Failed => body["outcome"] = json!("FAILED"),
            }
            (
                Method::POST,
                format!("{}:resolve", key_path(run, command_key)),
                Some(body),
            )
        }
        ConsoleCommand::Rollback {
            run,
            reason: Some(reason),
        } => (
            Method::POST,
            format!("/v1/runs/{}/rollback", segment(run)),
            Some(json!({ "reason": reason })),
        ),
        ConsoleCommand::Rollback { run, reason: None } => (
            Method::GET,
            format!("/v1/runs/{}/rollback", segment(run)),
            None,
        ),
        ConsoleCommand::Audit(AuditCommand::Show { run }) => (
            Method::GET,
            format!("/v1/runs/{}/audit", segment(run)),
            None,
        ),
        ConsoleCommand::Audit(AuditCommand::Verify { run }) => (
            Method::GET,
            format!("/v1/runs/{}/audit/verify", segment(run)),
            None,
        ),
        ConsoleCommand::Flow(FlowCommand::List) => (Method::GET, "/v1/flow".to_owned(), None),
        ConsoleCommand::Budgets { at } => (
            Method::GET,
            match at {
                Some(at) => format!("/v1/budgets?at={}", segment(at)),
                None => "/v1/budgets".to_owned(),
            },
            None,
        ),
        ConsoleCommand::Flow(FlowCommand::Pause { name, reason }) => (
            Method::POST,
            format!("/v1/flow/{}:pause", segment(name)),
            Some(json!({ "reason": reason })),
        ),
        ConsoleCommand::Flow(FlowCommand::Resume { name, reason }) => (
            Method::POST,
            format!("/v1/flow/{}:resume", segment(name)),
            Some(json!({ "reason": reason })),
        ),
        ConsoleCommand::Purge {
            older_than,
            reason,
            max_runs,
            dry_run,
        } => {
            let mut body = json!({
                "older_than": parse_since(older_than, now)?,
                "reason": reason,
                "dry_run": dry_run,
            });
            if let Some(max_runs) = max_runs {
                body["max_runs"] = json!(max_runs);
            }
            (Method::POST, "/v1/audit/purge".to_owned(), Some(body))
        }
    };
    let answer = client.call(method, &path, body).await?;
    if !answer.status.is_success() {
        let message = match &answer.body["error"] {
            Value::Object(error) => format!(
                "{} ({}): {}",
                answer.status.as_u16(),
                text(&error.get("code").cloned().unwrap_or(Value::Null)),
                text(&error.get("message").cloned().unwrap_or(Value::Null))
            ),
            _ => format!("{}: {}", answer.status, text(&answer.body)),
        };
        let exit = exit_of(answer.status);
        if args.json {
            return Err(Failure::new(exit, answer.body.to_string()));
        }
        return Err(Failure::new(exit, format!("error: {message}")));
    }
    // A run's listing answers an empty list for a run it has never seen (a run begins with
    // its first effect, for the SDKs' run handles); people asking about a run by id mean it
    // exists, so an empty answer is checked here and an unknown run is "not found".
    match &command {
        ConsoleCommand::Effects {
            run: Some(run),
            status,
            tool,
            ..
        } if listed_nothing(&answer.body) => {
            known_run(&client, run, status.is_some() || tool.is_some(), args.json).await?;
        }
        ConsoleCommand::Scheduled { run, .. } if listed_nothing(&answer.body) => {
            known_run(&client, run, true, args.json).await?;
        }
        _ => {}
    }
    // Outcomes that succeed over HTTP but mean "no": a broken chain, a refused dry run.
    let exit = match &command {
        ConsoleCommand::Audit(AuditCommand::Verify { .. })
            if answer.body["valid"] == json!(false) =>
        {
            Some(Exit::Tampered)
        }
        ConsoleCommand::Replay { dry_run: true, .. } if answer.body["allowed"] == json!(false) => {
            Some(Exit::Refused)
        }
        _ => None,
    };
    let out = if args.json {
        serde_json::to_string_pretty(&answer.body).unwrap_or_else(|_| answer.body.to_string())
    } else {
        render(&command, &answer.body)
    };
    match exit {
        Some(exit) => Err(Failure::new(exit, out)),
        None => Ok(out),
    }
}

fn listed_nothing(body: &Value) -> bool {
    body["effects"].as_array().is_some_and(Vec::is_empty)
}

/// Whether a run whose listing came back empty exists: `filtered` says the listing was
/// narrowed (by status, tool, or to SCHEDULED effects), so the run's whole listing is asked
/// for first. A run with no effects is "not found"; one purged since says so, and where its
/// audit checkpoint is.
async fn known_run(client: &Client, run: &str, filtered: bool, json: bool) -> Result<(), Failure> {
    let refused = |answer: &Answer| {
        Failure::new(
            exit_of(answer.status),
            format!("error: {}: {}", answer.status.as_u16(), text(&answer.body)),
        )
    };
    if filtered {
        let all = client
            .call(
                Method::GET,
                &format!("/v1/runs/{}/effects", segment(run)),
                None,
            )
            .await?;
        if !all.status.is_success() {
            return Err(refused(&all));
        }
        if !listed_nothing(&all.body) {
            return Ok(());
        }
    }
    let trail = client
        .call(
            Method::GET,
            &format!("/v1/runs/{}/audit", segment(run)),
            None,
        )
        .await?;
    let purged = match trail.status {
        StatusCode::NOT_FOUND => false,
        status if status.is_success() => {
            let entries = trail.body["entries"].as_array().map_or(0, Vec::len);
            if trail.body["checkpoint"].is_null() || entries > 0 {
                // Records but no effects: a run that exists, with nothing to list.
                return Ok(());
            }
            true
        }
        _ => return Err(refused(&trail)),
    };
    let message = if purged {
        format!(
            "run {run} not found: it was purged, and only its audit checkpoint remains (sluice audit verify {run})"
        )
    } else {
        format!(
            "run {run} not found: no effect was ever submitted in it (run ids are case-sensitive; sluice runs lists recent ones)"
        )
    };
    Err(Failure::new(
        Exit::NotFound,
        if json {
            json!({"error": {"code": "unknown_run", "message": message}}).to_string()
        } else {
            format!("error: {message}")
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::render::render_purge;
    use super::*;

    #[test]
    fn segments_encode_command_keys() {
        assert_eq!(segment("d-3/payments/wire/0"), "d-3%2Fpayments%2Fwire%2F0");
    }

    #[test]
    fn since_takes_durations_and_times() {
        let now = Timestamp::from_millis(10 * 86_400_000);
        assert_eq!(
            parse_since("1d", now).expect("a duration"),
            Timestamp::from_millis(9 * 86_400_000).to_string()
        );
        assert!(parse_since("2026-11-01T00:00:00Z", now).is_ok());
        assert_eq!(parse_since("soon", now).expect_err("bad").exit, Exit::Usage);
        assert_eq!(
            parse_since("3w", now).expect_err("bad unit").exit,
            Exit::Usage
        );
    }

    #[test]
    fn a_purge_names_the_runs_it_kept_and_why() {
        let mut report = sluice_ledger::PurgeReport {
            runs: 2,
            commands: 3,
            ..Default::default()
        };
        let run = sluice_core::ids::RunId::parse("r-abc").expect("valid");
        let key = sluice_core::ids::CommandKey::parse("d-3/payments/wire/0").expect("valid");
        for owed in [
            sluice_core::retention::Owed::DuplicateCleanUp,
            sluice_core::retention::Owed::LastLook,
        ] {
            report.keep(run.clone(), key.clone(), owed);
        }
        report.kept.pop();
        let out = render_purge(&serde_json::to_value(&report).expect("json"));
        assert!(out.starts_with("purged 2 run(s): 3 command(s)"), "{out}");
        assert!(
            out.contains("kept 2 finished run(s) that still owe work"),
            "{out}"
        );
        assert!(out.contains("r-abc"), "{out}");
        assert!(out.contains("the clean-up of a duplicate commit"), "{out}");
        assert!(out.contains("… and 1 more"), "{out}");

        let none = render_purge(
            &serde_json::to_value(sluice_ledger::PurgeReport::default()).expect("json"),
        );
        assert!(!none.contains("kept 0"), "{none}");
    }

    #[test]
    fn statuses_map_to_exit_codes() {
        assert_eq!(exit_of(StatusCode::UNAUTHORIZED), Exit::Denied);
        assert_eq!(exit_of(StatusCode::FORBIDDEN), Exit::Denied);
        assert_eq!(exit_of(StatusCode::CONFLICT), Exit::Refused);
        assert_eq!(exit_of(StatusCode::NOT_FOUND), Exit::NotFound);
        assert_eq!(exit_of(StatusCode::UNPROCESSABLE_ENTITY), Exit::Usage);
        assert_eq!(exit_of(StatusCode::SERVICE_UNAVAILABLE), Exit::Unavailable);
    }
}
