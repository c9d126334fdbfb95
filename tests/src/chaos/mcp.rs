//! Agents that make their tool calls through `sluice mcp --transport http`, in raw JSON-RPC
//! over streamable HTTP, and re-drive their conversations.
//!
//! The runner starts `sluice mcp --transport http` beside `sluice dev` ([`McpServer`]); it is a
//! client of the producer's API and is not crashed, while the `sluice dev` behind it is. Each
//! story ([`McpStory`]) is one agent run told through it with the agent's own bearer token
//! (over HTTP `sluice mcp` lends none of its own):
//!
//! 1. `initialize` → `Mcp-Session-Id` → `notifications/initialized`, then each planned call as
//!    `tools/call` with `_meta` naming the run (`dev.sluice/run_id`) and its decision, in order.
//!    One call of some stories is sent with a client timeout shorter than the call: the client
//!    gives up, says so (`notifications/cancelled`, as the SDKs do) and sends the same call
//!    again. A call Sluice could not answer (the pipeline was down) is sent again too.
//! 2. A *new* session re-drives the whole conversation: the same calls in the same order, the
//!    same run named in `_meta`.
//!
//! The rule under test (docs/mcp.md): the same call at the same position gets the same
//! command key, so a retry and a re-drive get the stored result and the upstream sees each
//! effect once. [`McpCall`] keeps what each call was answered; the invariants compare the keys
//! with the plan and read the upstream's record for any effect that reached it under two keys.

use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use reqwest::{Client, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::ChaosError;
use super::catalog::{APPROVE_ABOVE_TIGHTENED, ToolKind};
use super::driver::Accepted;
use super::purge::Activity;
use super::upstream::{DispatchFault, FaultRates};
use super::workload::EffectPlan;

/// The longest `sluice mcp` waits for a call's effect before answering "still running".
pub const MAX_WAIT_S: u64 = 8;

/// A client timeout the calls it is used for outlast: their first attempt is held at the
/// upstream past the tool's timeout (see [`plan`]).
pub const SHORT_TIMEOUT: Duration = Duration::from_millis(150);

/// The client's timeout for every other request: past `sluice mcp`'s own wait.
const TIMEOUT: Duration = Duration::from_secs(MAX_WAIT_S + 30);

/// How often one call is sent again while Sluice cannot say what became of it.
const MAX_TRIES: u32 = 60;

/// What [`read`] says when the client's timeout passed while the answer was read.
const TIMED_OUT: &str = "timed out";

/// The protocol version the client asks for: the newest with sessions.
const PROTOCOL: &str = "2025-11-25";

/// `sluice mcp --transport http`, as a child process.
#[derive(Debug)]
pub struct McpServer {
    child: Option<Child>,
    /// `http://127.0.0.1:<port>/mcp`.
    pub url: String,
    pub log: PathBuf,
    /// How it answered a request without a token, when not with 401: over HTTP it must lend
    /// no token of its own (a finding, reported as unexpected).
    pub lends_a_token: Option<String>,
}

impl McpServer {
    /// Starts `bin mcp --transport http` in front of the API at `api_url` and waits until it
    /// answers; a request without a token must be refused with 401.
    pub async fn start(bin: &Path, api_url: &str, dir: &Path) -> Result<Self, ChaosError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|source| ChaosError::Io {
                what: "find a free port for sluice mcp".into(),
                source,
            })?
            .port();
        let log = dir.join("sluice-mcp.log");
        let out = std::fs::File::create(&log).map_err(|source| ChaosError::Io {
            what: format!("create {}", log.display()),
            source,
        })?;
        let err = out.try_clone().map_err(|source| ChaosError::Io {
            what: "a second handle on the mcp log".into(),
            source,
        })?;
        let child = Process::new(bin)
            .args(["mcp", "--transport", "http", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["--url", api_url, "--max-wait-s"])
            .arg(MAX_WAIT_S.to_string())
            // Over HTTP it lends no token of its own; none is given to make sure.
            .env_remove("SLUICE_TOKEN")
            .env_remove("SLUICE_URL")
            .env_remove("SLUICE_CONFIG")
            .env_remove("FAILPOINTS")
            .env_remove("SLUICE_FAULT_CLOCK_SKEW_MS")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| ChaosError::Io {
                what: format!("start {} mcp", bin.display()),
                source,
            })?;
        let mut server = Self {
            child: Some(child),
            url: format!("http://127.0.0.1:{port}/mcp"),
            log,
            lends_a_token: None,
        };
        let http = Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = http
                .post(&server.url)
                .header("accept", "application/json, text/event-stream")
                .json(&json!({"jsonrpc": "2.0", "id": 0, "method": "ping"}))
                .send()
                .await;
            let error = match answer {
                Ok(answer) => {
                    if answer.status() != StatusCode::UNAUTHORIZED {
                        server.lends_a_token = Some(format!(
                            "sluice mcp --transport http answered a request without a token with HTTP {} instead of 401",
                            answer.status()
                        ));
                    }
                    return Ok(server);
                }
                Err(error) => error,
            };
            if Instant::now() >= deadline {
                let text = std::fs::read_to_string(&server.log).unwrap_or_default();
                return Err(ChaosError::NotReady(format!(
                    "sluice mcp did not listen on {} within 30 s (last: {error}); its log:\n{}",
                    server.url,
                    super::crashes::tail(&text, 40)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether it still runs (it is never crashed on purpose: an exit is a finding).
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One planned MCP conversation.
#[derive(Debug, Clone)]
pub struct McpStory {
    pub run_id: String,
    pub calls: Vec<EffectPlan>,
    /// The call sent first with [`SHORT_TIMEOUT`], cancelled and sent again.
    pub time_out: Option<usize>,
}

/// What became of one planned call.
#[derive(Debug, Clone)]
pub struct McpCall {
    pub run_id: String,
    pub tool: ToolKind,
    /// The key the plan gives its position.
    pub planned_key: String,
    pub journal: (u32, u32),
    /// Its business key, when its tool declares one.
    pub business_key: Option<String>,
    /// The first session's last answer (`structuredContent`), and the key it named.
    pub first: Option<Value>,
    pub first_key: Option<String>,
    /// The re-driving session's answer, and its key.
    pub redrive: Option<Value>,
    pub redrive_key: Option<String>,
    /// Given up by the client after its timeout, cancelled and sent again.
    pub timed_out: bool,
    /// Sent again because Sluice could not say what became of it.
    pub unanswered: u32,
}

impl McpCall {
    /// Whether an answer says the call was recorded (not refused, and not left unknown).
    pub fn recorded(answer: &Value) -> bool {
        !matches!(
            answer["status"].as_str(),
            None | Some("REFUSED" | "NOT_RECORDED" | "UNANSWERED")
        )
    }

    /// The commands the calls' answers named, for the invariants every command is held to.
    pub fn accepted(calls: &[Self]) -> Vec<Accepted> {
        let mut accepted = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for call in calls {
            let answers = [
                (call.first.as_ref(), call.first_key.as_ref()),
                (call.redrive.as_ref(), call.redrive_key.as_ref()),
            ];
            for (answer, key) in answers {
                let (Some(answer), Some(key)) = (answer, key) else {
                    continue;
                };
                if !Self::recorded(answer) || !seen.insert((call.run_id.clone(), key.clone())) {
                    continue;
                }
                accepted.push(Accepted {
                    run_id: call.run_id.clone(),
                    command_key: key.clone(),
                    idempotency_key: format!("{}/{key}", call.run_id),
                    tool: call.tool,
                    journal: call.journal,
                    business_key: call.business_key.clone(),
                });
            }
        }
        accepted
    }
}

/// What the stories did, for the figures.
#[derive(Debug, Default, Clone)]
pub struct Told {
    pub calls: Vec<McpCall>,
    pub stories: usize,
    pub sessions: u64,
    /// Answers the runner did not expect (a JSON-RPC error, a refusal).
    pub unexpected: Vec<String>,
}

/// `count` stories for `seed`. The call that times out is one whose first attempt the upstream
/// holds past the tool's timeout (drawn from the same dice as the upstream's faults), on a tool
/// that never needs approval: its answer cannot come before the client gives up, so the client
/// always abandons it unanswered, as an agent's client abandons a slow call.
pub fn plan(seed: u64, count: usize, rates: &FaultRates) -> Vec<McpStory> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x00c0_ffee_0bad_u64);
    let tools = [
        ToolKind::Transfer,
        ToolKind::Payout,
        ToolKind::Refund,
        ToolKind::Wire,
        ToolKind::Ticket,
        ToolKind::Email,
        ToolKind::Sms,
        ToolKind::Case,
        ToolKind::Search,
    ];
    (0..count)
        .map(|n| {
            let run_id = format!("chaos-{seed:x}-mcp-{n}");
            let size = rng.random_range(2..=5usize);
            let mut calls: Vec<EffectPlan> = Vec::with_capacity(size);
            let mut decision = 1u32;
            for i in 0..size {
                // Mostly the bank: the calls that can be held and timed out.
                let tool = if rng.random_bool(0.5) {
                    tools[rng.random_range(0..3usize)]
                } else {
                    tools[rng.random_range(3..tools.len())]
                };
                let call_idx = calls
                    .iter()
                    .filter(|e| e.decision == decision && e.tool == tool)
                    .count();
                calls.push(EffectPlan {
                    decision,
                    call_idx: u32::try_from(call_idx).unwrap_or(u32::MAX),
                    tool,
                    args: json!({
                        "ref": format!("{run_id}-{i}"),
                        "amount_minor": rng.random_range(100..APPROVE_ABOVE_TIGHTENED),
                        "note": "chaos mcp",
                    }),
                    delay_ms: None,
                    cancel_after_ms: None,
                });
                if !rng.random_bool(0.2) {
                    decision += 1;
                }
            }
            let time_out = calls.iter().position(|call| {
                matches!(
                    call.tool,
                    ToolKind::Transfer | ToolKind::Payout | ToolKind::Refund
                ) && held(rates, seed, &run_id, call)
            });
            McpStory {
                run_id,
                calls,
                time_out,
            }
        })
        .collect()
}

/// Whether the upstream holds the first attempt of `call` past the tool's timeout.
fn held(rates: &FaultRates, seed: u64, run_id: &str, call: &EffectPlan) -> bool {
    let key = format!("{run_id}/{}", call.command_key());
    let doubles = call.tool.verifies_commits();
    matches!(
        rates.dispatch_fault(seed, call.tool.endpoint(), &key, 0, doubles),
        DispatchFault::CommitThenTimeout
            | DispatchFault::TimeoutNoCommit
            | DispatchFault::LateCommit
    )
}

/// The tool's name over MCP: `namespace__name`.
pub fn mcp_name(tool: ToolKind) -> String {
    tool.name().replace('/', "__")
}

/// Tells every story, story `i` starting `i * spacing` after the start, each run held in
/// `activity` while its conversations go on; returns when all are told.
pub async fn tell(
    client: McpClient,
    stories: Vec<McpStory>,
    spacing: Duration,
    activity: Activity,
) -> Told {
    let client = Arc::new(client);
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let count = stories.len();
    for (i, story) in stories.into_iter().enumerate() {
        let client = Arc::clone(&client);
        let at = start + spacing * u32::try_from(i).unwrap_or(u32::MAX);
        let activity = activity.clone();
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let _telling = activity.hold(&story.run_id);
            client.story(&story).await
        });
    }
    let mut told = Told {
        stories: count,
        ..Told::default()
    };
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(story) => {
                told.calls.extend(story.calls);
                told.sessions += story.sessions;
                told.unexpected.extend(story.unexpected);
            }
            Err(e) => told.unexpected.push(format!("an MCP story failed: {e}")),
        }
    }
    told.calls
        .sort_by(|a, b| (&a.run_id, &a.planned_key).cmp(&(&b.run_id, &b.planned_key)));
    told
}

/// An MCP session over streamable HTTP.
#[derive(Debug)]
pub struct Session {
    id: String,
    version: String,
    next_id: u64,
}

/// How one request ended.
#[derive(Debug)]
enum Ended {
    /// The JSON-RPC `result`.
    Result(Value),
    /// A JSON-RPC error, or an HTTP answer that was not one.
    Error(String),
    /// No answer within the client's timeout.
    TimedOut,
}

/// A raw JSON-RPC client of `sluice mcp --transport http`, with an agent's own token.
#[derive(Debug, Clone)]
pub struct McpClient {
    http: Client,
    url: String,
    token: String,
}

/// One story's calls.
struct Story {
    calls: Vec<McpCall>,
    sessions: u64,
    unexpected: Vec<String>,
}

impl McpClient {
    pub fn new(url: &str, token: &str) -> Result<Self, ChaosError> {
        let http = Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| ChaosError::Setup(format!("an HTTP client: {e}")))?;
        Ok(Self {
            http,
            url: url.to_owned(),
            token: token.to_owned(),
        })
    }

    async fn story(&self, story: &McpStory) -> Story {
        let mut told = Story {
            calls: Vec::new(),
            sessions: 0,
            unexpected: Vec::new(),
        };
        // The first conversation.
        let mut first = match self.open(&mut told).await {
            Some(session) => session,
            None => return told,
        };
        for (i, call) in story.calls.iter().enumerate() {
            let short = story.time_out == Some(i);
            let (answer, timed_out, unanswered) =
                self.until_answered(&mut first, story, call, short).await;
            if let Err(e) = &answer {
                told.unexpected
                    .push(format!("mcp {} {}: {e}", story.run_id, call.command_key()));
            }
            let answer = answer.ok();
            told.calls.push(McpCall {
                run_id: story.run_id.clone(),
                tool: call.tool,
                planned_key: call.command_key(),
                journal: (call.decision, call.call_idx),
                business_key: call.business_key(),
                first_key: answer
                    .as_ref()
                    .and_then(|a| a["command_key"].as_str().map(str::to_owned)),
                first: answer,
                redrive: None,
                redrive_key: None,
                timed_out,
                unanswered,
            });
        }
        self.close(&first).await;
        // The re-drive: a new session, the same calls in the same order.
        let Some(mut again) = self.open(&mut told).await else {
            return told;
        };
        for (call, told_call) in story.calls.iter().zip(told.calls.iter_mut()) {
            let (answer, _, unanswered) = self.until_answered(&mut again, story, call, false).await;
            told_call.unanswered += unanswered;
            match answer {
                Ok(answer) => {
                    told_call.redrive_key = answer["command_key"].as_str().map(str::to_owned);
                    told_call.redrive = Some(answer);
                }
                Err(e) => told.unexpected.push(format!(
                    "mcp re-drive {} {}: {e}",
                    story.run_id,
                    call.command_key()
                )),
            }
        }
        self.close(&again).await;
        told
    }

    /// A new session, asked for until `sluice mcp` answers.
    async fn open(&self, told: &mut Story) -> Option<Session> {
        let mut last = String::new();
        for _ in 0..20 {
            match self.initialize().await {
                Ok(session) => {
                    told.sessions += 1;
                    return Some(session);
                }
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        told.unexpected
            .push(format!("mcp initialize never succeeded: {last}"));
        None
    }

    /// Sends `call` until its answer says what became of it: `(answer, timed out, unanswered
    /// answers before it)`. A call the client gives up on is cancelled and sent again; one
    /// Sluice could not answer is sent again after a pause.
    async fn until_answered(
        &self,
        session: &mut Session,
        story: &McpStory,
        call: &EffectPlan,
        mut short: bool,
    ) -> (Result<Value, String>, bool, u32) {
        let mut timed_out = false;
        let mut unanswered = 0;
        let params = json!({
            "name": mcp_name(call.tool),
            "arguments": call.args,
            "_meta": {
                "dev.sluice/run_id": story.run_id,
                "dev.sluice/decision": call.decision,
            },
        });
        for _ in 0..MAX_TRIES {
            let timeout = if short { SHORT_TIMEOUT } else { TIMEOUT };
            let (id, ended) = self
                .request(session, "tools/call", params.clone(), timeout)
                .await;
            match ended {
                Ended::TimedOut if short => {
                    // As the SDKs do after their own timeout: say so, then call again.
                    timed_out = true;
                    short = false;
                    let cancelled = json!({
                        "requestId": id,
                        "reason": "chaos: the client's timeout passed",
                    });
                    if let Err(e) = self
                        .notify(session, "notifications/cancelled", cancelled)
                        .await
                    {
                        return (Err(format!("notifications/cancelled: {e}")), timed_out, 0);
                    }
                }
                Ended::TimedOut => {
                    return (
                        Err(format!("no answer within {} s", timeout.as_secs())),
                        timed_out,
                        unanswered,
                    );
                }
                Ended::Error(e) => return (Err(e), timed_out, unanswered),
                Ended::Result(result) => {
                    let answer = result["structuredContent"].clone();
                    if answer.is_null() {
                        return (
                            Err(format!("a result without structuredContent: {result}")),
                            timed_out,
                            unanswered,
                        );
                    }
                    // Sluice could not say what became of it: the same call asks again.
                    let unknown = matches!(
                        answer["status"].as_str(),
                        Some("UNANSWERED" | "NOT_RECORDED")
                    ) || answer.get("unanswered").is_some();
                    if !unknown {
                        return (Ok(answer), timed_out, unanswered);
                    }
                    unanswered += 1;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
        (
            Err(format!("still unanswered after {MAX_TRIES} tries")),
            timed_out,
            unanswered,
        )
    }

    async fn initialize(&self) -> Result<Session, String> {
        let body = json!({
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "sluice-chaos", "version": "1"},
            },
        });
        let response = self
            .post(None, &body, TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let session = response
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| format!("initialize: HTTP {} without a session", response.status()))?;
        let answer = read(response, 0).await?;
        let version = answer["protocolVersion"]
            .as_str()
            .unwrap_or(PROTOCOL)
            .to_owned();
        let mut session = Session {
            id: session,
            version,
            next_id: 1,
        };
        self.notify(&mut session, "notifications/initialized", json!({}))
            .await?;
        Ok(session)
    }

    /// One request; its JSON-RPC id and how it ended.
    async fn request(
        &self,
        session: &mut Session,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> (u64, Ended) {
        let id = session.next_id;
        session.next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let ended = match self.post(Some(session), &body, timeout).await {
            Err(e) if e.is_timeout() => Ended::TimedOut,
            Err(e) => Ended::Error(e.to_string()),
            Ok(response) => match tokio::time::timeout(timeout, read(response, id)).await {
                Err(_) => Ended::TimedOut,
                Ok(Ok(result)) => Ended::Result(result),
                Ok(Err(e)) if e == TIMED_OUT => Ended::TimedOut,
                Ok(Err(e)) => Ended::Error(e),
            },
        };
        (id, ended)
    }

    /// A notification; `sluice mcp` takes it in order with the session's requests once it
    /// answered 202.
    async fn notify(
        &self,
        session: &mut Session,
        method: &str,
        params: Value,
    ) -> Result<(), String> {
        let body = json!({"jsonrpc": "2.0", "method": method, "params": params});
        let response = self
            .post(Some(session), &body, TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("{method}: HTTP {}", response.status()))
        }
    }

    /// Ends a session (`DELETE`), as a client that is done does.
    async fn close(&self, session: &Session) {
        let _ = self
            .http
            .delete(&self.url)
            .bearer_auth(&self.token)
            .header("mcp-session-id", &session.id)
            .header("mcp-protocol-version", &session.version)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
    }

    async fn post(
        &self,
        session: Option<&Session>,
        body: &Value,
        timeout: Duration,
    ) -> Result<reqwest::Response, reqwest::Error> {
        let mut request = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("accept", "application/json, text/event-stream")
            .timeout(timeout)
            .json(body);
        if let Some(session) = session {
            request = request
                .header("mcp-session-id", &session.id)
                .header("mcp-protocol-version", &session.version);
        }
        request.send().await
    }
}

/// The JSON-RPC answer to request `id`: the body itself (JSON), or the `data:` of the event
/// that carries it (an SSE stream).
async fn read(response: reqwest::Response, id: u64) -> Result<Value, String> {
    let status = response.status();
    // An SSE answer comes in the body: the client's timeout may pass while it is read.
    let text = response.text().await.map_err(|e| {
        if e.is_timeout() {
            TIMED_OUT.to_owned()
        } else {
            e.to_string()
        }
    })?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {text}"));
    }
    let messages: Vec<Value> = if text.trim_start().starts_with('{') {
        serde_json::from_str(&text).into_iter().collect()
    } else {
        text.lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str(data.trim()).ok())
            .collect()
    };
    let answer = messages
        .into_iter()
        .find(|m| m["id"] == json!(id))
        .ok_or_else(|| format!("no answer to request {id} in: {text}"))?;
    match answer.get("error") {
        Some(error) => Err(format!("JSON-RPC error: {error}")),
        None => Ok(answer["result"].clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stories_are_planned_from_the_seed_and_some_time_out_on_a_held_call() {
        let rates = FaultRates::standard();
        let a = plan(3, 60, &rates);
        let b = plan(3, 60, &rates);
        assert_eq!(a.len(), 60);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.run_id, y.run_id);
            assert_eq!(x.time_out, y.time_out);
            assert!(x.calls.iter().zip(&y.calls).all(|(c, d)| c.args == d.args));
        }
        assert!(a.iter().filter(|s| s.time_out.is_some()).count() >= 5);
        for story in &a {
            if let Some(i) = story.time_out {
                assert!(held(&rates, 3, &story.run_id, &story.calls[i]));
            }
        }
        assert!(
            plan(3, 60, &FaultRates::calm())
                .iter()
                .all(|s| s.time_out.is_none())
        );
        assert_eq!(mcp_name(ToolKind::Wire), "bank__wire");
    }

    #[tokio::test]
    async fn an_sse_answer_is_read_by_its_id() {
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(|| async {
                (
                    [("content-type", "text/event-stream")],
                    "data: \n\nid: 0\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{\"ok\":1}}\n\n",
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        let response = Client::new()
            .post(format!("http://{addr}/"))
            .send()
            .await
            .expect("answered");
        assert_eq!(read(response, 7).await.expect("read"), json!({"ok": 1}));
    }
}
