//! A SWIM member's identity: the node id the gate knows it by, the socket
//! address it answers on, and a generation that grows with each restart;
//! and the [`Arbiter`] by which a member decides address conflicts.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

/// The SWIM identities nodes signed, by address (name, generation): the
/// orchestrator's node table (`live::nodes`) keeps it, and its SWIM member
/// decides address conflicts by it (see [`Arbiter`]).
pub type SignedView = Arc<RwLock<HashMap<SocketAddr, (String, u64)>>>;

/// Whether the term a signed view belongs to still lasts, by the term's
/// own clock.
pub type TermLasts = Arc<dyn Fn() -> bool + Send + Sync>;

/// How one SWIM member decides address conflicts: by generation, as every
/// member does, or, while the term it feeds lasts, by the identities its
/// nodes signed first.
///
/// An identity a node signed beats any other at its address, whatever
/// their generations, so a forged identity with a higher generation
/// cannot replace the node in the member's view (nor get it declared down
/// by the conflict). foca asks the identities themselves
/// (`win_addr_conflict`) and hands them nothing else, so a member's codec
/// gives its arbiter to every identity it decodes (see
/// `watch::WatchingCodec`): each one foca holds or receives carries the
/// rule of the member that holds it, as it stands when foca asks. The
/// rule is not on the wire and not part of who a member is.
#[derive(Clone, Default)]
pub struct Arbiter(Arc<RwLock<Option<Rule>>>);

/// A signed view, and the term it belongs to.
#[derive(Clone)]
struct Rule {
    signed: SignedView,
    lasts: Option<TermLasts>,
}

impl Arbiter {
    /// Decides by `signed` from now on, while `lasts` says the term lasts
    /// (none: for as long as it is kept). A deposed leader woken from a
    /// freeze reads the datagrams that waited before its term is
    /// detached; decided by its nodes' last lives, a node restarted under
    /// the next leader would lose the conflict here and be declared down.
    pub fn by_signed(&self, signed: SignedView, lasts: Option<TermLasts>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Rule { signed, lasts });
    }

    /// Decides by generation alone from now on, as every member does.
    pub fn by_generation(&self) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Whether `a` beats `b` by what was signed at their address, if that
    /// decides it now.
    fn verdict(&self, a: &SwimIdentity, b: &SwimIdentity) -> Option<bool> {
        let rule = self.0.read().ok()?.clone()?;
        if !rule.lasts.is_none_or(|lasts| lasts()) {
            return None;
        }
        let view = rule.signed.read().ok()?;
        let (node, generation) = view.get(&a.addr)?;
        let signed = |id: &SwimIdentity| id.node == *node && id.generation == *generation;
        match (signed(a), signed(b)) {
            (true, false) => Some(true),
            (false, true) => Some(false),
            _ => None,
        }
    }
}

impl std::fmt::Debug for Arbiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let by_signed = self.0.read().is_ok_and(|rule| rule.is_some());
        f.write_str(if by_signed {
            "Arbiter(by signed identities)"
        } else {
            "Arbiter(by generation)"
        })
    }
}

/// Who a SWIM member is. Two identities with the same address are the same
/// member; the higher generation wins (a restarted or renewed member),
/// unless the [`Arbiter`] of the member that decides says otherwise.
#[derive(Clone, Serialize, Deserialize)]
pub struct SwimIdentity {
    /// The node id, as the gate knows the node.
    pub node: String,
    /// Where the member answers.
    pub addr: SocketAddr,
    /// Bumped on each restart, and by foca's `renew` when the member learns
    /// it was declared down, so it can rejoin.
    pub generation: u64,
    /// The rule of the member holding this identity (see [`Arbiter`]):
    /// neither sent nor compared; none (no allocation) for an identity no
    /// member's codec decoded, or one deciding by generation alone.
    #[serde(skip)]
    arbiter: Option<Arbiter>,
}

impl SwimIdentity {
    /// Node `node` answering at `addr`, in its life `generation`.
    pub fn new(node: impl Into<String>, addr: SocketAddr, generation: u64) -> Self {
        Self {
            node: node.into(),
            addr,
            generation,
            arbiter: None,
        }
    }

    /// A placeholder for a seed known only by its address: foca accepts an
    /// announce addressed to any identity with its address.
    pub fn seed(addr: SocketAddr) -> Self {
        Self::new(String::new(), addr, 0)
    }

    /// This identity, deciding its address conflicts by `arbiter`.
    pub(crate) fn judged_by(mut self, arbiter: &Arbiter) -> Self {
        self.arbiter = Some(arbiter.clone());
        self
    }
}

impl PartialEq for SwimIdentity {
    fn eq(&self, other: &Self) -> bool {
        self.node == other.node && self.addr == other.addr && self.generation == other.generation
    }
}

impl Eq for SwimIdentity {}

impl Hash for SwimIdentity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.node.hash(state);
        self.addr.hash(state);
        self.generation.hash(state);
    }
}

impl std::fmt::Debug for SwimIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SwimIdentity")
            .field("node", &self.node)
            .field("addr", &self.addr)
            .field("generation", &self.generation)
            .finish()
    }
}

#[cfg(test)]
impl SwimIdentity {
    /// A member on 127.0.0.1:`port` at generation 1 (the unit tests').
    pub(crate) fn local(node: &str, port: u16) -> Self {
        Self::new(node, SocketAddr::from(([127, 0, 0, 1], port)), 1)
    }
}

impl foca::Identity for SwimIdentity {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            generation: self.generation.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        [&self.arbiter, &adversary.arbiter]
            .into_iter()
            .flatten()
            .find_map(|arbiter| arbiter.verdict(self, adversary))
            .unwrap_or(self.generation > adversary.generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foca::Identity;

    fn id(node: &str, generation: u64) -> SwimIdentity {
        SwimIdentity::new(node, SocketAddr::from(([10, 0, 0, 1], 7946)), generation)
    }

    #[test]
    fn a_signed_identity_beats_any_other_at_its_address_only_while_its_arbiter_decides_by_it() {
        let (real, forged, other) = (id("node-1", 5), id("node-1", 5_000), id("node-9", 6));
        // Without a rule: the higher generation wins.
        assert!(forged.win_addr_conflict(&real));
        let arbiter = Arbiter::default();
        let view: SignedView = Arc::default();
        view.write()
            .unwrap()
            .insert(real.addr, ("node-1".into(), 5));
        let lasts = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let term = Arc::clone(&lasts);
        arbiter.by_signed(
            view,
            Some(Arc::new(move || {
                term.load(std::sync::atomic::Ordering::SeqCst)
            })),
        );
        // Either side carrying the member's arbiter decides by it.
        let judged = |id: &SwimIdentity| id.clone().judged_by(&arbiter);
        for (real, forged) in [
            (judged(&real), forged.clone()),
            (real.clone(), judged(&forged)),
        ] {
            assert!(real.win_addr_conflict(&forged));
            assert!(!forged.win_addr_conflict(&real));
        }
        assert!(judged(&real).win_addr_conflict(&other));
        assert!(!other.win_addr_conflict(&judged(&real)));
        // Neither signed: the generations decide.
        assert!(judged(&forged).win_addr_conflict(&other));
        // Equal whatever arbiter they carry: it is not who they are.
        assert_eq!(judged(&real), real);
        // The term over, or the member back to generations: as before.
        lasts.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(judged(&forged).win_addr_conflict(&judged(&real)));
        lasts.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(!judged(&forged).win_addr_conflict(&judged(&real)));
        arbiter.by_generation();
        assert!(judged(&forged).win_addr_conflict(&judged(&real)));
    }

    #[test]
    fn the_arbiter_is_neither_sent_nor_shown() {
        use foca::{Codec, Member, PostcardCodec, State};
        let arbiter = Arbiter::default();
        arbiter.by_signed(Arc::default(), None);
        let judged = id("node-1", 5).judged_by(&arbiter);
        let encoded = |id: &SwimIdentity| {
            let mut buf = Vec::new();
            PostcardCodec
                .encode_member(&Member::new(id.clone(), 0, State::Alive), &mut buf)
                .unwrap();
            buf
        };
        assert_eq!(encoded(&judged), encoded(&id("node-1", 5)));
        assert_eq!(format!("{judged:?}"), format!("{:?}", id("node-1", 5)));
        assert!(!format!("{judged:?}").contains("Arbiter"));
    }
}
