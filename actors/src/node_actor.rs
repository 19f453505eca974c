//! `NodeActor`: one per candidate. Holds the node's [`NodeFacts`], applies
//! each observation, and tells the pool actor only when the view changed.

use std::sync::Arc;

use actix::{Actor, Addr, Context, Handler, Message, MessageResponse};

use crate::core::{Applied, NodeFacts, NodeId, Observation, SlotKey, Time};
use crate::pool_actor::{NodeChanged, PoolActor};
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
}

impl Handler<Observe> for NodeActor {
    type Result = Outcome;

    fn handle(&mut self, msg: Observe, _ctx: &mut Context<Self>) -> Outcome {
        match self.facts.apply(msg.observation) {
            Applied::Changed(change) => {
                self.pool.do_send(NodeChanged {
                    key: self.key,
                    node: self.node.clone(),
                    at: msg.at,
                    change,
                });
                Outcome::Changed
            }
            Applied::Duplicate => {
                IgnoredCounts::bump(&self.router.ignored.duplicate);
                Outcome::Duplicate
            }
            Applied::Stale => {
                IgnoredCounts::bump(&self.router.ignored.stale);
                tracing::debug!(node = %self.node, "stale SWIM observation ignored");
                Outcome::Stale
            }
        }
    }
}
