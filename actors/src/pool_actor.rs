//! `PoolActor`: supervises the node actors of the candidate pool, aggregates
//! their verdicts in [`PoolReadiness`], owns the convergence timer, publishes
//! events, and hands pool news to the active run's `RunActor`.
//!
//! Commands (define, begin, commit, finish) are answered in order with the
//! inputs: each first settles the core at its instant, and where the active
//! run's state matters it asks the run actor before answering, holding its
//! own mailbox meanwhile (`AtomicResponse`), so the answer does not depend
//! on message timing.

use std::sync::Arc;
use std::time::Duration;

use actix::fut::{self, ActorFutureExt, WrapFuture};
use actix::ActorContext;
use actix::{
    Actor, Addr, AsyncContext, AtomicResponse, Context, Handler, Message, MessageResponse,
};

use crate::core::Reason;
use crate::core::{
    CandidateSummary, Epoch, Event, LastChange, NodeChange, NodeDetail, NodeId, PlanningPolicy,
    PoolDefinition, PoolId, PoolPhase, PoolReadiness, RunError, RunId, SlotKey, Time, Verdict,
};
use crate::node_actor::{NodeActor, Resync};
use crate::run_actor::{Commit, Finish, News, PoolNews, QueryRun, RunActor, RunSnapshot};
use crate::telemetry::{self, BlockedGauges};
use crate::wiring::{Clock, IgnoredCounts, Publisher, Router, TimerSlot};

/// What the pool actor needs to start.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    /// The first candidate pool.
    pub definition: PoolDefinition,
    /// How long the view must hold still before `PoolReady`.
    pub window: Duration,
    /// What planning does when readiness is lost.
    pub policy: PlanningPolicy,
}

/// A node actor reports a change of its node's view.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct NodeChanged {
    /// The candidate's slot, as given to the node actor.
    pub key: SlotKey,
    /// The candidate.
    pub node: NodeId,
    /// When the observation that changed it entered the gate.
    pub at: Time,
    /// The change.
    pub change: NodeChange,
    /// The node's SWIM state and fault reason after it, for reports.
    pub detail: NodeDetail,
}

/// A node actor stopped (failed, or dropped after a redefinition).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct NodeActorStopped {
    /// Its slot.
    pub key: SlotKey,
    /// Its node.
    pub node: NodeId,
}

/// Failures a test can inject into the pool actor.
#[cfg(any(test, feature = "fault-injection"))]
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub enum InjectPoolFault {
    /// Panic inside a handler, where the core is called.
    Panic,
}

/// The convergence timer armed for `at` fired.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ConvergenceDue {
    pub(crate) generation: u64,
}

/// The active run's wait deadline is due: settle the pool up to `at` first,
/// so a `PoolReady` at the same instant reaches the run before the timeout.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct WaitDeadlineDue {
    /// The run whose deadline it is.
    pub run: RunId,
    /// The deadline.
    pub at: Time,
}

/// A run actor ended its run (aborted, faulted or finished).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct RunEnded {
    /// The run that ended.
    pub run: RunId,
}

/// The orchestrator replaces the candidate pool (SPEC §2).
#[derive(Message, Debug)]
#[rtype(result = "Result<(), RunError>")]
pub struct DefinePool {
    /// When.
    pub at: Time,
    /// The new pool.
    pub definition: PoolDefinition,
}

/// Begin planning a run on the ready pool (SPEC §3).
#[derive(Message, Debug)]
#[rtype(result = "Result<Epoch, RunError>")]
pub struct BeginPlanning {
    /// When.
    pub at: Time,
    /// The run.
    pub run: RunId,
    /// Proof of the epoch the caller saw ready, if it has one.
    pub epoch: Option<Epoch>,
}

/// Commit a run's plan: provisioning begins (SPEC §3).
#[derive(Message, Debug)]
#[rtype(result = "Result<(), RunError>")]
pub struct CommitPlan {
    /// When.
    pub at: Time,
    /// The run.
    pub run: RunId,
    /// The nodes the plan requires.
    pub required: Vec<NodeId>,
    /// The epoch the plan was made on, if the caller gives one.
    pub epoch: Option<Epoch>,
}

/// End a committed run.
#[derive(Message, Debug)]
#[rtype(result = "Result<(), RunError>")]
pub struct FinishRun {
    /// When.
    pub at: Time,
    /// The run.
    pub run: RunId,
}

/// Ask where the pool stands.
#[derive(Message, Debug)]
#[rtype(result = "PoolReport")]
pub struct GetReport {
    /// As of when.
    pub at: Time,
}

/// Ask for the earliest timer the pool or its run has pending.
#[derive(Message, Debug)]
#[rtype(result = "Option<Time>")]
pub struct PendingDeadline {
    /// As of when.
    pub at: Time,
}

/// Where the pool stands, and why.
#[derive(Clone, Debug, MessageResponse)]
pub struct PoolReport {
    /// The pool.
    pub pool: PoolId,
    /// Forming, converging (with deadline) or ready (with epoch).
    pub phase: PoolPhase,
    /// Every candidate, sorted by id: ready or what blocks it, and since
    /// when.
    pub candidates: Vec<CandidateSummary>,
    /// The last view change (the start of the current window).
    pub last_change: LastChange,
    /// The active run, if any.
    pub run: Option<RunId>,
    /// SWIM observations ignored as stale.
    pub ignored_stale: u64,
    /// Observations ignored because the node is not a candidate.
    pub ignored_non_candidate: u64,
}

#[derive(Debug)]
struct ActiveRun {
    id: RunId,
    addr: Addr<RunActor>,
}

/// The actor of the candidate pool.
#[derive(Debug)]
pub struct PoolActor {
    core: PoolReadiness,
    policy: PlanningPolicy,
    clock: Clock,
    publisher: Publisher,
    router: Arc<Router>,
    timer: TimerSlot,
    run: Option<ActiveRun>,
    out: Vec<Event>,
    blocked: BlockedGauges,
    /// When the pool last started forming (for `time_to_ready`).
    forming_since: Option<Time>,
    /// Inputs are applied at this instant or later (see `applied_at`).
    fired_through: Time,
}

impl PoolActor {
    /// Starts the pool actor and one node actor per candidate.
    pub fn launch(
        settings: PoolSettings,
        clock: Clock,
        publisher: Publisher,
        router: Arc<Router>,
    ) -> Addr<PoolActor> {
        actix::Supervisor::start(move |ctx| {
            let (core, added) =
                PoolReadiness::new(&settings.definition, settings.window, clock.now());
            let mut actor = PoolActor {
                core,
                policy: settings.policy,
                clock,
                publisher,
                router,
                timer: TimerSlot::default(),
                run: None,
                out: Vec::new(),
                blocked: BlockedGauges::default(),
                forming_since: Some(clock.now()),
                fired_through: Time::ZERO,
            };
            actor.start_nodes(ctx, added);
            actor.recount_blocked();
            actor
        })
    }

    fn recount_blocked(&mut self) {
        let verdicts = self.core.candidates().into_iter().map(|c| c.verdict);
        self.blocked.recount(verdicts);
    }

    fn start_nodes(&mut self, ctx: &mut Context<Self>, added: Vec<(NodeId, SlotKey)>) {
        for (node, key) in added {
            let addr =
                NodeActor::new(node.clone(), key, ctx.address(), Arc::clone(&self.router)).start();
            self.router.insert(node, addr);
        }
    }

    /// Publishes what the core produced, hands pool news to the active run,
    /// and re-arms the convergence timer for the core's next deadline.
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
        if let Some(run) = &self.run {
            for event in &self.out {
                let news = match event {
                    Event::PoolReady { epoch, .. } => News::PoolReady { epoch: *epoch },
                    Event::ReadinessLost { .. } => News::ReadinessLost,
                    _ => continue,
                };
                // A run actor that already stopped has ended its run; the
                // news no longer concerns it.
                run.addr.do_send(PoolNews {
                    at: event.at(),
                    news,
                });
            }
        }
        self.publisher.publish(&mut self.out);
        self.timer
            .rearm(ctx, &self.clock, self.core.deadline(), |generation| {
                ConvergenceDue { generation }
            });
    }

    /// Runs `step` on the core; a panic in it stops the actor, and its
    /// supervisor restarts it (see `Supervised::restarting`).
    fn guarded(
        &mut self,
        ctx: &mut Context<Self>,
        step: impl FnOnce(&mut PoolReadiness, &mut Vec<Event>),
    ) -> bool {
        let (core, out) = (&mut self.core, &mut self.out);
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| step(core, out))) {
            Ok(()) => true,
            Err(_) => {
                tracing::error!(pool = %self.core.id(), "pool actor failed; restarting it");
                ctx.stop();
                false
            }
        }
    }

    /// The instant an input is applied at: its stamp, or later if the
    /// pool's clock reads later (the input waited in a mailbox) or a timer
    /// already fired at its stamp.
    ///
    /// The pool is where inputs and timers meet, so this is where their
    /// order is fixed. Inputs stamped `T` come before timers due at `T`
    /// (SPEC §2); an input that reaches the pool after a timer due at `T`
    /// fired is therefore applied at `T + 1 ms` at the earliest. The clock
    /// reads whole milliseconds, so the applied instants, recorded, replay
    /// to the same events.
    fn applied_at(&self, stamp: Time) -> Time {
        stamp.max(self.clock.now()).max(self.fired_through)
    }

    /// A timer due at `at` fired: later inputs are applied after it.
    fn timer_fired(&mut self, at: Time) {
        self.fired_through = self.fired_through.max(at + Duration::from_millis(1));
    }

    fn settle(&mut self, at: Time, ctx: &mut Context<Self>) {
        self.core.settle_before(at, &mut self.out);
        self.flush(ctx);
    }

    /// Asks the active run where it stands at `at` (settling it first), then
    /// runs `then` with the answer; `None` when no run is active.
    fn with_active_run<R, F>(&mut self, at: Time, then: F) -> AtomicResponse<Self, R>
    where
        R: 'static,
        F: FnOnce(&mut Self, &mut Context<Self>, Option<RunSnapshot>) -> R + 'static,
    {
        let query = self.run.as_ref().map(|run| run.addr.send(QueryRun { at }));
        let answer = async move {
            match query {
                // A closed mailbox means the run actor stopped: its run ended.
                Some(query) => query.await.ok().flatten(),
                None => None,
            }
        };
        AtomicResponse::new(Box::pin(answer.into_actor(self).map(
            move |snapshot, act: &mut Self, ctx| {
                if snapshot.is_none() {
                    act.run = None;
                }
                let result = then(act, ctx, snapshot);
                act.flush(ctx);
                result
            },
        )))
    }

    fn active_run(&self, run: &RunId) -> Option<Addr<RunActor>> {
        self.run
            .as_ref()
            .filter(|active| &active.id == run)
            .map(|active| active.addr.clone())
    }

    fn pool_check(&self, required: &[NodeId], given: Option<Epoch>) -> Result<Epoch, RunError> {
        let epoch = self.current_epoch(given)?;
        if let Some(node) = required.iter().find(|n| !self.core.is_candidate(n)) {
            return Err(RunError::NotCandidate(node.clone()));
        }
        Ok(epoch)
    }

    fn current_epoch(&self, given: Option<Epoch>) -> Result<Epoch, RunError> {
        let epoch = self.core.ready_epoch().ok_or(RunError::PoolNotReady)?;
        match given {
            Some(given) if given != epoch => Err(RunError::StaleEpoch {
                given,
                current: Some(epoch),
            }),
            _ => Ok(epoch),
        }
    }

    /// Forwards a run command and forgets the run if it turns out to have
    /// ended.
    fn forward_to_run<M>(
        &mut self,
        run: RunId,
        addr: Addr<RunActor>,
        message: M,
        ends_run: bool,
    ) -> AtomicResponse<Self, Result<(), RunError>>
    where
        M: Message<Result = Result<(), RunError>> + Send + 'static,
        RunActor: Handler<M>,
    {
        let request = addr.send(message);
        let ended_run = run.clone();
        let answer = async move {
            request
                .await
                .unwrap_or(Err(RunError::UnknownRun(ended_run)))
        };
        AtomicResponse::new(Box::pin(answer.into_actor(self).map(
            move |result, act: &mut Self, _ctx| {
                let ended = match &result {
                    Ok(()) => ends_run,
                    Err(RunError::UnknownRun(_)) => true,
                    Err(_) => false,
                };
                if ended && act.active_run(&run).is_some() {
                    act.run = None;
                }
                result
            },
        )))
    }
}

impl Actor for PoolActor {
    type Context = Context<Self>;
}

impl actix::Supervised for PoolActor {
    /// After a failure readiness starts over: every summary is forgotten, a
    /// fresh window is needed, the epoch keeps rising, and each node actor
    /// reports its facts again.
    fn restarting(&mut self, ctx: &mut Context<Self>) {
        // The old timers died with the old context.
        self.timer = TimerSlot::default();
        self.out.clear();
        let now = self.clock.now();
        self.core.restart(now, &mut self.out);
        self.recount_blocked();
        for candidate in self.core.candidates() {
            if let Some(addr) = self.router.route(&candidate.node) {
                addr.do_send(Resync { at: now });
            }
        }
        self.flush(ctx);
    }
}

#[cfg(any(test, feature = "fault-injection"))]
impl Handler<InjectPoolFault> for PoolActor {
    type Result = ();

    fn handle(&mut self, _msg: InjectPoolFault, ctx: &mut Context<Self>) {
        self.guarded(ctx, |_, _| panic!("injected pool actor fault"));
    }
}

impl Handler<NodeActorStopped> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: NodeActorStopped, ctx: &mut Context<Self>) {
        // Only the actor of a current candidate is replaced.
        let Some(before) = self.core.verdict_of(msg.key) else {
            return;
        };
        if self
            .router
            .route(&msg.node)
            .is_some_and(|addr| addr.connected())
        {
            return;
        }
        let addr = NodeActor::new(
            msg.node.clone(),
            msg.key,
            ctx.address(),
            Arc::clone(&self.router),
        )
        .start();
        self.router.insert(msg.node.clone(), addr);
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
        self.handle(
            NodeChanged {
                key: msg.key,
                node: msg.node,
                at: self.clock.now(),
                change,
                detail: NodeDetail::default(),
            },
            ctx,
        );
    }
}

impl Handler<NodeChanged> for PoolActor {
    type Result = ();

    fn handle(&mut self, mut msg: NodeChanged, ctx: &mut Context<Self>) {
        msg.at = self.applied_at(msg.at);
        let _span = tracing::debug_span!("pool", pool = %self.core.id()).entered();
        tracing::debug!(node = %msg.node, reason = %msg.change.reason, ready = msg.change.after.is_ready(), "view change");
        let restarts_window = matches!(
            self.core.phase(),
            PoolPhase::Converging { .. } | PoolPhase::Ready { .. }
        );
        let mut before = None;
        let completed = self.guarded(ctx, |core, out| {
            before = core.node_changed(msg.key, msg.at, &msg.change, out);
            core.set_detail(msg.key, msg.detail);
        });
        // Nothing more on a failure (the actor restarts) or for a node actor
        // of an earlier pool definition.
        let (true, Some(before)) = (completed, before) else {
            return;
        };
        if restarts_window {
            telemetry::window_restart(msg.change.reason);
        }
        self.blocked.changed(before, msg.change.after);
        self.flush(ctx);
        if let Some(run) = &self.run {
            run.addr.do_send(PoolNews {
                at: msg.at,
                news: News::NodeChanged {
                    node: msg.node,
                    change: msg.change,
                },
            });
        }
    }
}

impl Handler<ConvergenceDue> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: ConvergenceDue, ctx: &mut Context<Self>) {
        let Some(at) = self.timer.fired(msg.generation) else {
            return;
        };
        let due = self.core.deadline().filter(|deadline| *deadline <= at);
        if self.guarded(ctx, |core, out| core.on_deadline(at, out)) {
            if let Some(deadline) = due {
                self.timer_fired(deadline);
            }
            self.flush(ctx);
        }
    }
}

impl Handler<WaitDeadlineDue> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: WaitDeadlineDue, ctx: &mut Context<Self>) {
        self.core.on_deadline(msg.at, &mut self.out);
        self.flush(ctx);
        if let Some(addr) = self.active_run(&msg.run) {
            self.timer_fired(msg.at);
            addr.do_send(PoolNews {
                at: msg.at,
                news: News::WaitExpired,
            });
        }
    }
}

impl Handler<RunEnded> for PoolActor {
    type Result = ();

    fn handle(&mut self, msg: RunEnded, _ctx: &mut Context<Self>) {
        if self.active_run(&msg.run).is_some() {
            self.run = None;
        }
    }
}

impl Handler<DefinePool> for PoolActor {
    type Result = AtomicResponse<Self, Result<(), RunError>>;

    fn handle(&mut self, mut msg: DefinePool, ctx: &mut Context<Self>) -> Self::Result {
        msg.at = self.applied_at(msg.at);
        self.settle(msg.at, ctx);
        self.with_active_run(msg.at, move |act, ctx, run| {
            if let Some(run) = run.filter(|r| r.committed) {
                return Err(RunError::RunCommitted(run.run));
            }
            if matches!(
                act.core.phase(),
                PoolPhase::Converging { .. } | PoolPhase::Ready { .. }
            ) {
                telemetry::window_restart(Reason::PoolRedefined);
            }
            let change = act.core.redefine(&msg.definition, msg.at, &mut act.out);
            for (node, _) in change.removed {
                // Dropping the router's address stops the node actor once
                // its mailbox is empty; a late change of it is ignored by
                // slot generation.
                act.router.remove(&node);
            }
            act.start_nodes(ctx, change.added);
            act.recount_blocked();
            Ok(())
        })
    }
}

impl Handler<BeginPlanning> for PoolActor {
    type Result = AtomicResponse<Self, Result<Epoch, RunError>>;

    fn handle(&mut self, mut msg: BeginPlanning, ctx: &mut Context<Self>) -> Self::Result {
        msg.at = self.applied_at(msg.at);
        self.settle(msg.at, ctx);
        self.with_active_run(msg.at, move |act, ctx, active| {
            let epoch = act.current_epoch(msg.epoch)?;
            if let Some(active) = active {
                return Err(RunError::RunInProgress(active.run));
            }
            let addr = RunActor::begin(
                msg.run.clone(),
                epoch,
                act.policy,
                msg.at,
                ctx.address(),
                act.publisher.clone(),
                act.clock,
            );
            act.run = Some(ActiveRun { id: msg.run, addr });
            Ok(epoch)
        })
    }
}

impl Handler<CommitPlan> for PoolActor {
    type Result = AtomicResponse<Self, Result<(), RunError>>;

    fn handle(&mut self, mut msg: CommitPlan, ctx: &mut Context<Self>) -> Self::Result {
        msg.at = self.applied_at(msg.at);
        self.settle(msg.at, ctx);
        // The plan's shape is checked first, as other malformed input is.
        if msg.required.is_empty() {
            return AtomicResponse::new(Box::pin(fut::ready(Err(RunError::InvalidPlan(msg.run)))));
        }
        let Some(addr) = self.active_run(&msg.run) else {
            return AtomicResponse::new(Box::pin(fut::ready(Err(RunError::UnknownRun(msg.run)))));
        };
        let pool_check = self.pool_check(&msg.required, msg.epoch);
        let commit = Commit {
            at: msg.at,
            required: msg.required,
            pool_check,
        };
        self.forward_to_run(msg.run, addr, commit, false)
    }
}

impl Handler<FinishRun> for PoolActor {
    type Result = AtomicResponse<Self, Result<(), RunError>>;

    fn handle(&mut self, mut msg: FinishRun, ctx: &mut Context<Self>) -> Self::Result {
        msg.at = self.applied_at(msg.at);
        self.settle(msg.at, ctx);
        let Some(addr) = self.active_run(&msg.run) else {
            return AtomicResponse::new(Box::pin(fut::ready(Err(RunError::UnknownRun(msg.run)))));
        };
        self.forward_to_run(msg.run, addr, Finish { at: msg.at }, true)
    }
}

impl Handler<GetReport> for PoolActor {
    type Result = PoolReport;

    fn handle(&mut self, mut msg: GetReport, ctx: &mut Context<Self>) -> PoolReport {
        msg.at = self.applied_at(msg.at);
        self.settle(msg.at, ctx);
        PoolReport {
            pool: self.core.id().clone(),
            phase: self.core.phase(),
            candidates: self.core.candidates(),
            last_change: self.core.last_change().clone(),
            run: self.run.as_ref().map(|r| r.id.clone()),
            ignored_stale: IgnoredCounts::read(&self.router.ignored.stale),
            ignored_non_candidate: IgnoredCounts::read(&self.router.ignored.non_candidate),
        }
    }
}

impl Handler<PendingDeadline> for PoolActor {
    type Result = AtomicResponse<Self, Option<Time>>;

    fn handle(&mut self, mut msg: PendingDeadline, ctx: &mut Context<Self>) -> Self::Result {
        msg.at = self.applied_at(msg.at);
        self.settle(msg.at, ctx);
        self.with_active_run(msg.at, |act, _ctx, run| {
            let run_deadline = run.and_then(|r| r.deadline);
            match (act.core.deadline(), run_deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
    }
}
