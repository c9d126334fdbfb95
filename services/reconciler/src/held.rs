//! Evidence that came before it was awaited (`sluice_core::evidence`): an upstream's signed
//! event that named a command still PENDING or LEASED was recorded by the producer, not applied
//! (`Disposition::Recorded`). When the command goes UNKNOWN, the look applies the latest such
//! event instead of calling the status check — as `Event::Evidence`, the same event the
//! producer would have applied — and marks its record applied; a tool with no status check is
//! then settled by its webhook instead of going to a person. An asynchronous tool's callback
//! that found its command not waiting yet is kept and applied the same way.

use serde_json::json;

use sluice_core::callback;
use sluice_core::catalog::Tool;
use sluice_core::command::Command;
use sluice_core::evidence::{Disposition, EvidenceRecord};
use sluice_core::machine::{self, Event};
use sluice_runtime::{Context, PipelineError};

/// The event to apply for `command` from the evidence kept for it, and its record; `None`
/// when it is not UNKNOWN, its tool takes neither evidence nor callbacks, or none was kept.
/// An asynchronous tool's callback (source `callback:<tool>`, kept as `{epoch, body}`) counts
/// as its webhook's events do.
pub(crate) async fn evidence_for(
    ctx: &Context,
    command: &Command,
    tool: Option<&Tool>,
) -> Result<Option<(Event, EvidenceRecord)>, PipelineError> {
    let Some(tool) = tool else {
        return Ok(None);
    };
    let declared = tool.evidence();
    let callbacks = tool
        .asynchronous()
        .map(|_| callback::source_of(&tool.name().to_string()));
    if declared.is_none() && callbacks.is_none() {
        return Ok(None);
    }
    if !machine::takes_held_evidence(&command.state) {
        return Ok(None);
    }
    let key = command.idempotency_key.to_string();
    let held = ctx.ledger.evidence_held(&key).await?;
    // The latest the upstream said, of this tool's source or its callbacks.
    let Some(record) = held.into_iter().rev().find(|r| {
        r.outcome.is_some()
            && (declared.is_some_and(|d| r.source == d.source)
                || callbacks.as_ref() == Some(&r.source))
    }) else {
        return Ok(None);
    };
    let Some(outcome) = record.outcome else {
        return Ok(None);
    };
    let external_ref = if callbacks.as_ref() == Some(&record.source) {
        callback::read(tool, key, &record.event["body"])
    } else {
        declared.and_then(|declared| declared.read(&record.event))
    }
    .and_then(|reading| reading.external_ref);
    let event = Event::Evidence {
        source: record.source.clone(),
        event_id: record.event_id.clone(),
        outcome,
        external_ref,
        evidence: json!({
            "source": record.source,
            "event_id": record.event_id,
            "event": record.event,
            "held_since": record.received_at,
        }),
    };
    Ok(Some((event, record)))
}

/// Marks a held record applied once its event was stored: it is no longer held.
pub(crate) async fn applied(
    ctx: &Context,
    mut record: EvidenceRecord,
    note: String,
) -> Result<(), PipelineError> {
    record.disposition = Disposition::Applied;
    record.note = note;
    ctx.ledger.evidence_settle(&record).await?;
    Ok(())
}
