//! Every statement the ledger runs, prepared once when it connects.
//!
//! Plain statements are marked idempotent (the driver may retry them); lightweight transactions
//! are not: a retried LWT could apply twice, so the ledger settles their timeouts itself with a
//! SERIAL read. LWTs run with the session's serial consistency (SERIAL or LOCAL_SERIAL) for the
//! Paxos phase and its consistency (QUORUM or LOCAL_QUORUM) for the commit.

use std::time::Duration;

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;

use crate::CqlError;
use crate::config::CqlConfig;

/// The static columns of a run's partition, as every head read selects them.
pub(crate) const STATICS: &str = "audit_seq, audit_head, audit_pending, audit_pending_prev, \
     audit_write_id, run_created_at, updated_at, ckpt_count, ckpt_hash, ckpt_at, run_closed_at";
/// A command row's own columns.
const ROW: &str = "command_key, identity, state, status, lease_epoch, due_at, args_hash, write_id";

/// Where a run's audit records sit among its partition's rows: keys `a-<seq, 20 digits>`
/// (`codec::link_key`), before every command key (`d-…`), read and deleted by range.
pub(crate) const LINKS_START: &str = "a-";
const LINKS_END: &str = "a.";
/// The range of a run's command keys (`d-<decision>/…`).
const COMMANDS_START: &str = "d-";
const COMMANDS_END: &str = "d.";

/// How long a link's use is kept, in seconds: a day past the longest a link lives.
const LINK_USE_TTL_S: u64 = sluice_core::approval_link::MAX_EXPIRES_S + 24 * 3_600;

/// Rows per page of a partition read.
const PAGE_SIZE: i32 = 1_000;

#[derive(Debug)]
pub(crate) struct Statements {
    // Reads.
    pub read_head: PreparedStatement,
    pub read_head_serial: PreparedStatement,
    pub read_command: PreparedStatement,
    pub read_command_serial: PreparedStatement,
    pub read_run: PreparedStatement,
    pub read_run_brief: PreparedStatement,
    pub read_due_at: PreparedStatement,
    pub read_audit: PreparedStatement,
    pub read_links: PreparedStatement,
    pub read_link_serial: PreparedStatement,
    pub read_commands: PreparedStatement,
    pub read_due: PreparedStatement,
    pub read_cursors: PreparedStatement,
    pub read_claim_serial: PreparedStatement,
    pub read_runs_day: PreparedStatement,
    pub read_meta: PreparedStatement,
    // Lightweight transactions.
    pub reserve: PreparedStatement,
    pub reserve_claimed: PreparedStatement,
    pub transition: PreparedStatement,
    pub quiet: PreparedStatement,
    pub append: PreparedStatement,
    pub claim: PreparedStatement,
    pub fence_claim: PreparedStatement,
    pub take_over_claim: PreparedStatement,
    pub release_claim: PreparedStatement,
    pub purge_fence: PreparedStatement,
    pub purge_row: PreparedStatement,
    pub restore_run: PreparedStatement,
    // Plain writes.
    pub insert_audit: PreparedStatement,
    pub delete_audit_below: PreparedStatement,
    /// A record's row in its run's partition: only ever in a batch with the LWT that fixed it.
    pub insert_link: PreparedStatement,
    pub delete_links_below: PreparedStatement,
    pub insert_due: PreparedStatement,
    pub delete_due: PreparedStatement,
    pub write_cursor: PreparedStatement,
    pub insert_run: PreparedStatement,
    pub delete_run: PreparedStatement,
    pub write_meta: PreparedStatement,
    // Sweep shards (`ledger/shards.rs`).
    pub read_shards: PreparedStatement,
    pub read_shard_serial: PreparedStatement,
    pub read_members: PreparedStatement,
    pub take_shard: PreparedStatement,
    pub write_shard: PreparedStatement,
    pub announce: PreparedStatement,
    // Flow controls (`ledger/flow.rs`).
    pub read_flow: PreparedStatement,
    pub read_flow_serial: PreparedStatement,
    pub create_flow: PreparedStatement,
    pub write_flow: PreparedStatement,
    pub read_budget_serial: PreparedStatement,
    pub create_budget: PreparedStatement,
    pub write_budget: PreparedStatement,
    pub index_budget_window: PreparedStatement,
    pub index_budget_command: PreparedStatement,
    pub read_budget_window: PreparedStatement,
    pub read_budget_counter: PreparedStatement,
    pub read_budget_command: PreparedStatement,
    pub delete_budget_command: PreparedStatement,
    // Webhook deliveries (`ledger/webhooks.rs`).
    pub enqueue_webhook: PreparedStatement,
    pub update_webhook: PreparedStatement,
    pub read_webhook_serial: PreparedStatement,
    // Approval links' uses (`ledger/webhooks.rs`).
    pub consume_link: PreparedStatement,
    pub read_link_use_serial: PreparedStatement,
    pub due_webhooks: PreparedStatement,
    pub list_webhooks: PreparedStatement,
    // Evidence received by webhook (`ledger/evidence.rs`).
    pub put_evidence: PreparedStatement,
    pub settle_evidence: PreparedStatement,
    pub read_evidence_serial: PreparedStatement,
    pub list_evidence: PreparedStatement,
    pub hold_evidence: PreparedStatement,
    pub unhold_evidence: PreparedStatement,
    pub read_evidence_held: PreparedStatement,
    // The reference index (`ledger/evidence.rs`).
    pub put_reference: PreparedStatement,
    pub read_reference: PreparedStatement,
    pub read_reference_serial: PreparedStatement,
}

impl Statements {
    pub(crate) async fn prepare(session: &Session, config: &CqlConfig) -> Result<Self, CqlError> {
        let ks = config.keyspace.as_str();
        let serial_read = config.serial_consistency.as_read();
        let lwt_timeout =
            (config.lwt_timeout_ms > 0).then(|| Duration::from_millis(config.lwt_timeout_ms));
        let prepare = |cql: String, kind: Kind| async move {
            let mut statement =
                session
                    .prepare(cql.as_str())
                    .await
                    .map_err(|source| CqlError::Prepare {
                        keyspace: ks.to_owned(),
                        statement: cql.clone(),
                        source: Box::new(source),
                    })?;
            match kind {
                Kind::Read => {
                    statement.set_is_idempotent(true);
                    statement.set_page_size(PAGE_SIZE);
                }
                Kind::SerialRead => {
                    // A SERIAL read runs a Paxos round: never retried behind our back either.
                    statement.set_consistency(serial_read);
                    statement.set_page_size(PAGE_SIZE);
                }
                Kind::Write => statement.set_is_idempotent(true),
                Kind::Lwt => {
                    statement.set_is_idempotent(false);
                    if lwt_timeout.is_some() {
                        statement.set_request_timeout(lwt_timeout);
                    }
                }
            }
            Ok::<_, CqlError>(statement)
        };
        use Kind::{Lwt, Read, SerialRead, Write};
        let reserve = format!(
            "UPDATE {ks}.commands SET status = :status, lease_epoch = :lease_epoch, due_at = :due_at, \
             args_hash = :args_hash, identity = :identity, state = :state, \
             write_id = :write_id, audit_seq = :next_seq, audit_head = :head, \
             audit_pending = null, audit_pending_prev = null, updated_at = :updated_at, \
             run_created_at = :new_run_created_at \
             WHERE run_id = :run_id AND command_key = :command_key \
             IF status = null AND audit_seq = :seq AND audit_head = :seq_head \
             AND run_created_at = :run_created_at"
        );
        Ok(Self {
            read_head: prepare(
                format!("SELECT {STATICS} FROM {ks}.commands WHERE run_id = ? LIMIT 1"),
                Read,
            )
            .await?,
            read_head_serial: prepare(
                format!("SELECT {STATICS} FROM {ks}.commands WHERE run_id = ? LIMIT 1"),
                SerialRead,
            )
            .await?,
            read_command: prepare(
                format!(
                    "SELECT {ROW}, {STATICS} FROM {ks}.commands WHERE run_id = ? AND command_key = ?"
                ),
                Read,
            )
            .await?,
            read_command_serial: prepare(
                format!(
                    "SELECT {ROW}, {STATICS} FROM {ks}.commands WHERE run_id = ? AND command_key = ?"
                ),
                SerialRead,
            )
            .await?,
            read_run: prepare(
                format!("SELECT {ROW}, {STATICS} FROM {ks}.commands WHERE run_id = ?"),
                Read,
            )
            .await?,
            read_run_brief: prepare(
                format!(
                    "SELECT status, run_created_at, updated_at, run_closed_at FROM {ks}.commands WHERE run_id = ?"
                ),
                Read,
            )
            .await?,
            read_due_at: prepare(
                format!(
                    "SELECT status, due_at FROM {ks}.commands WHERE run_id = ? AND command_key = ?"
                ),
                Read,
            )
            .await?,
            read_audit: prepare(
                format!(
                    "SELECT seq, record, prev_hash, hash, write_id FROM {ks}.audit \
                     WHERE run_id = ? AND seq >= ?"
                ),
                Read,
            )
            .await?,
            read_links: prepare(
                format!(
                    "SELECT command_key, link_record, link_prev, link_hash, write_id \
                     FROM {ks}.commands WHERE run_id = ? AND command_key >= ? \
                     AND command_key < '{LINKS_END}'"
                ),
                Read,
            )
            .await?,
            read_link_serial: prepare(
                format!(
                    "SELECT write_id FROM {ks}.commands WHERE run_id = ? AND command_key = ?"
                ),
                SerialRead,
            )
            .await?,
            read_commands: prepare(
                format!(
                    "SELECT {ROW}, {STATICS} FROM {ks}.commands WHERE run_id = ? \
                     AND command_key >= '{COMMANDS_START}' AND command_key < '{COMMANDS_END}'"
                ),
                Read,
            )
            .await?,
            read_due: prepare(
                format!(
                    "SELECT due_at, run_id, command_key, WRITETIME(status) AS written FROM {ks}.due \
                     WHERE minute = ? AND shard = ? AND due_at > ? AND due_at <= ?"
                ),
                Read,
            )
            .await?,
            read_cursors: prepare(
                format!("SELECT shard, minute FROM {ks}.sweep_cursor WHERE shard IN ?"),
                Read,
            )
            .await?,
            read_claim_serial: prepare(
                format!(
                    "SELECT run_id, command_key, claimed_at, claim_id FROM {ks}.business_keys \
                     WHERE tool = ? AND business_key = ?"
                ),
                SerialRead,
            )
            .await?,
            read_runs_day: prepare(
                format!(
                    "SELECT created_at, run_id FROM {ks}.runs \
                     WHERE day = ? AND created_at >= ? AND created_at < ?"
                ),
                Read,
            )
            .await?,
            read_meta: prepare(
                format!("SELECT value FROM {ks}.meta WHERE name = ?"),
                Read,
            )
            .await?,
            reserve: prepare(reserve.clone(), Lwt).await?,
            // The same under a business-key claim: not if the claim was fenced here.
            reserve_claimed: prepare(
                format!("{reserve} AND claim_fences[:claim_id] = null"),
                Lwt,
            )
            .await?,
            transition: prepare(
                format!(
                    "UPDATE {ks}.commands SET status = :status, lease_epoch = :lease_epoch, \
                     due_at = :due_at, state = :state, write_id = :write_id, \
                     audit_seq = :next_seq, audit_head = :head, audit_pending = null, \
                     audit_pending_prev = null, updated_at = :updated_at \
                     WHERE run_id = :run_id AND command_key = :command_key \
                     IF status = :guard_status AND lease_epoch = :guard_epoch \
                     AND write_id = :row_write_id AND audit_seq = :seq AND audit_head = :seq_head"
                ),
                Lwt,
            )
            .await?,
            quiet: prepare(
                format!(
                    "UPDATE {ks}.commands SET status = ?, lease_epoch = ?, due_at = ?, state = ?, \
                     write_id = ? WHERE run_id = ? AND command_key = ? \
                     IF status = ? AND lease_epoch = ?"
                ),
                Lwt,
            )
            .await?,
            append: prepare(
                format!(
                    "UPDATE {ks}.commands SET audit_seq = :next_seq, audit_head = :head, \
                     audit_pending = null, audit_pending_prev = null, updated_at = :updated_at, \
                     run_created_at = :new_run_created_at, run_closed_at = :closed_at \
                     WHERE run_id = :run_id \
                     IF audit_seq = :seq AND run_created_at = :run_created_at"
                ),
                Lwt,
            )
            .await?,
            claim: prepare(
                format!(
                    "INSERT INTO {ks}.business_keys (tool, business_key, run_id, command_key, claimed_at, claim_id) \
                     VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL ?"
                ),
                Lwt,
            )
            .await?,
            // No TTL: a fence must outlive any stall of the producer it stops.
            fence_claim: prepare(
                format!(
                    "UPDATE {ks}.commands SET claim_fences[?] = ? \
                     WHERE run_id = ? AND command_key = ? IF status = null"
                ),
                Lwt,
            )
            .await?,
            take_over_claim: prepare(
                format!(
                    "UPDATE {ks}.business_keys USING TTL ? SET run_id = ?, command_key = ?, \
                     claimed_at = ?, claim_id = ? WHERE tool = ? AND business_key = ? \
                     IF run_id = ? AND command_key = ? AND claim_id = ?"
                ),
                Lwt,
            )
            .await?,
            release_claim: prepare(
                format!(
                    "DELETE FROM {ks}.business_keys WHERE tool = ? AND business_key = ? \
                     IF run_id = ? AND command_key = ?"
                ),
                Lwt,
            )
            .await?,
            purge_fence: prepare(
                format!(
                    "UPDATE {ks}.commands SET ckpt_count = ?, ckpt_hash = ?, ckpt_at = ?, \
                     run_created_at = null WHERE run_id = ? \
                     IF audit_seq = ? AND run_created_at = ?"
                ),
                Lwt,
            )
            .await?,
            purge_row: prepare(
                format!(
                    "DELETE FROM {ks}.commands WHERE run_id = ? AND command_key = ? \
                     IF status = ? AND lease_epoch = ?"
                ),
                Lwt,
            )
            .await?,
            restore_run: prepare(
                format!(
                    "UPDATE {ks}.commands SET run_created_at = ? WHERE run_id = ? \
                     IF run_created_at = null"
                ),
                Lwt,
            )
            .await?,
            insert_audit: prepare(
                format!(
                    "INSERT INTO {ks}.audit (run_id, seq, record, prev_hash, hash, write_id) \
                     VALUES (?, ?, ?, ?, ?, ?)"
                ),
                Write,
            )
            .await?,
            delete_audit_below: prepare(
                format!("DELETE FROM {ks}.audit WHERE run_id = ? AND seq < ?"),
                Write,
            )
            .await?,
            insert_link: prepare(
                format!(
                    "INSERT INTO {ks}.commands \
                     (run_id, command_key, link_record, link_prev, link_hash, write_id) \
                     VALUES (?, ?, ?, ?, ?, ?)"
                ),
                Lwt,
            )
            .await?,
            delete_links_below: prepare(
                format!(
                    "DELETE FROM {ks}.commands WHERE run_id = ? \
                     AND command_key >= '{LINKS_START}' AND command_key < ?"
                ),
                Write,
            )
            .await?,
            insert_due: prepare(
                format!(
                    "INSERT INTO {ks}.due (minute, shard, due_at, run_id, command_key, status) \
                     VALUES (?, ?, ?, ?, ?, ?)"
                ),
                Write,
            )
            .await?,
            delete_due: prepare(
                format!(
                    "DELETE FROM {ks}.due USING TIMESTAMP ? WHERE minute = ? AND shard = ? \
                     AND due_at = ? AND run_id = ? AND command_key = ?"
                ),
                Write,
            )
            .await?,
            write_cursor: prepare(
                format!("UPDATE {ks}.sweep_cursor SET minute = ? WHERE shard = ?"),
                Write,
            )
            .await?,
            insert_run: prepare(
                format!("INSERT INTO {ks}.runs (day, created_at, run_id) VALUES (?, ?, ?)"),
                Write,
            )
            .await?,
            delete_run: prepare(
                format!("DELETE FROM {ks}.runs WHERE day = ? AND created_at = ? AND run_id = ?"),
                Write,
            )
            .await?,
            write_meta: prepare(
                format!("UPDATE {ks}.meta SET value = ? WHERE name = ?"),
                Write,
            )
            .await?,
            read_shards: prepare(
                format!(
                    "SELECT shard, holder, epoch, expires_at FROM {ks}.sweep_shards \
                     WHERE sweep_group = ? AND shard IN ?"
                ),
                Read,
            )
            .await?,
            read_shard_serial: prepare(
                format!(
                    "SELECT shard, holder, epoch, expires_at, write_id FROM {ks}.sweep_shards \
                     WHERE sweep_group = ? AND shard = ?"
                ),
                SerialRead,
            )
            .await?,
            read_members: prepare(
                format!("SELECT name, expires_at FROM {ks}.sweep_members WHERE sweep_group = ?"),
                Read,
            )
            .await?,
            take_shard: prepare(
                format!(
                    "INSERT INTO {ks}.sweep_shards \
                     (sweep_group, shard, holder, epoch, expires_at, write_id) \
                     VALUES (?, ?, ?, ?, ?, ?) IF NOT EXISTS"
                ),
                Lwt,
            )
            .await?,
            write_shard: prepare(
                format!(
                    "UPDATE {ks}.sweep_shards SET holder = ?, epoch = ?, expires_at = ?, \
                     write_id = ? WHERE sweep_group = ? AND shard = ? IF epoch = ?"
                ),
                Lwt,
            )
            .await?,
            announce: prepare(
                format!(
                    "INSERT INTO {ks}.sweep_members (sweep_group, name, expires_at) \
                     VALUES (?, ?, ?) USING TTL ?"
                ),
                Write,
            )
            .await?,
            read_flow: prepare(
                format!("SELECT name, version, body FROM {ks}.flow_controls WHERE scope = ?"),
                Read,
            )
            .await?,
            read_flow_serial: prepare(
                format!(
                    "SELECT name, version, body, write_id FROM {ks}.flow_controls \
                     WHERE scope = ? AND name = ?"
                ),
                SerialRead,
            )
            .await?,
            enqueue_webhook: prepare(
                format!(
                    "UPDATE {ks}.webhook_deliveries SET version = ?, status = ?, next_at = ?, \
                     created_at = ?, record = ?, write_id = ? \
                     WHERE webhook = ? AND event_id = ? IF version = null"
                ),
                Lwt,
            )
            .await?,
            update_webhook: prepare(
                format!(
                    "UPDATE {ks}.webhook_deliveries USING TTL ? SET version = ?, status = ?, \
                     next_at = ?, created_at = ?, record = ?, write_id = ? \
                     WHERE webhook = ? AND event_id = ? IF version = ?"
                ),
                Lwt,
            )
            .await?,
            consume_link: prepare(
                format!(
                    "INSERT INTO {ks}.approval_link_uses \
                     (link_id, run_id, command_key, used_at, write_id) VALUES (?, ?, ?, ?, ?) \
                     IF NOT EXISTS USING TTL {LINK_USE_TTL_S}"
                ),
                Lwt,
            )
            .await?,
            read_link_use_serial: prepare(
                format!("SELECT write_id FROM {ks}.approval_link_uses WHERE link_id = ?"),
                SerialRead,
            )
            .await?,
            read_webhook_serial: prepare(
                format!(
                    "SELECT version, write_id FROM {ks}.webhook_deliveries \
                     WHERE webhook = ? AND event_id = ?"
                ),
                SerialRead,
            )
            .await?,
            create_flow: prepare(
                format!(
                    "INSERT INTO {ks}.flow_controls (scope, name, version, body, write_id) \
                     VALUES (?, ?, ?, ?, ?) IF NOT EXISTS"
                ),
                Lwt,
            )
            .await?,
            write_flow: prepare(
                format!(
                    "UPDATE {ks}.flow_controls SET version = ?, body = ?, write_id = ? \
                     WHERE scope = ? AND name = ? IF version = ?"
                ),
                Lwt,
            )
            .await?,
            read_budget_serial: prepare(
                format!(
                    "SELECT used, holds, version, write_id FROM {ks}.budget_counters \
                     WHERE counter = ?"
                ),
                SerialRead,
            )
            .await?,
            create_budget: prepare(
                format!(
                    "INSERT INTO {ks}.budget_counters (counter, budget, scope_value, \
                     window_start, currency, used, holds, version, write_id) \
                     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
                ),
                Lwt,
            )
            .await?,
            write_budget: prepare(
                format!(
                    "UPDATE {ks}.budget_counters SET used = ?, holds = ?, version = ?, \
                     write_id = ? WHERE counter = ? IF version = ?"
                ),
                Lwt,
            )
            .await?,
            index_budget_window: prepare(
                format!(
                    "INSERT INTO {ks}.budget_windows (budget, window_start, counter) \
                     VALUES (?, ?, ?)"
                ),
                Write,
            )
            .await?,
            index_budget_command: prepare(
                format!(
                    "INSERT INTO {ks}.budget_command_holds (run_id, command_key, counter) \
                     VALUES (?, ?, ?)"
                ),
                Write,
            )
            .await?,
            read_budget_window: prepare(
                format!(
                    "SELECT counter FROM {ks}.budget_windows WHERE budget = ? AND window_start = ?"
                ),
                Read,
            )
            .await?,
            read_budget_counter: prepare(
                format!(
                    "SELECT scope_value, currency, used, holds FROM {ks}.budget_counters \
                     WHERE counter = ?"
                ),
                Read,
            )
            .await?,
            read_budget_command: prepare(
                format!(
                    "SELECT counter FROM {ks}.budget_command_holds \
                     WHERE run_id = ? AND command_key = ?"
                ),
                Read,
            )
            .await?,
            delete_budget_command: prepare(
                format!(
                    "DELETE FROM {ks}.budget_command_holds \
                     WHERE run_id = ? AND command_key = ? AND counter = ?"
                ),
                Write,
            )
            .await?,
            due_webhooks: prepare(
                format!(
                    "SELECT record, next_at FROM {ks}.webhook_deliveries \
                     WHERE webhook = ? AND status = ? AND next_at <= ? ALLOW FILTERING"
                ),
                Read,
            )
            .await?,
            list_webhooks: prepare(
                format!(
                    "SELECT record, created_at FROM {ks}.webhook_deliveries WHERE webhook = ?"
                ),
                Read,
            )
            .await?,
            put_evidence: prepare(
                format!(
                    "INSERT INTO {ks}.evidence_events \
                     (source, event_id, received_at, record, write_id) VALUES (?, ?, ?, ?, ?) \
                     IF NOT EXISTS USING TTL ?"
                ),
                Lwt,
            )
            .await?,
            settle_evidence: prepare(
                format!(
                    "UPDATE {ks}.evidence_events USING TTL ? SET record = ? \
                     WHERE source = ? AND event_id = ? IF EXISTS"
                ),
                Lwt,
            )
            .await?,
            read_evidence_serial: prepare(
                format!(
                    "SELECT record, write_id FROM {ks}.evidence_events \
                     WHERE source = ? AND event_id = ?"
                ),
                SerialRead,
            )
            .await?,
            list_evidence: prepare(
                format!(
                    "SELECT record, received_at FROM {ks}.evidence_events WHERE source = ?"
                ),
                Read,
            )
            .await?,
            hold_evidence: prepare(
                format!(
                    "INSERT INTO {ks}.evidence_held \
                     (idempotency_key, source, event_id, received_at, record) \
                     VALUES (?, ?, ?, ?, ?) USING TTL ?"
                ),
                Write,
            )
            .await?,
            unhold_evidence: prepare(
                format!(
                    "DELETE FROM {ks}.evidence_held \
                     WHERE idempotency_key = ? AND source = ? AND event_id = ?"
                ),
                Write,
            )
            .await?,
            read_evidence_held: prepare(
                format!(
                    "SELECT record, received_at FROM {ks}.evidence_held WHERE idempotency_key = ?"
                ),
                Read,
            )
            .await?,
            put_reference: prepare(
                format!(
                    "INSERT INTO {ks}.evidence_references (tool, reference, idempotency_key) \
                     VALUES (?, ?, ?) IF NOT EXISTS USING TTL ?"
                ),
                Lwt,
            )
            .await?,
            read_reference: prepare(
                format!(
                    "SELECT idempotency_key FROM {ks}.evidence_references \
                     WHERE tool = ? AND reference = ?"
                ),
                Read,
            )
            .await?,
            read_reference_serial: prepare(
                format!(
                    "SELECT idempotency_key FROM {ks}.evidence_references \
                     WHERE tool = ? AND reference = ?"
                ),
                SerialRead,
            )
            .await?,
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Read,
    SerialRead,
    Write,
    Lwt,
}
