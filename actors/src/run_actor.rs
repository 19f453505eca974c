//! `RunActor`: one per committed run. It holds the run's [`RunGuard`] from
//! the commit on, when provisioning begins, and owns its faults: the loss
//! of a required node faults the run at once (design §3). It hears of the
//! required nodes' changes from the pool actor, in order, and answers each
//! with the run's [`RunStatus`] and the events its guard produced: the pool
//! stores the run's end before it tells them, so a run's outcome is never
//! told unwritten (an isolated replica faults nobody).

use actix::{Actor, ActorContext, Context, Handler};

use crate::messages::{ConfirmDue, FinishCommitted, RequiredNodeChanged, RunAnswer, RunStatus};
use poolgate_core::{Event, Refusal, RunGuard};

/// The actor of one committed run.
#[derive(Debug)]
pub struct RunActor {
    guard: RunGuard,
    /// The gate's count of its running actors (see `Router::live`).
    live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl RunActor {
    /// The actor of a run whose plan was just committed.
    pub fn new(guard: RunGuard, live: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Self {
        // Counted out when dropped (see `Drop`).
        live.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self { guard, live }
    }

    /// The answer with what the guard produced; the actor stops once the
    /// run ended.
    fn answer<T>(
        &mut self,
        ctx: &mut Context<Self>,
        status: T,
        events: Vec<Event>,
    ) -> RunAnswer<T> {
        if self.guard.is_ended() {
            ctx.stop();
        }
        RunAnswer { status, events }
    }

    fn status(&self) -> RunStatus {
        if self.guard.is_ended() {
            RunStatus::Ended
        } else {
            RunStatus::Active
        }
    }
}

impl Actor for RunActor {
    type Context = Context<Self>;
}

/// Counted out however the actor ends, a panic included.
impl Drop for RunActor {
    fn drop(&mut self) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Handler<RequiredNodeChanged> for RunActor {
    type Result = RunAnswer;

    fn handle(&mut self, msg: RequiredNodeChanged, ctx: &mut Context<Self>) -> RunAnswer {
        let mut out = Vec::new();
        self.guard
            .node_changed(msg.at, &msg.node, &msg.change, &mut out);
        let status = self.status();
        self.answer(ctx, status, out)
    }
}

impl Handler<ConfirmDue> for RunActor {
    type Result = RunAnswer;

    fn handle(&mut self, msg: ConfirmDue, ctx: &mut Context<Self>) -> RunAnswer {
        let mut out = Vec::new();
        self.guard.on_confirm_deadline(msg.at, &mut out);
        let status = self.status();
        self.answer(ctx, status, out)
    }
}

impl Handler<FinishCommitted> for RunActor {
    type Result = RunAnswer<Result<(), Refusal>>;

    fn handle(&mut self, msg: FinishCommitted, ctx: &mut Context<Self>) -> Self::Result {
        let mut out = Vec::new();
        let result = self.guard.finish(msg.at, &mut out);
        self.answer(ctx, result, out)
    }
}

#[cfg(any(test, feature = "testing"))]
impl Handler<crate::messages::InjectFault> for RunActor {
    type Result = ();

    fn handle(&mut self, _msg: crate::messages::InjectFault, _ctx: &mut Context<Self>) {
        panic!("injected run actor fault");
    }
}
