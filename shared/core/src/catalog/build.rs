//! Building a [`Tool`] from its raw TOML entry: every rule a tool must satisfy to load.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::args::{FieldUse, check_field};
use super::credential::Credential;
use super::endpoint::{
    DispatchConnector, EndpointContext, MatchList, ReferenceSource, Section, StatusAnswers,
    build_endpoint, check_placeholder, is_header_name,
};
use super::error::CatalogError;
use super::raw::{OneOrMany, RawEndpoint, RawPolicy, RawTool, describe};
pub(super) use super::schema::{compile_schema, load_schema, toml_to_json};
use super::template::Template;
use super::tool::{Tool, ToolPolicy};
use super::variables::Variables;
use super::{
    DEFAULT_MAX_CLOCK_SKEW_MS, DEFAULT_REFERENCE_POINTER, DEFAULT_TIMEOUT_MS, SchemaReader,
};
use crate::command::EffectSemantics;
use crate::error::IdError;
use crate::ids::ToolName;
use crate::machine::Rules;

/// A lease must outlast the whole call, measured on clocks that may disagree by the skew bound;
/// the last look must come after a late attempt can land and lookups have caught up.
pub(super) fn check_lease(tool: &Tool, file: &str) -> Result<(), CatalogError> {
    let timeout_ms = tool.dispatch.endpoint.timeout_ms;
    if tool.policy.lease_ttl_ms <= timeout_ms.saturating_add(tool.clock_skew_ms) {
        return Err(CatalogError::LeaseShorterThanTimeout {
            file: file.to_owned(),
            tool: tool.name.to_string(),
            lease_ttl_ms: tool.policy.lease_ttl_ms,
            timeout_ms,
            skew_ms: tool.clock_skew_ms,
        });
    }
    let rules = tool.rules();
    let landing = rules
        .late_commit_ms
        .saturating_add(rules.clock_skew_ms)
        .saturating_add(rules.settle_ms);
    if rules.verify_after_ms < landing {
        return Err(CatalogError::VerifyBeforeLanding {
            file: file.to_owned(),
            tool: tool.name.to_string(),
            verify_after_ms: tool.policy.verify_after_ms,
            landing_ms: u64::try_from(landing).unwrap_or(u64::MAX),
        });
    }
    Ok(())
}

/// Error context of one tool: the file and the tool's resolved name.
pub(super) struct At<'a> {
    pub(super) file: &'a str,
    pub(super) tool: &'a ToolName,
}

impl At<'_> {
    pub(super) fn file(&self) -> String {
        self.file.to_owned()
    }

    pub(super) fn tool(&self) -> String {
        self.tool.to_string()
    }
}

pub(super) fn build_tool(
    entry: toml::Table,
    position: usize,
    file: &str,
    default_namespace: &str,
    schemas: Option<SchemaReader<'_>>,
    credentials: &BTreeMap<String, Arc<Credential>>,
    variables: &Variables,
) -> Result<Tool, CatalogError> {
    // Name the entry by its raw name if it has one, so shape errors point at the right tool.
    let label = match entry.get("name").and_then(toml::Value::as_str) {
        Some(name) => name.to_owned(),
        None => format!("#{position}"),
    };
    let raw = RawTool::deserialize(toml::Value::Table(entry)).map_err(|error| {
        CatalogError::MalformedTool {
            file: file.to_owned(),
            tool: label.clone(),
            detail: describe(&error),
        }
    })?;
    let name = ToolName::resolve(&raw.name, default_namespace).map_err(|error| {
        CatalogError::BadToolName {
            file: file.to_owned(),
            tool: label.clone(),
            why: match error {
                IdError::ToolName { why, .. } => why.to_owned(),
                other => other.to_string(),
            },
        }
    })?;
    let at = At { file, tool: &name };
    let name_text = name.to_string();

    let (schema, schema_key) = load_schema(&at, raw.schema, raw.schema_file, schemas)?;
    let validator = compile_schema(&at, &schema, schema_key)?;
    if schema.get("type") != Some(&Value::String("object".into())) {
        return Err(CatalogError::SchemaNotObject {
            file: at.file(),
            tool: at.tool(),
            key: schema_key,
        });
    }

    let business_key = build_business_key(&at, raw.business_key, &schema)?;

    let policy = build_policy(&at, raw.policy, raw.semantics, &schema)?;
    let money = super::money::build_money(&at, raw.money, &schema)?;
    let event_args = super::events::build_events(&at, raw.events, &schema)?;
    let rules = super::rules::build_tool_rules(raw.rule, file, &name)?;
    let evidence = raw
        .evidence
        .map(super::evidence::build_tool_evidence)
        .transpose()
        .map_err(|detail| CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail,
        })?;
    let asynchronous = raw
        .asynchronous
        .map(|raw_async| {
            super::asynchronous::build_tool_async(
                raw_async,
                raw.status_check.is_some(),
                evidence.is_some(),
            )
        })
        .transpose()
        .map_err(|detail| CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail,
        })?;
    if policy.verify_after_refusal && raw.status_check.is_none() {
        return Err(CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail:
                "policy.verify_after_refusal needs a [tool.status_check] to look the refusal up"
                    .into(),
        });
    }
    if policy.verify_after_commit && raw.status_check.is_none() {
        return Err(CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail: "policy.verify_after_commit needs a [tool.status_check] to look the commit up"
                .into(),
        });
    }

    let Some(mut dispatch) = raw.dispatch else {
        return Err(CatalogError::MissingDispatch {
            file: at.file(),
            tool: at.tool(),
        });
    };
    let tool_credential = raw.credential.map(OneOrMany::into_vec).unwrap_or_default();
    let context = EndpointContext {
        schema: &schema,
        policy: &policy,
        has_business_key: business_key.is_some(),
        credentials,
        tool_credential: &tool_credential,
        is_async: asynchronous.is_some(),
    };
    let mut status_check = raw.status_check;
    let mut compensate = raw.compensate;
    // `${variable}`s are the catalog's own text: expanded before anything checks a URL, a
    // body, a header or a query value.
    for (name, section) in [
        ("dispatch", Some(&mut dispatch)),
        ("status_check", status_check.as_mut()),
        ("compensate", compensate.as_mut()),
    ] {
        if let Some(section) = section {
            expand_section(&at, name, section, variables)?;
        }
    }
    only_in(
        &at,
        Section::StatusCheck,
        status_check.as_ref(),
        &DISPATCH_ONLY,
        "[tool.dispatch]",
    )?;
    only_in(
        &at,
        Section::Compensate,
        compensate.as_ref(),
        &DISPATCH_ONLY,
        "[tool.dispatch]",
    )?;
    only_in(
        &at,
        Section::Dispatch,
        Some(&dispatch),
        &STATUS_CHECK_ONLY,
        "[tool.status_check]",
    )?;
    only_in(
        &at,
        Section::Compensate,
        compensate.as_ref(),
        &STATUS_CHECK_ONLY,
        "[tool.status_check]",
    )?;
    for (section, raw) in [
        (Section::Dispatch, Some(&dispatch)),
        (Section::StatusCheck, status_check.as_ref()),
    ] {
        only_in(&at, section, raw, &COMPENSATE_ONLY, "[tool.compensate]")?;
    }
    if compensate
        .as_ref()
        .is_some_and(|raw| raw.reference_pointer.is_some())
    {
        return Err(CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: "compensate.reference_pointer".into(),
            detail: "a compensation's reference is read as the dispatch's; set reference_pointer on [tool.dispatch]".into(),
        });
    }

    let reference = match (
        dispatch.reference_pointer.take(),
        dispatch.reference_header.take(),
    ) {
        (Some(_), Some(_)) => {
            return Err(CatalogError::ReferenceChoice {
                file: at.file(),
                tool: at.tool(),
            });
        }
        (Some(pointer), None) => {
            check_pointer(&at, "dispatch.reference_pointer", &pointer)?;
            ReferenceSource::JsonPointer(pointer)
        }
        (None, Some(header)) => {
            if !is_header_name(&header) {
                return Err(CatalogError::BadReferenceHeader {
                    file: at.file(),
                    tool: at.tool(),
                    header,
                });
            }
            ReferenceSource::Header(header)
        }
        (None, None) => ReferenceSource::JsonPointer(DEFAULT_REFERENCE_POINTER.to_owned()),
    };
    let in_progress_status = dispatch.in_progress_status.take().unwrap_or_default();
    // 408, 425 and 429 are ambiguous already; other codes here would turn a success or a
    // server error into something it is not.
    if let Some(&status) = in_progress_status
        .iter()
        .find(|status| !(400..=499).contains(*status))
    {
        return Err(CatalogError::BadInProgressStatus {
            file: at.file(),
            tool: at.tool(),
            status,
        });
    }
    let explicit_require_reference = dispatch.require_reference.take();
    let dispatch_endpoint = build_endpoint(&at, Section::Dispatch, &mut dispatch, &context)?;
    let status_answers = match status_check.as_mut() {
        Some(raw) => build_answers(&at, raw, &reference, &context)?,
        None => StatusAnswers::default(),
    };
    let status_check = status_check
        .as_mut()
        .map(|raw| build_endpoint(&at, Section::StatusCheck, raw, &context))
        .transpose()?;
    let compensate_done_status = compensate
        .as_mut()
        .and_then(|raw| raw.done_status.take())
        .unwrap_or_default();
    if let Some(status) = compensate_done_status
        .iter()
        .find(|status| !(400..=499).contains(*status) || matches!(status, 408 | 425 | 429))
    {
        return Err(CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: "compensate.done_status".into(),
            detail: format!(
                "{status} is not a refusal (a 4xx other than 408, 425, 429): list the statuses that mean the commit is already undone, such as 404 for a DELETE"
            ),
        });
    }
    let compensate = compensate
        .as_mut()
        .map(|raw| build_endpoint(&at, Section::Compensate, raw, &context))
        .transpose()?;
    // A compensation that names the commit's reference can only be sent for a commit whose
    // reference is known: such a tool requires one unless it says otherwise.
    let compensate_needs_reference = compensate
        .as_ref()
        .is_some_and(|endpoint| endpoint.names("external_ref"));
    // Known once, so a dispatch of any other tool costs no signature (`crate::callback`).
    let uses_callback_url = dispatch_endpoint.names("callback_url");
    let dispatch = DispatchConnector {
        endpoint: dispatch_endpoint,
        reference,
        in_progress_status,
        require_reference: explicit_require_reference.unwrap_or(compensate_needs_reference),
    };

    match raw.semantics {
        EffectSemantics::NonIdempotent
            if business_key.is_none()
                && status_check.is_none()
                && compensate.is_none()
                && !raw.allow_unsafe =>
        {
            return Err(CatalogError::UnsafeNonIdempotent {
                file: at.file(),
                tool: at.tool(),
            });
        }
        EffectSemantics::ObserveOnly if compensate.is_some() => {
            return Err(CatalogError::CompensateOnObserveOnly {
                file: at.file(),
                tool: at.tool(),
            });
        }
        EffectSemantics::Idempotent
        | EffectSemantics::NonIdempotent
        | EffectSemantics::ObserveOnly => {}
    }

    let (upstream, joins) = super::upstream::joins(
        raw.upstream,
        raw.breaker,
        dispatch.endpoint.url.as_str(),
        &name_text,
    )
    .map_err(|detail| CatalogError::MalformedTool {
        file: at.file(),
        tool: at.tool(),
        detail,
    })?;
    Ok(Tool {
        name,
        description: raw.description,
        semantics: raw.semantics,
        schema,
        validator: Arc::new(validator),
        business_key,
        policy,
        dispatch,
        status_check,
        status_answers,
        compensate,
        compensate_done_status,
        allow_unsafe: raw.allow_unsafe,
        clock_skew_ms: DEFAULT_MAX_CLOCK_SKEW_MS,
        upstream,
        joins,
        money,
        event_args: Arc::from(event_args),
        mcp: None,
        rules: Arc::from(rules),
        evidence: evidence.map(Arc::new),
        asynchronous: asynchronous.map(Arc::new),
        uses_callback_url,
    })
}

/// A tool's `business_key` template, every field it names a required text field of `schema`.
pub(super) fn build_business_key(
    at: &At<'_>,
    text: Option<String>,
    schema: &Value,
) -> Result<Option<Template>, CatalogError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let template = parse_template(at, "business_key", &text)?;
    for field in template.placeholders() {
        check_field(at, "business_key", field, schema, FieldUse::Text)?;
    }
    Ok(Some(template))
}

pub(super) fn parse_template(
    at: &At<'_>,
    key: &'static str,
    text: &str,
) -> Result<Template, CatalogError> {
    Template::parse(text).map_err(|problem| CatalogError::BadTemplate {
        file: at.file(),
        tool: at.tool(),
        key,
        template: text.to_owned(),
        problem,
    })
}

/// The largest `policy.max_rate_limited_ms` a catalog may declare: a day.
const MAX_RATE_LIMITED_MS: u64 = 86_400_000;

pub(super) fn build_policy(
    at: &At<'_>,
    raw: RawPolicy,
    semantics: EffectSemantics,
    schema: &Value,
) -> Result<ToolPolicy, CatalogError> {
    let defaults = Rules::defaults(semantics);
    let millis = |ms: i64| u64::try_from(ms).unwrap_or(0);
    let policy = ToolPolicy {
        requires_approval: raw.requires_approval,
        approve_above: raw.approve_above,
        max_attempts: raw.max_attempts.unwrap_or(defaults.max_attempts),
        timeout_ms: raw.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
        max_checks: raw.max_checks.unwrap_or(defaults.max_checks),
        max_replays: raw.max_replays.unwrap_or(defaults.max_replays),
        settle_ms: raw.settle_ms.unwrap_or(millis(defaults.settle_ms)),
        on_absent: raw.on_absent.unwrap_or(defaults.on_absent),
        lease_ttl_ms: raw.lease_ttl_ms.unwrap_or(millis(defaults.lease_ttl_ms)),
        verify_after_commit: raw.verify_after_commit,
        verify_after_refusal: raw.verify_after_refusal,
        late_commit_ms: raw.late_commit_ms,
        verify_after_ms: raw
            .verify_after_ms
            .unwrap_or(millis(defaults.verify_after_ms)),
        idempotency_key_ttl_ms: raw.idempotency_key_ttl_ms,
        max_rate_limited_ms: raw
            .max_rate_limited_ms
            .unwrap_or(millis(defaults.max_rate_limited_ms)),
        rate_limited_commits_nothing: raw.rate_limited_commits_nothing,
        approval_timeout_ms: raw
            .approval_timeout_ms
            .unwrap_or(millis(defaults.approval_timeout_ms)),
    };
    if policy.max_rate_limited_ms > MAX_RATE_LIMITED_MS {
        return Err(CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail: format!(
                "policy.max_rate_limited_ms is {} ms; at most {MAX_RATE_LIMITED_MS} (a day): a command waiting longer on Retry-After answers is an outage for a person, not a wait (0 turns the waiting off)",
                policy.max_rate_limited_ms
            ),
        });
    }
    if policy.verify_after_ms < policy.settle_ms {
        return Err(CatalogError::VerifyBeforeSettle {
            file: at.file(),
            tool: at.tool(),
            verify_after_ms: policy.verify_after_ms,
            settle_ms: policy.settle_ms,
        });
    }
    for (key, value) in [
        ("policy.max_attempts", u64::from(policy.max_attempts)),
        ("policy.max_checks", u64::from(policy.max_checks)),
        ("policy.timeout_ms", policy.timeout_ms),
        ("policy.lease_ttl_ms", policy.lease_ttl_ms),
        ("policy.approval_timeout_ms", policy.approval_timeout_ms),
    ] {
        if value == 0 {
            return Err(CatalogError::Zero {
                file: at.file(),
                tool: at.tool(),
                key,
            });
        }
    }
    if let Some(threshold) = &policy.approve_above {
        check_field(
            at,
            "policy.approve_above.field",
            &threshold.field,
            schema,
            FieldUse::Number,
        )?;
    }
    Ok(policy)
}

/// Keys a section's raw table may set only in [tool.dispatch].
/// A key of one section only, and whether a raw section sets it.
type SectionKey = (&'static str, fn(&RawEndpoint) -> bool);

const DISPATCH_ONLY: [SectionKey; 3] = [
    ("reference_header", |raw| raw.reference_header.is_some()),
    ("in_progress_status", |raw| raw.in_progress_status.is_some()),
    ("require_reference", |raw| raw.require_reference.is_some()),
];

/// Keys a section's raw table may set only in [tool.status_check].
const STATUS_CHECK_ONLY: [SectionKey; 6] = [
    ("match_where", |raw| raw.match_where.is_some()),
    ("absent_status", |raw| raw.absent_status.is_some()),
    ("duplicate_status", |raw| raw.duplicate_status.is_some()),
    ("matches", |raw| raw.matches.is_some()),
    ("match_reference_pointer", |raw| {
        raw.match_reference_pointer.is_some()
    }),
    ("count", |raw| raw.count.is_some()),
];

/// Keys a section's raw table may set only in [tool.compensate].
const COMPENSATE_ONLY: [SectionKey; 1] = [("done_status", |raw| raw.done_status.is_some())];

/// Refuses a key of `keys` set in `section`, naming the section it belongs to.
fn only_in(
    at: &At<'_>,
    section: Section,
    raw: Option<&RawEndpoint>,
    keys: &[SectionKey],
    owner: &str,
) -> Result<(), CatalogError> {
    let Some(raw) = raw else { return Ok(()) };
    match keys.iter().find(|(_, set)| set(raw)) {
        Some((key, _)) => Err(CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: format!("{}.{key}", section.name()),
            detail: format!("{key} applies only to {owner}"),
        }),
        None => Ok(()),
    }
}

/// A JSON pointer: empty (the whole document) or starting with `/`.
pub(super) fn check_pointer(at: &At<'_>, key: &str, pointer: &str) -> Result<(), CatalogError> {
    if pointer.is_empty() || pointer.starts_with('/') {
        return Ok(());
    }
    if key == "dispatch.reference_pointer" {
        return Err(CatalogError::BadReferencePointer {
            file: at.file(),
            tool: at.tool(),
            pointer: pointer.to_owned(),
        });
    }
    Err(CatalogError::BadShape {
        file: at.file(),
        tool: at.tool(),
        key: key.to_owned(),
        detail: format!("{pointer:?} is not a JSON pointer (empty, or starting with /)"),
    })
}

/// How the status check's answers are read: what the tool declares, nothing more.
pub(super) fn build_answers(
    at: &At<'_>,
    raw: &mut RawEndpoint,
    dispatch_reference: &ReferenceSource,
    context: &EndpointContext<'_>,
) -> Result<StatusAnswers, CatalogError> {
    let bad = |key: &str, detail: String| CatalogError::BadShape {
        file: at.file(),
        tool: at.tool(),
        key: format!("status_check.{key}"),
        detail,
    };
    let absent_status = raw.absent_status.take().unwrap_or_default();
    let duplicate_status = raw.duplicate_status.take().unwrap_or_default();
    for (key, statuses) in [
        ("absent_status", &absent_status),
        ("duplicate_status", &duplicate_status),
    ] {
        if let Some(status) = statuses
            .iter()
            .find(|status| !(200..=499).contains(*status))
        {
            return Err(bad(
                key,
                format!(
                    "{status} is not a 2xx or 4xx status: a 5xx or a missing answer can never prove what happened"
                ),
            ));
        }
    }
    if let Some(status) = absent_status
        .iter()
        .find(|status| duplicate_status.contains(status))
    {
        return Err(bad(
            "absent_status",
            format!("{status} is also in duplicate_status"),
        ));
    }
    let list = match (raw.matches.take(), raw.count.take()) {
        (Some(_), Some(_)) => {
            return Err(bad("matches", "set matches or count, not both".into()));
        }
        (Some(pointer), None) => {
            check_pointer(at, "status_check.matches", &pointer)?;
            let reference = match raw.match_reference_pointer.take() {
                Some(pointer) => pointer,
                None => match dispatch_reference {
                    ReferenceSource::JsonPointer(pointer) => pointer.clone(),
                    ReferenceSource::Header(_) => DEFAULT_REFERENCE_POINTER.to_owned(),
                },
            };
            check_pointer(at, "status_check.match_reference_pointer", &reference)?;
            let mut filter = Vec::new();
            for (field, text) in raw.match_where.take().unwrap_or_default() {
                check_pointer(at, "status_check.match_where", &field)?;
                let template = parse_template(at, "status_check.match_where", &text)?;
                for name in template.placeholders() {
                    check_placeholder(
                        at,
                        Section::StatusCheck,
                        "status_check.match_where",
                        name,
                        FieldUse::Text,
                        context,
                    )?;
                }
                filter.push((field, template));
            }
            Some(MatchList::Items {
                pointer,
                reference,
                filter,
            })
        }
        (None, Some(pointer)) => {
            check_pointer(at, "status_check.count", &pointer)?;
            Some(MatchList::Count { pointer })
        }
        (None, None) => None,
    };
    if raw.match_reference_pointer.is_some() || raw.match_where.is_some() {
        return Err(bad(
            "matches",
            "match_reference_pointer and match_where need matches".into(),
        ));
    }
    let reference_pointer = raw.reference_pointer.take();
    if let Some(pointer) = &reference_pointer {
        check_pointer(at, "status_check.reference_pointer", pointer)?;
    }
    for (status, meaning) in absent_status
        .iter()
        .map(|status| (status, "absent"))
        .chain(duplicate_status.iter().map(|status| (status, "duplicate")))
    {
        if (200..=299).contains(status) && list.is_some() {
            return Err(bad(
                "absent_status",
                format!("{status} is read by matches or count; it cannot also mean {meaning}"),
            ));
        }
    }
    Ok(StatusAnswers {
        absent_status,
        duplicate_status,
        list,
        reference_pointer,
    })
}

/// Expands the `${variable}`s of an endpoint section's URL, body strings, headers and query
/// values; an error names the key.
fn expand_section(
    at: &At<'_>,
    name: &str,
    section: &mut RawEndpoint,
    variables: &Variables,
) -> Result<(), CatalogError> {
    let bad = |key: &str, detail: String| CatalogError::BadShape {
        file: at.file(),
        tool: at.tool(),
        key: format!("{name}.{key}"),
        detail,
    };
    section.url = variables.expand(&section.url).map_err(|e| bad("url", e))?;
    for value in section.headers.values_mut() {
        *value = variables.expand(value).map_err(|e| bad("headers", e))?;
    }
    for value in section.query.values_mut() {
        *value = variables.expand(value).map_err(|e| bad("query", e))?;
    }
    if let Some(body) = section.body.as_mut() {
        expand_toml(body, variables).map_err(|e| bad("body", e))?;
    }
    Ok(())
}

/// Expands the `${variable}`s in every string of a TOML value.
fn expand_toml(value: &mut toml::Value, variables: &Variables) -> Result<(), String> {
    match value {
        toml::Value::String(text) => *text = variables.expand(text)?,
        toml::Value::Array(items) => {
            for item in items {
                expand_toml(item, variables)?;
            }
        }
        toml::Value::Table(table) => {
            for (_, item) in table.iter_mut() {
                expand_toml(item, variables)?;
            }
        }
        toml::Value::Integer(_)
        | toml::Value::Float(_)
        | toml::Value::Boolean(_)
        | toml::Value::Datetime(_) => {}
    }
    Ok(())
}
