//! Tenants: whose share of the pipeline an effect counts against, and whether a tenant may put
//! one more effect in flight.
//!
//! A command's tenant is the principal that submitted it, or a tenant that principal is allowed
//! to name (a platform's one token submitting for each of its customers). Commands recorded
//! before tenants existed read as their submitter, and those recorded without authentication as
//! [`ANONYMOUS`], the open API's principal.
//!
//! A tenant's quota bounds its effects *in flight*: recorded and not yet in a final status
//! (`CommandStatus::is_terminal`; STUCK and BLOCKED count, since they still wait for someone).
//! A submission that would pass it is refused before anything is recorded (429 with
//! `Retry-After`): [`admit`]. How the services count what is in flight, and how exact that is
//! across producer replicas, is in docs/decisions.md, "Tenants".

use std::fmt;
use std::sync::Arc;

pub mod hold;
pub mod lanes;

/// The tenant of commands recorded without authentication (the open API's principal).
pub const ANONYMOUS: &str = "anonymous";

/// The longest tenant name: a token's name is a tenant, and they share one syntax.
pub const MAX_TENANT_CHARS: usize = 64;

/// A tenant name that is not 1 to 64 letters, digits, `-`, `_`, `.` or `@`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tenant {0:?} is malformed: a tenant is 1 to {MAX_TENANT_CHARS} letters, digits, '-', '_', '.' or '@'"
)]
pub struct MalformedTenant(pub String);

/// Checks a tenant's name; the same syntax as a token's name (`auth.tokens[].name`).
pub fn parse(name: &str) -> Result<Arc<str>, MalformedTenant> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'));
    if ok {
        Ok(Arc::from(name))
    } else {
        Err(MalformedTenant(name.chars().take(80).collect()))
    }
}

/// Why a principal may not submit as the tenant it named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantRefusal {
    /// 422: not a tenant name at all.
    #[error(transparent)]
    Malformed(#[from] MalformedTenant),
    /// 403: a tenant this principal may not name.
    #[error(
        "{principal} may not submit for tenant {named:?}; it may submit for itself{}",
        allowed_list(.allowed)
    )]
    NotAllowed {
        principal: String,
        named: String,
        allowed: Vec<String>,
    },
}

fn allowed_list(allowed: &[String]) -> String {
    if allowed.is_empty() {
        " only (auth.tokens[].tenants names none)".to_owned()
    } else {
        format!(" and for {}", allowed.join(", "))
    }
}

/// The tenant a submission is recorded under: the principal itself unless it named one, and a
/// named one only if it is the principal or among those it may name (`allowed`, from its
/// token's `tenants`).
pub fn choose(
    principal: &str,
    named: Option<&str>,
    allowed: &[String],
) -> Result<Arc<str>, TenantRefusal> {
    let Some(named) = named else {
        return Ok(Arc::from(principal));
    };
    let tenant = parse(named)?;
    if &*tenant == principal || allowed.iter().any(|a| a.as_str() == &*tenant) {
        Ok(tenant)
    } else {
        Err(TenantRefusal::NotAllowed {
            principal: principal.to_owned(),
            named: named.to_owned(),
            allowed: allowed.to_vec(),
        })
    }
}

/// A submission refused because its tenant holds its whole quota in flight: 429, nothing
/// recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverQuota {
    pub tenant: Arc<str>,
    pub quota: u64,
    pub in_flight: u64,
    /// The `Retry-After` to answer with, in whole seconds (at least 1).
    pub retry_after_s: u64,
}

impl fmt::Display for OverQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tenant {} has {} effects in flight and its quota is {}; nothing was recorded: \
             submit again after {} s, or once some of them reach a final status",
            self.tenant, self.in_flight, self.quota, self.retry_after_s
        )
    }
}

/// The longest `Retry-After` a quota refusal asks for.
pub const MAX_RETRY_AFTER_S: u64 = 3_600;

/// Whether `tenant`, with `in_flight` effects not yet final, may put one more in flight under
/// `quota` (`None`: no quota). Refused, the client is asked to come back after `retry_after_ms`
/// (rounded up to whole seconds, 1 s to an hour): how soon a tenant's effects settle is the
/// upstreams' business, so the wait is the operator's estimate, not a promise.
pub fn admit(
    tenant: &Arc<str>,
    in_flight: u64,
    quota: Option<u64>,
    retry_after_ms: u64,
) -> Result<(), OverQuota> {
    match quota {
        Some(quota) if in_flight >= quota => Err(OverQuota {
            tenant: Arc::clone(tenant),
            quota,
            in_flight,
            retry_after_s: retry_after_ms.div_ceil(1_000).clamp(1, MAX_RETRY_AFTER_S),
        }),
        Some(_) | None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_token_name_syntax() {
        for good in ["acme", "acme-eu.prod_1", "ops@example.com", &"a".repeat(64)] {
            assert_eq!(parse(good).as_deref(), Ok(good), "{good}");
        }
        for bad in ["", "acme corp", "acme/eu", "ünï", &"a".repeat(65)] {
            let refused = parse(bad).expect_err(bad);
            assert!(refused.to_string().contains("malformed"), "{refused}");
        }
    }

    #[test]
    fn a_principal_submits_as_itself_or_a_tenant_it_may_name() {
        let allowed = vec!["acme".to_owned(), "globex".to_owned()];
        assert_eq!(
            choose("platform", None, &allowed).as_deref(),
            Ok("platform")
        );
        assert_eq!(
            choose("platform", Some("platform"), &[]).as_deref(),
            Ok("platform")
        );
        assert_eq!(
            choose("platform", Some("globex"), &allowed).as_deref(),
            Ok("globex")
        );
        let refused = choose("platform", Some("initech"), &allowed).expect_err("not listed");
        assert!(matches!(refused, TenantRefusal::NotAllowed { .. }));
        let said = refused.to_string();
        assert!(
            said.contains("platform") && said.contains("initech") && said.contains("acme, globex"),
            "{said}"
        );
        let refused = choose("bot", Some("acme"), &[]).expect_err("names none");
        assert!(refused.to_string().contains("names none"), "{refused}");
        assert!(matches!(
            choose("platform", Some("acme corp"), &allowed),
            Err(TenantRefusal::Malformed(_))
        ));
    }

    #[test]
    fn a_quota_admits_up_to_its_size_and_refuses_at_it() {
        let acme: Arc<str> = Arc::from("acme");
        assert_eq!(admit(&acme, 1_000_000, None, 1_000), Ok(()));
        assert_eq!(admit(&acme, 2, Some(3), 1_000), Ok(()));
        let refused = admit(&acme, 3, Some(3), 1_500).expect_err("at quota");
        assert_eq!(
            (refused.quota, refused.in_flight, refused.retry_after_s),
            (3, 3, 2)
        );
        let said = refused.to_string();
        assert!(
            said.contains("acme")
                && said.contains("3 effects in flight")
                && said.contains("quota is 3"),
            "{said}"
        );
        // A stale count above the quota is refused the same way; a zero quota refuses all.
        assert!(admit(&acme, 9, Some(3), 0).is_err());
        assert_eq!(
            admit(&acme, 0, Some(0), 0).map_err(|r| r.retry_after_s),
            Err(1)
        );
        assert_eq!(
            admit(&acme, 5, Some(1), u64::MAX).map_err(|r| r.retry_after_s),
            Err(MAX_RETRY_AFTER_S)
        );
    }
}
