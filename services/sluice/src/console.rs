//! The operator console: `sluice runs`, `effects`, `show`, `approve`, `reject`, `cancel`,
//! `replay`, `resolve`, `rollback`, `audit`, `purge` — the producer's HTTP API for people.
//!
//! Output is a readable table, or with `--json` the server's answer as it came, for scripts.
//! The exit code says what happened (see [`Exit`]); the token comes from `--token` or
//! `SLUICE_TOKEN` and is never printed.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{ContentArrangement, Table, presets};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sluice_core::time::{Clock, SystemClock, Timestamp};

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
    /// Approve a BLOCKED command: it is dispatched under the current policy version.
    Approve {
        run: String,
        command_key: String,
        #[arg(long)]
        reason: String,
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
    /// Remove finished runs untouched for a while, leaving their audit checkpoints.
    Purge {
        /// `30d`, `12h`, or an RFC 3339 cutoff.
        #[arg(long)]
        older_than: String,
        #[arg(long)]
        reason: String,
        #[arg(long)]
        max_runs: Option<usize>,
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

/// Percent-encodes one path segment (command keys hold `/`).
pub fn segment(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
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

fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().copied());
    table
}

fn effects_table(effects: &[Value]) -> String {
    let mut t = table(&[
        "RUN",
        "COMMAND",
        "STATUS",
        "ATTEMPTS",
        "DUE",
        "REF / ERROR",
        "BY",
    ]);
    for e in effects {
        let detail = if e["external_ref"].is_null() {
            text(&e["last_error"])
        } else {
            text(&e["external_ref"])
        };
        let status = if e["escalated"].as_bool() == Some(true) {
            format!("{} (!)", text(&e["status"]))
        } else {
            text(&e["status"])
        };
        t.add_row(vec![
            text(&e["run_id"]),
            text(&e["command_key"]),
            status,
            text(&e["attempts"]),
            text(&e["due_at"]),
            detail,
            text(&e["submitted_by"]),
        ]);
    }
    format!("{t}\n{} effect(s)", effects.len())
}

fn command_view(c: &Value) -> String {
    let mut t = table(&["FIELD", "VALUE"]);
    for field in [
        "run_id",
        "command_key",
        "idempotency_key",
        "tool",
        "semantics",
        "status",
        "attempts",
        "replays",
        "due_at",
        "not_before",
        "external_ref",
        "last_error",
        "escalated",
        "business_key",
        "policy_version",
        "submitted_by",
        "created_at",
        "updated_at",
        "approval",
        "compensation",
        "args",
        "result",
    ] {
        if !c[field].is_null() {
            t.add_row(vec![field.to_owned(), text(&c[field])]);
        }
    }
    t.to_string()
}

fn audit_table(trail: &Value) -> String {
    let mut t = table(&["SEQ", "AT", "COMMAND", "FROM", "TO", "ACTOR", "REASON"]);
    let entries = trail["entries"].as_array().cloned().unwrap_or_default();
    for e in &entries {
        t.add_row(vec![
            text(&e["seq"]),
            text(&e["at"]),
            text(&e["command_key"]),
            text(&e["from"]),
            text(&e["to"]),
            text(&e["actor"]),
            text(&e["reason"]),
        ]);
    }
    let mut out = String::new();
    if let Some(cp) = trail["checkpoint"].as_object() {
        out.push_str(&format!(
            "checkpoint: {} records purged at {}, last hash {}\n",
            text(&cp["count"].clone()),
            text(&cp["purged_at"].clone()),
            text(&cp["last_hash"].clone())
        ));
    }
    out.push_str(&format!("{t}\n{} record(s)", entries.len()));
    out
}

fn progress_table(progress: &Value) -> String {
    let mut t = table(&["COMMAND", "TOOL", "STATUS", "STARTED", "ENDED", "DETAIL"]);
    for c in progress["commands"].as_array().cloned().unwrap_or_default() {
        let comp = &c["compensation"];
        t.add_row(vec![
            text(&c["command_key"]),
            text(&c["tool"]),
            text(&c["status"]),
            text(&comp["started_at"]),
            text(&comp["ended_at"]),
            if comp["detail"].is_null() {
                text(&comp["reference"])
            } else {
                text(&comp["detail"])
            },
        ]);
    }
    let done = if progress["done"].as_bool() == Some(true) {
        "rollback finished"
    } else {
        "rollback in progress"
    };
    format!("{t}\n{done}")
}

/// Runs one console command; returns what to print and the exit code.
pub async fn run(args: ConsoleArgs, command: ConsoleCommand) -> Result<String, Failure> {
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
        } => (
            Method::POST,
            format!("{}:approve", key_path(run, command_key)),
            Some(json!({ "reason": reason })),
        ),
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
        ConsoleCommand::Purge {
            older_than,
            reason,
            max_runs,
        } => {
            let mut body = json!({ "older_than": parse_since(older_than, now)?, "reason": reason });
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

fn render(command: &ConsoleCommand, body: &Value) -> String {
    let list = |key: &str| body[key].as_array().cloned().unwrap_or_default();
    match command {
        ConsoleCommand::Whoami => format!(
            "{} ({}){}",
            text(&body["name"]),
            text(&body["role"]),
            if body["authenticated"] == json!(false) {
                ", open API without tokens"
            } else {
                ""
            }
        ),
        ConsoleCommand::Runs { .. } => {
            let runs = list("runs");
            let mut t = table(&["RUN", "CREATED", "UPDATED", "OPEN"]);
            for r in &runs {
                t.add_row(vec![
                    text(&r["run_id"]),
                    text(&r["created_at"]),
                    text(&r["updated_at"]),
                    text(&r["open_commands"]),
                ]);
            }
            format!("{t}\n{} run(s)", runs.len())
        }
        ConsoleCommand::Effects { .. } | ConsoleCommand::Scheduled { .. } => {
            effects_table(&list("effects"))
        }
        ConsoleCommand::Show { .. } => command_view(body),
        ConsoleCommand::Approve { .. }
        | ConsoleCommand::Reject { .. }
        | ConsoleCommand::Cancel { .. }
        | ConsoleCommand::Resolve { .. }
        | ConsoleCommand::Replay { dry_run: false, .. } => format!(
            "{}: {} {} -> {}\n{}",
            text(&body["action"]),
            text(&body["command"]["command_key"]),
            text(&body["from"]),
            text(&body["to"]),
            command_view(&body["command"])
        ),
        ConsoleCommand::Replay { dry_run: true, .. } => {
            let mut t = table(&["CHECK", "RESULT"]);
            t.add_row(vec!["from".into(), text(&body["from"])]);
            t.add_row(vec![
                "arguments valid".into(),
                text(&body["arguments"]["valid"]),
            ]);
            t.add_row(vec!["policy".into(), text(&body["policy"]["decision"])]);
            t.add_row(vec![
                "replays (command)".into(),
                format!(
                    "{} of {}",
                    text(&body["replays"]["command"]),
                    text(&body["replays"]["command_limit"])
                ),
            ]);
            t.add_row(vec![
                "replays (run)".into(),
                format!(
                    "{} of {}",
                    text(&body["replays"]["run"]),
                    text(&body["replays"]["run_limit"])
                ),
            ]);
            for p in body["problems"].as_array().cloned().unwrap_or_default() {
                t.add_row(vec![
                    format!("refused: {}", text(&p["code"])),
                    text(&p["message"]),
                ]);
            }
            format!(
                "dry run: {}\n{t}\nwould happen: {}",
                if body["allowed"] == json!(true) {
                    "allowed"
                } else {
                    "refused"
                },
                text(&body["next"])
            )
        }
        ConsoleCommand::Rollback { .. } => progress_table(&body["progress"]),
        ConsoleCommand::Audit(AuditCommand::Show { .. }) => audit_table(body),
        ConsoleCommand::Audit(AuditCommand::Verify { .. }) => {
            if body["valid"] == json!(true) {
                format!(
                    "audit chain of {} verifies: {} record(s)",
                    text(&body["run_id"]),
                    text(&body["records"])
                )
            } else {
                format!(
                    "audit chain of {} is BROKEN at seq {} ({}): {}",
                    text(&body["run_id"]),
                    text(&body["broken"]["seq"]),
                    text(&body["broken"]["kind"]),
                    text(&body["message"])
                )
            }
        }
        ConsoleCommand::Purge { .. } => render_purge(&body["report"]),
    }
}

/// What a purge removed, then the runs it kept because a command still owes work.
fn render_purge(report: &Value) -> String {
    let mut out = format!(
        "purged {} run(s): {} command(s), {} audit record(s), {} business key(s); checkpoints kept",
        text(&report["runs"]),
        text(&report["commands"]),
        text(&report["audit_records"]),
        text(&report["business_keys"])
    );
    let kept = report["kept"].as_array().cloned().unwrap_or_default();
    let counted = report["kept_runs"].as_u64().unwrap_or(kept.len() as u64);
    if counted == 0 {
        return out;
    }
    out.push_str(&format!(
        "\nkept {counted} finished run(s) that still owe work (purged once it is done):"
    ));
    let mut table = table(&["run", "command", "still owed"]);
    for run in &kept {
        let owed = match run["owed"].as_str() {
            Some("duplicate_clean_up") => "the clean-up of a duplicate commit",
            Some("last_look") => "a last look for a late or second commit",
            Some("due") => "a step the sweep has yet to take",
            _ => "work",
        };
        table.add_row([
            text(&run["run_id"]),
            text(&run["command_key"]),
            owed.to_owned(),
        ]);
    }
    out.push_str(&format!("\n{table}"));
    if counted > kept.len() as u64 {
        out.push_str(&format!("\n… and {} more", counted - kept.len() as u64));
    }
    out
}

#[cfg(test)]
mod tests {
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
