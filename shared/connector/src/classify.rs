//! What an upstream's answer means: the classification table of the wire contract
//! (docs/architecture.md, "Wire contract"), as pure functions.
//!
//! | answer | dispatch | status check | compensate |
//! |---|---|---|---|
//! | 2xx | `Committed` (reference, result); `Ambiguous` without a reference when the tool requires one | `present` (reference), or read as a list (`matches`, `count`: 0 absent, 1 present, more duplicate) | `Done` (reference) |
//! | 2xx, body cut off by the transport | `Ambiguous` | `inconclusive` | `Done` |
//! | a status the status check declares (`absent_status`, `duplicate_status`) | — | `absent`, `duplicate` (refs in evidence) | — |
//! | 404 | `Refused` | `inconclusive` unless declared | `Impossible` (`Done` if in `done_status`) |
//! | 409 | `Refused` (`Ambiguous` if in the tool's `in_progress_status`) | `inconclusive` unless declared | `Impossible` (`Done` if in `done_status`) |
//! | other 4xx | `Refused` (`Ambiguous` if in the tool's `in_progress_status`) | `inconclusive` unless declared | `Impossible` (`Done` if in `done_status`) |
//! | 429, 503, 403 with a `Retry-After` that is a delay (`retry_after`) | `RateLimited` (the delay; past the tool's ceiling the core reads it as the row below, a 403 as a refusal) | `inconclusive` carrying the delay (`retry_after_ms`) | `Retry` carrying the delay (`retry_after_ms`: waited out without spending an attempt, as a dispatch's) |
//! | 408, 425, 429 | `Ambiguous` | `inconclusive` | `Retry` |
//! | 5xx | `Ambiguous` | `inconclusive` | `Retry` |
//! | 1xx, 3xx (redirects are not followed) | `Ambiguous` | `inconclusive` | `Retry` |
//! | no answer: nothing was sent | `NotSent` | `inconclusive` | `Retry` |
//! | no answer: the request may have been processed | `Ambiguous` | `inconclusive` | `Retry` |
//!
//! A status check proves only what the tool declares: a real API's 401, the 404 of a route it
//! lacks, or a 2xx of another shape (an unsigned call answered by another service) must never
//! read as absent or present, or a charge that never happened is confirmed, or one that did is
//! sent again.
//!
//! 408, 425 and 429 are 4xx codes that mean "not now", not "no": the upstream may have
//! started the work, or will accept the same request later, so a dispatch answered with one
//! is ambiguous and a compensation is retried rather than escalated as impossible.
//!
//! A 3xx is ambiguous because the connector does not follow redirects: following one would
//! turn a POST into a GET (301–303) or replay a side effect at a second URL.
//!
//! The status line is the upstream's verdict, so a body cut off part-way (a reset or the
//! timeout while reading it) changes the verdict only where the body carries what the verdict
//! needs: the reference and result of a 2xx dispatch (reported `Ambiguous`, so reconciliation
//! can recover the reference instead of confirming without one) and the reference or list of
//! commits of a 2xx or 409 status check (`inconclusive`; a status check can simply be asked
//! again). A body longer than the cap is not a failure: it is read up to the cap, and a
//! reference that lay beyond it is simply not found.

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};
use sluice_core::catalog::{DispatchConnector, MatchList, ReferenceSource, StatusAnswers};
use sluice_core::command::Observation;
use sluice_core::machine::{CompensationOutcome, DispatchOutcome};

use crate::port::StatusReport;

/// Longest body excerpt kept in a reason or in evidence, in bytes.
pub const DEFAULT_EXCERPT_BYTES: usize = 512;

/// An upstream's answer: the status line, the headers and the body read up to a cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    /// The body was longer than the cap; `body` is its beginning.
    pub truncated: bool,
    /// Reading the body failed part-way (timeout, reset); `body` is what had arrived.
    pub body_error: Option<String>,
    /// What its `Retry-After` header asks for, read when the answer arrived
    /// (`retry_after::retry_after_ms`); `None` without one.
    pub retry_after_ms: Option<i64>,
}

impl Answer {
    /// The delay of an answer that asks for a later call: a 429, 503 or 403 with a
    /// `Retry-After` that is one.
    pub fn later(&self) -> Option<i64> {
        self.retry_after_ms
            .filter(|_| crate::retry_after::asks_later(self.status))
    }
}

/// A call that got no answer, split by the one question that matters: could the upstream
/// have seen the request?
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoAnswer {
    /// Nothing left the process: the request could not be built, or no connection was
    /// established. The effect did not happen.
    NotSent { reason: String },
    /// The request was, or may have been, written, and no complete answer came back.
    Lost { reason: String, timed_out: bool },
}

impl NoAnswer {
    pub fn reason(&self) -> &str {
        match self {
            Self::NotSent { reason } | Self::Lost { reason, .. } => reason,
        }
    }
}

/// The classes of status codes the table distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    /// 2xx.
    Success,
    /// 4xx other than 408, 425 and 429: the upstream definitively said no.
    Refusal,
    /// 408, 425, 429 and 5xx: the upstream did not decide, or did not say what it decided.
    Transient,
    /// 1xx and 3xx: nothing the contract defines.
    Unexpected,
}

impl StatusClass {
    pub fn of(status: StatusCode) -> Self {
        match status.as_u16() {
            200..=299 => Self::Success,
            408 | 425 | 429 => Self::Transient,
            400..=499 => Self::Refusal,
            500..=599 => Self::Transient,
            _ => Self::Unexpected,
        }
    }
}

/// What a dispatch answer means for the effect, read as the tool's `[tool.dispatch]` says
/// (its reference source, `in_progress_status` and `require_reference`).
pub fn dispatch(
    answer: &Answer,
    connector: &DispatchConnector,
    excerpt_bytes: usize,
) -> DispatchOutcome {
    let in_progress = connector.in_progress_status.as_slice();
    if let Some(retry_after_ms) = answer.later() {
        // Not a verdict but "call again then": the core waits it out, up to the tool's
        // ceiling, and past it reads the answer as without the header (a 403 a refusal).
        return DispatchOutcome::RateLimited {
            reason: format!(
                "{} (Retry-After: {retry_after_ms} ms)",
                answer.summary(excerpt_bytes)
            ),
            retry_after_ms,
            refusal: StatusClass::of(answer.status) == StatusClass::Refusal,
        };
    }
    match StatusClass::of(answer.status) {
        StatusClass::Success => match &answer.body_error {
            None => {
                let json = answer.json();
                let external_ref =
                    read_reference(&connector.reference, &answer.headers, json.as_ref());
                // The upstream says it committed but not which commit: without the reference
                // the effect could not be undone, so it is looked up rather than confirmed.
                if external_ref.is_none() && connector.require_reference {
                    return DispatchOutcome::Ambiguous {
                        reason: format!(
                            "{}, but the answer names no reference and the tool requires one",
                            answer.summary(excerpt_bytes)
                        ),
                    };
                }
                DispatchOutcome::Committed {
                    external_ref,
                    result: json.or_else(|| answer.text()).map(std::sync::Arc::new),
                }
            }
            Some(error) => DispatchOutcome::Ambiguous {
                reason: format!(
                    "HTTP {}, but the response body was cut off ({error}): the effect most likely committed and its reference is unknown",
                    answer.status.as_u16()
                ),
            },
        },
        // The tool says this status means "a request with this key is still in progress":
        // the earlier request may yet commit, so nothing is decided.
        StatusClass::Refusal if in_progress.contains(&answer.status.as_u16()) => {
            DispatchOutcome::Ambiguous {
                reason: format!(
                    "{} (a request with this idempotency key is still in progress upstream)",
                    answer.summary(excerpt_bytes)
                ),
            }
        }
        StatusClass::Refusal => DispatchOutcome::Refused {
            reason: answer.summary(excerpt_bytes),
        },
        StatusClass::Transient | StatusClass::Unexpected => DispatchOutcome::Ambiguous {
            reason: answer.summary(excerpt_bytes),
        },
    }
}

/// An asynchronous tool's answer (`[tool.async]`): a status its `accepted_status` lists
/// means "accepted, the outcome comes later" — unless it also asks for a later call
/// (`Retry-After`), which `dispatch` reads first. `None`: read it with `dispatch`. The
/// upstream's reference of the accepted work (a job id) is read where the tool's dispatch
/// reads a commit's (`connector.reference`); a body cut off part-way gives none.
pub fn accepted(
    answer: &Answer,
    accepted_status: &[u16],
    connector: &DispatchConnector,
    excerpt_bytes: usize,
) -> Option<DispatchOutcome> {
    (accepted_status.contains(&answer.status.as_u16()) && answer.later().is_none()).then(|| {
        let external_ref = match &answer.body_error {
            None => read_reference(
                &connector.reference,
                &answer.headers,
                answer.json().as_ref(),
            ),
            Some(_) => None,
        };
        DispatchOutcome::Accepted {
            reason: answer.summary(excerpt_bytes),
            external_ref,
        }
    })
}

/// A dispatch that got no answer.
pub fn dispatch_without_answer(no_answer: NoAnswer) -> DispatchOutcome {
    match no_answer {
        NoAnswer::NotSent { reason } => DispatchOutcome::NotSent { reason },
        NoAnswer::Lost { reason, .. } => DispatchOutcome::Ambiguous { reason },
    }
}

/// What a status check answer says about the effect, read only as the tool declares
/// (`StatusAnswers`); any other answer is `inconclusive`, never absent or present.
///
/// * a status in `absent_status` is `absent`; in `duplicate_status`, `duplicate`, its commits
///   collected into `evidence.refs` from a `refs` array in the body (strings or numbers) and
///   from the reference source, the command's own the one the reference source names, else the
///   first listed;
/// * a 2xx with a declared list (`matches`, `count`): 0 matches `absent`, 1 `present`, more
///   `duplicate` (references read from each match); a 2xx where the list is not there, or is
///   not an array or a count, is `inconclusive`;
/// * a 2xx without a list: `present`.
///
/// `filter` is the list's `match_where` rendered for the command (`request::match_filter`): an
/// item counts as a match only when each pointer holds that text.
pub fn status_check(
    answer: &Answer,
    reference: &ReferenceSource,
    answers: &StatusAnswers,
    filter: &[(String, String)],
    excerpt_bytes: usize,
) -> StatusReport {
    let mut evidence = answer.evidence(excerpt_bytes);
    let code = answer.status.as_u16();
    let json = answer.json();
    let own_reference = |json: Option<&Value>| match &answers.reference_pointer {
        Some(pointer) => json
            .and_then(|body| body.pointer(pointer))
            .and_then(reference_text),
        None => read_reference(reference, &answer.headers, json),
    };
    let inconclusive = |mut evidence: Map<String, Value>, why: String| {
        evidence.insert("reading".into(), json!(why));
        StatusReport {
            observation: Observation::Inconclusive,
            external_ref: None,
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record: None,
        }
    };
    let carries_body = (200..=299).contains(&code) || answers.duplicate_status.contains(&code);
    if carries_body && answer.body_error.is_some() {
        return inconclusive(evidence, "the answer's body was cut off".into());
    }
    if answers.absent_status.contains(&code) {
        return StatusReport {
            observation: Observation::Absent,
            external_ref: None,
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record: None,
        };
    }
    if answers.duplicate_status.contains(&code) {
        let mut refs: Vec<String> = json
            .as_ref()
            .and_then(|body| body.get("refs"))
            .and_then(Value::as_array)
            .map(|listed| listed.iter().filter_map(reference_text).collect())
            .unwrap_or_default();
        let named = own_reference(json.as_ref());
        match &named {
            Some(own) if !refs.contains(own) => refs.insert(0, own.clone()),
            Some(_) | None => {}
        }
        let own = named.or_else(|| refs.first().cloned());
        evidence.insert("refs".into(), json!(refs));
        return StatusReport {
            observation: Observation::Duplicate,
            external_ref: own,
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record: None,
        };
    }
    if let Some(retry_after_ms) = answer.later() {
        // "Ask again then": the next look waits for it, and this one is not counted (the
        // core's decision, up to the tool's ceiling).
        evidence.insert("retry_after_ms".into(), json!(retry_after_ms));
        let mut report = inconclusive(
            evidence,
            format!("HTTP {code} asks to be asked again in {retry_after_ms} ms"),
        );
        report.retry_after_ms = Some(retry_after_ms);
        return report;
    }
    if !(200..=299).contains(&code) {
        return inconclusive(
            evidence,
            format!(
                "HTTP {code} is not an answer the tool declares (absent_status, duplicate_status or a 2xx)"
            ),
        );
    }
    let Some(list) = &answers.list else {
        return StatusReport {
            observation: Observation::Present,
            external_ref: own_reference(json.as_ref()),
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record: json,
        };
    };
    let Some(body) = json.as_ref() else {
        return inconclusive(evidence, "the answer is not JSON read in full".into());
    };
    let (count, refs, matched) = match list {
        MatchList::Items {
            pointer,
            reference: item_reference,
            ..
        } => match body.pointer(pointer).and_then(Value::as_array) {
            Some(items) => {
                let matching: Vec<&Value> = items
                    .iter()
                    .filter(|item| {
                        filter.iter().all(|(field, expected)| {
                            item.pointer(field).and_then(reference_text).as_deref()
                                == Some(expected.as_str())
                        })
                    })
                    .collect();
                if !filter.is_empty() {
                    evidence.insert("listed".into(), json!(items.len()));
                }
                (
                    matching.len(),
                    matching
                        .iter()
                        .filter_map(|item| item.pointer(item_reference).and_then(reference_text))
                        .collect::<Vec<_>>(),
                    matching
                        .iter()
                        .map(|item| {
                            let reference = item.pointer(item_reference).and_then(reference_text);
                            (reference, (*item).clone())
                        })
                        .collect::<Vec<_>>(),
                )
            }
            None => {
                return inconclusive(evidence, format!("no array of matches at {pointer}"));
            }
        },
        MatchList::Count { pointer } => match body.pointer(pointer).and_then(Value::as_u64) {
            Some(count) => (
                usize::try_from(count).unwrap_or(usize::MAX),
                Vec::new(),
                Vec::new(),
            ),
            None => {
                return inconclusive(evidence, format!("no count of matches at {pointer}"));
            }
        },
    };
    evidence.insert("matches".into(), json!(count));
    let own = answers
        .reference_pointer
        .as_ref()
        .and_then(|pointer| body.pointer(pointer).and_then(reference_text))
        .or_else(|| refs.first().cloned());
    // The matching item that is the command's own commit: its result when the answer was lost.
    let record = matched
        .iter()
        .find(|(reference, _)| reference.is_some() && *reference == own)
        .or_else(|| matched.first().filter(|_| count == 1))
        .map(|(_, item)| item.clone());
    match count {
        0 => StatusReport {
            observation: Observation::Absent,
            external_ref: None,
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record: None,
        },
        1 => StatusReport {
            observation: Observation::Present,
            external_ref: own,
            evidence: Value::Object(evidence),
            retry_after_ms: None,
            record,
        },
        _ => {
            evidence.insert("refs".into(), json!(refs));
            StatusReport {
                observation: Observation::Duplicate,
                external_ref: own,
                evidence: Value::Object(evidence),
                retry_after_ms: None,
                record,
            }
        }
    }
}

/// A status check that got no answer: inconclusive, with the transport error as evidence.
pub fn status_check_without_answer(no_answer: &NoAnswer) -> StatusReport {
    let timed_out = matches!(
        no_answer,
        NoAnswer::Lost {
            timed_out: true,
            ..
        }
    );
    StatusReport::inconclusive(json!({
        "error": no_answer.reason(),
        "timed_out": timed_out,
    }))
}

/// What a compensate answer means. `done_status`: the tool's `compensate.done_status`, 4xx
/// answers that mean the commit is already undone (a retried DELETE's 404).
pub fn compensation(
    answer: &Answer,
    reference: &ReferenceSource,
    done_status: &[u16],
    excerpt_bytes: usize,
) -> CompensationOutcome {
    if done_status.contains(&answer.status.as_u16()) {
        return CompensationOutcome::Done { reference: None };
    }
    // Asked to call again later (429, 503, or GitHub's 403, with `Retry-After`): the core waits
    // it out without spending an attempt.
    if let Some(retry_after_ms) = answer.later() {
        return CompensationOutcome::Retry {
            reason: answer.summary(excerpt_bytes),
            retry_after_ms: Some(retry_after_ms),
        };
    }
    match StatusClass::of(answer.status) {
        // The reference of a compensation is informational (the refund's id): a body cut off
        // after a 2xx does not make the undo any less done.
        StatusClass::Success => CompensationOutcome::Done {
            reference: read_reference(reference, &answer.headers, answer.json().as_ref()),
        },
        StatusClass::Refusal => CompensationOutcome::Impossible {
            reason: answer.summary(excerpt_bytes),
        },
        StatusClass::Transient | StatusClass::Unexpected => CompensationOutcome::Retry {
            reason: answer.summary(excerpt_bytes),
            retry_after_ms: None,
        },
    }
}

/// A compensate call that got no answer: it may or may not have run, so try again later.
pub fn compensation_without_answer(no_answer: NoAnswer) -> CompensationOutcome {
    match no_answer {
        NoAnswer::NotSent { reason } | NoAnswer::Lost { reason, .. } => {
            CompensationOutcome::Retry {
                reason,
                retry_after_ms: None,
            }
        }
    }
}

/// The external reference in a response: a non-empty string (or a number, as its JSON text)
/// at the JSON pointer, or a non-empty header value.
pub fn read_reference(
    source: &ReferenceSource,
    headers: &HeaderMap,
    body: Option<&Value>,
) -> Option<String> {
    match source {
        ReferenceSource::JsonPointer(pointer) => body?.pointer(pointer).and_then(reference_text),
        ReferenceSource::Header(name) => {
            let value = headers.get(name.as_str())?.to_str().ok()?.trim();
            (!value.is_empty()).then(|| value.to_owned())
        }
    }
}

fn reference_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => {
            None
        }
    }
}

/// At most `max` bytes of `body` as text, cut at a character boundary, `…` marking a cut.
pub fn excerpt(body: &[u8], max: usize) -> String {
    // Three bytes of slack so a character split by the byte cut is not turned into U+FFFD.
    let window = &body[..body.len().min(max.saturating_add(3))];
    let text = String::from_utf8_lossy(window);
    let text = text.trim();
    if text.len() <= max && window.len() == body.len() {
        return text.to_owned();
    }
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl Answer {
    /// The body as JSON, when it was read in full and is JSON.
    fn json(&self) -> Option<Value> {
        if self.truncated || self.body_error.is_some() || self.body.is_empty() {
            return None;
        }
        serde_json::from_slice(&self.body).ok()
    }

    /// The body as a JSON string, for a result that is not JSON; `None` when empty.
    fn text(&self) -> Option<Value> {
        (!self.body.is_empty())
            .then(|| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }

    /// `HTTP <code>: <body excerpt>`, the reason of a refusal or an ambiguous status.
    fn summary(&self, excerpt_bytes: usize) -> String {
        let code = self.status.as_u16();
        match excerpt(&self.body, excerpt_bytes) {
            text if text.is_empty() => format!("HTTP {code} (empty body)"),
            text => format!("HTTP {code}: {text}"),
        }
    }

    /// The evidence of a status check answer: its status and a body excerpt.
    fn evidence(&self, excerpt_bytes: usize) -> Map<String, Value> {
        let mut evidence = Map::new();
        evidence.insert("http_status".into(), json!(self.status.as_u16()));
        evidence.insert("body".into(), json!(excerpt(&self.body, excerpt_bytes)));
        evidence.insert(
            "body_truncated".into(),
            json!(self.truncated || self.body.len() > excerpt_bytes),
        );
        if let Some(error) = &self.body_error {
            evidence.insert("error".into(), json!(error));
        }
        evidence
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            status: StatusCode::from_u16(status).expect("a valid status code"),
            headers: HeaderMap::new(),
            body: body.as_bytes().to_vec(),
            truncated: false,
            body_error: None,
            retry_after_ms: None,
        }
    }

    fn id() -> ReferenceSource {
        ReferenceSource::JsonPointer("/id".into())
    }

    /// A dispatch section reading `/id`, with the given in-progress statuses.
    fn connector(in_progress: &[u16]) -> DispatchConnector {
        DispatchConnector {
            endpoint: sluice_core::catalog::HttpEndpoint {
                url: sluice_core::catalog::Template::parse("http://bank.test/wires")
                    .expect("a valid template"),
                method: sluice_core::catalog::HttpMethod::Post,
                timeout_ms: 1_000,
                shape: sluice_core::catalog::RequestShape::default(),
            },
            reference: id(),
            in_progress_status: in_progress.to_vec(),
            require_reference: false,
        }
    }

    /// The answers of Sluice's own by-key contract: 404 absent, 409 duplicate.
    fn contract() -> StatusAnswers {
        StatusAnswers {
            absent_status: vec![404],
            duplicate_status: vec![409],
            ..StatusAnswers::default()
        }
    }

    #[test]
    fn status_classes_follow_the_design_table() {
        let table = [
            (200, StatusClass::Success),
            (201, StatusClass::Success),
            (204, StatusClass::Success),
            (299, StatusClass::Success),
            (100, StatusClass::Unexpected),
            (301, StatusClass::Unexpected),
            (303, StatusClass::Unexpected),
            (400, StatusClass::Refusal),
            (401, StatusClass::Refusal),
            (404, StatusClass::Refusal),
            (409, StatusClass::Refusal),
            (422, StatusClass::Refusal),
            (408, StatusClass::Transient),
            (425, StatusClass::Transient),
            (429, StatusClass::Transient),
            (499, StatusClass::Refusal),
            (500, StatusClass::Transient),
            (503, StatusClass::Transient),
            (599, StatusClass::Transient),
        ];
        for (code, class) in table {
            let status = StatusCode::from_u16(code).expect("valid");
            assert_eq!(StatusClass::of(status), class, "HTTP {code}");
        }
    }

    #[test]
    fn a_2xx_dispatch_commits_with_the_reference_and_the_result() {
        let outcome = dispatch(
            &answer(201, r#"{"id": "w-1", "n": 2}"#),
            &connector(&[]),
            512,
        );
        assert_eq!(
            outcome,
            DispatchOutcome::Committed {
                external_ref: Some("w-1".into()),
                result: Some(std::sync::Arc::new(json!({"id": "w-1", "n": 2}))),
            }
        );
        let text = dispatch(&answer(200, "ok"), &connector(&[]), 512);
        assert_eq!(
            text,
            DispatchOutcome::Committed {
                external_ref: None,
                result: Some(std::sync::Arc::new(json!("ok"))),
            }
        );
        let empty = dispatch(&answer(204, ""), &connector(&[]), 512);
        assert_eq!(
            empty,
            DispatchOutcome::Committed {
                external_ref: None,
                result: None,
            }
        );
    }

    #[test]
    fn an_asynchronous_tools_accepted_status_is_accepted_and_nothing_else_is() {
        let by_id = connector(&[]);
        let DispatchOutcome::Accepted {
            reason,
            external_ref,
        } = accepted(&answer(202, r#"{"id": "job_7"}"#), &[202], &by_id, 512)
            .expect("202 is accepted")
        else {
            panic!("expected accepted");
        };
        assert!(reason.starts_with("HTTP 202"), "{reason}");
        assert_eq!(
            external_ref.as_deref(),
            Some("job_7"),
            "the job's id, read where a commit's reference is"
        );
        // No reference where the tool reads it, or a body cut off: accepted, without one.
        let Some(DispatchOutcome::Accepted { external_ref, .. }) =
            accepted(&answer(202, r#"{"job": "j-1"}"#), &[202], &by_id, 512)
        else {
            panic!("expected accepted");
        };
        assert_eq!(external_ref, None);
        let mut cut = answer(202, r#"{"id": "job_7"}"#);
        cut.body_error = Some("reset".into());
        let Some(DispatchOutcome::Accepted { external_ref, .. }) =
            accepted(&cut, &[202], &by_id, 512)
        else {
            panic!("expected accepted");
        };
        assert_eq!(external_ref, None);
        // Other statuses are read as any tool's: a 200 commits, a 5xx is ambiguous.
        assert_eq!(accepted(&answer(200, "{}"), &[202], &by_id, 512), None);
        assert_eq!(accepted(&answer(503, ""), &[202], &by_id, 512), None);
        // A tool that lists no such status (no [tool.async]) never gets one.
        assert_eq!(accepted(&answer(202, "{}"), &[], &by_id, 512), None);
    }

    #[test]
    fn a_2xx_dispatch_whose_body_was_cut_off_is_ambiguous() {
        let mut cut = answer(201, r#"{"id": "w"#);
        cut.body_error = Some("connection reset".into());
        let outcome = dispatch(&cut, &connector(&[]), 512);
        let DispatchOutcome::Ambiguous { reason } = outcome else {
            panic!("expected ambiguous, got {outcome:?}");
        };
        assert!(
            reason.starts_with("HTTP 201, but the response body was cut off (connection reset)"),
            "{reason}"
        );
        // A 4xx whose body was cut off is still a refusal: the status line is the verdict.
        let mut refused = answer(400, "bad");
        refused.body_error = Some("reset".into());
        assert!(matches!(
            dispatch(&refused, &connector(&[]), 512),
            DispatchOutcome::Refused { .. }
        ));
    }

    #[test]
    fn refusals_and_ambiguous_statuses_carry_a_capped_excerpt() {
        let long = "x".repeat(2_000);
        let DispatchOutcome::Refused { reason } =
            dispatch(&answer(422, &long), &connector(&[]), 16)
        else {
            panic!("422 is a refusal");
        };
        assert_eq!(reason, format!("HTTP 422: {}…", "x".repeat(16)));
        let DispatchOutcome::Ambiguous { reason } = dispatch(&answer(503, ""), &connector(&[]), 16)
        else {
            panic!("503 is ambiguous");
        };
        assert_eq!(reason, "HTTP 503 (empty body)");
    }

    #[test]
    fn references_come_from_the_pointer_or_the_header() {
        let body = json!({"data": {"id": 42}, "empty": "", "flag": true});
        let mut headers = HeaderMap::new();
        headers.insert("location", HeaderValue::from_static(" /wires/w-9 "));
        let pointer = |p: &str| ReferenceSource::JsonPointer(p.into());
        assert_eq!(
            read_reference(&pointer("/data/id"), &headers, Some(&body)),
            Some("42".into())
        );
        assert_eq!(
            read_reference(&pointer("/empty"), &headers, Some(&body)),
            None
        );
        assert_eq!(
            read_reference(&pointer("/flag"), &headers, Some(&body)),
            None
        );
        assert_eq!(
            read_reference(&pointer("/missing"), &headers, Some(&body)),
            None
        );
        assert_eq!(read_reference(&pointer("/id"), &headers, None), None);
        let header = ReferenceSource::Header("Location".into());
        assert_eq!(
            read_reference(&header, &headers, None),
            Some("/wires/w-9".into())
        );
        let absent = ReferenceSource::Header("X-Ref".into());
        assert_eq!(read_reference(&absent, &headers, Some(&body)), None);
    }

    #[test]
    fn status_answers_map_to_observations() {
        let table = [
            (200, Observation::Present),
            (204, Observation::Present),
            (404, Observation::Absent),
            (409, Observation::Duplicate),
            (400, Observation::Inconclusive),
            (410, Observation::Inconclusive),
            (429, Observation::Inconclusive),
            (302, Observation::Inconclusive),
            (500, Observation::Inconclusive),
            (503, Observation::Inconclusive),
        ];
        for (code, observation) in table {
            let report = status_check(&answer(code, "{}"), &id(), &contract(), &[], 512);
            assert_eq!(report.observation, observation, "HTTP {code}");
            assert_eq!(report.evidence["http_status"], json!(code));
        }
    }

    #[test]
    fn a_duplicate_lists_every_commit_and_keeps_the_named_one() {
        let report = status_check(
            &answer(409, r#"{"refs": ["w-1", 7, null, "w-3"]}"#),
            &id(),
            &contract(),
            &[],
            512,
        );
        assert_eq!(report.observation, Observation::Duplicate);
        assert_eq!(report.external_ref.as_deref(), Some("w-1"));
        assert_eq!(report.evidence["refs"], json!(["w-1", "7", "w-3"]));
        assert_eq!(report.extra_commits(), ["7", "w-3"]);

        let named = status_check(
            &answer(409, r#"{"id": "w-3", "refs": ["w-1", "w-3"]}"#),
            &id(),
            &contract(),
            &[],
            512,
        );
        assert_eq!(named.external_ref.as_deref(), Some("w-3"));
        assert_eq!(named.extra_commits(), ["w-1"]);

        let only_pointer = status_check(
            &answer(409, r#"{"id": "w-5"}"#),
            &id(),
            &contract(),
            &[],
            512,
        );
        assert_eq!(only_pointer.evidence["refs"], json!(["w-5"]));
        assert!(only_pointer.extra_commits().is_empty());
    }

    #[test]
    fn a_present_answer_whose_body_was_cut_off_is_inconclusive() {
        let mut cut = answer(200, r#"{"id""#);
        cut.body_error = Some("timed out".into());
        let report = status_check(&cut, &id(), &contract(), &[], 512);
        assert_eq!(report.observation, Observation::Inconclusive);
        assert_eq!(report.evidence["error"], json!("timed out"));
        assert_eq!(report.external_ref, None);
    }

    #[test]
    fn compensation_answers_map_to_outcomes() {
        assert_eq!(
            compensation(&answer(200, r#"{"id": "rev-1"}"#), &id(), &[], 512),
            CompensationOutcome::Done {
                reference: Some("rev-1".into())
            }
        );
        assert_eq!(
            compensation(&answer(422, "already settled"), &id(), &[], 512),
            CompensationOutcome::Impossible {
                reason: "HTTP 422: already settled".into()
            }
        );
        for code in [408, 425, 429, 500, 503, 307] {
            assert!(
                matches!(
                    compensation(&answer(code, ""), &id(), &[], 512),
                    CompensationOutcome::Retry { .. }
                ),
                "HTTP {code}"
            );
        }
    }

    #[test]
    fn no_answer_is_not_sent_only_when_nothing_left_the_process() {
        let not_sent = NoAnswer::NotSent {
            reason: "refused".into(),
        };
        let lost = NoAnswer::Lost {
            reason: "reset".into(),
            timed_out: false,
        };
        assert_eq!(
            dispatch_without_answer(not_sent.clone()),
            DispatchOutcome::NotSent {
                reason: "refused".into()
            }
        );
        assert_eq!(
            dispatch_without_answer(lost.clone()),
            DispatchOutcome::Ambiguous {
                reason: "reset".into()
            }
        );
        assert_eq!(
            status_check_without_answer(&lost).observation,
            Observation::Inconclusive
        );
        assert!(matches!(
            compensation_without_answer(not_sent),
            CompensationOutcome::Retry { .. }
        ));
    }

    #[test]
    fn excerpts_are_capped_at_a_character_boundary() {
        assert_eq!(excerpt(b"  short  ", 512), "short");
        assert_eq!(excerpt("ééé".as_bytes(), 3), "é…");
        assert_eq!(excerpt(b"abcdef", 3), "abc…");
        assert_eq!(excerpt(b"abc", 3), "abc");
        assert_eq!(excerpt(&[0xff, b'a'], 8), "\u{fffd}a");
    }

    /// What a lookup found for the command's own commit is kept as its record (its result when
    /// the dispatch's answer was lost): the body of a plain 2xx, the own item of a list, and
    /// nothing from an absence or a bare count.
    #[test]
    fn a_present_lookup_carries_the_record_it_found() {
        let plain = status_check(
            &answer(200, r#"{"id": "w-7", "amount": 5}"#),
            &id(),
            &StatusAnswers::default(),
            &[],
            4096,
        );
        assert_eq!(plain.observation, Observation::Present);
        assert_eq!(plain.record, Some(json!({"id": "w-7", "amount": 5})));

        let listed = StatusAnswers {
            list: Some(MatchList::Items {
                pointer: "/data".into(),
                reference: "/id".into(),
                filter: Vec::new(),
            }),
            ..StatusAnswers::default()
        };
        let one = status_check(
            &answer(200, r#"{"data": [{"id": "ch_1", "amount": 5}]}"#),
            &id(),
            &listed,
            &[],
            4096,
        );
        assert_eq!(one.record, Some(json!({"id": "ch_1", "amount": 5})));
        let two = status_check(
            &answer(200, r#"{"data": [{"id": "ch_1"}, {"id": "ch_2"}]}"#),
            &id(),
            &listed,
            &[],
            4096,
        );
        assert_eq!(two.observation, Observation::Duplicate);
        assert_eq!(
            two.record,
            Some(json!({"id": "ch_1"})),
            "the own commit's item"
        );
        let none = status_check(&answer(200, r#"{"data": []}"#), &id(), &listed, &[], 4096);
        assert_eq!((none.observation, none.record), (Observation::Absent, None));
        let counted = StatusAnswers {
            list: Some(MatchList::Count {
                pointer: "/total".into(),
            }),
            ..StatusAnswers::default()
        };
        let count = status_check(&answer(200, r#"{"total": 1}"#), &id(), &counted, &[], 4096);
        assert_eq!(
            (count.observation, count.record),
            (Observation::Present, None)
        );
    }
}
