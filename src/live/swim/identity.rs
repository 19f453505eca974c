//! A SWIM member's identity: the node id the gate knows it by, the socket
//! address it answers on, and a generation that grows with each restart.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Who a SWIM member is. Two identities with the same address are the same
/// member; the higher generation wins (a restarted or renewed member).
#[derive(Clone, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct SwimIdentity {
    /// The node id, as the gate knows the node.
    pub node: String,
    /// Where the member answers.
    pub addr: SocketAddr,
    /// Bumped on each restart, and by foca's `renew` when the member learns
    /// it was declared down, so it can rejoin.
    pub generation: u64,
}

impl SwimIdentity {
    /// A placeholder for a seed known only by its address: foca accepts an
    /// announce addressed to any identity with its address.
    pub fn seed(addr: SocketAddr) -> Self {
        Self {
            node: String::new(),
            addr,
            generation: 0,
        }
    }
}

impl foca::Identity for SwimIdentity {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            node: self.node.clone(),
            addr: self.addr,
            generation: self.generation.wrapping_add(1),
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}
