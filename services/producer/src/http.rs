//! The HTTP plumbing every route shares: the JSON error answer ([`ApiError`]), extractors that
//! refuse bad input as JSON errors naming what was wrong ([`Q`], [`RawBody`]), and the answers
//! to a route or method that does not exist.

use axum::Json;
use axum::body::Bytes;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice_core::ids::RunId;

/// An error answer: `{"error": {"code", "message", "details"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    details: Value,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Value::Null,
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
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!(
            "{method} is not allowed on {}; the API is described in schemas/openapi.yaml",
            uri.path().chars().take(200).collect::<String>()
        ),
    )
}
