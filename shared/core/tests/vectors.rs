//! The core against the shared key and journal vectors (`sdk/test-vectors/journal.json`), the
//! same file the Python and TypeScript SDKs check themselves against: every client derives
//! the same keys from the same journal walk, and refuses the same malformed ids.

use serde_json::Value;
use sluice_core::journal::Journal;
use sluice_core::{CommandKey, IdempotencyKey, RunId, ToolName};

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../sdk/test-vectors/journal.json"
    );
    let text = std::fs::read_to_string(path).expect("the shared vectors are readable");
    serde_json::from_str(&text).expect("the shared vectors are JSON")
}

fn text<'v>(value: &'v Value, field: &str) -> &'v str {
    value[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is text in {value}"))
}

fn number(value: &Value, field: &str) -> u32 {
    value[field]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or_else(|| panic!("{field} is a u32 in {value}"))
}

#[test]
fn keys_are_derived_as_the_vectors_say() {
    let vectors = vectors();
    let keys = vectors["keys"].as_array().expect("keys");
    assert!(keys.len() >= 5);
    for case in keys {
        let run = RunId::parse(text(case, "run_id")).expect("a valid run id");
        let tool = ToolName::parse(text(case, "tool")).expect("a valid tool");
        let key = CommandKey::new(number(case, "decision"), tool, number(case, "call_idx"));
        assert_eq!(key.as_str(), text(case, "command_key"), "{case}");
        assert_eq!(
            CommandKey::parse(text(case, "command_key")).expect("parses"),
            key
        );
        let idempotency = IdempotencyKey::new(run, key.clone());
        assert_eq!(idempotency.to_string(), text(case, "idempotency_key"));
        let segment = key.as_str().replace('%', "%25").replace('/', "%2F");
        assert_eq!(segment, text(case, "command_key_path_segment"));
    }
}

#[test]
fn journal_walks_give_the_vectors_keys() {
    let vectors = vectors();
    for walk in vectors["journals"].as_array().expect("journals") {
        let mut journal = Journal::new();
        let mut got = Vec::new();
        for step in walk["steps"].as_array().expect("steps") {
            let step = step.as_str().expect("a step is text");
            match step.split_once(' ') {
                None if step == "decide" => {
                    journal.decide();
                }
                Some(("call", tool)) => {
                    let tool = ToolName::parse(tool).expect("a valid tool");
                    got.push(journal.next_call(&tool).as_str().to_owned());
                }
                _ => panic!("unknown step {step:?}"),
            }
        }
        let want: Vec<&str> = walk["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| k.as_str().expect("a key is text"))
            .collect();
        assert_eq!(got, want, "{}", walk["name"]);
    }
}

#[test]
fn malformed_ids_are_refused_as_the_vectors_say() {
    let vectors = vectors();
    let invalid = &vectors["invalid"];
    let each = |field: &str| -> Vec<String> {
        invalid[field]
            .as_array()
            .expect("a list")
            .iter()
            .map(|v| v.as_str().expect("text").to_owned())
            .collect()
    };
    for raw in each("run_ids") {
        assert!(
            RunId::parse(&raw).is_err(),
            "run id {raw:?} must be refused"
        );
    }
    for raw in each("tool_names") {
        assert!(
            ToolName::parse(&raw).is_err(),
            "tool {raw:?} must be refused"
        );
    }
    for raw in each("command_keys") {
        assert!(
            CommandKey::parse(&raw).is_err(),
            "command key {raw:?} must be refused"
        );
    }
}
