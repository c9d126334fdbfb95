//! The HTTP plumbing every route shares: the JSON error answer ([`ApiError`]), extractors that
//! refuse bad input as JSON errors naming what was wrong ([`Q`], [`RawBody`]), and the answers
//! to a route or method that does not exist.

use axum::Json;
use axum::body::Bytes;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_core::ids::RunId;

/// An error answer: `{"error": {"code", "message", "details"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Value,
    /// The `Allow` header of a 405 (RFC 9110: the methods the resource has).
    allow: Option<&'static str>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Value::Null,
            allow: None,
        }
    }

    /// 405 `method_not_allowed` on a resource that has the methods `allow`.
    pub(crate) fn method_not_allowed(allow: &'static str, message: impl Into<String>) -> Self {
        Self {
            allow: Some(allow),
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                message,
            )
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = details;
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The JSON pointer the error names, if any (`details.pointer`).
    pub fn pointer(&self) -> Option<&str> {
        self.details.get("pointer").and_then(Value::as_str)
    }

    /// 422 `invalid_request`.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    pub(crate) fn body(&self) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if !self.details.is_null() {
            error["details"] = self.details.clone();
        }
        json!({ "error": error })
    }

    /// 503: the ledger (or the bus behind a pipeline step) did not answer.
    pub(crate) fn unavailable(e: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            e.to_string(),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let unauthenticated = self.status == StatusCode::UNAUTHORIZED;
        let mut response = (self.status, Json(self.body())).into_response();
        // Unavailable for now, not for good: a client backs off by the server's measure (an
        // admission refusal says how long in its details, `sluice_core::load::admit`).
        // A tenant over its quota (429) is told the same way when to come back.
        if matches!(
            self.status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        ) {
            let after = self
                .details
                .get("retry_after_s")
                .and_then(Value::as_u64)
                .unwrap_or(1);
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(after),
            );
        }
        if let Some(allow) = self.allow {
            response.headers_mut().insert(
                axum::http::header::ALLOW,
                axum::http::HeaderValue::from_static(allow),
            );
        }
        if unauthenticated {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

pub(crate) fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            format!("request body is not valid JSON: {e}"),
        )
    })
}

/// Parses a request body into `T`, naming the expected shape when it does not match.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(
    body: &Bytes,
    shape: &str,
) -> Result<T, ApiError> {
    serde_json::from_value(parse_json(body)?)
        .map_err(|e| ApiError::invalid(format!("expected {shape}: {e}")))
}

pub(crate) fn parse_run(raw: &str) -> Result<RunId, ApiError> {
    RunId::parse(raw).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A query string parsed into `T`, refused as a 422 JSON error (axum's own rejection is plain
/// text) naming what was wrong.
#[derive(Debug)]
pub(crate) struct Q<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for Q<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| Q(value))
            .map_err(|e| ApiError::invalid(format!("invalid query string: {}", e.body_text())))
    }
}

/// A request body as bytes; over the size limit it is a 413 JSON error (axum's own rejection
/// is plain text).
#[derive(Debug)]
pub(crate) struct RawBody(pub Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for RawBody {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        Bytes::from_request(request, state)
            .await
            .map(RawBody)
            .map_err(|e| {
                if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "body_too_large",
                        "the request body is over the size limit (producer.max_body_bytes)",
                    )
                } else {
                    ApiError::new(e.status(), "unreadable_body", e.body_text())
                }
            })
    }
}

/// Answers a route that does not exist, or a method a route does not have, as JSON.
pub(crate) async fn no_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!(
            "no route {method} {}; the API is described in schemas/openapi.yaml",
            uri.path().chars().take(200).collect::<String>()
        ),
    )
}

pub(crate) async fn no_method(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    let message = format!(
        "{method} is not allowed on {}; the API is described in schemas/openapi.yaml",
        uri.path().chars().take(200).collect::<String>()
    );
    // A command (GET, DELETE) and its actions (`…/effects/{key}:approve`, POST) share one route,
    // whose methods the router would list for both: each is told its own.
    let effect = uri
        .path()
        .strip_prefix("/v1/runs/")
        .and_then(|rest| rest.split_once("/effects/"))
        .map(|(_, key)| key)
        .filter(|key| !key.is_empty());
    match effect {
        Some(key) if is_action_path(key) => ApiError::method_not_allowed("POST", message),
        Some(_) => ApiError::method_not_allowed("GET, HEAD, DELETE", message),
        None => ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
        ),
    }
}

/// The command actions, as they follow a command key after a colon.
pub(crate) const ACTIONS: [&str; 6] = [
    "approve",
    "reject",
    "cancel",
    "replay",
    "resolve",
    "approval-link",
];

/// Whether the rest of an effect path (`{key}` or `{key}:{action}`) names an action.
pub(crate) fn is_action_path(rest: &str) -> bool {
    rest.rsplit_once(':')
        .is_some_and(|(_, action)| ACTIONS.contains(&action))
}

/// Refuses GET and DELETE of a command action's path with 405 `Allow: POST`.
pub(crate) fn not_on_action(rest: &str) -> Result<(), ApiError> {
    if is_action_path(rest) {
        return Err(ApiError::method_not_allowed(
            "POST",
            "a command action is POSTed: …/effects/{command_key}:{action}",
        ));
    }
    Ok(())
}

/// A JSON integer as JSON Schema reads it: `7` and `7.0` alike (the document's `integer`
/// admits both), within `T`'s range; anything else is refused.
fn whole<T: TryFrom<u64>>(number: &serde_json::Number) -> Option<T> {
    let value = match number.as_u64() {
        Some(value) => value,
        None => {
            let float = number.as_f64()?;
            // Exactly representable whole numbers only: 2^53 and beyond are not exact in f64.
            if float.fract() != 0.0 || !(0.0..=9_007_199_254_740_992.0).contains(&float) {
                return None;
            }
            float as u64
        }
    };
    T::try_from(value).ok()
}

/// `#[serde(deserialize_with = "crate::http::whole_number")]` for an integer field.
pub(crate) fn whole_number<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    let number = serde_json::Number::deserialize(deserializer)?;
    whole(&number)
        .ok_or_else(|| serde::de::Error::custom(format!("{number} is not a whole number in range")))
}

/// [`whole_number`] for an optional field (`null` or absent: `None`).
pub(crate) fn optional_whole_number<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    match Option::<serde_json::Number>::deserialize(deserializer)? {
        None => Ok(None),
        Some(number) => whole(&number).map(Some).ok_or_else(|| {
            serde::de::Error::custom(format!("{number} is not a whole number in range"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_503_says_when_to_come_back_by_the_refusals_measure() {
        let refused = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ledger_behind", "slow")
            .with_details(json!({"retry_after_s": 7}))
            .into_response();
        assert_eq!(refused.headers()[axum::http::header::RETRY_AFTER], "7");
        let plain = ApiError::unavailable("down").into_response();
        assert_eq!(plain.headers()[axum::http::header::RETRY_AFTER], "1");
    }
}
