//! The MCP gateway through the whole pipeline: a catalog whose tools are an MCP server's (the
//! notebook server of `shared/connector/tests/support/`, a real MCP server written here,
//! started over stdio as the `sluice-mcp-fixture` binary), submitted through the API, called by
//! the dispatcher, looked up by the reconciler. Checked against the server's own notes file.
//! (The third-party servers — git, memory, filesystem — are `tests/mcp-gateway/`'s.)

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_core::catalog::Catalog;
use sluice_core::command::CommandStatus::*;
use sluice_tests::processes::binary;
use sluice_tests::*;

/// The notebook twice: `nb` with a lookup for `append_slow`, `blind` without one. Each call
/// has 400 ms; `append_slow` answers after `delay_ms`, so a longer delay loses the answer after
/// the server acted.
fn catalog(dir: &Path) -> Catalog {
    let server = |name: &str| {
        format!(
            r#"[mcp_servers.{name}]
command = "{}"
env = {{ FIXTURE_STATE = "{}" }}
timeout_ms = 400
allow = ["append_slow", "notes"]
[mcp_servers.{name}.tools.append_slow.policy]
settle_ms = 300
"#,
            binary("sluice-mcp-fixture").display(),
            dir.join(format!("{name}.json")).display(),
        )
    };
    let text = format!(
        r#"max_clock_skew_ms = 100
{}
[mcp_servers.nb.tools.append_slow]
set_arguments = {{ text = "{{args.text}} [key {{idempotency_key}}]" }}
[mcp_servers.nb.tools.append_slow.status_check]
tool = "notes"
matches = "/items"
match_reference_pointer = "/id"
match_where = {{ "/text" = "{{args.text}} [key {{idempotency_key}}]" }}
{}"#,
        server("nb"),
        server("blind"),
    );
    Catalog::from_toml_str(&text, "mcp-gateway.toml").expect("the catalog parses")
}

fn notes(dir: &Path, server: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join(format!("{server}.json")))
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_of_an_mcp_tool_is_looked_up_through_the_same_server_and_never_resent() {
    init_tracing();
    let servers = tempfile::tempdir().expect("a temporary directory");
    let data = tempfile::tempdir().expect("a temporary directory");
    let config = test_config(data.path());
    let pipeline = start_pipeline(&config, catalog(servers.path())).await;
    let agent = Agent::new(&pipeline.url());

    // Listed by the API as the server's tools, with the source of their semantics.
    let tools = reqwest::get(format!("{}/v1/tools", pipeline.url()))
        .await
        .expect("the API answers")
        .json::<Value>()
        .await
        .expect("JSON");
    let slow = tools["tools"]
        .as_array()
        .and_then(|tools| tools.iter().find(|t| t["name"] == "nb/append_slow"))
        .expect("nb/append_slow is listed");
    assert_eq!(slow["semantics"], "NON_IDEMPOTENT");
    assert_eq!(slow["semantics_source"], "annotation");
    assert_eq!(slow["mcp_server"], "nb");
    assert_eq!(slow["status_check"], true);

    // Answered in time: CONFIRMED with the server's result.
    agent
        .submit_created(&effect(
            "r-mcp",
            1,
            "nb/append_slow",
            0,
            json!({"text": "quick", "delay_ms": 0}),
        ))
        .await;
    let quick = agent.wait_settled("r-mcp", "d-1/nb/append_slow/0").await;
    assert_eq!(quick.status(), Confirmed, "{quick:?}");

    // The answer lost after the server acted: UNKNOWN, then the lookup through `notes` finds
    // the one note, CONFIRMED with one attempt; the server holds one note for the key.
    agent
        .submit_created(&effect(
            "r-mcp",
            2,
            "nb/append_slow",
            0,
            json!({"text": "slow", "delay_ms": 1500}),
        ))
        .await;
    let slow = agent
        .wait_settled_within("r-mcp", "d-2/nb/append_slow/0", Duration::from_secs(30))
        .await;
    assert_eq!(slow.status(), Confirmed, "{slow:?}");
    assert_eq!(slow.state.attempts, 1, "confirmed without a second call");
    assert_eq!(slow.state.external_ref.as_deref(), Some("n-2"));
    let stored = notes(servers.path(), "nb");
    let key = "r-mcp/d-2/nb/append_slow/0";
    let with_key: Vec<&Value> = stored
        .iter()
        .filter(|note| {
            note["text"]
                .as_str()
                .is_some_and(|text| text.ends_with(&format!("[key {key}]")))
        })
        .collect();
    assert_eq!(with_key.len(), 1, "{stored:?}");
    assert_eq!(with_key[0]["meta"]["dev.sluice/idempotency_key"], key);

    // No lookup: a person decides (STUCK), and the server was called once.
    agent
        .submit_created(&effect(
            "r-mcp",
            3,
            "blind/append_slow",
            0,
            json!({"text": "blind", "delay_ms": 1500}),
        ))
        .await;
    let blind = agent
        .wait_settled_within("r-mcp", "d-3/blind/append_slow/0", Duration::from_secs(30))
        .await;
    assert_eq!(blind.status(), Stuck, "{blind:?}");
    assert_eq!(notes(servers.path(), "blind").len(), 1);

    pipeline.stop().await.expect("every service stops cleanly");
}
