//! `RunActor`: one per committed run. It holds the run's [`RunGuard`] from
//! the commit on, when provisioning begins, and owns its faults: the loss
//! of a required node faults the run at once (SPEC §3). It hears of the
//! required nodes' changes from the pool actor, in order, and answers each
//! with the run's [`RunStatus`], so the pool knows at once when the run
//! ended.

use actix::{Actor, ActorContext, Context, Handler};

use crate::messages::{ConfirmDue, FinishRun, RequiredNodeChanged, RunStatus};
use crate::publisher::Publisher;
use crate::telemetry;
use poolgate_core::{Event, Refusal, RunGuard};

/// The actor of one committed run.
#[derive(Debug)]
pub struct RunActor {
    guard: RunGuard,
    publisher: Publisher,
    out: Vec<Event>,
}

impl RunActor {
    /// The actor of a run whose plan was just committed.
    pub fn new(guard: RunGuard, publisher: Publisher) -> Self {
        Self {
            guard,
            publisher,
            out: Vec::new(),
        }
    }

    /// Publishes what the guard produced, and stops once the run ended.
    fn flush(&mut self, ctx: &mut Context<Self>) -> RunStatus {
        for event in &self.out {
            if let Event::RunFaulted { reason, .. } = event {
                telemetry::run_faulted(*reason);
            }
        }
        self.publisher.publish(&mut self.out);
        if self.guard.is_ended() {
            ctx.stop();
            RunStatus::Ended
        } else {
            RunStatus::Active
        }
    }
}

impl Actor for RunActor {
    type Context = Context<Self>;
}

impl Handler<RequiredNodeChanged> for RunActor {
    type Result = RunStatus;

    fn handle(&mut self, msg: RequiredNodeChanged, ctx: &mut Context<Self>) -> RunStatus {
        let _span = tracing::debug_span!("run", run = %self.guard.run()).entered();
        self.guard
            .node_changed(msg.at, &msg.node, &msg.change, &mut self.out);
        self.flush(ctx)
    }
}

impl Handler<ConfirmDue> for RunActor {
    type Result = RunStatus;

    fn handle(&mut self, msg: ConfirmDue, ctx: &mut Context<Self>) -> RunStatus {
        self.guard.on_confirm_deadline(msg.at, &mut self.out);
        self.flush(ctx)
    }
}

impl Handler<FinishRun> for RunActor {
    type Result = Result<(), Refusal>;

    fn handle(&mut self, msg: FinishRun, ctx: &mut Context<Self>) -> Result<(), Refusal> {
        let result = self.guard.finish(msg.at, &mut self.out);
        self.flush(ctx);
        result
    }
}
