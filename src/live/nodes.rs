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
    pub(crate) latest: HashMap<NodeId, HashMap<SocketAddr, MembershipUpdate>>,
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
        facts.insert(observed.addr, observed.update.clone());
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

    /// The node signed `addr`: binds it, and returns the latest fact heard
    /// from there, if the binding changed.
    pub(crate) fn bind(
        &mut self,
        node: &NodeId,
        addr: SocketAddr,
    ) -> Option<Option<MembershipUpdate>> {
        if self.swim_addr.insert(node.clone(), addr) == Some(addr) {
            return None;
        }
        let latest = self.latest.get(node).and_then(|f| f.get(&addr)).cloned();
        Some(latest.map(|update| self.for_gate(update)))
    }
}
