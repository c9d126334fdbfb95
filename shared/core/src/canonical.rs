//! Canonical JSON and the argument hash.
//!
//! Canonical form: object keys sorted by their UTF-16 code units (as RFC 8785 does), no
//! insignificant whitespace, strings escaped as `serde_json` does, and numbers in one spelling:
//! an integral float within ±2^53 is written as an integer (`1.0` → `1`), any other float in
//! the shortest form that reads back to the same value. Two argument objects that mean the same
//! thing therefore hash the same, whatever key order or spacing the agent sent.

use serde_json::{Number, Value};
use sha2::{Digest, Sha256};

use crate::ids::ArgsHash;

/// Largest integer an IEEE double holds exactly.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

/// Writes `value` in canonical form.
pub fn to_canonical_string(value: &Value) -> String {
    let mut out = Vec::with_capacity(128);
    write_value(value, &mut out);
    into_string(out)
}

/// The canonical bytes of `value`, for hashing.
pub fn to_canonical_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_value(value, &mut out);
    out
}

/// Lowercase hex SHA-256 of the canonical JSON of a command's arguments.
pub fn args_hash(args: &Value) -> ArgsHash {
    ArgsHash::from_hex(hex::encode(Sha256::digest(to_canonical_bytes(args))))
}

/// Appends `value` in canonical form to `out`. Written straight into the buffer: the audit
/// records of every effect go through here, and a `String` per string and number showed.
pub(crate) fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => write_number(number, out),
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_value(item, out);
            }
            out.push(b'}');
        }
    }
}

fn write_number(number: &Number, out: &mut Vec<u8>) {
    use std::io::Write as _;
    // Writing into a Vec cannot fail.
    if number.is_i64() || number.is_u64() {
        let _ = write!(out, "{number}");
        return;
    }
    match number.as_f64() {
        Some(float) if float.fract() == 0.0 && float.abs() <= MAX_SAFE_INTEGER => {
            // Exact: |float| ≤ 2^53 and integral, so the cast loses nothing. `-0.0` becomes 0.
            #[allow(clippy::cast_possible_truncation)]
            let integral = float as i64;
            let _ = write!(out, "{integral}");
        }
        // serde_json prints finite floats in the shortest round-trip form; JSON has no NaN.
        Some(_) | None => {
            let _ = write!(out, "{number}");
        }
    }
}

/// Appends `text` as a JSON string, escaped as `serde_json` does (minimal and deterministic).
pub(crate) fn write_string(text: &str, out: &mut Vec<u8>) {
    // Serialising a `str` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// The canonical text as a `String`: every byte written came from a `&str` or from ASCII.
pub(crate) fn into_string(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_whitespace_dropped() {
        let value = json!({"b": 1, "a": {"d": [1, 2, {"z": null, "y": true}], "c": "x"}});
        assert_eq!(
            to_canonical_string(&value),
            r#"{"a":{"c":"x","d":[1,2,{"y":true,"z":null}]},"b":1}"#
        );
    }

    #[test]
    fn numbers_have_one_spelling() {
        let integral: Value = serde_json::from_str("{\"n\": 125000.0}").expect("json");
        let plain: Value = serde_json::from_str("{\"n\": 125000}").expect("json");
        assert_eq!(to_canonical_string(&integral), r#"{"n":125000}"#);
        assert_eq!(args_hash(&integral), args_hash(&plain));
        let fractional: Value = serde_json::from_str("[0.1, -0.0, 1e300]").expect("json");
        assert_eq!(to_canonical_string(&fractional), "[0.1,0,1e+300]");
    }

    #[test]
    fn different_arguments_hash_differently() {
        assert_ne!(
            args_hash(&json!({"amount": 1})),
            args_hash(&json!({"amount": 2}))
        );
        assert_eq!(args_hash(&json!({})).as_str().len(), 64);
    }

    #[test]
    fn strings_are_escaped_and_keys_sort_by_utf16() {
        let value = json!({"é": 1, "z": 2, "\u{1F600}": 3, "line": "a\n\"b\""});
        assert_eq!(
            to_canonical_string(&value),
            "{\"line\":\"a\\n\\\"b\\\"\",\"z\":2,\"é\":1,\"\u{1F600}\":3}"
        );
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            (-1.0e9..1.0e9f64).prop_map(|f| json!(f)),
            "[a-z\\\\\"\\n]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,4}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn canonical_form_parses_back_to_an_equal_value_and_is_a_fixed_point(value in arb_json()) {
            let text = to_canonical_string(&value);
            let parsed: Value = serde_json::from_str(&text).expect("canonical output is JSON");
            prop_assert_eq!(to_canonical_string(&parsed), text.clone());
            // Key order of the input never changes the hash.
            if let Value::Object(map) = &value {
                let reversed: serde_json::Map<String, Value> =
                    map.iter().rev().map(|(k, v)| (k.clone(), v.clone())).collect();
                prop_assert_eq!(to_canonical_string(&Value::Object(reversed)), text);
            }
        }
    }
}
