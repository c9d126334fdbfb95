//! The builder of a server's tools: one allowed tool from what the server listed for it and
//! the catalog's overrides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::{
    ListedTool, McpBinding, McpCall, McpLookup, McpServer, OnError, SemanticsSource,
    semantics_from_hints,
};
use crate::catalog::DEFAULT_REFERENCE_POINTER;
use crate::catalog::args::FieldUse;
use crate::catalog::build::{
    At, build_answers, build_business_key, build_policy, check_pointer, compile_schema,
    parse_template, toml_to_json,
};
use crate::catalog::endpoint::{
    DispatchConnector, EndpointContext, HttpEndpoint, HttpMethod, ReferenceSource, Section,
    StatusAnswers, check_placeholder,
};
use crate::catalog::error::CatalogError;
use crate::catalog::raw::{RawEndpoint, RawPolicy, describe};
use crate::catalog::shape::{BodyTemplate, ContentType, RequestShape, Use};
use crate::catalog::template::Template;
use crate::catalog::tool::{Joins, Tool};
use crate::command::EffectSemantics;
use crate::ids::ToolName;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::catalog) struct RawMcpTool {
    semantics: Option<EffectSemantics>,
    description: Option<String>,
    business_key: Option<String>,
    key_argument: Option<String>,
    #[serde(default)]
    set_arguments: BTreeMap<String, toml::Value>,
    on_error: Option<OnError>,
    reference_pointer: Option<String>,
    upstream: Option<String>,
    #[serde(default)]
    policy: RawPolicy,
    #[serde(default)]
    money: BTreeMap<String, crate::catalog::money::Money>,
    #[serde(default)]
    events: crate::catalog::events::RawEvents,
    status_check: Option<RawMcpLookup>,
    compensate: Option<RawMcpCall>,
    /// `[[mcp_servers.<name>.tools.<tool>.rule]]`: its policy rules, as `[[tool.rule]]`.
    #[serde(default)]
    rule: Vec<toml::Table>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpLookup {
    tool: String,
    #[serde(default)]
    arguments: toml::Table,
    timeout_ms: Option<u64>,
    contains: Option<String>,
    matches: Option<String>,
    match_where: Option<BTreeMap<String, String>>,
    match_reference_pointer: Option<String>,
    count: Option<String>,
    reference_pointer: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcpCall {
    tool: String,
    #[serde(default)]
    arguments: toml::Table,
    timeout_ms: Option<u64>,
}

/// The address an MCP tool's endpoints show (`mcp://git/git_commit`): never sent anywhere.
fn endpoint(server: &str, tool: &str, timeout_ms: u64) -> Result<HttpEndpoint, CatalogError> {
    Ok(HttpEndpoint {
        url: Template::parse(&format!("mcp://{server}/{tool}")).map_err(|problem| {
            CatalogError::McpTool {
                file: String::new(),
                server: server.to_owned(),
                tool: tool.to_owned(),
                detail: problem.to_string(),
            }
        })?,
        method: HttpMethod::Post,
        timeout_ms,
        shape: RequestShape {
            content_type: ContentType::Json,
            body: None,
            headers: Vec::new(),
            query: Vec::new(),
            idempotency_header: None,
            credentials: Vec::new(),
        },
    })
}

/// An arguments table as a template, its placeholders checked for `section`.
fn arguments(
    at: &At<'_>,
    section: Section,
    key: &'static str,
    table: toml::Table,
    context: &EndpointContext<'_>,
) -> Result<BodyTemplate, CatalogError> {
    let bad = |detail: String| CatalogError::BadShape {
        file: at.file(),
        tool: at.tool(),
        key: key.to_owned(),
        detail,
    };
    let json = toml_to_json(&toml::Value::Table(table)).map_err(bad)?;
    let template = BodyTemplate::parse(&json)
        .map_err(|(pointer, problem)| bad(format!("{problem} in the string at {pointer}")))?;
    for (name, usage) in template.placeholders() {
        let usage = match usage {
            Use::Text => FieldUse::Text,
            Use::Whole | Use::WholeScalar => FieldUse::Whole,
        };
        check_placeholder(at, section, key, name, usage, context)?;
    }
    Ok(template)
}

/// Builds one allowed tool of `server` from what the server listed for it. `listed` names
/// every tool the server listed (a lookup or compensation may use one that is not allowed).
pub(in crate::catalog) fn build_mcp_tool(
    server: &McpServer,
    tool: &ListedTool,
    listed: &BTreeSet<&str>,
    file: &str,
    clock_skew_ms: u64,
) -> Result<Tool, CatalogError> {
    let label = format!("{}/{}", server.name, tool.name);
    let name =
        ToolName::from_parts(&server.name, &tool.name).map_err(|error| CatalogError::McpTool {
            file: file.to_owned(),
            server: server.name.clone(),
            tool: tool.name.clone(),
            detail: format!("its name cannot be a catalog tool's ({label}): {error}"),
        })?;
    let at = At { file, tool: &name };
    let table = server
        .overrides
        .get(&tool.name)
        .cloned()
        .unwrap_or_default();
    let mut raw = RawMcpTool::deserialize(toml::Value::Table(table)).map_err(|error| {
        CatalogError::McpTool {
            file: file.to_owned(),
            server: server.name.clone(),
            tool: tool.name.clone(),
            detail: describe(&error),
        }
    })?;

    let schema = tool.input_schema.clone();
    let validator = compile_schema(&at, &schema, "inputSchema")?;
    if schema.get("type") != Some(&Value::String("object".into())) {
        return Err(CatalogError::SchemaNotObject {
            file: at.file(),
            tool: at.tool(),
            key: "inputSchema",
        });
    }
    let (semantics, semantics_source) = match raw.semantics {
        Some(semantics) => (semantics, SemanticsSource::Catalog),
        None => (
            semantics_from_hints(&tool.hints),
            SemanticsSource::Annotation,
        ),
    };
    let business_key = build_business_key(&at, raw.business_key.take(), &schema)?;
    // The server's timeout is the call's unless the tool's policy names one.
    let timeout_ms = raw.policy.timeout_ms.unwrap_or(server.timeout_ms);
    raw.policy.timeout_ms = Some(timeout_ms);
    // A server's calls may be slow (a program started on first use, a model behind it): the
    // lease and the last look follow its timeout when the tool does not set them, so a
    // `timeout_ms` alone is a valid declaration.
    let defaults = crate::machine::Rules::defaults(semantics);
    let millis = |ms: i64| u64::try_from(ms).unwrap_or(0);
    let reach = timeout_ms.saturating_add(clock_skew_ms);
    if raw.policy.lease_ttl_ms.is_none() && millis(defaults.lease_ttl_ms) <= reach {
        raw.policy.lease_ttl_ms = Some(reach.saturating_add(timeout_ms));
    }
    let settle_ms = raw.policy.settle_ms.unwrap_or(millis(defaults.settle_ms));
    let landing = raw
        .policy
        .late_commit_ms
        .unwrap_or(timeout_ms)
        .saturating_add(clock_skew_ms)
        .saturating_add(settle_ms);
    if raw.policy.verify_after_ms.is_none() && millis(defaults.verify_after_ms) < landing {
        raw.policy.verify_after_ms = Some(landing);
    }
    let policy = build_policy(&at, raw.policy, semantics, &schema)?;
    let rules = crate::catalog::rules::build_tool_rules(raw.rule, file, &name)?;
    let money = crate::catalog::money::build_money(&at, raw.money, &schema)?;
    let event_args = crate::catalog::events::build_events(&at, raw.events, &schema)?;
    for (flag, key) in [
        (policy.verify_after_commit, "policy.verify_after_commit"),
        (policy.verify_after_refusal, "policy.verify_after_refusal"),
    ] {
        if flag && raw.status_check.is_none() {
            return Err(CatalogError::MalformedTool {
                file: at.file(),
                tool: at.tool(),
                detail: format!("{key} needs a status_check to look the effect up"),
            });
        }
    }
    let context = EndpointContext {
        schema: &schema,
        policy: &policy,
        has_business_key: business_key.is_some(),
        credentials: &BTreeMap::new(),
        tool_credential: &[],
        // An MCP tool's call is the server's to answer; it is never given a callback URL.
        is_async: false,
    };

    let mut set_arguments = Vec::with_capacity(raw.set_arguments.len());
    for (argument, value) in raw.set_arguments {
        let bad = |detail: String| CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: format!("set_arguments.{argument}"),
            detail,
        };
        if argument.is_empty() {
            return Err(bad("names no argument".into()));
        }
        if argument.starts_with('/') {
            check_pointer(&at, "set_arguments", &argument)?;
        }
        let json = toml_to_json(&value).map_err(bad)?;
        let template = BodyTemplate::parse(&json)
            .map_err(|(pointer, problem)| bad(format!("{problem} in the string at {pointer}")))?;
        for (placeholder, usage) in template.placeholders() {
            let usage = match usage {
                Use::Text => FieldUse::Text,
                Use::Whole | Use::WholeScalar => FieldUse::Whole,
            };
            check_placeholder(
                &at,
                Section::Dispatch,
                "set_arguments",
                placeholder,
                usage,
                &context,
            )?;
        }
        set_arguments.push((argument, template));
    }
    if let Some(argument) = &raw.key_argument {
        if argument.is_empty() {
            return Err(CatalogError::BadShape {
                file: at.file(),
                tool: at.tool(),
                key: "key_argument".into(),
                detail: "names no argument".into(),
            });
        }
        if argument.starts_with('/') {
            check_pointer(&at, "key_argument", argument)?;
        }
        if set_arguments.iter().any(|(name, _)| name == argument) {
            return Err(CatalogError::BadShape {
                file: at.file(),
                tool: at.tool(),
                key: "key_argument".into(),
                detail: format!("{argument} is also rewritten by set_arguments"),
            });
        }
    }
    let reference_pointer = raw
        .reference_pointer
        .take()
        .unwrap_or_else(|| DEFAULT_REFERENCE_POINTER.to_owned());
    check_pointer(&at, "reference_pointer", &reference_pointer)?;
    let reference = ReferenceSource::JsonPointer(reference_pointer);

    let sibling = |key: &str, named: &str| -> Result<(), CatalogError> {
        if listed.contains(named) {
            Ok(())
        } else {
            Err(CatalogError::McpTool {
                file: file.to_owned(),
                server: server.name.clone(),
                tool: tool.name.clone(),
                detail: format!(
                    "{key}.tool: the server lists no tool {named:?} (it lists {})",
                    listed.iter().copied().collect::<Vec<_>>().join(", ")
                ),
            })
        }
    };
    let (lookup, status_answers, status_endpoint) = match raw.status_check {
        None => (None, StatusAnswers::default(), None),
        Some(check) => {
            sibling("status_check", &check.tool)?;
            let call = McpCall {
                arguments: arguments(
                    &at,
                    Section::StatusCheck,
                    "status_check.arguments",
                    check.arguments,
                    &context,
                )?,
                tool: check.tool,
            };
            let json_rules = check.matches.is_some()
                || check.count.is_some()
                || check.match_where.is_some()
                || check.match_reference_pointer.is_some()
                || check.reference_pointer.is_some();
            let contains = match check.contains {
                Some(_) if json_rules => {
                    return Err(CatalogError::BadShape {
                        file: at.file(),
                        tool: at.tool(),
                        key: "status_check.contains".into(),
                        detail: "contains reads a text answer; matches, match_where, match_reference_pointer, count and reference_pointer read a JSON one: set one kind".into(),
                    });
                }
                Some(text) => {
                    let template = parse_template(&at, "status_check.contains", &text)?;
                    if template.placeholders().next().is_none() {
                        return Err(CatalogError::BadShape {
                            file: at.file(),
                            tool: at.tool(),
                            key: "status_check.contains".into(),
                            detail: "names no key or argument, so every answer would hold it: include {idempotency_key} (or what set_arguments wrote)".into(),
                        });
                    }
                    for placeholder in template.placeholders() {
                        check_placeholder(
                            &at,
                            Section::StatusCheck,
                            "status_check.contains",
                            placeholder,
                            FieldUse::Text,
                            &context,
                        )?;
                    }
                    Some(template)
                }
                None => None,
            };
            let mut rules = RawEndpoint {
                url: String::new(),
                method: None,
                timeout_ms: None,
                content_type: None,
                body: None,
                headers: BTreeMap::new(),
                query: BTreeMap::new(),
                idempotency_header: None,
                credential: None,
                reference_pointer: check.reference_pointer,
                reference_header: None,
                in_progress_status: None,
                require_reference: None,
                absent_status: None,
                duplicate_status: None,
                matches: check.matches,
                match_reference_pointer: check.match_reference_pointer,
                count: check.count,
                match_where: check.match_where,
                done_status: None,
            };
            let answers = build_answers(&at, &mut rules, &reference, &context)?;
            // A lookup is a read that a reconciler's sweep must fit
            // (`sweep::looks_that_do_not_fit`): the server's timeout, at most the default
            // timeout of a tool, unless the lookup names its own.
            let timeout_ms = check
                .timeout_ms
                .unwrap_or(server.timeout_ms.min(crate::catalog::DEFAULT_TIMEOUT_MS));
            let shown = endpoint(&server.name, &call.tool, timeout_ms)?;
            (Some(McpLookup { call, contains }), answers, Some(shown))
        }
    };
    let (compensate, compensate_endpoint) = match raw.compensate {
        None => (None, None),
        Some(undo) => {
            sibling("compensate", &undo.tool)?;
            let call = McpCall {
                arguments: arguments(
                    &at,
                    Section::Compensate,
                    "compensate.arguments",
                    undo.arguments,
                    &context,
                )?,
                tool: undo.tool,
            };
            let timeout_ms = undo.timeout_ms.unwrap_or(server.timeout_ms);
            let shown = endpoint(&server.name, &call.tool, timeout_ms)?;
            (Some(call), Some(shown))
        }
    };
    if semantics == EffectSemantics::ObserveOnly && compensate.is_some() {
        return Err(CatalogError::CompensateOnObserveOnly {
            file: at.file(),
            tool: at.tool(),
        });
    }
    let require_reference = compensate.as_ref().is_some_and(|call| {
        call.arguments
            .placeholders()
            .iter()
            .any(|(name, _)| *name == "external_ref")
    });
    let (upstream, joins) = match raw.upstream {
        Some(named) => (named, Joins::Named),
        None => (format!("mcp:{}", server.name), Joins::ByDefault),
    };
    let dispatch = DispatchConnector {
        endpoint: endpoint(&server.name, &tool.name, policy.timeout_ms)?,
        reference,
        in_progress_status: Vec::new(),
        require_reference,
    };
    let description = raw
        .description
        .or_else(|| tool.description.clone())
        .unwrap_or_default();
    Ok(Tool {
        name,
        description,
        semantics,
        schema,
        validator: Arc::new(validator),
        business_key,
        policy,
        dispatch,
        status_check: status_endpoint,
        status_answers,
        compensate: compensate_endpoint,
        compensate_done_status: Vec::new(),
        // A NON_IDEMPOTENT MCP tool without a lookup is allowed: its unknown outcome goes to
        // a person (the machine's `look_for`), never to a blind second call.
        allow_unsafe: false,
        clock_skew_ms,
        upstream,
        joins,
        money,
        event_args: Arc::from(event_args),
        rules: Arc::from(rules),
        // An MCP server's tool answers in its own result: no webhook evidence.
        evidence: None,
        asynchronous: None,
        uses_callback_url: false,
        mcp: Some(Arc::new(McpBinding {
            server: server.name.clone(),
            tool: tool.name.clone(),
            key_argument: raw.key_argument,
            set_arguments,
            on_error: raw.on_error.unwrap_or_default(),
            status_check: lookup,
            compensate,
            semantics_source,
            hints: tool.hints.clone(),
        })),
    })
}
