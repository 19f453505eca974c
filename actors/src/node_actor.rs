//! `NodeActor`: one per candidate. Holds the node's [`NodeFacts`], applies
//! each observation, and tells the pool actor only when the view changed.

use std::sync::Arc;

use actix::{Actor, ActorContext, Context, Handler, Recipient};

use crate::messages::{
    ApplyObservation, ApplyObservations, Fanout, FromNode, NodeActorStopped, NodeChanged,
    ObservationOutcome, Resync,
};
use crate::telemetry::{self, IgnoredCounts};
use poolgate_core::{Applied, NodeChange, NodeDetail, NodeFacts, NodeId, SlotKey, Verdict};

/// The actor of one candidate node.
#[derive(Debug)]
pub struct NodeActor {
    node: NodeId,
    key: SlotKey,
    facts: NodeFacts,
    /// Where changes, and the actor's end, are told: the pool actor.
    pool: Recipient<FromNode>,
    ignored: Arc<IgnoredCounts>,
    /// The gate's count of its running actors (see `Router::live`).
    live: Arc<std::sync::atomic::AtomicUsize>,
}

impl NodeActor {
    /// A node actor with no facts yet, reporting changes under `key`.
    pub fn new(
        node: NodeId,
        key: SlotKey,
        pool: Recipient<FromNode>,
        ignored: Arc<IgnoredCounts>,
        live: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        // Counted out when dropped (see `Drop`).
        live.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self {
            node,
            key,
            facts: NodeFacts::default(),
            pool,
            ignored,
            live,
        }
    }
}

impl Actor for NodeActor {
    type Context = Context<Self>;
}

/// Runs however the actor ends (stopped; failed in a handler, the panic
/// caught or not): the pool decides whether that matters (a current
/// candidate's actor is replaced; one of a former candidate is not).
impl Drop for NodeActor {
    fn drop(&mut self) {
        self.live.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        self.pool.do_send(FromNode::Stopped(NodeActorStopped {
            key: self.key,
            node: self.node.clone(),
        }));
    }
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
                crate::telemetry::said!(error, node = %self.node, "node actor failed; restarting it with no facts");
                ctx.stop();
                None
            }
        }
    }
}

#[cfg(any(test, feature = "testing"))]
impl Handler<crate::messages::InjectFault> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: crate::messages::InjectFault, ctx: &mut Context<Self>) {
        use crate::messages::InjectFault;
        match msg {
            InjectFault::Panic => {
                self.guarded(ctx, |_| panic!("injected node actor fault"));
            }
            InjectFault::Stop => ctx.stop(),
        }
    }
}

impl Handler<crate::messages::StopNode> for NodeActor {
    type Result = ();

    fn handle(&mut self, _msg: crate::messages::StopNode, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<Resync> for NodeActor {
    type Result = ();

    fn handle(&mut self, msg: Resync, _ctx: &mut Context<Self>) {
        let verdict = self.facts.verdict();
        if verdict != Verdict::NOTHING_KNOWN {
            self.pool.do_send(FromNode::Changed(NodeChanged {
                key: self.key,
                node: self.node.clone(),
                at: msg.at,
                change: NodeChange {
                    // Reported afresh, after the pool's restart: a run
                    // that requires the node and was not told of its loss
                    // hears why it is not ready.
                    reason: self.facts.reason(),
                    before: Verdict::NOTHING_KNOWN,
                    after: verdict,
                    fingerprint: self.facts.fingerprint(),
                },
                detail: self.detail(),
                observation: None,
                fanout: Fanout::Own,
            }));
        }
    }
}

impl Handler<ApplyObservation> for NodeActor {
    type Result = ObservationOutcome;

    fn handle(&mut self, msg: ApplyObservation, ctx: &mut Context<Self>) -> ObservationOutcome {
        self.apply(ctx, msg.at, msg.observation, msg.fanout)
    }
}

impl Handler<ApplyObservations> for NodeActor {
    type Result = Vec<ObservationOutcome>;

    fn handle(
        &mut self,
        msg: ApplyObservations,
        ctx: &mut Context<Self>,
    ) -> Vec<ObservationOutcome> {
        let mut outcomes = Vec::with_capacity(msg.observations.len());
        for (i, observation) in msg.observations.into_iter().enumerate() {
            let fanout = msg.fanout.nth(i);
            let outcome = self.apply(ctx, msg.at, observation, fanout);
            outcomes.push(outcome);
            if outcome == ObservationOutcome::Failed {
                // The actor is stopping; what follows is not applied.
                break;
            }
        }
        outcomes
    }
}

impl NodeActor {
    /// Applies one observation; tells the pool if the view changed.
    fn apply(
        &mut self,
        ctx: &mut Context<Self>,
        at: poolgate_core::Time,
        observation: poolgate_core::Observation,
        fanout: Fanout,
    ) -> ObservationOutcome {
        let Some(applied) = self.guarded(ctx, |facts| facts.observe(&observation)) else {
            return ObservationOutcome::Failed;
        };
        match applied {
            Applied::Changed(change) => {
                self.pool.do_send(FromNode::Changed(NodeChanged {
                    key: self.key,
                    node: self.node.clone(),
                    at,
                    change,
                    detail: self.detail(),
                    observation: Some(observation),
                    fanout,
                }));
                telemetry::observation("applied");
                ObservationOutcome::Changed
            }
            Applied::Duplicate => {
                telemetry::observation("duplicate");
                ObservationOutcome::Duplicate
            }
            Applied::Stale => {
                IgnoredCounts::bump(&self.ignored.stale);
                telemetry::observation("stale");
                crate::telemetry::said!(debug, node = %self.node, "stale SWIM observation ignored");
                ObservationOutcome::Stale
            }
        }
    }
}
