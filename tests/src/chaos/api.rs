//! The producer's HTTP API as the runner's agents and operators use it, through crashes.
//!
//! The pipeline is killed and restarted under the runner's feet, so every call is retried on
//! a transport error or a 503 until a deadline, as a client of a service that restarts would.
//! Retrying is safe where the API makes it so: a submission repeats the same key (201 the
//! first time, 200 after), an operator action that already applied answers 409.

use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use sluice_core::audit::AuditEntry;
use sluice_core::command::Command;
use tokio::time::Instant;

use super::ChaosError;

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Agent,
    Admin,
}

/// One answer: status and JSON body (`Null` when not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Value,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

#[derive(Debug, Clone)]
pub struct Api {
    http: Client,
    base: String,
    agent: String,
    admin: String,
    /// How long one logical call may keep retrying.
    pub patience: Duration,
}

/// How long an admission refusal is waited out, per call.
pub const ADMISSION_PATIENCE: Duration = Duration::from_secs(600);

/// A 503 that admission answered: nothing recorded, come back after `Retry-After`.
pub fn is_admission_refusal(answer: &Answer) -> bool {
    answer.status == StatusCode::SERVICE_UNAVAILABLE
        && matches!(
            answer.code(),
            "dispatch_behind" | "ledger_behind" | "bus_behind"
        )
}

/// A command key as one URL path segment.
pub fn encode_key(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

impl Api {
    pub fn new(base: &str, agent: &str, admin: &str) -> Result<Self, ChaosError> {
        let http = Client::builder()
            .timeout(Duration::from_secs(20))
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| ChaosError::Setup(format!("an HTTP client: {e}")))?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            agent: agent.to_owned(),
            admin: admin.to_owned(),
            patience: Duration::from_secs(90),
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// One attempt: `None` when there was no answer (connection refused, reset, timeout).
    pub async fn try_call(
        &self,
        role: Role,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Option<Answer> {
        let token = match role {
            Role::Agent => &self.agent,
            Role::Admin => &self.admin,
        };
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.ok()?;
        let status = response.status();
        let text = response.text().await.ok()?;
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        Some(Answer { status, body })
    }

    /// Calls until an answer other than 502/503/504 comes, or the patience runs out. An
    /// admission refusal (503 `dispatch_behind`, `ledger_behind`, `bus_behind`: the pipeline is
    /// behind and recorded nothing) is asked again after its `Retry-After` (at most 5 s) for up
    /// to [`ADMISSION_PATIENCE`]: a pipeline slowed by a lost node refuses for as long as it
    /// is slow, and a client waits it out.
    pub async fn call(
        &self,
        role: Role,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Answer, ChaosError> {
        let began = Instant::now();
        let mut deadline = began + self.patience;
        let mut pause = Duration::from_millis(50);
        loop {
            let last = match self.try_call(role, method.clone(), path, body).await {
                Some(answer) if !matches!(answer.status.as_u16(), 502..=504) => {
                    return Ok(answer);
                }
                Some(answer) if is_admission_refusal(&answer) => {
                    deadline = deadline.max(began + ADMISSION_PATIENCE);
                    let retry_after = answer.body["error"]["details"]["retry_after_s"]
                        .as_u64()
                        .unwrap_or(1);
                    if Instant::now() < deadline {
                        tokio::time::sleep(Duration::from_secs(retry_after.clamp(1, 5))).await;
                        continue;
                    }
                    format!("HTTP {}: {}", answer.status, answer.body)
                }
                Some(answer) => format!("HTTP {}: {}", answer.status, answer.body),
                None => "no answer (the pipeline may be restarting)".into(),
            };
            if Instant::now() >= deadline {
                return Err(ChaosError::Unanswered {
                    what: format!("{method} {path}"),
                    secs: self.patience.as_secs(),
                    last,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// `GET /readyz` answered 200.
    pub async fn ready(&self) -> bool {
        let url = format!("{}/readyz", self.base);
        matches!(self.http.get(url).send().await, Ok(r) if r.status() == StatusCode::OK)
    }

    pub async fn submit(&self, effect: &Value) -> Result<Answer, ChaosError> {
        self.call(Role::Agent, Method::POST, "/v1/effects", Some(effect))
            .await
    }

    pub async fn batch(&self, effects: &[Value]) -> Result<Answer, ChaosError> {
        self.call(
            Role::Agent,
            Method::POST,
            "/v1/effects/batch",
            Some(&json!({ "effects": effects })),
        )
        .await
    }

    /// A run's commands in journal order.
    pub async fn run_commands(&self, run: &str) -> Result<Vec<Command>, ChaosError> {
        let path = format!("/v1/runs/{run}/effects");
        let answer = self.call(Role::Admin, Method::GET, &path, None).await?;
        expect_ok(&path, &answer)?;
        commands(&path, &answer.body["effects"])
    }

    /// Effects with `status` across the runs created since `since` (RFC 3339).
    pub async fn effects_with(
        &self,
        status: &str,
        since: &str,
    ) -> Result<Vec<Command>, ChaosError> {
        let mut effects = Vec::new();
        let mut before = String::new();
        loop {
            let path = format!("/v1/effects?status={status}&since={since}&limit=1000{before}");
            let answer = self.call(Role::Admin, Method::GET, &path, None).await?;
            expect_ok(&path, &answer)?;
            effects.extend(commands(&path, &answer.body["effects"])?);
            // Every page, not the newest runs only (a BLOCKED command of an old run waits).
            match answer.body["next"].as_str() {
                Some(next) => before = format!("&before={next}"),
                None => return Ok(effects),
            }
        }
    }

    /// `POST …/effects/{key}:{action}` as admin.
    pub async fn act(
        &self,
        run: &str,
        key: &str,
        action: &str,
        body: &Value,
    ) -> Result<Answer, ChaosError> {
        let path = format!("/v1/runs/{run}/effects/{}:{action}", encode_key(key));
        self.call(Role::Admin, Method::POST, &path, Some(body))
            .await
    }

    pub async fn rollback(&self, run: &str, reason: &str) -> Result<Answer, ChaosError> {
        let path = format!("/v1/runs/{run}/rollback");
        self.call(
            Role::Admin,
            Method::POST,
            &path,
            Some(&json!({ "reason": reason })),
        )
        .await
    }

    /// The run's audit chain as the API returns it.
    pub async fn audit(&self, run: &str) -> Result<Vec<AuditEntry>, ChaosError> {
        let path = format!("/v1/runs/{run}/audit");
        let answer = self.call(Role::Admin, Method::GET, &path, None).await?;
        expect_ok(&path, &answer)?;
        serde_json::from_value(answer.body["entries"].clone()).map_err(|e| ChaosError::Unexpected {
            what: path,
            status: answer.status.as_u16(),
            body: format!("not audit entries ({e})"),
        })
    }

    /// The API's verdict on the run's audit chain.
    pub async fn verify(&self, run: &str) -> Result<Value, ChaosError> {
        let path = format!("/v1/runs/{run}/audit/verify");
        let answer = self.call(Role::Admin, Method::GET, &path, None).await?;
        expect_ok(&path, &answer)?;
        Ok(answer.body)
    }
}

fn expect_ok(what: &str, answer: &Answer) -> Result<(), ChaosError> {
    if answer.status == StatusCode::OK {
        Ok(())
    } else {
        Err(ChaosError::Unexpected {
            what: what.to_owned(),
            status: answer.status.as_u16(),
            body: answer.body.to_string(),
        })
    }
}

fn commands(what: &str, value: &Value) -> Result<Vec<Command>, ChaosError> {
    serde_json::from_value(value.clone()).map_err(|e| ChaosError::Unexpected {
        what: what.to_owned(),
        status: 200,
        body: format!("not a list of commands ({e})"),
    })
}
