//! The flow controls every dispatcher replica shares (`sluice_core::flow::FlowControl`: an
//! operator's pause and a circuit breaker per tool or upstream name), stored whole and written
//! with a compare-and-set on their version.

use async_trait::async_trait;

use sluice_core::flow::FlowControl;

use crate::LedgerError;

/// What a flow control's write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowCas {
    /// Written; the control as stored now (its version one past the guard).
    Applied(FlowControl),
    /// The stored version was not the guard; the control as stored (`None`: never written).
    Conflict(Option<FlowControl>),
}

/// The flow controls: few rows (one per paused or broken tool or upstream), read whole by
/// every dispatcher every second or so, written rarely.
#[async_trait]
pub trait FlowStore: Send + Sync + std::fmt::Debug + 'static {
    /// Every stored control, by name.
    async fn flow_controls(&self) -> Result<Vec<FlowControl>, LedgerError>;

    /// Writes `next` (its `version` is ignored) if the stored version is `guard` (0: only if
    /// none is stored). Of racing writers with the same guard exactly one applies.
    async fn write_flow_control(
        &self,
        guard: u64,
        next: FlowControl,
    ) -> Result<FlowCas, LedgerError>;
}

/// Refuses a control that is not one to store: a name that is neither a tool's nor an
/// upstream's, or a text over its bounds.
pub fn validate(next: &FlowControl) -> Result<(), LedgerError> {
    let bad = |why: String| LedgerError::InvalidRequest {
        run_id: crate::SYSTEM_RUN.into(),
        command_key: format!("flow/{}", next.name),
        why,
    };
    if next.name.is_empty() || next.name.len() > 160 {
        return Err(bad("a flow control's name must be 1-160 bytes".into()));
    }
    if let Some(pause) = &next.paused
        && (pause.reason.len() > 2_000 || pause.actor.len() > 200)
    {
        return Err(bad(
            "a pause's reason is at most 2000 bytes, its actor 200".into()
        ));
    }
    Ok(())
}
