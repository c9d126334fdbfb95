//! Credentials a tool's calls carry: declared once in the catalog by name, their secrets only by
//! reference (an environment variable or a file, such as a Kubernetes secret mount), never as
//! text in the catalog.
//!
//! ```toml
//! [credentials.stripe]
//! kind = "bearer"                                   # Authorization: Bearer <token>
//! token = { env = "STRIPE_SECRET_KEY" }
//!
//! [credentials.mail]
//! kind = "basic"                                    # Authorization: Basic base64(user:password)
//! username = "sluice"                               # a name is not a secret: text or a reference
//! password = { file = "/var/run/secrets/mail/password" }
//!
//! [credentials.jira]
//! kind = "header"                                   # any header: X-Api-Key: <value>
//! header = "X-Api-Key"
//! value = { env = "JIRA_KEY" }
//! prefix = ""                                       # optional text before the value
//!
//! [credentials.aws]
//! kind = "aws_sigv4"                                # AWS Signature Version 4
//! service = "sqs"
//! region = "eu-west-1"
//! access_key_id = { env = "AWS_ACCESS_KEY_ID" }
//! secret_access_key = { env = "AWS_SECRET_ACCESS_KEY" }
//! session_token = { env = "AWS_SESSION_TOKEN" }     # optional
//!
//! [credentials.tool_services]
//! kind = "standard_webhooks"                        # webhook-id, -timestamp, -signature
//! keys = [{ env = "SLUICE_TOOL_SIGNING_KEYS" }]     # whsec_… keys; each one signs
//! ```
//!
//! A tool names the credentials of all its calls with `credential = "stripe"` (or a list), and
//! an endpoint may name its own instead. Loading checks the shape only; the connector reads the
//! secrets when it sends (so a rotated file is picked up without a restart) and the services
//! check at start that every referenced secret can be read.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a secret is read from. Shown (in errors, `GET /v1/tools`, a dry run) by its reference,
/// never by its value.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SecretRef {
    /// An environment variable of the process that sends the call.
    Env(String),
    /// A file, read whole with surrounding whitespace trimmed; a relative path is resolved
    /// against the catalog file's directory at load.
    File(PathBuf),
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Env(name) => write!(f, "env {name}"),
            Self::File(path) => write!(f, "file {}", path.display()),
        }
    }
}

/// A value that is either plain text from the catalog or a secret reference (a user name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextOrSecret {
    Text(String),
    Secret(SecretRef),
}

/// What a credential adds to a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialKind {
    Bearer {
        token: SecretRef,
    },
    Basic {
        username: TextOrSecret,
        password: SecretRef,
    },
    Header {
        header: String,
        prefix: String,
        value: SecretRef,
    },
    AwsSigV4 {
        service: String,
        region: String,
        access_key_id: SecretRef,
        secret_access_key: SecretRef,
        session_token: Option<SecretRef>,
    },
    /// The Standard Webhooks scheme: HMAC-SHA256 over `id.timestamp.body`, with every key the
    /// references hold (whitespace-separated `whsec_…` keys), so a receiver that knows any one
    /// of them accepts the call during a rotation.
    StandardWebhooks {
        keys: Vec<SecretRef>,
    },
}

impl CredentialKind {
    /// The `kind` as written in the catalog.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Bearer { .. } => "bearer",
            Self::Basic { .. } => "basic",
            Self::Header { .. } => "header",
            Self::AwsSigV4 { .. } => "aws_sigv4",
            Self::StandardWebhooks { .. } => "standard_webhooks",
        }
    }

    /// The request headers this credential writes (lowercase), to refuse two credentials, or a
    /// credential and a declared header, that would write the same one.
    pub fn headers(&self) -> Vec<String> {
        match self {
            Self::Bearer { .. } | Self::Basic { .. } => vec!["authorization".into()],
            Self::Header { header, .. } => vec![header.to_ascii_lowercase()],
            Self::AwsSigV4 { session_token, .. } => {
                let mut headers = vec![
                    "authorization".into(),
                    "x-amz-date".into(),
                    "x-amz-content-sha256".into(),
                ];
                if session_token.is_some() {
                    headers.push("x-amz-security-token".into());
                }
                headers
            }
            Self::StandardWebhooks { .. } => vec![
                "webhook-id".into(),
                "webhook-timestamp".into(),
                "webhook-signature".into(),
            ],
        }
    }

    /// Every secret reference the credential reads.
    pub fn secrets(&self) -> Vec<&SecretRef> {
        match self {
            Self::Bearer { token } => vec![token],
            Self::Basic { username, password } => match username {
                TextOrSecret::Secret(name) => vec![name, password],
                TextOrSecret::Text(_) => vec![password],
            },
            Self::Header { value, .. } => vec![value],
            Self::AwsSigV4 {
                access_key_id,
                secret_access_key,
                session_token,
                ..
            } => {
                let mut refs = vec![access_key_id, secret_access_key];
                refs.extend(session_token.iter());
                refs
            }
            Self::StandardWebhooks { keys } => keys.iter().collect(),
        }
    }

    /// Signers sign the request as it will be sent, so they come after every other credential
    /// (and SigV4, which also signs the webhook headers, last of all).
    pub fn order(&self) -> u8 {
        match self {
            Self::Bearer { .. } | Self::Basic { .. } | Self::Header { .. } => 0,
            Self::StandardWebhooks { .. } => 1,
            Self::AwsSigV4 { .. } => 2,
        }
    }
}

/// A named credential of the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub name: String,
    pub kind: CredentialKind,
}

/// Resolves a `{ file = … }` reference against the catalog's directory.
pub(super) fn resolve_file(dir: Option<&Path>, path: &str) -> PathBuf {
    let path = PathBuf::from(path);
    match dir {
        Some(dir) if path.is_relative() => dir.join(path),
        Some(_) | None => path,
    }
}

/// Builds the catalog's `[credentials.<name>]` tables. `dir` resolves relative secret files.
pub(super) fn build_credentials(
    raw: std::collections::BTreeMap<String, toml::Table>,
    file: &str,
    dir: Option<&Path>,
) -> Result<std::collections::BTreeMap<String, std::sync::Arc<Credential>>, CatalogError> {
    let mut built = std::collections::BTreeMap::new();
    for (name, table) in raw {
        let credential =
            build_one(&name, table, dir).map_err(|detail| CatalogError::BadCredential {
                file: file.to_owned(),
                credential: name.clone(),
                detail,
            })?;
        built.insert(name, std::sync::Arc::new(credential));
    }
    Ok(built)
}

use super::error::CatalogError;

/// One credential table, or why it is refused (the message names the key).
fn build_one(name: &str, mut table: toml::Table, dir: Option<&Path>) -> Result<Credential, String> {
    if let Err(why) = crate::ids::check_snake_case(name) {
        return Err(format!("the name {name:?} is invalid: {why}"));
    }
    let kind = match table.remove("kind") {
        Some(toml::Value::String(kind)) => kind,
        Some(_) => return Err("kind must be a string".into()),
        None => {
            return Err(
                "kind is missing: one of bearer, basic, header, aws_sigv4, standard_webhooks"
                    .into(),
            );
        }
    };
    let mut take = Fields {
        table: &mut table,
        dir,
    };
    let kind = match kind.as_str() {
        "bearer" => CredentialKind::Bearer {
            token: take.secret("token")?,
        },
        "basic" => CredentialKind::Basic {
            username: take.text_or_secret("username")?,
            password: take.secret("password")?,
        },
        "header" => {
            let header = take.text("header")?;
            if !super::endpoint::is_header_name(&header) {
                return Err(format!("header {header:?} is not an HTTP header name"));
            }
            CredentialKind::Header {
                header,
                prefix: take.optional_text("prefix")?.unwrap_or_default(),
                value: take.secret("value")?,
            }
        }
        "aws_sigv4" => CredentialKind::AwsSigV4 {
            service: take.text("service")?,
            region: take.text("region")?,
            access_key_id: take.secret("access_key_id")?,
            secret_access_key: take.secret("secret_access_key")?,
            session_token: take.optional_secret("session_token")?,
        },
        "standard_webhooks" => {
            let keys = match take.table.remove("keys") {
                Some(toml::Value::Array(items)) if !items.is_empty() => items
                    .into_iter()
                    .map(|item| secret_ref("keys", item, dir))
                    .collect::<Result<Vec<_>, _>>()?,
                Some(_) => {
                    return Err("keys must be a non-empty list of { env = \"NAME\" } or { file = \"/path\" }".into());
                }
                None => return Err("keys is missing".into()),
            };
            CredentialKind::StandardWebhooks { keys }
        }
        other => {
            return Err(format!(
                "kind {other:?} is unknown: one of bearer, basic, header, aws_sigv4, standard_webhooks"
            ));
        }
    };
    if let Some(extra) = table.keys().next() {
        return Err(format!("unknown key {extra:?} for kind {}", kind.as_str()));
    }
    Ok(Credential {
        name: name.to_owned(),
        kind,
    })
}

struct Fields<'a> {
    table: &'a mut toml::Table,
    dir: Option<&'a Path>,
}

impl Fields<'_> {
    fn secret(&mut self, key: &str) -> Result<SecretRef, String> {
        self.optional_secret(key)?.ok_or_else(|| {
            format!("{key} is missing: {{ env = \"NAME\" }} or {{ file = \"/path\" }}")
        })
    }

    fn optional_secret(&mut self, key: &str) -> Result<Option<SecretRef>, String> {
        self.table
            .remove(key)
            .map(|value| secret_ref(key, value, self.dir))
            .transpose()
    }

    fn text(&mut self, key: &str) -> Result<String, String> {
        self.optional_text(key)?
            .ok_or_else(|| format!("{key} is missing"))
    }

    fn optional_text(&mut self, key: &str) -> Result<Option<String>, String> {
        match self.table.remove(key) {
            Some(toml::Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(format!("{key} must be a string")),
            None => Ok(None),
        }
    }

    fn text_or_secret(&mut self, key: &str) -> Result<TextOrSecret, String> {
        match self.table.remove(key) {
            Some(toml::Value::String(text)) => Ok(TextOrSecret::Text(text)),
            Some(value) => secret_ref(key, value, self.dir).map(TextOrSecret::Secret),
            None => Err(format!("{key} is missing")),
        }
    }
}

/// `{ env = "NAME" }` or `{ file = "path" }`. A string is refused without being shown: it is a
/// secret written into the catalog.
pub(super) fn secret_ref(
    key: &str,
    value: toml::Value,
    dir: Option<&Path>,
) -> Result<SecretRef, String> {
    let table = match value {
        toml::Value::Table(table) => table,
        toml::Value::String(_) => {
            return Err(format!(
                "{key} is written as text; a secret is given only by reference, {{ env = \"NAME\" }} or {{ file = \"/path\" }}, never in the catalog"
            ));
        }
        _ => {
            return Err(format!(
                "{key} must be {{ env = \"NAME\" }} or {{ file = \"/path\" }}"
            ));
        }
    };
    let mut entries = table.into_iter();
    match (entries.next(), entries.next()) {
        (Some((source, toml::Value::String(name))), None) if !name.is_empty() => {
            match source.as_str() {
                "env" => Ok(SecretRef::Env(name)),
                "file" => Ok(SecretRef::File(resolve_file(dir, &name))),
                _ => Err(format!(
                    "{key} must be {{ env = \"NAME\" }} or {{ file = \"/path\" }}, not {{ {source} = … }}"
                )),
            }
        }
        _ => Err(format!(
            "{key} must be exactly one of {{ env = \"NAME\" }} or {{ file = \"/path\" }}"
        )),
    }
}
