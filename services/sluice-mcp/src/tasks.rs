//! MCP Tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663, as `rmcp` models it) for
//! calls that wait: a client that declares the extension and whose call needs a person's
//! approval, is scheduled, has an outcome nobody knows yet or is still running when a short
//! wait passes gets a task instead of a result, and polls `tasks/get`.
//!
//! **A task is the command, nothing more.** Its id is the command's run and key
//! (`<run_id>/<command_key>`), so any `sluice mcp` replica answers for any task and nothing is
//! kept in memory: `tasks/get` reads the command from the producer's API and `tasks/cancel` is
//! the API's cancel, each with the caller's own token. The id is never an authorisation — a
//! token that may not read (or cancel) the command gets the API's refusal.
//!
//! **The mapping** ([`task_status`]) from the command's status is pure: `CONFIRMED` and the
//! settled failures (`FAILED`, rolled back) are `completed` with the tool result (`isError` for
//! the failures, as a tool's own failure is in MCP); `CANCELLED` is `cancelled`; everything a
//! person or the pipeline still has to finish (`SCHEDULED`, `PENDING`, `BLOCKED`, `APPROVED`,
//! `LEASED`, `UNKNOWN`, `STUCK`, `COMPENSATING`) is `working`, with a status message saying what
//! it waits for. `input_required` is not used: in the extension it carries requests the
//! *client* must answer (elicitation, sampling), and an approval is a person's act through
//! Sluice's API (an admin's token), never the agent's. `failed` is a JSON-RPC error, which a
//! recorded command never is.

use rmcp::model::{CallToolResult, DetailedTask, JsonObject, Task, TaskPayload, TaskStatus};
use serde_json::Value;
use sluice_core::{CommandKey, CommandStatus, RunId};

/// How often a client is asked to poll a task, in milliseconds.
pub const POLL_INTERVAL_MS: u64 = 2_000;

/// The task state of a command in `status` (a `CommandStatus` as the API names it; a status
/// this build does not know is still running as far as a task can tell).
pub fn task_status(status: &str) -> TaskStatus {
    match serde_json::from_value(Value::String(status.to_owned())) {
        Ok(status) => task_status_of(status),
        Err(_) => TaskStatus::Working,
    }
}

/// Whether a call whose outcome says `status` is answered with a task (for a client that takes
/// them): a command that is still to finish. What the bridge says of a call that made no
/// command, or whose command it could not read (`REFUSED`, `NOT_RECORDED`, `UNANSWERED`), is
/// never a task: it is answered at once, as to any client.
pub fn waits(status: &str) -> bool {
    serde_json::from_value(Value::String(status.to_owned()))
        .is_ok_and(|status| task_status_of(status) == TaskStatus::Working)
}

/// The task state of a command status; exhaustive, so a new status must be placed here.
fn task_status_of(status: CommandStatus) -> TaskStatus {
    match status {
        CommandStatus::Confirmed
        | CommandStatus::Failed
        | CommandStatus::Compensated
        | CommandStatus::NoCompensation
        | CommandStatus::CompensationFailed => TaskStatus::Completed,
        CommandStatus::Cancelled => TaskStatus::Cancelled,
        CommandStatus::Scheduled
        | CommandStatus::Pending
        | CommandStatus::Blocked
        | CommandStatus::Approved
        | CommandStatus::Leased
        | CommandStatus::Unknown
        | CommandStatus::Stuck
        | CommandStatus::Compensating => TaskStatus::Working,
    }
}

/// The task id of a command: its run and key.
pub fn task_id(run: &RunId, key: &CommandKey) -> String {
    format!("{run}/{key}")
}

/// The command a task id names.
pub fn parse_task_id(id: &str) -> Result<(RunId, CommandKey), String> {
    let shape = || {
        format!(
            "task id {id:?} is not one sluice mcp gave: it is <run_id>/<command_key>, e.g. r-1/d-1/payments/wire/0"
        )
    };
    let (run, key) = id.split_once('/').ok_or_else(shape)?;
    let run = RunId::parse(run).map_err(|e| format!("{}: {e}", shape()))?;
    let key = CommandKey::parse(key).map_err(|e| format!("{}: {e}", shape()))?;
    Ok((run, key))
}

/// The task of a command as the API answered it (`command`), with `result` the tool result a
/// completed task carries.
pub fn detailed(
    run: &RunId,
    key: &CommandKey,
    command: &Value,
    message: &str,
    result: CallToolResult,
) -> DetailedTask {
    let status = task_status(command["status"].as_str().unwrap_or("UNKNOWN"));
    let created = command["created_at"].as_str().unwrap_or_default();
    let updated = command["updated_at"].as_str().unwrap_or(created);
    let task = Task::new(task_id(run, key), status, created, updated)
        .with_status_message(message)
        .with_poll_interval_ms(POLL_INTERVAL_MS);
    let payload = match status {
        TaskStatus::Completed => TaskPayload::Completed {
            result: as_object(&result),
        },
        TaskStatus::Cancelled => TaskPayload::Cancelled,
        _ => TaskPayload::Working,
    };
    DetailedTask::new(task, payload)
}

fn as_object(result: &CallToolResult) -> JsonObject {
    match serde_json::to_value(result) {
        Ok(Value::Object(map)) => map,
        _ => JsonObject::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use sluice_core::ToolName;

    use super::*;

    #[test]
    fn settled_commands_complete_and_waiting_ones_work() {
        for status in [
            "CONFIRMED",
            "FAILED",
            "COMPENSATED",
            "NO_COMPENSATION",
            "COMPENSATION_FAILED",
        ] {
            assert_eq!(task_status(status), TaskStatus::Completed, "{status}");
        }
        assert_eq!(task_status("CANCELLED"), TaskStatus::Cancelled);
        for status in [
            "SCHEDULED",
            "PENDING",
            "BLOCKED",
            "APPROVED",
            "LEASED",
            "UNKNOWN",
            "STUCK",
            "COMPENSATING",
        ] {
            assert_eq!(task_status(status), TaskStatus::Working, "{status}");
        }
    }

    #[test]
    fn only_commands_still_to_finish_are_tasks() {
        for status in [
            "BLOCKED",
            "SCHEDULED",
            "UNKNOWN",
            "STUCK",
            "LEASED",
            "PENDING",
        ] {
            assert!(waits(status), "{status}");
        }
        for status in [
            "CONFIRMED",
            "FAILED",
            "CANCELLED",
            "REFUSED",
            "NOT_RECORDED",
            "UNANSWERED",
            "",
        ] {
            assert!(!waits(status), "{status}");
        }
    }

    #[test]
    fn every_command_status_maps_and_none_asks_the_client_for_input() {
        for status in CommandStatus::ALL {
            let name = serde_json::to_value(status).expect("a status");
            let mapped = task_status(name.as_str().expect("a name"));
            assert_ne!(mapped, TaskStatus::InputRequired, "{name}");
            assert_ne!(mapped, TaskStatus::Failed, "{name}");
        }
    }

    #[test]
    fn a_task_id_names_its_command_and_bad_ones_say_what_they_must_be() {
        let run = RunId::parse("r-1").expect("run");
        let key = CommandKey::new(2, ToolName::parse("payments/wire").expect("tool"), 3);
        let id = task_id(&run, &key);
        assert_eq!(id, "r-1/d-2/payments/wire/3");
        assert_eq!(parse_task_id(&id).expect("parsed"), (run, key));
        for bad in ["", "r-1", "r 1/d-1/a/b/0", "r-1/not-a-key"] {
            let said = parse_task_id(bad).expect_err(bad);
            assert!(said.contains("<run_id>/<command_key>"), "{said}");
        }
    }

    #[test]
    fn a_completed_task_carries_the_tool_result_and_a_working_one_none() {
        let run = RunId::parse("r-1").expect("run");
        let key = CommandKey::new(1, ToolName::parse("email/send").expect("tool"), 0);
        let result = CallToolResult::success(vec![]);
        let done = detailed(
            &run,
            &key,
            &json!({"status": "CONFIRMED", "created_at": "2026-01-01T00:00:00Z",
                    "updated_at": "2026-01-01T00:00:01Z"}),
            "done",
            result.clone(),
        );
        let wire = serde_json::to_value(&done).expect("json");
        assert_eq!(wire["status"], json!("completed"));
        assert_eq!(wire["result"]["isError"], json!(false));
        assert_eq!(wire["lastUpdatedAt"], json!("2026-01-01T00:00:01Z"));
        let waiting = detailed(&run, &key, &json!({"status": "BLOCKED"}), "waits", result);
        let wire = serde_json::to_value(&waiting).expect("json");
        assert_eq!(wire["status"], json!("working"));
        assert_eq!(wire["statusMessage"], json!("waits"));
        assert!(wire.get("result").is_none(), "{wire}");
    }
}
