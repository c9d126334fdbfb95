//! Secrets kept out of the configuration file: a secret setting may be given as
//! `{ file = "/path" }` (a mounted Kubernetes Secret, a Docker secret) or `{ env = "VAR" }`
//! instead of its value, and is read here, before the file is parsed into [`super::Config`],
//! with errors that name the setting and the file or variable but never the value.
//!
//! A setting is a secret when its name is `password`, `token` or `secret`, or ends in
//! `_password`, `_token`, `_secret` (or `.password`, …), or when it is a librdkafka property under
//! `bus.kafka.extra` (SASL/OAUTHBEARER secrets live there). A file's trailing line break is
//! dropped (`echo secret > file` writes one); anything else in it is the secret.

use std::path::Path;

use super::ConfigError;

/// Whether the setting `name` (the last segment of its key, or a librdkafka property such as
/// `sasl.password`) holds a secret.
pub(super) fn is_secret_name(name: &str) -> bool {
    ["password", "secret", "token"].iter().any(|word| {
        name == *word || name.ends_with(&format!("_{word}")) || name.ends_with(&format!(".{word}"))
    })
}

/// Replaces every `{ file = … }` / `{ env = … }` secret reference in `table` by its value.
/// `env` looks variables up (the process's environment in [`super::Config::load`]).
pub(super) fn resolve(
    table: &mut toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    walk(table, "", false, env)
}

fn walk(
    table: &mut toml::Table,
    prefix: &str,
    in_extra: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    for (name, value) in table.iter_mut() {
        let key = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}.{name}")
        };
        let secret = in_extra || is_secret_name(name);
        match value {
            toml::Value::Table(inner) if secret && reference(inner).is_some() => {
                *value = toml::Value::String(read(&key, inner, env)?);
            }
            toml::Value::Table(inner) => {
                walk(inner, &key, key == "bus.kafka.extra", env)?;
            }
            toml::Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    if let toml::Value::Table(inner) = item {
                        walk(inner, &format!("{key}[{i}]"), false, env)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `Some((kind, target))` for a table that is exactly `{ file = "…" }` or `{ env = "…" }`.
fn reference(table: &toml::Table) -> Option<(&str, &str)> {
    if table.len() != 1 {
        return None;
    }
    let (kind, target) = table.iter().next()?;
    matches!(kind.as_str(), "file" | "env")
        .then_some(())
        .and(target.as_str())
        .map(|target| (kind.as_str(), target))
}

fn read(
    key: &str,
    table: &toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        key: key.to_owned(),
        message,
    };
    let (kind, target) = reference(table).ok_or_else(|| invalid("is not a reference".into()))?;
    let value = if kind == "file" {
        let text = std::fs::read_to_string(Path::new(target))
            .map_err(|e| invalid(format!("cannot read the secret file {target}: {e}")))?;
        let trimmed = text
            .strip_suffix("\r\n")
            .or_else(|| text.strip_suffix('\n'))
            .unwrap_or(&text);
        trimmed.to_owned()
    } else {
        env(target).ok_or_else(|| {
            invalid(format!(
                "the environment variable {target} that should hold it is not set"
            ))
        })?
    };
    if value.is_empty() {
        return Err(invalid(format!("the secret in {kind} {target} is empty")));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn files_and_variables_replace_references_and_errors_name_the_key() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("password");
        std::fs::write(&file, "from-a-file\n").expect("write");
        let text = format!(
            "[ledger.cql]\npassword = {{ file = {:?} }}\n\
             [bus.kafka.extra]\n\"sasl.oauthbearer.client.secret\" = {{ env = \"OIDC\" }}\n\
             [bus.kafka.tls]\nca_file = {{ file = \"/not/a/secret\" }}\n",
            file.display().to_string()
        );
        let mut table: toml::Table = toml::from_str(&text).expect("toml");
        let env = |var: &str| (var == "OIDC").then(|| "from-env".to_owned());
        resolve(&mut table, &env).expect("resolved");
        assert_eq!(
            table["ledger"]["cql"]["password"].as_str(),
            Some("from-a-file")
        );
        assert_eq!(
            table["bus"]["kafka"]["extra"]["sasl.oauthbearer.client.secret"].as_str(),
            Some("from-env")
        );
        assert!(
            table["bus"]["kafka"]["tls"]["ca_file"].is_table(),
            "only secret settings are references"
        );

        let mut missing: toml::Table =
            toml::from_str("[bus.kafka.sasl]\npassword = { file = \"/nowhere/pw\" }\n")
                .expect("toml");
        let err = resolve(&mut missing, &no_env).expect_err("no such file");
        assert!(err.to_string().contains("bus.kafka.sasl.password"), "{err}");
        assert!(err.to_string().contains("/nowhere/pw"), "{err}");

        let mut unset: toml::Table =
            toml::from_str("[[auth.tokens]]\nname = \"a\"\ntoken = { env = \"NOPE\" }\n")
                .expect("toml");
        let err = resolve(&mut unset, &no_env).expect_err("no such variable");
        assert!(err.to_string().contains("auth.tokens[0].token"), "{err}");
        assert!(err.to_string().contains("NOPE"), "{err}");
    }
}
