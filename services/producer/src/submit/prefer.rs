//! The preferences a client may state for a submission's answer (RFC 7240 `Prefer`), and
//! the answer `return=minimal` asks for.

use super::*;
use sluice_core::command::CommandStatus;

pub(super) const PREFER: &str = "prefer";
pub(super) const PREFERENCE_APPLIED: &str = "preference-applied";

/// What a client stated in `Prefer` that this service honours.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Preferences {
    /// `return=minimal`.
    pub minimal: bool,
    /// `wait=<seconds>`, capped at `producer.max_wait_ms`; `None`: answer at once.
    pub wait: Option<Duration>,
}

impl Preferences {
    /// The preferences in `headers` (every `Prefer` header, comma-separated preferences, each
    /// `name[=value][; parameters]`).
    pub(crate) fn of(headers: &HeaderMap, max_wait: Duration) -> Result<Self, ApiError> {
        let mut preferences = Self::default();
        let stated = headers
            .get_all(PREFER)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .filter_map(|preference| {
                let preference = preference.split(';').next()?.trim();
                let (name, value) = preference.split_once('=')?;
                Some((name.trim(), value.trim().trim_matches('"')))
            });
        for (name, value) in stated {
            if name.eq_ignore_ascii_case("return") && value.eq_ignore_ascii_case("minimal") {
                preferences.minimal = true;
            } else if name.eq_ignore_ascii_case("wait") {
                let seconds: u64 = value.parse().map_err(|_| {
                    ApiError::invalid(format!(
                        "Prefer: wait={:?} is not a whole number of seconds (RFC 7240)",
                        value.chars().take(32).collect::<String>()
                    ))
                })?;
                preferences.wait = Some(Duration::from_secs(seconds).min(max_wait));
            }
        }
        Ok(preferences)
    }

    /// Marks `response` with the preferences applied to it (`Preference-Applied`).
    pub(super) fn mark(self, mut response: Response) -> Response {
        let mut applied = Vec::new();
        if self.minimal {
            applied.push("return=minimal".to_owned());
        }
        if let Some(wait) = self.wait {
            applied.push(format!("wait={}", wait.as_secs()));
        }
        if applied.is_empty() {
            return response;
        }
        if let Ok(value) = HeaderValue::from_str(&applied.join(", ")) {
            response.headers_mut().insert(PREFERENCE_APPLIED, value);
        }
        response
    }
}

/// A submitted command as `Prefer: return=minimal` answers it.
#[derive(Serialize)]
pub(super) struct MinimalCommand<'a> {
    pub(super) run_id: &'a RunId,
    pub(super) command_key: &'a CommandKey,
    pub(super) command_status: CommandStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) existing: Option<Existing>,
}

impl<'a> MinimalCommand<'a> {
    pub(super) fn of(submitted: &'a Submitted) -> Self {
        let command = &submitted.command;
        Self {
            run_id: &command.run_id,
            command_key: &command.command_key,
            command_status: command.status(),
            existing: submitted.existing,
        }
    }
}
