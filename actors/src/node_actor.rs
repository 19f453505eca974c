//! `NodeActor`: one per candidate. Holds the node's [`NodeFacts`], applies
//! each observation, and tells the pool actor only when the view changed.

use std::sync::Arc;

use actix::{Actor, ActorContext, Addr, Context, Handler, Message, MessageResponse};

use crate::core::{
    Applied, NodeChange, NodeDetail, NodeFacts, NodeId, Observation, Reason, SlotKey, Time, Verdict,
};
use crate::pool_actor::{NodeActorStopped, NodeChanged, PoolActor};
use crate::telemetry;
use crate::wiring::{IgnoredCounts, Router};

/// What became of one observation.
#[derive(Clone, Copy, PartialEq, Eq, Debug, MessageResponse)]
pub enum Outcome {
    /// The node's view changed; the pool was told.
    Changed,
    /// The observation repeated the view.
    Duplicate,
    /// A SWIM observation older than the view, ignored.
    Stale,
    /// The node is not a candidate; ignored.
    NotCandidate,
    /// The node's actor failed while applying it; the actor was restarted
    /// with no facts, and the node counts as not ready until it reports
    /// again.
    Failed,
}

/// Apply one observation, stamped with the instant it entered the gate.
#[derive(Message, Debug)]
#[rtype(result = "Outcome")]
pub struct Observe {
    /// When the observation entered the gate.
    pub at: Time,
    /// What was observed.
    pub observation: Observation,
}

/// The actor of one candidate node.
#[derive(Debug)]
pub struct NodeActor {
    node: NodeId,
    key: SlotKey,
    facts: NodeFacts,
    pool: Addr<PoolActor>,
    router: Arc<Router>,
}

impl NodeActor {
    /// A node actor with no facts yet, reporting to `pool` under `key`.
    pub fn new(node: NodeId, key: SlotKey, pool: Addr<PoolActor>, router: Arc<Router>) -> Self {
        Self {
            node,
            key,
            facts: NodeFacts::default(),
            pool,
            router,
        }
    }
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    /// Runs however the actor ends (stopped, or failed in a handler): the
    /// pool decides whether that matters (a current candidate's actor is
    /// replaced; one of a former candidate is not).
    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.pool.do_send(NodeActorStopped {
            key: self.key,
            node: self.node.clone(),
        });
    }
}

/// Re-send the node's verdict to a restarted pool actor.
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Resync {
    /// When the pool restarted.
    pub at: Time,
}

/// Failures a test can inject into a node actor.
#[cfg(any(test, feature = "fault-injection"))]
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub enum InjectFault {
    /// Panic inside the handler, where observations are applied.
    Panic,
    /// Stop the actor.
    Stop,
}

impl NodeActor {
    fn detail(&self) -> NodeDetail {
        NodeDetail {
            membership: self.facts.membership(),
            fault: self.facts.fault().map(Arc::from),
        }
    }

    /// Runs `apply` on the facts; a panic in it stops the actor (the pool
    /// restarts it with no facts) instead of taking the arbiter down.
    fn guarded<R>(
        &mut self,
        ctx: &mut Context<Self>,
        apply: impl FnOnce(&mut NodeFacts) -> R,
    ) -> Option<R> {
        let facts = &mut self.facts;
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply(facts))) {
            Ok(result) => Some(result),
            Err(_) => {
                tracing::error!(node = %self.node, "node actor failed; restarting it with no facts");
                ctx.stop();
                None
            }
        }
    }
}

#[cfg(any(test, feature = "fault-injection"))]
impl Handler<InjectFault> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: InjectFault, ctx: &mut Context<Self>) {
        match msg {
            InjectFault::Panic => {
                self.guarded(ctx, |_| panic!("injected node actor fault"));
            }
            InjectFault::Stop => ctx.stop(),
        }
    }
}

impl Handler<Resync> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: Resync, _ctx: &mut Context<Self>) {
        let verdict = self.facts.verdict();
        if verdict != Verdict::NOTHING_KNOWN {
            self.pool.do_send(NodeChanged {
                key: self.key,
                node: self.node.clone(),
                at: msg.at,
                change: NodeChange {
                    reason: Reason::ViewChanged,
                    before: Verdict::NOTHING_KNOWN,
                    after: verdict,
                    fingerprint: self.facts.fingerprint(),
                },
                detail: self.detail(),
            });
        }
    }
}

impl Handler<Observe> for NodeActor {
    type Result = Outcome;

    fn handle(&mut self, msg: Observe, ctx: &mut Context<Self>) -> Outcome {
        let Some(applied) = self.guarded(ctx, |facts| facts.apply(msg.observation)) else {
            return Outcome::Failed;
        };
        match applied {
            Applied::Changed(change) => {
                self.pool.do_send(NodeChanged {
                    key: self.key,
                    node: self.node.clone(),
                    at: msg.at,
                    change,
                    detail: self.detail(),
                });
                telemetry::observation("applied");
                Outcome::Changed
            }
            Applied::Duplicate => {
                telemetry::observation("duplicate");
                Outcome::Duplicate
            }
            Applied::Stale => {
                IgnoredCounts::bump(&self.router.ignored.stale);
                telemetry::observation("stale");
                tracing::debug!(node = %self.node, "stale SWIM observation ignored");
                Outcome::Stale
            }
        }
    }
}
