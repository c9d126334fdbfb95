//! `[upstream.<name>]`: an upstream several tools share, with its rate, its cap on calls in
//! flight and its circuit breaker (`crate::flow`). A tool joins one with `upstream = "<name>"`;
//! a tool that names none is its own upstream, with no limit and no breaker.
//!
//! ```toml
//! [upstream.bank]
//! rate = "50/s"          # calls per period over every dispatcher replica together
//! burst = 10             # calls that may go at once after a quiet spell (default 1)
//! max_in_flight = 8      # calls at once over every replica
//! [upstream.bank.breaker]
//! failures = 5           # failing answers in a row (5xx, timeouts, refused) that open it
//! open_ms = 30000        # open this long before a probe (default 30 s)
//! max_open_ms = 300000   # each failed probe doubles the time, up to this (default 5 min)
//! probe_ms = 30000       # a probe's holder reports within this (default 30 s)
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use super::error::CatalogError;
use crate::flow::{BreakerSpec, Rate, UpstreamSpec};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    rate: Option<String>,
    burst: Option<u32>,
    max_in_flight: Option<u32>,
    breaker: Option<RawBreaker>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreaker {
    failures: Option<u32>,
    open_ms: Option<u64>,
    max_open_ms: Option<u64>,
    probe_ms: Option<u64>,
}

/// Failing answers in a row that open a breaker unless declared.
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
pub const DEFAULT_BREAKER_OPEN_MS: u64 = 30_000;
pub const DEFAULT_BREAKER_MAX_OPEN_MS: u64 = 300_000;
pub const DEFAULT_PROBE_MS: u64 = 30_000;

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
        let breaker = raw
            .breaker
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
