//! What every service does with a command: read it, ask the state machine, write the step
//! through a guarded ledger write, then carry out the actions the step returned.
//!
//! [`Context::drive`] is that loop. On a lost compare-and-set it re-reads and asks again, so a
//! handler racing another replica (or a zombie) either applies to the state it actually found
//! or learns the event no longer applies. [`Context::carry_out`] turns actions into bus
//! messages; it runs only after the ledger write, so a crash in between leaves a stored state
//! whose due time makes the sweep redo the publication (nothing is lost, at worst repeated).

use std::sync::Arc;

use sluice_bus::{Admission, Bus, BusError, Topic};
use sluice_connector::Connector;
use sluice_core::catalog::{Catalog, Tool};
use sluice_core::command::{Command, CommandStatus};
use sluice_core::ids::{CommandKey, RunId};
use sluice_core::machine::{self, Action, Event, Refusal, RunAction, Step};
use sluice_core::time::Clock;
use sluice_ledger::{Cas, Closing, Ledger, LedgerError, Transition};
use thiserror::Error;
use tracing::Instrument;

use crate::messages::{
    Cause, CompensateJob, EventOrigin, LifecycleEvent, Outgoing, compensate_request,
    dispatch_request, reconcile_request, run_compensate_request,
};
use crate::metrics::Metrics;

/// How often a handler re-reads and retries after losing a compare-and-set.
const MAX_CAS_RETRIES: usize = 8;

/// Everything a service needs, shared by the four of them when they run in one process.
#[derive(Debug, Clone)]
pub struct Context {
    pub ledger: Arc<dyn Ledger>,
    pub bus: Arc<dyn Bus>,
    pub catalog: Arc<Catalog>,
    pub connector: Arc<dyn Connector>,
    pub clock: Arc<dyn Clock>,
    pub metrics: Arc<Metrics>,
    /// Flow control's per-process state: the shared controls as last read, this process's
    /// buckets and calls in flight (`crate::flow`).
    pub flow: Arc<crate::flow::Flow>,
    /// The keys that sign a command's copy in its dispatch requests, and verify it at the
    /// dispatcher (`crate::copies`); `None`: requests carry no copy and are read.
    pub copies: Option<Arc<crate::copies::Copies>>,
    /// The commands of this process's lifecycle events, handed to the waiters of a producer
    /// in the same process with the whole command (`crate::local_events`).
    pub local_events: Arc<crate::local_events::LocalEvents>,
}

/// A failure that stops a handler; the message is not acknowledged and comes back.
#[derive(Debug, Error)]
pub enum PipelineError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("command {run_id}/{command_key} kept changing under {attempts} attempts")]
    Contended {
        run_id: RunId,
        command_key: CommandKey,
        attempts: usize,
    },
}

/// What [`Context::drive`] did. Short-lived and moved once, so its size does not matter.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Driven {
    /// The step was stored; this is the command as stored and the step.
    Applied(Command, Step),
    /// The event does not apply to the command as it is now.
    Refused(Command, Refusal),
    /// The caller chose not to act on the command as it is now.
    Skipped(Command),
    /// No such command.
    Missing,
}

/// A command as [`Context::current`] found it.
#[derive(Debug, Clone)]
pub struct Current {
    /// `None`: the ledger has no such command.
    pub command: Option<Command>,
    /// Read from the ledger just now. A copy this process wrote last ([`CommandStore::cached`]) is
    /// only trusted to start a compare-and-set from: [`Context::drive`] re-reads it
    /// before it skips or refuses on it.
    pub trusted: bool,
}

/// How the record of a run's rollback begins; the operator's reason follows.
pub const ROLLBACK_RECORD: &str = "run rollback: ";

/// What [`Context::begin_rollback`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RollbackBegun {
    pub cancelled: usize,
    pub compensating: usize,
    pub no_compensation: usize,
    /// Commands in flight at the time (leased, UNKNOWN, retrying after an ambiguous attempt,
    /// STUCK): marked, so that a commit they turn out to have made is compensated.
    pub in_flight: Vec<String>,
    /// How many of them were marked.
    pub marked: usize,
    /// The run was rolled back before: no second rollback record was written, and only what
    /// the first left undone (a rollback cut short by a crash) was taken now.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub already: bool,
    /// The job the rollback asks of the compensator (`machine::plan_rollback_job`), for the
    /// caller to carry out ([`Context::carry_out_run`]); `None`: nothing is sent.
    #[serde(skip)]
    pub job: Option<RunAction>,
}

impl RollbackBegun {
    /// Whether this call moved any command.
    pub fn moved_any(&self) -> bool {
        self.cancelled + self.compensating + self.no_compensation + self.marked > 0
    }
}

/// The span of one guarded write, in the command's trace (`sluice_trace::adopt`): a database
/// client span after OpenTelemetry's conventions, named `<operation> commands` — the ledger's
/// operation (`lease` takes a lease, `finalize` stores a call's outcome, `transition` any other
/// step; the `op` of `sluice_ledger_round_trips_total`) and the table — with `db.system.name`,
/// `db.namespace`, `db.collection.name` and `db.operation.name`. Sluice's own attributes: run
/// id, command key, tool, the event (`sluice.event`), the status it leads to, and (recorded
/// after the write) the outcome: the status stored, or `conflict` for a lost compare-and-set.
/// Never arguments.
fn write_span(
    ledger: &dyn sluice_ledger::Ledger,
    command: &Command,
    event: &Event,
    to: CommandStatus,
) -> tracing::Span {
    use machine::EventKind;
    let operation = match event.kind() {
        EventKind::Lease => "lease",
        EventKind::Dispatched => "finalize",
        _ => "transition",
    };
    let event_name = match event.kind() {
        EventKind::Lease => "lease",
        EventKind::Dispatched => "finalize",
        EventKind::Release => "release",
        EventKind::Block => "block",
        EventKind::Deny => "deny",
        EventKind::Due => "due",
        EventKind::LeaseExpired => "lease_expired",
        EventKind::Observed => "observed",
        EventKind::Evidence => "evidence",
        EventKind::RetrySameKey => "retry_same_key",
        EventKind::GiveUp => "give_up",
        EventKind::Compensated => "compensated",
        EventKind::DuplicateSettled => "duplicate_settled",
        EventKind::Approve => "approve",
        EventKind::Reject => "reject",
        EventKind::ApprovalExpired => "approval_expired",
        EventKind::Cancel => "cancel",
        EventKind::Rollback => "rollback",
        EventKind::MarkRollback => "mark_rollback",
        EventKind::Resolve => "resolve",
        EventKind::Replay => "replay",
        _ => "transition",
    };
    // Debug level: without the exporter (whose filter takes Sluice's debug spans) and at the
    // default log level, the span is disabled and costs next to nothing per write.
    let db = ledger.db_identity();
    let span = tracing::debug_span!(
        "ledger.write",
        otel.name = %format_args!("{operation} {}", sluice_ledger::COMMANDS_TABLE),
        otel.kind = "client",
        db.system.name = db.system,
        db.namespace = db.namespace,
        db.collection.name = sluice_ledger::COMMANDS_TABLE,
        db.operation.name = operation,
        sluice.event = event_name,
        run_id = %command.run_id,
        command_key = %command.command_key,
        tool = %command.tool,
        epoch = command.epoch().get(),
        to = to.as_str(),
        outcome = tracing::field::Empty,
    );
    sluice_trace::adopt(&span, command.trace.as_ref());
    span
}

/// The tool of a command, or a reason the command cannot run any more.
pub fn tool_of<'c>(catalog: &'c Catalog, command: &Command) -> Option<&'c Tool> {
    catalog.get(&command.tool)
}

impl Context {
    /// The command as a handler first sees it: the copy this process wrote last, which saves
    /// the read, or else the ledger's.
    pub async fn current(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Result<Current, PipelineError> {
        Ok(match self.ledger.cached(run_id, command_key) {
            Some(hint) => Current {
                command: Some(hint),
                trusted: false,
            },
            None => Current {
                command: self.ledger.get(run_id, command_key).await?,
                trusted: true,
            },
        })
    }

    /// The signed copy of `command` as this process just wrote it, with its ledger's basis,
    /// for the command's dispatch request; `None` without copy keys.
    pub fn seal_copy(&self, command: &Command) -> Option<Vec<u8>> {
        let copies = self.copies.as_ref()?;
        let basis = self.ledger.basis(&command.run_id, &command.command_key);
        Some(copies.seal(command, basis, self.clock.now()))
    }

    /// The command a dispatch request's signed copy holds, adopted by this process's ledger
    /// with its basis, as a [`Current`] to start from without a read (untrusted: a decision not
    /// to act on it is taken on a read). `None` when the request carries no copy or the copy
    /// is not used (counted by why, in `sluice_dispatch_copies_total`): then read the command.
    pub fn adopt_copy(
        &self,
        header: Option<&[u8]>,
        run_id: &RunId,
        command_key: &CommandKey,
    ) -> Option<Current> {
        let copies = self.copies.as_ref()?;
        let Some(header) = header else {
            self.metrics.copy_outcome("absent");
            return None;
        };
        match copies.open(header, (run_id, command_key), self.clock.now()) {
            Ok(copy) => {
                if let Some(basis) = &copy.basis {
                    self.ledger.adopt(&copy.command, basis);
                }
                self.metrics.copy_outcome("used");
                Some(Current {
                    command: Some(copy.command),
                    trusted: false,
                })
            }
            Err(refused) => {
                if refused != crate::copies::Refused::Stale {
                    tracing::warn!(%run_id, %command_key, why = refused.as_str(),
                        "a dispatch request's copy was refused; reading the command instead");
                }
                self.metrics.copy_outcome(refused.as_str());
                None
            }
        }
    }

    /// Lets `decide` pick an event for the command in `current` (as [`Context::current`] found
    /// it, or as the caller last read or wrote it) as it is now, or `None` to leave it; applies
    /// the event and stores the step, re-reading and deciding again on a lost compare-and-set.
    /// Services reach it through their one entry, [`Context::run_job`], which carries out the
    /// stored step.
    ///
    /// Not an `async fn`: a state machine of its own would keep `current` (~700 bytes) beside
    /// the inner one it awaits.
    pub(crate) fn drive<F>(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        actor: &str,
        current: Current,
        decide: F,
    ) -> impl Future<Output = Result<Driven, PipelineError>>
    where
        F: FnMut(&Command) -> Option<Event> + Send,
    {
        self.drive_inner(
            run_id,
            command_key,
            actor,
            current.command,
            current.trusted,
            decide,
        )
    }

    /// [`Context::drive`] starting from a command the caller just read or wrote, saving a
    /// ledger read; a stale copy only costs a lost compare-and-set and a re-read.
    pub(crate) async fn drive_from<F>(
        &self,
        command: Command,
        actor: &str,
        decide: F,
    ) -> Result<Driven, PipelineError>
    where
        F: FnMut(&Command) -> Option<Event> + Send,
    {
        let (run_id, command_key) = (command.run_id.clone(), command.command_key.clone());
        self.drive_inner(&run_id, &command_key, actor, Some(command), true, decide)
            .await
    }

    /// `trusted`: `current` was read from the ledger or written by the caller just now; an
    /// untrusted copy ([`CommandStore::cached`]) is re-read before the caller's decision not to act
    /// on it, or a refusal, is believed.
    async fn drive_inner<F>(
        &self,
        run_id: &RunId,
        command_key: &CommandKey,
        actor: &str,
        mut current: Option<Command>,
        mut trusted: bool,
        mut decide: F,
    ) -> Result<Driven, PipelineError>
    where
        F: FnMut(&Command) -> Option<Event> + Send,
    {
        let mut round = 0;
        while round < MAX_CAS_RETRIES {
            let Some(command) = current else {
                return Ok(Driven::Missing);
            };
            let decided = decide(&command).map(|event| {
                let rules = self.rules_of(&command);
                let step = machine::apply(&command.state, &rules, &event, self.clock.now());
                (event, step)
            });
            let (event, step) = match decided {
                Some((event, Ok(step))) => (event, step),
                _ if !trusted => {
                    current = self.ledger.get(run_id, command_key).await?;
                    trusted = true;
                    continue;
                }
                None => return Ok(Driven::Skipped(command)),
                Some((_, Err(refusal))) => return Ok(Driven::Refused(command, refusal)),
            };
            round += 1;
            // Before the write that stores it: a stored reference is never missing from the
            // index (`crate::references`).
            if let Some(reference) = crate::references::to_index(&self.catalog, &command, &step) {
                crate::references::index(&*self.ledger, &command, reference).await?;
            }
            let write = Transition::from_step(&command, &step, actor);
            let span = write_span(&*self.ledger, &command, &event, step.to());
            let cas = async {
                match &event {
                    Event::Lease { .. } => self.ledger.acquire_lease(write).await,
                    Event::Dispatched { .. } => self.ledger.finalize(write).await,
                    _ => self.ledger.transition(write).await,
                }
            }
            .instrument(span.clone())
            .await?;
            match cas {
                Cas::Applied(stored) => {
                    span.record("outcome", stored.status().as_str());
                    // The span of the work this write is part of (a message's, an operator
                    // action's) names the command it came to and where it left it.
                    let record = |work: &tracing::Span| {
                        work.record("command_key", stored.command_key.as_str());
                        work.record("tool", tracing::field::display(&stored.tool));
                        work.record("outcome", stored.status().as_str());
                    };
                    record(&tracing::Span::current());
                    let _ = crate::consumer::WORK_SPAN.try_with(record);
                    if !step.quiet {
                        self.metrics.transition(&stored, step.from);
                    }
                    return Ok(Driven::Applied(stored, step));
                }
                Cas::Conflict(now) => {
                    span.record("outcome", "conflict");
                    self.metrics.cas_conflicts.inc();
                    // Decided again on the command as it is now: a fenced event (an outcome,
                    // a compensation's result) is refused by the core if its epoch is gone,
                    // and applies if only something beside the fence moved (a run rollback's
                    // mark keeps the lease holder's right to write its outcome).
                    current = now;
                    trusted = true;
                }
            }
        }
        Err(PipelineError::Contended {
            run_id: run_id.clone(),
            command_key: command_key.clone(),
            attempts: MAX_CAS_RETRIES,
        })
    }

    /// The state machine rules of a command (`machine::Rules::for_command`: the tool's rules
    /// now, the stricter of its semantics now and the command's stored ones, the command's own
    /// attempts); a tool gone from the catalog keeps the command's own semantics with no
    /// status check or compensate.
    pub fn rules_of(&self, command: &Command) -> machine::Rules {
        let rules = match tool_of(&self.catalog, command) {
            Some(tool) => tool.rules(),
            None => machine::Rules::defaults(command.semantics),
        }
        .for_command(command.semantics, command.max_attempts);
        self.with_write_slack(rules)
    }

    /// `rules` with leases sized for the ledger's writes as this process measures them now
    /// (`load::write_slack_ms`, at most the configured lease again).
    pub fn with_write_slack(&self, rules: machine::Rules) -> machine::Rules {
        let slack =
            sluice_core::load::write_slack_ms(self.ledger.write_latency_ms(), rules.lease_ttl_ms);
        rules.with_write_slack(slack)
    }

    /// Publishes the work a stored step implies. `CallUpstream` is the dispatcher's own job
    /// and is not handled here.
    pub async fn carry_out(
        &self,
        service: &str,
        command: &Command,
        step: &Step,
        cause: Cause,
    ) -> Result<(), BusError> {
        self.carry_out_admitted(service, command, step, cause, None)
            .await
    }

    /// [`Context::carry_out`] of new work entering the pipeline: the step's first request to
    /// another service is published under `room`, the queue room a submission took for it
    /// ([`Bus::admit`]), which it keeps until the request is handled.
    pub async fn carry_out_admitted(
        &self,
        service: &str,
        command: &Command,
        step: &Step,
        cause: Cause,
        mut room: Option<Admission>,
    ) -> Result<(), BusError> {
        for action in &step.actions {
            match action {
                Action::Dispatch
                | Action::Reconcile
                | Action::Compensate
                | Action::CompensateDuplicate => {
                    let copy = matches!(action, Action::Dispatch)
                        .then(|| self.seal_copy(command))
                        .flatten();
                    if let Some((topic, message)) = request_for(action, command, cause, copy) {
                        self.publish(topic, command.run_id.as_str(), message, room.take())
                            .await?;
                    }
                }
                Action::Publish { status } => {
                    let event = LifecycleEvent::new(
                        service,
                        command,
                        self.event_origin(command, step),
                        self.clock.now(),
                    );
                    debug_assert_eq!(*status, command.status());
                    let event = Outgoing {
                        payload: event.payload,
                        headers: event.headers,
                    };
                    // Before the bus delivers the event: a waiter here takes the command
                    // without reading the ledger.
                    self.local_events.published(command);
                    self.publish(Topic::Events, command.run_id.as_str(), event, None)
                        .await?;
                }
                Action::Escalate { reason } => {
                    self.metrics.escalations.inc();
                    tracing::warn!(
                        run_id = %command.run_id,
                        command_key = %command.command_key,
                        status = %command.status(),
                        reason = %reason,
                        "escalated to a person"
                    );
                    let event = LifecycleEvent::escalated(
                        service,
                        command,
                        self.event_origin(command, step),
                        self.clock.now(),
                        reason,
                    );
                    let event = Outgoing {
                        payload: event.payload,
                        headers: event.headers,
                    };
                    self.publish(Topic::Events, command.run_id.as_str(), event, None)
                        .await?;
                }
                Action::CallUpstream => {}
            }
        }
        Ok(())
    }

    /// What the lifecycle events of `step` are built from besides the command: the status it
    /// left and the arguments the command's tool publishes (none when it left the catalog).
    pub fn event_origin<'c>(&'c self, command: &Command, step: &Step) -> EventOrigin<'c> {
        EventOrigin {
            from: Some(step.from),
            include_args: tool_of(&self.catalog, command)
                .map(Tool::event_args)
                .unwrap_or_default(),
        }
    }

    /// Publishes the request a run's plan names ([`run_request_for`]), under the current
    /// span's trace context.
    pub async fn carry_out_run(&self, run_id: &RunId, action: &RunAction) -> Result<(), BusError> {
        let (topic, message) = run_request_for(action, run_id);
        self.publish(topic, run_id.as_str(), message, None).await
    }

    /// The one publish path: `message` keyed by its run, in a send span; under `room` when the
    /// message is new work a submission took queue room for.
    async fn publish(
        &self,
        topic: Topic,
        run_id: &str,
        message: Outgoing,
        room: Option<Admission>,
    ) -> Result<(), BusError> {
        let span = crate::spans::send(&*self.bus, topic, run_id);
        let published = match room {
            Some(room) => {
                self.bus
                    .publish_admitted(room, topic, run_id, message.payload, message.headers)
                    .instrument(span.clone())
                    .await?
            }
            None => {
                self.bus
                    .publish(topic, run_id, message.payload, message.headers)
                    .instrument(span.clone())
                    .await?
            }
        };
        crate::spans::sent(&span, &published);
        Ok(())
    }

    /// Starts a run rollback durably: records it in the run's audit chain and closes the run to
    /// new commands (one write), cancels the commands that have not started, and moves every
    /// CONFIRMED command that can be undone to COMPENSATING (with a due time, so the sweep finishes the work if the process dies) or to
    /// NO_COMPENSATION. The compensate calls themselves are the compensator's job.
    pub async fn begin_rollback(
        &self,
        run_id: &RunId,
        actor: &str,
        reason: &str,
    ) -> Result<RollbackBegun, PipelineError> {
        let commands = self.ledger.list_run(run_id, None).await?;
        let in_flight: Vec<String> = commands
            .iter()
            .filter(|c| machine::in_flight_at_rollback(&c.state))
            .map(|c| c.command_key.to_string())
            .collect();
        // Recorded and closed in one write: from here on the run takes no new effects. A run
        // closed before gets no second record; its commands are still driven below, so a
        // rollback cut short after its close is finished by the next one (and one that ran to
        // its end writes nothing more: the core has no rollback step for an undone command).
        let closing = self
            .ledger
            .close_run(
                run_id,
                sluice_core::audit::AuditDraft {
                    command_key: None,
                    from: None,
                    to: None,
                    actor: actor.to_owned(),
                    reason: format!("{ROLLBACK_RECORD}{reason}"),
                    evidence: serde_json::json!({
                        "commands": commands.len(),
                        "in_flight": in_flight,
                    }),
                },
                self.clock.now(),
            )
            .await?;
        let already = matches!(closing, Closing::AlreadyClosed);
        // Read again now that the run is closed: a command reserved between the first read and
        // the close (the reservation checks the close atomically) is in this list, so nothing
        // the run accepted escapes the rollback.
        let commands = self.ledger.list_run(run_id, None).await?;
        let operator = machine::Operator {
            actor: actor.to_owned(),
            reason: format!("run rolled back: {reason}"),
        };
        let mut begun = RollbackBegun {
            in_flight,
            already,
            ..RollbackBegun::default()
        };
        // Last in the journal first, as the compensations will run. What to do with each is the
        // core's decision, taken again on the command as it is at each write: one that moved
        // while the rollback ran (fell due, was leased, settled) is still taken.
        for command in commands.iter().rev() {
            let driven = self
                .drive_from(command.clone(), actor, |current| {
                    if already {
                        machine::repeated_rollback_event(
                            &current.state,
                            current.semantics,
                            &operator,
                        )
                    } else {
                        machine::rollback_event(&current.state, current.semantics, &operator)
                    }
                })
                .await?;
            if let Driven::Applied(command, step) = driven {
                match command.status() {
                    CommandStatus::Cancelled => begun.cancelled += 1,
                    CommandStatus::Compensating => begun.compensating += 1,
                    CommandStatus::NoCompensation => begun.no_compensation += 1,
                    // Marked in flight: compensated once its outcome is known.
                    _ => begun.marked += 1,
                }
                // Publish the lifecycle events; the compensations run in order in one job.
                let mut step = step;
                step.actions
                    .retain(|action| !matches!(action, Action::Compensate));
                self.carry_out("producer", &command, &step, Cause::Reserved)
                    .await?;
            }
        }
        begun.job = machine::plan_rollback_job(already, begun.moved_any(), actor, reason);
        Ok(begun)
    }
}

/// The one table from a requested action to its topic and message: a step's actions
/// (`Context::carry_out`, a sweep's republish among them: `Event::Republish` names the awaited
/// request) go through it.
/// `None` for the actions that are not requests to another service.
/// `copy`: the command's signed copy, for a dispatch request ([`Context::seal_copy`]).
pub fn request_for(
    action: &Action,
    command: &Command,
    cause: Cause,
    copy: Option<Vec<u8>>,
) -> Option<(Topic, Outgoing)> {
    match action {
        Action::Dispatch => Some((Topic::Requested, dispatch_request(command, cause, copy))),
        Action::Reconcile => Some((Topic::Unknown, reconcile_request(command))),
        Action::Compensate => Some((
            Topic::Compensate,
            compensate_request(
                command,
                CompensateJob::Command {
                    command_key: command.command_key.clone(),
                },
            ),
        )),
        Action::CompensateDuplicate => Some((
            Topic::Compensate,
            compensate_request(
                command,
                CompensateJob::Duplicate {
                    command_key: command.command_key.clone(),
                    extra_refs: command.state.owed_duplicates.clone(),
                },
            ),
        )),
        Action::Publish { .. } | Action::Escalate { .. } | Action::CallUpstream => None,
    }
}

/// The table's rows for a request about a whole run ([`RunAction`], named by a run's plan:
/// `machine::plan_rollback_job`), sent under the current span's trace context.
pub fn run_request_for(action: &RunAction, run_id: &RunId) -> (Topic, Outgoing) {
    match action {
        RunAction::Rollback { actor, reason } => (
            Topic::Compensate,
            run_compensate_request(
                run_id,
                CompensateJob::Rollback {
                    actor: actor.clone(),
                    reason: reason.clone(),
                },
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{CompensateRequest, decode};

    #[test]
    fn a_run_s_rollback_job_goes_to_the_compensate_topic_as_the_compensator_reads_it() {
        let run_id = RunId::parse("r-1").expect("valid");
        let job = machine::plan_rollback_job(false, true, "ops-ana", "the agent looped")
            .expect("a first rollback sends its job");
        let (topic, message) = run_request_for(&job, &run_id);
        assert_eq!(topic, Topic::Compensate);
        assert_eq!(
            decode::<CompensateRequest>("compensate request", &message.payload).expect("ok"),
            CompensateRequest {
                run_id,
                job: CompensateJob::Rollback {
                    actor: "ops-ana".into(),
                    reason: "the agent looped".into(),
                },
            }
        );
    }
}
