//! Flow control as one process carries it out: the controls every replica shares, read from
//! the ledger every second (`keep_fresh`); this process's share of each upstream's rate and cap
//! (one over the dispatchers announced live); its bucket, its calls in flight and its count
//! of failing answers in a row per upstream. What to do is decided in `sluice_core::flow`;
//! here it is counted, waited for and written.
//!
//! The share is 1/N of the live dispatchers, not the share of the bus partitions each owns:
//! it needs nothing from the bus, and it is exact when the work is spread over the partitions,
//! as run ids hashed over them spread it. A replica owning the hot partitions gets no more
//! than its share, so a skewed load reaches less than the declared rate: the limit is never
//! exceeded by it (docs/decisions.md, "Flow control").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use serde_json::json;

use sluice_core::audit::AuditDraft;
use sluice_core::catalog::Tool;
use sluice_core::command::Command;
use sluice_core::flow::{
    self, Breaker, Bucket, FlowControl, Gate, Held, HoldCause, UpstreamSpec, Verdict,
};
use sluice_core::ids::RunId;
use sluice_core::machine::DispatchOutcome;
use sluice_core::time::Timestamp;
use sluice_ledger::{FlowCas, LedgerError, Member, SYSTEM_RUN};

use crate::Context;

/// How often the controls are read again and this dispatcher announces itself: a pause, a
/// resume or another replica's breaker is seen within this.
pub const REFRESH_MS: u64 = 1_000;
/// The sweep group dispatchers announce themselves in, to count each other.
pub const DISPATCHERS: &str = "flow.dispatchers";

/// The flow metrics: `sluice_flow_holds_total{upstream, cause}`,
/// `sluice_breaker_transitions_total{upstream, to}`, `sluice_breaker_state{upstream}` (0
/// closed, 1 open, 2 half open) and `sluice_flow_paused{name}` (1 while paused).
#[derive(Debug, Clone)]
pub struct FlowMetrics {
    pub holds: IntCounterVec,
    pub breaker_transitions: IntCounterVec,
    pub breaker_state: IntGaugeVec,
    pub paused: IntGaugeVec,
}

impl FlowMetrics {
    pub fn register(registry: &Registry) -> Self {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("metric definitions are static and valid");
            registry
                .register(Box::new(metric.clone()))
                .expect("each metric is registered once");
            metric
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntGaugeVec::new(Opts::new(name, help), labels)
                .expect("metric definitions are static and valid");
            registry
                .register(Box::new(metric.clone()))
                .expect("each metric is registered once");
            metric
        };
        Self {
            holds: counter(
                "flow_holds_total",
                "Calls put back until later by flow control, by upstream and cause",
                &["upstream", "cause"],
            ),
            breaker_transitions: counter(
                "breaker_transitions_total",
                "Circuit breaker changes written by this process, by upstream and new state",
                &["upstream", "to"],
            ),
            breaker_state: gauge(
                "breaker_state",
                "Circuit breaker state as last read: 0 closed, 1 open, 2 half open",
                &["upstream"],
            ),
            paused: gauge(
                "flow_paused",
                "1 while a tool or upstream is paused by an operator",
                &["name"],
            ),
        }
    }
}

#[derive(Debug, Default)]
struct Local {
    bucket: Bucket,
    in_flight: u32,
    failures: u32,
}

#[derive(Debug)]
struct State {
    controls: HashMap<String, FlowControl>,
    share: f64,
    local: HashMap<String, Local>,
}

/// One process's flow control. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Flow {
    state: Mutex<State>,
    freed: tokio::sync::Notify,
}

impl Default for Flow {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                controls: HashMap::new(),
                share: 1.0,
                local: HashMap::new(),
            }),
            freed: tokio::sync::Notify::new(),
        }
    }
}

/// What a dispatcher may do with a call now.
#[derive(Debug)]
pub enum Admission {
    /// Call; the permit counts the call in flight until dropped.
    Go(Permit),
    /// Put it back until later.
    Hold(Held),
}

/// A call in flight, counted against its upstream's cap until dropped.
#[derive(Debug)]
pub struct Permit {
    /// `None`: a call nothing limits (no upstream declared, no control stored), counted
    /// nowhere.
    flow: Option<Arc<Flow>>,
    upstream: String,
    /// This call is the breaker's probe.
    pub probe: bool,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some(flow) = &self.flow else {
            return;
        };
        if let Ok(mut state) = flow.state.lock()
            && let Some(local) = state.local.get_mut(&self.upstream)
        {
            local.in_flight = local.in_flight.saturating_sub(1);
        }
        flow.freed.notify_waiters();
    }
}

impl Flow {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut state)
    }

    /// The controls as last read, by name.
    pub fn controls(&self) -> Vec<FlowControl> {
        let mut all: Vec<FlowControl> =
            self.with_state(|state| state.controls.values().cloned().collect());
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// This process's share of every upstream's rate and cap.
    pub fn share(&self) -> f64 {
        self.with_state(|state| state.share)
    }

    fn install(&self, controls: Vec<FlowControl>) {
        self.with_state(|state| {
            state.controls = controls.into_iter().map(|c| (c.name.clone(), c)).collect();
        });
    }

    fn install_one(&self, control: FlowControl) {
        self.with_state(|state| {
            let newer = state
                .controls
                .get(&control.name)
                .is_none_or(|held| held.version <= control.version);
            if newer {
                state.controls.insert(control.name.clone(), control);
            }
        });
    }

    /// Whether `tool`'s call may go now, and if not until when it is put back. Waits inside
    /// the process only up to `flow::WAIT_IN_PROCESS_MS`, for a slot of the rate or a place
    /// under the cap.
    pub async fn admit(
        self: &Arc<Self>,
        ctx: &Context,
        tool: &Tool,
        command: &Command,
        owner: &str,
    ) -> Result<Admission, LedgerError> {
        // The common case, on every dispatch: an upstream with no rate or cap (a breaker at
        // most) and nothing stored by an operator or a breaker. Nothing to count or look up;
        // the answer is still counted toward the breaker (`after_call`).
        let spec = ctx.catalog.upstream_of(tool);
        if spec.rate.is_none()
            && spec.max_in_flight.is_none()
            && self.with_state(|state| state.controls.is_empty())
        {
            return Ok(Admission::Go(Permit {
                flow: None,
                upstream: String::new(),
                probe: false,
            }));
        }
        let spec = spec.into_owned();
        let now = ctx.clock.now();
        let (tool_control, upstream_control) = self.with_state(|state| {
            (
                state.controls.get(&tool.name().to_string()).cloned(),
                state.controls.get(&spec.name).cloned(),
            )
        });
        let mut probe = false;
        match flow::gate(tool_control.as_ref(), upstream_control.as_ref(), now) {
            Gate::Go => {}
            Gate::Hold(held) => return Ok(Admission::Hold(held)),
            Gate::Probe => match self.claim_probe(ctx, &spec, owner).await? {
                None => probe = true,
                Some(held) => return Ok(Admission::Hold(held)),
            },
        }
        let permit = match self.take_place(&spec, probe).await {
            Some(permit) => permit,
            None => {
                return Ok(Admission::Hold(Held {
                    until: flow::in_flight_recheck(ctx.clock.now()),
                    cause: HoldCause::InFlight,
                    reason: format!(
                        "upstream {} has its {} calls in flight (max_in_flight {} over every dispatcher)",
                        spec.name,
                        spec.in_flight_share(self.share()).unwrap_or(0),
                        spec.max_in_flight.unwrap_or(0)
                    ),
                }));
            }
        };
        let Some(rate) = spec.rate else {
            return Ok(Admission::Go(permit));
        };
        let now = ctx.clock.now();
        let skew = ctx.rules_of(command).clock_skew_ms;
        // Its slot was booked when it was held: it goes without booking another.
        if flow::booked_slot_come(command.state.flow_slot, now, skew) {
            return Ok(Admission::Go(permit));
        }
        let slot = self.with_state(|state| {
            // The burst is the upstream's over every replica too: this one's part of it.
            let share = state.share;
            let burst = ((f64::from(spec.burst) * share).ceil() as u32).max(1);
            local(state, &spec.name)
                .bucket
                .book(rate, share, burst, now)
        });
        match flow::wait_for_slot(slot, now) {
            flow::SlotWait::Go { wait_ms } => {
                if wait_ms > 0 {
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                }
                Ok(Admission::Go(permit))
            }
            flow::SlotWait::Hold => Ok(Admission::Hold(Held {
                until: slot,
                cause: HoldCause::Rate,
                reason: format!(
                    "upstream {}'s rate {rate} (burst {}): its slot is at {slot}",
                    spec.name, spec.burst
                ),
            })),
        }
    }

    /// A place under the cap in flight, waiting up to `WAIT_IN_PROCESS_MS` for one.
    async fn take_place(self: &Arc<Self>, spec: &UpstreamSpec, probe: bool) -> Option<Permit> {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(u64::try_from(flow::WAIT_IN_PROCESS_MS).unwrap_or(0));
        loop {
            let freed = self.freed.notified();
            let taken = self.with_state(|state| {
                let cap = spec.in_flight_share(state.share);
                let local = local(state, &spec.name);
                if cap.is_some_and(|cap| local.in_flight >= cap) && !probe {
                    return false;
                }
                local.in_flight += 1;
                true
            });
            if taken {
                return Some(Permit {
                    flow: Some(Arc::clone(self)),
                    upstream: spec.name.clone(),
                    probe,
                });
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return None;
            }
        }
    }

    /// Takes the breaker's probe for this dispatcher: `None` when won, else the hold of a call
    /// that lost it.
    async fn claim_probe(
        &self,
        ctx: &Context,
        spec: &UpstreamSpec,
        owner: &str,
    ) -> Result<Option<Held>, LedgerError> {
        let Some(breaker) = spec.breaker else {
            return Ok(None);
        };
        let written = self
            .write(ctx, &spec.name, owner, |current, now| {
                flow::claim_probe(&breaker, current, owner, now).map(|next| FlowControl {
                    breaker: next,
                    ..current.clone()
                })
            })
            .await?;
        let now = ctx.clock.now();
        Ok(match written {
            Some(control) if matches!(&control.breaker, Breaker::HalfOpen { probe_by, .. } if probe_by == owner) => {
                None
            }
            _ => match flow::gate(
                None,
                self.with_state(|s| s.controls.get(&spec.name).cloned())
                    .as_ref(),
                now,
            ) {
                Gate::Hold(held) => Some(held),
                // Still waiting for a probe another took and lost meanwhile: look again soon.
                Gate::Go | Gate::Probe => Some(Held {
                    until: flow::in_flight_recheck(now),
                    cause: HoldCause::BreakerOpen,
                    reason: format!(
                        "upstream {}'s breaker is being probed by another dispatcher",
                        spec.name
                    ),
                }),
            },
        })
    }

    /// What the controls as last read say of a look at `tool`'s upstream now: held while the
    /// tool or its upstream is paused, or its breaker is open and its probe not yet due (a
    /// lookup would load a failing upstream, and spend a check). Looks never take the probe
    /// and their answers never count toward the breaker: a lookup failing for one key (a slow
    /// record) says nothing of the upstream, and a breaker that looks could open would hold
    /// the looks that could close it. Once the probe is due they go as before.
    pub fn look_gate(&self, ctx: &Context, tool: &Tool) -> Option<Held> {
        let (tool_control, upstream_control) = self.with_state(|state| {
            (
                state.controls.get(&tool.name().to_string()).cloned(),
                state.controls.get(tool.upstream()).cloned(),
            )
        });
        match flow::gate(
            tool_control.as_ref(),
            upstream_control.as_ref(),
            ctx.clock.now(),
        ) {
            Gate::Hold(held) => Some(held),
            Gate::Go | Gate::Probe => None,
        }
    }

    /// Counts a call's answer against its upstream, and opens or closes the breaker when the
    /// core says so.
    pub async fn after_call(
        &self,
        ctx: &Context,
        tool: &Tool,
        outcome: &DispatchOutcome,
        permit: &Permit,
        owner: &str,
    ) -> Result<(), LedgerError> {
        let error = match outcome {
            DispatchOutcome::Ambiguous { reason } | DispatchOutcome::NotSent { reason } => {
                reason.as_str()
            }
            _ => "",
        };
        self.after_answer(
            ctx,
            tool,
            flow::verdict(outcome),
            error,
            permit.probe,
            owner,
        )
        .await
    }

    /// Counts a call's answer judged `verdict` against `tool`'s upstream; `probe`: it was this
    /// process's probe.
    async fn after_answer(
        &self,
        ctx: &Context,
        tool: &Tool,
        verdict: Verdict,
        error: &str,
        probe: bool,
        owner: &str,
    ) -> Result<(), LedgerError> {
        // Every upstream has one unless it says `breaker = false`.
        let spec = ctx.catalog.upstream_of(tool);
        let Some(breaker) = spec.breaker else {
            return Ok(());
        };
        let failures = self.with_state(|state| {
            let local = local(state, &spec.name);
            match verdict {
                Verdict::Up => local.failures = 0,
                Verdict::Failing => local.failures = local.failures.saturating_add(1),
                Verdict::Neither => {}
            }
            local.failures
        });
        // Decided first on the controls as last read: most answers change nothing, and then
        // nothing is read or written.
        let cached = self
            .with_state(|state| state.controls.get(&spec.name).cloned())
            .unwrap_or_else(|| FlowControl::new(&spec.name));
        let now = ctx.clock.now();
        if flow::after_call(&breaker, &cached, failures, verdict, probe, error, now).is_none() {
            return Ok(());
        }
        let changed = self
            .write(ctx, &spec.name, owner, |current, now| {
                flow::after_call(&breaker, current, failures, verdict, probe, error, now).map(
                    |next| FlowControl {
                        breaker: next,
                        ..current.clone()
                    },
                )
            })
            .await?;
        if changed.is_some() && verdict == Verdict::Up {
            self.with_state(|state| local(state, &spec.name).failures = 0);
        }
        Ok(())
    }

    /// Changes the control of `name` by `change` (given the stored control and now; `None`:
    /// nothing to write), with a compare-and-set retried on a race. A write that applied is
    /// audited in the ledger's own chain, published as an event and counted. Returns the
    /// control as written, or `None` when nothing was.
    pub async fn write(
        &self,
        ctx: &Context,
        name: &str,
        actor: &str,
        change: impl Fn(&FlowControl, Timestamp) -> Option<FlowControl>,
    ) -> Result<Option<FlowControl>, LedgerError> {
        let mut current = ctx
            .ledger
            .flow_controls()
            .await?
            .into_iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| FlowControl::new(name));
        for _ in 0..5 {
            let Some(next) = change(&current, ctx.clock.now()) else {
                self.install_one(current);
                return Ok(None);
            };
            match ctx.ledger.write_flow_control(current.version, next).await? {
                FlowCas::Applied(written) => {
                    self.install_one(written.clone());
                    record(ctx, &current, &written, actor).await;
                    return Ok(Some(written));
                }
                FlowCas::Conflict(stored) => {
                    current = stored.unwrap_or_else(|| FlowControl::new(name));
                }
            }
        }
        Ok(None)
    }
}

fn local<'a>(state: &'a mut State, upstream: &str) -> &'a mut Local {
    state.local.entry(upstream.to_owned()).or_default()
}

/// What changed between `before` and `after`, audited, published and counted. Best effort
/// past the write: the control is stored; a record that fails is logged.
async fn record(ctx: &Context, before: &FlowControl, after: &FlowControl, actor: &str) {
    let Some(change) = crate::messages::FlowChange::between(before, after) else {
        return;
    };
    let metrics = &ctx.metrics.flow;
    if let Some(to) = change.breaker_to() {
        metrics
            .breaker_transitions
            .with_label_values(&[&after.name, to])
            .inc();
    }
    let draft = AuditDraft {
        command_key: None,
        from: None,
        to: None,
        actor: actor.to_owned(),
        reason: change.describe(&after.name),
        evidence: json!({ "flow_control": after, "change": change.kind() }),
    };
    let system = RunId::parse(SYSTEM_RUN).expect("SYSTEM_RUN is a valid run id");
    if let Err(error) = ctx
        .ledger
        .audit_append(&system, draft, ctx.clock.now())
        .await
    {
        tracing::warn!(%error, name = %after.name, "a flow control change was written but not audited");
    }
    let event = change.event(after, actor, ctx.clock.now());
    if let Err(error) = ctx
        .bus
        .publish(
            sluice_bus::Topic::Events,
            &after.name,
            event.payload,
            event.headers,
        )
        .await
    {
        tracing::warn!(%error, name = %after.name, "a flow control change was written but its event not published");
    }
    tracing::warn!(name = %after.name, change = change.kind(), actor, "{}", change.describe(&after.name));
}

/// Reads the controls every `REFRESH_MS` into `ctx.flow` and sets the gauges; a dispatcher
/// (`owner`) also announces itself and counts the live ones for its share. Until `shutdown`.
/// A read that fails keeps the controls last read.
pub async fn keep_fresh(ctx: Context, owner: Option<String>, shutdown: crate::Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_millis(REFRESH_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let lifetime = i64::try_from(REFRESH_MS * 5).unwrap_or(5_000);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        if let Some(owner) = &owner {
            announce(&ctx, owner, lifetime).await;
        }
        refresh(&ctx).await;
    }
    // Withdrawn: the others' shares grow at once instead of after the announcement lapses.
    if let Some(owner) = owner {
        let gone = Member {
            name: owner,
            expires_at: Timestamp::from_millis(0),
        };
        let _ = ctx.ledger.announce(DISPATCHERS, gone).await;
    }
}

/// Announces dispatcher `owner` for `lifetime_ms` and takes one over the live ones as this
/// process's share.
async fn announce(ctx: &Context, owner: &str, lifetime_ms: i64) {
    let now = ctx.clock.now();
    let me = Member {
        name: owner.to_owned(),
        expires_at: now.plus_millis(lifetime_ms),
    };
    if let Err(error) = ctx.ledger.announce(DISPATCHERS, me).await {
        tracing::debug!(%error, "could not announce this dispatcher for flow shares");
    }
    if let Ok(view) = ctx.ledger.sweep_view(DISPATCHERS, 0).await {
        let live = view
            .members
            .iter()
            .filter(|m| m.expires_at > now || m.name == owner)
            .count()
            .max(1);
        ctx.flow.with_state(|state| state.share = 1.0 / live as f64);
    }
}

/// Reads the controls into `ctx.flow` once, and sets the gauges.
pub async fn refresh(ctx: &Context) {
    match ctx.ledger.flow_controls().await {
        Ok(controls) => {
            set_gauges(ctx, &controls);
            ctx.flow.install(controls);
        }
        Err(error) => {
            tracing::warn!(%error, "could not read the flow controls; keeping the last read")
        }
    }
}

fn set_gauges(ctx: &Context, controls: &[FlowControl]) {
    let metrics = &ctx.metrics.flow;
    for control in controls {
        metrics
            .paused
            .with_label_values(&[&control.name])
            .set(i64::from(control.paused.is_some()));
        let state = match control.breaker {
            Breaker::Closed => 0,
            Breaker::Open { .. } => 1,
            Breaker::HalfOpen { .. } => 2,
        };
        metrics
            .breaker_state
            .with_label_values(&[&control.name])
            .set(state);
    }
}
