//! How the console's commands show the server's answers: tables of effects, audit records and
//! rollback progress, a command's detail, and the purge report.

use super::*;

pub(super) fn text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().copied());
    table
}

pub(super) fn effects_table(effects: &[Value]) -> String {
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

pub(super) fn command_view(c: &Value) -> String {
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
        "tenant",
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

pub(super) fn audit_table(trail: &Value) -> String {
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
    if let Some(facts) = checkpoint_facts(&trail["checkpoint"]) {
        out.push_str(&format!("checkpoint: {facts}\n"));
    }
    out.push_str(&format!("{t}\n{} record(s)", entries.len()));
    out
}

/// What the checkpoint a purge left of a run's chain says; `None` for a run never purged.
pub(super) fn checkpoint_facts(checkpoint: &Value) -> Option<String> {
    let cp = checkpoint.as_object()?;
    let field = |key: &str| text(cp.get(key).unwrap_or(&Value::Null));
    Some(format!(
        "{} record(s) purged at {}, last hash {}",
        field("count"),
        field("purged_at"),
        field("last_hash")
    ))
}

pub(super) fn progress_table(progress: &Value) -> String {
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

pub(super) fn render(command: &ConsoleCommand, body: &Value) -> String {
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
        ConsoleCommand::ApprovalLink { .. } => format!(
            "{}\nlink {}, expires at {}{}",
            text(&body["url"]),
            text(&body["link_id"]),
            text(&body["expires_at"]),
            body["for"]
                .as_str()
                .map(|r| format!(", for {r}"))
                .unwrap_or_default()
        ),
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
        ConsoleCommand::Rollback { .. } => match body["message"].as_str() {
            Some(message) if body["already_rolled_back"] == json!(true) => {
                format!("{message}\n{}", progress_table(&body["progress"]))
            }
            _ => progress_table(&body["progress"]),
        },
        ConsoleCommand::Audit(AuditCommand::Show { .. }) => audit_table(body),
        ConsoleCommand::Audit(AuditCommand::Verify { .. }) => {
            if body["valid"] == json!(true) {
                let verified = format!(
                    "audit chain of {} verifies: {} record(s)",
                    text(&body["run_id"]),
                    text(&body["records"])
                );
                match checkpoint_facts(&body["checkpoint"]) {
                    Some(facts) => format!("{verified} after its checkpoint ({facts})"),
                    None => verified,
                }
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
        ConsoleCommand::Flow(FlowCommand::List) => flow_table(body),
        ConsoleCommand::Budgets { .. } => budgets_table(body),
        ConsoleCommand::Flow(_) => {
            let outcome = text(&body["outcome"]);
            let pause = &body["paused"];
            if pause.is_null() {
                format!("{}: {outcome}", text(&body["name"]))
            } else {
                format!(
                    "{}: {outcome} (paused by {} at {}: {})",
                    text(&body["name"]),
                    text(&pause["actor"]),
                    text(&pause["at"]),
                    text(&pause["reason"])
                )
            }
        }
    }
}

/// Upstreams and tools with their limits and state, one row each.
pub(super) fn flow_table(body: &Value) -> String {
    let entries = body["flow"].as_array().cloned().unwrap_or_default();
    let mut t = table(&["NAME", "KIND", "RATE", "IN FLIGHT", "BREAKER", "PAUSED"]);
    for e in &entries {
        let breaker = match e["breaker_state"]["state"].as_str() {
            Some("open") => format!("open until {}", text(&e["breaker_state"]["probe_at"])),
            Some("half_open") => format!("half open ({})", text(&e["breaker_state"]["probe_by"])),
            Some(state) if !e["breaker"].is_null() => state.to_owned(),
            _ => "-".to_owned(),
        };
        let kind = match e["kind"].as_str() {
            Some("tool") if e["upstream"] != e["name"] => {
                format!("tool of {}", text(&e["upstream"]))
            }
            _ => text(&e["kind"]),
        };
        t.add_row(vec![
            text(&e["name"]),
            kind,
            match e["rate"].as_str() {
                Some(rate) => format!("{rate} (burst {})", text(&e["burst"])),
                None => "-".into(),
            },
            if e["max_in_flight"].is_null() {
                "-".into()
            } else {
                text(&e["max_in_flight"])
            },
            breaker,
            if e["paused"].is_null() {
                String::new()
            } else {
                format!(
                    "{}: {}",
                    text(&e["paused"]["actor"]),
                    text(&e["paused"]["reason"])
                )
            },
        ]);
    }
    t.to_string()
}

/// Each budget as a heading, then its counters in the window shown, one row each.
pub(super) fn budgets_table(body: &Value) -> String {
    let budgets = body["budgets"].as_array().cloned().unwrap_or_default();
    if budgets.is_empty() {
        return "the catalog declares no [budgets.<name>]".to_owned();
    }
    let mut out = Vec::new();
    for b in &budgets {
        let limits: Vec<String> = b["limits"]
            .as_object()
            .map(|limits| limits.iter().map(|(c, l)| format!("{c} {l}")).collect())
            .unwrap_or_default();
        let mut heading = format!(
            "budget {}: per {}, {} window from {}, limits {} (minor units), over it: {}",
            text(&b["name"]),
            text(&b["scope"]),
            text(&b["window"]),
            text(&b["window_start"]),
            limits.join(", "),
            text(&b["on_exceed"])
        );
        let counters = b["counters"].as_array().cloned().unwrap_or_default();
        if counters.is_empty() {
            heading.push_str("\n  nothing held in this window");
            out.push(heading);
            continue;
        }
        let mut t = table(&[
            &text(&b["scope"]).to_uppercase(),
            "CURRENCY",
            "HELD",
            "LIMIT",
            "LEFT",
            "HOLDS",
        ]);
        for c in &counters {
            t.add_row(vec![
                text(&c["scope_value"]),
                text(&c["currency"]),
                text(&c["used"]),
                text(&c["limit"]),
                text(&c["remaining"]),
                text(&c["holds"]),
            ]);
        }
        out.push(format!("{heading}\n{t}"));
    }
    out.join("\n\n")
}

/// How many removed runs a purge's report names; the rest are counted.
const PURGED_LISTED: usize = 50;

/// What a purge removed (or, for a dry run, would remove) run by run, then the runs it kept
/// because a command still owes work.
pub(super) fn render_purge(report: &Value) -> String {
    let dry_run = report["dry_run"] == json!(true);
    let mut out = format!(
        "{} {} run(s): {} command(s), {} audit record(s), {} business key(s), {} budget hold(s) of ended windows; {}",
        if dry_run {
            "dry run, nothing removed: would purge"
        } else {
            "purged"
        },
        text(&report["runs"]),
        text(&report["commands"]),
        text(&report["audit_records"]),
        text(&report["business_keys"]),
        report["budget_holds"].as_u64().unwrap_or(0),
        if dry_run {
            "each would keep its audit checkpoint"
        } else {
            "checkpoints kept"
        }
    );
    let removed = report["checkpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !removed.is_empty() {
        let mut table = table(&["run", "audit records", "checkpoint hash"]);
        for checkpoint in removed.iter().take(PURGED_LISTED) {
            table.add_row([
                text(&checkpoint["run_id"]),
                text(&checkpoint["count"]),
                text(&checkpoint["last_hash"]),
            ]);
        }
        out.push_str(&format!("\n{table}"));
        if removed.len() > PURGED_LISTED {
            out.push_str(&format!("\n… and {} more", removed.len() - PURGED_LISTED));
        }
    }
    let kept = report["kept"].as_array().cloned().unwrap_or_default();
    let counted = report["kept_runs"].as_u64().unwrap_or(kept.len() as u64);
    if counted == 0 {
        return out;
    }
    out.push_str(&format!(
        "\n{} {counted} finished run(s) that still owe work (purged once it is done):",
        if dry_run { "would keep" } else { "kept" }
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
