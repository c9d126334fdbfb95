//! The reference index of evidence (`sluice_ledger::EvidenceStore::reference_put`): which
//! command stored an upstream's reference of its effect, for the webhooks that name the effect
//! by that reference and not by the key Sluice sent (`[tool.evidence] reference_pointer`).
//!
//! Written in one place, [`Context::drive`]'s loop, which every transition of every service
//! goes through (a dispatch's answer, an accepted job's id, a look's find, an operator's
//! resolution, an event's): a step that stores a reference the command did not hold has it
//! indexed *before* the guarded write that stores it. So a stored reference always has its
//! entry — a crash or a lost compare-and-set after the index write leaves at worst an entry
//! for a reference no command stores, which the reader ignores, as it checks the command's own
//! `external_ref` and tool. Only tools that match by reference pay the write
//! (`Tool::evidence_by_reference`, known at load); every other tool's transitions skip it on
//! a comparison.

use sluice_core::catalog::Catalog;
use sluice_core::command::Command;
use sluice_core::evidence::MAX_REFERENCE_BYTES;
use sluice_core::ids::IdempotencyKey;
use sluice_core::machine::Step;
use sluice_ledger::Ledger;

use crate::pipeline::PipelineError;

/// The reference `step` stores for `command` that must be indexed first: a new one (not the
/// one the command holds), of a tool that matches its evidence by reference. A reference
/// longer than [`MAX_REFERENCE_BYTES`] is never indexed (and never looked up).
pub(crate) fn to_index<'s>(
    catalog: &Catalog,
    command: &Command,
    step: &'s Step,
) -> Option<&'s str> {
    let reference = step.state.external_ref.as_deref()?;
    if command.state.external_ref.as_deref() == Some(reference) {
        return None;
    }
    let by_reference = catalog
        .get(&command.tool)
        .is_some_and(|tool| tool.evidence_by_reference());
    if !by_reference {
        return None;
    }
    if reference.len() > MAX_REFERENCE_BYTES {
        tracing::warn!(
            run_id = %command.run_id,
            command_key = %command.command_key,
            tool = %command.tool,
            bytes = reference.len(),
            "the upstream's reference is longer than {MAX_REFERENCE_BYTES} bytes: not indexed, so no webhook can name the effect by it"
        );
        return None;
    }
    Some(reference)
}

/// Indexes `reference` to `command` (first writer wins). Another command of the same tool
/// holding it already (an upstream that gave two effects one id) is logged: events naming it
/// go to that command, and this one waits for its key, its look or a person.
pub(crate) async fn index(
    ledger: &dyn Ledger,
    command: &Command,
    reference: &str,
) -> Result<(), PipelineError> {
    let key = IdempotencyKey::new(command.run_id.clone(), command.command_key.clone());
    let held = ledger.reference_put(&command.tool, reference, &key).await?;
    if held != key {
        tracing::warn!(
            run_id = %command.run_id,
            command_key = %command.command_key,
            tool = %command.tool,
            reference,
            held_by = %held,
            "the upstream's reference is indexed to another command of the tool already: webhooks naming it go to that one"
        );
    }
    Ok(())
}
