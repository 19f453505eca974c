//! A SWIM member's identity: the node id the gate knows it by, the socket
//! address it answers on, and a generation that grows with each restart.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// The SWIM identities nodes signed, by address (name, generation): the
/// orchestrator's node table (`live::nodes`) keeps it, and its SWIM member
/// decides address conflicts by it (see [`with_signed`]).
pub type SignedView = Arc<RwLock<HashMap<SocketAddr, (String, u64)>>>;

thread_local! {
    static SIGNED: RefCell<Option<SignedView>> = const { RefCell::new(None) };
}

/// Runs `f` (a call into foca) with `view` deciding address conflicts: an
/// identity a node signed beats any other at its address, whatever their
/// generations, so a forged identity with a higher generation cannot
/// replace the node in this member's view (nor get it declared down by
/// the conflict). Without a view, as outside `f`, the higher generation
/// wins, as foca's members elsewhere decide.
pub fn with_signed<R>(view: Option<&SignedView>, f: impl FnOnce() -> R) -> R {
    let before = SIGNED.with(|s| s.replace(view.cloned()));
    let result = f();
    SIGNED.with(|s| *s.borrow_mut() = before);
    result
}

/// Whether `a` beats `b` by what was signed at their address, if that
/// decides it.
fn signed_verdict(a: &SwimIdentity, b: &SwimIdentity) -> Option<bool> {
    SIGNED.with(|s| {
        let view = s.borrow();
        let view = view.as_ref()?.read().ok()?;
        let (node, generation) = view.get(&a.addr)?;
        let signed = |id: &SwimIdentity| id.node == *node && id.generation == *generation;
        match (signed(a), signed(b)) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    })
}

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

#[cfg(test)]
impl SwimIdentity {
    /// A member on 127.0.0.1:`port` at generation 1 (the unit tests').
    pub(crate) fn local(node: &str, port: u16) -> Self {
        Self {
            node: node.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            generation: 1,
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
        signed_verdict(self, adversary).unwrap_or(self.generation > adversary.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::Identity;

    fn id(node: &str, generation: u64) -> SwimIdentity {
        SwimIdentity {
            node: node.into(),
            addr: SocketAddr::from(([10, 0, 0, 1], 7946)),
            generation,
        }
    }

    #[test]
    fn a_signed_identity_beats_any_other_at_its_address_only_where_signed_is_known() {
        let (real, forged, other) = (id("node-1", 5), id("node-1", 5_000), id("node-9", 6));
        // Without a view: the higher generation wins.
        assert!(forged.win_addr_conflict(&real));
        let view: SignedView = Arc::default();
        view.write()
            .unwrap()
            .insert(real.addr, ("node-1".into(), 5));
        with_signed(Some(&view), || {
            assert!(real.win_addr_conflict(&forged));
            assert!(!forged.win_addr_conflict(&real));
            assert!(real.win_addr_conflict(&other));
            assert!(!other.win_addr_conflict(&real));
            // Neither signed: the generations decide.
            assert!(forged.win_addr_conflict(&other));
        });
        // Outside the call, as before.
        assert!(forged.win_addr_conflict(&real));
    }
}
