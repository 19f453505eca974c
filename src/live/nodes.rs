//! What the orchestrator remembers of each node between its frames: the
//! sequence last accepted, whether it is leaving, and the SWIM address it
//! signed, against which every SWIM fact about it is checked (a fact
//! about node N counts only from the address N signed). The live
//! orchestrator and the simulator ([`crate::sim`]) both go through it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use poolgate_actors::core::{MembershipUpdate, NodeId, SwimState};

use super::swim::tracker::Observed;

/// What the orchestrator remembers of each node between frames.
#[derive(Debug, Default)]
pub(crate) struct Nodes {
    /// The last sequence accepted per node (replay protection).
    pub(crate) last_seq: HashMap<NodeId, u64>,
    /// The last incarnation SWIM reported per node.
    pub(crate) incarnation: HashMap<NodeId, u64>,
    /// Nodes that announced they are leaving: SWIM's `dead` is their `left`.
    pub(crate) leaving: HashSet<NodeId>,
    /// The SWIM address each node signed in its latest frame: SWIM facts
    /// about the node count only from there.
    pub(crate) swim_addr: HashMap<NodeId, SocketAddr>,
    /// The agent connection each node was last heard on (an id of the
    /// listener's), so a lost connection is told from a replaced one.
    pub(crate) attached: HashMap<NodeId, u64>,
    /// The latest SWIM fact per node and address, so a node's state is
    /// known the moment it signs its address.
    pub(crate) latest: HashMap<NodeId, HashMap<SocketAddr, Held>>,
}

/// The SWIM facts held for one (node, address) until the node signs it:
/// the latest, and the last `alive` before it, so that a suspicion heard
/// before the node's first frame is not dropped as a suspicion of a member
/// never seen alive.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    alive: Option<MembershipUpdate>,
    latest: MembershipUpdate,
}

/// How many addresses' facts are kept per node name (impostors included).
const ADDRESSES_PER_NODE: usize = 8;

impl Nodes {
    /// A SWIM fact from the node's signed address, as the gate is told it:
    /// a leaving node's `dead` is its `left`.
    pub(crate) fn for_gate(&mut self, mut update: MembershipUpdate) -> MembershipUpdate {
        self.incarnation
            .insert(update.node.clone(), update.incarnation);
        if update.state == SwimState::Dead && self.leaving.contains(&update.node) {
            update.state = SwimState::Left;
        }
        update
    }

    /// Keeps a SWIM fact; returns it for the gate if it comes from the
    /// address the node signed.
    pub(crate) fn observe(&mut self, observed: Observed) -> Option<MembershipUpdate> {
        let node = observed.update.node.clone();
        let facts = self.latest.entry(node.clone()).or_default();
        if facts.len() >= ADDRESSES_PER_NODE && !facts.contains_key(&observed.addr) {
            facts.clear();
        }
        let alive = match facts.get(&observed.addr) {
            _ if observed.update.state == SwimState::Alive => Some(observed.update.clone()),
            Some(held) => held.alive.clone(),
            None => None,
        };
        facts.insert(
            observed.addr,
            Held {
                alive,
                latest: observed.update.clone(),
            },
        );
        match self.swim_addr.get(&node) {
            Some(bound) if *bound == observed.addr => Some(self.for_gate(observed.update)),
            Some(_) => {
                metrics::counter!("poolgate_swim_impostors_total").increment(1);
                tracing::debug!(%node, addr = %observed.addr, "SWIM fact from an address the node did not sign; ignored");
                None
            }
            // Held until the node signs its address.
            None => None,
        }
    }

    /// The node signed `addr`: binds it, and returns the facts heard from
    /// there, for the gate in order (the last `alive`, then the latest), if
    /// the binding changed.
    pub(crate) fn bind(
        &mut self,
        node: &NodeId,
        addr: SocketAddr,
    ) -> Option<Vec<MembershipUpdate>> {
        if self.swim_addr.insert(node.clone(), addr) == Some(addr) {
            return None;
        }
        let held = self.latest.get(node).and_then(|f| f.get(&addr)).cloned();
        let mut facts = Vec::new();
        if let Some(held) = held {
            if let Some(alive) = held.alive.filter(|a| *a != held.latest) {
                facts.push(self.for_gate(alive));
            }
            facts.push(self.for_gate(held.latest));
        }
        Some(facts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::swim::tracker::Observed;

    fn observed(state: SwimState, incarnation: u64) -> Observed {
        Observed {
            update: MembershipUpdate {
                node: NodeId::new("node-4").unwrap(),
                state,
                incarnation,
            },
            addr: SocketAddr::from(([10, 0, 0, 4], 7946)),
        }
    }

    #[test]
    fn a_suspicion_heard_before_the_first_frame_comes_after_the_alive_it_suspects() {
        // SWIM saw node-4 alive, then suspected it, all before node-4's
        // first frame signed its address: binding hands the gate both, in
        // order, so the suspicion counts (alone it would be a suspicion of
        // a member never seen, which the gate ignores as stale).
        let mut nodes = Nodes::default();
        assert_eq!(nodes.observe(observed(SwimState::Alive, 7)), None);
        assert_eq!(nodes.observe(observed(SwimState::Suspect, 7)), None);
        let node = NodeId::new("node-4").unwrap();
        let facts = nodes
            .bind(&node, SocketAddr::from(([10, 0, 0, 4], 7946)))
            .unwrap();
        let states: Vec<SwimState> = facts.iter().map(|f| f.state).collect();
        assert_eq!(states, vec![SwimState::Alive, SwimState::Suspect]);
        // Bound already: nothing again.
        assert!(nodes
            .bind(&node, SocketAddr::from(([10, 0, 0, 4], 7946)))
            .is_none());
    }
}
