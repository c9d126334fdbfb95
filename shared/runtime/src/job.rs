//! The one runtime entry of every service job ([`Context::run_job`]): a service reads the
//! command, asks the core for a plan (`sluice_core::machine`'s `plan_*`), makes its one call to
//! the outside world, and hands the plan's event here; this drives it through the guarded
//! write (asking the plan again on the command as it is after a lost compare-and-set), owns
//! what the ledger answered (applied, refused, left, missing, and the log line of each), and
//! carries out the stored step's actions through the one action → topic table
//! ([`crate::pipeline::request_for`]) with the cause the core names (`machine::cause_of`). Restate's
//! leader carrying out the actions its handlers return is the model: the same way every time.
//! The producer's operator actions and evidence events take the same entry, their event given
//! by a person or a source instead of planned.

use sluice_core::command::Command;
use sluice_core::machine::{self, Event, Job, Refusal, Step};

use crate::pipeline::Driven;
use crate::{Context, Current, PipelineError};

/// What [`Context::run_job`] did.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Ran {
    /// The plan's event was stored (this is the command as stored, and the step), and the
    /// step's actions were carried out.
    Applied(Command, Step),
    /// Nothing was written: the plan left the command as it is now. This is the command as it
    /// stands.
    Left(Command),
    /// Nothing was written: the core refused the plan's event on the command as it is now
    /// (logged). This is the command as it stands, and why.
    Refused(Command, Refusal),
    /// No such command.
    Missing,
}

impl Ran {
    /// The command as it stands after the job; `None` when there is no such command.
    pub fn command(self) -> Option<Command> {
        match self {
            Self::Applied(command, _) | Self::Left(command) | Self::Refused(command, _) => {
                Some(command)
            }
            Self::Missing => None,
        }
    }

    /// The command as stored, when the plan's event was applied.
    pub fn applied(self) -> Option<Command> {
        match self {
            Self::Applied(command, _) => Some(command),
            Self::Left(_) | Self::Refused(..) | Self::Missing => None,
        }
    }
}

/// Who runs a job: the service that carries out its step (the source of its lifecycle events)
/// and the actor its write records in the audit chain. A service's own job is both (`From` a
/// service's name); an operator's action is recorded as the operator, an evidence event as its
/// source, and both are carried out by the producer.
#[derive(Debug, Clone, Copy)]
pub struct Actor<'a> {
    pub service: &'a str,
    pub recorded: &'a str,
}

impl<'a> Actor<'a> {
    /// `service` carrying out a job it writes as `recorded`.
    pub fn on_behalf_of(service: &'a str, recorded: &'a str) -> Self {
        Actor { service, recorded }
    }
}

impl<'a> From<&'a str> for Actor<'a> {
    /// A service's own job.
    fn from(service: &'a str) -> Self {
        Actor {
            service,
            recorded: service,
        }
    }
}

/// The failpoint sites of a job's write (`sluice_faults::point!` takes its name as a literal,
/// so a service passes a function holding its sites): `written` right after the write returned
/// (whatever it answered), `carrying` and `carried` around carrying out the step of an applied
/// write. A crash at `written` or `carrying` leaves a stored step whose publication the sweep
/// redoes.
#[derive(Debug, Clone, Copy)]
pub struct Sites {
    pub written: fn(),
    pub carrying: fn(),
    pub carried: fn(),
}

impl Sites {
    /// No failpoint site around the write.
    pub const NONE: Sites = Sites {
        written: none,
        carrying: none,
        carried: none,
    };
}

fn none() {}

impl From<Command> for Current {
    /// A command the caller just read or wrote: trusted.
    fn from(command: Command) -> Self {
        Current {
            command: Some(command),
            trusted: true,
        }
    }
}

impl Context {
    /// Runs one step of `job` on the command in `start` (as read, or as the caller last wrote
    /// it): `plan` gives the event to write on the command as it is (the core's plan for the
    /// job, or `None` to leave it), asked again on every re-read after a lost compare-and-set.
    /// An applied step's actions are carried out with the core's cause; a refusal is logged
    /// here. Only a ledger failure, or a bus failure in a job a caller does not wait on
    /// (`answers_a_caller`), is an error.
    pub fn run_job<'a, P>(
        &self,
        job: Job,
        actor: impl Into<Actor<'a>>,
        start: impl Into<Current>,
        sites: Sites,
        mut plan: P,
    ) -> impl Future<Output = Result<Ran, PipelineError>>
    where
        P: FnMut(&Command) -> Option<Event> + Send,
    {
        // Not an `async fn`: its arguments would be kept in the state machine beside what
        // they are converted to (the command twice, ~700 bytes more in every job's future and
        // in each service's future that awaits one). Converted first, only these are kept.
        let (actor, start) = (actor.into(), start.into());
        async move {
            let Some(command) = &start.command else {
                return Ok(Ran::Missing);
            };
            let (run_id, command_key) = (command.run_id.clone(), command.command_key.clone());
            // The event of the last plan: the one applied, or refused.
            let mut planned: Option<Event> = None;
            let driven = self
                .drive(&run_id, &command_key, actor.recorded, start, |current| {
                    let event = plan(current);
                    planned.clone_from(&event);
                    event
                })
                .await?;
            (sites.written)();
            Ok(match driven {
                Driven::Applied(command, step) => {
                    let cause = match &planned {
                        Some(event) => machine::cause_of(job, event, &command.state),
                        // Applied means planned; the cause only labels the request.
                        None => machine::Cause::Other,
                    };
                    (sites.carrying)();
                    match self.carry_out(actor.service, &command, &step, cause).await {
                        Ok(()) => (sites.carried)(),
                        // The step is stored all the same: its requests are republished by the
                        // sweep (a PENDING or APPROVED command goes stale, an awaited request
                        // falls due), so only its lifecycle event may be missing. A caller told
                        // it failed would repeat an action that took, and be refused.
                        Err(e) if answers_a_caller(job) => {
                            tracing::warn!(
                                run_id = %run_id,
                                command_key = %command_key,
                                ?job,
                                error = %e,
                                "follow-up not published"
                            );
                        }
                        Err(e) => return Err(e.into()),
                    }
                    Ran::Applied(command, step)
                }
                Driven::Refused(command, refusal) => {
                    refused(job, planned.as_ref(), &command, &refusal);
                    Ran::Refused(command, refusal)
                }
                Driven::Skipped(command) => Ran::Left(command),
                Driven::Missing => Ran::Missing,
            })
        }
    }
}

/// Whether `job` answers a caller (an operator's request, an evidence source's delivery)
/// rather than a bus message. A bus message's job fails when its step is stored but not
/// published: the message is not acknowledged and comes back, and the job runs again. A
/// caller's job has stored what it was asked, so it reports the step applied and the failure
/// only in the log; the refusal of its event is the caller's answer, not a service's problem.
fn answers_a_caller(job: Job) -> bool {
    match job {
        Job::Operate | Job::Evidence => true,
        Job::Dispatch | Job::Look | Job::Sweep | Job::Compensate | Job::SettleDuplicate => false,
    }
}

/// The log line of a refused plan. A job's result refused is worth a warning (the write was
/// the point of the job; what it found is not lost: evidence, the sweep or the holder of the
/// newer epoch settles the command); the bookkeeping around it (a claim another job holds, a
/// due time moved meanwhile) is routine, and so is a caller's event refused (the caller is
/// answered why).
fn refused(job: Job, event: Option<&Event>, command: &Command, refusal: &Refusal) {
    let status = command.status();
    match (refusal, event) {
        (Refusal::StaleEpoch { .. }, Some(Event::Dispatched { outcome, .. })) => {
            tracing::warn!(
                %refusal,
                outcome = outcome.label(),
                "lease lost before the outcome was written; the reconciler resolves it from evidence"
            );
        }
        (_, Some(event)) if routine(event) || answers_a_caller(job) => {
            tracing::debug!(%refusal, ?job, %status, "not applied");
        }
        (_, _) => tracing::warn!(%refusal, ?job, %status, "refused"),
    }
}

/// The events a job writes around its result, not as it: claims, holds and due-time moves.
fn routine(event: &Event) -> bool {
    matches!(
        event,
        Event::Claim { .. }
            | Event::Republish { .. }
            | Event::ExtendLease { .. }
            | Event::Release { .. }
            | Event::Due
            | Event::LeaseExpired
            | Event::ApprovalExpired
    )
}
