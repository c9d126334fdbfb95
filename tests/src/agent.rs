//! [`Agent`]: an agent (and operator) speaking the producer's HTTP API — submit, read,
//! long-poll, act, roll back — and [`Answer`], one HTTP answer as a test reads it.

use std::time::Duration;

use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use sluice_core::command::Command;

use crate::*;

/// One HTTP answer: status and JSON body (`Null` when the body is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl Answer {
    /// The body as a command.
    pub fn command(&self) -> Command {
        serde_json::from_value(self.body.clone()).unwrap_or_else(|e| {
            panic!(
                "answer {} is not a command ({e}): {}",
                self.status, self.text
            )
        })
    }

    /// `error.code` of an error answer.
    pub fn error_code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// An agent (and operator) speaking the producer's HTTP API, with a bearer token or none.
#[derive(Debug, Clone)]
pub struct Agent {
    http: Client,
    base: String,
    token: Option<String>,
}

impl Agent {
    pub fn new(base_url: &str) -> Self {
        let http = Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("a plain HTTP client builds");
        Self {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            token: None,
        }
    }

    /// The same client, sending `token` as its bearer token.
    #[must_use]
    pub fn with_token(&self, token: &str) -> Self {
        Self {
            token: Some(token.to_owned()),
            ..self.clone()
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    fn post(&self, url: String) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, url)
    }

    fn get_url(&self, url: String) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::GET, url)
    }

    /// Any request: `method` on `path` (from `/v1…`), with a JSON body or none.
    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("an HTTP method");
        let mut request = self.request(method.clone(), format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        Self::answer(request.send().await)
            .await
            .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"))
    }

    /// `POST …/effects/{key}:{action}` with `body`.
    pub async fn act(&self, run: &str, key: &str, action: &str, body: &Value) -> Answer {
        self.call(
            "POST",
            &format!("/v1/runs/{run}/effects/{}:{action}", encode_key(key)),
            Some(body),
        )
        .await
    }

    async fn answer(response: reqwest::Result<reqwest::Response>) -> reqwest::Result<Answer> {
        let response = response?;
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok(Answer {
            status,
            headers,
            body,
            text,
        })
    }

    /// `POST /v1/effects` with `effect` as JSON; errors are transport errors.
    pub async fn try_submit(&self, effect: &Value) -> reqwest::Result<Answer> {
        Self::answer(
            self.post(format!("{}/v1/effects", self.base))
                .json(effect)
                .send()
                .await,
        )
        .await
    }

    /// `POST /v1/effects`.
    pub async fn submit(&self, effect: &Value) -> Answer {
        self.try_submit(effect)
            .await
            .expect("the producer answers a submission")
    }

    /// `POST /v1/effects` with a body of raw bytes.
    pub async fn submit_raw(&self, body: Vec<u8>) -> Answer {
        Self::answer(
            self.post(format!("{}/v1/effects", self.base))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await,
        )
        .await
        .expect("the producer answers a raw submission")
    }

    /// `POST /v1/effects/batch` with `{"effects": effects}`.
    pub async fn batch(&self, effects: Vec<Value>) -> Answer {
        Self::answer(
            self.post(format!("{}/v1/effects/batch", self.base))
                .json(&json!({ "effects": effects }))
                .send()
                .await,
        )
        .await
        .expect("the producer answers a batch")
    }

    /// `POST` of `body` to `path` with a `Prefer` header; the answer and its
    /// `Preference-Applied` header.
    pub async fn post_preferring(
        &self,
        path: &str,
        body: &Value,
        prefer: &str,
    ) -> (Answer, Option<String>) {
        let response = self
            .post(format!("{}{path}", self.base))
            .header("prefer", prefer)
            .json(body)
            .send()
            .await
            .expect("the producer answers");
        let applied = response
            .headers()
            .get("preference-applied")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let answer = Self::answer(Ok(response)).await.expect("a readable answer");
        (answer, applied)
    }

    /// Submits a batch, expecting every effect in it to be created (201).
    pub async fn batch_created(&self, effects: Vec<Value>) {
        let batch = self.batch(effects).await;
        assert_eq!(batch.status, StatusCode::OK, "{}", batch.text);
        assert!(
            batch.body["results"]
                .as_array()
                .expect("results")
                .iter()
                .all(|r| r["status"] == 201),
            "{}",
            batch.text
        );
    }

    /// `GET /v1/runs/{run}/effects/{path}` where `path` is the command key as it should appear
    /// in the URL (raw or percent-encoded), with an optional `?wait=`.
    pub async fn get_path(&self, run: &str, path: &str, wait: Option<&str>) -> Answer {
        let mut url = format!("{}/v1/runs/{run}/effects/{path}", self.base);
        if let Some(wait) = wait {
            url.push_str("?wait=");
            url.push_str(wait);
        }
        Self::answer(self.get_url(url).send().await)
            .await
            .expect("the producer answers a read")
    }

    /// The command `run`/`key`, read with the key percent-encoded as one path segment.
    pub async fn get(&self, run: &str, key: &str) -> Command {
        let answer = self.get_path(run, &encode_key(key), None).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "GET {run}/{key}: {}",
            answer.text
        );
        answer.command()
    }

    /// `GET /v1/runs/{run}/effects[?status=…]`.
    pub async fn list(&self, run: &str, status: Option<&str>) -> Answer {
        let mut url = format!("{}/v1/runs/{run}/effects", self.base);
        if let Some(status) = status {
            url.push_str("?status=");
            url.push_str(status);
        }
        Self::answer(self.get_url(url).send().await)
            .await
            .expect("the producer answers a listing")
    }

    /// The run's commands, in journal order.
    pub async fn commands(&self, run: &str, status: Option<&str>) -> Vec<Command> {
        let answer = self.list(run, status).await;
        assert_eq!(answer.status, StatusCode::OK, "list {run}: {}", answer.text);
        serde_json::from_value(answer.body["effects"].clone())
            .unwrap_or_else(|e| panic!("the listing holds commands ({e}): {}", answer.text))
    }

    /// `POST /v1/runs/{run}/rollback`.
    pub async fn rollback(&self, run: &str, reason: &str) -> Answer {
        Self::answer(
            self.post(format!("{}/v1/runs/{run}/rollback", self.base))
                .json(&if self.token.is_some() {
                    json!({ "reason": reason })
                } else {
                    json!({ "reason": reason, "actor": "e2e-operator" })
                })
                .send()
                .await,
        )
        .await
        .expect("the producer answers a rollback")
    }

    /// Long-polls (`?wait=`) until the command is settled (terminal, STUCK or BLOCKED).
    pub async fn wait_settled(&self, run: &str, key: &str) -> Command {
        self.wait_settled_within(run, key, DEADLINE).await
    }

    /// [`Agent::wait_settled`] with a deadline of the caller's.
    pub async fn wait_settled_within(&self, run: &str, key: &str, within: Duration) -> Command {
        let deadline = tokio::time::Instant::now() + within;
        let path = encode_key(key);
        loop {
            let answer = self.get_path(run, &path, Some("5s")).await;
            assert_eq!(
                answer.status,
                StatusCode::OK,
                "long poll of {run}/{key}: {}",
                answer.text
            );
            let command = answer.command();
            if command.status().is_settled() {
                return command;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{run}/{key} did not settle within {within:?}; it is {}: {}",
                command.status(),
                answer.text
            );
        }
    }

    /// Polls until `accept` holds for the command (for changes after it settled, such as a
    /// rollback of a CONFIRMED command).
    pub async fn wait_until(
        &self,
        run: &str,
        key: &str,
        what: &str,
        accept: impl Fn(&Command) -> bool,
    ) -> Command {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let command = self.get(run, key).await;
            if accept(&command) {
                return command;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{run}/{key} never became {what} within {DEADLINE:?}; it is {}: {command:?}",
                command.status()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Submits `effect`, expecting 201, and returns the command.
    pub async fn submit_created(&self, effect: &Value) -> Command {
        let answer = self.submit(effect).await;
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "submission of {effect} answered {}",
            answer.text
        );
        answer.command()
    }
}
