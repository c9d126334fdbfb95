//! The connector port: what a service asks of an upstream on a command's behalf.
//!
//! Every method is total. A connector never returns an error: a failure is one of the outcomes
//! the state machine already handles, classified by what it says about the effect — did it
//! happen, not happen, or is that unknown. Implementations must be safe to call concurrently
//! for different commands; the lease (not the connector) keeps one command's calls in order.

use std::fmt;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_core::catalog::Tool;
use sluice_core::command::{Command, Observation};
use sluice_core::machine::{CompensationOutcome, DispatchOutcome, Event};

/// A way to carry out a tool's side effects. One instance serves every tool and command.
#[async_trait]
pub trait Connector: Send + Sync + fmt::Debug {
    /// Performs the command's effect once, with its idempotency key.
    ///
    /// `NotSent` promises that the effect did not happen; anything that cannot promise that
    /// and did not get a definitive answer is `Ambiguous`.
    async fn dispatch(&self, tool: &Tool, command: &Command) -> DispatchOutcome;

    /// Asks the upstream whether the command's effect happened (after an ambiguous dispatch).
    async fn status_check(&self, tool: &Tool, command: &Command) -> StatusReport;

    /// Undoes one commit of the command: its own (run rollback) or an extra one left by a
    /// duplicate dispatch.
    async fn compensate(
        &self,
        tool: &Tool,
        command: &Command,
        target: CompensationTarget,
    ) -> CompensationOutcome;
}

/// What a status check found, and the evidence for it (stored in the audit chain).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    pub observation: Observation,
    /// The reference of the command's own commit, when the upstream named it.
    pub external_ref: Option<String>,
    /// What the upstream answered: for the HTTP connector `http_status`, a size-capped `body`
    /// excerpt, `refs` (every commit a `duplicate` answer listed) or the transport `error`.
    pub evidence: Value,
    /// An `inconclusive` answer that asked to be asked again later (`Retry-After` on a 429,
    /// 503 or 403): the delay in milliseconds, never negative. The core decides what waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<i64>,
    /// For `present` and `duplicate`: the record the lookup found for the command's own commit
    /// (the answer's JSON body, or the one matching item of a declared list), which becomes
    /// the command's result when its dispatch answer was lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<Value>,
}

impl StatusReport {
    /// An `inconclusive` report that says why.
    pub fn inconclusive(evidence: Value) -> Self {
        Self {
            observation: Observation::Inconclusive,
            external_ref: None,
            evidence,
            retry_after_ms: None,
            record: None,
        }
    }

    /// The commits of a `duplicate` answer other than the command's own, in the upstream's
    /// order: the references to compensate with [`CompensationTarget::ExtraCommit`].
    pub fn extra_commits(&self) -> Vec<String> {
        let Some(refs) = self.evidence.get("refs").and_then(Value::as_array) else {
            return Vec::new();
        };
        refs.iter()
            .filter_map(Value::as_str)
            .filter(|reference| Some(*reference) != self.external_ref.as_deref())
            .map(str::to_owned)
            .collect()
    }
}

impl From<StatusReport> for Event {
    fn from(report: StatusReport) -> Self {
        let extra_refs = report.extra_commits();
        Event::Observed {
            observation: report.observation,
            external_ref: report.external_ref,
            evidence: report.evidence,
            extra_refs,
            retry_after_ms: report.retry_after_ms,
            record: report.record,
        }
    }
}

/// Which commit a compensate call undoes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "target", rename_all = "snake_case")]
pub enum CompensationTarget {
    /// The command's own commit, named by its `external_ref` (a run rollback).
    OwnCommit,
    /// An extra commit found by a `duplicate` observation, named by its reference.
    ExtraCommit { external_ref: String },
}

impl CompensationTarget {
    /// The reference of the commit to undo; `None` when the command's own commit has none.
    pub fn external_ref<'a>(&'a self, command: &'a Command) -> Option<&'a str> {
        match self {
            Self::OwnCommit => command.state.external_ref.as_deref(),
            Self::ExtraCommit { external_ref } => Some(external_ref),
        }
    }
}
