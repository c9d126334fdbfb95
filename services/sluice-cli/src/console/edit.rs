//! `sluice approve … --args` / `--set`: the edited arguments of an edit and approve
//! (docs/decisions.md, "Edit and approve"). The server takes the arguments whole, so `--set`
//! changes are applied here to the command's current arguments (its latest revision's, or the
//! submitted ones), read first.

use serde_json::Value;

use super::{Client, Exit, Failure};

/// `--args`: JSON text, or the path of a file holding it.
pub(super) fn parse_args(raw: &str) -> Result<Value, Failure> {
    let text = if raw.trim_start().starts_with('{') {
        raw.to_owned()
    } else {
        std::fs::read_to_string(raw).map_err(|e| {
            Failure::new(
                Exit::Usage,
                format!("--args is neither a JSON object nor a readable file ({raw}): {e}"),
            )
        })?
    };
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::new(Exit::Usage, format!("--args is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(Failure::new(
            Exit::Usage,
            "--args must be a JSON object: the command's arguments, whole",
        ));
    }
    Ok(value)
}

/// Applies each `--set /pointer=value` to `args`: the value is JSON when it parses as JSON,
/// else text; a missing last field is added to its object.
pub(super) fn apply_sets(mut args: Value, sets: &[String]) -> Result<Value, Failure> {
    for set in sets {
        let usage = |why: &str| {
            Failure::new(
                Exit::Usage,
                format!(
                    "--set {set:?}: {why}; write --set /pointer=value, e.g. --set /amount_minor=900"
                ),
            )
        };
        let (pointer, raw) = set.split_once('=').ok_or_else(|| usage("no '='"))?;
        if !pointer.starts_with('/') {
            return Err(usage("the pointer must start with '/'"));
        }
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()));
        if let Some(slot) = args.pointer_mut(pointer) {
            *slot = value;
            continue;
        }
        let (parent, last) = pointer.rsplit_once('/').unwrap_or(("", pointer));
        let field = last.replace("~1", "/").replace("~0", "~");
        match args.pointer_mut(parent) {
            Some(Value::Object(object)) => {
                object.insert(field, value);
            }
            _ => return Err(usage("no object in the arguments holds that field")),
        }
    }
    Ok(args)
}

/// The arguments an approval sends: `--args` whole, then `--set` on them (or on the command's
/// current arguments, read from `path`); `None` for a plain approval.
pub(super) async fn edited_args(
    client: &Client,
    path: &str,
    args: Option<&str>,
    sets: &[String],
) -> Result<Option<Value>, Failure> {
    let base = match args {
        Some(raw) => parse_args(raw)?,
        None if sets.is_empty() => return Ok(None),
        None => {
            let answer = client.call(reqwest::Method::GET, path, None).await?;
            if !answer.status.is_success() {
                return Err(Failure::new(
                    super::exit_of(answer.status),
                    format!(
                        "error: reading the command to edit: {}: {}",
                        answer.status,
                        super::text(&answer.body["error"]["message"])
                    ),
                ));
            }
            current_args(&answer.body)
        }
    };
    apply_sets(base, sets).map(Some)
}

/// A command's current arguments as the API shows it: the last revision's, else `args`.
pub(super) fn current_args(command: &Value) -> Value {
    command["revisions"]
        .as_array()
        .and_then(|revisions| revisions.last())
        .map_or(&command["args"], |revision| &revision["args"])
        .clone()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sets_change_add_and_refuse_with_a_usage_error() {
        let args = json!({"amount_minor": 1500, "beneficiary": {"iban": "DE89"}});
        let edited = apply_sets(
            args.clone(),
            &[
                "/amount_minor=900".into(),
                "/beneficiary/iban=DE44".into(),
                "/beneficiary/name=\"ACME\"".into(),
            ],
        )
        .expect("applied");
        assert_eq!(
            edited,
            json!({"amount_minor": 900, "beneficiary": {"iban": "DE44", "name": "ACME"}})
        );
        for bad in ["amount_minor=1", "/amount_minor", "/missing/deep=1"] {
            let failure = apply_sets(args.clone(), &[bad.into()]).expect_err(bad);
            assert_eq!(failure.exit, Exit::Usage, "{bad}");
            assert!(failure.message.contains("--set"), "{}", failure.message);
        }
    }

    #[test]
    fn the_current_arguments_are_the_last_revisions() {
        let command =
            json!({"args": {"a": 1}, "revisions": [{"args": {"a": 2}}, {"args": {"a": 3}}]});
        assert_eq!(current_args(&command), json!({"a": 3}));
        assert_eq!(current_args(&json!({"args": {"a": 1}})), json!({"a": 1}));
        assert!(parse_args("{\"a\": 1}").is_ok());
        assert_eq!(parse_args("[1]").expect_err("an object").exit, Exit::Usage);
        assert_eq!(
            parse_args("/nonexistent/args.json")
                .expect_err("no file")
                .exit,
            Exit::Usage
        );
    }
}
