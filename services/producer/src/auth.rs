//! Who is calling: bearer tokens from `[auth]` mapped to a [`Principal`] with a [`Role`].
//!
//! Only the SHA-256 digest of each configured token is kept in memory. A presented token is
//! hashed and compared with *every* digest in constant time (no early exit), so neither the
//! comparison nor the number of entries checked tells an attacker how close a guess was. Tokens
//! never reach a log line or an error message: an error says only that the token is missing or
//! not recognised.
//!
//! With no tokens configured the API is open and every caller is the anonymous admin; the
//! configuration refuses that beyond loopback (see `AuthConfig`).

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sluice_core::command::Command;
use sluice_core::ids::RunId;
use sluice_core::tenant::TenantRefusal;
use sluice_runtime::config::{AuthConfig, Role};
use subtle::ConstantTimeEq;

use crate::{Api, ApiError};

/// The caller of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// The token's name: the actor in the audit chain and the owner of submitted runs.
    pub name: String,
    pub role: Role,
    /// False in open mode (no tokens configured).
    pub authenticated: bool,
    /// The tenants it may submit for besides itself (`auth.tokens[].tenants`).
    pub tenants: Vec<String>,
}

/// What a route needs of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Submit effects: an agent or an admin.
    Submit,
    /// Read one run: its owning agent, an operator or an admin.
    ReadRun,
    /// Read across runs: an operator or an admin.
    ReadAll,
    /// Change a command or a run by hand, or purge: an admin.
    Admin,
    /// Cancel a scheduled effect (DELETE): its owning agent or an admin.
    RemoveScheduled,
    /// Roll a run back: its owning agent (undoing its own failed run) or an admin.
    Rollback,
    /// Read the catalog's tools: any authenticated caller.
    Discover,
}

impl Need {
    fn describe(self) -> &'static str {
        match self {
            Self::Submit => "submitting effects needs an agent or admin token",
            Self::ReadRun => "reading a run needs its agent's token, or an operator or admin token",
            Self::ReadAll => "reading across runs needs an operator or admin token",
            Self::Admin => "this operator action needs an admin token",
            Self::RemoveScheduled => "removing an effect needs its agent's token or an admin token",
            Self::Rollback => "rolling a run back needs its agent's token or an admin token",
            Self::Discover => "reading the tools needs a token",
        }
    }
}

/// The configured tokens, by digest.
#[derive(Clone)]
pub struct Authenticator {
    entries: Vec<([u8; 32], Principal)>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("tokens", &self.entries.len())
            .finish()
    }
}

/// The SHA-256 digest of a token.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl Authenticator {
    /// Keeps the digests of the configured tokens (the configuration was validated at load).
    pub fn from_config(config: &AuthConfig) -> Self {
        let entries = config
            .tokens
            .iter()
            .filter_map(|entry| {
                let digest = match (&entry.token, &entry.token_sha256) {
                    (Some(token), _) => digest(token),
                    (None, Some(hex_digest)) => {
                        let bytes = hex::decode(hex_digest).ok()?;
                        <[u8; 32]>::try_from(bytes.as_slice()).ok()?
                    }
                    (None, None) => return None,
                };
                Some((
                    digest,
                    Principal {
                        name: entry.name.clone(),
                        role: entry.role,
                        authenticated: true,
                        tenants: entry.tenants.clone(),
                    },
                ))
            })
            .collect();
        Self { entries }
    }

    /// True when no token is configured: every caller is the anonymous admin.
    pub fn is_open(&self) -> bool {
        self.entries.is_empty()
    }

    /// The principal of an `Authorization` header value.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, ApiError> {
        if self.is_open() {
            return Ok(Principal {
                name: "anonymous".into(),
                role: Role::Admin,
                authenticated: false,
                tenants: Vec::new(),
            });
        }
        let token = authorization
            .and_then(|value| {
                let (scheme, token) = value.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|token| !token.is_empty())
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    "missing bearer token: send Authorization: Bearer <token>",
                )
            })?;
        let presented = digest(token);
        let mut found: Option<&Principal> = None;
        for (known, principal) in &self.entries {
            // Every entry is compared, whatever matched before.
            if bool::from(known.ct_eq(&presented)) {
                found = Some(principal);
            }
        }
        found.cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "the bearer token is not recognised",
            )
        })
    }
}

impl Principal {
    /// Whether the caller's role allows `need` at all (before any ownership check).
    pub fn may(&self, need: Need) -> bool {
        match need {
            Need::Submit => matches!(self.role, Role::Agent | Role::Admin),
            Need::ReadRun | Need::Discover => true,
            Need::ReadAll => matches!(self.role, Role::Operator | Role::Admin),
            Need::Admin => self.role == Role::Admin,
            Need::RemoveScheduled | Need::Rollback => {
                matches!(self.role, Role::Agent | Role::Admin)
            }
        }
    }

    /// Fails with 403 unless the role allows `need`.
    pub fn require(&self, need: Need) -> Result<(), ApiError> {
        if self.may(need) {
            Ok(())
        } else {
            Err(forbidden(self, need.describe()))
        }
    }

    /// The submitter recorded on commands: the token's name, or none in open mode.
    pub fn submitter(&self) -> Option<&str> {
        self.authenticated.then_some(self.name.as_str())
    }

    /// The tenant a submission is recorded under: this principal (the anonymous one in open
    /// mode), or the tenant it `named` if it may name it (`sluice_core::tenant::choose`): 422
    /// for a malformed name, 403 for one it may not.
    pub fn tenant(&self, named: Option<&str>) -> Result<std::sync::Arc<str>, ApiError> {
        let me = self.submitter().unwrap_or(sluice_core::tenant::ANONYMOUS);
        sluice_core::tenant::choose(me, named, &self.tenants).map_err(|refused| match refused {
            TenantRefusal::Malformed(e) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                e.to_string(),
            )
            .with_details(serde_json::json!({ "pointer": "/tenant" })),
            e @ TenantRefusal::NotAllowed { .. } => forbidden(self, &e.to_string()),
        })
    }

    /// For an agent, checks that the run exists and that its commands were submitted by it: an
    /// agent may read and act only on its own runs. Operators and admins see every run.
    pub fn require_owner(&self, run_id: &RunId, commands: &[Command]) -> Result<(), ApiError> {
        if self.role == Role::Agent && self.authenticated && commands.is_empty() {
            return Err(forbidden(
                self,
                &format!("run {run_id} has no commands of agent {}", self.name),
            ));
        }
        self.require_no_foreign(run_id, commands)
    }

    /// For an agent, checks that none of the run's commands belong to someone else (a new run
    /// is fine): an agent adds effects to its own runs only.
    pub fn require_no_foreign(&self, run_id: &RunId, commands: &[Command]) -> Result<(), ApiError> {
        if self.role != Role::Agent || !self.authenticated {
            return Ok(());
        }
        let foreign = commands
            .iter()
            .any(|c| c.submitted_by.as_deref() != Some(self.name.as_str()));
        if foreign {
            return Err(forbidden(
                self,
                &format!("run {run_id} was not submitted by agent {}", self.name),
            ));
        }
        Ok(())
    }
}

fn forbidden(principal: &Principal, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "{why} (you are {} with role {})",
            principal.name, principal.role
        ),
    )
}

/// The authenticated caller of a request; extracting it answers 401 by itself.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<Api> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Self, Self::Rejection> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        api.auth.authenticate(header).map(Caller)
    }
}

#[cfg(test)]
mod tests {
    use sluice_runtime::config::TokenConfig;

    use super::*;

    fn auth() -> Authenticator {
        Authenticator::from_config(&AuthConfig {
            tokens: vec![
                TokenConfig {
                    name: "bot".into(),
                    role: Role::Agent,
                    token: Some("agent-token-0123456789".into()),
                    token_sha256: None,
                    tenants: Vec::new(),
                },
                TokenConfig {
                    name: "ops".into(),
                    role: Role::Admin,
                    token: None,
                    token_sha256: Some(hex::encode(digest("admin-token-0123456789"))),
                    tenants: Vec::new(),
                },
            ],
        })
    }

    #[test]
    fn tokens_map_to_principals_by_digest() {
        let auth = auth();
        let bot = auth
            .authenticate(Some("Bearer agent-token-0123456789"))
            .expect("known");
        assert_eq!((bot.name.as_str(), bot.role), ("bot", Role::Agent));
        let ops = auth
            .authenticate(Some("bearer admin-token-0123456789"))
            .expect("known by digest");
        assert_eq!(ops.role, Role::Admin);
        for header in [
            None,
            Some("Bearer"),
            Some("Bearer "),
            Some("Basic agent-token-0123456789"),
            Some("Bearer agent-token-012345678"),
        ] {
            let err = auth.authenticate(header).expect_err("refused");
            assert_eq!(err.status(), StatusCode::UNAUTHORIZED, "{header:?}");
            assert!(!err.message().contains("token-0123"), "no token in errors");
        }
    }

    #[test]
    fn roles_allow_what_they_should() {
        let who = |role| Principal {
            name: "x".into(),
            role,
            authenticated: true,
            tenants: Vec::new(),
        };
        let table = [
            (Need::Submit, [true, false, true]),
            (Need::ReadRun, [true, true, true]),
            (Need::ReadAll, [false, true, true]),
            (Need::Admin, [false, false, true]),
            (Need::RemoveScheduled, [true, false, true]),
        ];
        for (need, allowed) in table {
            for (role, allowed) in [Role::Agent, Role::Operator, Role::Admin]
                .into_iter()
                .zip(allowed)
            {
                assert_eq!(who(role).may(need), allowed, "{role} {need:?}");
            }
        }
    }

    #[test]
    fn open_mode_is_the_anonymous_admin_that_owns_nothing() {
        let open = Authenticator::from_config(&AuthConfig::default());
        let anyone = open.authenticate(None).expect("open");
        assert_eq!(anyone.role, Role::Admin);
        assert_eq!(anyone.submitter(), None);
    }
}
