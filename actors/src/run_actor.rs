//! `RunActor`: one per run. Holds the [`RunGuard`]; applies the planning
//! policy while planning, and once the plan is committed faults the run
//! when a required node is lost. It hears everything through the pool actor,
//! in order.

use actix::{Actor, ActorContext, Addr, Context, Handler, Message};

use crate::core::{
    Epoch, Event, NodeChange, NodeId, PlanningPolicy, RunError, RunGuard, RunId, RunPhase, Time,
};
use crate::pool_actor::{PoolActor, RunEnded, WaitDeadlineDue};
use crate::telemetry;
use crate::wiring::{Clock, Publisher, TimerSlot};

/// What the pool tells its active run.
#[derive(Debug, Clone)]
pub enum News {
    /// The pool became ready at `epoch`.
    PoolReady {
        /// The new epoch.
        epoch: Epoch,
    },
    /// The pool stopped being ready.
    ReadinessLost,
    /// A candidate's view changed.
    NodeChanged {
        /// The candidate.
        node: NodeId,
        /// The change.
        change: NodeChange,
    },
    /// The run's wait deadline is due, after the pool settled up to it.
    WaitExpired,
}

/// News from the pool, stamped with when it happened.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct PoolNews {
    /// When.
    pub at: Time,
    /// What.
    pub news: News,
}

/// Where an active run stands.
#[derive(Debug, Clone)]
pub struct RunSnapshot {
    /// The run.
    pub run: RunId,
    /// Whether the plan is committed.
    pub committed: bool,
    /// The wait deadline, if suspended with one.
    pub deadline: Option<Time>,
}

/// Ask the run where it stands at `at`; `None` once it has ended.
#[derive(Message, Debug)]
#[rtype(result = "Option<RunSnapshot>")]
pub struct QueryRun {
    /// As of when.
    pub at: Time,
}

/// Commit the plan; `pool_check` is the pool's verdict (its current epoch,
/// or why the pool refuses), weighed after the run's own state.
#[derive(Message, Debug)]
#[rtype(result = "Result<(), RunError>")]
pub struct Commit {
    /// When.
    pub at: Time,
    /// The nodes the plan requires.
    pub required: Vec<NodeId>,
    /// The pool's epoch, or its refusal.
    pub pool_check: Result<Epoch, RunError>,
}

/// Finish the committed run.
#[derive(Message, Debug)]
#[rtype(result = "Result<(), RunError>")]
pub struct Finish {
    /// When.
    pub at: Time,
}

/// The wait timer armed for `at` fired.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct WaitTimerFired {
    generation: u64,
}

/// The actor of one run.
#[derive(Debug)]
pub struct RunActor {
    guard: RunGuard,
    pool: Addr<PoolActor>,
    publisher: Publisher,
    clock: Clock,
    timer: TimerSlot,
    out: Vec<Event>,
}

impl RunActor {
    /// Begins planning `run` on `epoch` and starts its actor. The pool actor
    /// has checked that the pool is ready and no other run is active.
    pub fn begin(
        run: RunId,
        epoch: Epoch,
        policy: PlanningPolicy,
        at: Time,
        pool: Addr<PoolActor>,
        publisher: Publisher,
        clock: Clock,
    ) -> Addr<RunActor> {
        let mut out = Vec::new();
        let guard = RunGuard::begin(run, epoch, policy, at, &mut out);
        publisher.publish(&mut out);
        RunActor {
            guard,
            pool,
            publisher,
            clock,
            timer: TimerSlot::default(),
            out,
        }
        .start()
    }

    /// Publishes what the guard produced, re-arms the wait timer, and stops
    /// once the run has ended.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        for event in &self.out {
            if let Event::RunFaulted { reason, .. } = event {
                telemetry::run_faulted(*reason);
            }
        }
        self.publisher.publish(&mut self.out);
        self.timer
            .rearm(ctx, &self.clock, self.guard.deadline(), |generation| {
                WaitTimerFired { generation }
            });
        if self.guard.is_ended() {
            self.pool.do_send(RunEnded {
                run: self.guard.run().clone(),
            });
            ctx.stop();
        }
    }

    fn unknown(&self) -> RunError {
        RunError::UnknownRun(self.guard.run().clone())
    }
}

impl Actor for RunActor {
    type Context = Context<Self>;
}

impl Handler<PoolNews> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: PoolNews, ctx: &mut Context<Self>) {
        let _span = tracing::debug_span!("run", run = %self.guard.run()).entered();
        let out = &mut self.out;
        match msg.news {
            News::PoolReady { epoch } => self.guard.pool_ready(msg.at, epoch, out),
            News::ReadinessLost => self.guard.readiness_lost(msg.at, out),
            News::NodeChanged { node, change } => {
                self.guard.node_changed(msg.at, &node, &change, out)
            }
            News::WaitExpired => self.guard.on_deadline(msg.at, out),
        }
        self.flush(ctx);
    }
}

impl Handler<WaitTimerFired> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: WaitTimerFired, _ctx: &mut Context<Self>) {
        if let Some(at) = self.timer.fired(msg.generation) {
            // The pool settles first, so a PoolReady due at the same instant
            // reaches this run before the timeout does (SPEC §3).
            self.pool.do_send(WaitDeadlineDue {
                run: self.guard.run().clone(),
                at,
            });
        }
    }
}

impl Handler<QueryRun> for RunActor {
    type Result = Option<RunSnapshot>;

    fn handle(&mut self, msg: QueryRun, ctx: &mut Context<Self>) -> Option<RunSnapshot> {
        self.guard.settle_before(msg.at, &mut self.out);
        self.flush(ctx);
        if self.guard.is_ended() {
            return None;
        }
        Some(RunSnapshot {
            run: self.guard.run().clone(),
            committed: matches!(self.guard.phase(), RunPhase::Committed { .. }),
            deadline: self.guard.deadline(),
        })
    }
}

impl Handler<Commit> for RunActor {
    type Result = Result<(), RunError>;

    fn handle(&mut self, msg: Commit, ctx: &mut Context<Self>) -> Result<(), RunError> {
        self.guard.settle_before(msg.at, &mut self.out);
        let result = if self.guard.is_ended() {
            Err(self.unknown())
        } else {
            msg.pool_check.and_then(|epoch| {
                self.guard
                    .commit(msg.at, msg.required, epoch, &mut self.out)
            })
        };
        self.flush(ctx);
        result
    }
}

impl Handler<Finish> for RunActor {
    type Result = Result<(), RunError>;

    fn handle(&mut self, msg: Finish, ctx: &mut Context<Self>) -> Result<(), RunError> {
        self.guard.settle_before(msg.at, &mut self.out);
        let result = if self.guard.is_ended() {
            Err(self.unknown())
        } else {
            self.guard.finish(msg.at, &mut self.out)
        };
        self.flush(ctx);
        result
    }
}
