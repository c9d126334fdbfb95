//! Catalog variables: a value a catalog names once (an upstream's base URL) and uses in its
//! endpoints' URLs, bodies, headers and query values as `${name}`, overridable by the
//! environment at load, so moving an upstream means setting one variable, not editing every
//! URL.
//!
//! ```toml
//! [variables]
//! bank = { default = "http://127.0.0.1:8787", env = "SLUICE_BANK_URL" }
//! mail = "http://127.0.0.1:8025"          # no override
//!
//! [tool.dispatch]
//! url = "${bank}/wires"
//! ```
//!
//! A variable is the catalog author's text, not an argument: it may stand anywhere in a URL
//! (the scheme and host included), a body's strings, a header or a query value. The expanded URL is checked like any other (http or https,
//! no user information, no `{placeholder}` before the path), and a value from the environment
//! is held to the same rules.

use std::collections::BTreeMap;

use serde::Deserialize;

/// A variable as written: a plain value, or a default and the environment variable that
/// overrides it.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawVariable {
    Value(String),
    Overridable(Overridable),
}

/// `{ default = "…", env = "NAME" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Overridable {
    default: String,
    env: String,
}

/// The catalog's variables with the environment's overrides applied.
#[derive(Debug, Clone, Default)]
pub(super) struct Variables {
    values: BTreeMap<String, String>,
}

impl Variables {
    /// Resolves each variable: its environment variable's value when set and not empty, else
    /// its default. `env` reads the environment (injected so the rule is testable).
    pub(super) fn resolve(
        raw: BTreeMap<String, RawVariable>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let mut values = BTreeMap::new();
        for (name, variable) in raw {
            if let Err(why) = crate::ids::check_snake_case(&name) {
                return Err(format!("variables.{name}: the name is invalid: {why}"));
            }
            let value = match variable {
                RawVariable::Value(value) => value,
                RawVariable::Overridable(Overridable { default, env: var }) => env(&var)
                    .filter(|value| !value.is_empty())
                    .unwrap_or(default),
            };
            values.insert(name, value);
        }
        Ok(Self { values })
    }

    /// `text` with every `${name}` replaced by its variable's value; an unknown name or an
    /// unclosed `${` is an error naming it.
    pub(super) fn expand(&self, text: &str) -> Result<String, String> {
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err(format!(
                    "\"${{\" at byte {} is never closed",
                    text.len() - rest.len() + start
                ));
            };
            let name = &after[..end];
            let Some(value) = self.values.get(name) else {
                return Err(format!(
                    "${{{name}}} names no variable; declare it under [variables]"
                ));
            };
            out.push_str(value);
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> BTreeMap<String, RawVariable> {
        let table: toml::Table = toml::from_str(text).expect("valid TOML");
        table
            .into_iter()
            .map(|(name, value)| (name, RawVariable::deserialize(value).expect("a variable")))
            .collect()
    }

    #[test]
    fn a_variable_takes_its_environment_override_else_its_default() {
        let raw = raw(r#"
            bank = { default = "http://127.0.0.1:8787", env = "BANK_URL" }
            mail = "http://127.0.0.1:8025"
        "#);
        let none = Variables::resolve(raw.clone(), &|_| None).expect("resolves");
        assert_eq!(
            none.expand("${bank}/wires?m=${mail}").expect("expands"),
            "http://127.0.0.1:8787/wires?m=http://127.0.0.1:8025"
        );
        let moved = Variables::resolve(raw.clone(), &|name| {
            (name == "BANK_URL").then(|| "https://bank.internal".to_owned())
        })
        .expect("resolves");
        assert_eq!(
            moved.expand("${bank}/wires").expect("expands"),
            "https://bank.internal/wires"
        );
        let empty = Variables::resolve(raw, &|_| Some(String::new())).expect("resolves");
        assert_eq!(
            empty.expand("${bank}").expect("expands"),
            "http://127.0.0.1:8787",
            "an empty override keeps the default"
        );
    }

    #[test]
    fn unknown_and_unclosed_variables_are_refused() {
        let vars = Variables::resolve(raw(r#"bank = "http://b""#), &|_| None).expect("resolves");
        assert!(
            vars.expand("${bnak}/x")
                .expect_err("unknown")
                .contains("${bnak} names no variable")
        );
        assert!(
            vars.expand("${bank/x")
                .expect_err("unclosed")
                .contains("never closed")
        );
        assert_eq!(
            vars.expand("{run_id}/x").expect("placeholders pass"),
            "{run_id}/x"
        );
    }
}
