//! `[upstream.<name>]`: an upstream several tools share, with its rate, its cap on calls in
//! flight and its circuit breaker (`crate::flow`). A tool joins one with `upstream = "<name>"`.
//!
//! Every upstream has a circuit breaker unless it says `breaker = false`: the default
//! thresholds below when it declares none. A tool that names no upstream joins the one of its
//! dispatch URL's host (host and port, as the HTTP `Host` header names it: tools calling the
//! same host share its breaker), which has the default breaker and no limit unless the catalog
//! declares an upstream of that name (`[upstream."api.stripe.com"]`). `breaker = false` on a
//! tool that names no upstream makes it its own upstream with no breaker. Why a breaker by default: a
//! transient outage must fail nothing (docs/decisions.md, "A breaker by default").
//!
//! ```toml
//! [upstream.bank]
//! rate = "50/s"          # calls per period over every dispatcher replica together
//! burst = 10             # calls that may go at once after a quiet spell (default 1)
//! max_in_flight = 8      # calls at once over every replica
//! # breaker = false      # no circuit breaker (default: one, with the thresholds below)
//! [upstream.bank.breaker]
//! failures = 5           # failing answers in a row (5xx, timeouts, refused) that open it
//! open_ms = 5000         # open this long before a probe (default 5 s)
//! max_open_ms = 300000   # each failed probe doubles the time, up to this (default 5 min)
//! probe_ms = 30000       # a probe's holder reports within this (default 30 s)
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::CatalogError;
use super::tool::Joins;
use crate::flow::{BreakerSpec, Rate, UpstreamSpec};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    rate: Option<String>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
    /// `false`, `true` or a `[breaker]` table; read on its own so its errors name the key.
    breaker: Option<toml::Value>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    failures: Option<u32>,
    open_ms: Option<u64>,
    max_open_ms: Option<u64>,
    probe_ms: Option<u64>,
}

/// Failing answers in a row that open a breaker unless declared: few enough that an outage
/// costs a handful of calls, more than the odd 5xx of a healthy upstream.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
/// How long a breaker stays open before its first probe unless declared: short, so a blip
/// costs seconds; a failed probe doubles it, so a long outage costs one call per
/// `DEFAULT_BREAKER_MAX_OPEN_MS`.
pub const DEFAULT_BREAKER_OPEN_MS: u64 = 5_000;
pub const DEFAULT_BREAKER_MAX_OPEN_MS: u64 = 300_000;
/// How long a probe's holder has to report: above the default call timeout (10 s).
pub const DEFAULT_PROBE_MS: u64 = 30_000;

/// The breaker of an upstream that declares no thresholds.
pub const DEFAULT_BREAKER: BreakerSpec = BreakerSpec {
    failures: DEFAULT_BREAKER_FAILURES,
    open_ms: DEFAULT_BREAKER_OPEN_MS,
    max_open_ms: DEFAULT_BREAKER_MAX_OPEN_MS,
    probe_ms: DEFAULT_PROBE_MS,
};

/// The upstream a tool naming none joins: its dispatch URL's host, with the port when the URL
/// names one other than the scheme's (`bank.example.com`, `127.0.0.1:8787`), lowercased.
/// `None` when the URL names no host (the catalog refuses a placeholder there); such a tool is
/// its own upstream, with the default breaker.
pub fn host_of(url: &str) -> Option<String> {
    // The WHATWG parser (the `url` crate) lowercases the host, drops credentials and reports
    // no port when it is the scheme's own. A placeholder in the host (`http://{host}/x`) names
    // no host yet, whatever the parser makes of its braces.
    let parsed = url::Url::parse(url).ok()?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty() && !h.contains(['{', '}']))?;
    Some(match parsed.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    })
}

/// The upstream a tool joins and how, from its `upstream` and `breaker` keys and its
/// dispatch URL; the error is the detail of a refusal.
pub(super) fn joins(
    named: Option<String>,
    breaker: Option<bool>,
    dispatch_url: &str,
    tool: &str,
) -> Result<(String, Joins), String> {
    match (named, breaker) {
        (Some(named), None | Some(true)) => Ok((named, Joins::Named)),
        (Some(named), Some(false)) => Err(format!(
            "breaker = false on a tool that joins upstream {named:?}: the breaker is the \
             upstream's; set breaker = false in [upstream.{named}]"
        )),
        (None, Some(false)) => Ok((tool.to_owned(), Joins::Alone)),
        (None, None | Some(true)) => Ok((
            host_of(dispatch_url).unwrap_or_else(|| tool.to_owned()),
            Joins::ByDefault,
        )),
    }
}

/// The spec of an upstream nobody declared: the default breaker, no limit.
pub fn by_default(name: &str) -> UpstreamSpec {
    UpstreamSpec {
        breaker: Some(DEFAULT_BREAKER),
        ..UpstreamSpec::unlimited(name)
    }
}

/// Checks an upstream's name: 1–64 of `[a-z0-9_.-]`, so it never reads as a tool's
/// (`namespace/name`) where both are named, as in a pause.
pub fn check_upstream_name(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        });
    if fine {
        Ok(())
    } else {
        Err(format!(
            "upstream name {name:?} must be 1-64 of a-z, 0-9, '_', '.', '-'"
        ))
    }
}

pub(super) fn build_upstreams(
    raw: BTreeMap<String, toml::Table>,
    file: &str,
) -> Result<BTreeMap<String, UpstreamSpec>, CatalogError> {
    let bad = |name: &str, detail: String| CatalogError::Malformed {
        file: file.to_owned(),
        detail: format!("upstream.{name}: {detail}"),
    };
    let mut built = BTreeMap::new();
    for (name, table) in raw {
        check_upstream_name(&name).map_err(|why| bad(&name, why))?;
        let raw = RawUpstream::deserialize(toml::Value::Table(table))
            .map_err(|error| bad(&name, super::raw::describe(&error)))?;
        let rate = raw
            .rate
            .as_deref()
            .map(str::parse::<Rate>)
            .transpose()
            .map_err(|why| bad(&name, format!("rate: {why}")))?;
        let burst = raw.burst.unwrap_or(1);
        if burst == 0 || burst > 100_000 {
            return Err(bad(&name, format!("burst is {burst}; it must be 1-100000")));
        }
        if raw.burst.is_some() && rate.is_none() {
            return Err(bad(&name, "burst is declared without a rate".into()));
        }
        if raw.max_in_flight == Some(0) {
            return Err(bad(
                &name,
                "max_in_flight is 0, which allows no call at all; pause the upstream instead"
                    .into(),
            ));
        }
        let breaker = match raw.breaker {
            None | Some(toml::Value::Boolean(true)) => Some(RawBreaker::default()),
            Some(toml::Value::Boolean(false)) => None,
            Some(table @ toml::Value::Table(_)) => {
                Some(RawBreaker::deserialize(table).map_err(|error| {
                    bad(&name, format!("breaker: {}", super::raw::describe(&error)))
                })?)
            }
            Some(other) => {
                return Err(bad(
                    &name,
                    format!(
                        "breaker is {other}; it must be false (no breaker), true or a [breaker] table"
                    ),
                ));
            }
        };
        let breaker = breaker
            .map(|b| {
                let spec = BreakerSpec {
                    failures: b.failures.unwrap_or(DEFAULT_BREAKER_FAILURES),
                    open_ms: b.open_ms.unwrap_or(DEFAULT_BREAKER_OPEN_MS),
                    max_open_ms: b.max_open_ms.unwrap_or(DEFAULT_BREAKER_MAX_OPEN_MS),
                    probe_ms: b.probe_ms.unwrap_or(DEFAULT_PROBE_MS),
                };
                if spec.failures == 0 {
                    return Err(bad(&name, "breaker.failures must be at least 1".into()));
                }
                if spec.open_ms == 0 || spec.probe_ms == 0 {
                    return Err(bad(
                        &name,
                        "breaker.open_ms and breaker.probe_ms must be over 0".into(),
                    ));
                }
                if spec.max_open_ms < spec.open_ms {
                    return Err(bad(
                        &name,
                        format!(
                            "breaker.max_open_ms ({}) is under breaker.open_ms ({})",
                            spec.max_open_ms, spec.open_ms
                        ),
                    ));
                }
                Ok(spec)
            })
            .transpose()?;
        built.insert(
            name.clone(),
            UpstreamSpec {
                name,
                rate,
                burst,
                max_in_flight: raw.max_in_flight,
                breaker,
            },
        );
    }
    Ok(built)
}
