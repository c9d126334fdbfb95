//! Building a [`Tool`] from its raw TOML entry: every rule a tool must satisfy to load.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Number, Value};

use super::args::{FieldUse, bounded, check_field};
use super::endpoint::{
    DispatchConnector, ReferenceSource, Section, build_endpoint, is_header_name,
};
use super::error::CatalogError;
use super::raw::{RawEndpoint, RawPolicy, RawTool, describe};
use super::template::Template;
use super::tool::{Tool, ToolPolicy};
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

    let (schema, schema_key) = load_schema(&at, raw.schema, raw.schema_file, schemas)?;
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|error| CatalogError::InvalidSchema {
            file: at.file(),
            tool: at.tool(),
            key: schema_key,
            // The path inside the schema document: `/properties/amount/minimum`.
            detail: bounded(match error.instance_path().as_str() {
                "" => error.to_string(),
                path => format!("{path}: {error}"),
            }),
        })?;
    if schema.get("type") != Some(&Value::String("object".into())) {
        return Err(CatalogError::SchemaNotObject {
            file: at.file(),
            tool: at.tool(),
            key: schema_key,
        });
    }

    let business_key = match raw.business_key {
        Some(text) => {
            let template = parse_template(&at, "business_key", &text)?;
            for field in template.placeholders() {
                check_field(&at, "business_key", field, &schema, FieldUse::Text)?;
            }
            Some(template)
        }
        None => None,
    };

    let policy = build_policy(&at, raw.policy, raw.semantics, &schema)?;
    if policy.verify_after_commit && raw.status_check.is_none() {
        return Err(CatalogError::MalformedTool {
            file: at.file(),
            tool: at.tool(),
            detail: "policy.verify_after_commit needs a [tool.status_check] to look the commit up"
                .into(),
        });
    }

    let Some(dispatch) = raw.dispatch else {
        return Err(CatalogError::MissingDispatch {
            file: at.file(),
            tool: at.tool(),
        });
    };
    let has_business_key = business_key.is_some();
    let reference = match (dispatch.reference_pointer, dispatch.reference_header) {
        (Some(_), Some(_)) => {
            return Err(CatalogError::ReferenceChoice {
                file: at.file(),
                tool: at.tool(),
            });
        }
        (Some(pointer), None) => {
            if !(pointer.is_empty() || pointer.starts_with('/')) {
                return Err(CatalogError::BadReferencePointer {
                    file: at.file(),
                    tool: at.tool(),
                    pointer,
                });
            }
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
    let dispatch = DispatchConnector {
        endpoint: build_endpoint(
            &at,
            Section::Dispatch,
            RawEndpoint {
                url: dispatch.url,
                method: dispatch.method,
                timeout_ms: dispatch.timeout_ms,
            },
            &schema,
            &policy,
            has_business_key,
        )?,
        reference,
        in_progress_status: dispatch.in_progress_status,
    };
    // 408, 425 and 429 are ambiguous already; other codes here would turn a success or a
    // server error into something it is not.
    if let Some(&status) = dispatch
        .in_progress_status
        .iter()
        .find(|status| !(400..=499).contains(*status))
    {
        return Err(CatalogError::BadInProgressStatus {
            file: at.file(),
            tool: at.tool(),
            status,
        });
    }
    let status_check = raw
        .status_check
        .map(|raw| {
            build_endpoint(
                &at,
                Section::StatusCheck,
                raw,
                &schema,
                &policy,
                has_business_key,
            )
        })
        .transpose()?;
    let compensate = raw
        .compensate
        .map(|raw| {
            build_endpoint(
                &at,
                Section::Compensate,
                raw,
                &schema,
                &policy,
                has_business_key,
            )
        })
        .transpose()?;

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
        compensate,
        allow_unsafe: raw.allow_unsafe,
        clock_skew_ms: DEFAULT_MAX_CLOCK_SKEW_MS,
    })
}

pub(super) fn load_schema(
    at: &At<'_>,
    inline: Option<toml::Table>,
    file: Option<String>,
    schemas: Option<SchemaReader<'_>>,
) -> Result<(Value, &'static str), CatalogError> {
    match (inline, file) {
        (Some(table), None) => {
            let schema = toml_to_json(&toml::Value::Table(table)).map_err(|detail| {
                CatalogError::InvalidSchema {
                    file: at.file(),
                    tool: at.tool(),
                    key: "schema",
                    detail,
                }
            })?;
            Ok((schema, "schema"))
        }
        (None, Some(relative)) => {
            let Some(read) = schemas else {
                return Err(CatalogError::SchemaFileWithoutDirectory {
                    file: at.file(),
                    tool: at.tool(),
                    path: relative,
                });
            };
            let (path, text) = read(&relative);
            let text = text.map_err(|source| CatalogError::SchemaFileRead {
                file: at.file(),
                tool: at.tool(),
                path: path.clone(),
                source,
            })?;
            let schema =
                serde_json::from_str(&text).map_err(|source| CatalogError::SchemaFileJson {
                    file: at.file(),
                    tool: at.tool(),
                    path,
                    source,
                })?;
            Ok((schema, "schema_file"))
        }
        (Some(_), Some(_)) | (None, None) => Err(CatalogError::SchemaChoice {
            file: at.file(),
            tool: at.tool(),
        }),
    }
}

/// Converts an inline TOML schema to JSON, refusing what JSON cannot hold.
pub(super) fn toml_to_json(value: &toml::Value) -> Result<Value, String> {
    Ok(match value {
        toml::Value::String(text) => Value::String(text.clone()),
        toml::Value::Integer(number) => Value::from(*number),
        toml::Value::Float(number) => Number::from_f64(*number)
            .map(Value::Number)
            .ok_or_else(|| format!("{number} is not a JSON number"))?,
        toml::Value::Boolean(flag) => Value::Bool(*flag),
        // JSON has no date type; the toml crate already hands dates over as strings.
        toml::Value::Datetime(at) => Value::String(at.to_string()),
        toml::Value::Array(items) => {
            Value::Array(items.iter().map(toml_to_json).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(table) => Value::Object(
            table
                .iter()
                .map(|(key, value)| Ok((key.clone(), toml_to_json(value)?)))
                .collect::<Result<Map<_, _>, String>>()?,
        ),
    })
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
        late_commit_ms: raw.late_commit_ms,
        verify_after_ms: raw
            .verify_after_ms
            .unwrap_or(millis(defaults.verify_after_ms)),
        approval_timeout_ms: raw
            .approval_timeout_ms
            .unwrap_or(millis(defaults.approval_timeout_ms)),
    };
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
