//! A tool's argument schema: inline TOML or a JSON file beside the catalog, converted to JSON
//! and compiled with `format` assertions on.

use serde_json::{Map, Number, Value};

use super::SchemaReader;
use super::args::bounded;
use super::build::At;
use super::error::CatalogError;

/// Compiles a tool's argument schema, with `format` assertions on.
pub(super) fn compile_schema(
    at: &At<'_>,
    schema: &Value,
    key: &'static str,
) -> Result<jsonschema::Validator, CatalogError> {
    jsonschema::options()
        .should_validate_formats(true)
        .build(schema)
        .map_err(|error| CatalogError::InvalidSchema {
            file: at.file(),
            tool: at.tool(),
            key,
            // The path inside the schema document: `/properties/amount/minimum`.
            detail: bounded(match error.instance_path().as_str() {
                "" => error.to_string(),
                path => format!("{path}: {error}"),
            }),
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
