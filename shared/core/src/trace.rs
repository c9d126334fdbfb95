//! W3C Trace Context (`traceparent`, `tracestate`): parsed once at the boundary, stored with
//! the command and passed on, so one effect is one trace across the services and the upstream.
//!
//! Parsing follows the W3C Trace Context recommendation (level 1, with level 2's rule for
//! future versions): a `traceparent` that does not parse is ignored *with* its `tracestate`;
//! a `tracestate` that does not parse is dropped alone. Nothing here is a secret, but
//! `tracestate` is a vendor's opaque text, so it is bounded and never interpreted.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Longest `tracestate` kept (the recommendation asks to propagate at least 512 characters;
/// longer ones may be dropped).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// Most list members a `tracestate` may hold.
const MAX_TRACESTATE_MEMBERS: usize = 32;

/// A validated trace context: the `traceparent` in its version-00 form and the `tracestate`
/// that came with it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    /// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lowercase.
    pub traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl fmt::Debug for TraceContext {
    // tracestate is a vendor's opaque text: shown by its length only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceContext")
            .field("traceparent", &self.traceparent)
            .field("tracestate_len", &self.tracestate.as_ref().map(String::len))
            .finish()
    }
}

impl TraceContext {
    /// The context of a request's headers, or `None` when `traceparent` is absent or invalid.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = parse_traceparent(traceparent.trim_matches([' ', '\t']))?;
        Some(Self {
            traceparent,
            tracestate: tracestate.and_then(parse_tracestate),
        })
    }

    /// A context from its parts (`flags` bit 0: sampled); `None` for an all-zero id.
    pub fn from_parts(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        flags: u8,
        tracestate: Option<String>,
    ) -> Option<Self> {
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            traceparent: format!(
                "00-{}-{}-{flags:02x}",
                hex::encode(trace_id),
                hex::encode(span_id)
            ),
            tracestate: tracestate.as_deref().and_then(parse_tracestate),
        })
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The parent (span) id, 16 lowercase hex digits.
    pub fn parent_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The trace id as bytes.
    pub fn trace_id_bytes(&self) -> [u8; 16] {
        let mut out = [0; 16];
        // Validated at construction: 32 hex digits.
        let _ = hex::decode_to_slice(self.trace_id(), &mut out);
        out
    }

    /// The parent id as bytes.
    pub fn parent_id_bytes(&self) -> [u8; 8] {
        let mut out = [0; 8];
        let _ = hex::decode_to_slice(self.parent_id(), &mut out);
        out
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        u8::from_str_radix(&self.traceparent[53..55], 16).unwrap_or(0)
    }

    /// The same trace under another parent: what a participant sends on for a span of its own.
    #[must_use]
    pub fn with_parent(&self, span_id: [u8; 8]) -> Self {
        Self::from_parts(
            self.trace_id_bytes(),
            span_id,
            self.flags(),
            self.tracestate.clone(),
        )
        .unwrap_or_else(|| self.clone())
    }
}

fn is_lower_hex(text: &str) -> bool {
    text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The version-00 form of a valid `traceparent`. Version `ff` is invalid; a higher version is
/// read as 00 if its first four fields are, and only then may more follow after a `-`.
fn parse_traceparent(raw: &str) -> Option<String> {
    if raw.len() < 55 || !raw.is_ascii() {
        return None;
    }
    let version = &raw[0..2];
    if !is_lower_hex(version) || version == "ff" {
        return None;
    }
    if version == "00" && raw.len() != 55 {
        return None;
    }
    if raw.len() > 55 && raw.as_bytes()[55] != b'-' {
        return None;
    }
    let bytes = raw.as_bytes();
    if bytes[2] != b'-' || bytes[35] != b'-' || bytes[52] != b'-' {
        return None;
    }
    let (trace_id, parent_id, flags) = (&raw[3..35], &raw[36..52], &raw[53..55]);
    if !is_lower_hex(trace_id) || !is_lower_hex(parent_id) || !is_lower_hex(flags) {
        return None;
    }
    if trace_id.bytes().all(|b| b == b'0') || parent_id.bytes().all(|b| b == b'0') {
        return None;
    }
    // A future version's flags other than `sampled` are not ours to pass on.
    let flags = if version == "00" {
        flags.to_owned()
    } else {
        format!("{:02x}", u8::from_str_radix(flags, 16).ok()? & 1)
    };
    Some(format!("00-{trace_id}-{parent_id}-{flags}"))
}

/// A `tracestate` whose members are all well formed, trimmed of optional whitespace and empty
/// members; `None` if any member is malformed, a key repeats, or it is too long.
fn parse_tracestate(raw: &str) -> Option<String> {
    if raw.len() > MAX_TRACESTATE_LEN * 2 {
        return None;
    }
    let mut members: Vec<&str> = Vec::new();
    let mut keys: Vec<&str> = Vec::new();
    for member in raw.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue;
        }
        let (key, value) = member.split_once('=')?;
        if !valid_key(key) || !valid_value(value) || keys.contains(&key) {
            return None;
        }
        keys.push(key);
        members.push(member);
    }
    if members.is_empty() || members.len() > MAX_TRACESTATE_MEMBERS {
        return None;
    }
    let joined = members.join(",");
    (joined.len() <= MAX_TRACESTATE_LEN).then_some(joined)
}

/// `simple-key` or `tenant-id@system-id`.
fn valid_key(key: &str) -> bool {
    let part = |text: &str, max: usize, first_digit_ok: bool| {
        !text.is_empty()
            && text.len() <= max
            && text.bytes().enumerate().all(|(i, b)| match b {
                b'a'..=b'z' => true,
                b'0'..=b'9' => i > 0 || first_digit_ok,
                b'_' | b'-' | b'*' | b'/' => i > 0,
                _ => false,
            })
    };
    match key.split_once('@') {
        Some((tenant, system)) => part(tenant, 241, true) && part(system, 14, false),
        None => part(key, 256, false),
    }
}

/// 1–256 printable ASCII characters other than `,` and `=`, not ending in a space.
fn valid_value(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 256
        && !value.ends_with(' ')
        && value
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b',' && b != b'=')
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_with_its_parts() {
        let ctx = TraceContext::parse(VALID, Some("congo=t61rcWkgMzE")).expect("valid");
        assert_eq!(ctx.traceparent, VALID);
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.parent_id(), "00f067aa0ba902b7");
        assert_eq!(ctx.flags(), 1);
        assert_eq!(ctx.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        let child = ctx.with_parent([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(child.trace_id(), ctx.trace_id());
        assert_eq!(child.parent_id(), "0102030405060708");
        assert_eq!(child.tracestate, ctx.tracestate);
    }

    #[test]
    fn invalid_traceparents_are_ignored_with_their_tracestate() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceContext::parse(bad, Some("a=b")), None, "{bad:?}");
        }
    }

    #[test]
    fn a_future_version_is_read_as_00() {
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03-what-the-future";
        let ctx = TraceContext::parse(future, None).expect("readable");
        assert_eq!(
            ctx.traceparent,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        );
    }

    #[test]
    fn a_malformed_tracestate_is_dropped_alone() {
        for bad in [
            "no-equals",
            "Upper=1",
            "a=1,a=2",
            "a=va,lue=",
            "a=x y=z",
            "1abc=x",
        ] {
            let ctx = TraceContext::parse(VALID, Some(bad)).expect("traceparent kept");
            assert_eq!(ctx.tracestate, None, "{bad:?}");
        }
        let ctx = TraceContext::parse(VALID, Some(" rojo=00f067aa0ba902b7 ,, tenant@vendor=x "))
            .expect("valid");
        assert_eq!(
            ctx.tracestate.as_deref(),
            Some("rojo=00f067aa0ba902b7,tenant@vendor=x")
        );
        let long = (0..40)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            TraceContext::parse(VALID, Some(&long))
                .expect("valid")
                .tracestate,
            None
        );
    }

    #[test]
    fn tracestate_is_not_shown_by_debug() {
        let ctx = TraceContext::parse(VALID, Some("vendor=opaque-value")).expect("valid");
        let shown = format!("{ctx:?}");
        assert!(!shown.contains("opaque-value"), "{shown}");
        assert!(shown.contains(VALID), "{shown}");
    }
}
