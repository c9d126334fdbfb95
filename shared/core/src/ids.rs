//! Identifiers of the domain as validated newtypes.
//!
//! Every id that crosses a boundary (HTTP, bus, ledger) is parsed here once; past this module a
//! `RunId` or a `CommandKey` is known to be well formed. The idempotency key is derived from the
//! journal position (`<run_id>/d-<decision>/<tool>/<call_idx>`), never from the arguments, so the
//! same call on re-drive produces the same key.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::IdError;

/// Longest run id accepted, in bytes.
pub const MAX_RUN_ID_LEN: usize = 128;
/// Longest segment of a tool name (namespace or name), in bytes.
pub const MAX_TOOL_SEGMENT_LEN: usize = 64;
/// The namespace a bare tool name resolves in unless the catalog says otherwise.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Implements `Display`, `FromStr` and string serde for a newtype with a `parse` constructor.
/// `string_id!(T, as_str)` is for an id that holds its text: it serializes that text as it is.
macro_rules! string_id {
    ($ty:ident) => {
        string_id!(@common $ty);
        impl Serialize for $ty {
            // One string for the serializer: `collect_str` would escape every fragment the
            // formatter hands it on its own, and ids are serialized many times per effect.
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut inline = Inline::new();
                match self.write_repr(&mut inline) {
                    Ok(()) => serializer.serialize_str(inline.as_str()),
                    Err(_) => serializer.collect_str(self),
                }
            }
        }
    };
    ($ty:ident, as_str) => {
        string_id!(@common $ty);
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
    (@common $ty:ident) => {
        impl fmt::Display for $ty {
            // Written straight into the formatter: ids are formatted on every hop (keys,
            // headers, JSON), and building a `String` per part first showed in profiles.
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                if f.width().is_none() && f.precision().is_none() {
                    return self.write_repr(f);
                }
                let mut padded = String::new();
                self.write_repr(&mut padded)?;
                f.pad(&padded)
            }
        }
        impl FromStr for $ty {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse(s)
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(deserializer)?;
                Self::parse(&raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// Text formatted on the stack; a write past its capacity fails and leaves it unusable.
struct Inline {
    bytes: [u8; INLINE_CAPACITY],
    len: usize,
}

/// Enough for the longest id, an idempotency key (run id, command key and separators).
const INLINE_CAPACITY: usize = 512;

impl Inline {
    fn new() -> Self {
        Self {
            bytes: [0; INLINE_CAPACITY],
            len: 0,
        }
    }

    fn as_str(&self) -> &str {
        // Only whole `str`s are ever copied in, so the bytes are UTF-8.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for Inline {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.bytes.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Writes `n` in decimal without the formatter's padding machinery (ids and audit `seq`s are
/// written on every hop, where `format!` showed in profiles).
pub(crate) fn write_decimal(out: &mut impl fmt::Write, n: u64) -> fmt::Result {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.write_str(std::str::from_utf8(&digits[at..]).unwrap_or_default())
}

/// One agent run. All of a run's commands share a ledger partition and a bus partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
// Ids hold shared text: a command is cloned at every hop of the pipeline, and each clone of a
// `String`-backed id was an allocation and a copy (over a hundred per effect).
pub struct RunId(Arc<str>);

impl RunId {
    /// Accepts 1 to 128 characters of `[A-Za-z0-9._:-]`; `/` is reserved as the key separator.
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        if raw.is_empty() || raw.len() > MAX_RUN_ID_LEN {
            return Err(IdError::RunId {
                value: truncate(raw),
                why: "must be 1 to 128 characters",
            });
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        {
            return Err(IdError::RunId {
                value: truncate(raw),
                why: "may contain only letters, digits and . _ : -",
            });
        }
        Ok(Self(Arc::from(raw)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn write_repr(&self, out: &mut impl fmt::Write) -> fmt::Result {
        out.write_str(&self.0)
    }
}
string_id!(RunId, as_str);

/// A tool's qualified name, `namespace/name`, both segments snake_case.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ToolName {
    namespace: Arc<str>,
    name: Arc<str>,
}

impl ToolName {
    /// Parses a qualified name; a bare name is refused (use [`ToolName::resolve`]).
    pub fn parse(raw: &str) -> Result<Self, IdError> {
        match raw.split_once('/') {
            Some((namespace, name)) => Self::from_parts(namespace, name),
            None => Err(IdError::ToolName {
                value: truncate(raw),
                why: "must be qualified as namespace/name",
            }),
        }
    }

    /// Parses a qualified name, or places a bare name in `default_namespace`.
    pub fn resolve(raw: &str, default_namespace: &str) -> Result<Self, IdError> {
        if raw.contains('/') {
            Self::parse(raw)
        } else {
            Self::from_parts(default_namespace, raw)
        }
    }

    pub fn from_parts(namespace: &str, name: &str) -> Result<Self, IdError> {
        for segment in [namespace, name] {
            if let Err(why) = check_snake_case(segment) {
                return Err(IdError::ToolName {
                    value: truncate(&format!("{namespace}/{name}")),
                    why,
                });
            }
        }
        Ok(Self {
            namespace: Arc::from(namespace),
            name: Arc::from(name),
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn write_repr(&self, out: &mut impl fmt::Write) -> fmt::Result {
        out.write_str(&self.namespace)?;
        out.write_char('/')?;
        out.write_str(&self.name)
    }
}
string_id!(ToolName);

/// Checks one segment of a tool name: `[a-z][a-z0-9_]*`, at most 64 bytes.
pub fn check_snake_case(segment: &str) -> Result<(), &'static str> {
    let mut bytes = segment.bytes();
    match bytes.next() {
        None => return Err("has an empty segment"),
        Some(b) if !b.is_ascii_lowercase() => {
            return Err("segments must start with a lowercase letter (snake_case)");
        }
        Some(_) => {}
    }
    if segment.len() > MAX_TOOL_SEGMENT_LEN {
        return Err("segments must be at most 64 characters");
    }
    if !bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
        return Err("segments may contain only lowercase letters, digits and _ (snake_case)");
    }
    Ok(())
}

/// Identity of a command inside its run: `d-<decision>/<namespace>/<name>/<call_idx>`.
///
/// Ordered by decision, tool and call index; equal and hashed by its text, which those three
/// determine. The text is rendered once, when the key is made: a key is written into keys,
/// headers, audit records and JSON a dozen times per effect, and rendering it each time showed
/// in profiles.
#[derive(Debug, Clone, PartialOrd, Ord)]
pub struct CommandKey {
    decision: u32,
    tool: ToolName,
    call_idx: u32,
    text: Arc<str>,
}

impl CommandKey {
    pub fn new(decision: u32, tool: ToolName, call_idx: u32) -> Self {
        let mut text = String::with_capacity(tool.namespace.len() + tool.name.len() + 16);
        // Writing into a `String` cannot fail.
        let _ = Self::render(&mut text, decision, &tool, call_idx);
        Self {
            decision,
            tool,
            call_idx,
            text: Arc::from(text),
        }
    }

    pub fn parse(raw: &str) -> Result<Self, IdError> {
        let bad = |why| IdError::CommandKey {
            value: truncate(raw),
            why,
        };
        let mut parts = raw.split('/');
        let (Some(decision), Some(namespace), Some(name), Some(call_idx), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(bad(
                "must look like d-<decision>/<namespace>/<name>/<call_idx>",
            ));
        };
        let decision = decision
            .strip_prefix("d-")
            .and_then(parse_index)
            .ok_or_else(|| bad("decision must be d- followed by a non-negative integer"))?;
        let call_idx = parse_index(call_idx)
            .ok_or_else(|| bad("call index must be a non-negative integer"))?;
        let tool = ToolName::from_parts(namespace, name)?;
        // Every part was checked to be in its one spelling, so `raw` is the key's text.
        Ok(Self {
            decision,
            tool,
            call_idx,
            text: Arc::from(raw),
        })
    }

    pub fn decision(&self) -> u32 {
        self.decision
    }

    pub fn tool(&self) -> &ToolName {
        &self.tool
    }

    pub fn call_idx(&self) -> u32 {
        self.call_idx
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    fn render(
        out: &mut impl fmt::Write,
        decision: u32,
        tool: &ToolName,
        call_idx: u32,
    ) -> fmt::Result {
        out.write_str("d-")?;
        write_decimal(out, u64::from(decision))?;
        out.write_char('/')?;
        tool.write_repr(out)?;
        out.write_char('/')?;
        write_decimal(out, u64::from(call_idx))
    }

    fn write_repr(&self, out: &mut impl fmt::Write) -> fmt::Result {
        out.write_str(&self.text)
    }
}

impl PartialEq for CommandKey {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for CommandKey {}

impl std::hash::Hash for CommandKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

string_id!(CommandKey, as_str);

/// Parses a canonical decimal index: no sign, no leading zeros (so one index has one spelling).
fn parse_index(raw: &str) -> Option<u32> {
    if raw.is_empty() || (raw.len() > 1 && raw.starts_with('0')) {
        return None;
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse().ok()
}

/// The key sent upstream: `<run_id>/<command_key>`, stable across re-drives of the same call.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdempotencyKey {
    run_id: RunId,
    command_key: CommandKey,
}

impl IdempotencyKey {
    pub fn new(run_id: RunId, command_key: CommandKey) -> Self {
        Self {
            run_id,
            command_key,
        }
    }

    pub fn parse(raw: &str) -> Result<Self, IdError> {
        let (run, key) = raw.split_once('/').ok_or_else(|| IdError::IdempotencyKey {
            value: truncate(raw),
            why: "must look like <run_id>/d-<decision>/<namespace>/<name>/<call_idx>",
        })?;
        Ok(Self::new(RunId::parse(run)?, CommandKey::parse(key)?))
    }

    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    pub fn command_key(&self) -> &CommandKey {
        &self.command_key
    }

    fn write_repr(&self, out: &mut impl fmt::Write) -> fmt::Result {
        self.run_id.write_repr(out)?;
        out.write_char('/')?;
        self.command_key.write_repr(out)
    }
}
string_id!(IdempotencyKey);

/// Fencing token of a lease. Every lease acquisition increments it; a write carrying an older
/// epoch is stale and refused.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LeaseEpoch(u64);

impl LeaseEpoch {
    pub const ZERO: Self = Self(0);

    pub fn new(value: u64) -> Self {
        Self(value)
    }

    pub fn get(self) -> u64 {
        self.0
    }

    #[must_use]
    pub fn next(self) -> Self {
        Self(self.0 + 1)
    }
}

impl fmt::Display for LeaseEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A tool's business identity of an effect, rendered from its `business_key` template.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BusinessKey(Arc<str>);

impl BusinessKey {
    pub fn new(value: impl Into<String>) -> Self {
        Self(Arc::from(value.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BusinessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lowercase hex SHA-256 of the canonical JSON of a command's arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ArgsHash(Arc<str>);

impl ArgsHash {
    pub fn from_hex(hex: impl Into<String>) -> Self {
        Self(Arc::from(hex.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ArgsHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Keeps error messages bounded when a caller sends a huge id.
fn truncate(raw: &str) -> String {
    const MAX: usize = 160;
    if raw.len() <= MAX {
        return raw.to_owned();
    }
    let mut end = MAX;
    while !raw.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &raw[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_key_is_run_then_command_key() {
        let tool = ToolName::parse("payments/wire").expect("valid name");
        let key = CommandKey::new(3, tool, 0);
        let idem = IdempotencyKey::new(RunId::parse("r-abc").expect("valid run"), key.clone());
        assert_eq!(key.to_string(), "d-3/payments/wire/0");
        assert_eq!(idem.to_string(), "r-abc/d-3/payments/wire/0");
        assert_eq!(
            IdempotencyKey::parse("r-abc/d-3/payments/wire/0").expect("round trip"),
            idem
        );
    }

    #[test]
    fn ids_serialize_as_their_display() {
        let longest_run = "r".repeat(MAX_RUN_ID_LEN);
        let run = RunId::parse(&longest_run).expect("valid run");
        let tool = ToolName::from_parts(&"n".repeat(64), &"t".repeat(64)).expect("valid tool");
        let key = CommandKey::new(u32::MAX, tool.clone(), 4_000_000_000);
        let idem = IdempotencyKey::new(run.clone(), key.clone());
        assert_eq!(json(&run), format!("\"{run}\""));
        assert_eq!(json(&tool), format!("\"{tool}\""));
        assert_eq!(json(&key), format!("\"{key}\""));
        assert_eq!(json(&idem), format!("\"{idem}\""));
        assert!(key.to_string().starts_with("d-4294967295/"));
        assert!(key.to_string().ends_with("/4000000000"));
        let zero = CommandKey::new(0, tool, 0);
        assert_eq!(json(&zero), format!("\"d-0/{}/0\"", zero.tool()));

        let mut full = Inline::new();
        assert!(fmt::Write::write_str(&mut full, &"x".repeat(INLINE_CAPACITY)).is_ok());
        assert!(
            fmt::Write::write_str(&mut full, "y").is_err(),
            "no room is an error"
        );
    }

    fn json(value: &impl Serialize) -> String {
        serde_json::to_string(value).expect("serializes")
    }

    #[test]
    fn command_key_round_trips_and_rejects_other_spellings() {
        let key = CommandKey::parse("d-12/email/send/7").expect("valid");
        assert_eq!(key.decision(), 12);
        assert_eq!(key.tool().to_string(), "email/send");
        assert_eq!(key.call_idx(), 7);
        let made = CommandKey::new(12, ToolName::parse("email/send").expect("valid"), 7);
        assert_eq!(made, key, "a parsed key equals the key made from its parts");
        assert_eq!(made.as_str(), "d-12/email/send/7");
        let state = std::hash::RandomState::new();
        assert_eq!(
            std::hash::BuildHasher::hash_one(&state, &made),
            std::hash::BuildHasher::hash_one(&state, &key)
        );
        // Ordered by number, not by text: d-9 comes before d-10.
        let nine = CommandKey::parse("d-9/email/send/0").expect("valid");
        let ten = CommandKey::parse("d-10/email/send/0").expect("valid");
        assert!(nine < ten);
        assert!(CommandKey::parse("d-9/email/send/2").expect("valid") < ten);
        assert_ne!(nine, ten);
        for bad in [
            "d-1/wire/0",
            "3/payments/wire/0",
            "d-01/payments/wire/0",
            "d-1/payments/wire/-1",
            "d-1/Payments/wire/0",
            "d-1/payments/wire/0/extra",
            "d-/payments/wire/0",
        ] {
            assert!(CommandKey::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn tool_names_are_snake_case_and_bare_names_resolve_in_a_namespace() {
        assert_eq!(
            ToolName::resolve("lookup", "search")
                .expect("valid")
                .to_string(),
            "search/lookup"
        );
        assert_eq!(
            ToolName::resolve("email/send", "other")
                .expect("valid")
                .to_string(),
            "email/send"
        );
        for bad in [
            "Email/send",
            "email/Send",
            "email/",
            "/send",
            "e-mail/send",
            "9x/y",
        ] {
            assert!(ToolName::parse(bad).is_err(), "{bad} should be refused");
        }
        assert!(
            ToolName::parse("send").is_err(),
            "a bare name is not qualified"
        );
    }

    #[test]
    fn run_ids_are_bounded_and_have_no_separator() {
        assert!(RunId::parse("r-abc.1:x_y").is_ok());
        assert!(RunId::parse("").is_err());
        assert!(RunId::parse("a/b").is_err());
        assert!(RunId::parse(&"x".repeat(129)).is_err());
        assert!(RunId::parse(&"x".repeat(128)).is_ok());
    }

    #[test]
    fn ids_honour_width_and_precision_when_formatted() {
        let tool = ToolName::parse("email/send").expect("valid");
        let key = IdempotencyKey::new(
            RunId::parse("r-1").expect("valid"),
            CommandKey::new(2, tool.clone(), 5),
        );
        assert_eq!(key.to_string(), "r-1/d-2/email/send/5");
        assert_eq!(format!("[{tool:>12}]"), "[  email/send]");
        assert_eq!(format!("[{tool:<12}]"), "[email/send  ]");
        assert_eq!(format!("[{:.9}]", key.command_key()), "[d-2/email]");
    }

    #[test]
    fn ids_serialize_as_strings() {
        let key = CommandKey::parse("d-3/payments/wire/0").expect("valid");
        let json = serde_json::to_string(&key).expect("serializes");
        assert_eq!(json, "\"d-3/payments/wire/0\"");
        let back: CommandKey = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, key);
        assert!(serde_json::from_str::<CommandKey>("\"nope\"").is_err());
    }
}
