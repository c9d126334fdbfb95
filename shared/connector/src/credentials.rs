//! Credentials applied to a call as it is sent: bearer, basic, any header, AWS Signature V4 and
//! Standard Webhooks signatures, their secrets read from the environment or from files.
//!
//! Guarantees:
//! * a secret is read when a call needs it — a file whose content changed (a rotated Kubernetes
//!   secret mount) is read again, so a rotation needs no restart; an environment variable is
//!   read at every call;
//! * a secret never reaches a log, an error, the evidence or the audit chain: errors name the
//!   credential and the reference (`env STRIPE_SECRET_KEY`), never the value, and the header
//!   values written here are marked sensitive (`Debug` shows `Sensitive`);
//! * a secret that cannot be read, or a signature that cannot be made, means the call is not
//!   sent (`NotSent`): nothing reached the upstream;
//! * signers run last and sign the request as it will be sent: Standard Webhooks over
//!   `id.timestamp.body`, SigV4 over method, URL, every header (the webhook ones included) and
//!   the body's hash.
//!
//! The signing itself is done by libraries: `aws-sigv4` (the AWS SDK's own signer) and `hmac`
//! with `sha2` for the Standard Webhooks HMAC.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, KeyInit, Mac};
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, Url};
use sha2::Sha256;
use sluice_core::catalog::{Catalog, Credential, CredentialKind, SecretRef, TextOrSecret};

/// The Standard Webhooks headers.
pub const WEBHOOK_ID: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Why a credential could not be applied. Names the credential and the reference, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("credential {credential}: {reference} is not set")]
    Unset {
        credential: String,
        reference: String,
    },
    #[error("credential {credential}: cannot read {reference}: {detail}")]
    Unreadable {
        credential: String,
        reference: String,
        detail: String,
    },
    #[error("credential {credential}: {reference} is empty")]
    Empty {
        credential: String,
        reference: String,
    },
    #[error("credential {credential}: {detail}")]
    Invalid { credential: String, detail: String },
}

/// Reads secrets: environment variables at every use, files again whenever they changed.
#[derive(Debug, Default)]
pub struct Secrets {
    files: Mutex<HashMap<PathBuf, FileSecret>>,
}

#[derive(Debug, Clone)]
struct FileSecret {
    modified: Option<SystemTime>,
    len: u64,
    text: Arc<str>,
}

/// What [`Secrets::read`] hands out: the text, never shown by `Debug`.
pub struct SecretText(Arc<str>);

impl SecretText {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(sluice_core::secret::REDACTED)
    }
}

impl Secrets {
    pub fn new() -> Self {
        Self::default()
    }

    /// The secret's text, surrounding whitespace trimmed.
    pub fn read(
        &self,
        credential: &str,
        reference: &SecretRef,
    ) -> Result<SecretText, CredentialError> {
        let text: Arc<str> = match reference {
            SecretRef::Env(name) => match std::env::var(name) {
                Ok(value) => Arc::from(value.trim()),
                Err(_) => {
                    return Err(CredentialError::Unset {
                        credential: credential.to_owned(),
                        reference: reference.to_string(),
                    });
                }
            },
            SecretRef::File(path) => self.read_file(credential, reference, path)?,
        };
        if text.is_empty() {
            return Err(CredentialError::Empty {
                credential: credential.to_owned(),
                reference: reference.to_string(),
            });
        }
        Ok(SecretText(text))
    }

    fn read_file(
        &self,
        credential: &str,
        reference: &SecretRef,
        path: &Path,
    ) -> Result<Arc<str>, CredentialError> {
        let unreadable = |detail: std::io::Error| CredentialError::Unreadable {
            credential: credential.to_owned(),
            reference: reference.to_string(),
            detail: detail.kind().to_string(),
        };
        // Kubernetes swaps a mounted secret by moving a symlink: the metadata of the path (which
        // follows it) changes with the content, so a changed file is noticed without reading it.
        let metadata = fs::metadata(path).map_err(unreadable)?;
        let modified = metadata.modified().ok();
        let len = metadata.len();
        if let Ok(files) = self.files.lock() {
            if let Some(cached) = files.get(path) {
                if cached.modified == modified && cached.len == len && modified.is_some() {
                    return Ok(Arc::clone(&cached.text));
                }
            }
        }
        let text: Arc<str> = Arc::from(fs::read_to_string(path).map_err(unreadable)?.trim());
        if let Ok(mut files) = self.files.lock() {
            files.insert(
                path.to_owned(),
                FileSecret {
                    modified,
                    len,
                    text: Arc::clone(&text),
                },
            );
        }
        Ok(text)
    }

    /// Checks at start that every secret the catalog references can be read and every key is
    /// well formed, listing every problem (so a deployment fails before its first call, not at
    /// it).
    pub fn check(&self, catalog: &Catalog) -> Result<(), Vec<CredentialError>> {
        let mut problems = Vec::new();
        for credential in catalog.credentials() {
            for reference in credential.kind.secrets() {
                if let Err(error) = self.read(&credential.name, reference) {
                    problems.push(error);
                }
            }
            if let CredentialKind::StandardWebhooks { keys } = &credential.kind {
                if let Err(error) = self.webhook_keys(&credential.name, keys) {
                    if !problems.contains(&error) {
                        problems.push(error);
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Every `whsec_` key the references hold, decoded.
    fn webhook_keys(
        &self,
        credential: &str,
        refs: &[SecretRef],
    ) -> Result<Vec<Vec<u8>>, CredentialError> {
        let mut keys = Vec::new();
        for reference in refs {
            let text = self.read(credential, reference)?;
            for key in text.expose().split_whitespace() {
                keys.push(
                    decode_webhook_key(key).map_err(|detail| CredentialError::Invalid {
                        credential: credential.to_owned(),
                        detail: format!("{reference}: {detail}"),
                    })?,
                );
            }
        }
        Ok(keys)
    }
}

/// A `whsec_<base64>` key's bytes (the rule lives in the core, where the configuration's
/// webhook subscriptions are checked by it too). The error never quotes the key.
pub use sluice_core::webhook::decode_key as decode_webhook_key;

/// The Standard Webhooks signature header for `id.timestamp.body` under every key:
/// `v1,<base64> v1,<base64>`.
pub fn webhook_signature(keys: &[Vec<u8>], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut signatures = Vec::with_capacity(keys.len());
    for key in keys {
        // HMAC takes a key of any length; `new_from_slice` cannot fail for it.
        let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(key) else {
            continue;
        };
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        signatures.push(format!("v1,{}", BASE64.encode(mac.finalize().into_bytes())));
    }
    signatures.join(" ")
}

/// How secrets are written into a request: for sending, or masked for a dry run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Send,
    /// Each secret's place shows `<secret: env NAME>`; signatures are made with no key.
    Masked,
}

/// A request about to be sent, as the credentials see it.
#[derive(Debug)]
pub struct Outgoing<'a> {
    pub method: &'a Method,
    pub url: &'a Url,
    pub headers: &'a mut HeaderMap,
    pub body: &'a [u8],
}

/// Applies `credentials` (already ordered, signers last) to the request.
pub fn apply(
    secrets: &Secrets,
    credentials: &[Arc<Credential>],
    request: Outgoing<'_>,
    mode: Mode,
    now: SystemTime,
) -> Result<(), CredentialError> {
    for credential in credentials {
        apply_one(
            secrets,
            credential,
            request.method,
            request.url,
            &mut *request.headers,
            request.body,
            mode,
            now,
        )?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn apply_one(
    secrets: &Secrets,
    credential: &Credential,
    method: &Method,
    url: &Url,
    headers: &mut HeaderMap,
    body: &[u8],
    mode: Mode,
    now: SystemTime,
) -> Result<(), CredentialError> {
    let name = credential.name.as_str();
    let read = |reference: &SecretRef| -> Result<String, CredentialError> {
        match mode {
            Mode::Send => secrets
                .read(name, reference)
                .map(|text| text.expose().to_owned()),
            Mode::Masked => Ok(format!("<secret: {reference}>")),
        }
    };
    let invalid = |detail: String| CredentialError::Invalid {
        credential: name.to_owned(),
        detail,
    };
    let set = |headers: &mut HeaderMap, header: HeaderName, text: &str| {
        let mut value = HeaderValue::from_str(text)
            .map_err(|_| invalid(format!("the {header} value is not a valid header value")))?;
        value.set_sensitive(true);
        headers.insert(header, value);
        Ok::<(), CredentialError>(())
    };
    match &credential.kind {
        CredentialKind::Bearer { token } => {
            let token = read(token)?;
            set(headers, AUTHORIZATION, &format!("Bearer {token}"))
        }
        CredentialKind::Basic { username, password } => {
            let username = match username {
                TextOrSecret::Text(text) => text.clone(),
                TextOrSecret::Secret(reference) => read(reference)?,
            };
            let password = read(password)?;
            let encoded = match mode {
                Mode::Send => BASE64.encode(format!("{username}:{password}")),
                Mode::Masked => format!("base64({username}:{password})"),
            };
            set(headers, AUTHORIZATION, &format!("Basic {encoded}"))
        }
        CredentialKind::Header {
            header,
            prefix,
            value,
        } => {
            let value = read(value)?;
            let header = HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| invalid(format!("{header:?} is not a header name")))?;
            set(headers, header, &format!("{prefix}{value}"))
        }
        CredentialKind::StandardWebhooks { keys } => {
            let id = format!("msg_{}", uuid::Uuid::now_v7().simple());
            let timestamp = now.duration_since(UNIX_EPOCH).map_or(0, |at| at.as_secs());
            let signature = match mode {
                Mode::Send => {
                    let keys = secrets.webhook_keys(name, keys)?;
                    webhook_signature(&keys, &id, timestamp, body)
                }
                Mode::Masked => keys
                    .iter()
                    .map(|reference| {
                        format!("v1,<HMAC-SHA256 of id.timestamp.body under {reference}>")
                    })
                    .collect::<Vec<_>>()
                    .join(" "),
            };
            set(headers, HeaderName::from_static(WEBHOOK_ID), &id)?;
            set(
                headers,
                HeaderName::from_static(WEBHOOK_TIMESTAMP),
                &timestamp.to_string(),
            )?;
            set(
                headers,
                HeaderName::from_static(WEBHOOK_SIGNATURE),
                &signature,
            )
        }
        CredentialKind::AwsSigV4 {
            service,
            region,
            access_key_id,
            secret_access_key,
            session_token,
        } => {
            if mode == Mode::Masked {
                let access = read(access_key_id)?;
                set(
                    headers,
                    AUTHORIZATION,
                    &format!(
                        "AWS4-HMAC-SHA256 Credential={access}/…/{region}/{service}/aws4_request, SignedHeaders=…, Signature=<signature>"
                    ),
                )?;
                return Ok(());
            }
            let access = read(access_key_id)?;
            let secret = read(secret_access_key)?;
            let token = session_token.as_ref().map(&read).transpose()?;
            sign_v4(
                SigV4 {
                    service,
                    region,
                    access: &access,
                    secret: &secret,
                    token: token.as_deref(),
                },
                method,
                url,
                headers,
                body,
                now,
            )
            .map_err(invalid)
        }
    }
}

struct SigV4<'a> {
    service: &'a str,
    region: &'a str,
    access: &'a str,
    secret: &'a str,
    token: Option<&'a str>,
}

/// Signs with `aws-sigv4` and writes its headers (`authorization`, `x-amz-date`,
/// `x-amz-content-sha256`, `x-amz-security-token`) into the request.
fn sign_v4(
    key: SigV4<'_>,
    method: &Method,
    url: &Url,
    headers: &mut HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> Result<(), String> {
    use aws_sigv4::http_request::{
        PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
        UriPathNormalizationMode, sign,
    };
    use aws_sigv4::sign::v4;
    use aws_smithy_runtime_api::client::identity::Identity;

    let identity: Identity = aws_credential_types::Credentials::new(
        key.access,
        key.secret,
        key.token.map(str::to_owned),
        None,
        "sluice-catalog",
    )
    .into();
    let mut settings = SigningSettings::default();
    // S3 requires the payload hash header; the other services accept it.
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    // S3 signs the path as sent: encoded once and not normalised (an object name may hold an
    // encoded "/" or "//"), as the AWS SDKs sign it; every other service wants it encoded
    // twice. Signed the other way, an object named by Sluice's key (`%2F`) is refused with
    // SignatureDoesNotMatch.
    if key.service.starts_with("s3") {
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
    }
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(key.region)
        .name(key.service)
        .time(now)
        .settings(settings)
        .build()
        .map_err(|error| format!("SigV4 parameters: {error}"))?
        .into();
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new(
        method.as_str(),
        url.as_str(),
        pairs.into_iter(),
        SignableBody::Bytes(body),
    )
    .map_err(|error| format!("SigV4 request: {error}"))?;
    let (instructions, _signature) = sign(signable, &params)
        .map_err(|error| format!("SigV4 signing: {error}"))?
        .into_parts();
    let (signed, _params) = instructions.into_parts();
    for header in signed {
        let name = HeaderName::from_bytes(header.name().as_bytes())
            .map_err(|_| format!("SigV4 produced header {:?}", header.name()))?;
        let mut value = HeaderValue::from_str(header.value())
            .map_err(|_| format!("SigV4 produced a bad value for {name}"))?;
        value.set_sensitive(header.sensitive() || name == AUTHORIZATION);
        headers.insert(name, value);
    }
    Ok(())
}
