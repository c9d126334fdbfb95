//! `[tool.money.<field>]`: an integer argument that is an amount of money in minor units, and
//! its currency, so that people are shown `EUR 1,250.00` rather than `125000`.
//!
//! ```toml
//! [tool.money.amount_minor]
//! currency = "EUR"     # ISO 4217 code: three capital letters
//! minor_units = 2      # digits after the decimal point: 0 (JPY) to 4 (CLF)
//! ```
//!
//! Display only: the arguments, their hashes, keys and policy stay in minor units. Checked at
//! load: the field is a top-level integer argument of the tool's schema, the currency three
//! capital letters, the minor units 0 to 4; an error names `money.<field>`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::build::At;
use super::error::CatalogError;

/// Most digits after the decimal point a currency has (ISO 4217: CLF and UYW have 4).
pub const MAX_MINOR_UNITS: u8 = 4;

/// How one money argument is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Money {
    /// ISO 4217 code, e.g. `EUR`.
    pub currency: String,
    /// Digits after the decimal point: the amount `125000` with 2 is `1,250.00`.
    pub minor_units: u8,
}

/// A tool's money arguments by field name, validated against its argument `schema`.
pub(super) fn build_money(
    at: &At<'_>,
    raw: BTreeMap<String, Money>,
    schema: &Value,
) -> Result<BTreeMap<String, Money>, CatalogError> {
    for (field, money) in &raw {
        let bad = |detail: String| CatalogError::BadShape {
            file: at.file(),
            tool: at.tool(),
            key: format!("money.{field}"),
            detail,
        };
        let Some(property) = schema
            .get("properties")
            .and_then(Value::as_object)
            .and_then(|properties| properties.get(field))
        else {
            return Err(bad(format!(
                "{field:?} is not an argument of the tool: declare it under the schema's top-level properties"
            )));
        };
        let integer = match property.get("type") {
            Some(Value::String(kind)) => kind == "integer",
            Some(Value::Array(kinds)) => {
                kinds.iter().any(|k| k == "integer")
                    && kinds.iter().all(|k| k == "integer" || k == "null")
            }
            _ => false,
        };
        if !integer {
            return Err(bad(format!(
                "argument {field:?} must have type \"integer\" in the schema: a money field is a whole number of minor units (cents)"
            )));
        }
        let code = money.currency.as_bytes();
        if code.len() != 3 || !code.iter().all(u8::is_ascii_uppercase) {
            return Err(bad(format!(
                "currency {:?} is not an ISO 4217 code (three capital letters, such as \"EUR\")",
                money.currency
            )));
        }
        if money.minor_units > MAX_MINOR_UNITS {
            return Err(bad(format!(
                "minor_units = {} is more than {MAX_MINOR_UNITS}, the most digits after the decimal point any currency has",
                money.minor_units
            )));
        }
    }
    Ok(raw)
}
