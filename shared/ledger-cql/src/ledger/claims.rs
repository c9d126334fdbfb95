//! Business keys: which command of a (tool, business key) is the one recorded, and how a claim
//! whose command never landed is taken over without letting its stalled holder record a second.
//!
//! A claim is a row of `business_keys` naming the command (run id, command key) that may
//! record the key's one intent, and a `claim_id` that is new each time the claim is made or
//! taken over. The claim and the command are in different partitions, so no single LWT can
//! check one and write the other; instead the reservation is conditioned on its claim's id not
//! being **fenced** in its own row:
//!
//! 1. `claim`: `INSERT … IF NOT EXISTS` with a new id. Not applied → the holder, and its id.
//! 2. The holder's command exists → it holds the key (reserve answers with it). It does not,
//!    and the claim is older than `orphan_claim_grace_ms` (its reservation died or stalled):
//!    **fence** the holder — `UPDATE commands SET claim_fences[holder's id] = now` on the
//!    holder's command row `IF status = null` (only while that command does not exist) — then
//!    take the claim over, `IF run_id = ? AND command_key = ? AND claim_id = holder's id`.
//! 3. The reservation's LWT carries `AND claim_fences[its claim id] = null`.
//!
//! Both writes on the holder's row are Paxos rounds on one partition, so they are ordered: the
//! holder's reservation came first (the fence does not apply and the taker finds the command
//! holding the key), or the fence did (the reservation never applies under that claim). A
//! claim is taken over only after its id was fenced, so at most one command of a business key
//! is ever recorded, whichever producer stalls, for however long, at whatever step:
//!
//! * the holder stalls after its claim, the taker records its command: the holder's
//!   reservation finds its claim fenced, claims again and answers with the taker's command;
//! * the taker stalls after fencing, before taking over: the holder finds itself fenced and
//!   still named by the claim, takes the claim over from itself (a new id, which is not
//!   fenced) and records its command; the taker's takeover, conditioned on the old id, fails;
//! * the taker stalls after taking over: it is an orphan in turn, and whoever takes the key
//!   from it fences it first.
//!
//! A fence is never removed and has no TTL (it must outlive any stall); it is a cell in a row
//! that has no command, which every reader already treats as absent. A claim made before
//! `003_claim_fence.cql` has no id: it is fenced and taken over as the nil id. Cost: nothing on
//! the path where the claim is not taken over (the id rides on the claim's and the
//! reservation's LWTs); one LWT more (the fence) per takeover, and a fenced reservation costs
//! its LWT plus the claim again.

use uuid::Uuid;

use sluice_core::command::Command;
use sluice_core::ids::{BusinessKey, CommandKey, RunId, ToolName};
use sluice_ledger::LedgerError;

use super::{CqlLedger, Lwt, back_off, storage_msg};
use crate::codec::bad;
use crate::stats::{Kind, Op};

/// How a claim went, for reserve.
pub(super) enum Claimed {
    /// The key is the claimant's, under claim `id`; `fresh` if this call claimed it.
    Mine {
        id: Uuid,
        fresh: bool,
    },
    HeldBy(RunId, CommandKey),
}

impl CqlLedger {
    /// Claims `business_key` of `tool` for `run_id`/`command_key`. `dead`: this command's
    /// claim id that its reservation found fenced; that claim is taken over at once (by this
    /// command itself, if no one else has yet).
    pub(super) async fn claim(
        &self,
        op: Op,
        tool: &ToolName,
        business_key: &BusinessKey,
        run_id: &RunId,
        command_key: &CommandKey,
        dead: Option<Uuid>,
    ) -> Result<Claimed, LedgerError> {
        let (tool, bk) = (tool.to_string(), business_key.as_str());
        let (run, key) = (run_id.as_str(), command_key.to_string());
        let ttl = self.inner.config.business_key_ttl();
        let grace = i64::try_from(self.inner.config.orphan_claim_grace_ms).unwrap_or(i64::MAX);
        // How long to wait for a holder whose reservation is still in flight. Both this and
        // the grace are judged on the one clock reading taken before each attempt's LWT: read
        // apart, an attempt whose LWT ran long could see the grace not yet passed (stale
        // reading) and the patience already spent (fresh one), and give up on a key it was
        // entitled to take over.
        let patience = grace.min(5_000);
        let started = self.now().as_millis();
        for attempt in 0..self.inner.config.max_attempts {
            let now = self.now().as_millis();
            let id = Uuid::new_v4();
            let holder = match self
                .lwt(
                    op,
                    "claim business key",
                    &self.inner.st.claim,
                    (tool.as_str(), bk, run, key.as_str(), now, id, ttl),
                )
                .await?
            {
                Lwt::Applied => return Ok(Claimed::Mine { id, fresh: true }),
                Lwt::NotApplied(row) => row,
                Lwt::Unknown => {
                    let rows = self
                        .paged(
                            op,
                            "read business key",
                            &self.inner.st.read_claim_serial,
                            (tool.as_str(), bk),
                            Kind::Serial,
                        )
                        .await?;
                    match rows.into_iter().next() {
                        Some(row) => row,
                        None => continue,
                    }
                }
            };
            let (Some(held_run), Some(held_key)) =
                (holder.text("run_id"), holder.text("command_key"))
            else {
                continue;
            };
            // A claim made before claims had ids is fenced and taken over as the nil id.
            let held_id = holder.uuid("claim_id");
            let fence_id = held_id.unwrap_or_else(Uuid::nil);
            if held_run == run && held_key == key {
                if dead != Some(fence_id) {
                    return Ok(Claimed::Mine {
                        id: fence_id,
                        fresh: false,
                    });
                }
                // Our own claim, fenced by a taker that has not taken it over (yet): this id
                // can no longer reserve, so take the claim over from ourselves for a new one.
            } else {
                let holder_id = RunId::parse(held_run)
                    .and_then(|r| CommandKey::parse(held_key).map(|k| (r, k)))
                    .map_err(|e| bad("business key holder", held_run, e.to_string()))?;
                if self
                    .read_row(op, held_run, held_key, false)
                    .await?
                    .is_some()
                {
                    return Ok(Claimed::HeldBy(holder_id.0, holder_id.1));
                }
                // The holder does not exist: its reservation is in flight, or died or stalled
                // after its claim.
                let claimed_at = holder.bigint("claimed_at").unwrap_or(0);
                if now.saturating_sub(claimed_at) < grace {
                    if now.saturating_sub(started) >= patience {
                        return Err(storage_msg(
                            "claim business key",
                            format!(
                                "business key {bk} of {tool} is claimed by {held_run}/{held_key}, whose reservation has not landed yet; try again"
                            ),
                        ));
                    }
                    back_off(attempt.min(4) + 2).await;
                    continue;
                }
                // Fence the holder before taking its claim: from now on its reservation under
                // this claim cannot apply, stalled as long as it may be.
                match self
                    .lwt(
                        op,
                        "fence business key claim",
                        &self.inner.st.fence_claim,
                        (fence_id, now, held_run, held_key),
                    )
                    .await?
                {
                    Lwt::Applied => {}
                    // Its command landed first: the next round finds it holding the key. An
                    // unknown outcome is settled the same way (fencing again is harmless).
                    Lwt::NotApplied(_) | Lwt::Unknown => continue,
                }
                self.pause("claim.fenced", run).await;
            }
            let taken = self
                .lwt(
                    op,
                    "take over business key",
                    &self.inner.st.take_over_claim,
                    (
                        ttl,
                        run,
                        key.as_str(),
                        now,
                        id,
                        tool.as_str(),
                        bk,
                        held_run,
                        held_key,
                        held_id,
                    ),
                )
                .await?;
            if matches!(taken, Lwt::Applied) {
                return Ok(Claimed::Mine { id, fresh: true });
            }
            // Lost the race, or unknown: the next round reads who holds it now (a takeover that
            // did apply is read back as ours, with its id).
        }
        Err(self.too_contended(op, run))
    }

    /// Releases the claim `command` made, after its reservation was refused.
    pub(super) async fn release_claim(&self, op: Op, command: &Command) {
        let Some(bk) = &command.business_key else {
            return;
        };
        let key = command.command_key.to_string();
        let tool = command.tool.to_string();
        if let Err(e) = self
            .lwt(
                op,
                "release business key",
                &self.inner.st.release_claim,
                (
                    tool.as_str(),
                    bk.as_str(),
                    command.run_id.as_str(),
                    key.as_str(),
                ),
            )
            .await
        {
            // The claim outlives its failed reservation; the orphan rule frees it later.
            tracing::warn!(run_id = %command.run_id, command_key = %key, error = %e,
                "could not release a business key after a refused reservation");
        }
    }
}
