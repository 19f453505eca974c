//! Which node actor holds which candidate: written by the pool actor when
//! the pool is (re)defined, read by the gate's handle to route input.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use actix::Addr;

use crate::node_actor::NodeActor;
use crate::telemetry::IgnoredCounts;
use poolgate_core::NodeId;

/// The node actors of the current candidates, by node id.
#[derive(Debug, Default)]
pub(crate) struct Router {
    nodes: RwLock<HashMap<NodeId, Addr<NodeActor>>>,
    /// What was ignored, and why; shared with the node actors.
    pub(crate) ignored: Arc<IgnoredCounts>,
    /// How many of this gate's actors run (node actors and the run
    /// actor): each counts itself in when it starts and out when it stops.
    pub(crate) live: Arc<std::sync::atomic::AtomicUsize>,
}

impl Router {
    /// The node actor of a candidate, or `None` for a non-candidate.
    pub(crate) fn route(&self, node: &NodeId) -> Option<Addr<NodeActor>> {
        self.read().get(node).cloned()
    }

    pub(crate) fn insert(&self, node: NodeId, addr: Addr<NodeActor>) {
        self.write().insert(node, addr);
    }

    pub(crate) fn remove(&self, node: &NodeId) -> Option<Addr<NodeActor>> {
        self.write().remove(node)
    }

    /// Every node actor's address, the map left empty.
    pub(crate) fn drain(&self) -> Vec<Addr<NodeActor>> {
        self.write().drain().map(|(_, addr)| addr).collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<NodeId, Addr<NodeActor>>> {
        // A panic elsewhere while holding the lock leaves the map intact.
        self.nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<NodeId, Addr<NodeActor>>> {
        self.nodes
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Handle → `PoolActor`: the actor of candidate `node` ended with an
/// input in flight (it failed); its replacement, started now if the pool
/// has not yet, so that the input is applied, not lost. `None` for a node
/// that is no longer a candidate.
#[derive(Debug)]
pub struct ReplaceNode {
    /// The candidate.
    pub node: NodeId,
}

impl actix::Message for ReplaceNode {
    type Result = Option<Addr<NodeActor>>;
}
