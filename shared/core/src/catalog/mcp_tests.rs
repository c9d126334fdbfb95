//! `[mcp_servers]`: parsing, the annotation mapping and the builder of a server's tools.

use std::collections::BTreeMap;

use serde_json::json;

use super::*;
use crate::command::EffectSemantics;

const GIT: &str = r#"
    [credentials.github]
    kind = "bearer"
    token = { env = "GITHUB_TOKEN" }

    [mcp_servers.git]
    command = "mcp-server-git"
    args = ["--repository", "/srv/repo"]
    env = { GIT_AUTHOR_NAME = "Sluice" }
    env_credentials = { GITHUB_TOKEN = "github" }
    timeout_ms = 20000
    allow = ["git_status", "git_log", "git_commit"]

    [mcp_servers.git.tools.git_commit]
    semantics = "NON_IDEMPOTENT"
    key_argument = "idempotency_key"
    set_arguments = { message = "{args.message}\n\nSluice-Key: {idempotency_key}" }
    reference_pointer = "/sha"
    [mcp_servers.git.tools.git_commit.policy]
    requires_approval = true
    [mcp_servers.git.tools.git_commit.status_check]
    tool = "git_log"
    arguments = { repo_path = "{args.repo_path}", max_count = 50 }
    contains = "Sluice-Key: {idempotency_key}"
"#;

fn listed(name: &str, hints: ToolHints) -> ListedTool {
    ListedTool {
        name: name.into(),
        description: Some(format!("the server's {name}")),
        input_schema: json!({
            "type": "object",
            "required": ["repo_path"],
            "properties": {
                "repo_path": {"type": "string"},
                "message": {"type": "string"},
                "max_count": {"type": "integer"},
            },
        }),
        hints,
    }
}

fn commit_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "required": ["repo_path", "message"],
        "properties": {"repo_path": {"type": "string"}, "message": {"type": "string"}},
    })
}

/// What the git server lists: its read tools marked read-only, `git_commit` unmarked, and a
/// tool the catalog does not allow.
fn git_listing() -> BTreeMap<String, Vec<ListedTool>> {
    let read_only = ToolHints {
        read_only: Some(true),
        ..ToolHints::default()
    };
    let mut commit = listed("git_commit", ToolHints::default());
    commit.input_schema = commit_schema();
    BTreeMap::from([(
        "git".to_owned(),
        vec![
            listed("git_status", read_only.clone()),
            listed("git_log", read_only.clone()),
            commit,
            listed(
                "git_reset",
                ToolHints {
                    destructive: Some(true),
                    ..ToolHints::default()
                },
            ),
        ],
    )])
}

fn refused(text: &str, listing: &BTreeMap<String, Vec<ListedTool>>) -> String {
    match Catalog::from_toml_str(text, "mcp.toml").and_then(|c| c.with_mcp_tools(listing)) {
        Ok(_) => panic!("the catalog loaded"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn annotations_map_to_semantics_read_only_first_then_idempotent_else_non_idempotent() {
    let hints = |read_only, idempotent, destructive| ToolHints {
        read_only,
        idempotent,
        destructive,
        open_world: None,
    };
    use EffectSemantics::{Idempotent, NonIdempotent, ObserveOnly};
    for (given, expected) in [
        (hints(None, None, None), NonIdempotent),
        (hints(Some(true), None, None), ObserveOnly),
        // A read-only claim wins over the others, whatever they say.
        (hints(Some(true), Some(false), Some(true)), ObserveOnly),
        (hints(Some(false), Some(true), None), Idempotent),
        (hints(None, Some(true), Some(true)), Idempotent),
        (hints(Some(false), Some(false), Some(false)), NonIdempotent),
        (hints(None, None, Some(false)), NonIdempotent),
    ] {
        assert_eq!(semantics_from_hints(&given), expected, "{given:?}");
    }
}

#[test]
fn a_server_declares_its_tools_only_once_listed() {
    let catalog = Catalog::from_toml_str(GIT, "mcp.toml").expect("valid");
    assert!(!catalog.mcp_listed());
    assert!(catalog.is_empty(), "no tool before the listing");
    let server = &catalog.mcp_servers()[0];
    assert_eq!(server.name, "git");
    assert_eq!(server.timeout_ms, 20_000);
    let McpTransport::Stdio(command) = &server.transport else {
        panic!("a stdio server: {server:?}")
    };
    assert_eq!(command.command, "mcp-server-git");
    assert_eq!(command.args, ["--repository", "/srv/repo"]);
    assert_eq!(command.env_credentials[0].0, "GITHUB_TOKEN");
    assert_eq!(command.env_credentials[0].1.name, "github");
}

#[test]
fn the_allowed_tools_become_catalog_tools_namespaced_by_the_server() {
    let catalog = Catalog::from_toml_str(GIT, "mcp.toml")
        .and_then(|c| c.with_mcp_tools(&git_listing()))
        .expect("valid");
    assert!(catalog.mcp_listed());
    let names: Vec<String> = catalog
        .tools()
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    assert_eq!(names, ["git/git_status", "git/git_log", "git/git_commit"]);
    assert!(
        catalog.resolve("git/git_reset").is_err(),
        "not allowed: not exposed"
    );

    let status = catalog.resolve("git/git_status").expect("listed");
    assert_eq!(status.semantics(), EffectSemantics::ObserveOnly);
    assert_eq!(status.semantics_source(), SemanticsSource::Annotation);
    assert_eq!(status.description(), "the server's git_status");
    assert_eq!(status.upstream(), "mcp:git");
    assert_eq!(status.policy().timeout_ms, 20_000, "the server's timeout");

    let commit = catalog.resolve("git/git_commit").expect("listed");
    assert_eq!(commit.semantics(), EffectSemantics::NonIdempotent);
    assert_eq!(commit.semantics_source(), SemanticsSource::Catalog);
    assert!(commit.policy().requires_approval);
    let binding = commit.mcp().expect("an MCP tool");
    assert_eq!(
        (binding.server.as_str(), binding.tool.as_str()),
        ("git", "git_commit")
    );
    assert_eq!(binding.key_argument.as_deref(), Some("idempotency_key"));
    assert_eq!(binding.set_arguments[0].0, "message");
    let lookup = binding.status_check.as_ref().expect("a lookup");
    assert_eq!(lookup.call.tool, "git_log");
    assert!(lookup.contains.is_some());
    assert!(commit.rules().has_status_check);
    // A lookup fits a reconciler's sweep by default: at most 10 s unless it says otherwise.
    assert_eq!(
        commit.status_check().map(|check| check.timeout_ms),
        Some(10_000)
    );
    assert_eq!(commit.dispatch().endpoint.timeout_ms, 20_000);
    assert_eq!(
        commit.dispatch().reference,
        ReferenceSource::JsonPointer("/sha".into())
    );
    assert!(
        status
            .validate_args(&json!({"repo_path": "/srv/repo"}))
            .is_ok()
    );
    assert!(
        status.validate_args(&json!({})).is_err(),
        "the server's schema"
    );
    // The default upstream of the server's tools exists with the default breaker.
    assert!(
        catalog
            .default_upstreams()
            .any(|spec| spec.name == "mcp:git")
    );
}

#[test]
fn a_non_idempotent_tool_without_a_lookup_loads_and_goes_to_a_person_when_unknown() {
    let text = r#"
        [mcp_servers.git]
        command = "mcp-server-git"
        allow = ["git_commit"]
    "#;
    let catalog = Catalog::from_toml_str(text, "mcp.toml")
        .and_then(|c| c.with_mcp_tools(&git_listing()))
        .expect("no allow_unsafe needed");
    let commit = catalog.resolve("git/git_commit").expect("listed");
    assert_eq!(commit.semantics(), EffectSemantics::NonIdempotent);
    assert!(!commit.rules().has_status_check);
    let now = crate::time::Timestamp::from_millis(1_000);
    let mut state = crate::command::CommandState::reserved(now, None, 1_000);
    state.status = crate::command::CommandStatus::Unknown;
    assert!(matches!(
        crate::machine::look_for(&state, &commit.rules(), true, now),
        crate::machine::Look::GiveUp(_)
    ));
}

#[test]
fn load_errors_name_the_file_the_server_and_the_tool() {
    let listing = git_listing();
    for (text, expected) in [
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_push"]"#,
            "mcp.toml: mcp server git: tool git_push: allowed, but the server does not list it",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_log"]
               [mcp_servers.git.tools.git_commit]
               semantics = "IDEMPOTENT""#,
            "mcp.toml: mcp server git: tool git_commit: [mcp_servers.git.tools.git_commit] overrides a tool that is not allowed",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_commit"]
               [mcp_servers.git.tools.git_commit.status_check]
               tool = "git_blame"
               contains = "{idempotency_key}""#,
            "mcp.toml: mcp server git: tool git_commit: status_check.tool: the server lists no tool \"git_blame\"",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_commit"]
               [mcp_servers.git.tools.git_commit]
               semantcs = "IDEMPOTENT""#,
            "mcp.toml: mcp server git: tool git_commit: unknown field `semantcs`",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               url = "http://127.0.0.1:1/mcp"
               allow = ["git_commit"]"#,
            "mcp.toml: mcp server git: declare exactly one of command",
        ),
        (
            r#"[mcp_servers.Git]
               command = "x"
               allow = ["git_commit"]"#,
            "mcp.toml: mcp server Git: the server's name is the namespace of its tools",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = []"#,
            "mcp.toml: mcp server git: allow lists no tool",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               env_credentials = { TOKEN = "nope" }
               allow = ["git_commit"]"#,
            "mcp.toml: mcp server git: env_credentials.TOKEN: credential \"nope\" is not declared",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_commit"]
               [mcp_servers.git.tools.git_commit]
               set_arguments = { message = "{args.nowhere} {idempotency_key}" }"#,
            "mcp.toml: tool git/git_commit: set_arguments",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_status"]
               [mcp_servers.git.tools.git_status.compensate]
               tool = "git_reset""#,
            "mcp.toml: tool git/git_status",
        ),
        (
            r#"[mcp_servers.git]
               command = "x"
               allow = ["git_commit"]
               [mcp_servers.git.tools.git_commit.status_check]
               tool = "git_log"
               contains = "{idempotency_key}"
               matches = "/items""#,
            "mcp.toml: tool git/git_commit: status_check.contains",
        ),
    ] {
        let said = refused(text, &listing);
        assert!(
            said.starts_with(expected),
            "expected {expected:?}, got {said:?}"
        );
    }
}

#[test]
fn a_server_tool_named_like_a_declared_tool_is_refused() {
    let text = r#"
        [[tool]]
        name = "git/git_log"
        semantics = "OBSERVE_ONLY"
        schema = { type = "object" }
        [tool.dispatch]
        url = "http://127.0.0.1:1/log"
        [mcp_servers.git]
        command = "x"
        allow = ["git_log"]
    "#;
    let said = refused(text, &git_listing());
    assert!(
        said.contains("git/git_log") && said.contains("twice"),
        "{said}"
    );
}

#[test]
fn an_http_server_takes_a_header_credential_and_refuses_a_signer() {
    let text = r#"
        [credentials.vendor]
        kind = "bearer"
        token = { env = "VENDOR_TOKEN" }
        [mcp_servers.vendor]
        url = "https://mcp.example.com/mcp"
        credential = "vendor"
        allow = ["git_log"]
    "#;
    let catalog = Catalog::from_toml_str(text, "mcp.toml").expect("valid");
    let McpTransport::Http { url, credential } = &catalog.mcp_servers()[0].transport else {
        panic!("an HTTP server")
    };
    assert_eq!(url, "https://mcp.example.com/mcp");
    assert_eq!(credential.as_ref().map(|c| c.name.as_str()), Some("vendor"));
    let signer = r#"
        [credentials.hooks]
        kind = "standard_webhooks"
        keys = [{ env = "KEYS" }]
        [mcp_servers.vendor]
        url = "https://mcp.example.com/mcp"
        credential = "hooks"
        allow = ["git_log"]
    "#;
    let said = refused(signer, &git_listing());
    assert!(said.contains("bearer, basic or header"), "{said}");
}

/// The memory server's shape: an array of entities, each with an array of observations.
fn memory_listing(min_items: Option<u64>) -> BTreeMap<String, Vec<ListedTool>> {
    let mut entities = json!({
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name", "observations"],
            "properties": {
                "name": {"type": "string"},
                "observations": {"type": "array", "items": {"type": "string"}},
            },
        },
    });
    if let Some(min) = min_items {
        entities["minItems"] = json!(min);
    }
    let tool = |name: &str, schema: serde_json::Value| ListedTool {
        name: name.into(),
        description: None,
        input_schema: schema,
        hints: ToolHints::default(),
    };
    BTreeMap::from([(
        "memory".to_owned(),
        vec![
            tool(
                "create_entities",
                json!({"type": "object", "required": ["entities"], "properties": {"entities": entities}}),
            ),
            tool(
                "open_nodes",
                json!({"type": "object", "required": ["names"], "properties": {"names": {"type": "array", "items": {"type": "string"}}}}),
            ),
        ],
    )])
}

const MEMORY: &str = r#"
    [mcp_servers.memory]
    command = "mcp-server-memory"
    allow = ["create_entities"]
    [mcp_servers.memory.tools.create_entities]
    set_arguments = { "/entities/0/observations/-" = "Sluice-Key: {idempotency_key}" }
    [mcp_servers.memory.tools.create_entities.status_check]
    tool = "open_nodes"
    arguments = { names = ["{args.entities.0.name}"] }
    contains = "Sluice-Key: {idempotency_key}"
"#;

#[test]
fn templates_index_arrays_the_schema_guarantees_and_rewrites_reach_inside_the_arguments() {
    let catalog = Catalog::from_toml_str(MEMORY, "mcp.toml")
        .and_then(|c| c.with_mcp_tools(&memory_listing(Some(1))))
        .expect("entity 0 is there by minItems");
    let create = catalog.resolve("memory/create_entities").expect("listed");
    let binding = create.mcp().expect("an MCP tool");
    assert_eq!(binding.set_arguments[0].0, "/entities/0/observations/-");
    // In text, an item the schema does not promise is refused as an optional field would be.
    let text = MEMORY.replace(
        r#"names = ["{args.entities.0.name}"]"#,
        r#"names = ["entity {args.entities.0.name}"]"#,
    );
    let said = refused(&text, &memory_listing(None));
    assert!(said.contains("entities.0.name"), "{said}");
    // A whole value may be missing: left out when the arguments lack it.
    assert!(
        Catalog::from_toml_str(MEMORY, "mcp.toml")
            .and_then(|c| c.with_mcp_tools(&memory_listing(None)))
            .is_ok()
    );
}

#[test]
fn an_mcp_tool_takes_its_own_rules_and_the_catalog_rules_that_cover_it() {
    let text = r#"
        [[rule]]
        name = "no-git-on-main"
        tools = ["git/*"]
        when = "args.repo_path == '/srv/main'"
        then = "deny"
        [[rule]]
        name = "payments-only"
        tools = ["payments/*"]
        when = "true"
        then = "deny"
        [mcp_servers.git]
        command = "mcp-server-git"
        allow = ["git_commit"]
        [[mcp_servers.git.tools.git_commit.rule]]
        name = "long-message"
        when = "args.message.size() > 1000"
        then = "require_approval"
    "#;
    let catalog = Catalog::from_toml_str(text, "mcp.toml")
        .and_then(|c| c.with_mcp_tools(&git_listing()))
        .expect("valid");
    let commit = catalog.resolve("git/git_commit").expect("listed");
    let names: Vec<&str> = commit
        .policy_rules()
        .iter()
        .map(|rule| rule.name())
        .collect();
    assert_eq!(names, ["long-message", "no-git-on-main"]);
}

#[test]
fn a_budget_counts_an_mcp_tool_once_its_server_is_listed() {
    let budget = r#"
    [budgets.daily]
    tools = ["pay/*"]
    scope = "tenant"
    window = "day"
    limits = { EUR = 10000 }
    on_exceed = "deny"
    "#;
    let server = r#"
    [mcp_servers.pay]
    command = "pay-server"
    allow = ["charge"]
    "#;
    let money = "\n    [mcp_servers.pay.tools.charge.money.amount]\n    currency = \"EUR\"\n    minor_units = 2\n";
    let mut charge = listed("charge", ToolHints::default());
    charge.input_schema = json!({
        "type": "object",
        "required": ["amount"],
        "properties": {"amount": {"type": "integer"}},
    });
    let listing = BTreeMap::from([("pay".to_owned(), vec![charge])]);

    let catalog = Catalog::from_toml_str(&format!("{server}{money}{budget}"), "mcp.toml")
        .expect("a budget over tools still to be listed loads")
        .with_mcp_tools(&listing)
        .expect("valid once listed");
    assert_eq!(
        catalog.budgets()[0].fields.get("pay/charge"),
        Some(&("amount".to_owned(), "EUR".to_owned()))
    );

    let refusal = refused(&format!("{server}{budget}"), &listing);
    assert!(refusal.contains("daily"), "{refusal}");
    assert!(
        refusal.contains("declares no [tool.money] field"),
        "{refusal}"
    );
}
