//! `PoolActor`: hosts the pool's [`PoolMachine`] (readiness, planning
//! admission and policy), supervises the node actors of the candidates,
//! owns the pool's timer, publishes events, and starts a `RunActor` for
//! each committed run.
//!
//! The pool actor is where inputs and timers meet, so it fixes their order
//! (see [`PoolActor::applied_at`]). Every command is decided here, from the
//! core's state, with no round trip; only a change of a node that a
//! committed run requires waits for that run's answer (its [`RunStatus`]),
//! holding the mailbox meanwhile, so the pool knows at once whether the
//! run ended.

use std::sync::Arc;
use std::time::Duration;

use actix::fut::{self, ActorFuture, ActorFutureExt, WrapFuture};
use actix::{Actor, ActorContext, Addr, AsyncContext, AtomicResponse, Context, Handler};

use crate::clock::{Clock, TimerSlot};
use crate::error::GateError;
use crate::messages::{
    AbortPlanning, BeginPlanning, CommitPlan, ConfirmDue, DefinePool, FinishCommitted, FinishRun,
    FromNode, GetReport, NodeActorStopped, NodeChanged, PendingDeadline, RequiredNodeChanged,
    RunAnswer, RunStatus, TimerDue,
};
use crate::node_actor::NodeActor;
use crate::publisher::Publisher;
use crate::recording::{Held, Recording};
use crate::reservations::Reservations;
use crate::router::Router;
use crate::run_actor::RunActor;
use crate::settings::GateSettings;
use crate::store::{StateStore, StoreError};
use crate::telemetry::{self, BlockedGauges, IgnoredCounts};
mod commands;
mod restart;

use poolgate_core::{
    AdmittedCommit, Command, Durable, Epoch, Event, NodeChange, NodeDetail, NodeId, PoolMachine,
    Reason, Refusal, RunId, SlotKey, Time, Verdict,
};

/// The epoch an event held back by [`PoolActor::hold_untold`] tells.
fn untold_epoch(event: &Event) -> Option<Epoch> {
    match event {
        Event::PoolReady { epoch, .. } | Event::PlanningResumed { epoch, .. } => Some(*epoch),
        _ => None,
    }
}

/// The actor of the candidate pool.
#[derive(Debug)]
pub(crate) struct PoolActor {
    core: PoolMachine,
    clock: Clock,
    publisher: Publisher,
    router: Arc<Router>,
    timer: TimerSlot,
    /// The actor of the committed run, if any.
    run: Option<Addr<RunActor>>,
    out: Vec<Event>,
    blocked: BlockedGauges,
    /// When the pool last started forming (for `time_to_ready`).
    forming_since: Option<Time>,
    /// Inputs are applied at this instant or later (see `applied_at`).
    fired_through: Time,
    /// The latest instant an input was applied at.
    applied_through: Time,
    store: Option<Arc<dyn StateStore>>,
    /// The last epoch known to be in the store (`None` without a store).
    stored_epoch: Option<u64>,
    /// Events that tell an epoch not yet stored, held back until it is
    /// (see [`PoolActor::hold_untold`]).
    untold: Vec<Event>,
    /// Runs' outcomes whose write failed, held back until a write succeeds
    /// (see [`PoolActor::hold_unwritten_outcomes`]).
    unwritten: Vec<Event>,
    /// Whether the last write failed (its error is logged once).
    save_failing: bool,
    /// Until the first flush: its events are the start's (kept for the
    /// first subscriber).
    at_start: bool,
    recording: Option<Recording>,
    /// The fleet's reservations, when the pool is one of a fleet's (a
    /// node serves one committed run at a time across its pools).
    reservations: Option<Reservations>,
    /// Stopped for good ([`crate::messages::Shutdown`], or a restart
    /// given up): nothing runs, nothing is restarted.
    shut: bool,
    /// When the actor failed, within the last [`RESTART_PERIOD`].
    failures: Vec<Time>,
    /// A test's fault waiting for its moment (the restart, every handler,
    /// the next node change).
    #[cfg(any(test, feature = "testing"))]
    armed: Option<crate::messages::InjectPoolFault>,
}

/// How often a failed write of the durable state is tried again while an
/// epoch waits for it.
pub const SAVE_RETRY: Duration = Duration::from_secs(1);

impl PoolActor {
    /// Starts the pool actor, under a supervisor, and one node actor per
    /// candidate.
    pub(crate) fn launch(
        settings: GateSettings,
        clock: Clock,
        publisher: Publisher,
        router: Arc<Router>,
        reservations: Option<Reservations>,
        started: Option<Time>,
    ) -> Addr<PoolActor> {
        router
            .live
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        actix::Supervisor::start(move |ctx| {
            // A replayed pool starts at its recorded instant, the clock
            // being just before it.
            let now = started.map_or_else(|| clock.now(), |at| at.max(clock.now()));
            let (mut core, added) =
                PoolMachine::new(&settings.definition, settings.window, settings.policy, now);
            let mut out = Vec::new();
            let restored = settings.durable.as_ref().and_then(|durable| {
                core.restore(&durable.restored, durable.restore_grace, now, &mut out)
            });
            let restored_from = settings
                .durable
                .as_ref()
                .map(|durable| (durable.restored.clone(), durable.restore_grace));
            let mut actor = PoolActor {
                core,
                clock,
                publisher,
                router,
                timer: TimerSlot::default(),
                run: None,
                out,
                blocked: BlockedGauges::default(),
                forming_since: Some(now),
                fired_through: Time::ZERO,
                applied_through: now,
                stored_epoch: settings.durable.as_ref().map(|d| d.restored.last_epoch),
                store: settings.durable.map(|d| d.store),
                untold: Vec::new(),
                unwritten: Vec::new(),
                save_failing: false,
                at_start: true,
                recording: settings.record,
                reservations,
                shut: false,
                failures: Vec::new(),
                #[cfg(any(test, feature = "testing"))]
                armed: None,
            };
            if let Some(recording) = &actor.recording {
                recording.start(
                    now,
                    settings.window,
                    settings.policy,
                    &settings.definition,
                    restored_from.as_ref().map(|(d, grace)| (d, *grace)),
                );
            }
            if let Some(guard) = restored {
                if let Some(reservations) = &actor.reservations {
                    let pool = actor.core.readiness().id().clone();
                    let required: Vec<NodeId> = guard.required().cloned().collect();
                    if let Err(refused) = reservations.take(&pool, guard.run(), &required) {
                        telemetry::said!(error, %pool, run = %guard.run(), %refused, "a restored committed run shares a node with another pool's");
                    }
                }
                actor.run = Some(RunActor::new(guard, Arc::clone(&actor.router.live)).start());
            }
            for (node, key) in added {
                actor.start_node(ctx, node, key);
            }
            actor.recount_blocked();
            // A planning run aborted by the restart is over: stored so. Its
            // event goes out when the actor starts, once the handle's
            // caller could subscribe.
            let _ = actor.save();
            actor
        })
    }

    /// Writes the durable state (epochs, active run), if there is a store.
    fn save(&mut self) -> Result<(), StoreError> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let state = self.state_to_write();
        let result = store.save(&state);
        self.saved(&state, &result);
        result
    }

    /// Writes the durable state off the actors' thread (a redb commit ends
    /// with an fsync), then runs `then` with the outcome; the pool handles
    /// nothing else meanwhile, so writes and what follows them keep their
    /// order. Without a store, `then` runs at once.
    fn save_then(
        &mut self,
        ctx: &mut Context<Self>,
        then: impl FnOnce(&mut Self, &mut Context<Self>, Result<(), StoreError>) + 'static,
    ) {
        let state = self.state_to_write();
        self.write_then(ctx, state, then);
    }

    /// The durable state to write now, whether or not it changed (a retry
    /// after a failed write), handed out as the core's change.
    fn state_to_write(&mut self) -> Durable {
        self.core
            .take_durable_change()
            .unwrap_or_else(|| self.core.durable())
    }

    /// As [`PoolActor::save_then`], writing `state`.
    fn write_then(
        &mut self,
        ctx: &mut Context<Self>,
        state: Durable,
        then: impl FnOnce(&mut Self, &mut Context<Self>, Result<(), StoreError>) + 'static,
    ) {
        if self.store.is_none() {
            return then(self, ctx, Ok(()));
        }
        ctx.wait(self.write(Some(state)).map(move |result, act, ctx| {
            act.contained(ctx, |act, ctx| {
                let stored = result.is_ok();
                then(act, ctx, result);
                if stored && act.has_released() {
                    // Epochs held back for an earlier failed write are
                    // stored now: told at once, not at the next input.
                    act.flush(ctx);
                }
            });
        }));
    }

    /// Writes `state` off the actors' thread and notes the outcome (see
    /// [`PoolActor::saved`]); nothing to write without a store or a state.
    fn write(
        &mut self,
        state: Option<Durable>,
    ) -> impl ActorFuture<Self, Output = Result<(), StoreError>> {
        let wanted = state.is_some();
        actix::fut::ready(()).then(move |(), act: &mut Self, _| {
            // The state as it is when the write starts (at least what was
            // asked for: the core only moves on): one that waited behind
            // another write (a commit's) never puts an older state back.
            let state = wanted.then(|| act.core.durable());
            let job = act.store.clone().zip(state.clone());
            async move {
                match job {
                    Some((store, written)) => {
                        tokio::task::spawn_blocking(move || store.save(&written))
                            .await
                            .unwrap_or_else(|e| Err(StoreError(e.to_string())))
                    }
                    None => Ok(()),
                }
            }
            .into_actor(act)
            .map(move |result, act, _| {
                if let (Some(state), true) = (&state, act.store.is_some()) {
                    act.saved(state, &result);
                }
                result
            })
        })
    }

    /// Notes the outcome of a write of `state`.
    fn saved(&mut self, state: &Durable, result: &Result<(), StoreError>) {
        self.publisher.note_written(result.is_ok());
        match result {
            Ok(()) => {
                self.stored_epoch = Some(state.last_epoch);
                if std::mem::take(&mut self.save_failing) {
                    telemetry::said!(
                        warn,
                        last_epoch = state.last_epoch,
                        "durable state written again"
                    );
                }
            }
            Err(e) => {
                telemetry::guarded(|| {
                    metrics::counter!("poolgate_state_write_errors_total").increment(1)
                });
                if self.publisher.is_closed() {
                    // Fenced or stopped (a deposed leader): its writes are
                    // refused as they should be; nothing is wrong here.
                    self.save_failing = true;
                    telemetry::said!(debug, error = %e, "durable state not written: the gate no longer acts (stopped, or fenced: another replica leads)");
                } else if std::mem::replace(&mut self.save_failing, true) {
                    telemetry::said!(debug, error = %e, "durable state not written (again)");
                } else {
                    telemetry::said!(error, error = %e, "durable state not written; a new epoch is not told until it is (tried again every {SAVE_RETRY:?})");
                }
            }
        }
    }

    /// Holds back, from the events about to go out, those that tell an
    /// epoch the store does not hold yet (`pool_ready`, `planning_resumed`):
    /// an epoch told and then issued again after a restart would let the
    /// first life's proof pass in the second. The end of such an epoch
    /// (`readiness_lost`) is not told either, with what it ends. The held
    /// events go out once a write succeeds ([`SAVE_RETRY`]).
    fn hold_untold(&mut self) {
        let Some(stored) = self.stored_epoch else {
            return;
        };
        let mut told = Vec::with_capacity(self.out.len());
        for event in self.out.drain(..) {
            match &event {
                Event::PoolReady { epoch, .. } | Event::PlanningResumed { epoch, .. }
                    if epoch.0 > stored =>
                {
                    self.untold.push(event)
                }
                Event::ReadinessLost { epoch, .. } if epoch.0 > stored => {
                    let ended = *epoch;
                    self.untold.retain(|held| untold_epoch(held) != Some(ended));
                }
                _ => told.push(event),
            }
        }
        self.out = told;
    }

    /// Holds back, from the events about to go out after a failed write,
    /// the runs' outcomes (`run_faulted`, `run_finished`,
    /// `planning_aborted`): an outcome is written before it is told, so a
    /// gate that cannot write (a replica cut off from etcd) tells none.
    /// They go out, in order, once a write succeeds.
    fn hold_unwritten_outcomes(&mut self) {
        let (outcomes, rest): (Vec<Event>, Vec<Event>) =
            std::mem::take(&mut self.out).into_iter().partition(|e| {
                matches!(
                    e,
                    Event::RunFaulted { .. }
                        | Event::RunFinished { .. }
                        | Event::PlanningAborted { .. }
                )
            });
        self.unwritten.extend(outcomes);
        self.out = rest;
    }

    /// Whether events held back are now stored (a later write, whatever
    /// made it, stored their epoch or the runs' outcomes).
    fn has_released(&self) -> bool {
        !self.save_failing && !self.unwritten.is_empty()
            || self.untold.iter().any(|e| self.is_stored(e))
    }

    /// Whether the epoch `event` tells is in the store.
    fn is_stored(&self, event: &Event) -> bool {
        let stored = self.stored_epoch.unwrap_or(0);
        untold_epoch(event).is_some_and(|epoch| epoch.0 <= stored)
    }

    /// Puts the events held back whose epoch is stored now ahead of what
    /// goes out (they happened first); a `pool_ready` is ready for
    /// planning from now on, not from when it was held.
    fn release_stored(&mut self) {
        if !self.has_released() {
            return;
        }
        if !self.save_failing {
            // The last write succeeded: it stored every outcome held.
            let written = std::mem::take(&mut self.unwritten);
            self.out.splice(0..0, written);
        }
        let now = self.clock.now();
        let (mut due, held): (Vec<Event>, Vec<Event>) = std::mem::take(&mut self.untold)
            .into_iter()
            .partition(|e| self.is_stored(e));
        self.untold = held;
        for event in &mut due {
            if let Event::PoolReady { at, .. } = event {
                *at = now;
            }
        }
        self.out.splice(0..0, due);
    }

    fn start_node(&mut self, ctx: &mut Context<Self>, node: NodeId, key: SlotKey) {
        let addr = NodeActor::new(
            node.clone(),
            key,
            ctx.address().recipient(),
            Arc::clone(&self.router.ignored),
            Arc::clone(&self.router.live),
        )
        .start();
        self.router.insert(node, addr);
    }

    fn recount_blocked(&mut self) {
        let candidates = self.core.readiness().candidates();
        self.blocked
            .recount(candidates.into_iter().map(|c| c.verdict));
    }

    /// The instant an input is applied at: its stamp, or later if the
    /// pool's clock reads later (the input waited in a mailbox) or a timer
    /// already fired at its stamp.
    ///
    /// The pool is where inputs and timers meet, so this is where their
    /// order is fixed. Inputs stamped `T` come before timers due at `T`
    /// (design §2); an input that reaches the pool after a timer due at `T`
    /// fired is therefore applied at `T + 1 ms` at the earliest. The clock
    /// reads whole milliseconds, so the applied instants, recorded, replay
    /// to the same events.
    fn applied_at(&mut self, stamp: Time) -> Time {
        self.applied_through = stamp.max(self.clock.now()).max(self.fired_through);
        self.applied_through
    }

    /// The instant an observation a fleet handed to every pool that has
    /// its node is applied at: its stamp, whenever it arrives, unless a
    /// timer fired or an input was applied after it here (then as
    /// [`PoolActor::applied_at`] would). Every pool thus applies it at the
    /// same instant, and a fleet's recording, which writes it once,
    /// replays it to each as it was.
    fn fleet_applied_at(&mut self, stamp: Time) -> Time {
        self.applied_through = stamp.max(self.fired_through).max(self.applied_through);
        self.applied_through
    }

    /// Publishes what the core produced and re-arms the timer for the
    /// core's next deadline.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        for event in &self.out {
            match event {
                Event::PoolReady { at, .. } => {
                    if let Some(since) = self.forming_since.take() {
                        telemetry::time_to_ready((*at - since).as_secs_f64());
                    }
                }
                Event::ReadinessLost { at, .. } => {
                    self.forming_since.get_or_insert(*at);
                }
                _ => {}
            }
        }
        // What the core says must be stored is, before its events are
        // told; a failed write is logged and counted, and a new epoch
        // waits for the next write that succeeds.
        if self.store.is_some() {
            if let Some(state) = self.core.take_durable_change() {
                let held = std::mem::take(&mut self.out);
                self.write_then(ctx, state, move |act, ctx, _| {
                    act.out.splice(0..0, held);
                    act.publish_out(ctx);
                });
                return;
            }
        }
        self.publish_out(ctx);
    }

    /// The rest of [`PoolActor::flush`], once what must be stored is.
    fn publish_out(&mut self, ctx: &mut Context<Self>) {
        self.release_stored();
        if self.save_failing {
            self.hold_unwritten_outcomes();
        }
        self.hold_untold();
        if let (Some(recording), false) = (&self.recording, self.out.is_empty()) {
            recording.flush();
        }
        if std::mem::take(&mut self.at_start) {
            self.publisher.publish_start(&mut self.out);
        } else {
            self.publisher.publish(&mut self.out);
        }
        self.timer
            .rearm(ctx, &self.clock, self.core.deadline(), |generation| {
                TimerDue { generation }
            });
        if let Some((run, at)) = self.core.take_confirm_due() {
            self.tell_run(ctx, run, ConfirmDue { at });
        }
    }

    /// Sends the committed run a message it answers with its status; the
    /// pool waits for the answer before it handles anything else, forgets
    /// the run if it ended, and tells what the run produced once that is
    /// stored ([`PoolActor::flush`]).
    fn tell_run<M>(&mut self, ctx: &mut Context<Self>, run: RunId, message: M)
    where
        M: actix::Message<Result = RunAnswer> + Send + 'static,
        RunActor: Handler<M>,
    {
        let Some(addr) = self.run.clone() else {
            // No actor guards it (it failed before it could): the run
            // faults `internal`, never dropped.
            let events = self.run_actor_lost(&run);
            self.run_answered(&run, true, events);
            self.flush(ctx);
            return;
        };
        let answer = addr.send(message);
        ctx.wait(answer.into_actor(self).map(move |answer, act, ctx| {
            act.contained(ctx, |act, ctx| {
                // The run's actor stops only once it answered that its run
                // ended: a closed mailbox is its failure (a panic in it, or
                // in what it calls), and the run is faulted `internal`.
                let (status, events) = match answer {
                    Ok(RunAnswer { status, events }) => (status, events),
                    Err(_) => (RunStatus::Ended, act.run_actor_lost(&run)),
                };
                act.run_answered(&run, status == RunStatus::Ended, events);
                act.flush(ctx);
            });
        }));
    }

    /// The committed run's actor is gone without having answered that its
    /// run ended: the run's guard went with it, so the run faults with
    /// reason `internal` (the gate's failure), never dropped in silence.
    fn run_actor_lost(&mut self, run: &RunId) -> Vec<Event> {
        let Some((committed, node)) = self.core.committed_run() else {
            return Vec::new();
        };
        if committed != run {
            return Vec::new();
        }
        let node = node.clone();
        telemetry::actor_restarted("run");
        telemetry::said!(error, %run, "run actor failed: its run faults (reason internal)");
        vec![Event::RunFaulted {
            at: self.applied_at(self.clock.now()),
            pool: self.core.readiness().id().clone(),
            run: run.clone(),
            node,
            reason: poolgate_core::Reason::Internal,
        }]
    }

    /// Takes what the committed run answered: its events go out with the
    /// next flush, and a run that ended is forgotten.
    fn run_answered(&mut self, run: &RunId, ended: bool, events: Vec<Event>) {
        for event in &events {
            if let Event::RunFaulted { reason, .. } = event {
                telemetry::run_faulted(*reason);
            }
        }
        self.out.extend(events);
        if ended {
            self.core.run_ended(run);
            self.run = None;
            self.release(run);
        }
    }

    /// Settles the core up to `at` and publishes what fell due.
    fn settle(&mut self, at: Time, ctx: &mut Context<Self>) {
        self.core.settle_before(at, &mut self.out);
        self.flush(ctx);
    }

    /// Counts a window restart if the last view change made one.
    fn count_window_restart(&self) {
        let last = self.core.readiness().last_change();
        if last.restarted_window {
            telemetry::window_restart(last.reason);
        }
    }

    /// A change of a node that the committed run requires goes to the run;
    /// the pool waits for its answer before it handles anything else.
    fn tell_committed_run(
        &mut self,
        ctx: &mut Context<Self>,
        at: Time,
        node: NodeId,
        change: NodeChange,
    ) {
        let Some(run) = self.core.committed_run_requiring(&node).cloned() else {
            return;
        };
        self.tell_run(ctx, run, RequiredNodeChanged { at, node, change });
    }
}

/// Counted out when the actor itself goes (its supervisor ends once no
/// handle holds its address), not at each restart.
impl Drop for PoolActor {
    fn drop(&mut self) {
        self.router
            .live
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        if self.shut {
            return;
        }
        if std::thread::panicking() {
            // Gone in a panic the actor could not contain (in its
            // restart): its task ended, and its supervisor with it.
            self.wind_down(true);
        } else {
            // Gone with its System (ended, or its runtime dropped): not a
            // failure, but the gate cannot go on all the same.
            self.shut = true;
            self.publisher.close();
        }
    }
}

impl Actor for PoolActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.shut {
            return; // stopped for good: nothing runs
        }
        if tokio::runtime::Handle::try_current().is_err() {
            // Started (or restarted by its supervisor) while its System is
            // being dropped: no timer can be set, and nothing is left to
            // do (CI: the restarts property test panicked in actix here,
            // "there is no reactor running").
            return ctx.stop();
        }
        self.keep_recording_flushed(ctx);
        // A write that failed (an epoch, a run's end) is tried again until
        // it succeeds; then what waited for it is told.
        if self.store.is_some() {
            ctx.run_interval(SAVE_RETRY, |act, ctx| {
                if act.save_failing {
                    // A write that succeeds releases what it stored.
                    act.contained(ctx, |act, ctx| act.save_then(ctx, |_, _, _| {}));
                }
            });
        }
        self.contained(ctx, |act, ctx| act.flush(ctx));
    }
}

/// How often a recording's buffered lines are written out when nothing
/// else writes them (a crash of an idle gate loses no more than this).
pub const RECORDING_FLUSH: Duration = Duration::from_secs(1);

impl PoolActor {
    fn keep_recording_flushed(&self, ctx: &mut Context<Self>) {
        if self.recording.is_some() {
            ctx.run_interval(RECORDING_FLUSH, |act, ctx| {
                act.contained(ctx, |act, _| {
                    if let Some(recording) = &act.recording {
                        recording.flush();
                    }
                });
            });
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl Handler<crate::messages::InjectPoolFault> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: crate::messages::InjectPoolFault, ctx: &mut Context<Self>) {
        use crate::messages::InjectPoolFault;
        self.contained(ctx, |act, _| match msg {
            InjectPoolFault::PanicRunActor => {
                if let Some(run) = &act.run {
                    run.do_send(crate::messages::InjectFault::Panic);
                }
            }
            InjectPoolFault::PanicOnNextChange => act.armed = Some(msg),
            InjectPoolFault::Panic => panic!("injected pool actor fault"),
            InjectPoolFault::PanicAndFailRestart | InjectPoolFault::PanicAlways => {
                act.armed = Some(msg);
                panic!("injected pool actor fault")
            }
        });
    }
}

impl Handler<crate::messages::Shutdown> for PoolActor {
    type Result = ();

    /// The gate stopped for good: every node actor and the run actor are
    /// stopped, the store and the recording let go, and the actor's own
    /// context stops (its supervisor keeps an idle one while a handle
    /// holds the address; the last handle dropped ends it).
    fn handle(&mut self, _msg: crate::messages::Shutdown, ctx: &mut Context<Self>) {
        if self.shut {
            return;
        }
        self.wind_down(false);
        ctx.stop();
    }
}

impl Handler<FromNode> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: FromNode, ctx: &mut Context<Self>) {
        if self.shut {
            return;
        }
        self.contained(ctx, |act, ctx| match msg {
            FromNode::Changed(change) => act.node_changed(change, ctx),
            FromNode::Stopped(stopped) => act.node_actor_stopped(stopped, ctx),
        });
    }
}

impl PoolActor {
    /// A node actor stopped: the actor of a current candidate is replaced.
    fn node_actor_stopped(&mut self, msg: NodeActorStopped, ctx: &mut Context<Self>) {
        // Only the actor of a current candidate is replaced.
        let Some(before) = self.core.readiness().verdict_of(msg.key) else {
            return;
        };
        if self
            .router
            .route(&msg.node)
            .is_some_and(|addr| addr.connected())
        {
            return;
        }
        telemetry::actor_restarted("node");
        self.start_node(ctx, msg.node.clone(), msg.key);
        if before == Verdict::NOTHING_KNOWN {
            return;
        }
        // The facts died with the actor: the node is not ready until it
        // reports again, and a run that requires it faults. The failure is
        // the gate's own, not the node's.
        let change = NodeChange {
            reason: Reason::Internal,
            before,
            after: Verdict::NOTHING_KNOWN,
            fingerprint: None,
        };
        let at = self.clock.now();
        let change = NodeChanged {
            key: msg.key,
            node: msg.node,
            at,
            change,
            detail: NodeDetail::default(),
            observation: None,
            fanout: crate::messages::Fanout::Own,
        };
        self.node_changed(change, ctx);
    }

    /// A node actor reports a change of its node's view.
    fn node_changed(&mut self, msg: NodeChanged, ctx: &mut Context<Self>) {
        #[cfg(any(test, feature = "testing"))]
        if let Some(crate::messages::InjectPoolFault::PanicOnNextChange) = self.armed {
            self.armed = None;
            panic!("injected pool actor fault on a change");
        }
        let at = match msg.fanout {
            crate::messages::Fanout::Fleet(_) => self.fleet_applied_at(msg.at),
            crate::messages::Fanout::Own => self.applied_at(msg.at),
        };
        let pool = self.core.readiness().id();
        telemetry::said!(debug, %pool, node = %msg.node, reason = %msg.change.reason, ready = msg.change.after.is_ready(), "view change");
        let NodeChanged {
            key,
            node,
            change,
            detail,
            observation,
            fanout,
            ..
        } = msg;
        let before = self.core.node_changed(key, at, &change, &mut self.out);
        self.core.set_detail(key, detail);
        // Nothing more for a node actor of an earlier pool definition.
        let Some(before) = before else {
            return;
        };
        if let (Some(recording), Some(observation)) = (&self.recording, &observation) {
            recording.observation(at, node.as_str(), observation, fanout);
        }
        self.count_window_restart();
        self.blocked.changed(before, change.after);
        self.flush(ctx);
        self.tell_committed_run(ctx, at, node, change);
    }
}

impl Handler<TimerDue> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: TimerDue, ctx: &mut Context<Self>) {
        self.contained(ctx, |act, ctx| act.timer_due(msg, ctx));
    }
}

impl PoolActor {
    fn timer_due(&mut self, msg: TimerDue, ctx: &mut Context<Self>) {
        let Some(at) = self.timer.fired(msg.generation) else {
            return;
        };
        let due = self.core.deadline().filter(|deadline| *deadline <= at);
        self.core.on_deadline(at, &mut self.out);
        if let Some(deadline) = due {
            // Inputs reaching the pool from now on come after it.
            self.fired_through = self.fired_through.max(deadline + Duration::from_millis(1));
        }
        self.flush(ctx);
    }
}

impl Handler<DefinePool> for PoolActor {
    type Result = Result<(), GateError>;

    fn handle(&mut self, msg: DefinePool, ctx: &mut Context<Self>) -> Result<(), GateError> {
        self.contained(ctx, |act, ctx| act.define(msg, ctx))
            .unwrap_or(Err(GateError::Internal))
    }
}

impl PoolActor {
    fn define(&mut self, msg: DefinePool, ctx: &mut Context<Self>) -> Result<(), GateError> {
        let at = self.applied_at(msg.at);
        self.settle(at, ctx);
        let result = self.core.define(&msg.definition, at, &mut self.out);
        if let (Ok(_), Some(recording)) = (&result, &self.recording) {
            recording.command(at, &Command::DefinePool(msg.definition.clone()));
        }
        if let Ok(change) = &result {
            self.count_window_restart();
            for (node, _) in &change.removed {
                // Dropping the router's address stops the node actor once
                // its mailbox is empty; a late change of it is ignored by
                // slot generation.
                self.router.remove(node);
            }
            for (node, key) in change.added.clone() {
                self.start_node(ctx, node, key);
            }
            self.recount_blocked();
        }
        self.flush(ctx);
        Ok(result.map(drop)?)
    }
}

impl Handler<GetReport> for PoolActor {
    type Result = Result<poolgate_core::PoolReport, GateError>;

    fn handle(&mut self, msg: GetReport, ctx: &mut Context<Self>) -> Self::Result {
        self.contained(ctx, |act, ctx| {
            let at = act.applied_at(msg.at);
            act.settle(at, ctx);
            let ignored = &act.router.ignored;
            act.core.report(
                IgnoredCounts::read(&ignored.stale),
                IgnoredCounts::read(&ignored.non_candidate),
            )
        })
        .ok_or(GateError::Internal)
    }
}

impl Handler<crate::router::ReplaceNode> for PoolActor {
    type Result = Option<Addr<NodeActor>>;

    fn handle(&mut self, msg: crate::router::ReplaceNode, ctx: &mut Context<Self>) -> Self::Result {
        if self.shut {
            return None;
        }
        self.contained(ctx, |act, ctx| {
            let key = act.core.readiness().key_of(&msg.node)?;
            // What `node_actor_stopped` does when the actor's end is told
            // (it may still be on its way); done once either way.
            act.node_actor_stopped(
                NodeActorStopped {
                    key,
                    node: msg.node.clone(),
                },
                ctx,
            );
            act.router.route(&msg.node)
        })
        .flatten()
    }
}

impl Handler<PendingDeadline> for PoolActor {
    type Result = Result<Option<Time>, GateError>;

    fn handle(&mut self, msg: PendingDeadline, ctx: &mut Context<Self>) -> Self::Result {
        self.contained(ctx, |act, ctx| {
            let at = act.applied_at(msg.at);
            act.settle(at, ctx);
            act.core.deadline()
        })
        .ok_or(GateError::Internal)
    }
}
